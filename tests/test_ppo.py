"""Tests of `ppo.py`: credit assignment, action-level GAE, losses, and the agent-by-agent schedule.

Every expected number below is worked out by hand from the equations in ppo.py's docstring (the
derivation is in the comments) — never by calling the code under test or re-running its loop.

Chain notation for B = 1, T = 2, N = 2: k = 0..3 is (t, σ_n) = (0,σ1), (0,σ2), (1,σ1), (1,σ2).

    δ_k = r_k + γ_next · V_next · (1 − done) − V_k
    Â_k = δ_k + γ_next · λ · (1 − done) · Â_{k+1},      R_k = Â_k + V_k

with γ_next = γ_agent inside a step (never cut by done) and γ across steps (cut by done_t).
"""

import math
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

import ppo

TOL = dict(atol=1e-6, rtol=0)


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def every(team_reward, num_agents):
    """The action mask of a fixed D: every agent acts at every step, [B, T, N] of ones."""
    return torch.ones(*team_reward.shape, num_agents)


def close(actual, expected, msg=""):
    torch.testing.assert_close(actual, t(expected), **TOL, msg=msg or None)


# ---------------------------------------------------------------------------------------------
# action_level_gae: hand-worked tables
# ---------------------------------------------------------------------------------------------

GAMMA, GAMMA_AGENT, LAM = 0.9, 0.8, 0.5
# rewards r[t][n] and values V[t][n] for B = 1, T = 2, N = 2; V(ô^{σ1}_T) after the last step = 4.
R_TABLE = [[[1.0, 2.0], [-1.0, 3.0]]]
V_TABLE = [[[0.5, 1.0], [2.0, -0.5]]]
LAST_V = [4.0]


def test_action_level_gae_with_done_at_step_0_cuts_only_the_hop_between_steps():
    adv, ret = ppo.action_level_gae(t(R_TABLE), t(V_TABLE), t([[1.0, 0.0]]), GAMMA, GAMMA_AGENT, LAM, t(LAST_V))
    # δ(1,σ2) = r + γ·V_last·(1−done_1) − V(1,σ2) = 3 + 0.9·4·1 − (−0.5)   = 7.1
    # δ(1,σ1) = r + γ_a·V(1,σ2)              − V(1,σ1) = −1 + 0.8·(−0.5) − 2  = −3.4
    # δ(0,σ2) = r + γ·V(1,σ1)·(1−done_0)     − V(0,σ2) = 2 + 0.9·2·0 − 1      = 1.0   (hop cut)
    # δ(0,σ1) = r + γ_a·V(0,σ2)              − V(0,σ1) = 1 + 0.8·1 − 0.5      = 1.3
    # Â(1,σ2) = 7.1
    # Â(1,σ1) = −3.4 + γ_a·λ·7.1 = −3.4 + 0.4·7.1 = −0.56
    # Â(0,σ2) = 1.0 + γ·λ·0·Â(1,σ1) = 1.0                                       (hop cut)
    # Â(0,σ1) = 1.3 + γ_a·λ·1.0 = 1.3 + 0.4 = 1.7
    close(adv, [[[1.7, 1.0], [-0.56, 7.1]]])
    # R = Â + V: 1.7+0.5, 1.0+1.0, −0.56+2, 7.1−0.5
    close(ret, [[[2.2, 2.0], [1.44, 6.6]]])


def test_action_level_gae_without_done():
    adv, ret = ppo.action_level_gae(t(R_TABLE), t(V_TABLE), t([[0.0, 0.0]]), GAMMA, GAMMA_AGENT, LAM, t(LAST_V))
    # step 1 is unchanged: δ = [−3.4, 7.1], Â = [−0.56, 7.1]
    # δ(0,σ2) = 2 + 0.9·V(1,σ1) − 1 = 2 + 1.8 − 1 = 2.8
    # Â(0,σ2) = 2.8 + γ·λ·Â(1,σ1) = 2.8 + 0.45·(−0.56) = 2.8 − 0.252 = 2.548
    # Â(0,σ1) = 1.3 + 0.4·2.548 = 1.3 + 1.0192 = 2.3192
    close(adv, [[[2.3192, 2.548], [-0.56, 7.1]]])
    close(ret, [[[2.3192 + 0.5, 2.548 + 1.0], [-0.56 + 2.0, 7.1 - 0.5]]])


def test_action_level_gae_last_value_defaults_to_zero():
    adv, _ = ppo.action_level_gae(t(R_TABLE), t(V_TABLE), t([[0.0, 0.0]]), GAMMA, GAMMA_AGENT, LAM)
    # δ(1,σ2) = 3 + 0.9·0 + 0.5 = 3.5; Â(1,σ1) = −3.4 + 0.4·3.5 = −2.0
    # Â(0,σ2) = 2.8 + 0.45·(−2.0) = 1.9;  Â(0,σ1) = 1.3 + 0.4·1.9 = 2.06
    close(adv, [[[2.06, 1.9], [-2.0, 3.5]]])


