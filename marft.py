"""MARFT: multi-agent reinforcement fine-tuning of LLM agents that share one base model.

Paper: Liao, Wen, Wang, Zhang, *Multi-Agent Reinforcement Fine-Tuning*, arXiv 2504.16129. This
file is the algorithm box (`train`) and its phases; the README's "Module map" places the other
modules and its "Paper ↔ code" table maps every equation to the function that computes it.

One iteration (the paper's algorithm box):

    1. rollout      for t = 0 … H−1: for j in σ: a^j_t ~ π^j(· | ô^j_t); env.step(a_t) → R_t, done_t
                    (orchestrated: the orchestrator and the executors it calls act in turn)
    2. old policy   log π^j_old(a^j_t | ô^j_t), V_φ(o_t ⊕ a_{t,<k}) for the k-th action of the step
    3. advantages   r^i_t by credit assignment; Â, R by GAE over the (step, agent) chain,
                    or over the token chain with --decision_unit token
                    (--advantage group: no critic, Â from the returns of G episodes per problem)
    4. agents       in a random permutation, each agent maximises E[min(ρ M Â, clip(ρ) M Â)],
                    then M ← M · ρ^{agent} (trust-region agent-by-agent update)
    5. critic       minimise the clipped value loss toward R (not with --advantage group)
    6. eval, metrics, atomic checkpoint

Every per-sample table is [S, L] with a mask: S samples (one per action taken), L decisions per
sample, L = 1 at the action level and L = the longest response at the token level (`--decision_unit`).
Only `agents.policy_logprobs`, `agents.summed_logprobs`, `critic.decision_values` and `ppo.gae`
look at the level.

Deviations from the paper and choices it leaves open (each a named option of config.Config):
- `credit` (`last`): where the team reward lands among a step's agents; a profile may add per-role
  reward terms to an agent's placed reward.
- The critic's input for the k-th action of a step is o_t ⊕ every earlier action of the step,
  whatever D lets the policy read (rollout.py records it): δ of an action is informative only if
  the next value has seen it (the multi-agent advantage decomposition).
- `advantage group` (GRPO-style, no critic): Â of an action is its agent's return against the other
  episodes of its problem (`group_size` G; ppo.group_advantages); `group_baseline batch`: against
  every episode of the iteration (REINFORCE++).
- A D that changes with t (`agents orchestrated`): tables are indexed by (episode, step, k-th action);
  an agent acting several times in a step enters M with the product of its ratios.
- The HAPPO factor of an agent is its whole action's ratio π_new(a) / π_old(a), bounded to [1/c, c]
  (`happo_ratio_clip` c = 2); `shared_adapter`: every role moves one θ, one joint PPO update (M = 1).
- No entropy bonus, no KL penalty to a reference policy. GAE advantages are normalised per agent
  over its real samples only (ppo.normalize_advantages); `target_kl` ends an agent's epochs at the
  first minibatch whose approximate KL to π_old exceeds it, before that minibatch's step.
- `lr_schedule` cosine decays the rates to `lr_final_ratio` over `lr_decay_iterations` (ppo.scheduled_lr).
- The math task's single agent learns without a critic by default (tasks.MATH.organisation_options).
- A step whose loss or gradient is not finite is skipped; MAX_NONFINITE_STEPS of them in one update
  stop the run before its checkpoint.
- Training samples the full softmax at T (no top-p/top-k: π_old would not be the policy that drew).
  `backend vllm`: the adapters are re-registered under fresh lora_int_ids after each update; the PPO
  old log-probs always come from the training model, on the rollout's token ids.
- `rollout_correction` (verl's TIS/MIS): a sampler μ other than π_old (vLLM) weighs each decision's
  surrogate term by w = min(π_old/μ, C) (`tis`) or drops it where π_old/μ > C (`mis`); M stays
  π_new/π_old; after every sync a sampler still serving an old adapter stops the run.
- `eval/accuracy` is pass@1 over `eval_samples` samples at the training temperature and
  `eval/accuracy_greedy` decodes greedily; every `eval_interval` iterations, greedy only.
- All randomness of iteration k is seeded from (seed, k) (run.seed_iteration): a resumed run
  replays an uninterrupted one, and a checkpoint stores no generator state.
- `time_limit_minutes` ends a run early at equal wall time; under torchrun every phase's work is
  split over ranks so that the numbers stay one process's (distributed.py).

Usage: python marft.py --help
"""
from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

import torch
from tqdm import tqdm

import agents as agents_lib
import critic as critic_lib
import distributed
import ppo
from config import Config, frozen_roles, parse_args, role_temperatures
from envs import Grader
from flex_pomdp import Organisation
from rollout import Rollout, heldout_metrics, run_episodes
from run import (Job, PhaseTimer, iteration_batch, iteration_metrics, log_and_checkpoint, print_main, seed_iteration,
                 set_up)


