"""Where an iteration's time goes: one marft.py iteration under torch.profiler, per phase and op family, against its floor.

    python scripts/profile_iteration.py [--out DIR] [--iterations 3] -- [marft.py options]

Runs `marft.train` in this process with the marft.py options after `--` (default: the default job's,
16 problems per iteration) for `--iterations` iterations and profiles only the last one: the first
warms allocators and caches up, the ones between are timed without the profiler. The held-out set is
cut to one problem (the evaluation is not a phase of the table).

Per phase (run.PhaseTimer's: rollout, values, advantages, policy_update, critic_update,
adapter_sync), the profiled seconds split by op family, each op counted by its own (self) time:

    matrix products   aten::mm / addmm / bmm / baddbmm / matmul / linear and oneDNN's linear (the base's and LoRA's projections)
    attention         scaled dot-product attention and its backward
    elementwise       every other aten op that computes: norms, activations, softmax, sums, sampling
    copies & layout   copies, casts, cat/stack, indexing, views, allocations
    autograd engine   the backward nodes' own bookkeeping (their aten ops count in their families)
    optimiser         Adam's step, everything under it
    python & other    the phase's time inside no op: Python, tokenising, grading, the profiler itself

The floor of an iteration: the matrix products it executes (the profiler's FLOP count of mm, addmm,
bmm and baddbmm, and of oneDNN's linear: padding included, attention's products not) at this
machine's GEMM rate (the best of `--gemm_repeats` products of the model's MLP shape, [512, d_model] ×
[d_model, d_ff], in the base dtype at the run's threads, by torch's default library and by oneDNN,
the faster counting; timed once before the training and once after it: a slow timing, which
on a shared machine one of them can be, does not lower the rate and so raise the floor). FLOPs per token (prompt + response tokens of every action) come from the
profiled iteration; `floor_ratio` is the warm unprofiled iterations' seconds (all but the first;
adapter sync included, evaluation not) over that rate × their tokens: how many times its floor an
iteration takes.

The padding-free floor (`padding_free_floor_ratio`): the products an iteration cannot avoid, counted
from its rollout rather than from what ran (`padding_free_flops`). Per agent and pass, the positions
a pass must compute: its rows' shared prompt prefix once, every row's prompt after it and its
response, no padding. A forward costs 2·(W + A) FLOPs per position (W: the base's projection
weights in the decoder layers, A: one adapter's LoRA weights) and 2·V·d more at each response
token, whose next-token logits a log-prob pass needs (V·d: the output layer; the critic's passes
have no such term); a backward through the frozen base costs 2·W + 4·A (the inputs' gradients, and
the adapters' own weight gradients) plus 2·V·d per response token. The passes, as marft.train runs
them: the rollout's generation (one forward), the old log-probs and (critic + GAE) the values,
ppo_epochs forward + backward per learning agent, the forward that recomputes each updated
agent's log-probs for M (all but the last updated; counted as all but σ's last, the same positions
up to which agent the random order leaves last), and ppo_epochs forward + backward of the critic;
all at the same GEMM rate. Every learning agent counts as updated each iteration
(--agent_iteration_interval is not modelled).

The pass ceiling (`pass_ceiling`): what the floor ratio of an iteration can come down to by
rearranging its passes alone. After the training, one plain pass of the trained model under its first
policy adapter, over 8 rows of 16 prompt + 32 response tokens (384 positions: the default micro-batch
budget; random token ids, no shared prefix, no padding), the log-probs of the 32 response tokens of
each row, is timed forward and forward + backward (the best of `--ceiling_repeats`) and its matrix
products counted as above, at the same GEMM rate. An iteration made of nothing but such passes would
take about their ratios (forward for the passes without gradient, forward + backward for the
updates'); what it adds beyond them (the rollout's token-by-token decoding, optimiser steps,
shorter passes, Python) mostly raises its own, though a larger pass (the rollout's prefill, a
larger micro-batch) can run nearer the GEMM rate. `--ceiling_only` measures the ceiling alone, on a freshly
built model (no training) in a process set up as a run's (speed.return_freed_memory's allocator
setting, which the pass's time depends on): for a model too large to train here, e.g. `--model
random:<config.json>`.

Writes <out>/profile.json and <out>/profile.md (--ceiling_only: <out>/ceiling.json). A performance
figure: run it on an idle machine. The profiler holds every op of the iteration with its shapes: about
14 GB of memory for the default job.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import agents  # noqa: E402
import config as config_lib  # noqa: E402
import marft  # noqa: E402
import run as run_lib  # noqa: E402

PHASES = ("rollout", "values", "advantages", "policy_update", "critic_update", "adapter_sync")
FAMILIES = ("matrix products", "attention", "elementwise", "copies & layout", "autograd engine", "optimiser", "python & other")
MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
TOP_OPS = 12  # ops listed by self time under the table
CEILING_ROWS, CEILING_PROMPT_TOKENS, CEILING_RESPONSE_TOKENS = 8, 16, 32  # the pass ceiling's pass: 8 × 48 = 384 positions
COUNTED_FLOPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}  # aten::matmul / linear call these
LAYOUT = {"aten::" + name for name in (
    "copy_", "_to_copy", "to", "contiguous", "clone", "cat", "stack", "index", "index_select", "gather", "scatter",
    "scatter_", "slice", "view", "transpose", "t", "reshape", "_reshape_alias", "_unsafe_view", "expand", "expand_as",
    "permute", "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "fill_", "zero_", "narrow", "select", "unsqueeze", "squeeze", "split", "split_with_sizes", "chunk", "as_strided",
    "embedding", "index_put_", "_index_put_impl_", "masked_fill", "masked_fill_", "unbind", "resize_", "new_zeros",
    "new_empty", "new_empty_strided", "pad", "constant_pad_nd", "repeat", "flip", "detach", "detach_", "alias",
    "lift_fresh", "item", "_local_scalar_dense", "set_", "tensor", "arange", "unfold", "view_as", "flatten",
    "type_as", "masked_select", "nonzero", "where", "repeat_interleave", "roll", "tril", "triu")}


def family(name: str, under_optimiser: bool) -> str:
    """The op family of a profiled event, by its name (the table in the module docstring)."""
    if under_optimiser:
        return "optimiser"
    if "attention" in name.lower():
        return "attention"
    if name in MATMUL:
        return "matrix products"
    if "Backward" in name or name.startswith("autograd::") or "AccumulateGrad" in name:
        return "autograd engine"
    if name in LAYOUT:
        return "copies & layout"
    if name.startswith("aten::"):
        return "elementwise"
    return "python & other"


class Event(NamedTuple):
    """One profiled op or annotation on one thread (times in nanoseconds, as the profiler gives them)."""

    name: str
    start: int
    duration: int
    thread: int
    flops: int


def phase_table(events: list[Event]) -> dict:
    """Per phase (an annotation phase:<phase>): its profiled seconds, the seconds of each op family
    (each event's self time: its duration less its children's, the children being the events that
    start within it on its thread; the phase's own self time counts as python & other) and the
    FLOPs of its matrix products. Events outside every phase are left out."""
    out: dict[str, dict] = {}

    def close(event: Event, children_ns: int, phase: str | None, under_optimiser: bool, is_phase: bool) -> None:
        if phase is None:
            return
        row = out.setdefault(phase, {"seconds": 0.0, "families": dict.fromkeys(FAMILIES, 0.0), "matmul_flops": 0, "ops": {}})
        self_seconds = (event.duration - children_ns) / 1e9
        row["families"]["python & other" if is_phase else family(event.name, under_optimiser)] += self_seconds
        name = "(the phase itself)" if is_phase else event.name
        row["ops"][name] = row["ops"].get(name, 0.0) + self_seconds
        row["seconds"] += event.duration / 1e9 if is_phase else 0.0
        row["matmul_flops"] += event.flops if event.name in COUNTED_FLOPS else 0

    by_thread: dict[int, list[Event]] = {}
    for event in events:
        by_thread.setdefault(event.thread, []).append(event)
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (e.start, -e.duration))  # a parent before the children it contains
        stack: list[list] = []  # open events: [event, children's ns, phase, under the optimiser, is a phase]
        for event in thread_events:
            while stack and stack[-1][0].start + stack[-1][0].duration <= event.start:
                close(*stack.pop())
            parent = stack[-1] if stack else None
            if parent:
                parent[1] += event.duration
            is_phase = event.name.startswith("phase:") and event.name[6:] in PHASES and (parent is None or parent[2] is None)
            phase = event.name[6:] if is_phase else (parent[2] if parent else None)
            under = bool(parent and parent[3]) or event.name.startswith("Optimizer.step")
            stack.append([event, 0, phase, under, is_phase])
        while stack:
            close(*stack.pop())
    return out


def model_gemm_rate(model, repeats: int) -> float:
    """`gemm_flops_per_second` on the model's MLP shape, in its base dtype."""
    config, weight = model.get_base_model().config, next(model.get_base_model().parameters())
    return gemm_flops_per_second(config.hidden_size, config.intermediate_size, weight.dtype, repeats)


def gemm_flops_per_second(hidden: int, intermediate: int, dtype: torch.dtype, repeats: int) -> float:
    """This machine's matrix-product rate on the model's MLP shape, [512, hidden] × [hidden, intermediate]:
    the best of `repeats` products by torch's default library (torch.mm: MKL in torch's x86 builds)."""
    a, b = torch.randn(512, hidden, dtype=dtype), torch.randn(hidden, intermediate, dtype=dtype)
    products = [lambda: torch.mm(a, b)]
    best = float("inf")
    for product in products:
        product()  # warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            product()
            best = min(best, time.perf_counter() - t0)
    return 2 * 512 * hidden * intermediate / best


class ModelShape(NamedTuple):
    """What the padding-free floor needs of the model (module docstring): weights per position."""

    projection_weights: int  # W: the base's linear weights in the decoder layers (the output layer apart)
    adapter_weights: int  # A: one adapter's LoRA weights (A and B of every adapted projection)
    output_weights: int  # V·d: the output layer's weights (vocabulary × hidden)


class AgentTokens(NamedTuple):
    """One agent's rows in one iteration, as the padding-free floor counts them."""

    policy: int  # positions of a pass over its rows: their shared prompt prefix once, each prompt after it, each response
    critic: int  # the same over the critic's inputs (o_t ⊕ a_{t,<k}; the policy's prompts where they are the same)
    responses: int  # response tokens: the positions whose next-token logits a log-prob pass needs
    learns: bool  # it takes a PPO update (a frozen agent's rows are generated and valued, never updated)


def pass_positions(prompts: list[list[int]], responses: list[list[int]]) -> int:
    """Positions one pass over these rows must compute: the prompts' shared prefix once, the rest of
    each prompt and each response (no padding)."""
    if not prompts:
        return 0
    shared = agents.shared_prefix_length(prompts)
    return shared + sum(len(p) - shared + len(r) for p, r in zip(prompts, responses))


def model_shape(model) -> ModelShape:
    """W, A and V·d (ModelShape) of a peft model: its nn.Linear modules, the LoRA ones (lora_A /
    lora_B, every adapter's, divided by the number of adapters) apart from the base's projections,
    the output layer apart from both."""
    base, lora = 0, 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name.endswith("lm_head") or ".lm_head." in name:
            continue
        if ".lora_A." in name or ".lora_B." in name:
            lora += module.weight.numel()
        else:
            base += module.weight.numel()
    config = model.get_base_model().config
    adapters = max(len(getattr(model, "peft_config", {}) or {}), 1)
    return ModelShape(base, lora // adapters, config.vocab_size * config.hidden_size)


def padding_free_flops(agent_rows: list[AgentTokens], shape: ModelShape, critic: bool, ppo_epochs: int) -> dict[str, float]:
    """The padding-free floor's matrix FLOPs per phase (module docstring) of one iteration."""
    W, A, out = shape
    forward = lambda positions, logits: 2 * (W + A) * positions + 2 * out * logits
    backward = lambda positions, logits: (2 * W + 4 * A) * positions + 2 * out * logits
    learners = [a for a in agent_rows if a.learns]
    train = lambda positions, logits: ppo_epochs * (forward(positions, logits) + backward(positions, logits))
    return {
        "rollout": sum(forward(a.policy, a.responses) for a in agent_rows),
        "values": sum(forward(a.policy, a.responses) + (forward(a.critic, 0) if critic else 0) for a in agent_rows),
        "policy_update": sum(train(a.policy, a.responses) for a in learners)
                         + sum(forward(a.policy, a.responses) for a in learners[:-1]),  # M: all but the last
        "critic_update": sum(train(a.critic, 0) for a in agent_rows) if critic else 0.0,
    }


def agent_tokens(org, rollout, cfg) -> list[AgentTokens]:
    """Each learning agent of σ (tools have no rows) as the padding-free floor counts it."""
    frozen = config_lib.frozen_roles(cfg)
    rows = []
    for n, role in enumerate(org.order):
        samples = rollout.agent_samples(n)
        if not samples:
            continue
        prompts, responses = rollout.sequences(samples)
        critic_prompts, _ = rollout.sequences(samples, reader="critic")
        rows.append(AgentTokens(pass_positions(prompts, responses), pass_positions(critic_prompts, responses),
                                sum(map(len, responses)), role not in frozen))
    return rows


def counted_flops(events) -> int:
    """The matrix-product FLOPs of profiled events (kineto's), counted as the floor counts them."""
    return sum(e.flops() for e in events if e.name() in COUNTED_FLOPS)


def pass_ceiling(model, adapter: str, pad_id: int, repeats: int) -> dict:
    """The plain pass of the pass ceiling (module docstring) timed and counted, forward and forward +
    backward: {"forward": {...}, "forward_backward": {...}}, each with its best seconds of `repeats`
    and its matrix FLOPs (`at_gemm_rate` adds the floor and the ratio)."""
    vocab = agents.backbone(model).config.vocab_size
    generator = torch.Generator().manual_seed(0)
    draw = lambda length: torch.randint(0, vocab, (CEILING_ROWS, length), generator=generator).tolist()
    prompts, responses = draw(CEILING_PROMPT_TOKENS), draw(CEILING_RESPONSE_TOKENS)  # [8, 16], [8, 32]

    def one_pass(backward: bool) -> float:
        t0 = time.perf_counter()
        with torch.set_grad_enabled(backward):
            out = agents.policy_logprobs(model, prompts, responses, adapter, pad_id, "action", "sum", 1.0, share_prefix=False)
            if backward:
                out.logprob.sum().backward()
        seconds = time.perf_counter() - t0
        model.zero_grad(set_to_none=True)
        return seconds

    result = {"rows": CEILING_ROWS, "prompt_tokens": CEILING_PROMPT_TOKENS, "response_tokens": CEILING_RESPONSE_TOKENS,
              "adapter": adapter}
    for name, backward in (("forward", False), ("forward_backward", True)):
        one_pass(backward)  # warm-up
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True) as profiler:
            one_pass(backward)
        flops = counted_flops(profiler.profiler.kineto_results.events())
        seconds = min(one_pass(backward) for _ in range(repeats))
        result[name] = {"seconds": seconds, "flops": flops}
    return result


def at_gemm_rate(ceiling: dict, gemm_rate: float) -> dict:
    """The pass ceiling's passes (`pass_ceiling`) with their GFLOP, their floor at `gemm_rate`
    (FLOP/s) and their ratio to it."""
    passes = {name: {**p, "gflop": p["flops"] / 1e9, "floor_seconds": p["flops"] / gemm_rate,
                     "ratio": p["seconds"] * gemm_rate / p["flops"]}
              for name, p in ceiling.items() if name in ("forward", "forward_backward")}
    return {**ceiling, **passes}


def first_policy_adapter(org, cfg) -> str:
    """The adapter the pass ceiling runs: the first learning agent's policy (every adapter has the same shape)."""
    return agents.policy_adapter_names(org.learners, cfg.shared_adapter)[0]


def profile(cfg, iterations: int, gemm_repeats: int) -> dict:
    """Train `iterations` iterations with the last under the profiler; returns the phase table,
    the unprofiled iterations' seconds and tokens, the model's shape and the GEMM rate before the
    training."""
    seen = {"iterations": 0, "timings": [], "tokens": [], "padding_free_flops": []}
    original_build = run_lib.build
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True)
    original_call, original_init = run_lib.PhaseTimer.__call__, run_lib.PhaseTimer.__init__
    original_metrics = marft.iteration_metrics  # train's own name for run.iteration_metrics

    @contextlib.contextmanager
    def labelled_phase(timer, phase):
        with torch.profiler.record_function(f"phase:{phase}"), original_call(timer, phase):
            yield

    def build(cfg):  # the model's MLP shape and base dtype, for the GEMM rate
        built = original_build(cfg)
        seen["model_shape"] = model_shape(built[1])
        seen["gemm_before"] = model_gemm_rate(built[1], gemm_repeats)
        seen["built"] = built
        return built

    def init(timer, *args, **kwargs):
        seen["iterations"] += 1
        if seen["iterations"] == iterations:
            profiler.start()
        original_init(timer, *args, **kwargs)

    def metrics(org, rollout, old, returns, cfg, timer):
        if seen["iterations"] == iterations:
            profiler.stop()
        seen["timings"].append({phase: timer.seconds.get(phase, 0.0) for phase in PHASES})
        seen["tokens"].append(sum(map(len, rollout.prompt_ids)) + sum(map(len, rollout.response_ids)))
        seen["padding_free_flops"].append(padding_free_flops(agent_tokens(org, rollout, cfg), seen["model_shape"],
                                                             cfg.advantage == "gae", cfg.ppo_epochs))
        return original_metrics(org, rollout, old, returns, cfg, timer)

    run_lib.PhaseTimer.__call__, run_lib.PhaseTimer.__init__ = labelled_phase, init
    vars(run_lib).update(build=build)
    vars(marft).update(iteration_metrics=metrics)
    try:
        marft.train(cfg)
    finally:
        run_lib.PhaseTimer.__call__, run_lib.PhaseTimer.__init__ = original_call, original_init
        vars(run_lib).update(build=original_build)
        vars(marft).update(iteration_metrics=original_metrics)
    events = [Event(e.name(), e.start_ns(), e.duration_ns(), e.start_thread_id(), e.flops())
              for e in profiler.profiler.kineto_results.events()]  # not profiler.events(): its tree takes GBs here
    return {"phases": phase_table(events), "timings": seen["timings"], "tokens": seen["tokens"],
            "model_shape": seen["model_shape"]._asdict(), "padding_free_flops": seen["padding_free_flops"],
            "gemm_before": seen["gemm_before"], "built": seen["built"]}


