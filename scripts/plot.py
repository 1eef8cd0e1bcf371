"""Plot one or several MARFT runs from the metrics.jsonl in their run folders.

Usage: python scripts/plot.py RUN_DIR [RUN_DIR ...] [--out FOLDER] [--labels a,b,...]

Writes one PNG per figure into --out (default: RUN_DIR/plots for one run, ./plots-compare for
several):

    reward.png            training-batch charts/reward and charts/accuracy against iteration and
                          against wall time in minutes (time/elapsed / 60; iteration 0 at 0)
    heldout_accuracy.png  held-out eval/accuracy (sampled pass@1) and eval/accuracy_greedy
                          against iteration, wall time and generated tokens (charts/generated_tokens
                          summed: equal-token comparisons)
    diagnostics.png       approx KL, clip fraction and entropy (one line per role), critic value
                          loss and explained variance against iteration

With several runs every panel overlays them: one colour per run (named once, in a legend right
of the panels), one line style per role (or per metric, named in each panel). Non-finite values (NaN) are skipped; a figure whose metrics no run has is skipped
with a note. Needs matplotlib.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

STYLES = ["-", "--", ":", "-."]  # line style of the n-th role (or metric) in a panel
X_LABELS = {"iteration": "iteration", "minutes": "wall time (minutes)", "tokens": "generated tokens (thousands)"}


def read_metrics(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl file, one dict per non-blank line, in file order."""
    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise SystemExit(f"{path}, line {number}: not valid JSON ({error}); fix or delete that line")
        if not isinstance(row, dict) or not isinstance(row.get("iteration"), int):
            raise SystemExit(f"{path}, line {number}: expected a JSON object with an integer \"iteration\"; "
                             "fix or delete that line")
        rows.append(row)
    return rows


def load_run(run_dir: Path) -> list[dict]:
    """The metrics rows of a run folder, with an early error naming what is missing."""
    if not run_dir.is_dir():
        raise SystemExit(f"run folder {run_dir} does not exist; pass the folder marft.py trained into")
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path} is missing; is {run_dir} a marft.py run folder (has it finished iteration 0)?")
    return read_metrics(path)


def finite(value) -> bool:
    """A real number that is not NaN or ±inf (JSON null, strings and booleans are not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def series(rows: list[dict], key: str, x: str = "iteration") -> tuple[list[float], list[float]]:
    """The finite points of `key`: x is the iteration; with x="minutes" time/elapsed / 60; with
    x="tokens" the training rollouts' charts/generated_tokens summed up to the row, in thousands
    (iteration 0, the evaluation before training, at 0). Rows without the key or x are skipped."""
    xs, ys, tokens = [], [], 0.0
    for row in rows:
        y = row.get(key)
        tokens += row.get("charts/generated_tokens", 0.0) if row["iteration"] > 0 else 0.0
        if x == "iteration":
            at = row["iteration"]
        elif x == "tokens":
            at = tokens / 1000 if row["iteration"] == 0 or "charts/generated_tokens" in row else None
        else:
            at = 0.0 if row["iteration"] == 0 else row.get("time/elapsed")
            at = at / 60 if finite(at) else None
        if finite(y) and finite(at):
            xs.append(at)
            ys.append(float(y))
    return xs, ys


def roles(runs: list[tuple[str, list[dict]]], prefix: str) -> list[str]:
    """The roles of the per-role keys "<prefix>/<role>" in any run, sorted."""
    return sorted({key.rsplit("/", 1)[1] for _, rows in runs for row in rows for key in row
                   if key.startswith(prefix + "/")})


def panel(ax, runs, lines: list[tuple[str, str]], x: str, title: str) -> bool:
    """Draw each (key, name) of `lines` for every run on `ax`; True if any point was drawn. One run:
    its lines are named in the panel's legend. Several: the panel's legend names the line styles
    only (grey), and `run_legend` names the runs' colours once for the whole figure."""
    drawn, styles = False, {}
    for colour, (_, rows) in enumerate(runs):
        for n, (key, name) in enumerate(lines):
            xs, ys = series(rows, key, x)
            if xs:
                ax.plot(xs, ys, STYLES[n % len(STYLES)], color=f"C{colour}", marker="o" if len(xs) <= 20 else None,
                        markersize=3, label=name)
                drawn, styles[name] = True, STYLES[n % len(STYLES)]
    ax.set_title(title)
    ax.set_xlabel(X_LABELS[x])
    ax.grid(alpha=0.3)
    if not drawn:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    elif len(runs) == 1:
        ax.legend(fontsize="small")
    elif len(styles) > 1:
        ax.legend([Line2D([], [], linestyle=style, color="grey") for style in styles.values()], list(styles),
                  fontsize="small")
    return drawn


