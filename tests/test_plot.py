"""scripts/plot.py: figures from synthetic metrics.jsonl files (no model, no training)."""
import importlib.util
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "plot.py"
spec = importlib.util.spec_from_file_location("plot", SCRIPT)
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURES = ["reward.png", "heldout_accuracy.png", "diagnostics.png"]


def training_row(iteration: int, reward: float, elapsed: float) -> dict:
    """The metrics of one training iteration of a planner -> solver chain."""
    row = {"iteration": iteration, "charts/reward": reward, "charts/accuracy": reward,
           "losses/value_loss": 0.1 / iteration, "losses/explained_variance": 0.1 * iteration,
           "time/elapsed": elapsed, "time/iteration": 60.0}
    for n, role in enumerate(["planner", "solver"]):
        row.update({f"losses/approx_kl/{role}": 0.001 * (n + 1), f"losses/clip_fraction/{role}": 0.05 * (n + 1),
                    f"losses/entropy/{role}": 1.0 - 0.1 * iteration - 0.3 * n})
    return row


def write_run(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def synthetic_rows() -> list[dict]:
    """Initial evaluation, three training iterations (a NaN reward at 2), final evaluation at 3."""
    rows = [{"iteration": 0, "eval/accuracy": 0.25, "eval/unparseable_rate": 0.5, "eval/accuracy_greedy": 0.5}]
    rows += [training_row(k, 0.2 * k, 120.0 + 60 * k) for k in (1, 2, 3)]
    rows[2]["charts/reward"] = float("nan")
    rows[3].update({"eval/accuracy": 0.75, "eval/unparseable_rate": 0.0, "eval/accuracy_greedy": float("nan")})
    return rows


def assert_pngs(folder: Path) -> None:
    for name in FIGURES:
        data = (folder / name).read_bytes()
        assert data[:8] == PNG_SIGNATURE, name
        assert len(data) > 10_000, name  # a drawn figure, not an empty canvas


def test_one_run_writes_the_three_figures_into_its_plots_folder(tmp_path, capsys):
    run = write_run(tmp_path / "run-a", synthetic_rows())
    written = plot.main([str(run)])
    assert written == [run / "plots" / name for name in FIGURES]
    assert_pngs(run / "plots")
    printed = capsys.readouterr().out
    assert all(str(path) in printed for path in written)


def test_two_runs_overlay_into_the_chosen_folder(tmp_path):
    first = write_run(tmp_path / "run-a", synthetic_rows())
    second = write_run(tmp_path / "run-b", synthetic_rows()[:3])  # shorter, and without the final evaluation
    out = tmp_path / "compare"
    written = plot.main([str(first), str(second), "--out", str(out), "--labels", "action,token"])
    assert written == [out / name for name in FIGURES]
    assert_pngs(out)


def test_several_runs_are_named_once_beside_the_panels_and_the_metrics_in_each_panel(tmp_path, monkeypatch):
    """Ten runs × two metrics: the figure's legend lists the ten runs (one colour each), each
    panel's legend the two line styles, so no legend grows with runs × metrics over the data."""
    folders = [write_run(tmp_path / f"run-{n}", synthetic_rows()) for n in range(10)]
    figures, save = [], plot.save
    monkeypatch.setattr(plot, "save", lambda fig, drawn, path: (figures.append(fig), save(fig, drawn, path))[1])
    plot.main([*map(str, folders), "--out", str(tmp_path / "out")])
    heldout = figures[1]
    assert [t.get_text() for t in heldout.legends[0].get_texts()] == [f"run-{n}" for n in range(10)]
    for ax in heldout.axes:
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["sampled pass@1", "greedy"]
        assert len(ax.get_lines()) == 20  # every run's two curves are drawn


def test_a_figure_without_metrics_is_skipped_with_a_note(tmp_path, capsys):
    run = write_run(tmp_path / "eval-only", synthetic_rows()[:1])  # only the initial evaluation
    written = plot.main([str(run), "--out", str(tmp_path / "out")])
    assert written == [tmp_path / "out" / "heldout_accuracy.png"]
    assert "skipped reward.png" in capsys.readouterr().out


def test_series_skips_nan_and_missing_and_measures_minutes_from_the_start():
    rows = synthetic_rows()
    assert plot.series(rows, "charts/reward") == ([1, 3], [pytest.approx(0.2), pytest.approx(0.6)])
    assert plot.series(rows, "charts/reward", x="minutes") == ([3.0, 5.0], [pytest.approx(0.2), pytest.approx(0.6)])
    assert plot.series(rows, "eval/accuracy", x="minutes") == ([0.0, 5.0], [0.25, 0.75])
    assert plot.series(rows, "eval/accuracy_greedy") == ([0], [0.5])
    assert plot.series(rows, "losses/approx_kl/solver") == ([1, 2, 3], [0.002] * 3)
    assert plot.series(rows, "no/such/key") == ([], [])
    assert all(math.isfinite(y) for y in plot.series(rows, "charts/reward")[1])


def test_roles_are_what_follows_the_last_slash():
    assert plot.roles([("run", synthetic_rows())], "losses/entropy") == ["planner", "solver"]


def test_malformed_line_names_the_file_and_line(tmp_path):
    run = write_run(tmp_path / "broken", synthetic_rows())
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"iteration": 4, "charts/reward": \n')  # cut short, as by a crash mid-write
    with pytest.raises(SystemExit, match=r"metrics\.jsonl, line 5"):
        plot.main([str(run)])


def test_missing_folder_or_metrics_file_is_an_early_error(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        plot.main([str(tmp_path / "nowhere")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="metrics.jsonl is missing"):
        plot.main([str(tmp_path / "empty")])


def test_labels_must_match_the_runs(tmp_path):
    run = write_run(tmp_path / "run-a", synthetic_rows())
    with pytest.raises(SystemExit, match="one per run"):
        plot.main([str(run), "--labels", "a,b"])


def test_series_against_generated_tokens_sums_the_training_rollouts():
    rows = [{"iteration": 0, "eval/accuracy_greedy": 0.5},
            {"iteration": 1, "charts/generated_tokens": 300, "eval/accuracy_greedy": float("nan")},
            {"iteration": 2, "charts/generated_tokens": 500, "eval/accuracy_greedy": 0.75},
            {"iteration": 3, "charts/generated_tokens": 200, "eval/accuracy_greedy": 0.875}]
    assert plot.series(rows, "eval/accuracy_greedy", x="tokens") == ([0.0, 0.8, 1.0], [0.5, 0.75, 0.875])
