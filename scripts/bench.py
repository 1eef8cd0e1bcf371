"""The benchmark suite: speed, memory and learning of marft on one machine, in one invocation.

Sections (each a function returning a dict; `--skip a,b` leaves sections out):

    throughput  rollout tokens/s: response tokens / seconds of `generation.generate` (hf backend) on the
                default task's planner prompts; update tokens/s: (prompt + response) tokens / seconds
                of a forward + backward through a policy adapter (`agents.action_logprobs`) and the
                critic (`critic.action_values`), one minibatch at a time as in training.
    backends    rollout tokens/s of the hf and the vLLM backend on the same prompts, the same
                adapters (random, nonzero LoRA weights), the same thread count, after one warm-up call.
    phases      seconds per iteration by phase (rollout, values, advantages, policy update, critic
                update, adapter sync) from the `time/*` metrics of a real `marft.py` run (chain),
                averaged over its iterations after the first (whose one-time costs are reported
                apart), with prefix sharing (the default) and without (`--no-prefix_sharing`), and
                with the CPU-specific paths off (MARFT_CPU_PATHS=off: kernels capped at AVX2, speed.py),
                one run after the other: `prefix_sharing_speedup` and `cpu_paths_speedup` are ratios
                of their iteration times (each > 1 when the
                default's choice is the faster); the evaluation is reported apart. `floor_ratio`: the
                default run's iteration time over its floor, the matrix products it executes at this
                machine's GEMM rate (scripts/profile_iteration.py, one more run of the same options,
                over the same iterations); `padding_free_floor_ratio`: over the products no
                implementation can skip (each agent's shared prefix once, no padding; the same script).
    memory      peak resident memory (ru_maxrss of the `marft.py` process) of 1, 2 and 4 agents
                (`--agents single | chain | chain4`) at the same number of problems per iteration,
                with the default options and critic + GAE for all three (`--advantage gae`: the
                single agent's default has no critic); the ratio 4-agent / 1-agent, the base model's
                and one adapter's size, and the mean prompt length per agent position (later
                agents read earlier agents' actions).
    contention  the default chain's iteration alone and beside a competing 2-thread busy process,
                under libgomp's default spin and under GOMP_SPINCOUNT=3000 (scripts/setup_env.sh's
                choice on a shared machine): the slowdown of each.
    grading     seconds to grade one program of the default code task (`--data code`, 4 tests) in
                the code sandbox as the machine runs it (envs/sandbox.py: its isolation, the judge
                and the program's process): the reference solutions and as many wrong programs,
                one after the other; the median and the 90th percentile.
    learning    single agent vs two-agent chain vs two agents with D ≡ 0 (`parallel`) vs the
                orchestrated team (D decided step by step), each with its defaults (critic + GAE;
                the single agent: group advantages against the batch's mean, tasks.MATH's recipe for
                it; the row records the estimator its run used), and the chain with group
                advantages (no critic; G = 4 episodes of a quarter as many problems, as many
                episodes per iteration as GAE's, credit `shared`), on the default task; and on the
                word task (tools.py) caller → calculator → answerer, the same with one shared
                adapter (one agent that uses the calculator) and one agent without a tool; all
                at equal wall time (`--time_limit_minutes`, which counts the evaluations too),
                seeds 1, 2 and 3: held-out pass@1 and greedy accuracy at iteration 0 and at the end,
                seconds per iteration, peak resident memory, and overlay plots, one set per task (scripts/plot.py).
                Then per configuration, mean and range over seeds (`comparison`): held-out greedy
                accuracy at equal wall time (the last evaluation) and at equal training tokens (the
                last evaluation within the smallest final token count of the task's runs), and
                against the bar of majority voting: the untrained single agent's maj@k
                (evaluate.py, BASELINE_SAMPLES samples per problem, on each seed's held-out set)
                with k as large as the configuration's tokens per held-out episode allow.

`--learning_runs a,b` measures only those learning configurations (`--learning_seeds 1,2`: with
those seeds); with `--merge` the sections and
learning runs of the existing bench.json that this invocation does not measure are kept (e.g. a
new organisation added to an earlier comparison: same machine, same `--learning_minutes`).
Writes <out>/bench.json and <out>/bench.md (+ figures); `--update_page` (old name:
`--update_readme`) puts bench.md between the `<!-- bench:start -->` and `<!-- bench:end -->`
lines of docs/benchmark.md; `--render_only` rewrites bench.md (and, with `--update_page`, the
page's block) from an existing bench.json. `--learning_from FOLDER` measures nothing either: it compares
runs made with marft.py outside the bench (`imported_learning`: e.g. two side by side, a thread each), one
folder per run in FOLDER, at equal `--learning_minutes`, against the bar of FOLDER's untrained-*.json
evaluate.py reports, into FOLDER's bench.json, bench.md and learning/. `--model` measures another base model in every section
(marft.py's option: a local folder, or `random:models/qwen2.5-0.5b.json`, that shape with random
weights, whose seconds and bytes are real and whose accuracies mean nothing). `--quick`
is a smoke test of every section in a few minutes (prompts cut to 64 tokens, and the learning
section runs `chain-group`, seed 1 only: the phases and memory runs train with critic + GAE; CI runs
it on a 2-layer random model, tests/test_bench.py); the full mode takes about four and a half hours
on 2 cores (24 learning runs of 10 minutes).
marft.py is run as a subprocess (nothing imports it); its runs go to <out>/runs/ (not committed).
Each learning run's metrics.jsonl is kept in <out>/learning/metrics/<run>/, which the plot is drawn
from, so a later `--merge` on another machine redraws it; rows merged from a report that kept no
metrics stay in the table and are named as missing from the figure.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import agents  # noqa: E402
import critic  # noqa: E402
import generation  # noqa: E402
import speed  # noqa: E402
import tasks  # noqa: E402
from envs import make_arithmetic_problems  # noqa: E402
from flex_pomdp import BUILTIN_ORGANISATIONS, load_organisation, unrolled_messages  # noqa: E402
from config import LORA_ALPHA, LORA_TARGETS, Config  # noqa: E402
from run import random_config_error  # noqa: E402

SECTIONS = ("throughput", "backends", "phases", "memory", "contention", "grading", "learning")
DEFAULTS = Config()  # every section measures the default organisation, LoRA shape and prompts, on --model (smollm2 unless given)
FULL = dict(grading_programs=100, prompts=32, new_tokens=32, prompt_tokens=DEFAULTS.max_prompt_tokens, batch_size=16, phase_iterations=3,
            phase_cold_iterations=1, ceiling_repeats=5,
            phase_variants=("cpu_paths",), eval_problems=4, learning_minutes=10.0,
            learning_runs=("single", "chain", "parallel", "chain-group", "orchestrated", "word:calculator_team",
                           "word:calculator_team+shared", "word:single"), learning_seeds=(1, 2, 3),
            wait_policies=("spin 300,000 rounds (libgomp's default)", "spin 3,000 rounds (GOMP_SPINCOUNT=3000)"))
# The CI smoke test: every section, each with as few runs as still exercise it, the training runs on
# prompts cut to their last 64 tokens (its figures say nothing about the real sizes); the phase run's
# variants but the one without prefix sharing are left out (tests compare each option's numbers on and off).
QUICK = dict(grading_programs=4, prompts=4, new_tokens=8, prompt_tokens=64, batch_size=1, phase_iterations=1, phase_cold_iterations=0, phase_variants=(),
             ceiling_repeats=1,
             eval_problems=1, learning_minutes=0.1,
             learning_runs=("chain-group",), learning_seeds=(1,),
             wait_policies=("spin 3,000 rounds (GOMP_SPINCOUNT=3000)",))  # the section's code, with the fewest runs


def machine() -> dict:
    mem_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
    versions = {}
    for package in ("torch", "transformers", "peft", "vllm"):
        try:
            versions[package] = __import__(package).__version__
        except ImportError:
            versions[package] = "not installed"
    return {"date": date.today().isoformat(), "cpu_cores": os.cpu_count(), "memory_gib": round(mem_kib / 2**20, 1),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
            "processor": cpu_name(), **versions}


def cpu_name() -> str:
    """The CPU: /proc/cpuinfo's model name with its family and model numbers, else the platform's
    name. A virtual machine's model name may hide the generation ("AMD EPYC" is Zen 4 at family 25
    and Zen 5 at 26), and the generation decides this report's GEMM rate and so every floor ratio."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        first = ""
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first.splitlines())}
    if "model name" not in fields:
        return platform.processor() or platform.machine()
    return f"{platform.machine()}, {fields['model name']}, family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"


