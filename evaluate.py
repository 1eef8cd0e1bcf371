"""Evaluate the base model or a checkpoint of a MARFT run on a math or code data set, or on a task of your own.

Paper: MARFT (Liao et al., arXiv 2504.16129); docs/evaluating.md. The agents play training's episodes (rollout.run_episodes)
with the policy adapters only: `--run RUN_DIR`'s checkpoint (default: checkpoints/latest) with its config.json's settings,
or the base model (`--model`, `--task`, `--agents`, the rest at `config.Config`'s defaults, LoRA B = 0).

Metrics over P problems × k = `--samples` episodes: `rollout.heldout_metrics`'s, eval/pass@k' and eval/maj@k' for
k' = 1, 2, 4, … ≤ k, and k; pass@1, greedy accuracy and unparseable rate per level and subject. The noise is seeded
as in training: `--run R --limit <eval_problems> --samples <eval_samples>` replays the run's held-out evaluation.

Usage:
    python evaluate.py                                                # base model, chain, generated held-out task
    python evaluate.py --run runs/<name> --checkpoint iter_000006 --data ../shared/data/math_test.jsonl --limit 200
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
from datetime import datetime
from pathlib import Path

import torch

import agents as agents_lib
import generation
import run as run_lib
import speed
import tasks
from config import Config, read_config
from envs import Grader, Problem, load_problems
from envs.sandbox import OUTCOMES as PROGRAM_OUTCOMES
from flex_pomdp import Organisation
from rollout import Rollout, has_answers, heldout_metrics, maj_at_k, pass_at_k, same_answer, solved_counts

NO_GROUP = "(none)"  # the group of rows without a level or subject


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    what = parser.add_argument_group("what to evaluate")
    what.add_argument("--run", help="run folder written by marft.py (default: the base model)")
    what.add_argument("--checkpoint", help="checkpoint of --run, e.g. iter_000012 (default: checkpoints/latest)")
    what.add_argument("--model", help="base model without --run: smollm2 (embedded), a local HF folder, a hub id or "
                                      f"random:<config.json> (default: {Config.model})")
    what.add_argument("--agents", help="organisation without --run: one the task offers (" + "; ".join(
        f"{t.name}: {' | '.join(t.organisations)}" for t in tasks.TASKS.values()) + "), or a profile JSON file")
    what.add_argument("--task", help=f"task without --run: {' | '.join(tasks.TASKS)} | package.module:name | "
                                     "path/to/file.py (default: chosen from --data and --agents as in training)")
    data = parser.add_argument_group("data")
    data.add_argument("--data", help="built-in tasks: arithmetic[:levels] (generated; with --run its levels and seed), "
                                     "code, humaneval, a MATH/GSM8K/MBPP .jsonl/.json file or an HF dataset id "
                                     "(default: code for the code task, else arithmetic)")
    data.add_argument("--split", help="built-in tasks: split of the generated task or HF dataset (default: test)")
    data.add_argument("--limit", type=int, help="evaluate the first N problems (default: all)")
    data.add_argument("--shuffle", action="store_true", help="shuffle the problems with --seed before --limit")
    data.add_argument("--skip_malformed_rows", action="store_true", help="leave out malformed rows with a warning")
    sampling = parser.add_argument_group("sampling and metrics")
    sampling.add_argument("--samples", type=int, default=4, help="k: sampled episodes per problem (default: 4)")
    sampling.add_argument("--greedy", action=argparse.BooleanOptionalAction, default=True,
                          help="also play one greedy episode per problem (default: on)")
    sampling.add_argument("--temperature", type=float,
                          help=f"sampling temperature (default: the run's, else the task's, else {Config.temperature})")
    sampling.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling threshold (default: 1)")
    sampling.add_argument("--max_new_tokens", type=int,
                          help=f"longest response (default: the run's, else the task's, else {Config.max_new_tokens})")
    sampling.add_argument("--seed", type=int, help="seed of the sampling noise, of --shuffle and, without --run, of "
                                                   f"the generated split (default: the run's, else {Config.seed})")
    out = parser.add_argument_group("output and machine")
    out.add_argument("--transcripts", type=int, default=3, help="print and store N sampled episodes (default: 3)")
    out.add_argument("--out", help="JSON file to write (default: RUN/eval-<checkpoint>-<data>.json with --run, "
                                   "else ./eval-base-<data>.json)")
    out.add_argument("--threads", type=int, default=Config.threads, help="torch threads (default 0: all cores)")
    out.add_argument("--device", default=Config.device, choices=("auto", "cpu", "cuda"),
                     help="device of the model (default auto: cuda when available, else cpu)")
    out.add_argument("--generation_batch_size", type=int, default=generation.GENERATION_BATCH_SIZE,
                     help=f"prompts per generate() call (default: {generation.GENERATION_BATCH_SIZE})")
    out.add_argument("--backend", default=Config.backend, choices=("hf", "vllm"),
                     help="generation backend: hf (transformers + peft) or vllm (one engine, one LoRARequest per "
                          "agent; MARFT_VLLM=1 bash scripts/setup_env.sh installs it; default: hf)")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, failing at start, naming the option, for every value that cannot work."""
    args = build_parser().parse_args(argv)
    if args.run is not None and (given := [o for o in ("model", "agents", "task") if getattr(args, o) is not None]):
        raise SystemExit(f"{'--task' if given == ['task'] else '--model/--agents'} cannot be combined with --run: its "
                         "config.json gives the model, organisation and task. Drop them, or drop --run for a base model.")
    if args.checkpoint is not None and args.run is None:
        raise SystemExit("--checkpoint needs --run (the run folder whose checkpoint to evaluate)")
    for option, least in (("samples", 1), ("generation_batch_size", 1), ("max_new_tokens", 1), ("limit", 1),
                          ("transcripts", 0), ("threads", 0)):
        if (value := getattr(args, option)) is not None and value < least:
            raise SystemExit(f"--{option}={value}: must be " + ("at least 1" if least else "0 or more"))
    if args.temperature is not None and args.temperature <= 0:
        raise SystemExit(f"--temperature={args.temperature}: must be positive (greedy decoding is --greedy)")
    if not 0 < args.top_p <= 1:
        raise SystemExit(f"--top_p={args.top_p}: must lie in (0, 1]")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device=cuda: torch sees no GPU here; use --device cpu")
    return args


