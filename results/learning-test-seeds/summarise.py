"""The held-out greedy accuracy (of 12 problems) after each iteration of every run of run.sh, and its
mean training reward per iteration, from the kept metrics (or from runs/learning-test-seeds/)."""
import json
import sys
from pathlib import Path

folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "metrics"
print("| seed | sampler | greedy solved of 12, iterations 0-4 | mean training reward, iterations 1-4 |")
print("| ---: | --- | --- | --- |")
for path in sorted(folder.glob("*.jsonl")):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    seed, sampler = path.stem.removeprefix("s").split("-")
    greedy = [round(r["eval/accuracy_greedy"] * 12) for r in rows if "eval/accuracy_greedy" in r]
    reward = [f"{r['charts/reward']:.2f}" for r in rows if "charts/reward" in r]
    print(f"| {seed} | {sampler} | {' '.join(map(str, greedy))} | {' '.join(reward)} |")