def planner_prompts(tokenizer, count: int) -> list[list[int]]:
    """The default task's first-agent prompts (default organisation, arithmetic train problems)."""
    org = load_organisation(DEFAULTS.agents)
    problems = make_arithmetic_problems("train", seed=DEFAULTS.seed)[:count]
    messages = [unrolled_messages(org, org.order[0], p.problem, {}) for p in problems]
    return agents.tokenize_prompts(tokenizer, messages, DEFAULTS.max_prompt_tokens)[0]


def lora_config():
    """The default LoRA shape of config.Config."""
    return agents.lora_config(DEFAULTS.lora_rank, LORA_ALPHA, LORA_TARGETS.split(","))


def policies_with_random_adapters(model_name: str, roles: list[str]):
    """The base model with one adapter per role whose A and B are random (as after training); a
    random: base is drawn from seed 0 too (whichever sections ran before)."""
    torch.manual_seed(0)
    base, tokenizer = agents.load_base_model(model_name)
    torch.manual_seed(0)
    config = lora_config()
    config.init_lora_weights = False
    return agents.attach_adapters(base, roles, config), tokenizer


def tokens_per_second(generate, prompts) -> tuple[float, int]:
    generate(prompts[:2])  # warm-up
    torch.manual_seed(0)
    started = time.perf_counter()
    actions = generate(prompts)
    tokens = sum(len(t) for t in actions.token_ids)
    return tokens / (time.perf_counter() - started), tokens


def throughput(sizes: dict, threads: int) -> dict:
    model, tokenizer = policies_with_random_adapters(sizes["model"], ["planner", "critic"])
    prompts = planner_prompts(tokenizer, sizes["prompts"])
    sampling = generation.Sampling(1.0, 1.0, sizes["new_tokens"])
    rollout_tps, _ = tokens_per_second(lambda p: generation.generate(model, tokenizer, p, "planner", sampling, 64), prompts)
    torch.manual_seed(0)
    responses = generation.generate(model, tokenizer, prompts, "planner", sampling, 64).token_ids
    heads = critic.make_value_heads(model.config.hidden_size, ["critic"])
    pad, minibatch = tokenizer.pad_token_id, 8
    tokens = sum(len(p) + len(r) for p, r in zip(prompts, responses))
    timings = {}
    for name in ("policy", "critic"):
        started = time.perf_counter()
        for start in range(0, len(prompts), minibatch):
            p, r = prompts[start : start + minibatch], responses[start : start + minibatch]
            if name == "policy":
                loss = -agents.action_logprobs(model, p, r, "planner", pad, "mean", 1.0)[0].mean()
            else:
                loss = critic.action_values(model, heads, "critic", p, pad).pow(2).mean()
            loss.backward()
        timings[name] = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    return {"threads": threads, "prompts": len(prompts), "max_new_tokens": sizes["new_tokens"],
            "rollout_tokens_per_second": rollout_tps,
            "policy_update_tokens_per_second": tokens / timings["policy"],
            "critic_update_tokens_per_second": tokens / timings["critic"]}


def backends(sizes: dict, threads: int, out: Path) -> dict:
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        return {"skipped": f"vLLM not importable ({err}); MARFT_VLLM=1 bash scripts/setup_env.sh installs it"}
    roles = ["planner", "solver"]
    model, tokenizer = policies_with_random_adapters(sizes["model"], roles)
    prompts = planner_prompts(tokenizer, sizes["prompts"])
    sampling = generation.Sampling(1.0, 1.0, sizes["new_tokens"])
    hf_tps, hf_tokens = tokens_per_second(lambda p: generation.generate(model, tokenizer, p, "planner", sampling, 64), prompts)
    started = time.perf_counter()
    vllm_config = Config(model=sizes["model"], backend="vllm", seed=0, max_new_tokens=sizes["new_tokens"], threads=threads)
    engine = generation.make_backend(vllm_config, model, tokenizer, roles, fallback_sync_dir=out / "runs" / "vllm-sync")
    startup = time.perf_counter() - started
    try:
        vllm_tps, vllm_tokens = tokens_per_second(lambda p: engine.generate(p, "planner", sampling), prompts)
        base_tps, _ = tokens_per_second(lambda p: engine.generate(p, None, sampling), prompts)
    finally:
        engine.close()
    return {"threads": threads, "prompts": len(prompts), "max_new_tokens": sizes["new_tokens"],
            "hf_decoding": "generation.decode + peft", "omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", ""),
            "hf_tokens_per_second": hf_tps, "vllm_tokens_per_second": vllm_tps,
            "vllm_without_lora_tokens_per_second": base_tps, "vllm_startup_seconds": startup,
            "tokens": {"hf": hf_tokens, "vllm": vllm_tokens}}


def run_marft(out: Path, name: str, args: list[str], threads: int, env_extra: dict | None = None) -> tuple[list[dict], float]:
    """Run marft.py in a child process (`env_extra`: variables set for it); returns (its metrics.jsonl
    rows, its peak RSS in MiB)."""
    run_dir = out / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    # The wrapper waits for marft.py and reports the largest resident set of its children.
    wrapper = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
               "print('PEAK_RSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")
    command = [sys.executable, "-c", wrapper, sys.executable, str(ROOT / "marft.py"), "--output_dir", str(out / "runs"),
               "--run_name", name, "--threads", str(threads), *args]
    # The job as scripts/train_math.sh runs it with the hf backend: OpenMP's default wait policy
    # (bench.sh installs vLLM for its backends section, and setup_env.sh then sets PASSIVE).
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")} | (env_extra or {})
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"marft.py {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    peak = next(int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("PEAK_RSS_KIB"))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows, peak / 1024


def short_run_args(sizes: dict, agents_name: str, iterations: int) -> list[str]:
    return ["--model", sizes["model"], "--agents", agents_name, "--iterations", str(iterations), "--batch_size", str(sizes["batch_size"]),
            "--max_new_tokens", str(sizes["new_tokens"]), "--max_prompt_tokens", str(sizes["prompt_tokens"]),
            "--eval_problems", str(sizes["eval_problems"]), "--eval_samples", "1", "--no-eval_greedy"]


PHASES = ("rollout", "values", "advantages", "policy_update", "critic_update", "adapter_sync", "eval")

# How OpenMP's idle threads wait: libgomp's default, and scripts/setup_env.sh's choice on a machine
# that other processes keep busy.
WAIT_POLICIES = {"spin 300,000 rounds (libgomp's default)": {}, "spin 3,000 rounds (GOMP_SPINCOUNT=3000)": {"GOMP_SPINCOUNT": "3000"}}
COMPETITOR = ("import time, torch\ntorch.set_num_threads(2)\na = torch.randn(1024, 1024)\nt = time.time()\n"
              "while time.time() - t < 3600: a @ a")


def contention(sizes: dict, threads: int, out: Path) -> dict:
    """Seconds of the default chain's first iteration (no evaluation in it) alone and beside one
    competing busy process of 2 threads (torch's matrix products), under each of WAIT_POLICIES,
    one run after the other: `slowdown` = beside / alone, the fair share on 2 cores being about 2."""
    table = {}
    for policy, env in ((name, WAIT_POLICIES[name]) for name in sizes["wait_policies"]):
        seconds = {}
        for where in ("alone", "beside_a_busy_process"):
            competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR]) if where != "alone" else None
            try:
                time.sleep(1.0 if competitor else 0.0)  # the competitor has its threads busy before the run starts
                rows, _ = run_marft(out, f"contention-{len(table)}-{where}", short_run_args(sizes, "chain", 1), threads, env)
            finally:
                if competitor:
                    competitor.kill()
                    competitor.wait()
            first = next(r for r in rows if r["iteration"] == 1)
            seconds[where] = first["time/iteration"] - first.get("time/eval", 0.0)
        table[policy] = {**{f"{where}_seconds": s for where, s in seconds.items()},
                         "slowdown": seconds["beside_a_busy_process"] / seconds["alone"]}
    return table


def grading(sizes: dict) -> dict:
    """Seconds of `sandbox.run_tests` per program of the default code task: the first
    `grading_programs` training problems' reference solutions and a wrong program for each
    (`f(x)` returns x), one after the other."""
    from envs import make_code_problems, sandbox
    seconds = []
    for problem in make_code_problems("train")[: sizes["grading_programs"]]:
        name = problem.solution.split("(")[0].removeprefix("def ")
        for program in (problem.solution, f"def {name}(x):\n    return x\n"):
            seconds.append(sandbox.run_tests(program, list(problem.tests)).seconds)
    seconds.sort()
    return {"isolation": sandbox.isolation(), "syscall_filter": sandbox.syscall_filter(), "programs": len(seconds),
            "median_seconds": statistics.median(seconds), "p90_seconds": seconds[int(0.9 * (len(seconds) - 1))]}


