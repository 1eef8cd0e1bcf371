"""The held-out greedy accuracy (of 12 problems) after each iteration of every run of run.sh, and its
mean training reward per iteration: from the kept metrics beside this file (metrics/<run>.jsonl), or
from the runs run.sh writes (`python results/learning-test-seeds/summarise.py runs/learning-test-seeds`)."""
import json
import sys
from pathlib import Path

folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "metrics"
kept = {path.stem: path for path in folder.glob("*.jsonl")}
written = {path.parent.name: path for path in folder.glob("*/metrics.jsonl")}
print("| seed | sampler | greedy solved of 12, iterations 0-4 | mean training reward, iterations 1-4 |")
print("| ---: | --- | --- | --- |")
for run, path in sorted((kept or written).items()):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    seed, sampler = run.removeprefix("s").split("-")
    greedy = [round(r["eval/accuracy_greedy"] * 12) for r in rows if "eval/accuracy_greedy" in r]
    reward = [f"{r['charts/reward']:.2f}" for r in rows if "charts/reward" in r]
    print(f"| {seed} | {sampler} | {' '.join(map(str, greedy))} | {' '.join(reward)} |")