def test_done_does_not_cut_the_hop_between_agents_of_the_same_step():
    # T = 1, N = 2, the episode ends at step 0. The hop σ1 → σ2 is inside the step: kept.
    adv, ret = ppo.action_level_gae(t([[[0.0, 2.0]]]), t([[[0.5, 1.0]]]), t([[1.0]]), GAMMA, GAMMA_AGENT, LAM,
                                    t([100.0]))
    # δ(σ2) = 2 + γ·100·(1−1) − 1 = 1   (last_value ignored: the episode ended)
    # δ(σ1) = 0 + γ_a·V(σ2) − V(σ1) = 0.8·1 − 0.5 = 0.3   (not 0 − 0.5 = −0.5: no cut)
    # Â(σ1) = 0.3 + γ_a·λ·Â(σ2) = 0.3 + 0.4·1 = 0.7       (not 0.3: no cut)
    close(adv, [[[0.7, 1.0]]], "done must only cut the hop (t, σ_N) → (t+1, σ_1)")
    close(ret, [[[1.2, 2.0]]])


def test_action_level_gae_batch_rows_are_independent():
    # Row 0 is the done-at-step-0 table; row 1 the same data without done.
    r = t(R_TABLE * 2)
    v = t(V_TABLE * 2)
    adv, _ = ppo.action_level_gae(r, v, t([[1.0, 0.0], [0.0, 0.0]]), GAMMA, GAMMA_AGENT, LAM, t([4.0, 4.0]))
    close(adv, [[[1.7, 1.0], [-0.56, 7.1]], [[2.3192, 2.548], [-0.56, 7.1]]])


# ---------------------------------------------------------------------------------------------
# Credit assignment
# ---------------------------------------------------------------------------------------------

TEAM = [[1.0, 2.0], [-3.0, 0.0]]  # [B=2, T=2]


def test_place_team_reward_last():
    r = ppo.place_team_reward(t(TEAM), every(t(TEAM), 3), "last")
    assert r.shape == (2, 2, 3)
    close(r, [[[0, 0, 1.0], [0, 0, 2.0]], [[0, 0, -3.0], [0, 0, 0]]])


def test_place_team_reward_equal():
    r = ppo.place_team_reward(t(TEAM), every(t(TEAM), 3), "equal")
    third = 1.0 / 3.0
    close(r, [[[third] * 3, [2 * third] * 3], [[-1.0] * 3, [0.0] * 3]])
    # the per-step sum over agents is the team reward
    close(r.sum(-1), TEAM)


def test_place_team_reward_shared():
    r = ppo.place_team_reward(t(TEAM), every(t(TEAM), 3), "shared")
    close(r, [[[1.0] * 3, [2.0] * 3], [[-3.0] * 3, [0.0] * 3]])


def test_place_team_reward_unknown_option_raises():
    with pytest.raises(ValueError, match="credit"):
        ppo.place_team_reward(t(TEAM), every(t(TEAM), 2), "first")


# ---------------------------------------------------------------------------------------------
# Group advantages (no critic)
# ---------------------------------------------------------------------------------------------

def test_group_returns_are_the_agents_own_reward_then_the_teams_later_rewards():
    # B = 1, T = 3, N = 2, γ = 0.5. Team rewards R = [1, 0, 2]; the agents' placed rewards (credit
    # and per-role terms) r^0 = [0.5, 0, 1], r^1 = [1, 0, 2].
    # The team's return from step t: F_2 = 2, F_1 = 0 + 0.5 · 2 = 1 (F_3 = 0).
    #   G_2 = r_2 + 0.5 · F_3 = [1, 2];  G_1 = r_1 + 0.5 · F_2 = [1, 1];  G_0 = r_0 + 0.5 · F_1 = [1, 1.5]
    # (Agent 0's own later rewards alone would give G_0 = 0.5 + 0.5 · 0 + 0.25 · 1 = 0.75.)
    rewards = t([[[0.5, 1.0], [0.0, 0.0], [1.0, 2.0]]])  # [B, T, N]
    close(ppo.group_returns(rewards, t([[1.0, 0.0, 2.0]]), gamma=0.5), [[[1.0, 1.5], [1.0, 1.0], [1.0, 2.0]]])


def test_group_returns_of_agents_that_act_every_step_paid_the_team_reward_are_their_own_discounted_rewards():
    # Credit `shared`, a fixed D (every agent acts at every step), no per-role terms: r^i_t = R_t, so
    # r^i_t + Σ_{t' > t} γ^(t'−t) R_t' = Σ_{t' ≥ t} γ^(t'−t) r^i_t' (the agent's own rewards).
    # R = [1, 0, 2], γ = 0.5: G_2 = 2, G_1 = 0 + 0.5 · 2 = 1, G_0 = 1 + 0.5 · 0 + 0.25 · 2 = 1.5, for both agents.
    team = t([[1.0, 0.0, 2.0]])
    rewards = ppo.place_team_reward(team, every(team, 2), "shared")
    close(ppo.group_returns(rewards, team, gamma=0.5), [[[1.5, 1.5], [1.0, 1.0], [2.0, 2.0]]])