def grading_lines(g: dict) -> list[str]:
    """The grading section of the report (markdown lines)."""
    return ["| grading one program of the code task (4 tests) | programs | median (s) | 90th percentile (s) |",
            "| --- | --- | --- | --- |",
            f"| sandbox `{g['isolation']}`, syscall filter `{g['syscall_filter']}` | {g['programs']} | "
            f"**{g['median_seconds']:.3f}** | {g['p90_seconds']:.3f} |", ""]


def contention_lines(c: dict) -> list[str]:
    """The contention section of the report (markdown lines)."""
    lines = ["| OpenMP's idle threads (the chain's first iteration) | alone (s) | beside a 2-thread busy process (s) | slowdown |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {policy} | {row['alone_seconds']:.1f} | {row['beside_a_busy_process_seconds']:.1f} | **{row['slowdown']:.1f}×** |"
              for policy, row in c.items()]
    return lines + ["", "Fair share on 2 cores is about 2×. scripts/setup_env.sh takes the short spin where other processes "
                        "keep at least half a core busy when a run starts (the run's `[threads]` line says which), the "
                        "long one on a machine to itself.", ""]


def phase_seconds(rows: list[dict], cold: int = 0) -> dict:
    """Mean seconds of each phase over a run's trained iterations (metrics `time/<phase>`) after its
    first `cold` ones, which carry one-time costs (first touches of memory, kernels set up for new
    shapes); their iteration time, evaluation left out, is kept apart."""
    trained = [r for r in rows if r["iteration"] > 0]
    warm = trained[cold:]
    table = {"iterations": len(warm), **{f"{p}_seconds": sum(r[f"time/{p}"] for r in warm) / len(warm) for p in PHASES}}
    table["iteration_seconds_without_eval"] = sum(table[f"{p}_seconds"] for p in PHASES if p != "eval")
    if cold:
        table["cold_iterations"] = cold
        table["cold_iteration_seconds_without_eval"] = sum(r[f"time/{p}"] for r in trained[:cold] for p in PHASES if p != "eval") / cold
    return table


# The phase run's variants, each the default chain run with one of the default's choices undone: the
# report's key of its phase table, the environment it runs in, the name of its speedup (the variant's
# iteration time over the default's: how many times faster the default's choice makes the iteration).
PHASE_VARIANTS = {"cpu_paths": ("without_cpu_paths", {speed.CPU_PATHS_VARIABLE: "off", **speed.AVX2_CAPS}, "cpu_paths_speedup")}


def phases_and_memory(sizes: dict, threads: int, out: Path, skip: set[str]) -> tuple[dict, dict]:
    """One short run per organisation with the default options and critic + GAE: peak memory; the chain run also
    gives the seconds per phase, and a chain run without prefix sharing the comparison."""
    memory, phase_table = {"default": {}}, {}
    for agents_name, count in (("single", 1), ("chain", 2), ("chain4", 4)):
        is_phase_run = agents_name == "chain"
        if "memory" in skip and not is_phase_run:
            continue
        # critic + GAE for every organisation (the math task's single agent has none by default),
        # so that the three runs differ only in the number of agents
        args = (short_run_args(sizes, agents_name, sizes["phase_iterations"] if is_phase_run else 1)
                + ["--advantage", "gae", "--minibatch_size", str(DEFAULTS.minibatch_size)])  # not the single agent's recipe
        rows, peak = run_marft(out, f"memory-default-{agents_name}", args, threads)
        memory["default"][f"{count}_agents"] = {"organisation": agents_name, "peak_rss_mib": peak}
        if is_phase_run and "phases" not in skip:
            phase_table = {"problems_per_iteration": sizes["batch_size"], **phase_seconds(rows, sizes["phase_cold_iterations"])}
            plain_rows, plain_peak = run_marft(out, "phases-no-prefix-sharing", args + ["--no-prefix_sharing"], threads)
            phase_table["without_prefix_sharing"] = {**phase_seconds(plain_rows, sizes["phase_cold_iterations"]), "peak_rss_mib": plain_peak}
            phase_table["prefix_sharing_speedup"] = (phase_table["without_prefix_sharing"]["iteration_seconds_without_eval"]
                                                     / phase_table["iteration_seconds_without_eval"])
            phase_table["floor"] = iteration_floor(out, args, sizes["phase_iterations"], sizes["phase_cold_iterations"], threads,
                                                   sizes["ceiling_repeats"])
            phase_table["floor_ratio"] = phase_table["iteration_seconds_without_eval"] / phase_table["floor"]["floor_seconds"]
            phase_table["padding_free_floor_ratio"] = (phase_table["iteration_seconds_without_eval"]
                                                       / phase_table["floor"]["padding_free_floor_seconds"])
            for variant in sizes["phase_variants"]:
                key, environment, speedup = PHASE_VARIANTS[variant]
                variant_rows, variant_peak = run_marft(out, f"phases-{key.replace('_', '-')}", args, threads, environment)
                phase_table[key] = {**phase_seconds(variant_rows, sizes["phase_cold_iterations"]), "peak_rss_mib": variant_peak}
                seconds = phase_table["iteration_seconds_without_eval"], phase_table[key]["iteration_seconds_without_eval"]
                phase_table[speedup] = seconds[1] / seconds[0]
    if "memory" in skip:
        return phase_table, {}
    memory["default"]["ratio_4_to_1"] = memory["default"]["4_agents"]["peak_rss_mib"] / memory["default"]["1_agents"]["peak_rss_mib"]
    base, tokenizer = agents.load_base_model(sizes["model"])
    memory["base_model_mib"] = sum(p.numel() * p.element_size() for p in base.parameters()) / 2**20
    model = agents.attach_adapters(base, ["one"], lora_config())
    memory["adapter_mib"] = sum(p.numel() * p.element_size() for p in agents.adapter_parameters(model, "one")) / 2**20
    memory["prompt_tokens_by_agent_position"] = prompt_lengths_by_position(tokenizer)
    return phase_table, memory


def iteration_floor(out: Path, phase_args: list[str], iterations: int, cold: int, threads: int, ceiling_repeats: int) -> dict:
    """The phase run's floor (scripts/profile_iteration.py): the same options and seed, one more
    iteration, the last under the profiler; its matrix FLOPs per token at this machine's GEMM rate
    over the tokens of the phase run's iterations after its first `cold` ones (the same problems:
    the same seed), the profiled iteration's seconds by op family, and the pass ceiling's ratios (the
    best of `ceiling_repeats` passes each)."""
    options = [a for i, a in enumerate(phase_args) if a != "--iterations" and phase_args[i - 1 : i] != ["--iterations"]]
    folder = out / "profile"
    command = [sys.executable, str(ROOT / "scripts" / "profile_iteration.py"), "--iterations", str(iterations + 1),
               "--ceiling_repeats", str(ceiling_repeats), "--out", str(folder), "--", *options, "--threads", str(threads)]
    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}  # as run_marft
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"profile_iteration.py {' '.join(command[2:])} failed:\n{result.stderr[-3000:]}")
    profile = json.loads((folder / "profile.json").read_text())
    shutil.rmtree(folder / "runs", ignore_errors=True)
    warm = slice(cold, iterations)  # the iterations phase_seconds averages
    return {"floor_seconds": sum(profile["floor_seconds_by_iteration"][warm]) / (iterations - cold),
            "padding_free_floor_seconds": sum(profile["padding_free_floor_seconds_by_iteration"][warm]) / (iterations - cold),
            "gemm_gflops_per_second": profile["gemm_gflops_per_second"],
            "matmul_mflop_per_token": profile["matmul_flops_per_token"] / 1e6,
            # the profile run's own unprofiled iterations after the first: the same code and options measured again
            "profile_run_seconds": profile["warm_seconds_per_iteration"], "profile_run_floor_ratio": profile["floor_ratio"],
            **{key: profile[key] for key in ("profiled_seconds", "profiled_seconds_by_family")},
            # one plain pass of the same model against its floor (profile_iteration.pass_ceiling)
            "pass_ceiling_ratios": {name: profile["pass_ceiling"][name]["ratio"] for name in ("forward", "forward_backward")},
            "pass_ceiling_rows_and_tokens": [profile["pass_ceiling"]["rows"],
                                             profile["pass_ceiling"]["prompt_tokens"] + profile["pass_ceiling"]["response_tokens"]]}


def prompt_lengths_by_position(tokenizer) -> list[float]:
    """Mean prompt tokens of each agent of chain4 when each parent's action is a typical 20-token one."""
    org = load_organisation("chain4")
    problems = make_arithmetic_problems("train", seed=1)[:8]
    typical_action = "Multiply the two digits: 6 * 7 = 42. The answer is \\boxed{42}."
    lengths = []
    for role in org.order:
        parents = {parent: typical_action for parent in org.parents(role)}
        messages = [unrolled_messages(org, role, p.problem, parents) for p in problems]
        ids = agents.tokenize_prompts(tokenizer, messages, DEFAULTS.max_prompt_tokens)[0]
        lengths.append(sum(map(len, ids)) / len(ids))
    return lengths


