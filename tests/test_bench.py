"""scripts/bench.py: the report it writes, the block of docs/benchmark.md it replaces, and a quick smoke run."""
import dataclasses
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_the_benchmark_pages_block_is_replaced_between_the_markers_only(tmp_path, monkeypatch):
    page = tmp_path / "docs" / "benchmark.md"
    page.parent.mkdir()
    page.write_text("intro\n<!-- bench:start -->\nold table\n<!-- bench:end -->\noutro\n")
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    bench.update_page("new table\n![x](learning/x.png)", tmp_path / "results")
    assert page.read_text() == "intro\n<!-- bench:start -->\nnew table\n![x](../results/learning/x.png)\n<!-- bench:end -->\noutro\n"
    page.write_text("no markers here\n")
    with pytest.raises(SystemExit, match="bench:start"):
        bench.update_page("new", tmp_path / "results")


def test_learning_figures_are_drawn_per_task_so_that_no_panel_mixes_two_tasks(tmp_path, monkeypatch):
    calls = []  # (--out, the runs plotted) of each scripts/plot.py call

    def plot(command, check, cwd):
        out, labels = Path(command[command.index("--out") + 1]), command[command.index("--labels") + 1].split(",")
        assert [Path(arg).name for arg in command[2 : 2 + len(labels)]] == labels  # each run's kept metrics folder
        calls.append((out, labels))
        out.mkdir(parents=True, exist_ok=True)
        for name in ("reward.png", "heldout_accuracy.png"):
            (out / name).write_bytes(b"png")

    monkeypatch.setattr(bench.subprocess, "run", plot)
    figures = tmp_path / "learning"
    runs = ["word:single-seed1", "chain-seed1", "word:calculator_team+shared-seed2", "chain-group-seed2"]
    drawn = bench.draw_learning_figures(tmp_path / "kept", runs, figures)
    assert calls == [(figures, ["chain-seed1", "chain-group-seed2"]),
                     (figures / "word", ["word:single-seed1", "word:calculator_team+shared-seed2"])]
    assert drawn == [figures / "heldout_accuracy.png", figures / "reward.png",
                     figures / "word" / "heldout_accuracy.png", figures / "word" / "reward.png"]


def test_unknown_section_is_refused():
    with pytest.raises(SystemExit, match="unknown sections"):
        bench.main(["--skip", "everything"])


def test_render_only_needs_a_report(tmp_path):
    with pytest.raises(SystemExit, match="run the suite first"):
        bench.main(["--render_only", "--out", str(tmp_path)])


def tiny_random_model(folder: Path) -> str:
    """`--model random:<config>` of a 2-layer, 64-wide SmolLM2 (heads of 32, the smallest vLLM's
    CPU attention takes): every section's code on the default model's tokenizer, in seconds."""
    config = json.loads((ROOT / "models" / "smollm2-135m.json").read_text())
    config.update(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=32)
    (folder / "tiny-smollm2.json").write_text(json.dumps(config))
    return f"random:{folder / 'tiny-smollm2.json'}"


def test_a_bench_model_is_checked_before_any_section_and_never_overwrites_the_default_report(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=r"--model=random:nowhere.json: no such file 'nowhere.json'"):
        bench.main(["--quick", "--model", "random:nowhere.json", "--out", str(out)])
    assert not out.exists() and "bench: throughput" not in capsys.readouterr().out
    config = ROOT / "models" / "qwen2.5-0.5b.json"
    with pytest.raises(SystemExit, match=r"give --out <folder>; .*results holds the default model's report"):
        bench.main(["--quick", "--model", f"random:{config}", "--out", str(ROOT / "results")])
    # --merge into a report of another model (or of the default one, which older reports do not name) is refused
    out.mkdir()
    (out / "bench.json").write_text(json.dumps({"mode": "quick"}))
    with pytest.raises(SystemExit, match=r"measured --model=smollm2, this run --model=random:.*qwen2.5-0.5b.json; merge runs of the same"):
        bench.main(["--quick", "--merge", "--model", f"random:{config}", "--out", str(out)])
    (out / "bench.json").write_text(json.dumps({"mode": "quick", "model": f"random:{config}"}))
    with pytest.raises(SystemExit, match=r"measured --model=random:.*, this run --model=smollm2; merge runs of the same"):
        bench.main(["--quick", "--merge", "--out", str(out)])