def train(cfg: Config) -> dict:
    """MARFT's algorithm box: one pass of the loop is one iteration, one call per phase.
    Under torchrun every rank runs it; distributed.py's docstring says how the work is split."""
    job = set_up(cfg)  # device, task, run folder, model with every adapter, critic, optimisers, generator; resumed state
    org, model, value_heads, optimisers, backend, pad = (job.org, job.model, job.value_heads, job.optimisers, job.backend,
                                                          job.tokenizer.pad_token_id)
    with Grader() as grader, contextlib.closing(backend):
        if job.start == 0:
            job.run.log(0, held_out_evaluation(job, grader, cfg, 0))
        progress = tqdm(range(job.start, cfg.iterations), initial=job.start, total=cfg.iterations, desc="MARFT",
                        dynamic_ncols=True, disable=not distributed.is_main())
        previous: dict[str, list[torch.Tensor]] = {}  # θ^i before the last update of each agent that moved
        for iteration in progress:
            timer, metrics, rng = PhaseTimer(job.device), {}, seed_iteration(cfg.seed, iteration)  # every draw from (seed, k)
            batch = iteration_batch(job.train_problems, cfg.batch_size, cfg.seed, iteration)
            episodes = [problem for problem in batch for _ in range(cfg.group_size)]  # episode b is in group b // G

            # 1. Rollout: every agent acts on its unrolled observation ô^j_t, in σ order.
            with timer("rollout"):
                rollout = run_episodes(backend.generate, job.tokenizer, org, episodes, grader, job.sampling, cfg)
            # 2. Old log-probs log π^i_old and values V_φ (no values without a critic), on the rollout's prompt ids
            #    (the critic's: o_t ⊕ every earlier action of the step).
            with timer("values"):
                old = old_policy_and_values(model, value_heads, pad, org, rollout, cfg)
                # 2b. The sampler μ against π_old: each decision's weight w, and how far μ is (rollout/*)
                metrics |= rollout_correction(rollout, old, backend.exact, cfg)
                if previous:  # the sampler serves the adapters of the last update, or the run stops here
                    metrics |= check_sampler(model, pad, org, rollout, old, previous, cfg, iteration,
                                             backend.description)
            # 3. Advantages: r^i_t by credit assignment, then GAE along the (step, agent) or token chain,
            #    or (--advantage group) each return against the others of its problem's group.
            with timer("advantages"):
                advantages, returns, signal, advantage_stats = compute_advantages(org, rollout, old, cfg)  # [S, L]
            metrics |= advantage_stats
            # 4. Trust-region agent-by-agent policy updates.
            metrics |= schedule_learning_rates(optimisers, iteration, cfg)
            previous = {} if backend.exact else adapter_snapshot(model, optimisers)  # checked after sync
            with timer("policy_update"):
                metrics |= update_agents(model, pad, org, rollout, old, advantages, signal, cfg, optimisers, rng)
            previous = adapters_that_moved(model, previous)
            # 5. Critic: clipped value loss toward the GAE returns.
            if cfg.advantage == "gae":
                with timer("critic_update"):
                    metrics |= update_critic(model, value_heads, pad, rollout, old, returns, cfg, optimisers, rng)
            # The generation backend serves the updated adapters from now on (vLLM: fresh lora_int_ids).
            with timer("adapter_sync"):
                backend.sync(model)
            # 6. Held-out evaluation, metrics, checkpoint.
            out_of_time = distributed.broadcast_object(cfg.time_limit_minutes > 0 and job.run.elapsed() >= 60 * cfg.time_limit_minutes)
            with timer("eval"):
                metrics |= held_out_evaluation(job, grader, cfg, iteration + 1, out_of_time)
            metrics |= iteration_metrics(org, rollout, old, returns, cfg, timer)
            log_and_checkpoint(job, iteration + 1, metrics, progress)
            if out_of_time:
                print_main(f"\ntime limit of {cfg.time_limit_minutes} min reached after iteration {iteration + 1}", flush=True)
                break
    summary = job.run.finish()
    distributed.close()
    return summary


# ---- 2. Old log-probs and values (no grad, batched per agent) -------------------------------

FORWARD_BATCH_SIZE = 8  # sequences per no-grad pass (old log-probs, values, M)


@dataclass
class OldPolicy:
    """What the updates compare against, per sample s: decision tables [S, L] and token tables [S, K]."""

    logprob: torch.Tensor  # log π^i_old per decision, [S, L]
    values: torch.Tensor  # V_φ(x) at the action level, V_φ(x, w_<k) at the token level, x = o_t ⊕ a_{t,<k} (critic.py), [S, L]
    mask: torch.Tensor  # 1 on real decisions (the token level pads shorter responses), [S, L]
    token_mask: torch.Tensor  # 1 on real tokens, [S, K]
    token_logprob: torch.Tensor | None = None  # log π^i_old(w_k | ô, w_<k) per token, [S, K]
    correction: torch.Tensor | None = None  # w of each decision's surrogate term, [S, L] (`rollout_correction`)
    sampler_token_logprob: torch.Tensor | None = None  # log μ per token as the sampler recorded it, [S, K]


