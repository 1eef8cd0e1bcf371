"""Evaluate the base model or a checkpoint of a MARFT run on a math or code data set, or on a task of your own.

Paper: MARFT (Liao et al., arXiv 2504.16129). README: "Evaluating". The agents play exactly the
episodes of training (`rollout.run_episodes`: every agent acts in σ order on its unrolled
observation ô^j_t, the environment grades the graded roles), for any organisation N and any
dependency function D, and any horizon.

What is evaluated:
  * `--run RUN_DIR`: a checkpoint of a run written by marft.py (default: the one named by
    RUN_DIR/checkpoints/latest). The task, the organisation, the LoRA shapes, the horizon, the
    sampling settings and the seed come from RUN_DIR/config.json (`config.read_config`).
  * without `--run`: the base model (`--model`) on task `--task` with organisation `--agents`,
    every other setting at its `config.Config` default. Every agent gets a fresh adapter, whose
    LoRA B = 0 makes it exactly the base model.
Only the policy adapters are built; the critic plays no part in evaluation.

On what: the built-in tasks (math, code; tasks.py) evaluate `--data` (and `--split`); a task of
your own evaluates its own held-out problems (`Task.load`, split with the run's seed), and its
environment scores them, as in training.

Metrics, over P problems with k = `--samples` sampled episodes each at the temperature (the
formulas are those of rollout.py's docstring, computed by `rollout.heldout_metrics`):

    eval/accuracy           pass@1: mean over problems of c_p / k
    eval/pass@k'            unbiased pass@k' (Chen et al. 2021) for k' = 1, 2, 4, … ≤ k, and k
    eval/maj@k'             majority vote over k' samples (answers compared after the grader's
                            normalisation, a tie split evenly; rollout.majority_vote), averaged over
                            the k // k' disjoint blocks of each problem's samples; not for code tasks
    eval/generated_tokens_per_episode   tokens all agents generated per sampled episode: a problem
                            at maj@k' or pass@k' costs k' of them (eval/greedy/…: per greedy episode)
    eval/accuracy_greedy    one greedy episode per problem (--greedy, the default)
    eval/unparseable_rate   graded answers without a parseable \\boxed{}, over all sampled graded answers

c_p is the number of solved sampled episodes of problem p; an episode is solved when every graded
answer of its last step is correct (code tasks: every graded program passed every test; the report
then also counts how the graded programs ended, sampled and greedy: passed, failed, syntax_error,
timeout, crash, no_program, and "unparseable" means no program). The same numbers are broken down per level and per subject
(`Problem.level`, `Problem.type`; rows without one are grouped as "(none)").

A transcript is one complete sampled episode: the problem, its gold answer, and for every step
each agent's role and response text in σ order, then the step's graded outcomes
(role → correct | wrong | unparseable) and team reward R_t.

Output: a table on stdout, then the first `--transcripts` transcripts, and one JSON file
(`--out`) holding what was evaluated, the metrics, the breakdowns, the transcripts and the wall
time. The sampling noise is seeded as in training (`heldout_metrics` seeds torch from --seed), so
`--run R --limit <eval_problems> --samples <eval_samples>` on the arithmetic task plays the
problems, and draws the noise, of the run's own held-out evaluation at that checkpoint.

Generation: `--backend hf` (default) is generation.decode, a sampling loop over transformers'
forward, on the policies themselves; `--backend vllm` starts one vLLM engine with the policies'
adapters (one `LoRARequest` per agent, as in training), faster for large evaluations; its samples
differ from hf's draws of the same policy, its greedy decodes agree in float32 (tests/test_vllm.py).

Usage:
    python evaluate.py                                                # base model, chain, generated held-out task
    python evaluate.py --run runs/chain-seed1-20250101-120000         # the run's latest checkpoint
    python evaluate.py --run runs/<name> --checkpoint iter_000006 --data ../shared/data/math_test.jsonl --limit 200
    python evaluate.py --agents chain3 --data ../shared/data/gsm8k_test.jsonl --samples 8 --transcripts 5
    python evaluate.py --task examples/units.py                       # a task of your own: its held-out problems
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import re
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import torch

import agents as agents_lib
import generation
import run as run_lib
import speed
import tasks
from envs import Grader, Problem, load_problems
from envs.sandbox import OUTCOMES as PROGRAM_OUTCOMES
from flex_pomdp import Organisation
from rollout import Rollout, has_answers, heldout_metrics, maj_at_k, pass_at_k, same_answer, solved_counts
from config import Config, read_config

NO_GROUP = "(none)"  # the group of rows without a level or subject


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_what_options(parser.add_argument_group("what to evaluate"))
    add_data_options(parser.add_argument_group("data"))
    add_sampling_options(parser.add_argument_group("sampling and metrics"))
    add_output_options(parser.add_argument_group("output and machine"))
    return parser


def add_what_options(what) -> None:
    what.add_argument("--run", default=None,
                      help="run folder written by marft.py (has config.json and checkpoints/); default: the base model")
    what.add_argument("--checkpoint", default=None,
                      help="checkpoint of --run, e.g. iter_000012 (default: the one checkpoints/latest names)")
    what.add_argument("--model", default=None,
                      help="base model without --run: smollm2 (embedded), a local HF folder, a hub id or random:<config.json> "
                           f"(default: {Config.model}); with --run it comes from config.json")
    what.add_argument("--agents", default=None,
                      help="organisation without --run: one the task offers ("
                           + "; ".join(f"{t.name}: {' | '.join(t.organisations)}" for t in tasks.TASKS.values())
                           + "), or a profile JSON file (default: the task's default organisation, math: chain); with "
                           "--run it comes from config.json")
    what.add_argument("--task", default=None,
                      help=f"task without --run: {' | '.join(tasks.TASKS)} | package.module:name | path/to/file.py (default: chosen "
                           "from --data as in training, else code for a code organisation, else math); with --run it "
                           "comes from config.json")


def add_data_options(data) -> None:
    data.add_argument("--data", default=None,
                      help="built-in tasks: arithmetic (the generated held-out task; with --run its levels and seed), "
                           "arithmetic:1,2,3 (levels), code (the generated code task's held-out split), humaneval, a "
                           "MATH/GSM8K/MBPP .jsonl/.json file, or an HF dataset id (default: code for the code task, else "
                           "arithmetic); a task of your own evaluates its own held-out problems")
    data.add_argument("--split", default=None,
                      help="built-in tasks: split of the generated task or of an HF dataset (a file is its own split; "
                           "default: test)")
    data.add_argument("--limit", type=int, default=None, help="evaluate the first N problems (default: all)")
    data.add_argument("--shuffle", action="store_true",
                      help="shuffle the problems with --seed before --limit takes the first N (MATH files are sorted "
                           "by subject: their first 200 rows are all Algebra)")
    data.add_argument("--skip_malformed_rows", action="store_true",
                      help="leave out malformed data rows with a warning (default: stop at the first, naming it)")


def add_sampling_options(sampling) -> None:
    sampling.add_argument("--samples", type=int, default=4,
                          help="k: sampled episodes per problem (pass@1 averaged over k, pass@k' for k' = 1, 2, 4, ... "
                               "and k; default: 4)")
    sampling.add_argument("--greedy", action=argparse.BooleanOptionalAction, default=True,
                          help="also play one greedy episode per problem (eval/accuracy_greedy; default: on)")
    sampling.add_argument("--temperature", type=float, default=None,
                          help=f"sampling temperature (default: the run's, else the task's, else {Config.temperature})")
    sampling.add_argument("--top_p", type=float, default=1.0,
                          help="nucleus sampling threshold of the sampled episodes (default 1: the full softmax, which "
                               "training samples from)")
    sampling.add_argument("--max_new_tokens", type=int, default=None,
                          help=f"longest response in tokens (default: the run's, else the task's, else {Config.max_new_tokens})")
    sampling.add_argument("--seed", type=int, default=None,
                          help="seed of the sampling noise, of the --shuffle order and, without --run, of the generated "
                               f"task's split (default: the run's seed, else {Config.seed})")


def add_output_options(out) -> None:
    out.add_argument("--transcripts", type=int, default=3,
                     help="print and store the first N sampled episodes in full (default: 3)")
    out.add_argument("--out", default=None,
                     help="JSON file to write (default: RUN/eval-<checkpoint>-<data>.json with --run, "
                          "else ./eval-base-<data>.json)")
    out.add_argument("--threads", type=int, default=Config.threads, help="torch threads (default 0: all cores)")
    out.add_argument("--device", default=Config.device, choices=("auto", "cpu", "cuda"),
                     help="device of the model (default auto: cuda when available, else cpu)")
    out.add_argument("--generation_batch_size", type=int, default=generation.GENERATION_BATCH_SIZE,
                     help=f"prompts per generate() call (default: {generation.GENERATION_BATCH_SIZE})")
    out.add_argument("--backend", default=Config.backend, choices=("hf", "vllm"),
                     help="generation backend: hf (transformers + peft) or vllm (one engine, one LoRARequest per "
                          "agent; its weights in the run's --base_dtype on a GPU, float32 on a CPU; "
                          "MARFT_VLLM=1 bash scripts/setup_env.sh installs it; default: hf)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    validate(args)
    return args


def validate(args: argparse.Namespace) -> None:
    """Fail at start, naming the option, for every value that cannot work."""
    if args.run is not None and (args.model is not None or args.agents is not None):
        raise SystemExit("--model/--agents cannot be combined with --run: a run's model and organisation come from its "
                         "config.json. Drop them to evaluate the run, or drop --run to evaluate a base model.")
    if args.run is not None and args.task is not None:
        raise SystemExit("--task cannot be combined with --run: a run's task comes from its config.json. Drop --task to "
                         "evaluate the run on it, or drop --run to evaluate a base model.")
    if args.checkpoint is not None and args.run is None:
        raise SystemExit("--checkpoint needs --run (the run folder whose checkpoint to evaluate)")
    for option in ("samples", "generation_batch_size", "max_new_tokens", "limit"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise SystemExit(f"--{option}={value}: must be at least 1")
    for option in ("transcripts", "threads"):
        if getattr(args, option) < 0:
            raise SystemExit(f"--{option}={getattr(args, option)}: must be 0 or more")
    if args.temperature is not None and args.temperature <= 0:
        raise SystemExit(f"--temperature={args.temperature}: must be positive (greedy decoding is --greedy)")
    if not 0 < args.top_p <= 1:
        raise SystemExit(f"--top_p={args.top_p}: must lie in (0, 1]")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device=cuda: torch sees no GPU here; use --device cpu")


# ---------------------------------------------------------------------------------------------
# The policies: base model + one LoRA adapter per agent (shared: one for all)
# ---------------------------------------------------------------------------------------------

def build_policies(cfg: Config, org: Organisation, checkpoint: Path | None = None):
    """(model, tokenizer): the base model with fresh policy adapters (B = 0, i.e. the base model),
    then the checkpoint's adapter weights when `checkpoint` is a checkpoint folder. Only the
    policies are built: the critic plays no part in evaluation."""
    adapters = agents_lib.policy_adapter_names(org.learners, cfg.shared_adapter)
    model, tokenizer = agents_lib.build_model(cfg, adapters)
    if checkpoint is not None:
        run_lib.load_adapters(checkpoint, model, adapters)
    return model, tokenizer


# ---------------------------------------------------------------------------------------------
# Numbers from the rollouts (pure functions)
# ---------------------------------------------------------------------------------------------

def pass_at_k_values(samples: int) -> list[int]:
    """k' = 1, 2, 4, … ≤ k, and k itself."""
    ks, k = [], 1
    while k <= samples:
        ks.append(k)
        k *= 2
    return ks if ks[-1] == samples else ks + [samples]