def test_group_advantages_two_problems_of_four_episodes_with_ties_and_an_all_equal_group():
    # Problem A (episodes 0–3) returns 1, 0, 1, 1: mean 0.75, sample std √((3·0.25² + 0.75²)/3) = 0.5.
    # Problem B (episodes 4–7) returns 0.5 four times: no signal, Â = 0.
    rewards = t([[[1.0]], [[0.0]], [[1.0]], [[1.0]], [[0.5]], [[0.5]], [[0.5]], [[0.5]]])  # [B=8, T=1, N=1]
    team = rewards[:, :, 0]  # one agent paid the team reward: R = r
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv, _, silent = ppo.group_advantages(rewards, team, torch.ones(8, 1), group, gamma=1.0, scale_by_std=True)
    high, low = 0.25 / (0.5 + 1e-4), -0.75 / (0.5 + 1e-4)
    close(adv[:, 0, 0], [high, low, high, high, 0.0, 0.0, 0.0, 0.0])
    assert silent == 0.5  # one of the two groups carries no signal
    adv, _, _ = ppo.group_advantages(rewards, team, torch.ones(8, 1), group, gamma=1.0, scale_by_std=False)
    close(adv[:, 0, 0], [0.25, -0.75, 0.25, 0.25, 0.0, 0.0, 0.0, 0.0])


def test_a_batch_baseline_compares_every_return_with_the_whole_iteration():
    # The table above with --group_baseline batch: the 8 returns 1, 0, 1, 1, 0.5 ×4 form one group,
    # mean 5 / 8 = 0.625; Σ(G − mean)² = 3·0.375² + 0.625² + 4·0.125² = 0.875, sample std √(0.875 / 7) = √0.125.
    # Problem B's episodes, silent within their own group, now get (0.5 − 0.625) / std each.
    rewards = t([[[1.0]], [[0.0]], [[1.0]], [[1.0]], [[0.5]], [[0.5]], [[0.5]], [[0.5]]])  # [B=8, T=1, N=1]
    assert ppo.baseline_groups(8, 4, "group").tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert ppo.baseline_groups(8, 4, "batch").tolist() == [0] * 8
    assert ppo.baseline_groups(3, 1, "batch").tolist() == [0, 0, 0]  # G = 1: still one group of 3
    adv, _, silent = ppo.group_advantages(rewards, rewards[:, :, 0], torch.ones(8, 1), ppo.baseline_groups(8, 4, "batch"),
                                       gamma=1.0, scale_by_std=True)
    std = 0.125 ** 0.5 + 1e-4
    close(adv[:, 0, 0], [0.375 / std, -0.625 / std, 0.375 / std, 0.375 / std] + [-0.125 / std] * 4)
    assert silent == 0.0


def test_group_advantages_compare_each_agents_return_among_the_episodes_that_played_the_step():
    # One problem, G = 2, H = 2, two agents, the first agent paid half the team reward, γ = 0.5.
    # Episode 0 is right at step 0 and ends; episode 1 is wrong at step 0, right at step 1.
    team = t([[1.0, 0.0], [0.0, 1.0]])
    rewards = t([[[0.5, 1.0], [0.0, 0.0]], [[0.0, 0.0], [0.5, 1.0]]])  # [2, 2, 2]: ep 0 t0 [.5, 1], ep 1 t1 [.5, 1]
    step_mask = t([[1.0, 0.0], [1.0, 1.0]])
    adv, _, silent = ppo.group_advantages(rewards, team, step_mask, torch.tensor([0, 0]), gamma=0.5, scale_by_std=False)
    # Returns from step 0, own reward then the team's later rewards: episode 0 [0.5, 1] + 0.5 · 0 = [0.5, 1],
    # episode 1 [0, 0] + 0.5 · R_1 = [0.5, 0.5]; mean [0.5, 0.75]. The first agent of episode 1 is judged
    # by the team's reward that followed (0.5 · 1), not by its own discounted share of it (0.5 · 0.5).
    close(adv[:, 0], [[0.0, 0.25], [0.0, -0.25]])
    # Step 1 was played by episode 1 alone: no baseline, Â = 0; episode 0 has no action there.
    close(adv[:, 1], [[0.0, 0.0], [0.0, 0.0]])
    assert silent == 0.75  # only the second agent's step-0 cell carries signal; the lone step-1 cells do not
    # With the std: step 0's sample std is 0 for the first agent (Â = 0 / (0 + 1e-4) = 0), √(2 · 0.25²) for the second.
    adv, _, _ = ppo.group_advantages(rewards, team, step_mask, torch.tensor([0, 0]), gamma=0.5, scale_by_std=True)
    close(adv[:, 0], [[0.0, 0.25 / (0.25 * 2 ** 0.5 + 1e-4)], [0.0, -0.25 / (0.25 * 2 ** 0.5 + 1e-4)]])