def build_policies(cfg: Config, org: Organisation, checkpoint: Path | None = None):
    """(model, tokenizer): the base model with fresh policy adapters, then `checkpoint`'s adapter weights."""
    adapters = agents_lib.policy_adapter_names(org.learners, cfg.shared_adapter)
    model, tokenizer = agents_lib.build_model(cfg, adapters)
    if checkpoint is not None:
        run_lib.load_adapters(checkpoint, model, adapters)
    return model, tokenizer


def pass_at_k_values(samples: int) -> list[int]:
    """k' = 1, 2, 4, … ≤ k, and k itself."""
    ks = [1 << i for i in range(samples.bit_length())]
    return ks if ks[-1] == samples else ks + [samples]


def pass_at_k_table(counts: list[int], samples: int) -> dict[str, float]:
    """eval/pass@k': mean over problems of the unbiased pass@k' from c_p correct of k samples."""
    return {f"eval/pass@{k}": sum(pass_at_k(samples, c, k) for c in counts) / len(counts)
            for k in pass_at_k_values(samples)}


def maj_at_k_table(sampled: Rollout, num_problems: int, samples: int, same) -> dict[str, float]:
    """eval/maj@k' for k' = 1, 2, 4, … ≤ k, and k (none when the task's info says no answers: code)."""
    return {f"eval/maj@{k}": maj_at_k(sampled, num_problems, k, same)
            for k in pass_at_k_values(samples)} if has_answers(sampled) else {}


def unparseable_tallies(rollout: Rollout, num_problems: int) -> list[tuple[int, int]]:
    """(unparseable graded answers, graded answers) of each problem p, over its episodes b ≡ p mod P."""
    graded = [[o for steps in rollout.outcomes[p::num_problems] for outcomes in steps for o in outcomes.values()]
              for p in range(num_problems)]  # [P][graded answers of problem p]
    return [(answers.count("unparseable"), len(answers)) for answers in graded]