def pass_at_k_table(counts: list[int], samples: int) -> dict[str, float]:
    """eval/pass@k': mean over problems of the unbiased pass@k' from c_p correct of k samples."""
    return {f"eval/pass@{k}": sum(pass_at_k(samples, c, k) for c in counts) / len(counts)
            for k in pass_at_k_values(samples)}


def maj_at_k_table(sampled: Rollout, num_problems: int, samples: int, same) -> dict[str, float]:
    """eval/maj@k' for k' = 1, 2, 4, … ≤ k, and k (none when the task's info says no answers: code)."""
    if not has_answers(sampled):
        return {}
    return {f"eval/maj@{k}": maj_at_k(sampled, num_problems, k, same) for k in pass_at_k_values(samples)}


def ordered_metrics(metrics: dict, pass_table: dict, maj_table: dict, greedy: Rollout | None) -> dict:
    """evaluate_policy's metrics with every pass@k', maj@k' and the greedy unparseable rate, in
    reading order, then any others (tokens, the orchestration metrics)."""
    ordered = {"eval/accuracy": metrics["eval/accuracy"], **pass_table, **maj_table}
    if greedy is not None:
        ordered["eval/accuracy_greedy"] = metrics["eval/accuracy_greedy"]
    ordered["eval/unparseable_rate"] = metrics["eval/unparseable_rate"]
    if greedy is not None:
        ordered["eval/unparseable_rate_greedy"] = greedy.unparseable / max(greedy.graded_answers, 1)
    return ordered | {key: value for key, value in metrics.items()
                      if key not in ordered and not key.startswith(("eval/pass@", "eval/maj@"))}