# One step, N = 2, team reward 2, V = [0.5, 1.0], done; γ_a = 0.8, λ = 0.5.
@pytest.mark.parametrize(
    "credit, expected",
    [
        # last: r = [0, 2]. δ(σ2) = 2 − 1 = 1; δ(σ1) = 0 + 0.8·1 − 0.5 = 0.3; Â(σ1) = 0.3 + 0.4·1 = 0.7
        ("last", [0.7, 1.0]),
        # equal: r = [1, 1]. δ(σ2) = 1 − 1 = 0; δ(σ1) = 1 + 0.8 − 0.5 = 1.3; Â(σ1) = 1.3 + 0.4·0 = 1.3
        ("equal", [1.3, 0.0]),
        # shared: r = [2, 2]. δ(σ2) = 2 − 1 = 1; δ(σ1) = 2 + 0.8 − 0.5 = 2.3; Â(σ1) = 2.3 + 0.4·1 = 2.7
        ("shared", [2.7, 1.0]),
    ],
)
def test_credit_option_through_gae(credit, expected):
    rewards = ppo.place_team_reward(t([[2.0]]), every(t([[2.0]]), 2), credit)
    adv, _ = ppo.action_level_gae(rewards, t([[[0.5, 1.0]]]), t([[1.0]]), GAMMA, GAMMA_AGENT, LAM)
    close(adv, [[expected]])


# ---------------------------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------------------------

def test_one_agent_one_step_gamma_lambda_one_gives_r_minus_v():
    adv, ret = ppo.action_level_gae(t([[[3.0]]]), t([[[1.25]]]), t([[1.0]]), 1.0, 1.0, 1.0)
    close(adv, [[[1.75]]])  # R − V = 3 − 1.25
    close(ret, [[[3.0]]])


def test_gamma_lambda_one_is_monte_carlo_return_minus_value():
    # N = 1, T = 3, done at the end: Â_t = Σ_{s≥t} r_s − V_t
    adv, _ = ppo.action_level_gae(t([[[1.0], [2.0], [3.0]]]), t([[[0.5], [1.0], [1.5]]]), t([[0.0, 0.0, 1.0]]),
                                  1.0, 1.0, 1.0)
    close(adv, [[[6 - 0.5], [5 - 1.0], [3 - 1.5]]])


def test_lambda_zero_gives_one_step_td_errors():
    adv, ret = ppo.action_level_gae(t(R_TABLE), t(V_TABLE), t([[0.0, 0.0]]), GAMMA, GAMMA_AGENT, 0.0, t(LAST_V))
    # the δ's of the no-done table: [1.3, 2.8, −3.4, 7.1]
    close(adv, [[[1.3, 2.8], [-3.4, 7.1]]])
    # R = δ + V = r + γ_next·V_next: 1 + 0.8·1, 2 + 0.9·2, −1 + 0.8·(−0.5), 3 + 0.9·4
    close(ret, [[[1.8, 3.8], [-1.4, 6.6]]])


# ---------------------------------------------------------------------------------------------
# Clipped surrogate
# ---------------------------------------------------------------------------------------------

EPS = 0.2
# ratios ρ and advantages Â; the last sample is masked out (mask 0).
RATIOS = [1.1, 1.5, 1.5, 0.5, 0.5, 3.0]
ADVS = [2.0, 1.0, -1.0, -2.0, 3.0, 100.0]
MASK = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
OLD_LP = [-1.0, -2.0, -0.5, -3.0, -1.5, -1.0]


def _new_logprob():
    return t([o + math.log(r) for o, r in zip(OLD_LP, RATIOS)]).requires_grad_(True)


def test_clipped_surrogate_loss_value_and_stats():
    new = _new_logprob()
    loss, stats = ppo.clipped_surrogate_loss(new, t(OLD_LP), t(ADVS), t(MASK), EPS)
    # per sample min(ρÂ, clip(ρ, 0.8, 1.2)Â):
    #   ρ=1.1, Â= 2: min(2.2, 2.2)   = 2.2    inside the range
    #   ρ=1.5, Â= 1: min(1.5, 1.2)   = 1.2    clipped (the bound that matters for Â > 0)
    #   ρ=1.5, Â=−1: min(−1.5, −1.2) = −1.5   outside, but the unclipped term is the min
    #   ρ=0.5, Â=−2: min(−1.0, −1.6) = −1.6   clipped (the bound that matters for Â < 0)
    #   ρ=0.5, Â= 3: min(1.5, 2.4)   = 1.5    outside, unclipped term is the min
    # mean over the 5 real samples = (2.2 + 1.2 − 1.5 − 1.6 + 1.5) / 5 = 0.36; loss = −0.36
    assert loss.item() == pytest.approx(-0.36, abs=1e-9)
    # |ρ − 1| > 0.2 for 4 of the 5 real samples
    assert stats["clip_fraction"] == pytest.approx(0.8)
    # k3 = (ρ − 1) − ln ρ: 0.1 − ln 1.1, 2·(0.5 − ln 1.5), 2·(−0.5 + ln 2); mean over 5
    k3 = ((0.1 - math.log(1.1)) + 2 * (0.5 - math.log(1.5)) + 2 * (-0.5 + math.log(2.0))) / 5
    assert stats["approx_kl"] == pytest.approx(k3, abs=1e-9)
    assert stats["approx_kl"] == pytest.approx(0.1160108, abs=1e-6)