def report(measured: dict, gemm_rate: float) -> dict:
    """The floor and its ratio (module docstring) from `profile`'s measurements: the FLOPs per token of
    the profiled (last) iteration, each earlier iteration's floor at that rate over its own tokens,
    and the warm unprofiled iterations' (all but the first, where there are two or more) seconds
    over their floors."""
    flops = sum(p["matmul_flops"] for p in measured["phases"].values())
    flops_per_token = flops / measured["tokens"][-1]
    seconds = [sum(t.values()) for t in measured["timings"][:-1]]  # the unprofiled iterations
    floors = [flops_per_token * tokens / gemm_rate for tokens in measured["tokens"][:-1]]
    warm = slice(1, None) if len(seconds) > 1 else slice(None)
    warm_timings = measured["timings"][:-1][warm]
    free = [sum(phases.values()) / gemm_rate for phases in measured.get("padding_free_flops", [])[:-1]]  # the unprofiled iterations
    if free:  # reports of profiles from before the padding-free floor have none
        measured = {**measured, "padding_free_floor_seconds_by_iteration": free,
                    "warm_padding_free_floor_seconds_per_iteration": sum(free[warm]) / len(free[warm]),
                    "padding_free_floor_ratio": sum(seconds[warm]) / sum(free[warm])}
    return {**measured, "gemm_gflops_per_second": gemm_rate / 1e9, "matmul_gflop": flops / 1e9,
            "profiled_seconds": sum(p["seconds"] for p in measured["phases"].values()),
            "profiled_seconds_by_family": {f: sum(p["families"][f] for p in measured["phases"].values()) for f in FAMILIES},
            "warm_seconds_by_phase": {phase: sum(t[phase] for t in warm_timings) / len(warm_timings) for phase in warm_timings[0]},
            "matmul_flops_per_token": flops_per_token, "profiled_floor_seconds": flops / gemm_rate,
            "seconds_by_iteration": seconds, "floor_seconds_by_iteration": floors,
            "warm_seconds_per_iteration": sum(seconds[warm]) / len(seconds[warm]),
            "warm_floor_seconds_per_iteration": sum(floors[warm]) / len(floors[warm]),
            "floor_ratio": sum(seconds[warm]) / sum(floors[warm])}