def unparseable_tallies(rollout: Rollout, num_problems: int) -> list[tuple[int, int]]:
    """(unparseable graded answers, graded answers) of each problem, over all its episodes and
    steps, when episode b played problem b mod P."""
    tallies = [[0, 0] for _ in range(num_problems)]
    for b, steps in enumerate(rollout.outcomes):
        for outcomes in steps:
            tallies[b % num_problems][0] += sum(o == "unparseable" for o in outcomes.values())
            tallies[b % num_problems][1] += len(outcomes)
    return [tuple(t) for t in tallies]


def group_label(value: str) -> str:
    return value or NO_GROUP


def breakdown(problems: list[Problem], field: str, counts: list[int], samples: int,
              greedy_solved: list[bool] | None, unparseable: list[tuple[int, int]]) -> dict[str, dict]:
    """Per value of Problem.<field> ("level" or "type"), sorted by name: problems, pass@1
    (mean c_p / k), greedy accuracy (None without greedy) and unparseable rate (over the group's
    sampled graded answers)."""
    members: dict[str, list[int]] = defaultdict(list)
    for p, problem in enumerate(problems):
        members[group_label(getattr(problem, field))].append(p)
    table = {}
    for name in sorted(members):
        ps = members[name]
        unparseable_answers = sum(unparseable[p][0] for p in ps)
        graded_answers = sum(unparseable[p][1] for p in ps)
        table[name] = {
            "problems": len(ps),
            "pass@1": sum(counts[p] / samples for p in ps) / len(ps),
            "accuracy_greedy": None if greedy_solved is None else sum(greedy_solved[p] for p in ps) / len(ps),
            "unparseable_rate": unparseable_answers / max(graded_answers, 1),
        }
    return table