def breakdown(problems: list[Problem], field: str, counts: list[int], samples: int,
              greedy_solved: list[bool] | None, unparseable: list[tuple[int, int]]) -> dict[str, dict]:
    """Per value of Problem.<field> ("level" or "type"; "(none)"), sorted: problems, pass@1 (mean c_p / k), greedy
    accuracy (None without greedy) and the unparseable rate of the group's sampled graded answers."""
    members: dict[str, list[int]] = {}
    for p, problem in enumerate(problems):
        members.setdefault(getattr(problem, field) or NO_GROUP, []).append(p)
    return {name: {"problems": len(ps), "pass@1": sum(counts[p] / samples for p in ps) / len(ps),
                   "accuracy_greedy": None if greedy_solved is None else sum(greedy_solved[p] for p in ps) / len(ps),
                   "unparseable_rate": sum(unparseable[p][0] for p in ps)
                   / max(sum(unparseable[p][1] for p in ps), 1)} for name, ps in sorted(members.items())}


def transcripts(rollout: Rollout, problems: list[Problem], org: Organisation, count: int) -> list[dict]:
    """The first `count` episodes (b played problems[b mod P]) in full: per step, every action in the order taken
    (σ, or the orchestrator's calls and how the step ended), the graded outcomes and the team reward R_t."""
    result = []
    for b in range(min(count, len(rollout.solved))):
        problem = problems[b % len(problems)]
        steps = []
        for t, outcomes in enumerate(rollout.outcomes[b]):
            actions = [{"role": org.order[rollout.agent_index[s]], "text": rollout.texts[s]}
                       for s in range(len(rollout.texts)) if rollout.episode[s] == b and rollout.step[s] == t]
            steps.append({"step": t, "actions": actions, "outcomes": outcomes, "reward": float(rollout.team_reward[b, t])}
                         | ({"calls": rollout.calls[b][t], "ended_by": rollout.step_ends[b][t]} if org.orchestrator else {}))
        result.append({"episode": b, "problem": problem.problem, "answer": problem.answer, "level": problem.level,
                       "type": problem.type, "solved": rollout.solved[b], "steps": steps}
                      | ({"tests": list(problem.tests)} if problem.tests else {}))
    return result


def dataset_stem(data: str) -> str:
    """A file-name-safe name of a data source: math_test.jsonl → math_test, openai/gsm8k:main → openai-gsm8k-main."""
    data = Path(data).stem if data.endswith((".jsonl", ".json")) else data
    return re.sub(r"[^A-Za-z0-9._-]+", "-", data).strip("-") or "data"


def format_table(report: dict) -> str:
    """The overall row, then one row per level and per subject."""
    metrics, what = report["metrics"], report["evaluated"]
    tokens, greedy_tokens = metrics["eval/generated_tokens_per_episode"], "eval/greedy/generated_tokens_per_episode"
    lines = [f"{what['checkpoint'] or 'base model'} · model {what['model']} · agents {what['agents']} "
             f"({' → '.join(what['roles'])}) · data {what['dataset']} ({what['problems']} problems)",
             f"{what['samples']} sample(s) per problem at T={what['temperature']}, max_new_tokens={what['max_new_tokens']}, "
             f"seed {what['seed']}",
             "  ".join(f"{key.removeprefix('eval/')} {value:.3f}" for key, value in metrics.items()
                       if key.startswith(("eval/pass@", "eval/maj@"))),
             f"generated tokens per episode: sampled {tokens:.1f}"
             + (f", greedy {metrics[greedy_tokens]:.1f}" if greedy_tokens in metrics else "")
             + f" (a problem at k = {what['samples']} samples: {what['samples'] * tokens:.0f})",
             "", f"{'group':<32} {'problems':>8} {'pass@1':>7} {'greedy':>7} {'unparseable':>12}"]
    groups = [("all", {"problems": what["problems"], "pass@1": metrics["eval/accuracy"],
                       "accuracy_greedy": metrics.get("eval/accuracy_greedy"),
                       "unparseable_rate": metrics["eval/unparseable_rate"]})]
    groups += [(f"{kind}: {name}", group) for kind, key in (("level", "by_level"), ("subject", "by_subject"))
               for name, group in report[key].items()]
    for label, group in groups:
        pass1, greedy, unparseable = ("-" if group[rate] is None else f"{group[rate]:.3f}"
                                      for rate in ("pass@1", "accuracy_greedy", "unparseable_rate"))
        lines.append(f"{label[:32]:<32} {group['problems']:>8} {pass1:>7} {greedy:>7} {unparseable:>12}")
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
        lines += [f"[step {step['step']}] {action['role']}: {action['text'].strip()}" for action in step["actions"]]
        if "calls" in step:
            lines.append(f"[step {step['step']}] calls: {' → '.join(step['calls']) or 'none'}; ended by {step['ended_by']}")
        outcomes = ", ".join(f"{role} {outcome}" for role, outcome in step["outcomes"].items())
        lines.append(f"[step {step['step']}] graded: {outcomes}; reward {step['reward']:.3f}")
    return "\n".join(lines)