def test_clipped_surrogate_gradient():
    new = _new_logprob()
    loss, _ = ppo.clipped_surrogate_loss(new, t(OLD_LP), t(ADVS), t(MASK), EPS)
    loss.backward()
    # ∂(−ρÂ/n)/∂ log π_new = −ρÂ/n for the unclipped branch; 0 where the clipped (constant) branch is
    # the min; 0 for the masked sample. n = 5.
    #   ρ=1.1, Â=2 : −1.1·2/5   = −0.44
    #   clipped    : 0
    #   ρ=1.5, Â=−1: −1.5·(−1)/5 = 0.3
    #   clipped    : 0
    #   ρ=0.5, Â=3 : −0.5·3/5    = −0.3
    #   masked     : 0
    close(new.grad, [-0.44, 0.0, 0.3, 0.0, -0.3, 0.0])
    assert new.grad[1].item() == 0.0 and new.grad[3].item() == 0.0, "clipped sample must have exactly 0 gradient"


def test_learning_rate_schedules_on_a_hand_table():
    # η = 0.1, T = 4 iterations, t = 0..4 (t = T only as the limit):
    #   linear: η(1 − t/4)            = 0.1, 0.075, 0.05, 0.025, 0
    #   cosine: η(1 + cos(πt/4))/2    = 0.1, 0.1·(1 + 0.70711)/2 = 0.085355, 0.05, 0.014645, 0
    rates = lambda schedule: [ppo.scheduled_lr(0.1, t, 4, schedule) for t in range(5)]
    close(t(rates("constant")), [0.1] * 5)
    close(t(rates("linear")), [0.1, 0.075, 0.05, 0.025, 0.0])
    close(t(rates("cosine")), [0.1, 0.0853553, 0.05, 0.0146447, 0.0])
    with pytest.raises(ValueError, match="choose one of constant, linear, cosine"):
        ppo.scheduled_lr(0.1, 0, 4, "step")
    # With a floor ρ = 0.2 the same decays end at 0.02 and stay there past T (t = 0..6):
    #   linear: η(0.2 + 0.8(1 − t/4))             = 0.1, 0.08, 0.06, 0.04, 0.02, 0.02, 0.02
    #   cosine: η(0.2 + 0.8(1 + cos(πt/4))/2)     = 0.1, 0.1·(0.2 + 0.8·0.853553) = 0.0882843, 0.06,
    #                                               0.1·(0.2 + 0.8·0.146447) = 0.0317157, 0.02, 0.02, 0.02
    floored = lambda schedule: [ppo.scheduled_lr(0.1, t, 4, schedule, 0.2) for t in range(7)]
    close(t(floored("constant")), [0.1] * 7)
    close(t(floored("linear")), [0.1, 0.08, 0.06, 0.04, 0.02, 0.02, 0.02])
    close(t(floored("cosine")), [0.1, 0.0882843, 0.06, 0.0317157, 0.02, 0.02, 0.02])


def test_clipped_surrogate_with_happo_weight():
    M = t([2.0, 0.5, 1.0, 3.0, 1.0, 7.0]).requires_grad_(True)
    new = _new_logprob()
    loss, _ = ppo.clipped_surrogate_loss(new, t(OLD_LP), t(ADVS), t(MASK), EPS, happo_weight=M)
    # M·Â = [4, 0.5, −1, −6, 3, (700 masked)]
    #   ρ=1.1: min(4.4, 4.4)          = 4.4
    #   ρ=1.5: min(0.75, 1.2·0.5=0.6) = 0.6
    #   ρ=1.5: min(−1.5, −1.2)        = −1.5
    #   ρ=0.5: min(−3.0, 0.8·(−6)=−4.8) = −4.8
    #   ρ=0.5: min(1.5, 2.4)          = 1.5
    # mean = (4.4 + 0.6 − 1.5 − 4.8 + 1.5)/5 = 0.2/5 = 0.04
    assert loss.item() == pytest.approx(-0.04, abs=1e-9)
    loss.backward()
    # gradient −ρ·M·Â/n on unclipped branches: −1.1·4/5 = −0.88, −1.5·(−1)/5 = 0.3, −0.5·3/5 = −0.3
    close(new.grad, [-0.88, 0.0, 0.3, 0.0, -0.3, 0.0])
    assert M.grad is None or torch.all(M.grad == 0), "M must be detached: no gradient flows into it"


def test_clipped_surrogate_masked_entries_contribute_nothing():
    # Changing the masked sample's ratio and advantage leaves loss and stats unchanged.
    base, s1 = ppo.clipped_surrogate_loss(_new_logprob(), t(OLD_LP), t(ADVS), t(MASK), EPS)
    new2 = _new_logprob().detach().clone()
    new2[-1] = OLD_LP[-1] + math.log(0.01)
    adv2 = t(ADVS[:-1] + [-1e4])
    other, s2 = ppo.clipped_surrogate_loss(new2, t(OLD_LP), adv2, t(MASK), EPS)
    assert base.item() == pytest.approx(-0.36, abs=1e-9)
    assert other.item() == pytest.approx(base.item(), abs=1e-12)
    assert s2 == pytest.approx(s1)