def transcripts(rollout: Rollout, problems: list[Problem], org: Organisation, count: int) -> list[dict]:
    """The first `count` episodes of a rollout in full: per step, every action in the order taken
    (σ, or the orchestrator's realised sequence with its calls and how the step ended), the graded
    outcomes and the team reward. Episode b played problems[b mod P]."""
    result = []
    for b in range(min(count, len(rollout.solved))):
        problem = problems[b % len(problems)]
        steps = []
        for t, outcomes in enumerate(rollout.outcomes[b]):
            actions = [{"role": org.order[rollout.agent_index[s]], "text": rollout.texts[s]}
                       for s in range(len(rollout.texts)) if rollout.episode[s] == b and rollout.step[s] == t]
            steps.append({"step": t, "actions": actions, "outcomes": outcomes, "reward": float(rollout.team_reward[b, t])})
            if org.orchestrator:  # the realised D_t: executors called, in order, and how the step ended
                steps[-1] |= {"calls": rollout.calls[b][t], "ended_by": rollout.step_ends[b][t]}
        result.append({"episode": b, "problem": problem.problem, "answer": problem.answer, "level": problem.level,
                       "type": problem.type, "solved": rollout.solved[b], "steps": steps}
                      | ({"tests": list(problem.tests)} if problem.tests else {}))
    return result