@pytest.mark.slow
def test_quick_mode_measures_every_section(tmp_path, monkeypatch):
    """The CI smoke: every section runs and reports finite numbers (no claim about their size), on a
    tiny random model (--model): the same code as on the default model, at a fraction of its cost."""
    # One thread: the suite runs two test files at once on 2 cores (figures of a smoke say nothing anyway).
    model = tiny_random_model(tmp_path)
    # The backends section's vLLM engine runs in the bench's process (no engine-core and worker processes
    # to start: about 20 s less; tests/test_vllm.py runs an engine as a user's run does).
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--threads", "1", "--model", model,
                             "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                            env=os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    assert set(bench.SECTIONS) <= set(report) and report["model"] == model
    for name in ("memory-default-chain", "phases-no-prefix-sharing", "learning-chain-group-seed1"):  # the phases, memory
        assert json.loads((tmp_path / "runs" / name / "config.json").read_text())["model"] == model  # and learning runs
    assert json.loads((tmp_path / "learning" / "baseline-single-seed1.json").read_text())["evaluated"]["model"] == model
    numbers = [report["throughput"]["rollout_tokens_per_second"], report["throughput"]["policy_update_tokens_per_second"],
               report["phases"]["iteration_seconds_without_eval"], report["phases"]["prefix_sharing_speedup"],
               report["phases"]["without_prefix_sharing"]["iteration_seconds_without_eval"], report["phases"]["floor_ratio"],
               report["phases"]["floor"]["floor_seconds"], report["phases"]["padding_free_floor_ratio"],
               report["phases"]["floor"]["profile_run_seconds"], report["phases"]["floor"]["profile_run_floor_ratio"],
               *report["phases"]["floor"]["pass_ceiling_ratios"].values(),
               report["memory"]["default"]["ratio_4_to_1"],
               *(row[key] for row in report["contention"].values() for key in ("alone_seconds", "slowdown")),
               report["grading"]["median_seconds"], report["grading"]["p90_seconds"]]
    assert report["grading"]["programs"] == 2 * bench.QUICK["grading_programs"]
    assert set(report["contention"]) == set(bench.QUICK["wait_policies"]) <= set(bench.WAIT_POLICIES)
    if "skipped" not in report["backends"]:
        numbers += [report["backends"]["hf_tokens_per_second"], report["backends"]["vllm_tokens_per_second"]]
    assert all(math.isfinite(x) and x > 0 for x in numbers)
    assert set(report["learning"]["runs"]) == {"chain-group-seed1"}  # quick mode: group advantages (the phases run GAE)
    assert report["learning"]["runs"]["chain-group-seed1"]["estimator"] == "group advantages"  # read from its config.json
    assert all(r["peak_rss_mib"] > 0 and r["seconds_per_iteration"] > 0 and r["cpu"] == bench.cpu_name()
               for r in report["learning"]["runs"].values())
    assert (tmp_path / "learning" / "heldout_accuracy.png").is_file()
    text = (tmp_path / "bench.md").read_text()
    assert "ratio 4 / 1" in text and "equal wall time" in text and "without prefix sharing" in text and "its floor**" in text
    assert "| spin 3,000 rounds (GOMP_SPINCOUNT=3000) |" in text and "grading one program of the code task" in text
    assert f"Model: `{model}`, random weights" in text
    assert "cpu_paths_speedup" not in report["phases"]  # quick mode leaves that run out
    profile = json.loads((tmp_path / "profile" / "profile.json").read_text())  # the floor's: the better of two GEMM timings
    assert profile["model"] == model
    assert profile["gemm_gflops_per_second"] == max(profile["gemm_gflops_per_second_before_and_after"])
    # --render_only rebuilds the same table from bench.json alone.
    (tmp_path / "bench.md").unlink()
    bench.main(["--render_only", "--out", str(tmp_path)])
    assert (tmp_path / "bench.md").read_text() == text
    # --merge adds a configuration to the comparison and keeps everything else, also on a machine
    # without the earlier run folders: the plot redraws from the metrics kept beside the report,
    # and a row whose metrics were not kept stays in the table, out of the figure.
    assert report["learning"]["plotted"] == ["chain-group-seed1"]
    # The merged run replays the trained run's metrics instead of training (the merge is under test).
    trained = (tmp_path / "learning" / "metrics" / "chain-group-seed1" / "metrics.jsonl").read_text()
    shutil.rmtree(tmp_path / "runs")
    shutil.rmtree(tmp_path / "learning" / "metrics" / "chain-group-seed1")

    def replay(out, name, args, threads):
        (out / "runs" / name).mkdir(parents=True)
        (out / "runs" / name / "metrics.jsonl").write_text(trained)
        (out / "runs" / name / "config.json").write_text(json.dumps({"advantage": "group", "group_baseline": "batch"}))
        return [json.loads(line) for line in trained.splitlines()], 1234.0

    monkeypatch.setattr(bench, "run_marft", replay)
    with pytest.raises(SystemExit, match="measured --model=random:.*, this run --model=smollm2; merge runs of the same model"):
        bench.main(["--quick", "--merge", "--skip", "throughput,backends,phases,memory,contention", "--out", str(tmp_path)])
    bench.main(["--quick", "--merge", "--skip", "throughput,backends,phases,memory,contention", "--learning_runs", "parallel",
                "--model", model, "--out", str(tmp_path)])
    merged = json.loads((tmp_path / "bench.json").read_text())
    assert set(merged["learning"]["runs"]) == {"chain-group-seed1", "parallel-seed1"}
    assert merged["learning"]["plotted"] == ["parallel-seed1"]
    assert merged["throughput"] == report["throughput"] and merged["memory"] == report["memory"]
    assert merged["learning"]["runs"]["chain-group-seed1"] == report["learning"]["runs"]["chain-group-seed1"]
    assert merged["learning"]["runs"]["parallel-seed1"]["peak_rss_mib"] == 1234.0
    text = (tmp_path / "bench.md").read_text()
    # the row says how its run estimated advantages (here the replayed config.json's), not what its name implies
    assert "| parallel, group advantages, batch baseline, seed 1 |" in text and "| chain, group advantages, seed 1 |" in text
    assert "The figures show the runs parallel-seed1 (the metrics of the other rows" in text


