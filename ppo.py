"""Multi-agent PPO math: credit assignment, advantages, losses, and the agent-by-agent schedule.

Paper: MARFT (Liao et al., arXiv 2504.16129), Sec. "MARFT" (action-level and token-level
advantages, trust-region agent-by-agent update); README: "Paper ↔ code". Pure tensor math, each function
checked against a hand-worked table.

Symbols and shapes

    B     episodes in the batch            T   steps per episode (horizon H)
    N     actions per step: the agents in the topological order σ of a fixed D, or, with an
          orchestrator, the longest realised sequence P (step t holds K_t ≤ P actions, a mask
          says which; "agent σ_n" below then reads "the n-th action of the step")
    K     length of a flattened chain (K = T·N at the action level)
    r     rewards            [B, T, N]     V   critic values V_φ(o_t ⊕ a_{t,<n}) [B, T, N]
    done  episode ended at t [B, T]        γ   discount between steps
    γ_a   discount between agents of one step (the trainer's: 1, agents are not time steps)
    λ     GAE parameter      ρ   probability ratio π_new / π_old     M   HAPPO weight [B, T]

Action level: the episode is flattened into the chain
(t, σ_1), (t, σ_2), …, (t, σ_N), (t+1, σ_1), … and

    δ_k = r_k + γ_next · V_next · (1 − done) − V_k                                  (TD error)
    Â_k = δ_k + γ_next · λ · (1 − done) · Â_{k+1},      R_k = Â_k + V_k               (GAE)

where "next" is the next agent of the same step (γ_next = γ_a, never cut by done) or the first
agent of step t+1 (γ_next = γ, cut by done). By the multi-agent advantage decomposition
A(o, a^{1:N}) = Σ_i A^i(o, a^{1:i−1}, a^i), agent i's advantage measures how its action moves the
value seen by the next agent: that value's input holds every earlier action of the step, whatever
D lets the next *policy* read (critic.py).

Token level: every token is an action. Inside an action there is no reward and the
discount is γ_token, Q(ô, w_<k, w_k) = γ_token V(ô, w_≤k); the last token of agent i's action
collects r^i_t and hops to the first token of the next agent (γ_a) or of step t+1 (γ, cut by
done). GAE runs along this whole token chain (`token_level_gae`), and the losses below apply
per token with a mask, so padding never carries advantage, loss or entropy.

The update:

    L^i = E[ min(ρ M Â, clip(ρ, 1 − ε, 1 + ε) M Â) ]                  (clipped surrogate, HAPPO)
    L^V = E[ max((V − R)², (V_old + clip(V − V_old, ±ε_v) − R)²) ]    (clipped value loss)
    KL  ≈ (ρ − 1) − log ρ                                              (k3 estimator)

and the trust-region agent-by-agent update: in a random permutation of the agents, update one
agent at a time, starting from M = 1; after agent i_m is updated, M ← M · ρ^{i_m} (detached,
recomputed with its new weights), so agent i_{m+1} optimises M · Â.

Rollout correction (not in the paper): when the rollout's sampler μ is not the training model
(vLLM), every decision's surrogate term is weighted by w = min(π_old / μ, C) (truncated importance
sampling, `rollout_correction_weights`; the masked mode drops the decisions with π_old / μ > C
instead; C = ROLLOUT_CORRECTION_CAP); M stays π_new / π_old. After each sync,
`stale_share` measures whether μ still serves an adapter from before the update (marft.check_sampler).

Critic-free alternative (`group_advantages`, GRPO-style, not in the paper): each action's return
against those of its problem's group; the update is unchanged.

Choices the paper leaves open (marft.py's docstring lists every deviation): GAE advantages are
normalised per agent over its real samples only (explicit masks: an exact zero advantage is data,
never padding); the approximate-KL early stop is checked before the step that would exceed it.
"""
from __future__ import annotations

import math

import torch