def resolve(args: argparse.Namespace) -> tuple[Path | None, Path | None, Config, Organisation, str, list[Problem]]:
    """(run folder, checkpoint folder, config, organisation, data source, problems). The config is a run's, or the
    defaults with --model, --task, --agents; then this command line's options. The problems are --data/--split's
    (built-in tasks, default arithmetic or code and test; "arithmetic" with the config's levels) or a task's own
    held-out ones, split with the run's seed (without --run, --seed's); cfg.seed orders --shuffle."""
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
        cfg, seed=seed, resume="", eval_samples=args.samples, eval_greedy=args.greedy, threads=args.threads,
        temperature=cfg.temperature if args.temperature is None else args.temperature,
        max_new_tokens=cfg.max_new_tokens if args.max_new_tokens is None else args.max_new_tokens,
        backend=args.backend, vllm_gpu_memory_utilization=0.9,  # no trainer shares the GPU
        device="cpu" if args.backend == "vllm" else args.device)  # vllm: the policies only hand their adapters to the engine
    org, task = tasks.organisation_of(cfg), tasks.task_of(cfg)
    if task in (tasks.MATH, tasks.CODE):
        args.data, args.split = args.data or ("code" if task is tasks.CODE else "arithmetic"), args.split or "test"
        source = f"arithmetic:{cfg.arithmetic_levels}" if args.data == "arithmetic" else args.data
        try:
            problems = load_problems(source, split=args.split, limit=None if args.shuffle else args.limit, seed=data_seed,
                                     skip_malformed=args.skip_malformed_rows)
        except (ValueError, FileNotFoundError, ImportError) as err:
            raise SystemExit(f"--data={args.data!r}: {err}") from None
    elif args.data is not None or args.split is not None:
        raise SystemExit(f"--data/--split: the {task.name} task evaluates its own held-out problems (its load); "
                         "drop them (--limit and --shuffle still pick among those problems)")
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
    return run_dir, checkpoint, cfg, org, source, problems


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    wall_start = time.time()
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    speed.return_freed_memory()
    run_dir, checkpoint, cfg, org, source, problems = resolve(args)
    print(f"evaluating {checkpoint or 'the base model ' + cfg.model} with agents {cfg.agents} "
          f"on {len(problems)} problems of {source}", flush=True)
    model, tokenizer = build_policies(cfg, org, checkpoint)
    backend = generation.make_backend(cfg, model, tokenizer, agents_lib.policy_adapter_names(org.learners, cfg.shared_adapter),
                                      fallback_sync_dir=Path(tempfile.gettempdir()), progress=True,
                                      batch_size=args.generation_batch_size)
    calls = {"sampled": 0, "greedy": 0}
    def generate(prompt_ids, adapter, sampling):  # the backend's, printing a line per call
        phase = "greedy" if sampling.temperature == 0 else "sampled"
        calls[phase] += 1
        started = time.perf_counter()
        actions = backend.generate(prompt_ids, adapter, sampling)
        print(f"  {phase:<7} call {calls[phase]:<3} {adapter:<20} {len(prompt_ids):>5} episodes  "
              f"{time.perf_counter() - started:6.1f} s", flush=True)
        return actions
    with Grader() as grader, contextlib.closing(backend):
        metrics, sampled, greedy = heldout_metrics(generate, tokenizer, org, problems, grader, cfg, top_p=args.top_p)
        report = make_report(args, cfg, run_dir, checkpoint, org, source, problems, metrics, sampled, greedy, grader)
    report["wall_seconds"] = time.time() - wall_start
    data = dataset_stem(args.data or tasks.task_of(cfg).name)  # a task of your own: its name
    out = Path(args.out or (run_dir or Path()) / f"eval-{checkpoint.name if run_dir else 'base'}-{data}.json")
    run_lib.write_json_atomically(out, report)
    print("\n" + "\n\n".join([format_table(report)] + [format_transcript(t) for t in report["transcripts"]]), flush=True)
    print(f"\nwrote {out}", flush=True)
    return report