def learning_configuration(name: str) -> tuple[str, str, str, bool]:
    """A learning run's name, [task:]organisation[-group][+shared] → (organisation, "group" or "",
    task or "" for the default task, --shared_adapter): e.g. word:calculator_team+shared is the
    word task's caller → calculator → answerer with one adapter (one agent that uses a tool)."""
    task, _, rest = name.rpartition(":")
    shared = rest.endswith("+shared")
    agents_name, _, estimator = rest.removesuffix("+shared").partition("-")
    return agents_name, estimator, task, shared


def run_configuration(run: str) -> tuple[str, str]:
    """A learning run's name, <configuration>-seed<k> → (configuration, k)."""
    configuration, seed = run.rsplit("-seed", 1)
    return configuration, seed


def source_commit() -> str:
    """The commit of the code a run measures (`git rev-parse --short HEAD`), + "-dirty" when tracked
    files other than the bench's own outputs (results/, docs/) differ from it; "unknown" outside a
    git checkout."""
    git = lambda *args: subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return "unknown"
    code_changes = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!results", ":!docs").stdout.strip()
    return head.stdout.strip() + ("-dirty" if code_changes else "")


BASELINE_SAMPLES = 8  # samples per problem of the untrained single agent's majority vote (quick: 2)


def evaluations(rows: list[dict]) -> list[dict]:
    """A run's held-out evaluations (metrics.jsonl lines with eval/accuracy_greedy), each with what
    was spent before it: minutes of wall time (time/elapsed, evaluations included; 0 before
    training) and training tokens (charts/generated_tokens summed over the lines so far), and what
    it measured: greedy accuracy at every one; pass@1 and tokens per held-out episode where the
    sampled episodes were played (the first and the last evaluation)."""
    points, tokens = [], 0
    for row in rows:
        tokens += row.get("charts/generated_tokens", 0)
        if "eval/accuracy_greedy" in row:
            point = {"iteration": row["iteration"], "minutes": row.get("time/elapsed", 0.0) / 60, "tokens": tokens,
                     "greedy": row["eval/accuracy_greedy"]}
            if "eval/accuracy" in row:
                point["pass1"] = row["eval/accuracy"]
            if "eval/generated_tokens_per_episode" in row:
                point["tokens_per_episode"] = row["eval/generated_tokens_per_episode"]
            points.append(point)
    return points


def within_budget(points: list[dict], key: str, budget: float) -> dict:
    """The last evaluation made with at most `budget` of `key` ("minutes" or "tokens") spent: what
    the run had reached with that much (the first, before training, spent nothing)."""
    return [point for point in points if point[key] <= budget][-1]


def spread(values: list[float]) -> dict | None:
    """Mean and range of one figure over seeds; None without a value."""
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values), "seeds": len(values)} if values else None


def run_cpu(row: dict) -> str:
    """The CPU a learning row ran on (`cpu_name`); rows of reports older than the key name none."""
    return row.get("cpu", "not recorded")


def with_cpu_column(lines: list[str]) -> list[str]:
    """A markdown table's lines ending in its header and separator, with a CPU column added to both."""
    return lines[:-2] + [lines[-2] + " CPU |", lines[-1] + " --- |"]


def comparison(runs: dict, baseline: dict, within_minutes: float | None = None) -> dict:
    """Per configuration (its runs over seeds; runs of older reports without `evaluations` are left
    out): held-out greedy accuracy at equal wall time (every run had the same time limit: its last
    evaluation, "the end"; with `within_minutes`, its last evaluation made within them) and at equal training tokens (the last evaluation within `token_budget`, the
    smallest final token count among the runs of the same task), pass@1 at the end, tokens per
    held-out episode; each as `spread` over seeds. On the baseline's task (its "task", else the default
    task), `bar`: the untrained organisation's maj@k (`baseline`, per seed: the single agent's on the default task) with k the largest of its table whose k samples cost no
    more tokens than one episode of the configuration, and `beats_bar`: the configuration's mean
    greedy accuracy at equal time above the bar's mean."""
    by_config: dict[str, list[list[dict]]] = {}
    cpus: dict[str, set[str]] = {}  # the CPUs its seeds ran on (`run_cpu`)
    for run, row in runs.items():
        if row.get("evaluations"):
            name = run_configuration(run)[0]
            by_config.setdefault(name, []).append(row["evaluations"])
            cpus.setdefault(name, set()).add(run_cpu(row))
    task_of = {name: learning_configuration(name)[2] or "math" for name in by_config}
    budgets = {task: min(points[-1]["tokens"] for name in by_config if task_of[name] == task for points in by_config[name])
               for task in set(task_of.values())}
    table = {}
    for name, seeds in by_config.items():
        budget = budgets[task_of[name]]
        ends = [points[-1] if within_minutes is None else within_budget(points, "minutes", within_minutes) for points in seeds]
        row = {"task": task_of[name], "token_budget": budget, "cpu": " + ".join(sorted(cpus[name])),
               "greedy_equal_time": spread([end["greedy"] for end in ends]),
               "greedy_equal_tokens": spread([within_budget(points, "tokens", budget)["greedy"] for points in seeds]),
               "pass1_end": spread([end["pass1"] for end in ends if "pass1" in end]),
               "tokens_per_episode": spread([end["tokens_per_episode"] for end in ends if "tokens_per_episode" in end])}
        if baseline and row["task"] == next(iter(baseline.values())).get("task", "math") and row["tokens_per_episode"]:
            per_sample = spread([b["tokens_per_episode"] for b in baseline.values()])["mean"]
            ks = sorted(int(k) for k in next(iter(baseline.values()))["maj"])
            k = max([k for k in ks if k * per_sample <= row["tokens_per_episode"]["mean"]], default=1)
            row["bar"] = {"k": k, "tokens_per_problem": k * per_sample,
                          "maj": spread([b["maj"][str(k)] for b in baseline.values()])}
            row["beats_bar"] = row["greedy_equal_time"]["mean"] > row["bar"]["maj"]["mean"]
        table[name] = row
    return table


def majority_vote_baseline(sizes: dict, threads: int, out: Path, quick: bool) -> dict:
    """Per seed: the untrained single agent on that seed's held-out problems of the default task
    (evaluate.py, BASELINE_SAMPLES samples each, no greedy): maj@k' for k' = 1, 2, 4, … and its
    tokens per episode."""
    samples = 2 if quick else BASELINE_SAMPLES
    baseline = {}
    for seed in sizes["learning_seeds"]:
        path = out / "learning" / f"baseline-single-seed{seed}.json"
        command = [sys.executable, str(ROOT / "evaluate.py"), "--model", sizes["model"], "--agents", "single", "--samples", str(samples), "--no-greedy",
                   "--seed", str(seed), "--limit", str(sizes["eval_problems"] if quick else DEFAULTS.eval_problems),
                   "--transcripts", "0", "--threads", str(threads), "--out", str(path)]
        if quick:
            command += ["--max_new_tokens", "8"]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"evaluate.py {' '.join(command[2:])} failed:\n{result.stderr[-3000:]}")
        baseline[str(seed)] = votes(json.loads(path.read_text()))
    return baseline


def votes(report: dict) -> dict:
    """An evaluate.py report's majority votes: its samples per problem, tokens per sampled episode and
    maj@k' by k' (a key "1", "2", "4", …)."""
    metrics = report["metrics"]
    return {"samples": report["evaluated"]["samples"], "tokens_per_episode": metrics["eval/generated_tokens_per_episode"],
            "maj": {key.removeprefix("eval/maj@"): value for key, value in metrics.items() if key.startswith("eval/maj@")}}


def estimator_label(advantage: str, group_baseline: str) -> str:
    """How a run's advantages were estimated, in the table's words."""
    if advantage != "group":
        return "critic + GAE"
    return "group advantages" if group_baseline == "group" else f"group advantages, {group_baseline} baseline"