def decision_logprobs(model, pad: int, rollout: Rollout, samples, adapter: str | None, cfg: Config,
                      prefix: agents_lib.SharedPrefix | None = None) -> agents_lib.PolicyLogProbs:
    """log π per decision, entropy, mask [n, L'] and token log-probs [n, K'] of the samples under
    `adapter` (`prefix`: their prompts' shared prefix, run already) at the temperature of the role
    whose policy the adapter is (--role_temperatures, else --temperature)."""
    temperature = next((t for role, t in role_temperatures(cfg).items()
                        if adapter == agents_lib.policy_adapter_name(role, cfg.shared_adapter)), cfg.temperature)
    prompts, responses = rollout.sequences(samples)
    return agents_lib.policy_logprobs(model, prompts, responses, adapter, pad, cfg.decision_unit, cfg.action_logprob,
                                      temperature, cfg.prefix_sharing, prefix=prefix)


@torch.no_grad()
def old_policy_and_values(model, value_heads, pad: int, org: Organisation, rollout: Rollout, cfg: Config) -> OldPolicy:
    """log π^i_old, V_φ (zeros without a critic), the decision mask and the token log-probs of every sample."""
    chunks = []  # (samples, log π_old, V, mask, token mask, token log π_old), one entry per forward batch of this rank
    batches = []  # (agent, role, samples) of every forward batch
    for n, role in enumerate(org.order):
        idx = rollout.agent_samples(n)
        batches += [(n, role, idx[start : start + FORWARD_BATCH_SIZE]) for start in range(0, len(idx), FORWARD_BATCH_SIZE)]
    @functools.cache
    def prefix(n: int, adapter: str | None, reader: str = "policy") -> agents_lib.SharedPrefix | None:
        """The prompt prefix all of agent n's samples share, run once for all its batches (not once per batch)."""
        return agent_prefix(model, rollout, torch.tensor(rollout.agent_samples(n)), adapter, cfg, reader)

    for n, role, chunk in distributed.shard(batches):  # under torchrun each rank computes every G-th batch
        adapter = agents_lib.policy_adapter_name(role, cfg.shared_adapter)
        policy = decision_logprobs(model, pad, rollout, chunk, adapter, cfg, prefix(n, adapter))
        # V_φ(o_t ⊕ a_{t,<k}): the critic reads every earlier action of the step (rollout.py's docstring)
        critic = critic_lib.SHARED_CRITIC
        values = (critic_lib.decision_values(model, value_heads, critic, *rollout.sequences(chunk, reader="critic"), pad,
                                             cfg.decision_unit, cfg.prefix_sharing, prefix(n, critic, "critic"))
                  if cfg.advantage == "gae" else torch.zeros_like(policy.logprob))
        chunks.append((chunk, policy.logprob, values, policy.mask, policy.token_mask, policy.token_logprob))
    S = len(rollout.prompt_ids)
    widths = [distributed.max_int(max((tables[k].shape[1] for _, *tables in chunks), default=0)) for k in range(5)]  # L, L, L, K, K
    old = OldPolicy(*(torch.zeros(S, width) for width in widths))
    tables = (old.logprob, old.values, old.mask, old.token_mask, old.token_logprob)
    for chunk, *parts in chunks:
        for whole, part in zip(tables, parts):
            whole[chunk, : part.shape[1]] = part
    for table in tables:
        distributed.sum_(table)  # each entry was filled on exactly one rank
    return old


# ---- 2b. Rollout correction: the sampler μ that drew the rollout against π_old --------------

def rollout_correction(rollout: Rollout, old: OldPolicy, exact_sampler: bool, cfg: Config) -> dict:
    """Set old.correction, the weight w [S, L] of every decision's surrogate term (--rollout_correction;
    1 where the sampler is the training model itself, μ = π_old: ppo.rollout_correction_weights);
    returns how far μ is from π_old (ppo.sampler_mismatch: the rollout/* metrics)."""
    tokens, decisions = ppo.sampler_logprobs(rollout.generation_logprobs, old.token_mask, cfg.decision_unit,
                                             cfg.action_logprob)  # log μ, [S, K] and [S, L]
    mode = "none" if exact_sampler else cfg.rollout_correction
    old.sampler_token_logprob = tokens  # read again by check_sampler
    old.correction = ppo.rollout_correction_weights(old.logprob, decisions, mode, ppo.ROLLOUT_CORRECTION_CAP) * old.mask
    return ppo.sampler_mismatch(old.token_logprob, tokens, old.token_mask, old.logprob, decisions, old.mask,
                                ppo.ROLLOUT_CORRECTION_CAP)


STALE_CHECK_SAMPLES = 16  # samples per agent and rank that the stale check reads
STALE_CHECK_POWER = 0.2  # the check stops a run only when β's standard error is below this


