"""Learning that holds: does held-out greedy accuracy stay near its best once it reaches a threshold?

The benchmark of "learning that holds" (docs/learning-per-minute.md), one run per configuration
and seed, each `--minutes` of wall time (evaluations included):

    reach     minutes to the first held-out greedy evaluation ≥ `--threshold` (None: never)
    fall      the largest  max(greedy so far) − greedy  over the evaluations from the first reach on
    holds     reached, and fall ≤ `--max_fall` (a fall of 10 points below the running best is allowed)

Configurations (`--configs`; `--options` adds marft.py options to every run, e.g. a candidate recipe):

    single-l3  one agent on the level-3 sums with group advantages, 4 problems × 4 episodes per
               iteration, 4 optimiser steps, greedy evaluation every 2 iterations
               (docs/learning-per-minute.md's command; its rate decays by default since 374f15e, constant before)
    single-l3-hold  the same agent and task with the recipe that holds there: a baseline over the
               whole batch (16 problems × 1 episode, one optimiser step per iteration) and the rate
               decayed over 24 iterations (cosine) to a tenth, where it stays (now the default decay, kept explicit)
    chain      the default job (`bash scripts/train_math.sh`'s options): planner → solver, critic + GAE,
               the rate decayed as above (the default since 374f15e)
    single-l3-default  one agent on the level-3 sums with every other option at its default,
               evaluated every 2 iterations: since 8b6b870 the math task's single agent defaults
               to single-l3-hold's recipe (tasks.MATH.organisation_options); critic + GAE, 16
               problems per iteration and the decay before

Writes <out>/summary.json and <out>/summary.md, and keeps each run's metrics.jsonl in
<out>/<config>-seed<k>/ (the run folders themselves go to <out>/runs/, not meant to be committed).
A performance figure, so one run at a time on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import shutil
import subprocess
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

CONFIGS = {
    "single-l3": ["--agents", "single", "--arithmetic_levels", "3", "--advantage", "group", "--group_baseline", "group", "--group_size", "4",
                  "--batch_size", "4", "--credit", "shared", "--minibatch_size", "4", "--eval_interval", "2"],
    "chain": [],
    "single-l3-default": ["--agents", "single", "--arithmetic_levels", "3", "--eval_interval", "2"],
}
CONFIGS["single-l3-hold"] = CONFIGS["single-l3"] + ["--group_baseline", "batch", "--batch_size", "16", "--group_size", "1",
                                                    "--minibatch_size", "16", "--lr_schedule", "cosine",
                                                    "--lr_decay_iterations", "24", "--lr_final_ratio", "0.1"]


def reach_and_fall(points: list[dict], threshold: float) -> dict:
    """From a run's evaluations (bench.evaluations: minutes, greedy, in order): the minutes of the
    first greedy ≥ threshold, the best greedy, and the largest fall below the running best at or
    after that evaluation (0.0 if none; None for both when the threshold is never reached)."""
    best, reach, fall = float("-inf"), None, None
    for point in points:
        best = max(best, point["greedy"])
        if reach is None and point["greedy"] >= threshold:
            reach, fall = point["minutes"], 0.0
        if reach is not None:
            fall = max(fall, best - point["greedy"])
    return {"reach_minutes": reach, "largest_fall": fall, "best": best}


def verdict(run: dict, max_fall: float, reach_minutes: float | None) -> dict:
    """`holds`: reached and never fell more than max_fall below the running best (1e-9 spares the
    rounding of 0.84 − 0.74); `in_time`: reached within reach_minutes (None: not asked)."""
    holds = run["reach_minutes"] is not None and run["largest_fall"] <= max_fall + 1e-9
    in_time = None if reach_minutes is None else run["reach_minutes"] is not None and run["reach_minutes"] <= reach_minutes
    return {"holds": holds, "in_time": in_time}


def commit() -> str | None:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return result.stdout.strip() or None


def markdown(report: dict) -> str:
    o = report["settings"]
    lines = [f"Measured {report['date']} at commit {report['commit']}: `python scripts/stability.py "
             f"{report['command']}`; {o['minutes']} min per run, threshold {o['threshold']}, allowed fall {o['max_fall']}.", "",
             "| run | iterations | minutes to ≥ threshold | best | largest fall after it | greedy at the end | pass@1 at the end | holds |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    fmt = lambda x: "—" if x is None else f"{x:.2f}"
    for name, run in report["runs"].items():
        lines.append(f"| {name} | {run['iterations']} | {fmt(run['reach_minutes'])} | {run['best']:.2f} | {fmt(run['largest_fall'])} "
                     f"| {run['greedy_end']:.2f} | {fmt(run.get('pass1_end'))} | {'yes' if run['holds'] else 'no'}"
                     + ("" if run["in_time"] is None else f", {'in' if run['in_time'] else 'not in'} time") + " |")
    lines.append("")
    for config, counts in report["configs"].items():
        lines.append(f"- {config}: holds in {counts['holds']} of {counts['seeds']} seeds"
                     + ("" if counts["in_time"] is None else f", reaches {o['threshold']} within {o['reach_minutes']} min in "
                        f"{counts['in_time']} of {counts['seeds']}"))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--configs", default="single-l3,chain", help=f"configurations, of {', '.join(CONFIGS)}")
    parser.add_argument("--seeds", default="1,2,3", help="seeds, one run each per configuration")
    parser.add_argument("--minutes", type=float, default=20.0, help="wall time of each run (--time_limit_minutes)")
    parser.add_argument("--iterations", type=int, default=1000, help="--iterations of each run (the horizon of a --lr_schedule; "
                        "the time limit ends the run first when it is large)")
    parser.add_argument("--options", default="", help="marft.py options added to every run, as one string: --options='--lr 1e-4 --skip_zero_signal_groups'")
    parser.add_argument("--threshold", type=float, default=0.8, help="held-out greedy accuracy a run must reach")
    parser.add_argument("--max_fall", type=float, default=0.10, help="largest allowed fall below the running best after it")
    parser.add_argument("--reach_minutes", type=float, default=3.7, help="single-l3 (and single-l3-hold) must reach the threshold within this "
                        "many minutes (the peer GRPO trainer's time, docs/learning-per-minute.md)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each run")
    parser.add_argument("--out", default=str(ROOT / "results" / "stability" / "default"), help="report folder")
    args = parser.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    if unknown := [c for c in configs if c not in CONFIGS]:
        raise SystemExit(f"stability: unknown configuration {unknown}; choose from {', '.join(CONFIGS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    out = Path(args.out)
    report = {"date": date.today().isoformat(), "commit": commit(),
              "command": " ".join(shlex.quote(a) for a in sys.argv[1:]), "settings": vars(args), "runs": {}}
    for config in configs:
        for seed in seeds:
            name = f"{config}-seed{seed}"
            marft_args = CONFIGS[config] + ["--iterations", str(args.iterations), "--time_limit_minutes", str(args.minutes),
                                            "--seed", str(seed)] + shlex.split(args.options)
            print(f"stability: {name}: marft.py {' '.join(marft_args)}", flush=True)
            rows, _ = bench.run_marft(out, name, marft_args, args.threads)
            (out / name).mkdir(parents=True, exist_ok=True)
            shutil.copy(out / "runs" / name / "metrics.jsonl", out / name / "metrics.jsonl")
            points = bench.evaluations(rows)
            run = reach_and_fall(points, args.threshold) | {"iterations": rows[-1]["iteration"], "greedy_end": points[-1]["greedy"],
                                                           "pass1_end": points[-1].get("pass1"),
                                                           "greedy": [[round(p["minutes"], 2), p["greedy"]] for p in points]}
            run |= verdict(run, args.max_fall, args.reach_minutes if config.startswith("single-l3") else None)
            report["runs"][name] = run
            print(f"stability: {name}: reach {run['reach_minutes']}, fall {run['largest_fall']}, holds {run['holds']}", flush=True)
            write_report(report, out)  # after every run: a benchmark cut short keeps what it measured
    print(markdown(report), flush=True)


def write_report(report: dict, out: Path) -> None:
    """summary.json and summary.md, with per configuration the counts over the seeds run so far."""
    by_config: dict[str, list[dict]] = {}
    for name, run in report["runs"].items():
        by_config.setdefault(name.rsplit("-seed", 1)[0], []).append(run)
    report["configs"] = {config: {"seeds": len(runs), "holds": sum(r["holds"] for r in runs),
                                  "in_time": None if runs[0]["in_time"] is None else sum(bool(r["in_time"]) for r in runs)}
                         for config, runs in by_config.items()}
    (out / "summary.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "summary.md").write_text(markdown(report))


if __name__ == "__main__":
    main()