def learning(sizes: dict, threads: int, out: Path, minutes: float, quick: bool, runs: list[str], earlier: dict | None) -> dict:
    """Each run is named by its configuration (`learning_configuration`: <organisation> with its
    defaults (critic + GAE; the math task's single agent: group advantages against the batch's
    baseline), <organisation>-group with group advantages (G = 4 against their group), optionally a
    task and one shared adapter),
    then -seed<k>; every configuration of `runs` runs once per seed of sizes["learning_seeds"].
    `earlier` (--merge): the learning section of an earlier report, whose other runs are kept."""
    if earlier and earlier["time_limit_minutes"] != minutes:
        raise SystemExit(f"--merge: the earlier learning runs had {earlier['time_limit_minutes']} min each, these "
                         f"{minutes}: an equal-time comparison needs the same --learning_minutes")
    table = dict(earlier["runs"]) if earlier else {}
    commit = source_commit()  # every run of this invocation measures the same checkout
    kept = out / "learning" / "metrics"  # each run's metrics.jsonl, kept with the report: the plot redraws from them
    for name in runs:
        agents_name, estimator, task, shared = learning_configuration(name)
        episodes = 2 if quick else DEFAULTS.batch_size  # per iteration, for both estimators
        group_size = (2 if quick else 4) if estimator == "group" else 1
        for seed in sizes["learning_seeds"]:
            args = ["--model", sizes["model"], "--agents", agents_name, "--iterations", "1000", "--time_limit_minutes", str(minutes),
                    "--seed", str(seed), "--batch_size", str(episodes // group_size)]
            if estimator == "group":
                args += ["--advantage", "group", "--group_size", str(group_size), "--credit", "shared"]
            args += (["--task", task] if task else []) + (["--shared_adapter"] if shared else [])
            if quick:
                args += ["--max_new_tokens", "8", "--max_prompt_tokens", str(sizes["prompt_tokens"]),
                         "--eval_problems", str(sizes["eval_problems"])]
            rows, peak = run_marft(out, f"learning-{name}-seed{seed}", args, threads)
            run_dir = out / "runs" / f"learning-{name}-seed{seed}"
            # what the run used, options it left out included (the math task's single agent: the batch baseline)
            options = json.loads((run_dir / "config.json").read_text())
            (kept / f"{name}-seed{seed}").mkdir(parents=True, exist_ok=True)
            shutil.copy(run_dir / "metrics.jsonl", kept / f"{name}-seed{seed}")
            evals, trained = [r for r in rows if "eval/accuracy" in r], [r for r in rows if r["iteration"] > 0]
            table[f"{name}-seed{seed}"] = {
                "measured": date.today().isoformat(), "commit": commit, "cpu": cpu_name(), "estimator": estimator_label(options["advantage"], options["group_baseline"]),
                "iterations": rows[-1]["iteration"], "minutes": rows[-1]["time/elapsed"] / 60,
                "seconds_per_iteration": sum(r["time/iteration"] - r["time/eval"] for r in trained) / len(trained),
                "peak_rss_mib": peak, "accuracy_start": evals[0]["eval/accuracy"], "accuracy_end": evals[-1]["eval/accuracy"],
                "greedy_start": evals[0]["eval/accuracy_greedy"], "greedy_end": evals[-1]["eval/accuracy_greedy"],
                "evaluations": evaluations(rows)}
    figures = out / "learning"
    for run in table:  # runs of a report older than the kept metrics: their run folder, where it is still here
        folder = out / "runs" / f"learning-{run}"
        if not (kept / run / "metrics.jsonl").is_file() and (folder / "metrics.jsonl").is_file():
            (kept / run).mkdir(parents=True, exist_ok=True)
            shutil.copy(folder / "metrics.jsonl", kept / run)
    plotted = [run for run in table if (kept / run / "metrics.jsonl").is_file()]  # runs merged from an older report may have none
    if unplotted := [run for run in table if run not in plotted]:
        print(f"bench: {unplotted} stay in the table but not in the plot: their metrics were not kept in {kept}", flush=True)
    drawn = draw_learning_figures(kept, plotted, figures)
    baseline = dict((earlier or {}).get("baseline", {}))  # --merge: the seeds not measured again are kept
    if any(not learning_configuration(name)[2] for name in runs):  # a run on the default task: its bar
        baseline |= majority_vote_baseline(sizes, threads, out, quick)
    return {"time_limit_minutes": minutes, "runs": table, "plotted": plotted, "baseline": baseline,
            "figures": [str(p.relative_to(out)) for p in drawn]}


def imported_learning(folder: Path, minutes: float) -> tuple[dict, str]:
    """--learning_from: the learning section from runs made with marft.py outside the bench (e.g. two side by
    side, a thread each), one subfolder per run holding its config.json and metrics.jsonl; each is named as
    the bench names its runs, <task>:<organisation>[-group][+shared]-seed<k> (the task as its --task). Equal
    wall time is `minutes` (--learning_minutes): each run's last evaluation made within it. The bar is the
    untrained organisations' evaluate.py reports in `folder` (untrained-*.json with samples > 1 on a task of
    the runs, each naming its organisation and seed): the organisation whose mean maj@1 is the highest. A run folder holds no
    peak memory, and without sampled evaluations (--eval_samples 0) no pass@1: those cells stay empty, and
    tokens per held-out episode are the greedy episodes'. The figures (scripts/plot.py) go to
    <folder>/learning/. Returns the section and the runs' --model."""
    runs, folders, models = {}, {}, set()
    for run_dir in sorted(p for p in folder.iterdir() if (p / "metrics.jsonl").is_file() and (p / "config.json").is_file()):
        try:
            config = json.loads((run_dir / "config.json").read_text())
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        except ValueError as err:
            raise SystemExit(f"--learning_from: {run_dir} is not a marft.py run folder ({err}); move it out of {folder}") from None
        if not any("eval/accuracy_greedy" in r for r in rows) or not any(r.get("iteration", 0) > 0 for r in rows):
            raise SystemExit(f"--learning_from: {run_dir} has no held-out evaluation or no trained iteration in its "
                             f"metrics.jsonl; compare runs that trained and evaluated greedily (the default), or move it out of {folder}")
        estimator = "-group" if config["advantage"] == "group" else ""
        name = f"{config['task']}:{config['agents']}{estimator}{'+shared' if config['shared_adapter'] else ''}-seed{config['seed']}"
        if name in folders:
            raise SystemExit(f"--learning_from: {folders[name]} and {run_dir} are both {name}; keep one of them in {folder}")
        points = evaluations(rows)
        for point, row in zip(points, [r for r in rows if "eval/accuracy_greedy" in r]):
            if "tokens_per_episode" not in point and "eval/greedy/generated_tokens_per_episode" in row:
                point["tokens_per_episode"] = row["eval/greedy/generated_tokens_per_episode"]
        sampled, trained = [r for r in rows if "eval/accuracy" in r], [r for r in rows if r["iteration"] > 0]
        runs[name] = {"estimator": estimator_label(config["advantage"], config["group_baseline"]),
                      "iterations": rows[-1]["iteration"], "minutes": rows[-1]["time/elapsed"] / 60,
                      "seconds_per_iteration": sum(r["time/iteration"] - r["time/eval"] for r in trained) / len(trained),
                      "peak_rss_mib": None, "accuracy_start": sampled[0]["eval/accuracy"] if sampled else None,
                      "accuracy_end": sampled[-1]["eval/accuracy"] if sampled else None,
                      "greedy_start": points[0]["greedy"], "greedy_end": points[-1]["greedy"], "evaluations": points}
        folders[name] = run_dir
        models.add(config["model"])
    if not runs:
        raise SystemExit(f"--learning_from={folder}: no run folders (config.json + metrics.jsonl) in it")
    if len(models) > 1:
        raise SystemExit(f"--learning_from={folder}: its runs trained different models ({', '.join(sorted(models))}); "
                         "compare runs of one --model")
    tasks_run = {name.rpartition(":")[0] for name in runs}
    untrained: dict[str, dict] = {}  # organisation → seed → its votes
    for path in sorted(folder.glob("untrained-*.json")):
        try:
            evaluated, metrics = (report := json.loads(path.read_text()))["evaluated"], report["metrics"]
            evaluated["samples"], evaluated["task"], evaluated["seed"], metrics["eval/generated_tokens_per_episode"]
        except (ValueError, KeyError, TypeError) as err:
            raise SystemExit(f"--learning_from: {path} is not an evaluate.py report ({err!r}); move it out of {folder}") from None
        if evaluated["samples"] > 1 and evaluated["task"] in tasks_run:
            organisation = evaluated["agents"] + ("+shared" if evaluated["shared_adapter"] else "")
            untrained.setdefault(organisation, {})[str(evaluated["seed"])] = {
                **votes(report), "greedy": evaluated["greedy"], "task": evaluated["task"], "organisation": organisation}
    baseline = max(untrained.values(), key=lambda seeds: spread([b["maj"]["1"] for b in seeds.values()])["mean"], default={})
    figures = folder / "learning"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "plot.py"), *map(str, folders.values()),
                    "--labels", ",".join(folders), "--out", str(figures)], check=True, cwd=ROOT)
    return {"time_limit_minutes": minutes, "equal_time": "within", "runs": runs, "plotted": list(runs), "baseline": baseline,
            "figures": [str(p.relative_to(folder)) for p in sorted(figures.glob("*.png"))]}, models.pop()