@torch.no_grad()
def check_sampler(model, pad: int, org: Organisation, rollout: Rollout, old: OldPolicy,
                  previous: dict[str, list[torch.Tensor]], cfg: Config, iteration: int, sampler: str) -> dict:
    """After a sync the sampler μ must serve each updated agent's new adapter. On up to STALE_CHECK_SAMPLES of the
    agent's samples that this rank drew (rank r played episodes r, r + G, …), the token log-probs under the adapter
    now (π_new) and as `previous` held it (π_prev), batched alike so that their rounding cancels, and μ's give
    ppo.stale_share's slope β: ≈ 1 for a sampler that kept the old adapter, ≈ 0 for a current one. β > 0.5 + 3
    errors (error below STALE_CHECK_POWER) on any rank stops the run. Logs rollout/stale_share/<agent>, the
    largest over ranks."""
    ranks, rank, stats = distributed.world_size(), distributed.rank(), {}
    for adapter, weights in previous.items():
        label = "shared" if adapter == agents_lib.SHARED_ADAPTER else adapter.removeprefix("policy_")
        chosen, mine = [s for s, n in enumerate(rollout.agent_index) if rollout.episode[s] % ranks == rank and
                        agents_lib.policy_adapter_name(org.order[n], cfg.shared_adapter) == adapter], None
        if chosen:
            chosen = torch.tensor(chosen[:STALE_CHECK_SAMPLES])
            now = decision_logprobs(model, pad, rollout, chosen, adapter, cfg).token_logprob  # [n, K']
            with adapter_weights(model, adapter, weights):
                before = decision_logprobs(model, pad, rollout, chosen, adapter, cfg).token_logprob
            width = now.shape[1]
            mine = ppo.stale_share(old.sampler_token_logprob[chosen, :width], now, before, old.token_mask[chosen, :width])
        found = [x for x in distributed.all_gather_objects(mine) if x is not None]  # every rank's (β, error)
        if not found:
            continue
        beta, error = max(found, key=lambda be: be[0] - 3 * be[1])
        stats[f"rollout/stale_share/{label}"] = beta
        if error < STALE_CHECK_POWER and beta > 0.5 + 3 * error:
            raise SystemExit(f"stale sampler: the {sampler} still serves agent {label!r} as it "
                             f"was before the update of iteration {iteration} (it misses {beta:.2f} ± {error:.2f} of "
                             "that update's change to the log-probs of its samples), so its rollouts would sample the "
                             f"old policy; the run stops, its checkpoints are intact. The backend's sync "
                             "(generation.py) did not reach it.")
    return stats


def adapter_snapshot(model, optimisers: dict) -> dict[str, list[torch.Tensor]]:
    """θ^i of every policy adapter as it is now (copies; a few MB for LoRA): what a sampler that
    missed the next sync would still serve."""
    return {adapter: [p.detach().clone() for p in agents_lib.adapter_parameters(model, adapter)]
            for adapter in optimisers if adapter.startswith("policy")}


def adapters_that_moved(model, snapshot: dict[str, list[torch.Tensor]]) -> dict[str, list[torch.Tensor]]:
    """The entries of an `adapter_snapshot` whose adapter's weights have changed since."""
    return {adapter: weights for adapter, weights in snapshot.items()
            if any(not torch.equal(p, w) for p, w in zip(agents_lib.adapter_parameters(model, adapter), weights))}


@contextlib.contextmanager
def adapter_weights(model, adapter: str, weights: list[torch.Tensor]):
    """The adapter holds `weights` (an `adapter_snapshot` entry) inside the block, its own after."""
    params = agents_lib.adapter_parameters(model, adapter)
    current = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, w in zip(params, weights):
            p.copy_(w)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, w in zip(params, current):
                p.copy_(w)


# ---- 3. Advantages --------------------------------------------------------------------------

def compute_advantages(org: Organisation, rollout: Rollout, old: OldPolicy, cfg: Config):
    """r_{t,k} by credit assignment plus each agent's per-role reward terms, on grids [B, T, P] of the
    k-th learning action of each step (rollout.learning_position), then Â: (Â [S, L], R [S, L] or None
    without a critic, signal [S] with group advantages or None, metrics)."""
    acted = rollout.to_grid(torch.ones(len(rollout.position)))  # [B, T, P]
    rewards = ppo.place_team_reward(rollout.team_reward, acted, cfg.credit)  # [B, T, P]
    rewards = rewards + rollout.to_grid(torch.tensor(rollout.role_reward))  # the profiles' per-role terms
    where = (rollout.episode, rollout.step, rollout.position)
    if cfg.advantage == "group":
        # Per agent: its reward at step t is the mean over its actions of the step (an agent that
        # acts twice is not paid twice); the group compares it across the problem's episodes.
        agent_rewards, agent_acted = per_agent_mean(rollout, rewards[where], len(org.order))  # [B, T, N]
        # G^i_t = r^i_t + Σ_{t' > t} γ^(t'−t) R_t': its own reward, then the team's later rewards.
        groups = ppo.baseline_groups(len(rollout.solved), cfg.group_size, cfg.group_baseline)
        advantages, signal, zero_signal = ppo.group_advantages(agent_rewards, rollout.team_reward, agent_acted, groups,
                                                               cfg.gamma, cfg.group_std)  # [B, T, N]
        sample = (rollout.episode, rollout.step, rollout.agent_index)
        # Every decision of an action (each token at the token level) gets its agent's Â.
        return (advantages[sample].unsqueeze(-1) * old.mask, None, signal[sample],
                {"charts/zero_signal_groups": zero_signal})
    # γ_agent = γ_token = 1: the agents of a step and the tokens of an action are not time steps
    advantages, returns = ppo.gae(rewards, rollout.to_grid(old.values), rollout.to_grid(old.mask), rollout.dones,
                                  cfg.gamma, 1.0, 1.0, cfg.lam)  # [B, T, P, L]
    return advantages[where], returns[where], None, {}