def run_legend(fig, runs) -> None:
    """With several runs: one legend entry per run (its colour), outside the panels on the right."""
    if len(runs) > 1:
        handles = [Line2D([], [], color=f"C{colour}", marker="o", markersize=3) for colour in range(len(runs))]
        fig.legend(handles, [label for label, _ in runs], loc="center left", bbox_to_anchor=(1.0, 0.5),
                   fontsize="small", title="run")


def save(fig, drawn: bool, path: Path) -> Path | None:
    """Write `fig` to `path` if any panel has data, else print a note; close it either way."""
    if drawn:
        fig.tight_layout()
        fig.savefig(path, dpi=120, bbox_inches="tight")  # "tight": the runs' legend outside the panels is kept
    else:
        print(f"skipped {path.name}: none of its metrics is in any run")
    plt.close(fig)
    return path if drawn else None


def reward_figure(runs, path: Path) -> Path | None:
    """reward.png: training-batch reward and accuracy against iteration and wall time."""
    lines = [("charts/reward", "reward"), ("charts/accuracy", "accuracy")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    drawn = [panel(ax, runs, lines, x, "training batch") for ax, x in zip(axes, X_LABELS)]
    run_legend(fig, runs)
    return save(fig, any(drawn), path)


def heldout_figure(runs, path: Path) -> Path | None:
    """heldout_accuracy.png: held-out sampled pass@1 and greedy accuracy against iteration, wall time and tokens."""
    lines = [("eval/accuracy", "sampled pass@1"), ("eval/accuracy_greedy", "greedy")]
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
    drawn = [panel(ax, runs, lines, x, "held-out accuracy") for ax, x in zip(axes, X_LABELS)]
    run_legend(fig, runs)
    return save(fig, any(drawn), path)


def diagnostics_figure(runs, path: Path) -> Path | None:
    """diagnostics.png: per-role approx KL, clip fraction, entropy; value loss; explained variance."""
    def per_role(prefix):
        return [(f"{prefix}/{role}", role) for role in roles(runs, prefix)]

    panels = [(per_role("losses/approx_kl"), "approx KL"), (per_role("losses/clip_fraction"), "clip fraction"),
              (per_role("losses/entropy"), "entropy"), ([("losses/value_loss", "value loss")], "critic value loss"),
              ([("losses/explained_variance", "explained variance")], "critic explained variance")]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    drawn = [panel(ax, runs, lines, "iteration", title) for ax, (lines, title) in zip(axes.flat, panels)]
    axes.flat[-1].axis("off")  # five panels in a 2 x 3 grid
    run_legend(fig, runs)
    return save(fig, any(drawn), path)


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description="Plot marft.py run folders' metrics.jsonl into PNG figures.")
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="run folder(s) holding metrics.jsonl")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the PNGs (default: RUN_DIR/plots for one run, ./plots-compare for several)")
    parser.add_argument("--labels", default=None,
                        help="comma-separated legend name of each run (default: each run folder's name)")
    args = parser.parse_args(argv)
    labels = args.labels.split(",") if args.labels is not None else [run.resolve().name for run in args.runs]
    if len(labels) != len(args.runs):
        raise SystemExit(f"--labels has {len(labels)} names for {len(args.runs)} run folders; give one per run")
    runs = [(label, load_run(run)) for label, run in zip(labels, args.runs)]
    out = args.out or (args.runs[0] / "plots" if len(args.runs) == 1 else Path("plots-compare"))
    out.mkdir(parents=True, exist_ok=True)
    written = [reward_figure(runs, out / "reward.png"), heldout_figure(runs, out / "heldout_accuracy.png"),
               diagnostics_figure(runs, out / "diagnostics.png")]
    written = [path for path in written if path is not None]
    for path in written:
        print(f"wrote {path}")
    return written


if __name__ == "__main__":
    main()