def draw_learning_figures(kept: Path, runs: list[str], figures: Path) -> list[Path]:
    """The learning runs' figures (scripts/plot.py) from their kept metrics, one set per task, so
    that no panel overlays two tasks' accuracies: the default task's in `figures`, another task's
    in figures/<task>/. Returns the files written, the default task's first."""
    by_task: dict[str, list[str]] = {}
    for run in runs:
        by_task.setdefault(learning_configuration(run_configuration(run)[0])[2], []).append(run)
    drawn = []
    for task in sorted(by_task):  # "" (the default task) sorts first
        folder = figures / task if task else figures
        subprocess.run([sys.executable, str(ROOT / "scripts" / "plot.py"), *(str(kept / run) for run in by_task[task]),
                        "--labels", ",".join(by_task[task]), "--out", str(folder)], check=True, cwd=ROOT)
        drawn += sorted(folder.glob("*.png"))
    return drawn


def markdown(report: dict) -> str:
    """The report as the markdown block of docs/benchmark.md."""
    m = report["machine"]
    lines = [f"Measured {m['date']} on {m['cpu_cores']} CPU cores ({m['processor']}), {m['memory_gib']} GiB, GPU: {m['gpu']}; "
             f"torch {m['torch']}, transformers {m['transformers']}, peft {m['peft']}, vllm {m['vllm']}. "
             f"Mode: {report['mode']}; {report['seconds'] / 60:.1f} min in all.", ""]
    if report["mode"] == "imported":  # --learning_from: nothing measured here
        lines[0] = (f"Runs made with marft.py outside the bench, compared on {m['date']} from their folders "
                    f"(`scripts/bench.py --learning_from`); the folder's README names their commit, CPU and commands.")
    # a section --merge measured on another day or CPU names them (the CPU only where it is not the header's)
    other_cpu = {name: cpu for name, cpu in report.get("section_processors", {}).items() if cpu != m["processor"]}
    if later := {name: day for name, day in report.get("section_dates", {}).items() if day != m["date"] or name in other_cpu}:
        lines[0] += " Measured again by a later `--merge`: " + ", ".join(
            f"{name} on {day}" + (f" ({other_cpu[name]})" if name in other_cpu else "") for name, day in later.items()) + "."
    model = report.get("model", DEFAULTS.model)  # reports older than the key measured the default
    lines[0] += " " + model_sentence(model)
    if t := report.get("throughput"):
        lines += throughput_lines(t)
    if b := report.get("backends"):
        lines += backends_lines(b)
    if p := report.get("phases"):
        lines += phases_lines(p)
    if mem := report.get("memory"):
        lines += memory_lines(mem)
    if c := report.get("contention"):
        lines += contention_lines(c)
    if g := report.get("grading"):
        lines += grading_lines(g)
    if learn := report.get("learning"):
        lines += learning_lines(learn, m, model)
    return "\n".join(lines)


def model_sentence(model: str) -> str:
    """What every section measured (--model; reports without the key measured the default)."""
    if model == DEFAULTS.model:
        return "Model: the embedded SmolLM2-135M-Instruct (the default)."
    if model.startswith(agents.RANDOM_MODEL):
        return (f"Model: `{model}`, random weights (vLLM's engine draws its own): its seconds and bytes mean something, "
                "its accuracies nothing.")
    return f"Model: `{model}`."


def throughput_lines(t: dict) -> list[str]:
    """The throughput section of the report (markdown lines)."""
    return ["| throughput (hf backend) | tokens/s |", "| --- | --- |",
            f"| rollout (generation, {t['prompts']} prompts × ≤ {t['max_new_tokens']} tokens) | {t['rollout_tokens_per_second']:.0f} |",
            f"| policy update (forward + backward, prompt + response tokens) | {t['policy_update_tokens_per_second']:.0f} |",
            f"| critic update (forward + backward) | {t['critic_update_tokens_per_second']:.0f} |", ""]


def backends_lines(b: dict) -> list[str]:
    """The backends section of the report (markdown lines)."""
    if "skipped" in b:
        return [f"Backends: skipped ({b['skipped']}).", ""]
    return [f"| generation backend ({b['prompts']} prompts, same random adapters, {b['threads']} threads) | tokens/s |",
            # reports older than the key measured transformers' generate (before generation.decode)
            "| --- | --- |", f"| hf ({b.get('hf_decoding', 'transformers generate + peft')}) | {b['hf_tokens_per_second']:.0f} |",
            f"| vLLM with the agent's LoRARequest (rank {DEFAULTS.lora_rank} on "
            f"{LORA_TARGETS.count(',') + 1} projections) "
            f"| {b['vllm_tokens_per_second']:.0f} |",
            f"| vLLM, base model (no LoRA) | {b['vllm_without_lora_tokens_per_second']:.0f} |", "",
            f"vLLM engine start-up: {b['vllm_startup_seconds']:.0f} s. With the adapters, vLLM runs at "
            f"{b['vllm_tokens_per_second'] / b['vllm_without_lora_tokens_per_second']:.0%} of its base-model speed "
            f"and at {b['vllm_tokens_per_second'] / b['hf_tokens_per_second']:.0%} of the hf backend's: "
            f"the LoRA cost grows with the rank and with the projections that carry an adapter. On this "
            f"machine the {'hf' if b['hf_tokens_per_second'] >= b['vllm_tokens_per_second'] else 'vLLM'} "
            f"backend generates faster.", ""]


def phases_lines(p: dict) -> list[str]:
    """The phases section of the report (markdown lines)."""
    columns = [(key, head) for key, head in (("without_prefix_sharing", "without prefix sharing"),
                                             ("without_cpu_paths", "MARFT_CPU_PATHS=off")) if key in p]
    variants, heads = [p[key] for key, _ in columns], [head for _, head in columns]
    warm = f"mean of {p['iterations']}" + (" after the first" if p.get("cold_iterations") else "")
    lines = [f"| phase (chain, {p['problems_per_iteration']} problems per iteration, {warm}) | seconds "
             f"| {' | '.join(heads)} |", "| --- | --- |" + " --- |" * len(variants)]
    lines += [f"| {name.replace('_', ' ')} | {p[f'{name}_seconds']:.1f} | "
              + " | ".join(f"{v[f'{name}_seconds']:.1f}" for v in variants) + " |" for name in PHASES if name != "eval"]
    lines += [f"| **iteration (without eval)** | **{p['iteration_seconds_without_eval']:.1f}** | "
              + " | ".join(f"**{v['iteration_seconds_without_eval']:.1f}**" for v in variants) + " |", "",
              f"Prefix sharing (the default) makes an iteration **{p['prefix_sharing_speedup']:.2f}×** faster "
              f"(`prefix_sharing_speedup`; the runs of this report, one after the other)."]
    if p.get("cold_iterations"):
        lines[-1] += (f" Each run's first iteration, with its one-time costs (memory touched for the first time, "
                      f"kernels set up for new shapes), is left out of the means: the default's took "
                      f"{p['cold_iteration_seconds_without_eval']:.1f} s.")
    if "floor" in p:  # reports from before the floor have none
        f, shares = p["floor"], p["floor"]["profiled_seconds_by_family"]
        lines[-1] += (f" Its floor, the matrix products it executes at this machine's GEMM rate "
                      f"({f['gemm_gflops_per_second']:.0f} GFLOP/s, {f['matmul_mflop_per_token']:.0f} MFLOP per token; "
                      f"scripts/profile_iteration.py), is {f['floor_seconds']:.1f} s: the iteration takes "
                      f"**{p['floor_ratio']:.1f}× its floor** (`floor_ratio`)"
                      + (f"; against the products no implementation can skip (each agent's shared prefix once, no padding) "
                         f"{f['padding_free_floor_seconds']:.1f} s: **{p['padding_free_floor_ratio']:.1f}× the padding-free floor** "
                         f"(`padding_free_floor_ratio`)" if "padding_free_floor_ratio" in p else "")
                      + ". The profiled iteration's seconds by op family: "
                      + ", ".join(f"{name} {seconds / f['profiled_seconds']:.0%}" for name, seconds in shares.items()) + ".")
        if "profile_run_seconds" in f:  # reports from before it have none
            lines[-1] += (f" The same options measured again, the profile run's own unprofiled iterations after its first: "
                          f"{f['profile_run_seconds']:.1f} s each, **{f['profile_run_floor_ratio']:.1f}× their floor** "
                          f"(two runs of the same code: their difference is the spread between runs on this machine).")
        if "pass_ceiling_ratios" in f:  # reports from before it have none
            c, (rows, tokens) = f["pass_ceiling_ratios"], f["pass_ceiling_rows_and_tokens"]
            lines[-1] += (f" One plain pass of the same model ({rows} rows of {tokens} tokens, no shared prefix, no padding) "
                          f"takes **{c['forward']:.2f}×** its floor forward and **{c['forward_backward']:.2f}×** forward + "
                          f"backward (`pass_ceiling_ratios`): an iteration of such passes alone would take about these ratios.")
    if "cpu_paths_speedup" in p:
        lines[-1] += (f" The kernels this CPU's instructions choose make it **{p['cpu_paths_speedup']:.2f}×** faster than "
                      f"with them capped at AVX2 (`cpu_paths_speedup`, MARFT_CPU_PATHS=off).")
    return lines + [""]