def test_learning_runs_must_name_a_built_in_organisation_and_merge_needs_a_report(tmp_path):
    with pytest.raises(SystemExit, match=r"'chian' is not \[task:\]<organisation>"):
        bench.main(["--learning_runs", "single,chian", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"'chain-gae' is not \[task:\]<organisation>"):
        bench.main(["--learning_runs", "chain-gae", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"'wrod:single' is not .* and task \(math, code, word"):
        bench.main(["--learning_runs", "wrod:single", "--out", str(tmp_path)])
    assert bench.learning_configuration("word:calculator_team+shared") == ("calculator_team", "", "word", True)
    assert bench.learning_configuration("chain-group") == ("chain", "group", "", False)
    with pytest.raises(SystemExit, match="no .*bench.json to merge into"):
        bench.main(["--merge", "--out", str(tmp_path)])
    (tmp_path / "bench.json").write_text(json.dumps({"mode": "quick"}))
    with pytest.raises(SystemExit, match="is a quick report"):
        bench.main(["--merge", "--out", str(tmp_path)])


def test_a_section_measured_again_by_a_later_merge_names_its_date():
    machine = {"date": "2026-11-24", "cpu_cores": 2, "processor": "x86_64", "memory_gib": 23.5, "gpu": "none",
               "torch": "2", "transformers": "5", "peft": "0", "vllm": "0"}
    report = {"mode": "full", "seconds": 60.0, "machine": machine,
              "section_dates": {"throughput": "2026-11-24", "phases": "2026-11-25"}}
    default_model = " Model: the embedded SmolLM2-135M-Instruct (the default)."  # a report without "model" measured it
    assert bench.markdown(report).splitlines()[0].endswith("Measured again by a later `--merge`: phases on 2026-11-25." + default_model)
    # a section measured on another CPU names it, even on the header's own date: its floor ratio is that CPU's
    report["section_dates"]["throughput"] = "2026-11-24"
    report["section_processors"] = {"throughput": "x86_64, AMD EPYC, family 26 model 2", "phases": "x86_64"}
    assert bench.markdown(report).splitlines()[0].endswith(
        "Measured again by a later `--merge`: throughput on 2026-11-24 (x86_64, AMD EPYC, family 26 model 2), phases on 2026-11-25."
        + default_model)
    del report["section_dates"]
    assert "Measured again" not in bench.markdown(report)
    report["model"] = "random:models/qwen2.5-0.5b.json"
    assert bench.markdown(report).splitlines()[0].endswith(
        "Model: `random:models/qwen2.5-0.5b.json`, random weights (vLLM's engine draws its own): its seconds and bytes "
        "mean something, its accuracies nothing.")


def test_the_backends_table_names_the_hf_decoding_its_report_measured():
    measured = {"prompts": 32, "threads": 2, "hf_tokens_per_second": 35.0, "vllm_tokens_per_second": 14.0,
                "vllm_without_lora_tokens_per_second": 61.0, "vllm_startup_seconds": 20.0}
    assert "| hf (transformers generate + peft) | 35 |" in bench.backends_lines(measured)  # reports before the key
    assert "| hf (generation.decode + peft) | 35 |" in bench.backends_lines({**measured, "hf_decoding": "generation.decode + peft"})


def test_the_cpu_is_named_with_its_family_and_model(monkeypatch, tmp_path):
    """/proc/cpuinfo's first processor block gives the name, family and model that tell two CPUs of
    one model name apart; without the file, the platform's name."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                       "model name\t: AMD EPYC\n\nprocessor\t: 1\ncpu family\t: 99\n")
    real_path = bench.Path
    monkeypatch.setattr(bench, "Path", lambda p: cpuinfo if p == "/proc/cpuinfo" else real_path(p))
    monkeypatch.setattr(bench.platform, "machine", lambda: "x86_64")
    assert bench.cpu_name() == "x86_64, AMD EPYC, family 25 model 17"
    monkeypatch.setattr(bench, "Path", lambda p: tmp_path / "missing" if p == "/proc/cpuinfo" else real_path(p))
    monkeypatch.setattr(bench.platform, "processor", lambda: "")
    assert bench.cpu_name() == "x86_64"


def metrics_rows(greedy: list[float], tokens_per_iteration: int, minutes_per_iteration: float) -> list[dict]:
    """A run's metrics.jsonl: line 0 the evaluation before training, then one line per iteration with
    a greedy evaluation at each; the first and the last also sampled (pass@1, tokens per episode)."""
    rows = []
    for i, g in enumerate(greedy):
        row = {"iteration": i, "eval/accuracy_greedy": g}
        if i:
            row |= {"charts/generated_tokens": tokens_per_iteration, "time/elapsed": 60 * minutes_per_iteration * i}
        if i in (0, len(greedy) - 1):
            row |= {"eval/accuracy": g / 2, "eval/generated_tokens_per_episode": tokens_per_iteration / 10}
        rows.append(row)
    return rows


def test_evaluations_carry_the_budget_spent_before_each():
    points = bench.evaluations(metrics_rows([0.1, 0.5, 0.7], 100, 2.0))
    assert [(p["iteration"], p["minutes"], p["tokens"], p["greedy"]) for p in points] == [(0, 0.0, 0, 0.1), (1, 2.0, 100, 0.5),
                                                                                          (2, 4.0, 200, 0.7)]
    assert "pass1" not in points[1] and points[2]["pass1"] == 0.35 and points[2]["tokens_per_episode"] == 10.0
    assert bench.within_budget(points, "tokens", 199)["greedy"] == 0.5  # 200 tokens were spent before the last
    assert bench.within_budget(points, "minutes", 0.5)["greedy"] == 0.1  # before training: nothing spent


def test_comparison_at_equal_time_equal_tokens_and_the_majority_vote_bar():
    # Two seeds of one agent (50 tokens an iteration, 3 iterations), one seed of a team (200 tokens an
    # iteration, 2 iterations in the same time), one word-task run apart (its own token budget).
    runs = {"single-seed1": {"evaluations": bench.evaluations(metrics_rows([0.5, 0.6, 0.8, 0.9], 50, 1.0))},
            "single-seed2": {"evaluations": bench.evaluations(metrics_rows([0.5, 0.7, 0.6, 0.7], 50, 1.0))},
            "chain-seed1": {"evaluations": bench.evaluations(metrics_rows([0.4, 0.6, 0.85], 200, 1.5))},
            "word:single-seed1": {"evaluations": bench.evaluations(metrics_rows([0.0, 0.1], 30, 3.0))},
            "parallel-seed1": {"greedy_end": 0.5}}  # an older report's run: no evaluations, not compared
    # The bar: the untrained single agent, 4 tokens per episode; maj@1, @2, @4 on the seeds' held-out sets.
    baseline = {"1": {"samples": 4, "tokens_per_episode": 4.0, "maj": {"1": 0.5, "2": 0.6, "4": 0.7}},
                "2": {"samples": 4, "tokens_per_episode": 4.0, "maj": {"1": 0.4, "2": 0.5, "4": 0.6}}}
    table = bench.comparison(runs, baseline)
    assert set(table) == {"single", "chain", "word:single"}
    single, chain = table["single"], table["chain"]
    assert single["greedy_equal_time"] == {"mean": 0.8, "min": 0.7, "max": 0.9, "seeds": 2}
    # Equal tokens: the math runs' smallest final count is the single agent's 150 (chain: 400), within
    # which the chain has only its evaluation before training.
    assert single["token_budget"] == chain["token_budget"] == 150
    assert chain["greedy_equal_tokens"]["mean"] == 0.4 and single["greedy_equal_tokens"]["mean"] == pytest.approx(0.8)
    assert table["word:single"]["token_budget"] == 30 and "bar" not in table["word:single"]
    # Tokens per held-out episode: single 5 (50 / 10), chain 20. The bar: k samples of 4 tokens within it.
    assert single["bar"]["k"] == 1 and single["bar"]["maj"]["mean"] == pytest.approx(0.45) and single["beats_bar"]
    assert chain["bar"]["k"] == 4 and chain["bar"]["maj"]["mean"] == pytest.approx(0.65) and chain["beats_bar"]
    assert chain["pass1_end"]["mean"] == 0.425
    text = "\n".join(bench.comparison_lines(table, baseline, "smollm2"))
    assert "| chain | 1 | 0.85 | 0.40 (150) | 0.42 | 20.00 | 0.65 [0.60, 0.70] (k = 4) | yes |" in text
    assert "CPU |" not in text  # no run names its CPU: one group, no column
    # Configurations measured on different CPUs: a CPU column, and one whose seeds span two says so
    runs["single-seed1"]["cpu"] = runs["chain-seed1"]["cpu"] = "A"
    lines = bench.comparison_lines(bench.comparison(runs, baseline), baseline, "smollm2")
    assert "| chain | 1 | 0.85 | 0.40 (150) | 0.42 | 20.00 | 0.65 [0.60, 0.70] (k = 4) | yes | A |" in lines
    assert any(line.startswith("| single | 2 |") and line.endswith("| yes | A + not recorded |") for line in lines)
    assert any(line.startswith("| configuration |") and line.endswith("| above the bar | CPU |") for line in lines)
    assert "| single | 2 | 0.80 [0.70, 0.90] |" in text
    assert "The bar: `python evaluate.py --agents single --samples" in text
    # another model's bar is that model's untrained single agent, and the command says so
    assert "The bar: `python evaluate.py --model /m --agents single" in "\n".join(bench.comparison_lines(table, baseline, "/m"))


def test_the_learning_table_names_the_commit_of_its_rows_and_the_rows_without_one():
    """Rows merged from several invocations keep the code and the CPU they measured: bench.json holds
    each row's commit and CPU, and the table's heading names the commits (and says when older rows
    name none); when the rows come from more than one CPU (or name none beside rows that do), each
    row names its CPU in a column, under a sentence saying to compare at equal time within one."""
    machine = {"date": "2026-11-24"}
    row = lambda day, **extra: {"measured": day, "iterations": 3, "minutes": 10.0, "seconds_per_iteration": 20.0,
                                "peak_rss_mib": 2000.0, "accuracy_start": 0.1, "accuracy_end": 0.5, "greedy_start": 0.4,
                                "greedy_end": 0.8, **extra}
    learn = {"time_limit_minutes": 10.0, "figures": [],
             "runs": {"single-seed1": row("2026-11-27", commit="abc1234"), "chain-seed1": row("2026-11-28", commit="def5678")}}
    text = "\n".join(bench.learning_lines(learn, machine, "smollm2"))
    assert "Learning runs measured on 2026-11-27, 2026-11-28, code of commits abc1234, def5678 (merged" in text
    learn["runs"]["parallel-seed1"] = row("2026-11-25")  # an older report's row
    assert "(rows of older reports name no commit)" in "\n".join(bench.learning_lines(learn, machine, "smollm2"))
    assert "CPU |" not in "\n".join(bench.learning_lines(learn, machine, "smollm2"))  # no row names one: one group
    zen4 = "x86_64, AMD EPYC, family 25 model 17"
    for run in learn["runs"].values():
        run["cpu"] = zen4
    assert "CPU |" not in "\n".join(bench.learning_lines(learn, machine, "smollm2"))  # every row on one CPU
    del learn["runs"]["parallel-seed1"]["cpu"]  # an older report's row beside two of this CPU: a CPU column
    lines = bench.learning_lines(learn, machine, "smollm2")
    header = next(i for i, line in enumerate(lines) if line.startswith("| run (equal wall time"))
    assert "compare iterations and accuracies at equal wall time" in lines[header - 2]  # above the table
    assert lines[header].endswith("| greedy start → end | CPU |") and lines[header + 1].count("---") == 8
    assert lines[header + 2].endswith(f"| 0.40 → 0.80 | {zen4} |") and lines[header + 4].endswith("| not recorded |")
    learn["runs"]["parallel-seed1"]["cpu"] = "x86_64, AMD EPYC, family 26 model 2"  # two named CPUs: the same
    assert bench.learning_lines(learn, machine, "smollm2")[header + 4].endswith(" family 26 model 2 |")
    assert bench.source_commit() != "unknown"  # the tests run in the project's checkout


# ---------------------------------------------------------------------------------------------
# scripts/stability.py: reach and fall of a run's held-out greedy accuracy
# ---------------------------------------------------------------------------------------------

_stability_spec = importlib.util.spec_from_file_location("stability", ROOT / "scripts" / "stability.py")
stability = importlib.util.module_from_spec(_stability_spec)
_stability_spec.loader.exec_module(stability)


def _points(course):
    return [{"minutes": minutes, "greedy": greedy} for minutes, greedy in course]


def test_reach_and_fall_on_a_hand_table():
    # greedy 0.14, 0.64, 0.82 (first ≥ 0.8, at 3.0 min), 0.86 (best so far), 0.74, 0.80:
    # falls below the running best from 3.0 min on: 0, 0, 0.86 − 0.74 = 0.12, 0.06 → largest 0.12
    run = stability.reach_and_fall(_points([(0, 0.14), (2.1, 0.64), (3.0, 0.82), (4.2, 0.86), (5.1, 0.74), (6.0, 0.80)]), 0.8)
    assert run["reach_minutes"] == 3.0 and run["best"] == 0.86
    assert run["largest_fall"] == pytest.approx(0.12)
    assert stability.verdict(run, 0.10, 3.7) == {"holds": False, "in_time": True}
    # 0.84 (first ≥ 0.8, at 4.0 min), then 0.74: a fall of exactly 0.10, allowed (the bound is inclusive)
    run = stability.reach_and_fall(_points([(0, 0.1), (4.0, 0.84), (5.0, 0.74)]), 0.8)
    assert run["largest_fall"] == pytest.approx(0.10)
    assert stability.verdict(run, 0.10, 3.7) == {"holds": True, "in_time": False}
    assert stability.verdict(run, 0.10, None)["in_time"] is None


def test_the_holding_recipe_is_one_step_on_a_batch_baseline_with_the_rate_decayed_to_a_tenth():
    """single-l3-hold as docs/learning-per-minute.md describes it: 16 problems × 1 episode in one
    optimiser step against the batch's baseline, and η = 2e-4 by half a cosine to 2e-5 at iteration
    24 (1.1e-4 halfway: 2e-4 · (0.1 + 0.9 · 0.5)), where it stays."""
    import config
    import ppo

    cfg = config.parse_args(stability.CONFIGS["single-l3-hold"] + ["--iterations", "1000"])
    assert (cfg.agents, cfg.advantage, cfg.group_baseline, cfg.batch_size, cfg.group_size, cfg.minibatch_size) == \
        ("single", "group", "batch", 16, 1, 16)
    rates = [ppo.scheduled_lr(cfg.lr, t, cfg.lr_decay_iterations, cfg.lr_schedule, cfg.lr_final_ratio) for t in (0, 12, 24, 500)]
    assert rates == pytest.approx([2e-4, 1.1e-4, 2e-5, 2e-5])


def test_the_single_agents_defaults_are_the_holding_recipe():
    """single-l3-default (every option at its default) trains as single-l3-hold: the same options
    but --credit (last and shared place R on one agent's one action alike) and the record of why."""
    import config

    default, hold = (config.parse_args(stability.CONFIGS[name]) for name in ("single-l3-default", "single-l3-hold"))
    differ = {f.name for f in dataclasses.fields(config.Config) if getattr(default, f.name) != getattr(hold, f.name)}
    assert differ == {"credit"} and (default.credit, hold.credit) == ("last", "shared")


def test_a_run_that_never_reaches_the_threshold_neither_holds_nor_is_in_time():
    run = stability.reach_and_fall(_points([(0, 0.14), (3.0, 0.78), (6.0, 0.30)]), 0.8)
    assert run == {"reach_minutes": None, "largest_fall": None, "best": 0.78}
    assert stability.verdict(run, 0.10, 3.7) == {"holds": False, "in_time": False}


def test_phase_seconds_leave_the_cold_first_iteration_out_of_the_means_and_report_it_apart():
    """Three trained iterations (and the row of iteration 0, the evaluation before training): with one
    cold iteration the means are over iterations 2 and 3; the first's time (evaluation left out) apart."""
    def row(iteration, seconds):
        return {"iteration": iteration, **{f"time/{p}": (0.0 if p in ("advantages", "adapter_sync") else seconds)
                                            for p in bench.PHASES}}
    rows = [{"iteration": 0}, row(1, 10.0), row(2, 4.0), row(3, 6.0)]  # rollout, values, both updates, eval: s each
    warm = bench.phase_seconds(rows, cold=1)
    assert warm["iterations"] == 2 and warm["rollout_seconds"] == 5.0 and warm["eval_seconds"] == 5.0
    assert warm["iteration_seconds_without_eval"] == 4 * 5.0  # four timed phases of 5 s, the evaluation apart
    assert warm["cold_iterations"] == 1 and warm["cold_iteration_seconds_without_eval"] == 4 * 10.0
    every = bench.phase_seconds(rows)
    assert every["iterations"] == 3 and every["rollout_seconds"] == 20.0 / 3 and "cold_iterations" not in every
    phase = {f"{name}_seconds": 1.0 for name in bench.PHASES}
    report = {"problems_per_iteration": 16, **warm, "without_prefix_sharing": {**phase, "iteration_seconds_without_eval": 40.0},
              "prefix_sharing_speedup": 2.0}
    text = "\n".join(bench.phases_lines(report))
    assert "problems per iteration, mean of 2 after the first) |" in text and "the default's took 40.0 s." in text


def test_the_phases_table_shows_the_variant_runs_when_there_are_some():
    phase = {f"{name}_seconds": 1.0 for name in bench.PHASES} | {"iteration_seconds_without_eval": 50.0, "iterations": 2}
    report = {"problems_per_iteration": 16, **phase, "without_prefix_sharing": {**phase, "iteration_seconds_without_eval": 100.0},
              "prefix_sharing_speedup": 2.0}
    old_report = "\n".join(bench.phases_lines(report))  # a report from before the CPU-paths run: two columns
    assert "MARFT_CPU_PATHS" not in old_report and "**2.00×**" in old_report
    # The run with the CPU-specific paths off: a third column, its ratio the variant's seconds over the default's (60 / 50).
    report |= {"without_cpu_paths": {**phase, "iteration_seconds_without_eval": 60.0}, "cpu_paths_speedup": 1.2}
    text = "\n".join(bench.phases_lines(report))
    assert "| seconds | without prefix sharing | MARFT_CPU_PATHS=off |" in text
    assert "| **iteration (without eval)** | **50.0** | **100.0** | **60.0** |" in text
    assert "make it **1.20×** faster than with them capped at AVX2 (`cpu_paths_speedup`" in text
    assert "floor" not in text  # a report from before the floor
    # The floor sentence: 50 s against a floor of 12.5 s is 4×; the families as shares of the profiled seconds.
    report |= {"floor": {"floor_seconds": 12.5, "gemm_gflops_per_second": 190.0, "matmul_mflop_per_token": 1750.0,
                         "profiled_seconds": 60.0, "profiled_seconds_by_family": {"matrix products": 30.0, "python & other": 30.0}},
               "floor_ratio": 4.0}
    text = "\n".join(bench.phases_lines(report))
    assert "is 12.5 s: the iteration takes **4.0× its floor**" in text and "matrix products 50%, python & other 50%" in text
    assert "padding-free" not in text  # a report from before the padding-free floor
    report["floor"]["padding_free_floor_seconds"], report["padding_free_floor_ratio"] = 20.0, 2.5  # 50 s over 20 s
    text = "\n".join(bench.phases_lines(report))
    assert "20.0 s: **2.5× the padding-free floor**" in text and "matrix products 50%" in text
    assert "measured again" not in text  # a report from before the profile run's own iterations were kept
    report["floor"] |= {"profile_run_seconds": 45.0, "profile_run_floor_ratio": 3.6}  # 45 s over its floor of 12.5 s
    text = "\n".join(bench.phases_lines(report))
    assert "the profile run's own unprofiled iterations after its first: 45.0 s each, **3.6× their floor**" in text
    assert "One plain pass" not in text  # a report from before the pass ceiling
    report["floor"] |= {"pass_ceiling_ratios": {"forward": 1.5, "forward_backward": 1.75}, "pass_ceiling_rows_and_tokens": [8, 48]}
    text = "\n".join(bench.phases_lines(report))
    assert ("(8 rows of 48 tokens, no shared prefix, no padding) takes **1.50×** its floor forward and **1.75×** forward + "
            "backward (`pass_ceiling_ratios`)") in text


# ---------------------------------------------------------------------------------------------
# scripts/profile_iteration.py: op families, the phase table of a profile, the floor and its ratio
# ---------------------------------------------------------------------------------------------

_profile_spec = importlib.util.spec_from_file_location("profile_iteration", ROOT / "scripts" / "profile_iteration.py")
profile_iteration = importlib.util.module_from_spec(_profile_spec)
_profile_spec.loader.exec_module(profile_iteration)


def test_op_families_by_name():
    table = {"aten::addmm": "matrix products", "aten::mm": "matrix products", "aten::linear": "matrix products",
             "aten::_scaled_dot_product_flash_attention_for_cpu": "attention", "MmBackward0": "autograd engine",
             "autograd::engine::evaluate_function: MmBackward0": "autograd engine", "aten::copy_": "copies & layout",
             "aten::cat": "copies & layout", "aten::silu": "elementwise", "aten::log_softmax": "elementwise",
             "## tokenise ##": "python & other"}
    assert {name: profile_iteration.family(name, False) for name in table} == table
    assert profile_iteration.family("aten::mm", True) == "optimiser"  # everything under Adam's step


def test_the_phase_table_nests_events_by_time_and_counts_self_times_and_matmul_flops():
    E = lambda name, start, end, flops=0, thread=1: profile_iteration.Event(name, start * 10**9, (end - start) * 10**9, thread, flops)
    events = [
        E("aten::mm", 0, 3),  # before any phase: left out
        E("phase:rollout", 10, 20),  # 10 s: 1.9 s its own (python & other)
        E("aten::linear", 10, 15.1), E("aten::addmm", 10.1, 15.1, flops=10**9),  # linear's own 0.1 s, addmm 5 s
        E("aten::copy_", 16, 17),
        E("Optimizer.step#Adam.step", 17, 18), E("aten::mul", 17.1, 17.5, flops=7),  # all optimiser; mul's FLOPs not counted
        E("aten::mm", 18, 19, flops=5),  # the last second of the phase but one
        E("aten::silu", 12, 13, thread=2),  # another thread, outside every phase there: left out
        E("phase:values", 30, 31), E("aten::_scaled_dot_product_flash_attention_for_cpu", 30, 30.5),
    ]
    table = profile_iteration.phase_table(events)
    assert set(table) == {"rollout", "values"}
    row = table["rollout"]
    assert row["seconds"] == pytest.approx(10.0) and row["matmul_flops"] == 10**9 + 5
    assert row["families"] == pytest.approx({"matrix products": 0.1 + 5.0 + 1.0, "copies & layout": 1.0, "optimiser": 1.0,
                                             "python & other": 10 - 5.1 - 1 - 1 - 1, "attention": 0.0, "elementwise": 0.0,
                                             "autograd engine": 0.0})
    assert row["ops"] == pytest.approx({"(the phase itself)": 1.9, "aten::linear": 0.1, "aten::addmm": 5.0, "aten::copy_": 1.0,
                                        "Optimizer.step#Adam.step": 1.0 - 0.4, "aten::mul": 0.4, "aten::mm": 1.0})
    assert table["values"]["families"]["attention"] == pytest.approx(0.5)
    assert table["values"]["families"]["python & other"] == pytest.approx(0.5)


def test_floor_and_ratio_on_a_hand_table():
    # 3 iterations, the last profiled: 3e9 matrix FLOPs over its 300 tokens = 1e7 per token. At 1e9
    # FLOP/s the unprofiled iterations' floors are 100 · 1e7 / 1e9 = 1 s and 200 · 1e7 / 1e9 = 2 s;
    # they took 6 s and 8 s. The warm one (the second) sets the ratio: 8 / 2 = 4.
    no_families = {"seconds": 0.0, "families": dict.fromkeys(profile_iteration.FAMILIES, 0.0)}
    measured = {"phases": {"rollout": {**no_families, "matmul_flops": 2e9}, "policy_update": {**no_families, "matmul_flops": 1e9}},
                "timings": [{"rollout": 5.0, "policy_update": 1.0}, {"rollout": 6.0, "policy_update": 2.0},
                            {"rollout": 50.0, "policy_update": 50.0}],
                "tokens": [100, 200, 300]}
    result = profile_iteration.report(measured, 1e9)
    assert result["matmul_flops_per_token"] == pytest.approx(1e7)
    assert result["profiled_floor_seconds"] == pytest.approx(3.0)
    assert result["seconds_by_iteration"] == pytest.approx([6.0, 8.0])
    assert result["floor_seconds_by_iteration"] == pytest.approx([1.0, 2.0])
    assert result["floor_ratio"] == pytest.approx(4.0)
    # two iterations: the one unprofiled iteration is all there is to time
    two = profile_iteration.report({**measured, "timings": measured["timings"][1:], "tokens": [200, 300]}, 1e9)
    assert two["floor_ratio"] == pytest.approx(8.0 / 2.0)
    # the padding-free floor, where the profile counted it: 1e9 and 4e9 FLOPs at 1e9 FLOP/s → 1 s and 4 s; warm 8 / 4
    free = profile_iteration.report({**measured, "padding_free_flops": [{"rollout": 1e9}, {"rollout": 3e9, "values": 1e9},
                                                                        {"rollout": 9e9}]}, 1e9)
    assert free["padding_free_floor_seconds_by_iteration"] == pytest.approx([1.0, 4.0])
    assert free["padding_free_floor_ratio"] == pytest.approx(2.0)
    assert "padding_free_floor_ratio" not in result  # a profile from before it


def test_padding_free_positions_and_flops_on_a_hand_count():
    # Two rows sharing a 2-token prefix: 2 once, then 2 + 2 and 1 + 1 → 8 positions (padding would make it 2 × 6).
    assert profile_iteration.pass_positions([[1, 2, 3, 4], [1, 2, 5]], [[7, 8], [9]]) == 8
    assert profile_iteration.pass_positions([], []) == 0
    # W = 10, A = 1, V·d = 100: a forward 22 per position + 200 per response token, a backward 24 + 200.
    shape = profile_iteration.ModelShape(10, 1, 100)
    planner = profile_iteration.AgentTokens(policy=8, critic=8, responses=3, learns=True)  # forward 776, critic forward 176
    solver = profile_iteration.AgentTokens(policy=5, critic=6, responses=2, learns=True)  # forward 510, critic forward 132
    flops = profile_iteration.padding_free_flops([planner, solver], shape, critic=True, ppo_epochs=1)
    assert flops == {"rollout": 776 + 510, "values": 776 + 510 + 176 + 132,
                     "policy_update": (776 + 792) + (510 + 520) + 776,  # forward + backward each, M's forward for the planner
                     "critic_update": (176 + 192) + (132 + 144)}
    # two epochs, no critic, a frozen solver
    frozen = profile_iteration.padding_free_flops([planner, solver._replace(learns=False)], shape, critic=False, ppo_epochs=2)
    assert frozen == {"rollout": 1286, "values": 1286, "policy_update": 2 * (776 + 792), "critic_update": 0.0}


def test_model_shape_counts_projections_adapters_and_the_output_layer():
    from transformers import LlamaConfig, LlamaForCausalLM

    import agents

    # hidden 8, 2 heads of 4, 1 key/value head: q, o 8 × 8; k, v 8 × 4; gate, up, down 8 × 16 → W = 64·2 + 32·2 + 128·3 = 576.
    # LoRA rank 2 on q (A 2 × 8, B 8 × 2) and v (A 2 × 8, B 4 × 2): A = 16 + 16 + 16 + 8 = 56 per adapter. V·d = 32 · 8.
    config = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, tie_word_embeddings=True)
    model = agents.attach_adapters(LlamaForCausalLM(config), ["policy_planner", "critic"],
                                   agents.lora_config(2, 4, ["q_proj", "v_proj"]))
    assert profile_iteration.model_shape(model) == (576, 56, 256)


def test_the_pass_ceiling_counts_one_plain_passs_products_by_hand(tiny_model_dir):
    """The pass ceiling's pass on the tiny Llama (hidden 32, intermediate 64, 2 layers, 2 heads of 16,
    1 key/value head), LoRA rank 2 on all seven projections, counted by hand."""
    import config
    import run

    cfg = config.parse_args(["--model", str(tiny_model_dir), "--lora_rank", "2", "--threads", "1"])
    org, model, tokenizer, _, _ = run.build(cfg)
    adapter = profile_iteration.first_policy_adapter(org, cfg)
    assert adapter == "policy_planner"  # the chain's first agent
    ceiling = profile_iteration.pass_ceiling(model, adapter, tokenizer.pad_token_id, repeats=1)
    # Per layer: q, o 32 × 32; k, v 32 × 16; gate, up, down 32 × 64 → W = 2 · (1024·2 + 512·2 + 2048·3) = 18432.
    # LoRA rank 2, r·(in + out) per projection: q, o 128; k, v 96; gate, up, down 192 → A = 2 · 1024 = 2048.
    W, A, Vd = 18432, 2048, len(tokenizer) * 32
    positions, logits = 8 * 48, 8 * 32  # 8 rows of 16 + 32 tokens; the head at the 32 positions predicting a response token
    forward = 2 * (W + A) * positions + 2 * Vd * logits
    # The backward: ∂/∂x of every frozen product (2 W), the LoRA products' four (4 A), the head's ∂/∂x (2 V·d); but the
    # first layer's q, k, v read the embeddings, which need no gradient: no ∂/∂x of their base products (32 · (32 + 16 + 16)
    # weights) nor through their A matrices (r · in = 2 · 32 each).
    first_layer = 2 * 32 * (32 + 16 + 16) * positions + 3 * 2 * (2 * 32) * positions
    backward = (2 * W + 4 * A) * positions + 2 * Vd * logits - first_layer
    assert ceiling["forward"]["flops"] == forward
    assert ceiling["forward_backward"]["flops"] == forward + backward
    assert all(param.grad is None for param in model.parameters())  # the passes leave no gradient behind


def test_the_pass_ceiling_at_another_gemm_rate():
    # 100 GFLOP in 2 s and 200 GFLOP in 6 s at 1e11 FLOP/s: floors 1 s and 2 s, ratios 2 and 3.
    measured = {"rows": 8, "forward": {"seconds": 2.0, "flops": 100e9}, "forward_backward": {"seconds": 6.0, "flops": 200e9}}
    ceiling = profile_iteration.at_gemm_rate(measured, 1e11)
    assert ceiling["rows"] == 8 and (ceiling["forward"]["gflop"], ceiling["forward_backward"]["gflop"]) == (100.0, 200.0)
    assert (ceiling["forward"]["floor_seconds"], ceiling["forward"]["ratio"]) == pytest.approx((1.0, 2.0))
    assert (ceiling["forward_backward"]["floor_seconds"], ceiling["forward_backward"]["ratio"]) == pytest.approx((2.0, 3.0))
    # A phase at the ceiling: its products at the GEMM rate times the ratio of its kind of pass. The rollout's
    # 2e11 FLOPs at 1e11 FLOP/s: 2 s, forward (2×) → 4 s; the policy update's 1e11: 1 s, forward + backward (3×) → 3 s.
    result = {"pass_ceiling": ceiling, "gemm_gflops_per_second": 100.0,
              "phases": {"rollout": {"matmul_flops": 2e11}, "policy_update": {"matmul_flops": 1e11}, "advantages": {"matmul_flops": 0}}}
    assert profile_iteration.at_the_ceiling(result) == pytest.approx({"rollout": 4.0, "policy_update": 3.0})


def test_merging_a_phases_run_keeps_the_earlier_memory_section(tmp_path, monkeypatch):
    """`--skip …,memory --merge`: the phases are measured again, the earlier report's memory stays."""
    earlier = json.loads((ROOT / "results" / "bench.json").read_text())
    (tmp_path / "bench.json").write_text(json.dumps(earlier))
    phases = dict(earlier["phases"], iteration_seconds_without_eval=12.5)
    monkeypatch.setattr(bench, "phases_and_memory", lambda sizes, threads, out, skip: (phases, {}))
    report = bench.main(["--skip", "throughput,backends,memory,contention,grading,learning", "--merge", "--out", str(tmp_path)])
    assert report["memory"] == earlier["memory"] and report["phases"]["iteration_seconds_without_eval"] == 12.5
    assert report["grading"] == earlier["grading"]  # a section left out keeps the earlier report's
    assert report["section_dates"]["memory"] == earlier["section_dates"]["memory"]


def test_runs_made_outside_the_bench_are_compared_from_their_folders(tmp_path, monkeypatch):
    """--learning_from: two runs of one task (a trio, one adapter per role, and one agent), seed 1, and the
    untrained organisations' evaluate.py reports; the comparison by hand: equal time is each run's last
    evaluation within 30 min, equal tokens the last within the smaller final token count (trio 300, solo 250:
    250), the bar the untrained trio's (its maj@1 0.10 beats the solo's 0.00) maj@k with k · 20 tokens at
    most the configuration's greedy episode (trio 41 tokens: k = 2, solo 30: k = 1)."""
    monkeypatch.setattr(bench.subprocess, "run", lambda command, check, cwd: None)  # no figures drawn

    def run(name, agents, shared, evals):  # evals: (iteration, seconds, greedy, greedy tokens per episode)
        folder = tmp_path / name
        folder.mkdir()
        config = {"task": "examples/desks.py", "agents": agents, "shared_adapter": shared, "seed": 1,
                  "advantage": "gae", "group_baseline": "group", "model": "smollm2"}
        (folder / "config.json").write_text(json.dumps(config))
        rows = []
        for iteration, seconds, greedy, tokens in evals:
            row = {"iteration": iteration, "time/elapsed": seconds}
            if iteration:
                row |= {"charts/generated_tokens": 50, "time/iteration": 100.0, "time/eval": 10.0}
            if greedy is not None:
                row |= {"eval/accuracy_greedy": greedy, "eval/greedy/generated_tokens_per_episode": tokens}
            rows.append(row)
        (folder / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")

    # the trio: 6 iterations of 50 tokens (300); its evaluation at 1900 s is past 30 minutes
    run("trio-separate-seed1", "trio", False, [(0, 0, 0.1, 40.0), (1, 300, None, 0), (2, 600, 0.2, 42.0), (3, 900, None, 0),
                                               (4, 1200, 0.4, 41.0), (5, 1500, None, 0), (6, 1900, 0.6, 41.0)])
    # one agent: 5 iterations (250 tokens)
    run("solo-seed1", "solo", False, [(0, 0, 0.0, 30.0), (1, 300, None, 0), (2, 600, 0.0, 30.0), (3, 900, None, 0),
                                      (4, 1200, 0.05, 30.0), (5, 1700, 0.1, 30.0)])
    # the trio's report is read first: the bar is the higher maj@1, not the last report read
    for agents, maj in (("trio", {"1": 0.1, "2": 0.15, "4": 0.2}), ("solo", {"1": 0.0, "2": 0.0, "4": 0.0})):
        report = {"evaluated": {"agents": agents, "shared_adapter": False, "seed": 1, "samples": 4, "greedy": True,
                                "task": "examples/desks.py"},
                  "metrics": {"eval/generated_tokens_per_episode": 20.0, **{f"eval/maj@{k}": v for k, v in maj.items()}}}
        (tmp_path / f"untrained-{'ab'[agents == 'solo']}-{agents}.json").write_text(json.dumps(report))
    result = bench.main(["--learning_from", str(tmp_path), "--learning_minutes", "30"])
    learn = result["learning"]
    assert set(learn["runs"]) == {"examples/desks.py:trio-seed1", "examples/desks.py:solo-seed1"}
    trio = learn["runs"]["examples/desks.py:trio-seed1"]
    assert (trio["iterations"], trio["seconds_per_iteration"], trio["greedy_start"], trio["greedy_end"]) == (6, 90.0, 0.1, 0.6)
    table = bench.comparison(learn["runs"], learn["baseline"], 30)
    trio, solo = table["examples/desks.py:trio"], table["examples/desks.py:solo"]
    assert trio["greedy_equal_time"]["mean"] == 0.4 and solo["greedy_equal_time"]["mean"] == 0.1
    assert trio["token_budget"] == 250 and trio["greedy_equal_tokens"]["mean"] == 0.4  # its iteration 4 (200 tokens)
    assert solo["greedy_equal_tokens"]["mean"] == 0.1
    assert trio["bar"]["k"] == 2 and trio["bar"]["maj"]["mean"] == 0.15 and trio["beats_bar"]
    assert solo["bar"]["k"] == 1 and solo["bar"]["maj"]["mean"] == 0.1 and not solo["beats_bar"]  # 0.1 is not above 0.1
    text = (tmp_path / "bench.md").read_text()
    assert "| examples/desks.py task, trio, critic + GAE, seed 1 | 6 | 31.7 | 90.0 | - | - → - | 0.10 → 0.60 |" in text
    assert "`python evaluate.py --task examples/desks.py --agents trio --samples 4 --seed <s>`" in text
    assert "| examples/desks.py:trio | 1 | 0.40 | 0.40 (250) | - | 41.00 | 0.15 (k = 2) | yes |" in text  # within 30 min
    assert "equal wall time (the last evaluation within 30 min)" in text
    for extra in (["--merge"], ["--learning_seeds", "2"], ["--out", str(tmp_path / "elsewhere")]):
        with pytest.raises(SystemExit, match="give it --learning_minutes alone"):
            bench.main(["--learning_from", str(tmp_path), *extra])
    with pytest.raises(SystemExit, match="no such folder"):
        bench.main(["--learning_from", str(tmp_path / "nowhere")])
    shutil.copytree(tmp_path / "solo-seed1", tmp_path / "solo-seed1-again")
    with pytest.raises(SystemExit, match="are both examples/desks.py:solo-seed1"):
        bench.main(["--learning_from", str(tmp_path)])
    shutil.rmtree(tmp_path / "solo-seed1-again")
    (tmp_path / "solo-seed1" / "metrics.jsonl").write_text('{"iteration": 0, "eval/accuracy_greedy": 0.0}\n')
    with pytest.raises(SystemExit, match="solo-seed1 has no held-out evaluation or no trained iteration"):
        bench.main(["--learning_from", str(tmp_path)])  # a run stopped before its first iteration