def per_agent_mean(rollout: Rollout, sample_rewards: torch.Tensor, num_agents: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample rewards [S] → (mean reward of each agent's actions at each step [B, T, N], 1 where it acted [B, T, N])."""
    B, T = rollout.step_mask.shape
    index = (torch.tensor(rollout.episode), torch.tensor(rollout.step), torch.tensor(rollout.agent_index))
    total = torch.zeros(B, T, num_agents, dtype=sample_rewards.dtype).index_put_(index, sample_rewards, accumulate=True)
    count = torch.zeros(B, T, num_agents, dtype=sample_rewards.dtype).index_put_(index, torch.ones_like(sample_rewards), accumulate=True)
    return total / count.clamp(min=1.0), (count > 0).to(sample_rewards.dtype)


# ---- 4. Trust-region agent-by-agent update of the policies ----------------------------------

def schedule_learning_rates(optimisers: dict, iteration: int, cfg: Config) -> dict:
    """Set every optimiser's learning rate for this iteration (--lr_schedule; `ppo.scheduled_lr`),
    from the rate it was built with (kept as param_group["initial_lr"], so a resumed run agrees)."""
    horizon = cfg.lr_decay_iterations or cfg.iterations
    for optimiser in optimisers.values():
        for group in optimiser.param_groups:
            group.setdefault("initial_lr", group["lr"])
            group["lr"] = ppo.scheduled_lr(group["initial_lr"], iteration, horizon, cfg.lr_schedule, cfg.lr_final_ratio)
    return {"charts/lr": ppo.scheduled_lr(cfg.lr, iteration, horizon, cfg.lr_schedule, cfg.lr_final_ratio)}


def update_agents(model, pad: int, org: Organisation, rollout: Rollout, old: OldPolicy, advantages: torch.Tensor,
                  signal: torch.Tensor | None, cfg: Config, optimisers: dict, rng: torch.Generator) -> dict:
    """Update the agents one at a time (HAPPO): agent i_{m+1} optimises M · Â with
    M = Π_{l ≤ m} ρ^{i_l}, each ρ recomputed after agent i_l's own update (`happo_weight_after_update`).
    With --shared_adapter every role moves one θ: one joint PPO update over all samples (M = 1)."""
    if cfg.shared_adapter:
        plan = [("shared", agents_lib.SHARED_ADAPTER, list(range(len(rollout.prompt_ids))))]
    else:
        # --frozen_agents: a fixed π^i, its ratio 1 in every M
        learners = tuple(role for role in org.learners if role not in frozen_roles(cfg))
        plan = [(role, agents_lib.policy_adapter_name(role, False), rollout.agent_samples(org.order.index(role)))
                for role in ppo.agent_update_order(learners, rng)]
        plan = [entry for entry in plan if entry[2]]  # an executor no episode called has nothing to learn from
    stats: dict[str, float] = {}
    happo_weight = torch.ones_like(rollout.step_mask)  # M [B, T]: one factor per joint action, starts at 1
    for m, (label, adapter, sample_list) in enumerate(plan):
        samples = torch.tensor(sample_list)
        stats |= update_agent(model, pad, rollout, old, advantages, signal, happo_weight, samples, label, adapter, cfg,
                              optimisers[adapter], rng)
        if m == len(plan) - 1:  # the last agent's ratio would weight no one: its pass is skipped
            break
        if stats[f"losses/update_samples/{label}"] == 0:  # it did not move: its ratio is 1
            continue
        new_logprob = logprobs_after_update(model, pad, rollout, old, samples, adapter, cfg)  # [n, L]
        stats[f"losses/kl_after_update/{label}"] = ppo.approx_kl(new_logprob, old.logprob[samples], old.mask[samples]).item()
        happo_weight = happo_weight_after_update(rollout, old, samples, new_logprob, happo_weight, cfg)
    stats["losses/happo_weight_mean"] = ppo.masked_mean(happo_weight, rollout.step_mask).item()
    return stats


def update_agent(model, pad: int, rollout: Rollout, old: OldPolicy, advantages: torch.Tensor, signal: torch.Tensor | None,
                 happo_weight: torch.Tensor, samples: torch.Tensor, label: str, adapter: str, cfg: Config, optimiser,
                 rng: torch.Generator) -> dict:
    """PPO epochs of one agent (adapter θ^i, metrics under `label`) on its own samples [n]: minimise
    `agent_objective` over minibatches; a minibatch whose approximate KL to π_old exceeds target_kl
    ends the epochs before its step. An agent left with no sample (--skip_zero_signal_groups) takes
    no step on any rank (Adam's momentum alone would move it)."""
    params = agents_lib.adapter_parameters(model, adapter)
    # normalised per agent over its real decisions; group advantages within their groups already
    agent_adv = (advantages[samples] if cfg.advantage == "group"
                 else ppo.normalize_advantages(advantages[samples], old.mask[samples]))  # [n, L]
    weight = happo_weight[torch.tensor(rollout.episode)[samples], torch.tensor(rollout.step)[samples]].unsqueeze(-1)  # M, [n, 1]
    if cfg.skip_zero_signal_groups:  # DAPO's dynamic sampling without the resampling: only episodes that disagree with their group
        keep = signal[samples]  # [n]: the sample's group had returns that differ (ppo.group_advantages)
        samples, agent_adv, weight = samples[keep], agent_adv[keep], weight[keep]
    def objective(rows: torch.Tensor, prefix) -> ObjectiveTerms:  # of positions `rows` of `samples`
        new = decision_logprobs(model, pad, rollout, samples[rows], adapter, cfg, prefix)
        return agent_objective(new, old, samples[rows], agent_adv[rows], weight[rows], cfg)

    history, stopped = defaultdict(list), False
    for epoch in range(cfg.ppo_epochs if len(samples) else 0):  # every rank sees the same samples: none steps
        for minibatch in torch.randperm(len(samples), generator=rng).split(cfg.minibatch_size):
            optimiser.zero_grad(set_to_none=True)
            kl, logged, finite = minibatch_gradient(model, rollout, old, samples, minibatch, adapter, cfg, objective)
            if cfg.target_kl > 0 and distributed.sum_(kl).item() > cfg.target_kl:  # the minibatch's KL, on every rank
                optimiser.zero_grad(set_to_none=True)
                stopped = True  # checked before the step it would waste
                break
            if not gradient_step(optimiser, finite, params, cfg.max_grad_norm):
                history["nonfinite_steps"].append(1.0)
                continue
            for key, value in logged.items():
                history[key].append(minibatch_sum(value))
        if stopped:
            break
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    stats = {f"losses/{key}/{label}": mean(history[key]) for key in ("policy_loss", "approx_kl", "clip_fraction", "entropy")}
    stats[f"losses/early_stopped/{label}"] = float(stopped)
    stats[f"losses/update_samples/{label}"] = float(len(samples))
    stats[f"losses/nonfinite_steps/{label}"] = stop_if_diverged(len(history["nonfinite_steps"]), label)
    return stats


class ObjectiveTerms(NamedTuple):
    """One micro-batch's objective as masked means (`agent_objective`, update_critic's), and what is logged of it."""

    per_decision: torch.Tensor  # −E[w · min(ρ M Â, clip(ρ, 1 ± ε) M Â)] (or the value loss), a mean over decisions
    kl_to_old: torch.Tensor  # approximate KL(π_old ‖ π) over decisions: the early stop's (0 for the critic)
    decision_stats: dict  # policy_loss, approx_kl, clip_fraction, entropy (means over decisions; entropy logged only)
    mask: torch.Tensor  # 1 on the rows' real decisions, [n, L']


def agent_objective(new: agents_lib.PolicyLogProbs, old: OldPolicy, batch: torch.Tensor, advantage: torch.Tensor,
                    weight: torch.Tensor, cfg: Config) -> ObjectiveTerms:
    """Agent i's objective on the samples `batch` [n], to minimise (the clipped surrogate with HAPPO's M):

        L = −E[w · min(ρ M Â, clip(ρ, 1 ± ε) M Â)],   ρ = π^i / π^i_old

    w: each decision's rollout correction (1 when the sampler is π_old); new: the agent's log-probs
    under its current adapter; advantage Â [n, L]; weight M [n, 1]. Entropy is logged, not optimised."""
    width = new.logprob.shape[1]  # L' ≤ L: the rows' longest response
    old_lp, mask = old.logprob[batch, :width], old.mask[batch, :width]
    # M [n, 1] times the rollout correction w [n, L'] of each decision (1 when μ = π_old)
    weight = weight * old.correction[batch, :width] if old.correction is not None else weight
    loss, s = ppo.clipped_surrogate_loss(new.logprob, old_lp, advantage[:, :width], mask, cfg.clip_eps, weight)
    decision_stats = {"policy_loss": loss.item(), "approx_kl": s["approx_kl"], "clip_fraction": s["clip_fraction"],
                      "entropy": ppo.masked_mean(new.entropy, mask).item()}
    return ObjectiveTerms(loss, ppo.approx_kl(new.logprob.detach(), old_lp, mask), decision_stats, mask)


def minibatch_gradient(model, rollout: Rollout, old: OldPolicy, samples: torch.Tensor, minibatch: torch.Tensor, adapter: str,
                       cfg: Config, objective, reader: str = "policy") -> tuple[torch.Tensor, dict, bool]:
    """Accumulate the gradient of the minibatch's objective into the adapter's .grad: this rank's rows
    (distributed.rows_of) in `micro_batches` of one agent each, the prefix its rows' prompts (those
    `reader` reads) share run once, each micro-batch's means weighted by its share of the minibatch's
    (summed over micro-batches and ranks: the minibatch's mean). `objective(rows, prefix)`: the
    ObjectiveTerms of positions `rows` of `samples`. Returns (this rank's share of the KL to π_old,
    the logged means, every loss finite)."""
    chunk, counted = distributed.rows_of(minibatch)  # this rank's rows of the minibatch (all of it in one process)
    minibatch_mask = old.mask[samples[minibatch]]
    kl, logged, finite = torch.zeros(()), defaultdict(float), True
    mine = samples[chunk].tolist()
    prompts, responses = rollout.sequences(mine, reader)
    per_agent = micro_batches(prompts, [len(p) + len(r) for p, r in zip(prompts, responses)],
                              [rollout.agent_index[s] for s in mine], cfg.micro_batch_tokens, cfg.prefix_sharing)
    for agent_micro_batches in per_agent:  # positions into `chunk`
        prefix = agent_prefix(model, rollout, samples[chunk[torch.cat(agent_micro_batches)]], adapter, cfg, reader)
        for micro in agent_micro_batches:
            terms = objective(chunk[micro], prefix)
            # the weight of its means in the minibatch's: its decisions / the minibatch's (0 on a rank not counted)
            share = (terms.mask.sum() / minibatch_mask.sum().clamp(min=1.0)).item() if counted else 0.0
            kl = kl + terms.kl_to_old * share
            for key, value in terms.decision_stats.items():
                logged[key] += value * share
            loss = terms.per_decision * share  # ∂loss/∂θ added to .grad; a loss that is not finite adds nothing
            if torch.isfinite(loss):
                loss.backward()
            else:
                finite = False
        agents_lib.backward_shared_prefix(prefix)  # the gradient through the prefix, summed over the micro-batches
    return kl, logged, finite


@torch.no_grad()
def logprobs_after_update(model, pad: int, rollout: Rollout, old: OldPolicy, samples: torch.Tensor, adapter: str,
                          cfg: Config) -> torch.Tensor:
    """log π^{i_m}_new per decision of the agent's samples under its updated adapter, [n, L] like old.logprob."""
    new_logprob = torch.zeros(len(samples), old.logprob.shape[1])
    prefix = agent_prefix(model, rollout, samples, adapter, cfg)  # run once for all the batches
    for chunk in distributed.shard(torch.arange(len(samples)).split(FORWARD_BATCH_SIZE)):  # every G-th batch per rank
        logprob = decision_logprobs(model, pad, rollout, samples[chunk], adapter, cfg, prefix).logprob
        new_logprob[chunk, : logprob.shape[1]] = logprob
    return distributed.sum_(new_logprob)


def happo_weight_after_update(rollout: Rollout, old: OldPolicy, samples: torch.Tensor, new_logprob: torch.Tensor,
                              happo_weight: torch.Tensor, cfg: Config) -> torch.Tensor:
    """M ← M · ρ^{i_m}: the HAPPO factor [B, T] after agent i_m's update, ρ^{i_m} = π_new(a) / π_old(a)
    the ratio of the agent's whole action (the sum of its token log-ratios, also with --action_logprob
    mean), from `logprobs_after_update`. Joint actions the agent took no part in keep their M."""
    lengths = torch.tensor([max(len(rollout.response_ids[s]), 1) for s in samples], dtype=torch.float32)
    log_ratio = agents_lib.summed_logprobs(new_logprob - old.logprob[samples], old.mask[samples], lengths,
                                           cfg.decision_unit, cfg.action_logprob)  # log ρ of each action, [n]
    episode, step = torch.tensor(rollout.episode)[samples], torch.tensor(rollout.step)[samples]
    log_ratio_grid, acted = torch.zeros_like(happo_weight), torch.zeros_like(happo_weight)  # [B, T]
    # An agent that acted more than once in a step (an orchestrator, a re-called executor) enters
    # M with the ratio of all its actions there: the log-ratios add up before the clip.
    log_ratio_grid.index_put_((episode, step), log_ratio, accumulate=True)
    acted[episode, step] = 1.0
    return ppo.update_happo_weight(happo_weight, log_ratio_grid, acted, cfg.happo_ratio_clip or None)


def micro_batches(prompts: list[list[int]], lengths: list[int], groups: list[int], token_budget: int,
                  share_prefix: bool) -> list[list[torch.Tensor]]:
    """Positions 0 … n−1 of a minibatch's rows (lengths: prompt + response tokens; groups: the agent
    of each row) → for each agent, in order of its first row, its micro-batches of positions. A
    micro-batch of k rows costs the agent's shared prefix once (0 without prefix sharing) plus
    k × (its longest row − the prefix), within `token_budget` (a longer row is one of its own): a
    gradient pass's activations stay bounded whatever the number of agents and their prompts' length."""
    by_group: dict[int, list[int]] = {}
    for position, group in enumerate(groups):
        by_group.setdefault(group, []).append(position)
    out = []
    for positions in by_group.values():
        shared = agents_lib.shared_prefix_length([prompts[p] for p in positions]) if share_prefix else 0
        agent_micro_batches, current = [], []
        for position in positions:
            candidate = current + [position]
            if current and shared + len(candidate) * (max(lengths[p] for p in candidate) - shared) > token_budget:
                agent_micro_batches.append(torch.tensor(current))
                candidate = [position]
            current = candidate
        out.append(agent_micro_batches + [torch.tensor(current)])
    return out


def agent_prefix(model, rollout: Rollout, samples: torch.Tensor, adapter: str, cfg: Config,
                 reader: str = "policy") -> agents_lib.SharedPrefix | None:
    """The prompt prefix one agent's samples [n] share (in the prompts `reader` reads), run once with
    gradient under `adapter` for all its micro-batches (agents.run_shared_prefix); None without one."""
    if not cfg.prefix_sharing:
        return None
    return agents_lib.run_shared_prefix(model, rollout.sequences(samples.tolist(), reader)[0], adapter)


def gradient_step(optimiser: torch.optim.Optimizer, finite: bool, params: list, max_grad_norm: float) -> bool:
    """One optimiser step on the accumulated gradients, clipped to max_grad_norm; none (and False)
    when a micro-batch's loss on any rank or the gradient is not finite."""
    if distributed.all_ranks(finite):  # every rank skips, or none does
        distributed.sum_gradients(params)  # Σ over ranks of each rank's share: the minibatch's gradient
        if torch.isfinite(torch.nn.utils.clip_grad_norm_(params, max_grad_norm)):
            optimiser.step()
            return True
    optimiser.zero_grad(set_to_none=True)
    return False


def minibatch_sum(value: float) -> float:
    """Σ over ranks of a weighted per-rank value (a logged loss or statistic of the minibatch)."""
    return value if distributed.world_size() == 1 else distributed.sum_(torch.tensor([value], dtype=torch.float64)).item()


MAX_NONFINITE_STEPS = 3  # skipped (non-finite) optimiser steps in one update of one iteration that stop the run


def stop_if_diverged(skipped_steps: int, label: str) -> float:
    """The number of skipped (non-finite) steps of one update, as a metric; MAX_NONFINITE_STEPS of
    them end the run before this iteration's checkpoint, so the last checkpoint stays intact."""
    if skipped_steps >= MAX_NONFINITE_STEPS:
        raise SystemExit(f"{label}: {skipped_steps} optimiser steps of this iteration had a non-finite loss or gradient "
                         f"({MAX_NONFINITE_STEPS} stop a run); the run stops and its last checkpoint is intact. "
                         "Start a new run with a lower --lr.")
    return float(skipped_steps)


# ---- 5. Critic update -----------------------------------------------------------------------

def update_critic(model, value_heads, pad: int, rollout: Rollout, old: OldPolicy, returns: torch.Tensor, cfg: Config,
                  optimisers: dict, rng: torch.Generator) -> dict:
    """Minimise the clipped value loss ½ E[max((V − R)², (V_old + clip(V − V_old, ±ε_v) − R)²)]
    of the shared critic on every agent's decisions, V read on the critic's input o_t ⊕ a_{t,<k}."""
    adapter, losses, skipped = critic_lib.SHARED_CRITIC, [], 0
    samples = torch.arange(len(rollout.agent_index))
    params = critic_lib.critic_parameters(model, value_heads, adapter)
    def objective(rows: torch.Tensor, prefix) -> ObjectiveTerms:  # of positions `rows` of `samples`
        batch = samples[rows]
        new_values = critic_lib.decision_values(model, value_heads, adapter, *rollout.sequences(batch, reader="critic"),
                                                pad, cfg.decision_unit, cfg.prefix_sharing, prefix)  # [n, L']
        width = new_values.shape[1]
        mask = old.mask[batch, :width]
        loss = ppo.clipped_value_loss(new_values, old.values[batch, :width], returns[batch, :width], mask,
                                      cfg.value_clip or None)
        return ObjectiveTerms(loss, torch.zeros(()), {"value_loss": loss.item()}, mask)

    for epoch in range(cfg.ppo_epochs):
        for minibatch in torch.randperm(len(samples), generator=rng).split(cfg.minibatch_size):
            optimisers[adapter].zero_grad(set_to_none=True)
            _, logged, finite = minibatch_gradient(model, rollout, old, samples, minibatch, adapter, cfg, objective,
                                                   reader="critic")
            if gradient_step(optimisers[adapter], finite, params, cfg.max_grad_norm):
                losses.append(minibatch_sum(logged["value_loss"]))
            else:
                skipped += 1
    return {"losses/value_loss": sum(losses) / len(losses) if losses else float("nan"),
            f"losses/nonfinite_steps/{adapter}": stop_if_diverged(skipped, adapter)}


# ---- 6. Held-out evaluation -----------------------------------------------------------------

def held_out_evaluation(job: Job, grader: Grader, cfg: Config, done_iterations: int, out_of_time: bool = False) -> dict:
    """The held-out metrics (rollout.heldout_metrics) due after `done_iterations`, decoded by the run's
    generation backend: all (pass@k and greedy) before training, after the last iteration or when time
    is up; greedy only every eval_interval iterations; else none."""
    full = done_iterations in (0, cfg.iterations) or out_of_time
    if not full and not (cfg.eval_interval and done_iterations % cfg.eval_interval == 0):
        return {}
    if done_iterations == 0:
        what = " + ".join(([f"{cfg.eval_samples} samples"] if cfg.eval_samples else []) + (["greedy"] if cfg.eval_greedy else []))
        print_main(f"held-out evaluation before training: {len(job.held_out)} problems × {what} …", flush=True)
    return heldout_metrics(job.backend.generate, job.tokenizer, job.org, job.held_out, grader, cfg, not full)[0]


if __name__ == "__main__":
    train(parse_args(description=__doc__.split("\n")[0]))