# ---------------------------------------------------------------------------------------------
# Clipped value loss (½ E[max(...)] as documented in ppo.py)
# ---------------------------------------------------------------------------------------------

V_NEW = [1.0, 1.5, 1.5, -1.0, 0.0, 10.0]
V_OLD = [0.9, 1.0, 1.0, 0.0, 1.0, 0.0]
RET = [2.0, 2.0, 1.0, 0.5, -1.0, -10.0]
V_MASK = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]


def test_clipped_value_loss_clipped():
    new = t(V_NEW).requires_grad_(True)
    loss = ppo.clipped_value_loss(new, t(V_OLD), t(RET), t(V_MASK), 0.2)
    # V_clip = V_old + clip(V − V_old, ±0.2); per sample max((V−R)², (V_clip−R)²):
    #   V=1.0,V_old=0.9,R=2 : V_clip=1.0 : max(1.00, 1.00) = 1.00
    #   V=1.5,V_old=1.0,R=2 : V_clip=1.2 : max(0.25, 0.64) = 0.64   (clipped term wins)
    #   V=1.5,V_old=1.0,R=1 : V_clip=1.2 : max(0.25, 0.04) = 0.25
    #   V=−1, V_old=0,  R=.5: V_clip=−.2 : max(2.25, 0.49) = 2.25
    #   V=0,  V_old=1,  R=−1: V_clip=0.8 : max(1.00, 3.24) = 3.24   (clipped term wins)
    # ½ · (1 + 0.64 + 0.25 + 2.25 + 3.24) / 5 = ½ · 7.38 / 5 = 0.738
    assert loss.item() == pytest.approx(0.738, abs=1e-9)
    loss.backward()
    # ∂ ½(V−R)²/n = (V−R)/n where the unclipped term wins; 0 where the clipped (constant) term wins
    #   (1−2)/5 = −0.2, 0, (1.5−1)/5 = 0.1, (−1−0.5)/5 = −0.3, 0, masked 0
    close(new.grad, [-0.2, 0.0, 0.1, -0.3, 0.0, 0.0])


def test_clipped_value_loss_without_clipping():
    loss = ppo.clipped_value_loss(t(V_NEW), t(V_OLD), t(RET), t(V_MASK), None)
    # ½ · (1 + 0.25 + 0.25 + 2.25 + 1) / 5 = ½ · 4.75 / 5 = 0.475
    assert loss.item() == pytest.approx(0.475, abs=1e-9)


# ---------------------------------------------------------------------------------------------
# Advantage normalisation
# ---------------------------------------------------------------------------------------------

def test_normalize_advantages_uses_only_real_entries_and_keeps_exact_zeros():
    adv = t([[1.0, 0.0], [3.0, 99.0]])
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    out = ppo.normalize_advantages(adv, mask)
    # real entries 1, 0, 3: mean 4/3; deviations −1/3, −4/3, 5/3; var = (1 + 16 + 25)/9/3 = 14/9;
    # std = √14/3, so (Â − mean)/std = −1/√14, −4/√14, 5/√14
    s = math.sqrt(14.0)
    close(out, [[-1 / s, -4 / s], [5 / s, 0.0]])
    # the exact-zero advantage is data: −4/√14 ≈ −1.069, not left at 0 as padding
    assert out[0, 1].item() == pytest.approx(-1.0690450, abs=1e-6), "an exact zero advantage must be normalised"
    assert out[1, 1].item() == 0.0, "a masked entry must come out 0"


def test_normalize_advantages_ignores_masked_value():
    a = ppo.normalize_advantages(t([1.0, 0.0, 3.0, 99.0]), t([1.0, 1.0, 1.0, 0.0]))
    b = ppo.normalize_advantages(t([1.0, 0.0, 3.0, -5e3]), t([1.0, 1.0, 1.0, 0.0]))
    torch.testing.assert_close(a, b)


# ---------------------------------------------------------------------------------------------
# HAPPO weight M
# ---------------------------------------------------------------------------------------------

def test_update_happo_weight_multiplies_only_where_mask_is_one():
    M = t([[1.0, 2.0, 0.5, 3.0]])
    old = t([[-1.0, -1.0, -2.0, -0.5]])
    ratios = [2.0, 0.5, 4.0, 0.25]
    new = (old + t([[math.log(r) for r in ratios]])).requires_grad_(True)
    mask = t([[1.0, 0.0, 1.0, 1.0]])
    out = ppo.update_happo_weight(M, new - old, mask)
    # M·ρ where mask = 1: 1·2, (2 kept), 0.5·4, 3·0.25
    close(out, [[2.0, 2.0, 2.0, 0.75]])
    assert not out.requires_grad, "the new M must be detached"
    # ratio_clip = 1.5 bounds ρ to [1/1.5, 1.5] = [2/3, 1.5]:
    # 1·1.5, (2 kept), 0.5·1.5, 3·(2/3)
    out = ppo.update_happo_weight(M, new - old, mask, ratio_clip=1.5)
    close(out, [[1.5, 2.0, 0.75, 2.0]])