CREDIT_OPTIONS = ("last", "equal", "shared")
ADVANTAGE_OPTIONS = ("gae", "group")
LR_SCHEDULES = ("constant", "linear", "cosine")
GROUP_BASELINES = ("group", "batch")
ROLLOUT_CORRECTIONS = ("tis", "mis", "none")
ROLLOUT_CORRECTION_CAP = 2.0  # C of the rollout correction: π_old / μ is truncated (tis) or dropped (mis) beyond it


# ---- Credit assignment: where the team reward R(s_t, a_t) lands among the agents of step t ----

def place_team_reward(team_reward: torch.Tensor, action_mask: torch.Tensor, credit: str) -> torch.Tensor:
    """[B, T] team reward → [B, T, P] rewards r_{t,k} of the k-th action of step t.

    action_mask [B, T, P]: 1 where step t had a k-th action. With a fixed D the k-th action is
    agent σ_k's and every step that happened has all P = N of them; with an orchestrator the
    realised sequence of step t is its first K_t = Σ_k mask positions (K_t differs between steps).

    last:    R on the step's last action (σ_N; the orchestrator's finish), 0 on the others (default)
    equal:   R / K_t to each action of the step
    shared:  R to each action
    """
    if credit not in CREDIT_OPTIONS:
        raise ValueError(f"credit={credit!r}: choose one of {CREDIT_OPTIONS}")
    mask = action_mask.to(team_reward.dtype)  # [B, T, P]
    count = mask.sum(-1, keepdim=True)  # K_t, [B, T, 1]
    position = torch.arange(mask.shape[-1], dtype=team_reward.dtype)  # k, [P]
    if credit == "last":
        share = (position == count - 1).to(team_reward.dtype)
    elif credit == "equal":
        share = 1.0 / count.clamp(min=1.0)
    else:
        share = torch.ones_like(mask)
    return team_reward.unsqueeze(-1) * share * mask


# ---- GAE along a chain (shared by the action level and the token level) ----------------------

def chain_gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, next_discounts: torch.Tensor,
              lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE along a chain of K decisions, each with its own discount to the next one.

    rewards, values, next_values, next_discounts: [B, K]. next_discounts[k] = γ_next · (1 − done)
    for the hop from k to k+1 (0 where the chain ends). Returns (advantages, returns), [B, K].

        δ_k = r_k + next_discounts_k · next_values_k − V_k
        Â_k = δ_k + next_discounts_k · λ · Â_{k+1}
    """
    deltas = rewards + next_discounts * next_values - values  # [B, K]
    advantages = torch.zeros_like(deltas)
    running = torch.zeros_like(deltas[:, 0])
    for k in reversed(range(deltas.shape[1])):
        running = deltas[:, k] + next_discounts[:, k] * lam * running
        advantages[:, k] = running
    return advantages, advantages + values


def action_level_gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, gamma: float, gamma_agent: float,
                     lam: float, last_value: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Action-level advantages Â^i_t and returns R^i_t over the (step, agent) chain.

    rewards, values: [B, T, N]; dones: [B, T] (1 where the episode ended at step t, which cuts
    the hop (t, σ_N) → (t+1, σ_1)); last_value: [B], V(ô^{σ_1}_T) after the last step, for
    trajectories that were cut off without ending (None: zero). Returns two [B, T, N] tensors.
    """
    B, T, N = values.shape
    dones = dones.to(values.dtype)
    if last_value is None:
        last_value = torch.zeros(B, dtype=values.dtype)
    # Next value of (t, n): V(t, n+1) inside the step; V(t+1, σ_1) across steps.
    next_values = torch.empty_like(values)
    next_values[:, :, :-1] = values[:, :, 1:]
    next_values[:, :-1, -1] = values[:, 1:, 0]
    next_values[:, -1, -1] = last_value
    # Discount of the hop out of (t, n): γ_agent inside the step, γ · (1 − done_t) across steps.
    next_discounts = torch.full_like(values, gamma_agent)
    next_discounts[:, :, -1] = gamma * (1.0 - dones)
    advantages, returns = chain_gae(
        rewards.reshape(B, T * N), values.reshape(B, T * N),
        next_values.reshape(B, T * N), next_discounts.reshape(B, T * N), lam,
    )
    return advantages.reshape(B, T, N), returns.reshape(B, T, N)