def make_report(args: argparse.Namespace, cfg: Config, run_dir: Path | None, checkpoint: Path | None, org: Organisation,
                source: str, problems: list[Problem], metrics: dict, sampled: Rollout, greedy: Rollout | None,
                grader: Grader) -> dict:
    """What was evaluated, the metrics (every pass@k', maj@k' and the greedy unparseable rate in reading order, then
    the others), the breakdowns and the transcripts."""
    counts, tallies = solved_counts(sampled, len(problems)), unparseable_tallies(sampled, len(problems))
    rollouts = [r for r in (sampled, greedy) if r is not None]
    ordered = {"eval/accuracy": metrics["eval/accuracy"], **pass_at_k_table(counts, cfg.eval_samples),
               **maj_at_k_table(sampled, len(problems), cfg.eval_samples, same_answer(grader)),
               **({} if greedy is None else {"eval/accuracy_greedy": metrics["eval/accuracy_greedy"]}),
               "eval/unparseable_rate": metrics["eval/unparseable_rate"]}
    if greedy is not None:
        ordered["eval/unparseable_rate_greedy"] = greedy.unparseable / max(greedy.graded_answers, 1)
    return {
        "evaluated": {
            "model": cfg.model, "run": str(run_dir) if run_dir else None,
            "checkpoint": checkpoint.name if checkpoint else None, "task": cfg.task, "agents": cfg.agents,
            "roles": list(org.order), "graded_roles": list(org.graded_roles), "shared_adapter": cfg.shared_adapter,
            "dataset": source, "split": args.split, "limit": args.limit, "shuffled": args.shuffle, "problems": len(problems),
            "samples": cfg.eval_samples, "greedy": cfg.eval_greedy, "temperature": cfg.temperature, "top_p": args.top_p,
            "max_new_tokens": cfg.max_new_tokens, "max_prompt_tokens": cfg.max_prompt_tokens, "horizon": cfg.horizon,
            "seed": cfg.seed, "backend": cfg.backend, "device": agents_lib.resolve_device(cfg.device),
            "date": datetime.now().isoformat(timespec="seconds")},
        "metrics": ordered | {key: value for key, value in metrics.items()
                              if key not in ordered and not key.startswith(("eval/pass@", "eval/maj@"))},
        "by_level": breakdown(problems, "level", counts, cfg.eval_samples, greedy and greedy.solved, tallies),
        "by_subject": breakdown(problems, "type", counts, cfg.eval_samples, greedy and greedy.solved, tallies),
        "diagnostics": {"truncated_prompts": sum(r.truncated_prompts for r in rollouts),
                        "generation_seconds": sum(r.generation_seconds for r in rollouts),
                        "grading_timeouts": grader.timeouts},
        "transcripts": transcripts(sampled, problems, org, args.transcripts),
        "program_outcomes": {kind: {o: rollout.program_outcomes.get(o, 0) for o in PROGRAM_OUTCOMES}  # code tasks
                             for kind, rollout in zip(("sampled", "greedy"), rollouts) if rollout.program_outcomes},
    }


if __name__ == "__main__":
    main()