def memory_lines(mem: dict) -> list[str]:
    """The memory section of the report (markdown lines)."""
    lines = ["| agents | peak resident memory (MiB), default options with critic + GAE |", "| --- | --- |"]
    lines += [f"| {k.split('_')[0]} ({v['organisation']}) | {v['peak_rss_mib']:.0f} |"
              for k, v in mem["default"].items() if k.endswith("_agents")]
    lengths = ", ".join(f"{x:.0f}" for x in mem["prompt_tokens_by_agent_position"])
    lines += [f"| **ratio 4 / 1** | **{mem['default']['ratio_4_to_1']:.2f}** |", "",
              f"The base model ({mem['base_model_mib']:.0f} MiB) is held once whatever the number of agents; each "
              f"agent adds its adapter ({mem['adapter_mib']:.1f} MiB) and its Adam state (2× that). Later agents "
              f"read earlier actions, so prompts grow along chain4 ({lengths} tokens); what keeps the activations "
              f"from growing with them: a gradient pass holds at most `--micro_batch_tokens` tokens (micro-batches "
              f"of one agent's rows, gradients accumulated), the prompt prefix a batch shares is computed once, "
              f"and freed tensors go back to the OS (speed.return_freed_memory).", ""]
    return lines


def learning_lines(learn: dict, m: dict, report_model: str) -> list[str]:
    """The learning section of the report (markdown lines)."""
    within = learn["time_limit_minutes"] if learn.get("equal_time") == "within" else None  # --learning_from's runs
    checked = ("the comparison below takes each run's last evaluation within it; this table, each whole run" if within
               else "checked after each iteration")
    lines = [f"| run (equal wall time: {learn['time_limit_minutes']} min, {checked}) | iterations "
             f"| minutes, evaluations included | s / iteration (no eval) | peak RSS (MiB) | held-out pass@1 start → end "
             f"| greedy start → end |", "| --- | --- | --- | --- | --- | --- | --- |"]
    def label(run: str) -> str:
        name, seed = run_configuration(run)
        agents_name, estimator, task, shared = learning_configuration(name)
        # rows of older reports record no estimator: their name's (-group: group advantages, else critic + GAE)
        estimator = learn["runs"][run].get("estimator") or estimator_label("group" if estimator == "group" else "gae", "group")
        where = f"{task} task, " if task else ""
        return f"{where}{agents_name}{' (one shared adapter)' if shared else ''}, {estimator}, seed {seed}"
    dates = sorted({r.get("measured", m["date"]) for r in learn["runs"].values()})
    commits = sorted({r["commit"] for r in learn["runs"].values() if "commit" in r})
    if len(dates) > 1 or commits:
        unnamed = commits and any("commit" not in r for r in learn["runs"].values())
        merged = len(dates) > 1 or len(commits) > 1 or unnamed
        lines[-2:-2] = [f"Learning runs measured on {', '.join(dates)}"
                        + (f", code of commit{'s' * (len(commits) > 1)} {', '.join(commits)}" if commits else "")
                        + (" (rows of older reports name no commit)" if unnamed else "")
                        + (" (merged with `--merge`; each row's date, commit and CPU are in bench.json)." if merged else "."), ""]
    # Iterations at equal wall time compare only on one CPU: a table merged from rows of several
    # (or of older reports, which name none) gets a CPU column; `comparison_lines` does the same for
    # its configurations.
    mixed = len({run_cpu(r) for r in learn["runs"].values()}) > 1
    if mixed:
        lines = with_cpu_column(lines)
        lines[-2:-2] = ["The rows come from more than one CPU (\"not recorded\": rows merged from reports written "
                        "before each row recorded its CPU): compare iterations and accuracies at equal wall time, here and in the "
                        "comparison below, only between rows of one CPU.", ""]
    def cell(value: float | None, form: str) -> str:  # --learning_from's runs record no peak memory, maybe no pass@1
        return "-" if value is None else format(value, form)
    lines += [f"| {label(run)} | {r['iterations']} | {r['minutes']:.1f} | {r['seconds_per_iteration']:.1f} "
              f"| {cell(r['peak_rss_mib'], '.0f')} | {cell(r['accuracy_start'], '.2f')} → {cell(r['accuracy_end'], '.2f')} "
              f"| {r['greedy_start']:.2f} → {r['greedy_end']:.2f} |" + (f" {run_cpu(r)} |" if mixed else "")
              for run, r in learn["runs"].items()]
    plotted = learn.get("plotted", list(learn["runs"]))
    if len(plotted) < len(learn["runs"]):
        lines += ["", f"The figures show the runs {', '.join(plotted)} (the metrics of the other rows were not kept)."]
    lines += comparison_lines(comparison(learn["runs"], learn.get("baseline", {}), within), learn.get("baseline", {}), report_model,
                              within)
    def alt(f: str) -> str:  # the default task's figures lie in learning/, another task's in learning/<task>/
        return Path(f).stem if Path(f).parent.name == "learning" else f"{Path(f).stem}, {Path(f).parent.name} task"
    lines += [""] + [f"![{alt(f)}]({f})" for f in learn["figures"] if "heldout" in f or "reward" in f] + [""]
    return lines