def test_two_agent_sequential_update_worked_example():
    # Agent 1 (updated first, M = 1) changes its log-probs so ρ¹ = [1.25, 0.8].
    old1 = t([[-1.0, -2.0]])
    new1 = old1 + t([[math.log(1.25), math.log(0.8)]])
    M = ppo.update_happo_weight(torch.ones(1, 2, dtype=torch.float64), new1 - old1, torch.ones(1, 2))
    close(M, [[1.25, 0.8]])
    # Agent 2: ρ² = [1.1, 1.3], Â = [2, −1], ε = 0.2; it optimises M·Â = [2.5, −0.8]:
    #   min(1.1·2.5, 1.1·2.5) = 2.75;  min(1.3·(−0.8), 1.2·(−0.8)) = min(−1.04, −0.96) = −1.04
    #   loss = −(2.75 − 1.04)/2 = −0.855
    old2 = t([[-0.7, -1.2]])
    new2 = old2 + t([[math.log(1.1), math.log(1.3)]])
    loss, _ = ppo.clipped_surrogate_loss(new2, old2, t([[2.0, -1.0]]), torch.ones(1, 2), EPS, happo_weight=M)
    assert loss.item() == pytest.approx(-0.855, abs=1e-9)
    # without M it would be −(2.2 + min(−1.3, −1.2))/2 = −(2.2 − 1.3)/2 = −0.45
    plain, _ = ppo.clipped_surrogate_loss(new2, old2, t([[2.0, -1.0]]), torch.ones(1, 2), EPS)
    assert plain.item() == pytest.approx(-0.45, abs=1e-9)


# ---------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------

SIGMA = ("planner", "solver", "verifier")


def test_agent_update_order_random():
    orders = []
    for seed in range(20):
        order = ppo.agent_update_order(SIGMA, torch.Generator().manual_seed(seed))
        assert sorted(order) == sorted(SIGMA) and len(order) == 3
        again = ppo.agent_update_order(SIGMA, torch.Generator().manual_seed(seed))
        assert order == again, "same generator seed must give the same order"
        orders.append(tuple(order))
    assert len(set(orders)) > 1, "the permutation must not always be the same"


# ---------------------------------------------------------------------------------------------
# Diagnostics
# ---------------------------------------------------------------------------------------------

def test_explained_variance_hand_case():
    # real entries V = [1, 2, 3], R = [1, 2, 4]; a masked 4th entry is ignored
    # Var R: mean 7/3, squares 16/9 + 1/9 + 25/9 = 42/9, /3 = 14/9
    # R − V = [0, 0, 1]: mean 1/3, squares 1/9 + 1/9 + 4/9 = 6/9, /3 = 2/9
    # EV = 1 − (2/9)/(14/9) = 1 − 1/7 = 6/7
    ev = ppo.explained_variance(t([1.0, 2.0, 3.0, 0.0]), t([1.0, 2.0, 4.0, 100.0]), t([1.0, 1.0, 1.0, 0.0]))
    assert ev == pytest.approx(6 / 7, abs=1e-9)
    # perfect critic → 1
    assert ppo.explained_variance(t([1.0, 5.0]), t([1.0, 5.0]), t([1.0, 1.0])) == pytest.approx(1.0)
    # constant returns → undefined
    assert math.isnan(ppo.explained_variance(t([1.0, 5.0]), t([2.0, 2.0]), t([1.0, 1.0])))





def test_approx_kl_direction():
    # ρ = π_new/π_old = 2: (2 − 1) − ln 2 ≈ 0.3068528 (the reversed ratio ½ gives −½ + ln 2 ≈ 0.1931)
    kl = ppo.approx_kl(t([math.log(2.0)]), t([0.0]), t([1.0]))
    assert kl.item() == pytest.approx(1 - math.log(2.0), abs=1e-9)


def test_a_group_of_returns_equal_within_rounding_carries_no_signal_and_every_member_gets_exactly_zero():
    # 0.85 reached two ways (1 − 0.15 summed in another order) differs in its last float32 bit: exact
    # equality would see signal, and (G − mean) / (std + ε) would hand every member ~6e-4.
    g = torch.tensor([0.85, 0.85, 0.85, 0.85], dtype=torch.float64)
    g[1] = torch.nextafter(g[1], torch.tensor(1.0))
    rewards, group = g.view(4, 1, 1), torch.tensor([0, 0, 0, 0])
    adv, signal, silent = ppo.group_advantages(rewards, rewards[:, :, 0], torch.ones(4, 1), group, 1.0, True)
    assert silent == 1.0 and not signal.any() and torch.equal(adv, torch.zeros(4, 1, 1))
    # A real difference (a wrong answer, 0.0 against 0.85) is signal for every member of the group.
    rewards[0] = 0.0
    adv, signal, silent = ppo.group_advantages(rewards, rewards[:, :, 0], torch.ones(4, 1), group, 1.0, False)
    assert silent == 0.0 and signal.all()
    close(adv[:, 0, 0], [-0.6375, 0.2125, 0.2125, 0.2125])  # mean 0.6375


