"""Rollouts and held-out evaluation: the agents playing episodes of the Flex-POMDP.

Paper: MARFT (Liao et al., arXiv 2504.16129), Sec. "Flex-POMDP" (the rollout of one step) and
the algorithm box's sampling phase. README: "Paper ↔ code".

At every step t of an episode the agents act in the topological order σ of the dependency graph;
agent j sees the unrolled observation

    ô^j_t = o^j_t ⊕ {a^i_t : D(a^i, a^j) = 1}                         (Flex-POMDP observation)

and samples a^j_t ~ π^j(· | ô^j_t). The joint action a_t goes to the environment, which returns
the team reward R_t and done_t. Both training (marft.py) and evaluation (evaluate.py) play
episodes through `run_episodes`, so they are the same game.

Generation goes through a `GenerateActions` function, (prompt ids, adapter, sampling) → Actions:
the `generate` method of the backend `agents.make_backend` built (transformers or vLLM).

A `Rollout` keeps every action as one sample s; `to_grid` scatters a per-sample table into the
[B, T, N, …] grid of joint actions that the advantage equations index.

Held-out metrics (`heldout_metrics`), over P problems with k sampled episodes each:

    eval/accuracy          mean over problems of c_p / k (pass@1 estimated from k samples)
    eval/pass@k            mean over problems of 1 − C(k − c_p, k) / C(k, k)  (= any sample right)
    eval/accuracy_greedy   one greedy episode per problem
    eval/unparseable_rate  graded answers with no parseable \\boxed{}, over all graded answers

with c_p the number of solved samples of problem p. `pass_at_k` is the unbiased estimator of
Chen et al. (2021), 1 − C(n − c, k) / C(n, k), for any k ≤ n.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

import agents as agents_lib
from envs import Grader, MathEnv, Problem
from flex_pomdp import Organisation, unrolled_messages
from run import Config

# (prompt ids, adapter name or None for the base model, sampling) → Actions
GenerateActions = Callable[[list[list[int]], "str | None", agents_lib.Sampling], agents_lib.Actions]


@dataclass
class Rollout:
    """Every action of a batch of episodes, flattened: sample s is agent agent_index[s] at
    (episode[s], step[s]). Tensors indexed by episode and step are [B, T]."""

    prompt_ids: list[list[int]] = field(default_factory=list)
    response_ids: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    generation_logprobs: list[list[float]] = field(default_factory=list)  # per token, from the backend
    episode: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    agent_index: list[int] = field(default_factory=list)
    role_reward: list[float] = field(default_factory=list)  # per sample: the agent's per-role reward terms (profile)
    team_reward: torch.Tensor | None = None  # [B, T]
    dones: torch.Tensor | None = None  # [B, T]
    step_mask: torch.Tensor | None = None  # [B, T], 1 where the step happened
    solved: list[bool] = field(default_factory=list)  # [B]: the graded answers were right at the end
    outcomes: list[list[dict[str, str]]] = field(default_factory=list)  # [B][t]: graded role → outcome
    unparseable: int = 0  # graded answers with no parseable \boxed{}
    ungraded: int = 0  # graded answers whose check timed out or crashed the grader
    graded_answers: int = 0
    truncated_prompts: int = 0
    generation_seconds: float = 0.0

    def agent_samples(self, agent: int) -> list[int]:
        """The samples s of agent σ[agent], in rollout order."""
        return [s for s, n in enumerate(self.agent_index) if n == agent]

    def sequences(self, samples) -> tuple[list[list[int]], list[list[int]]]:
        """(prompt ids, response ids) of the given samples: the exact ids of the rollout."""
        return [self.prompt_ids[s] for s in samples], [self.response_ids[s] for s in samples]

    def to_grid(self, table: torch.Tensor, num_agents: int) -> torch.Tensor:
        """Scatter a per-sample table [S, ...] into [B, T, N, ...] (zeros where no action was taken)."""
        B, T = self.step_mask.shape
        out = torch.zeros(B, T, num_agents, *table.shape[1:], dtype=table.dtype)
        out[self.episode, self.step, self.agent_index] = table
        return out


def run_episodes(generate_actions: GenerateActions, tokenizer, org: Organisation, problems: list[Problem],
                 grader: Grader, sampling: agents_lib.Sampling, cfg: Config) -> Rollout:
    """Play one episode per problem with every agent acting in σ order at every step.

    From `cfg`: the horizon H, the format penalty, max_prompt_tokens and shared_adapter."""
    B, T = len(problems), cfg.horizon
    role_rewards = {a.role: a.rewards for a in org.agents}
    envs = [MathEnv(p, grader, list(org.graded_roles), horizon=T, format_penalty=cfg.format_penalty, role_rewards=role_rewards)
            for p in problems]
    observations = [env.reset() for env in envs]
    out = Rollout(team_reward=torch.zeros(B, T), dones=torch.zeros(B, T), step_mask=torch.zeros(B, T),
                  solved=[False] * B, outcomes=[[] for _ in range(B)])
    active = list(range(B))
    for t in range(T):
        step_actions: list[dict[str, str]] = [{} for _ in active]
        step_samples: list[dict[str, int]] = [{} for _ in active]  # the sample index s of each action
        for n, role in enumerate(org.order):
            # ô^j_t = o^j_t ⊕ {a^i_t : D(a^i, a^j) = 1}
            messages = [unrolled_messages(org, role, observations[b], step_actions[k]) for k, b in enumerate(active)]
            prompt_ids, truncated = agents_lib.tokenize_prompts(tokenizer, messages, cfg.max_prompt_tokens)
            started = time.perf_counter()
            # a^j_t ~ π^j(· | ô^j_t)
            actions = generate_actions(prompt_ids, agents_lib.policy_adapter_name(role, cfg.shared_adapter), sampling)
            out.generation_seconds += time.perf_counter() - started
            texts = tokenizer.batch_decode(actions.token_ids, skip_special_tokens=True)
            out.truncated_prompts += truncated
            for k, b in enumerate(active):
                step_actions[k][role] = texts[k]
                step_samples[k][role] = len(out.prompt_ids)
                out.role_reward.append(0.0)
                out.prompt_ids.append(prompt_ids[k])
                out.response_ids.append(actions.token_ids[k])
                out.generation_logprobs.append(actions.logprobs[k])
                out.texts.append(texts[k])
                out.episode.append(b)
                out.step.append(t)
                out.agent_index.append(n)
        still_active = []
        for k, b in enumerate(active):
            # env.step(a_t) → R_t, done_t, o_{t+1}
            observations[b], reward, done, info = envs[b].step(step_actions[k])
            out.team_reward[b, t], out.dones[b, t], out.step_mask[b, t] = reward, float(done), 1.0
            out.solved[b] = info["correct"]
            for role, value in info.get("role_rewards", {}).items():
                out.role_reward[step_samples[k][role]] = value
            out.outcomes[b].append(dict(info["outcomes"]))
            out.unparseable += sum(o == "unparseable" for o in info["outcomes"].values())
            out.ungraded += sum(o == "ungraded" for o in info["outcomes"].values())
            out.graded_answers += len(info["outcomes"])
            if not done:
                still_active.append(b)
        active = still_active
        if not active:
            break
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 − C(n − c, k) / C(n, k)."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 ≤ k ≤ n and 0 ≤ c ≤ n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def solved_counts(rollout: Rollout, num_problems: int) -> list[int]:
    """c_p: solved samples of each problem, when episode b played problem b mod P."""
    counts = [0] * num_problems
    for b, solved in enumerate(rollout.solved):
        counts[b % num_problems] += int(solved)
    return counts


@torch.no_grad()
def heldout_metrics(generate_actions: GenerateActions, tokenizer, org: Organisation, problems: list[Problem],
                    grader: Grader, cfg: Config, greedy_only: bool = False) -> tuple[dict, Rollout | None, Rollout | None]:
    """Held-out metrics of the current policies: (metrics, sampled rollout or None, greedy rollout or None).

    The sampled rollout plays problems × cfg.eval_samples episodes at cfg.temperature, episode b
    on problem b mod P; with cfg.eval_greedy one greedy episode per problem follows. The sampling
    noise is re-seeded from cfg.seed, so every evaluation of a run sees the same noise.
    `greedy_only` (with cfg.eval_greedy) skips the sampled episodes: training's evaluations between
    the first and the last, where they would cost most of the time (an untrained policy's samples
    run to max_new_tokens, the greedy decode mostly stops early).
    """
    metrics, sampled = {}, None
    if not (greedy_only and cfg.eval_greedy):
        samples = cfg.eval_samples
        torch.manual_seed(cfg.seed + 424242)
        sampled = run_episodes(generate_actions, tokenizer, org, problems * samples, grader,
                               agents_lib.Sampling(cfg.temperature, cfg.top_p, cfg.max_new_tokens), cfg)
        counts = solved_counts(sampled, len(problems))
        metrics["eval/accuracy"] = sum(c / samples for c in counts) / len(problems)  # pass@1
        metrics["eval/unparseable_rate"] = sampled.unparseable / max(sampled.graded_answers, 1)
        if samples > 1:
            metrics[f"eval/pass@{samples}"] = sum(pass_at_k(samples, c, samples) for c in counts) / len(problems)
    greedy_rollout = None
    if cfg.eval_greedy:
        greedy_rollout = run_episodes(generate_actions, tokenizer, org, problems, grader,
                                      agents_lib.Sampling(0.0, 1.0, cfg.max_new_tokens), cfg)
        metrics["eval/accuracy_greedy"] = sum(greedy_rollout.solved) / len(problems)
    return metrics, sampled, greedy_rollout