def comparison_lines(table: dict, baseline: dict, report_model: str, within_minutes: float | None = None) -> list[str]:
    """The comparison at equal time and equal tokens, with the majority-vote bar (markdown lines)."""
    if not table:
        return []
    def figure(s: dict | None) -> str:
        return "-" if s is None else f"{s['mean']:.2f} [{s['min']:.2f}, {s['max']:.2f}]" if s["seeds"] > 1 else f"{s['mean']:.2f}"
    voter = next(iter(baseline.values())).get("organisation", "single") if baseline else "single"
    voters = "single agent" if voter == "single" else voter  # the default task's bar: the untrained single agent
    at_time = ("the last evaluation) and at equal training tokens (the last evaluation within the task's smallest final "
               "token count), pass@1 at the end, tokens per held-out episode" if within_minutes is None else
               f"the last evaluation within {within_minutes:g} min) and at equal training tokens (the last evaluation within "
               "the task's smallest final token count), pass@1 and tokens per held-out episode at that evaluation")
    lines = ["", f"Per configuration, mean [min, max] over seeds: held-out greedy accuracy at equal wall time ({at_time}, "
             f"and the bar of majority voting: the untrained {voters}'s maj@k with k samples costing at most one episode "
             "of the configuration.", "",
             "| configuration | seeds | greedy, equal time | greedy, equal tokens (budget) | pass@1, end | tokens / episode "
             f"| untrained {voter} maj@k (k) | above the bar |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    mixed = len({row["cpu"] for row in table.values()}) > 1
    if mixed:
        lines = with_cpu_column(lines)
    for name, row in table.items():
        seeds = row["greedy_equal_time"]["seeds"]
        bar = (f"{figure(row['bar']['maj'])} (k = {row['bar']['k']})", "yes" if row["beats_bar"] else "no") if "bar" in row else ("-", "-")
        lines.append(f"| {name} | {seeds} | {figure(row['greedy_equal_time'])} | {figure(row['greedy_equal_tokens'])} "
                     f"({row['token_budget']:,}) | {figure(row['pass1_end'])} | {figure(row['tokens_per_episode'])} | {bar[0]} | {bar[1]} |"
                     + (f" {row['cpu']} |" if mixed else ""))
    if baseline:
        first = next(iter(baseline.values()))
        model = "" if report_model == DEFAULTS.model else f"--model {report_model} "
        task = f"--task {first['task']} " if "task" in first else ""  # --learning_from's bar names its task
        lines += ["", f"The bar: `python evaluate.py {model}{task}--agents {voter.removesuffix('+shared')}"
                  f"{' --shared_adapter' if voter.endswith('+shared') else ''} --samples {first['samples']}"
                  f"{'' if first.get('greedy') else ' --no-greedy'} --seed <s>` on "
                  f"each seed's held-out set, {first['tokens_per_episode']:.1f} tokens per episode (seed {next(iter(baseline))}); "
                  "maj@k: " + ", ".join(f"k = {k}: {figure(spread([b['maj'][k] for b in baseline.values()]))}" for k in first["maj"]) + "."]
    return lines


BENCH_PAGE = Path("docs") / "benchmark.md"  # the page whose marked block --update_page rewrites (under ROOT)


def update_page(markdown_text: str, out: Path) -> None:
    page = ROOT / BENCH_PAGE
    text = page.read_text()
    start, end = "<!-- bench:start -->", "<!-- bench:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"--update_page: {BENCH_PAGE} lacks the lines {start} and {end}; add them where the results go")
    # Image links in bench.md are relative to <out>; from the page they go through <out>.
    prefix = os.path.relpath(out, page.parent)
    body = markdown_text.replace("](learning/", f"]({prefix}/learning/")
    head, rest = text.split(start, 1)
    page.write_text(head + start + "\n" + body + "\n" + end + rest.split(end, 1)[1])


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    skip, sizes, minutes, runs = checked_options(args)
    out = Path(args.out)
    if args.render_only:
        if not (out / "bench.json").is_file():
            raise SystemExit(f"--render_only: no {out / 'bench.json'}; run the suite first")
        return publish(json.loads((out / "bench.json").read_text()), out, args.update_page)
    if args.learning_from:  # measure nothing: the comparison of runs made outside the bench, in their folder
        folder = Path(args.learning_from).resolve()  # plot.py runs in ROOT
        learning_section, model = imported_learning(folder, minutes)
        report = {"mode": "imported", "model": model, "machine": machine(), "seconds": 0.0, "learning": learning_section}
        (folder / "bench.json").write_text(json.dumps(report, indent=2))
        return publish(report, folder, False)
    earlier = earlier_report(out, args.quick, sizes["model"]) if args.merge else {}
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    print(f"bench: {'quick' if args.quick else 'full'} mode, {args.threads} threads, sections "
          f"{[s for s in SECTIONS if s not in skip]}; learning runs {minutes} min each", flush=True)
    report: dict = earlier or {"mode": "quick" if args.quick else "full", "model": sizes["model"], "machine": machine()}
    started = time.perf_counter()

    def record(name, result):
        """A section's result, with the day and the CPU it was measured on (`markdown` names them after a --merge)."""
        report[name] = result
        report.setdefault("section_dates", {})[name] = date.today().isoformat()
        report.setdefault("section_processors", {})[name] = cpu_name()

    def section(name, function):
        if name in skip:
            return
        t0 = time.perf_counter()
        print(f"bench: {name} …", flush=True)
        record(name, function())
        print(f"bench: {name} done in {time.perf_counter() - t0:.0f} s", flush=True)

    section("throughput", lambda: throughput(sizes, args.threads))
    section("backends", lambda: backends(sizes, args.threads, out))
    if not {"phases", "memory"} <= skip:
        t0 = time.perf_counter()
        print("bench: phases + memory …", flush=True)
        measured = dict(zip(("phases", "memory"), phases_and_memory(sizes, args.threads, out, skip)))
        for name in ("phases", "memory"):
            if name not in skip:  # a skipped one keeps what --merge brought from the earlier report
                record(name, measured[name])
        print(f"bench: phases + memory done in {time.perf_counter() - t0:.0f} s", flush=True)
    section("contention", lambda: contention(sizes, args.threads, out))
    section("grading", lambda: grading(sizes))
    section("learning", lambda: learning(sizes, args.threads, out, minutes, args.quick, runs, earlier.get("learning")))
    report["seconds"] = report.get("seconds", 0.0) * bool(earlier) + time.perf_counter() - started
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    return publish(report, out, args.update_page)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke test of every section in a few minutes")
    parser.add_argument("--out", default=str(ROOT / "results"), help="folder for bench.json, bench.md, figures and runs/")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch (and vLLM) threads")
    parser.add_argument("--model", default=DEFAULTS.model,
                        help="the base model of every section, as marft.py's --model (smollm2, a local folder, or "
                             "random:<config.json>: that shape with random weights, for seconds and bytes)")
    parser.add_argument("--skip", default="", help=f"comma-separated sections to leave out: {', '.join(SECTIONS)}")
    parser.add_argument("--learning_minutes", type=float, default=None, help="wall time of each learning run (default: 10, quick 0.1)")
    parser.add_argument("--learning_runs", default=None,
                        help="comma-separated learning configurations, e.g. orchestrated,chain-group (default: the mode's list)")
    parser.add_argument("--learning_seeds", default=None, help="comma-separated seeds of every learning run (default: 1,2,3; quick 1)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the sections and learning runs of the existing <out>/bench.json that this invocation does not measure")
    parser.add_argument("--update_page", "--update_readme", dest="update_page", action="store_true",
                        help="write bench.md into docs/benchmark.md's marked block (--update_readme: its old name)")
    parser.add_argument("--learning_from", default=None,
                        help="measure nothing: the learning comparison of the marft.py run folders in this folder (one "
                             "per run, at equal --learning_minutes; its untrained-*.json evaluate.py reports the bar), "
                             "written to its bench.json, bench.md and learning/")
    parser.add_argument("--render_only", action="store_true",
                        help="measure nothing: rewrite <out>/bench.md (and the page's block) from <out>/bench.json")
    return parser


def checked_options(args: argparse.Namespace) -> tuple[set[str], dict, float, list[str]]:
    """(sections to skip, the mode's sizes with --learning_seeds and --model, minutes per learning run, learning
    runs), each checked: a value that cannot work stops here, naming the option."""
    skip = {s for s in args.skip.split(",") if s}
    if args.learning_from and not Path(args.learning_from).is_dir():
        raise SystemExit(f"--learning_from={args.learning_from}: no such folder; give the folder holding the run folders")
    if args.learning_from and (args.merge or args.render_only or args.update_page or args.quick or args.learning_runs
                               or args.learning_seeds or args.skip or args.model != DEFAULTS.model
                               or Path(args.out).resolve() != (ROOT / "results").resolve()):
        raise SystemExit("--learning_from measures nothing and writes its folder's own bench.json and bench.md: give it "
                         "--learning_minutes alone (the runs name their model, seeds and organisations)")
    if unknown := skip - set(SECTIONS):
        raise SystemExit(f"--skip: unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    model = args.model
    if model.startswith(agents.RANDOM_MODEL):
        if error := random_config_error(model.removeprefix(agents.RANDOM_MODEL)):
            raise SystemExit(f"--model={model}: {error}; give random:<a transformers config.json>, e.g. random:models/qwen2.5-0.5b.json")
        model = agents.RANDOM_MODEL + str(Path(model.removeprefix(agents.RANDOM_MODEL)).resolve())  # the runs start in ROOT
    elif Path(model).is_dir():
        model = str(Path(model).resolve())
    if model != DEFAULTS.model and Path(args.out).resolve() == (ROOT / "results").resolve() and not args.render_only:
        raise SystemExit(f"--model={args.model}: give --out <folder>; {ROOT / 'results'} holds the default model's report "
                         "(e.g. --out runs/bench-qwen2.5-0.5b)")
    sizes = {**(QUICK if args.quick else FULL), "model": model}
    minutes = args.learning_minutes if args.learning_minutes is not None else sizes["learning_minutes"]
    runs = args.learning_runs.split(",") if args.learning_runs else list(sizes["learning_runs"])
    if args.learning_seeds:
        try:
            sizes = {**sizes, "learning_seeds": tuple(int(x) for x in args.learning_seeds.split(","))}
        except ValueError:
            raise SystemExit(f"--learning_seeds={args.learning_seeds!r}: give comma-separated whole numbers, e.g. 1,2") from None
    for name in runs:
        agents_name, estimator, task, shared = learning_configuration(name)
        if agents_name not in BUILTIN_ORGANISATIONS or estimator not in ("", "group") or (task and task not in tasks.TASKS):
            raise SystemExit(f"--learning_runs: {name!r} is not [task:]<organisation>[-group][+shared] with a built-in "
                             f"organisation ({', '.join(BUILTIN_ORGANISATIONS)}) and task ({', '.join(tasks.TASKS)})")
    return skip, sizes, minutes, runs


def earlier_report(out: Path, quick: bool, model: str) -> dict:
    """--merge: the existing <out>/bench.json, of the same mode, whose sections this run keeps."""
    if not (out / "bench.json").is_file():
        raise SystemExit(f"--merge: no {out / 'bench.json'} to merge into; run without --merge first")
    earlier = json.loads((out / "bench.json").read_text())
    if earlier.get("mode") != ("quick" if quick else "full"):
        raise SystemExit(f"--merge: {out / 'bench.json'} is a {earlier.get('mode')} report; merge runs of the same mode")
    if (measured := earlier.get("model", DEFAULTS.model)) != model:
        raise SystemExit(f"--merge: {out / 'bench.json'} measured --model={measured}, this run "
                         f"--model={model}; merge runs of the same model")
    return earlier


def publish(report: dict, out: Path, readme: bool) -> dict:
    """Write <out>/bench.md from the report, print it, and put it into docs/benchmark.md when asked."""
    text = markdown(report)
    (out / "bench.md").write_text(text + "\n")
    print(text)
    if readme:
        update_page(text, out)
        print(f"bench: {BENCH_PAGE} block updated")
    return report


if __name__ == "__main__":
    main()