def test_rollout_correction_weights_truncate_or_mask_the_ratio_of_the_old_policy_to_the_sampler():
    # log π_old − log μ = [log 0.5, 0, log 1.5, log 3] → π_old / μ = [0.5, 1, 1.5, 3]; C = 2.
    old = t([[math.log(0.5), -1.0, math.log(1.5) - 2.0, math.log(3.0) - 0.5]])
    mu = t([[0.0, -1.0, -2.0, -0.5]])
    close(ppo.rollout_correction_weights(old, mu, "tis", 2.0), [[0.5, 1.0, 1.5, 2.0]])
    close(ppo.rollout_correction_weights(old, mu, "mis", 2.0), [[1.0, 1.0, 1.0, 0.0]])
    close(ppo.rollout_correction_weights(old, mu, "none", 2.0), [[1.0, 1.0, 1.0, 1.0]])
    # The weight multiplies each decision's surrogate term: Â = 1, ρ = 1, M = 1 → L = −mean(w).
    loss, _ = ppo.clipped_surrogate_loss(torch.zeros(1, 4), torch.zeros(1, 4), torch.ones(1, 4), torch.ones(1, 4), 0.2,
                                         ppo.rollout_correction_weights(old, mu, "tis", 2.0))
    assert loss.item() == pytest.approx(-(0.5 + 1.0 + 1.5 + 2.0) / 4)


def test_sampler_mismatch_measures_each_token_with_no_cancelling_of_signs():
    # Two tokens of one action: Δ = log π_old − log μ = +0.2 and −0.2. The old signed gap summed them to 0.
    old_tokens, mu_tokens, tokens = torch.tensor([[-1.0, -2.2]]), torch.tensor([[-1.2, -2.0]]), torch.ones(1, 2)
    # The action under the mean normalisation: log π_old(a) = −1.6 = log μ(a): π_old / μ = 1, within C = 2.
    stats = ppo.sampler_mismatch(old_tokens, mu_tokens, tokens, torch.tensor([[-1.6]]), torch.tensor([[-1.6]]),
                                 torch.ones(1, 1), 2.0)
    assert stats["rollout/logprob_abs_diff"] == pytest.approx(0.2)
    assert stats["rollout/max_abs_diff"] == pytest.approx(0.2)
    # k3 of KL(μ ‖ π_old): mean of (e^Δ − 1) − Δ over the two tokens.
    k3 = ((math.exp(0.2) - 1 - 0.2) + (math.exp(-0.2) - 1 + 0.2)) / 2
    assert stats["rollout/kl_sampler_old"] == pytest.approx(k3)
    assert stats["rollout/beyond_cap"] == 0.0
    # A padded token (mask 0) counts nowhere; a decision with π_old / μ = e > 2 is beyond the cap.
    stats = ppo.sampler_mismatch(torch.tensor([[-1.0, 9.0]]), torch.tensor([[-1.5, 0.0]]), torch.tensor([[1.0, 0.0]]),
                                 torch.tensor([[0.0], [0.0]]), torch.tensor([[-1.0], [0.0]]), torch.ones(2, 1), 2.0)
    assert (stats["rollout/logprob_abs_diff"], stats["rollout/max_abs_diff"], stats["rollout/beyond_cap"]) == (0.5, 0.5, 0.5)


def test_stale_share_is_zero_for_a_fresh_sampler_and_one_for_a_sampler_still_serving_the_previous_adapter():
    # Two samples of two tokens. The update undone, u per token: U = Σ_k u = [0.1, −0.3], Σ U² = 0.1.
    new = t([[-1.0, -2.0], [-0.5, -3.0]])
    previous = new + t([[0.3, -0.2], [0.1, -0.4]])
    rounding = t([[0.01, 0.01], [-0.01, -0.01]])  # X of a current sampler: [0.02, −0.02]
    mask = torch.ones(2, 2)
    # Current: β = (0.1 · 0.02 + 0.3 · 0.02) / 0.1 = 0.08; residuals [0.012, 0.004]: SE = √(0.00016 / 1 / 0.1) = 0.04.
    beta, error = ppo.stale_share(new + rounding, new, previous, mask)
    assert beta == pytest.approx(0.08) and error == pytest.approx(0.04)
    # Stale: X = U + rounding = [0.12, −0.32]: β = (0.012 + 0.096) / 0.1 = 1.08, the same residuals.
    beta, error = ppo.stale_share(previous + rounding, new, previous, mask)
    assert beta == pytest.approx(1.08) and error == pytest.approx(0.04)
    # A padded token counts nowhere; nothing moved, or one sample, tells nothing.
    assert ppo.stale_share(new + rounding, new, previous, t([[1.0, 0.0], [1.0, 0.0]]))[0] == pytest.approx(
        (0.3 * 0.01 + 0.1 * -0.01) / (0.09 + 0.01))
    assert ppo.stale_share(new, new, new, mask) == (0.0, math.inf)
    assert ppo.stale_share(new[:1], new[:1], previous[:1], mask[:1]) == (0.0, math.inf)