def dataset_stem(data: str) -> str:
    """A file-name-safe name of a data source: math_test.jsonl → math_test, openai/gsm8k:main → openai-gsm8k-main."""
    if data.endswith((".jsonl", ".json")):
        data = Path(data).stem
    return re.sub(r"[^A-Za-z0-9._-]+", "-", data).strip("-") or "data"


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def number(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_table(report: dict) -> str:
    """The overall row, then one row per level and per subject."""
    metrics, what = report["metrics"], report["evaluated"]
    lines = [
        f"{what['checkpoint'] or 'base model'} · model {what['model']} · agents {what['agents']} "
        f"({' → '.join(what['roles'])}) · data {what['dataset']} ({what['problems']} problems)",
        f"{what['samples']} sample(s) per problem at T={what['temperature']}, max_new_tokens={what['max_new_tokens']}, "
        f"seed {what['seed']}",
        "  ".join(f"{key.removeprefix('eval/')} {value:.3f}" for key, value in metrics.items()
                  if key.startswith(("eval/pass@", "eval/maj@"))),
        f"generated tokens per episode: sampled {metrics['eval/generated_tokens_per_episode']:.1f}"
        + (f", greedy {metrics['eval/greedy/generated_tokens_per_episode']:.1f}"
           if "eval/greedy/generated_tokens_per_episode" in metrics else "")
        + f" (a problem at k = {what['samples']} samples: {what['samples'] * metrics['eval/generated_tokens_per_episode']:.0f})",
        "",
        f"{'group':<32} {'problems':>8} {'pass@1':>7} {'greedy':>7} {'unparseable':>12}",
    ]

    def row(label: str, stats: dict) -> str:
        return (f"{label[:32]:<32} {stats['problems']:>8} {number(stats['pass@1']):>7} "
                f"{number(stats['accuracy_greedy']):>7} {number(stats['unparseable_rate']):>12}")

    lines.append(row("all", {"problems": what["problems"], "pass@1": metrics["eval/accuracy"],
                             "accuracy_greedy": metrics.get("eval/accuracy_greedy"),
                             "unparseable_rate": metrics["eval/unparseable_rate"]}))
    for kind, key in (("level", "by_level"), ("subject", "by_subject")):
        for name, stats in report[key].items():
            lines.append(row(f"{kind}: {name}", stats))
    if "eval/calls_per_episode" in metrics:  # the realised D_t of the greedy episodes (orchestrated)
        per_role = ", ".join(f"{key.removeprefix('eval/calls/')} {value:.2f}" for key, value in metrics.items()
                             if key.startswith("eval/calls/"))
        lines.append(f"orchestration (greedy): {metrics['eval/calls_per_episode']:.2f} calls per episode ({per_role}); "
                     f"finish {metrics['eval/finish_rate']:.2f}, max_calls {metrics['eval/max_calls_rate']:.2f}, "
                     f"errors {metrics['eval/orchestration_errors']:.2f} of the steps")
    for kind, counts in report.get("program_outcomes", {}).items():  # code tasks: how the graded programs ended
        lines.append(f"programs ({kind}): " + ", ".join(f"{outcome} {count}" for outcome, count in counts.items()))
    lines.append(f"wall time {report['wall_seconds']:.0f} s ({report['wall_seconds'] / 60:.1f} min)")
    return "\n".join(lines)


def format_transcript(transcript: dict) -> str:
    lines = [f"--- episode {transcript['episode']} ({'solved' if transcript['solved'] else 'not solved'}) "
             f"[{transcript['level'] or NO_GROUP} · {transcript['type'] or NO_GROUP}]",
             f"problem: {transcript['problem']}"]
    lines += [f"test: {test}" for test in transcript["tests"]] if "tests" in transcript else [f"gold answer: {transcript['answer']}"]
    for step in transcript["steps"]:
        for action in step["actions"]:
            lines.append(f"[step {step['step']}] {action['role']}: {action['text'].strip()}")
        if "calls" in step:
            lines.append(f"[step {step['step']}] calls: {' → '.join(step['calls']) or 'none'}; ended by {step['ended_by']}")
        outcomes = ", ".join(f"{role} {outcome}" for role, outcome in step["outcomes"].items())
        lines.append(f"[step {step['step']}] graded: {outcomes}; reward {step['reward']:.3f}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def progress_printer(generate_actions, org: Organisation):
    """Wrap a GenerateActions function to print one line per generation call: phase, call number,
    the adapter that acted (one call per agent per step under a fixed D; per orchestrator round
    or called executor with an orchestrator), episodes and seconds."""
    calls = {"sampled": 0, "greedy": 0}

    def generate(prompt_ids, adapter, sampling):
        phase = "greedy" if sampling.temperature == 0 else "sampled"
        calls[phase] += 1
        started = time.perf_counter()
        actions = generate_actions(prompt_ids, adapter, sampling)
        print(f"  {phase:<7} call {calls[phase]:<3} {adapter:<20} {len(prompt_ids):>5} episodes  "
              f"{time.perf_counter() - started:6.1f} s", flush=True)
        return actions

    return generate


def resolve_config(args: argparse.Namespace) -> tuple[Path | None, Path | None, Config, int]:
    """(run folder, checkpoint folder, config, data seed): a run's checkpoint with the run's
    config.json (its task included), or (None, None, the default Config with --model, --task and
    --agents); then this command line's sampling, metric and machine options. The data seed picks
    the generated task's split: with a run, the run's own held-out split."""
    if args.run is None:
        run_dir, checkpoint = None, None
        task = args.task or tasks.default_task_name(
            args.data or ("code" if args.agents in tasks.CODE.organisations else "arithmetic"), args.agents or Config.agents)
        cfg = Config(model=args.model or Config.model, task=task,
                     agents=args.agents or tasks.default_organisation(tasks.find_task(task)),
                     **tasks.find_task(task).options)  # the task's own defaults (the word task's temperature)
    else:
        run_dir = Path(args.run)
        cfg = read_config(run_dir, "--run")
        cfg.task = cfg.task or tasks.default_task_name(cfg.data, cfg.agents)  # a run from before --task: its data's
        checkpoint = run_lib.checkpoint_folder(run_dir, args.checkpoint, "--run")
    seed = cfg.seed if args.seed is None else args.seed
    data_seed = cfg.seed if run_dir is not None else seed
    cfg = dataclasses.replace(
        cfg, seed=seed, resume="", eval_samples=args.samples, eval_greedy=args.greedy,
        temperature=cfg.temperature if args.temperature is None else args.temperature,
        max_new_tokens=cfg.max_new_tokens if args.max_new_tokens is None else args.max_new_tokens,
        threads=args.threads, backend=args.backend,
        vllm_gpu_memory_utilization=0.9,  # no trainer shares the GPU
        device="cpu" if args.backend == "vllm" else args.device)  # vllm: the policies only hand their adapters to the engine
    tasks.organisation_of(cfg)  # one the task offers, or a profile file: else a message naming them
    task = tasks.task_of(cfg)
    if task in (tasks.MATH, tasks.CODE):
        args.data = args.data or ("code" if task is tasks.CODE else "arithmetic")
        args.split = args.split or "test"
    elif args.data is not None or args.split is not None:
        raise SystemExit(f"--data/--split: the {task.name} task evaluates its own held-out problems (its load); "
                         "drop them (--limit and --shuffle still pick among those problems)")
    return run_dir, checkpoint, cfg, data_seed


def load_eval_problems(args: argparse.Namespace, cfg: Config, data_seed: int) -> tuple[str, list[Problem]]:
    """(source, problems). Built-in tasks: --data, where "arithmetic" is the generated task with
    the config's levels and `data_seed` picks its split (a run's own held-out split). A task of
    your own: its held-out problems, loaded with `data_seed`. cfg.seed is the --shuffle order."""
    task = tasks.task_of(cfg)
    if task in (tasks.MATH, tasks.CODE):
        source = f"arithmetic:{cfg.arithmetic_levels}" if args.data == "arithmetic" else args.data
        try:
            problems = load_problems(source, split=args.split, limit=None if args.shuffle else args.limit, seed=data_seed,
                                     skip_malformed=args.skip_malformed_rows)
        except (ValueError, FileNotFoundError, ImportError) as err:
            raise SystemExit(f"--data={args.data!r}: {err}") from None
    else:
        source = f"{task.name} (held-out)"
        problems = tasks.task_problems(task, dataclasses.replace(cfg, seed=data_seed))[1]
    if args.shuffle:
        random.Random(f"evaluate-shuffle-{cfg.seed}").shuffle(problems)
    problems = problems[: args.limit]
    if not problems:
        raise SystemExit(f"--data={args.data!r}: no problems to evaluate")
    if task in (tasks.MATH, tasks.CODE):
        tasks.check_data(task is tasks.CODE, cfg, problems, "data")
    return source, problems


def output_path(args: argparse.Namespace, run_dir: Path | None, checkpoint: Path | None, cfg: Config) -> Path:
    """--out, else RUN/eval-<checkpoint>-<data>.json, else ./eval-base-<data>.json (a task of your
    own: its name for <data>)."""
    data = args.data or tasks.task_of(cfg).name
    if args.out:
        return Path(args.out)
    if run_dir is not None:
        return run_dir / f"eval-{checkpoint.name}-{dataset_stem(data)}.json"
    return Path(f"eval-base-{dataset_stem(data)}.json")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    wall_start = time.time()
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    speed.return_freed_memory()
    run_dir, checkpoint, cfg, data_seed = resolve_config(args)
    org = tasks.organisation_of(cfg)
    source, problems = load_eval_problems(args, cfg, data_seed)
    print(f"evaluating {checkpoint or 'the base model ' + cfg.model} with agents {cfg.agents} "
          f"on {len(problems)} problems of {source}", flush=True)
    model, tokenizer = build_policies(cfg, org, checkpoint)
    backend = generation.make_backend(cfg, model, tokenizer, agents_lib.policy_adapter_names(org.learners, cfg.shared_adapter),
                                      fallback_sync_dir=Path(tempfile.gettempdir()), progress=True,
                                      batch_size=args.generation_batch_size)
    with Grader() as grader, contextlib.closing(backend):
        metrics, sampled, greedy = heldout_metrics(progress_printer(backend.generate, org), tokenizer, org, problems, grader, cfg,
                                                   top_p=args.top_p)
        maj_table = maj_at_k_table(sampled, len(problems), cfg.eval_samples, same_answer(grader))
        grading_timeouts = grader.timeouts
    report = make_report(args, cfg, run_dir, checkpoint, org, source, problems, metrics, sampled, greedy, maj_table)
    report["diagnostics"]["grading_timeouts"] = grading_timeouts
    report["wall_seconds"] = time.time() - wall_start
    out = output_path(args, run_dir, checkpoint, cfg)
    run_lib.write_json_atomically(out, report)

    print("\n" + format_table(report), flush=True)
    for transcript in report["transcripts"]:
        print("\n" + format_transcript(transcript))
    print(f"\nwrote {out}", flush=True)
    return report


def make_report(args: argparse.Namespace, cfg: Config, run_dir: Path | None, checkpoint: Path | None, org: Organisation,
                source: str, problems: list[Problem], metrics: dict, sampled: Rollout, greedy: Rollout | None,
                maj_table: dict) -> dict:
    """What was evaluated, the metrics with every pass@k' and maj@k', the breakdowns and the transcripts."""
    counts = solved_counts(sampled, len(problems))
    greedy_solved = greedy.solved if greedy is not None else None
    tallies = unparseable_tallies(sampled, len(problems))
    return {
        "evaluated": {
            "model": cfg.model, "run": str(run_dir) if run_dir else None,
            "checkpoint": checkpoint.name if checkpoint else None, "task": cfg.task, "agents": cfg.agents,
            "roles": list(org.order), "graded_roles": list(org.graded_roles), "shared_adapter": cfg.shared_adapter,
            "dataset": source, "split": args.split, "limit": args.limit, "shuffled": args.shuffle, "problems": len(problems),
            "samples": cfg.eval_samples, "greedy": cfg.eval_greedy, "temperature": cfg.temperature, "top_p": args.top_p,
            "max_new_tokens": cfg.max_new_tokens, "max_prompt_tokens": cfg.max_prompt_tokens,
            "horizon": cfg.horizon, "seed": cfg.seed,
            "backend": cfg.backend, "device": agents_lib.resolve_device(cfg.device),
            "date": datetime.now().isoformat(timespec="seconds"),
        },
        "metrics": ordered_metrics(metrics, pass_at_k_table(counts, cfg.eval_samples), maj_table, greedy),
        "by_level": breakdown(problems, "level", counts, cfg.eval_samples, greedy_solved, tallies),
        "by_subject": breakdown(problems, "type", counts, cfg.eval_samples, greedy_solved, tallies),
        "diagnostics": {"truncated_prompts": sampled.truncated_prompts + (greedy.truncated_prompts if greedy else 0),
                        "generation_seconds": sampled.generation_seconds + (greedy.generation_seconds if greedy else 0.0)},
        "transcripts": transcripts(sampled, problems, org, args.transcripts),
        # code tasks: how many graded programs ended each way, sampled and greedy
        "program_outcomes": {kind: {o: rollout.program_outcomes.get(o, 0) for o in PROGRAM_OUTCOMES}
                             for kind, rollout in (("sampled", sampled), ("greedy", greedy))
                             if rollout is not None and rollout.program_outcomes},
    }


if __name__ == "__main__":
    main()