def markdown(result: dict) -> str:
    phases = [p for p in PHASES if p in result["phases"]]
    lines = [f"Measured at commit {result['commit']}: `python scripts/profile_iteration.py {result['command']}`, "
             f"{result['threads']} threads; the profiled iteration (the last of {len(result['timings'])}), seconds by op "
             "family (self time):", "",
             "| phase | profiled s | unprofiled s | " + " | ".join(FAMILIES) + " | matmul GFLOP | at the GEMM rate, s |",
             "| --- | ---: | ---: | " + " ---: |" * len(FAMILIES) + " ---: | ---: |"]
    for phase in phases:
        p = result["phases"][phase]
        lines.append(f"| {phase.replace('_', ' ')} | {p['seconds']:.2f} | {result['warm_seconds_by_phase'][phase]:.2f} | "
                     + " | ".join(f"{p['families'][f]:.2f}" for f in FAMILIES)
                     + f" | {p['matmul_flops'] / 1e9:.1f} | {p['matmul_flops'] / 1e9 / result['gemm_gflops_per_second']:.2f} |")
    total = result["profiled_seconds_by_family"]
    lines.append(f"| **iteration** | **{result['profiled_seconds']:.2f}** | "
                 f"**{result['warm_seconds_per_iteration']:.2f}** | " + " | ".join(f"**{total[f]:.2f}**" for f in FAMILIES)
                 + f" | **{result['matmul_gflop']:.1f}** | **{result['profiled_floor_seconds']:.2f}** |")
    ops: dict[str, float] = {}
    for phase in phases:
        for name, seconds in result["phases"][phase].get("ops", {}).items():
            ops[name] = ops.get(name, 0.0) + seconds
    top = sorted(ops.items(), key=lambda item: -item[1])[:TOP_OPS]
    lines += ["", f"The {TOP_OPS} ops with the most self time in the profiled iteration: "
              + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in top) + "."]
    timed = result.get("gemm_gflops_per_second_before_and_after")  # profiles from before it have one
    lines += ["", f"GEMM rate {result['gemm_gflops_per_second']:.1f} GFLOP/s"
              + (f" (the better of {timed[0]:.1f} before the training and {timed[1]:.1f} after it)" if timed else "")
              + f"; {result['tokens'][-1]} tokens (prompt + "
              f"response of every action) in the profiled iteration, {result['matmul_flops_per_token'] / 1e6:.1f} MFLOP of "
              f"matrix products per token. The warm unprofiled iterations: {result['warm_seconds_per_iteration']:.1f} s "
              f"each against a floor of {result['warm_floor_seconds_per_iteration']:.1f} s: "
              f"**{result['floor_ratio']:.1f}× the floor** (`floor_ratio`)."]
    if "padding_free_floor_ratio" in result:
        last = result["padding_free_flops"][-1]
        lines += ["", f"The padding-free floor (the products no implementation can skip: each agent's shared prefix once, no "
                  f"padding; module docstring): {result['warm_padding_free_floor_seconds_per_iteration']:.1f} s per warm "
                  f"iteration, so it takes **{result['padding_free_floor_ratio']:.1f}× the padding-free floor** "
                  f"(`padding_free_floor_ratio`); in the profiled iteration, per phase at the GEMM rate: "
                  + ", ".join(f"{phase.replace('_', ' ')} {flops / 1e9 / result['gemm_gflops_per_second']:.2f} s"
                              for phase, flops in last.items()) + "."]
    if "pass_ceiling" in result:  # profiles from before it have none
        lines += ["", ceiling_sentence(result) + " Each phase against its products at the ceiling's ratio (forward for the "
                  "rollout and the values, forward + backward for the updates), warm unprofiled seconds: "
                  + ", ".join(f"{phase.replace('_', ' ')} {result['warm_seconds_by_phase'][phase]:.1f} s against "
                              f"{seconds:.1f} s" for phase, seconds in at_the_ceiling(result).items()) + "."]
    return "\n".join(lines) + "\n"