def token_level_gae(token_rewards_at_end: torch.Tensor, token_values: torch.Tensor, token_mask: torch.Tensor,
                    dones: torch.Tensor, gamma: float, gamma_agent: float, gamma_token: float,
                    lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level advantages and returns: every token is an action (token-level MARFT).

    token_rewards_at_end: [B, T, N], the reward r^i_t placed on agent i (credit assignment),
    paid at the last token of its action; token_values: [B, T, N, L], V(ô^i_t, w_<k) read at the
    position that predicts token k; token_mask: [B, T, N, L], 1 on real tokens (a response cut at
    max_new_tokens simply ends: its last token is a normal last token, not `done`); dones: [B, T].

    Bellman backup along the token chain (t, σ_1, w_1 … w_K), (t, σ_2, …), …, (t+1, σ_1, …):

        inside an action    Q(ô, w_<k, w_k) = γ_token · V(ô, w_≤k)                 (no reward)
        at its last token   Q = r^i_t + γ_next · V(first token position of the next agent)
                            γ_next = γ_agent inside the step, γ · (1 − done_t) across steps

    and GAE with λ along the chain. Padding tokens get exactly zero advantage and return.
    Returns (advantages, returns), both [B, T, N, L].
    """
    B, T, N, L = token_values.shape
    mask = token_mask.bool()
    lengths = token_mask.sum(-1).long()  # [B, T, N]
    # Per-token reward and discount of the hop to the next token in the chain, on the grid.
    position = torch.arange(L).expand(B, T, N, L)
    is_last = mask & (position == (lengths - 1).unsqueeze(-1))
    rewards = torch.where(is_last, token_rewards_at_end.unsqueeze(-1).expand(B, T, N, L), torch.zeros(()))
    hop_discount = torch.full((B, T, N, L), gamma_token, dtype=token_values.dtype)
    # The hop out of an action: γ_agent to the next action of the step, γ · (1 − done_t) out of
    # the step's last action (σ_N with a fixed D; the K_t-th of a realised sequence).
    acted = mask.any(-1)  # [B, T, N]: the step had this action (realised actions come first)
    step_last = torch.arange(N) == acted.sum(-1, keepdim=True) - 1  # [B, T, N]
    across = (gamma * (1.0 - dones.to(token_values.dtype))).unsqueeze(-1).expand(B, T, N)
    end_of_action = torch.where(step_last, across, torch.full_like(across, gamma_agent))
    hop_discount = torch.where(is_last, end_of_action.unsqueeze(-1).expand(B, T, N, L), hop_discount)
    advantages = torch.zeros_like(token_values)
    returns = torch.zeros_like(token_values)
    for b in range(B):
        # Compress episode b's real tokens into one chain, in (t, σ, k) order.
        chain = mask[b].reshape(-1).nonzero().squeeze(-1)  # [K_b]
        if chain.numel() == 0:
            continue
        values = token_values[b].reshape(-1)[chain]
        next_values = torch.cat([values[1:], values.new_zeros(1)])  # the chain ends after its last token
        adv, ret = chain_gae(rewards[b].reshape(-1)[chain].unsqueeze(0), values.unsqueeze(0), next_values.unsqueeze(0),
                             hop_discount[b].reshape(-1)[chain].unsqueeze(0), lam)
        advantages[b].view(-1)[chain] = adv[0]
        returns[b].view(-1)[chain] = ret[0]
    return advantages, returns


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, dones: torch.Tensor, gamma: float,
        gamma_agent: float, gamma_token: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns of every decision, [B, T, N, L], whatever a decision is.

    rewards [B, T, N] (placed by credit assignment), values and mask [B, T, N, L], dones [B, T]; the
    third axis is the k-th action of a step (of the realised sequence with an orchestrator). L = 1:
    `action_level_gae`; L > 1, or steps of unequal lengths: `token_level_gae`, of which the action
    level is the special case L = 1.
    """
    acted = mask.any(-1)  # [B, T, N]
    ragged = bool((acted != acted[..., :1]).any())  # some step has fewer actions than another
    if values.shape[-1] == 1 and not ragged:
        advantages, returns = action_level_gae(rewards, values[..., 0], dones, gamma, gamma_agent, lam)
        return advantages.unsqueeze(-1), returns.unsqueeze(-1)
    return token_level_gae(rewards, values, mask, dones, gamma, gamma_agent, gamma_token, lam)


# ---- Critic-free group advantages (GRPO-style) -----------------------------------------------

def group_returns(rewards: torch.Tensor, team_reward: torch.Tensor, gamma: float) -> torch.Tensor:
    """G^i_{b,t}: agent i's own reward at step t, then the team's rewards of the later steps, [B, T, N].

    rewards [B, T, N]: agent i's reward at step t (placed by credit assignment, plus its per-role
    terms; with an orchestrator the mean over its actions of the step); team_reward [B, T]: R_{b,t}
    (0 at steps that did not happen).

        G^i_{b,t} = r^i_{b,t} + Σ_{t' > t} γ^(t'−t) R_{b,t'} = r^i_{b,t} + γ · F_{b,t+1},
        F_{b,t} = R_{b,t} + γ · F_{b,t+1},  F_{b,T} = 0                   (the team's return from step t)

    Credit assignment splits R_t among the actions of step t; what follows belongs to the team, so an
    action is judged by what follows it, not by whether agent i acts again (an orchestrator's step-0
    action gets one return whether or not the planner is called again). With H = 1, or credit
    `shared` and a fixed D, this is the sum of agent i's own discounted rewards.
    """
    B, T, N = rewards.shape
    returns = torch.zeros_like(rewards)  # G^i_{b,t}, [B, T, N]
    team_return = torch.zeros(B, dtype=rewards.dtype)  # F_{b,t+1}, [B]
    for t in reversed(range(T)):
        returns[:, t] = rewards[:, t] + gamma * team_return.unsqueeze(-1)
        team_return = team_reward[:, t].to(rewards.dtype) + gamma * team_return
    return returns


def baseline_groups(episodes: int, group_size: int, baseline: str) -> torch.Tensor:
    """The comparison group of each of an iteration's episodes, [B]: episode b is in problem b // G's
    group (`group`: GRPO), or every episode in one (`batch`: REINFORCE++'s global baseline,
    Hu 2025), so `group_advantages` compares a return with the whole iteration's at that step."""
    if baseline == "batch":
        return torch.zeros(episodes, dtype=torch.long)
    return torch.arange(episodes) // group_size


def group_advantages(rewards: torch.Tensor, team_reward: torch.Tensor, acted: torch.Tensor, group: torch.Tensor,
                     gamma: float, scale_by_std: bool, eps: float = 1e-4,
                     tolerance: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Â^i_t of every agent's actions from its group's returns, no critic: (advantages [B, T, N],
    signal [B, T, N], zero-signal fraction).

    rewards [B, T, N]: agent i's reward at step t (placed by credit assignment, plus any per-role
    terms); team_reward [B, T]; acted [B, T, N] (or [B, T] when every agent acts at every step that
    happened): 1 where agent i acted at step t; group [B] (episodes of the same problem share a group id).

        G^i_{b,t} = r^i_{b,t} + Σ_{t' > t} γ^(t'−t) R_{b,t'}             (`group_returns`)
        Â^i_{b,t} = (G^i_{b,t} − mean_g G^i_t) / (std_g G^i_t + ε)       (scale_by_std; else G − mean)

    where g is the *step group* of (b, t, i): the episodes of b's problem in which agent i acted at
    step t (with H = 1 and a fixed D the G episodes of the problem, GRPO). A step group of one
    episode has no baseline; std is the sample standard deviation (n − 1, as torch.std). A step
    group whose returns are equal within `tolerance` (max − min ≤ tolerance · max(1, max |G|): 0.85
    under a tool charge of 0.15 is not exactly representable) carries no signal and gets Â = 0
    exactly. `signal` is 1 on the members of step groups with signal (what --skip_zero_signal_groups
    keeps); the third output is the fraction of (step group, agent) cells without, one-episode
    groups included.
    """
    B, T, N = rewards.shape
    acted = (acted.unsqueeze(-1).expand(B, T, N) if acted.dim() == 2 else acted) > 0
    returns = group_returns(rewards, team_reward, gamma)  # [B, T, N]
    advantages, signal = torch.zeros_like(rewards), torch.zeros_like(rewards, dtype=torch.bool)
    cells = silent = 0
    for g in group.unique().tolist():
        for t in range(T):
            for i in range(N):
                members = ((group == g) & acted[:, t, i]).nonzero().squeeze(-1)  # [n]
                if members.numel() == 0:
                    continue
                G = returns[members, t, i]  # [n]
                cells += 1
                if members.numel() < 2 or (G.max() - G.min()).item() <= tolerance * max(1.0, G.abs().max().item()):
                    silent += 1  # no baseline, or every return alike: Â = 0
                    continue
                centred = G - G.mean()
                advantages[members, t, i] = centred / (G.std() + eps) if scale_by_std else centred
                signal[members, t, i] = True
    return advantages, signal, silent / max(cells, 1)


# ---- Masked statistics -----------------------------------------------------------------------

def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over entries with mask = 1 (0 when the mask is empty)."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def normalize_advantages(advantages: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(Â − mean) / (std + eps) over the real entries (mask = 1); masked entries become 0. The mask
    is explicit: an advantage that is exactly 0 is a real sample and is normalised like any other."""
    mask = mask.to(advantages.dtype)
    mean = masked_mean(advantages, mask)
    var = masked_mean((advantages - mean) ** 2, mask)
    return (advantages - mean) / (var.sqrt() + eps) * mask


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 − Var[R − V] / Var[R] over real entries: 1 is a perfect critic, ≤ 0 no better than a constant."""
    var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    residual = returns - values
    var_residual = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
    if var_returns.item() == 0:
        return float("nan")
    return 1.0 - (var_residual / var_returns).item()


# ---- Losses ----------------------------------------------------------------------------------

def approx_kl(new_logprob: torch.Tensor, old_logprob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(π_old ‖ π_new): E[(ρ − 1) − log ρ], ρ = exp(log π_new − log π_old)."""
    log_ratio = new_logprob - old_logprob
    return masked_mean(torch.expm1(log_ratio) - log_ratio, mask)


def clipped_surrogate_loss(new_logprob: torch.Tensor, old_logprob: torch.Tensor, advantages: torch.Tensor,
                           mask: torch.Tensor, clip_eps: float,
                           happo_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """−L^i = −E[min(ρ M Â, clip(ρ, 1 − ε, 1 + ε) M Â)] over real entries (any shape, all alike).

    happo_weight is M (detached; None means M = 1). Returns (loss to minimise, stats) with
    stats = {clip_fraction (ρ outside [1 − ε, 1 + ε]), approx_kl} as floats.
    """
    ratio = torch.exp(new_logprob - old_logprob)
    weighted = advantages if happo_weight is None else happo_weight.detach() * advantages
    unclipped = ratio * weighted
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * weighted
    loss = -masked_mean(torch.minimum(unclipped, clipped), mask)
    with torch.no_grad():
        clip_fraction = masked_mean(((ratio < 1.0 - clip_eps) | (ratio > 1.0 + clip_eps)).to(ratio.dtype), mask).item()
        kl = approx_kl(new_logprob, old_logprob, mask).item()
    return loss, {"clip_fraction": clip_fraction, "approx_kl": kl}


def clipped_value_loss(new_values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       clip_eps: float | None) -> torch.Tensor:
    """½ E[max((V − R)², (V_old + clip(V − V_old, ±ε_v) − R)²)]; clip_eps None: plain ½ E[(V − R)²]."""
    unclipped = (new_values - returns) ** 2
    if clip_eps is None:
        return 0.5 * masked_mean(unclipped, mask)
    clipped_values = old_values + torch.clamp(new_values - old_values, -clip_eps, clip_eps)
    clipped = (clipped_values - returns) ** 2
    return 0.5 * masked_mean(torch.maximum(unclipped, clipped), mask)


# ---- Rollout correction: samples drawn by a sampler μ that is not the training model's π_old ----

def sampler_logprobs(generation_logprobs: list[list[float]], token_mask: torch.Tensor, decision_unit: str,
                     action_logprob: str) -> tuple[torch.Tensor, torch.Tensor]:
    """log μ of every sample as the sampler recorded it, per token [S, K] (masked by token_mask) and per
    decision [S, L], reduced as π_old is: the tokens' sum, or mean ("mean"), at the action level."""
    tokens = torch.zeros_like(token_mask)  # [S, K]
    for s, logprobs in enumerate(generation_logprobs):
        tokens[s, : len(logprobs)] = torch.tensor(logprobs[: tokens.shape[1]], dtype=tokens.dtype)
    tokens = tokens * token_mask
    if decision_unit == "token":
        return tokens, tokens
    decisions = tokens.sum(-1, keepdim=True)  # [S, 1]
    if action_logprob == "mean":
        decisions = decisions / token_mask.sum(-1, keepdim=True).clamp(min=1.0)
    return tokens, decisions


def rollout_correction_weights(old_logprob: torch.Tensor, sampler_logprob: torch.Tensor, mode: str,
                               cap: float) -> torch.Tensor:
    """The weight w of every decision's surrogate term, [S, L] like its log-probs (any shape):

        tis   w = min(π_old / μ, C)         truncated importance sampling (μ drew the sample)
        mis   w = 1[π_old / μ ≤ C]          masked: decisions beyond the cap drop out of the gradient
        none  w = 1

    π_old / μ = exp(log π_old − log μ) with both log-probs of the same decision (a token, or an
    action under the same normalisation)."""
    if mode == "none":
        return torch.ones_like(old_logprob)
    ratio = torch.exp(old_logprob - sampler_logprob)
    if mode == "tis":
        return ratio.clamp(max=cap)
    if mode == "mis":
        return (ratio <= cap).to(old_logprob.dtype)
    raise ValueError(f"rollout correction {mode!r}: choose one of {ROLLOUT_CORRECTIONS}")


def sampler_mismatch(old_token_logprob: torch.Tensor, sampler_token_logprob: torch.Tensor, token_mask: torch.Tensor,
                     old_logprob: torch.Tensor, sampler_logprob: torch.Tensor, mask: torch.Tensor,
                     cap: float) -> dict[str, float]:
    """How far the sampler μ is from π_old: per token [S, K] (masked) the mean |Δ| of
    Δ = log π_old − log μ, the k3 estimate of KL(μ ‖ π_old) = E_μ[(r − 1) − log r] with r = π_old / μ
    (unbiased: the tokens were drawn from μ), the largest |Δ|; per decision [S, L] the share whose
    π_old / μ exceeds the cap C (the decisions `rollout_correction_weights` truncates or drops)."""
    delta = old_token_logprob - sampler_token_logprob  # [S, K]
    real = token_mask > 0
    return {
        "rollout/logprob_abs_diff": masked_mean(delta.abs(), token_mask).item(),
        "rollout/kl_sampler_old": masked_mean(torch.expm1(delta) - delta, token_mask).item(),
        "rollout/max_abs_diff": delta.abs()[real].max().item() if real.any() else 0.0,
        "rollout/beyond_cap": masked_mean((old_logprob - sampler_logprob > math.log(cap)).to(mask.dtype), mask).item(),
    }


def stale_share(sampler_logprob: torch.Tensor, new_logprob: torch.Tensor, previous_logprob: torch.Tensor,
                mask: torch.Tensor) -> tuple[float, float]:
    """How much of an agent's last update the sampler still misses, from samples of the rollout after
    the sync, token tables [n, K] (masked): per sample, X = Σ_k (log μ − log π_new) (what the sampler
    gets wrong) and U = Σ_k (log π_prev − log π_new) (the update, undone); the least-squares slope
    β = Σ X U / Σ U² of X on U, and its standard error from the samples' residuals (tokens of one
    response are not independent). A sampler serving the new adapter has β ≈ 0 (its rounding is not
    the update); one still serving the previous adapter β ≈ 1. Returns (β, standard error); (0, inf)
    with fewer than 2 samples or no movement."""
    m = mask.to(torch.float64)
    X = ((sampler_logprob - new_logprob).double() * m).sum(-1)  # [n]
    U = ((previous_logprob - new_logprob).double() * m).sum(-1)  # [n]
    moved = (U * U).sum()
    if X.numel() < 2 or moved.item() == 0:
        return 0.0, math.inf
    beta = (X * U).sum() / moved
    residual = ((X - beta * U) ** 2).sum() / (X.numel() - 1)
    return beta.item(), (residual / moved).sqrt().item()


# ---- Trust-region agent-by-agent update (HAPPO) ----------------------------------------------

def agent_update_order(order: tuple[str, ...], generator: torch.Generator) -> list[str]:
    """The sequence i_1, …, i_N in which agents are updated this iteration: a fresh random
    permutation of `order` (the paper's construction)."""
    return [order[k] for k in torch.randperm(len(order), generator=generator).tolist()]


def scheduled_lr(lr: float, iteration: int, iterations: int, schedule: str, final_ratio: float = 0.0) -> float:
    """The learning rate of iteration t = `iteration` (0-based) of a decay over T = `iterations`,
    to a floor ρη (ρ = `final_ratio`, 0 by default), where it stays after T:

        constant   η_t = η
        linear     η_t = η · (ρ + (1 − ρ)(1 − p))             p = min(t / T, 1); ρ = 0: the HF Trainer default
        cosine     η_t = η · (ρ + (1 − ρ)(1 + cos(π p)) / 2)  (ρ: Megatron's and verl's min_lr_ratio)
    """
    progress = min(max(iteration / iterations, 0.0), 1.0)
    if schedule == "constant":
        return lr
    if schedule == "linear":
        return lr * (final_ratio + (1.0 - final_ratio) * (1.0 - progress))
    if schedule == "cosine":
        return lr * (final_ratio + (1.0 - final_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))
    raise ValueError(f"lr_schedule={schedule!r}: choose one of {', '.join(LR_SCHEDULES)}")


def update_happo_weight(happo_weight: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor,
                        ratio_clip: float | None = None) -> torch.Tensor:
    """M ← M · ρ^{i_m}, with ρ^{i_m} = π^{i_m}_new(a) / π^{i_m}_old(a) recomputed after agent i_m's update.

    All arguments [B, T] (one entry per joint action); `log_ratio` = log ρ^{i_m} of the agent's
    whole action (at the token level the sum of its token log-ratios). Entries with mask = 0
    (agent i_m did not act there) keep their M. ratio_clip bounds ρ to [1/c, c] (None: unbounded).
    """
    ratio = torch.exp(log_ratio.detach())
    if ratio_clip is not None:
        ratio = ratio.clamp(1.0 / ratio_clip, ratio_clip)
    return torch.where(mask.bool(), happo_weight * ratio, happo_weight)
