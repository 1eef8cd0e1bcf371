"""Run marft.py and sample its resident memory every 0.2 s; print the peak per phase window.

    . .venv/bin/activate; python results/speed/orchestrated-peak/monitor.py NAME [marft.py options …]

The run goes to runs/orchestrated-peak/NAME (remove it to run NAME again), its output to NAME.log
there. The phases are placed on the sampling clock by taking the process's last sample as the end
of the last iteration, so every window sits late by the time the run takes to exit (seconds): a
phase's maximum can include the start of the phase after it (README.md beside this file)."""
import json
import subprocess
import sys
import time
from pathlib import Path

name, args = sys.argv[1], sys.argv[2:]
out = Path(__file__).resolve().parents[3] / "runs" / "orchestrated-peak"
cmd = [sys.executable, "marft.py", "--output_dir", str(out), "--run_name", name, *args]
t0 = time.time()
out.mkdir(parents=True, exist_ok=True)
log = out / f"{name}.log"
p = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[3], stdout=log.open("w"), stderr=subprocess.STDOUT)
samples = []
while p.poll() is None:
    try:
        rss = next(int(l.split()[1]) for l in open(f"/proc/{p.pid}/status") if l.startswith("VmRSS"))
        samples.append((time.time() - t0, rss / 1024))
    except (StopIteration, FileNotFoundError, ProcessLookupError):
        pass
    time.sleep(0.2)
if p.returncode:
    sys.exit(f"marft.py exited with {p.returncode}: see {log}")
rows = [json.loads(l) for l in (out / name / "metrics.jsonl").read_text().splitlines()]
# the run's clock starts a little after the process; align the end of the last iteration to the last sample with rss
print(name, "peak", round(max(r for _, r in samples)), "MiB at", round(max(samples, key=lambda s: s[1])[0], 1), "s of", round(samples[-1][0], 1))
phases = ["rollout", "values", "advantages", "policy_update", "critic_update", "adapter_sync", "eval"]
offset = samples[-1][0] - rows[-1]["time/elapsed"]  # approx: process start to run clock + teardown
for r in rows[1:]:
    end = r["time/elapsed"] + offset
    start = end - r["time/iteration"]
    t = start
    for ph in phases:
        d = r.get(f"time/{ph}", 0.0)
        window = [m for s, m in samples if t <= s < t + d]
        if window:
            print(f"  iter {r['iteration']} {ph:14s} {d:6.1f} s  max {max(window):7.0f} MiB")
        t += d
before = [m for s, m in samples if s < rows[1]["time/elapsed"] + offset - rows[1]["time/iteration"]]
print("  before iteration 1 (load, first eval): max", round(max(before)))