def at_the_ceiling(result: dict) -> dict[str, float]:
    """Seconds each phase's profiled matrix products would take at the pass ceiling's ratio: the forward
    pass's for the rollout and the values (no gradient), the forward + backward pass's for the updates.
    The products are the profiled iteration's, the seconds they stand beside the warm unprofiled
    iterations' (the same job on other problems, whose floors differ by about 1%)."""
    ratio = {"rollout": "forward", "values": "forward", "policy_update": "forward_backward", "critic_update": "forward_backward"}
    return {phase: result["phases"][phase]["matmul_flops"] / 1e9 / result["gemm_gflops_per_second"]
                   * result["pass_ceiling"][kind]["ratio"]
            for phase, kind in ratio.items() if phase in result["phases"]}


def ceiling_sentence(result: dict) -> str:
    """The pass ceiling (module docstring) in one paragraph."""
    c = result["pass_ceiling"]
    f, fb = c["forward"], c["forward_backward"]
    return (f"The pass ceiling (`pass_ceiling`; {result['model']}, {result['threads']} threads, GEMM rate "
            f"{result['gemm_gflops_per_second']:.1f} GFLOP/s): one plain pass under {c['adapter']}, {c['rows']} rows of "
            f"{c['prompt_tokens']} prompt + {c['response_tokens']} response tokens (no shared prefix, no padding), "
            f"forward {f['seconds'] * 1000:.0f} ms against a floor of {f['floor_seconds'] * 1000:.0f} ms "
            f"(**{f['ratio']:.2f}×**), forward + backward {fb['seconds'] * 1000:.0f} ms against "
            f"{fb['floor_seconds'] * 1000:.0f} ms (**{fb['ratio']:.2f}×**): an iteration made of such passes alone, "
            "no decoding, no optimiser, would take about these ratios, by its mix of passes with and without gradient.")


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    own, marft_argv = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "results" / "speed" / "profile"), help="report folder")
    parser.add_argument("--iterations", type=int, default=3,
                        help="iterations to train; the last is profiled (at least 2; none with --ceiling_only)")
    parser.add_argument("--gemm_repeats", type=int, default=20, help="matrix products timed for the GEMM rate (the best counts)")
    parser.add_argument("--ceiling_repeats", type=int, default=5, help="timed repeats of each pass of the pass ceiling (the best counts)")
    parser.add_argument("--ceiling_only", action="store_true",
                        help="measure the pass ceiling alone on a freshly built model, no training (writes <out>/ceiling.json)")
    args = parser.parse_args(own)
    if args.iterations < 2:
        raise SystemExit(f"--iterations {args.iterations}: at least 2 (the last is profiled, the others timed without the profiler)")
    if any(a == "--iterations" or a.startswith("--iterations=") for a in marft_argv):
        raise SystemExit("profile_iteration.py: give --iterations before `--` (the script's own), not among marft.py's options")
    out = Path(args.out)
    shutil.rmtree(out / "runs" / "profiled", ignore_errors=True)  # the profiled run is scratch: a new one every time
    cfg = config_lib.parse_args(["--iterations", str(args.iterations), "--eval_problems", "1", "--eval_samples", "1",
                              "--no-eval_greedy", "--eval_interval", "0", "--output_dir", str(out / "runs"),
                              "--run_name", "profiled", *marft_argv])
    if agents.resolve_device(cfg.device).startswith("cuda"):
        raise SystemExit("profile_iteration.py profiles the CPU (op times, the CPU's GEMM rate): give --device cpu after `--`")
    in_checkout = [str(Path(a).relative_to(ROOT)) if Path(a).is_absolute() and Path(a).is_relative_to(ROOT) else a for a in argv]
    provenance = {"command": " ".join(in_checkout), "model": cfg.model,
                  "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                           text=True).stdout.strip()}
    out.mkdir(parents=True, exist_ok=True)
    if args.ceiling_only:
        run_lib.set_up_process(cfg)  # threads and freed memory handed back: the pass's time depends on them
        org, model, tokenizer, _, _ = run_lib.build(cfg)
        rates = [model_gemm_rate(model, args.gemm_repeats)]
        ceiling = pass_ceiling(model, first_policy_adapter(org, cfg), tokenizer.pad_token_id, args.ceiling_repeats)
        rates.append(model_gemm_rate(model, args.gemm_repeats))
        result = {"pass_ceiling": at_gemm_rate(ceiling, max(rates)), "gemm_gflops_per_second": max(rates) / 1e9,
                  "gemm_gflops_per_second_before_and_after": [rate / 1e9 for rate in rates],
                  "threads": torch.get_num_threads(), **provenance}
        (out / "ceiling.json").write_text(json.dumps(result, indent=1) + "\n")
        print(ceiling_sentence(result))
        return result
    measured = profile(cfg, args.iterations, args.gemm_repeats)
    before = measured.pop("gemm_before")
    org, model, tokenizer, _, _ = measured.pop("built")
    after = model_gemm_rate(model, args.gemm_repeats)
    result = report(measured, max(before, after))
    result |= {"gemm_gflops_per_second_before_and_after": [before / 1e9, after / 1e9],
               "threads": torch.get_num_threads(), **provenance,
               "pass_ceiling": at_gemm_rate(pass_ceiling(model, first_policy_adapter(org, cfg), tokenizer.pad_token_id,
                                                         args.ceiling_repeats), max(before, after))}
    (out / "profile.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "profile.md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
