"""Token-level MARFT: `ppo.token_level_gae`, the per-token PPO losses, `critic.token_values` and
`agents.token_logprobs` (token-level MARFT; the equations are in ppo.py's docstring).

Every expected number is worked out by hand from the equations (derivations in the comments),
never by calling the code under test or re-running its loop.

The token chain of one episode runs over the real tokens in (step t, agent σ_n, token k) order:

    inside an action       r = 0,      d = γ_token,          V_next = V(next token of the action)
    at an action's end     r = r^i_t,  d = γ_agent           V_next = V(first token of σ_{n+1}, step t)
                                       d = γ · (1 − done_t)  V_next = V(first token of σ_1, step t+1)
    after the episode's last token                           V_next = 0

    δ_k = r_k + d_k · V_next − V_k,    Â_k = δ_k + d_k · λ · Â_{k+1},    R_k = Â_k + V_k

Padding (mask 0) gets exactly 0 advantage and 0 return.
"""
import math
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

import agents
import critic
import ppo

TOL = dict(atol=1e-9, rtol=0)
PAD_V = 100.0  # a conspicuous value at padding positions: it must never enter the chain


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def close(actual, expected, msg):
    torch.testing.assert_close(actual, t(expected), **TOL, msg=lambda m: f"{msg}\n{m}\nactual={actual.tolist()}")


def grid_from_lengths(lengths, values, L):
    """[T][N] lengths and [T][N][K] values → ([T, N, L] values with PAD_V at padding, [T, N, L] mask)."""
    v = [[row + [PAD_V] * (L - len(row)) for row in step] for step in values]
    m = [[[1.0] * n + [0.0] * (L - n) for n in step] for step in lengths]
    return v, m


# ---------------------------------------------------------------------------------------------
# 1. Hand-worked table: B = 1, N = 2 agents, T = 2 steps, response lengths (t0: 2, 1), (t1: 3, 2)
# ---------------------------------------------------------------------------------------------

GAMMA, GAMMA_AGENT, LAM = 0.9, 0.8, 0.5
LENGTHS = [[2, 1], [3, 2]]
REWARDS = [[1.0, 2.5], [-1.0, 3.0]]  # r^i_t, paid at the last token of agent i's action at step t
VALUES = [[[0.5, 1.0], [2.0]],  # t0: σ1 (2 tokens), σ2 (1 token)
          [[1.0, -1.0, 0.5], [1.5, 1.0]]]  # t1: σ1 (3 tokens), σ2 (2 tokens)
L = 3
V_GRID, MASK_GRID = grid_from_lengths(LENGTHS, VALUES, L)
DONE_AT_0 = [[1.0, 0.0]]

# The chain k = 0..7 (position (t, n, k), V, r at the end of an action, hop d, V_next):
#   k0 (0,σ1,0) V= 0.5  r=0     d=γ_tok            V_next= 1.0
#   k1 (0,σ1,1) V= 1.0  r=1     d=γ_a   = 0.8      V_next= 2.0  (σ2's first token, same step)
#   k2 (0,σ2,0) V= 2.0  r=2.5   d=γ(1−done_0) = 0  V_next= 1.0  (step 1's σ1, hop cut by done_0)
#   k3 (1,σ1,0) V= 1.0  r=0     d=γ_tok            V_next=−1.0
#   k4 (1,σ1,1) V=−1.0  r=0     d=γ_tok            V_next= 0.5
#   k5 (1,σ1,2) V= 0.5  r=−1    d=γ_a   = 0.8      V_next= 1.5
#   k6 (1,σ2,0) V= 1.5  r=0     d=γ_tok            V_next= 1.0
#   k7 (1,σ2,1) V= 1.0  r=3     d=γ(1−done_1)=0.9  V_next= 0    (end of the episode)


def test_token_gae_table_with_done_in_the_middle_and_gamma_token_0_9():
    adv, ret = ppo.token_level_gae(t([REWARDS]), t([V_GRID]), t([MASK_GRID]), t(DONE_AT_0),
                                   GAMMA, GAMMA_AGENT, 0.9, LAM)
    # δ7 = 3 + 0.9·0 − 1.0          =  2.0
    # δ6 = 0 + 0.9·1.0 − 1.5        = −0.6
    # δ5 = −1 + 0.8·1.5 − 0.5       = −0.3
    # δ4 = 0 + 0.9·0.5 − (−1.0)     =  1.45
    # δ3 = 0 + 0.9·(−1.0) − 1.0     = −1.9
    # δ2 = 2.5 + 0·1.0 − 2.0        =  0.5   (hop to step 1 cut by done_0)
    # δ1 = 1 + 0.8·2.0 − 1.0        =  1.6   (hop σ1 → σ2 inside step 0: not cut)
    # δ0 = 0 + 0.9·1.0 − 0.5        =  0.4
    # Â7 = 2.0
    # Â6 = −0.6 + 0.9·0.5·2.0       = −0.6 + 0.9      =  0.3
    # Â5 = −0.3 + 0.8·0.5·0.3       = −0.3 + 0.12     = −0.18
    # Â4 = 1.45 + 0.45·(−0.18)      = 1.45 − 0.081    =  1.369
    # Â3 = −1.9 + 0.45·1.369        = −1.9 + 0.61605  = −1.28395
    # Â2 = 0.5 + 0·λ·Â3             =  0.5
    # Â1 = 1.6 + 0.8·0.5·0.5        = 1.6 + 0.2       =  1.8
    # Â0 = 0.4 + 0.45·1.8           = 0.4 + 0.81      =  1.21
    close(adv, [[[[1.21, 1.8, 0.0], [0.5, 0.0, 0.0]],
                 [[-1.28395, 1.369, -0.18], [0.3, 2.0, 0.0]]]], "advantages, γ_token = 0.9, done_0 = 1")
    # R = Â + V: 1.21+0.5, 1.8+1, 0.5+2 | −1.28395+1, 1.369−1, −0.18+0.5 | 0.3+1.5, 2+1
    close(ret, [[[[1.71, 2.8, 0.0], [2.5, 0.0, 0.0]],
                 [[-0.28395, 0.369, 0.32], [1.8, 3.0, 0.0]]]], "returns, γ_token = 0.9, done_0 = 1")


def test_token_gae_table_with_done_in_the_middle_and_gamma_token_1():
    adv, ret = ppo.token_level_gae(t([REWARDS]), t([V_GRID]), t([MASK_GRID]), t(DONE_AT_0),
                                   GAMMA, GAMMA_AGENT, 1.0, LAM)
    # Only hops inside an action change (k0, k3, k4, k6: d = 1):
    # δ7 = 2.0;  δ6 = 1.0 − 1.5 = −0.5;  δ5 = −0.3;  δ4 = 0.5 + 1.0 = 1.5;  δ3 = −1.0 − 1.0 = −2.0
    # δ2 = 0.5;  δ1 = 1.6;  δ0 = 1.0 − 0.5 = 0.5
    # Â7 = 2.0
    # Â6 = −0.5 + 1·0.5·2.0   =  0.5
    # Â5 = −0.3 + 0.4·0.5     = −0.1
    # Â4 = 1.5 + 0.5·(−0.1)   =  1.45
    # Â3 = −2.0 + 0.5·1.45    = −1.275
    # Â2 = 0.5 (cut);  Â1 = 1.6 + 0.4·0.5 = 1.8;  Â0 = 0.5 + 0.5·1.8 = 1.4
    close(adv, [[[[1.4, 1.8, 0.0], [0.5, 0.0, 0.0]],
                 [[-1.275, 1.45, -0.1], [0.5, 2.0, 0.0]]]], "advantages, γ_token = 1, done_0 = 1")
    # R = Â + V: 1.9, 2.8, 2.5 | −0.275, 0.45, 0.4 | 2.0, 3.0
    close(ret, [[[[1.9, 2.8, 0.0], [2.5, 0.0, 0.0]],
                 [[-0.275, 0.45, 0.4], [2.0, 3.0, 0.0]]]], "returns, γ_token = 1, done_0 = 1")


def test_token_gae_table_in_float32_as_the_trainer_calls_it():
    # The trainer's tables are float32 (and the mask a float tensor): same hand table, float32 tolerance.
    f32 = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    adv, ret = ppo.token_level_gae(f32([REWARDS]), f32([V_GRID]), f32([MASK_GRID]), f32(DONE_AT_0),
                                   GAMMA, GAMMA_AGENT, 0.9, LAM)
    assert adv.dtype == ret.dtype == torch.float32
    expected = t([[[[1.21, 1.8, 0.0], [0.5, 0.0, 0.0]], [[-1.28395, 1.369, -0.18], [0.3, 2.0, 0.0]]]])
    torch.testing.assert_close(adv.double(), expected, atol=1e-5, rtol=0)


def test_token_gae_table_without_done_links_the_steps():
    adv, ret = ppo.token_level_gae(t([REWARDS]), t([V_GRID]), t([MASK_GRID]), t([[0.0, 0.0]]),
                                   GAMMA, GAMMA_AGENT, 0.9, LAM)
    # Step 1 is as in the γ_token = 0.9 table: Â3 = −1.28395, …
    # k2 now hops to step 1 with d = γ = 0.9, V_next = V(1,σ1,0) = 1.0:
    # δ2 = 2.5 + 0.9·1.0 − 2.0 = 1.4
    # Â2 = 1.4 + 0.9·0.5·(−1.28395) = 1.4 − 0.5777775        = 0.8222225
    # Â1 = 1.6 + 0.4·0.8222225      = 1.6 + 0.328889         = 1.928889
    # Â0 = 0.4 + 0.45·1.928889      = 0.4 + 0.86800005       = 1.26800005
    close(adv, [[[[1.26800005, 1.928889, 0.0], [0.8222225, 0.0, 0.0]],
                 [[-1.28395, 1.369, -0.18], [0.3, 2.0, 0.0]]]], "advantages, no done")
    close(ret, [[[[1.76800005, 2.928889, 0.0], [2.8222225, 0.0, 0.0]],
                 [[-0.28395, 0.369, 0.32], [1.8, 3.0, 0.0]]]], "returns, no done")


def test_token_gae_lambda_0_gives_the_one_step_td_errors_of_the_table():
    adv, ret = ppo.token_level_gae(t([REWARDS]), t([V_GRID]), t([MASK_GRID]), t(DONE_AT_0),
                                   GAMMA, GAMMA_AGENT, 0.9, 0.0)
    # λ = 0: Â_k = δ_k, the TD errors listed in the γ_token = 0.9 table.
    close(adv, [[[[0.4, 1.6, 0.0], [0.5, 0.0, 0.0]],
                 [[-1.9, 1.45, -0.3], [-0.6, 2.0, 0.0]]]], "λ = 0 advantages must be the TD errors")
    # R = δ + V = r + d·V_next: 0.9, 2.6, 2.5 | −0.9, 0.45, 0.2 | 0.9, 3.0
    close(ret, [[[[0.9, 2.6, 0.0], [2.5, 0.0, 0.0]],
                 [[-0.9, 0.45, 0.2], [0.9, 3.0, 0.0]]]], "λ = 0 returns must be the one-step targets")


# ---------------------------------------------------------------------------------------------
# 2. Reductions: one agent, one step
# ---------------------------------------------------------------------------------------------

ONE_V = [0.3, -1.2, 2.0, 0.7]  # 4 real tokens, then one padding position
ONE_R = 1.5


def one_agent_one_step(gamma_token, lam, done):
    values = t([[[ONE_V + [PAD_V]]]])  # [1, 1, 1, 5]
    mask = t([[[[1.0, 1.0, 1.0, 1.0, 0.0]]]])
    return ppo.token_level_gae(t([[[ONE_R]]]), values, mask, t([[done]]), 0.7, 0.6, gamma_token, lam)


@pytest.mark.parametrize("done", [0.0, 1.0])
def test_one_agent_one_step_gamma_lambda_1_gives_reward_minus_value(done):
    # γ_token = λ = 1: Â_k = Σ_{j≥k} δ_j telescopes to R − V_k (the only reward is R at the last
    # token, and after it V_next = 0 whatever γ and done).
    adv, ret = one_agent_one_step(1.0, 1.0, done)
    # R − V = 1.5 − [0.3, −1.2, 2.0, 0.7] = [1.2, 2.7, −0.5, 0.8]
    close(adv, [[[[1.2, 2.7, -0.5, 0.8, 0.0]]]], "γ = λ = 1 must give Â_k = R − V_k")
    close(ret, [[[[1.5, 1.5, 1.5, 1.5, 0.0]]]], "γ = λ = 1 must give the return R at every token")


def test_one_agent_one_step_lambda_0_gives_the_td_errors():
    adv, _ = one_agent_one_step(0.9, 0.0, 0.0)
    # δ0 = 0.9·(−1.2) − 0.3 = −1.38;  δ1 = 0.9·2.0 + 1.2 = 3.0;  δ2 = 0.9·0.7 − 2.0 = −1.37
    # δ3 = 1.5 + 0 − 0.7 = 0.8 (last token: reward, then the episode ends)
    close(adv, [[[[-1.38, 3.0, -1.37, 0.8, 0.0]]]], "λ = 0 must give the one-step TD errors")


def test_the_action_level_is_the_token_level_with_one_decision_per_action():
    # ppo.gae picks action_level_gae for L = 1. The token chain with one "token" per action must
    # give the same numbers on every joint action taken: episode 0 plays two steps, episode 1
    # ends at step 0 (its step 1 holds no action, mask 0, and a conspicuous value that must not enter).
    rewards = t([[[0.0, 1.0], [0.5, -1.0]], [[0.0, 2.0], [0.0, 0.0]]])  # [B, T, N]
    values = t([[[[0.3], [0.8]], [[-0.2], [0.6]]], [[[1.1], [0.4]], [[PAD_V], [PAD_V]]]])  # [B, T, N, 1]
    mask = t([[[[1.0], [1.0]], [[1.0], [1.0]]], [[[1.0], [1.0]], [[0.0], [0.0]]]])
    dones = t([[0.0, 1.0], [1.0, 0.0]])
    action_adv, action_ret = ppo.gae(rewards, values * mask, mask, dones, 0.9, 0.8, 0.7, 0.5)
    token_adv, token_ret = ppo.token_level_gae(rewards, values, mask, dones, 0.9, 0.8, 0.7, 0.5)
    taken = mask.bool()
    torch.testing.assert_close(action_adv[taken], token_adv[taken], **TOL)
    torch.testing.assert_close(action_ret[taken], token_ret[taken], **TOL)
    # One entry by hand: episode 1, step 0, σ_2 is its last decision (done): Â = R − V = 2.0 − 0.4.
    assert action_adv[1, 0, 1, 0].item() == pytest.approx(1.6)


# ---------------------------------------------------------------------------------------------
# 3. Padding and a batch of episodes of different lengths
# ---------------------------------------------------------------------------------------------

def test_batch_of_two_episodes_of_different_lengths_and_exact_zero_padding():
    # Episode 0: the γ_token = 0.9 table above. Episode 1 lasts one step (done_0 = 1; step 1 is
    # pure padding, with conspicuous rewards and values that must be ignored), lengths (1, 3).
    ep1_values = [[[4.0], [1.5, 2.0, -0.5]], [[], []]]
    v1, m1 = grid_from_lengths([[1, 3], [0, 0]], ep1_values, L)
    rewards = t([REWARDS, [[0.5, 1.0], [5.0, 5.0]]])
    values, mask = t([V_GRID, v1]), t([MASK_GRID, m1])
    adv, ret = ppo.token_level_gae(rewards, values, mask, t([[1.0, 0.0], [1.0, 1.0]]), GAMMA, GAMMA_AGENT, 0.9, LAM)
    # Episode 1 chain:
    #   k0 (0,σ1,0) V=4.0   r=0.5 d=γ_a=0.8       V_next=1.5 → δ0 = 0.5 + 1.2 − 4.0   = −2.3
    #   k1 (0,σ2,0) V=1.5   r=0   d=0.9           V_next=2.0 → δ1 = 1.8 − 1.5         =  0.3
    #   k2 (0,σ2,1) V=2.0   r=0   d=0.9           V_next=−.5 → δ2 = −0.45 − 2.0       = −2.45
    #   k3 (0,σ2,2) V=−0.5  r=1   d=γ(1−done_0)=0 V_next=0   → δ3 = 1 + 0.5           =  1.5
    # Â3 = 1.5
    # Â2 = −2.45 + 0.45·1.5      = −2.45 + 0.675   = −1.775
    # Â1 = 0.3 + 0.45·(−1.775)   = 0.3 − 0.79875   = −0.49875
    # Â0 = −2.3 + 0.4·(−0.49875) = −2.3 − 0.1995   = −2.4995
    # R = Â + V: 1.5005, 1.00125, 0.225, 1.0
    close(adv[0], [[[1.21, 1.8, 0.0], [0.5, 0.0, 0.0]], [[-1.28395, 1.369, -0.18], [0.3, 2.0, 0.0]]],
          "episode 0 of the batch must match its own hand table")
    close(adv[1], [[[-2.4995, 0.0, 0.0], [-0.49875, -1.775, 1.5]], [[0.0] * 3, [0.0] * 3]],
          "episode 1 (shorter) of the batch")
    close(ret[1], [[[1.5005, 0.0, 0.0], [1.00125, 0.225, 1.0]], [[0.0] * 3, [0.0] * 3]],
          "returns of episode 1 (shorter)")
    padding = mask == 0
    assert padding.sum() == 4 + 8
    assert torch.equal(adv[padding], torch.zeros(12, dtype=adv.dtype)), "padding must get exactly 0 advantage"
    assert torch.equal(ret[padding], torch.zeros(12, dtype=ret.dtype)), "padding must get exactly 0 return"


def test_token_gae_ignores_whatever_sits_at_padding():
    # Same episode with padding values 0 instead of PAD_V: identical results (bit for bit).
    values_zero_pad = t([V_GRID]) * t([MASK_GRID])
    first = ppo.token_level_gae(t([REWARDS]), t([V_GRID]), t([MASK_GRID]), t(DONE_AT_0), GAMMA, GAMMA_AGENT, 0.9, LAM)
    second = ppo.token_level_gae(t([REWARDS]), values_zero_pad, t([MASK_GRID]), t(DONE_AT_0), GAMMA, GAMMA_AGENT, 0.9, LAM)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


# ---------------------------------------------------------------------------------------------
# 4. Per-token losses with a mask
# ---------------------------------------------------------------------------------------------

def test_token_surrogate_loss_ignores_padding_and_gives_it_zero_gradient():
    eps = 0.2
    # [n = 2, L = 3]; real tokens (0,0), (0,1), (1,0). Padding holds wild values (ratio e^5, Â = 100).
    old = t([[-1.0, -2.0, -0.5], [-1.5, -3.0, -3.0]])
    log_ratio = t([[0.0, math.log(1.5), 5.0], [math.log(1.1), 5.0, -5.0]])
    new = (old + log_ratio).detach().requires_grad_(True)
    adv = t([[2.0, 1.0, 100.0], [-3.0, 100.0, -100.0]])
    mask = t([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, stats = ppo.clipped_surrogate_loss(new, old, adv, mask, eps)
    # (0,0): ρ = 1,   Â = 2:  min(2, 2)              = 2     (unclipped: ∂/∂new = ρÂ = 2)
    # (0,1): ρ = 1.5, Â = 1:  min(1.5, 1.2·1)         = 1.2   (clipped: constant, ∂ = 0)
    # (1,0): ρ = 1.1, Â = −3: min(−3.3, 1.1·(−3))     = −3.3  (inside the clip: ∂ = ρÂ = −3.3)
    # loss = −(2 + 1.2 − 3.3)/3 = 0.1/3
    assert loss.item() == pytest.approx(0.1 / 3, abs=1e-12)
    loss.backward()
    # ∂loss/∂new = −(ρÂ)/3 on the active unclipped entries: −2/3, 0, +3.3/3 = 1.1
    close(new.grad, [[-2.0 / 3, 0.0, 0.0], [1.1, 0.0, 0.0]], "surrogate gradient w.r.t. new token log-probs")
    assert torch.equal(new.grad[mask == 0], torch.zeros(3, dtype=new.grad.dtype)), "padding must get exactly 0 gradient"
    # clip fraction: only (0,1) has |ρ − 1| > ε among the 3 real tokens (padding ratios e^±5 are not counted)
    assert stats["clip_fraction"] == pytest.approx(1 / 3, abs=1e-12)
    # k3 KL: (ρ − 1) − log ρ = 0, 0.5 − log 1.5, 0.1 − log 1.1, averaged over the 3 real tokens
    assert stats["approx_kl"] == pytest.approx((0.5 - math.log(1.5) + 0.1 - math.log(1.1)) / 3, abs=1e-12)


@pytest.mark.parametrize("clip_eps", [0.2, None])
def test_token_value_loss_ignores_padding_and_gives_it_zero_gradient(clip_eps):
    # real tokens (0,0), (0,1), (1,0); padding holds wild values
    old = t([[0.5, 2.5, -50.0], [-0.5, -50.0, -50.0]])
    returns = t([[2.0, 1.0, 1000.0], [0.5, 1000.0, -1000.0]])
    new = t([[1.0, 3.0, 50.0], [-1.0, 50.0, 50.0]]).requires_grad_(True)
    mask = t([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss = ppo.clipped_value_loss(new, old, returns, mask, clip_eps)
    loss.backward()
    if clip_eps is None:
        # ½·mean((V − R)²) = ½·(1 + 4 + 2.25)/3 = 7.25/6;  ∂ = (V − R)/3 = −1/3, 2/3, −0.5
        assert loss.item() == pytest.approx(7.25 / 6, abs=1e-12)
        expected_grad = [[-1.0 / 3, 2.0 / 3, 0.0], [-0.5, 0.0, 0.0]]
    else:
        # (0,0): V−V_old = 0.5 → V_c = 0.7: max((1−2)², (0.7−2)²) = max(1, 1.69)   = 1.69 (clipped, ∂ = 0)
        # (0,1): V−V_old = 0.5 → V_c = 2.7: max((3−1)², (2.7−1)²) = max(4, 2.89)   = 4    (∂ = (V−R)/3 = 2/3)
        # (1,0): V−V_old = −.5 → V_c = −.7: max((−1.5)², (−1.2)²) = max(2.25, 1.44) = 2.25 (∂ = −1.5/3 = −0.5)
        # loss = ½·(1.69 + 4 + 2.25)/3 = 3.97/3
        assert loss.item() == pytest.approx(3.97 / 3, abs=1e-12)
        expected_grad = [[0.0, 2.0 / 3, 0.0], [-0.5, 0.0, 0.0]]
    close(new.grad, expected_grad, f"value-loss gradient (clip_eps={clip_eps})")
    assert torch.equal(new.grad[mask == 0], torch.zeros(3, dtype=new.grad.dtype)), "padding must get exactly 0 gradient"


# ---------------------------------------------------------------------------------------------
# 5. token_values and token_logprobs on the tiny model
# ---------------------------------------------------------------------------------------------

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = [[1, 50, 60, 70, 80, 90], [1, 51, 61], [1, 52, 62, 72, 82]]
RESPONSES = [[100, 101, 2], [200], [300, 301, 302, 303, 2]]  # lengths 3, 1, 5 → L = 5


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    base, tokenizer = agents.load_base_model(str(tiny_model_dir))
    torch.manual_seed(3)
    model = agents.attach_adapters(base, ["solver", "critic"], agents.lora_config(4, 8, TARGETS))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # LoRA starts at B = 0; give each adapter its own weights
                p.normal_(0, 0.5)
    heads = critic.make_value_heads(base.config.hidden_size, ["critic"])
    with torch.no_grad():
        heads["critic"].weight.normal_()
        heads["critic"].bias.fill_(0.25)
    return model, tokenizer, heads


def test_token_values_match_action_values_and_an_unpadded_forward(setup):
    model, tokenizer, heads = setup
    pad = tokenizer.pad_token_id
    head = heads["critic"]
    with torch.no_grad():
        values = critic.token_values(model, heads, "critic", PROMPTS, RESPONSES, pad)
        action = critic.action_values(model, heads, "critic", PROMPTS, pad)
    assert values.shape == (3, 5)
    torch.testing.assert_close(values[:, 0], action, atol=1e-5, rtol=0,
                               msg="column 0 must be the action-level value V(ô)")
    for row, (prompt, response) in enumerate(zip(PROMPTS, RESPONSES)):
        assert torch.equal(values[row, len(response):], torch.zeros(5 - len(response))), f"row {row}: padding must be 0"
        with agents.active_adapter(model, "critic"), torch.no_grad():
            hidden = model(input_ids=torch.tensor([prompt + response]), output_hidden_states=True).hidden_states[-1][0]
            for k in range(len(response)):
                # V(ô, w_<k) is read at the position that predicts token k: prompt_len − 1 + k
                expected = (head.weight[0] @ hidden[len(prompt) - 1 + k] + head.bias[0]).item()
                assert values[row, k].item() == pytest.approx(expected, abs=1e-4), f"row {row}, token {k}"
    assert values[2, 1:5].abs().min() > 0  # the random head really gives non-zero values at real tokens


def test_token_value_of_token_k_does_not_see_token_k(setup):
    # V(ô, w_<k): changing the last response token leaves every value of that response unchanged.
    model, tokenizer, heads = setup
    pad = tokenizer.pad_token_id
    changed = [r[:-1] + [r[-1] + 7] for r in RESPONSES]
    with torch.no_grad():
        before = critic.token_values(model, heads, "critic", PROMPTS, RESPONSES, pad)
        after = critic.token_values(model, heads, "critic", PROMPTS, changed, pad)
    torch.testing.assert_close(before, after, atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_sum_to_the_action_logprob_and_are_zero_at_padding(setup, temperature):
    model, tokenizer, _ = setup
    pad = tokenizer.pad_token_id
    with torch.no_grad():
        token_lp, token_ent, mask = agents.token_logprobs(model, PROMPTS, RESPONSES, "solver", pad, temperature)
        action_lp, _ = agents.action_logprobs(model, PROMPTS, RESPONSES, "solver", pad, "sum", temperature)
    assert token_lp.shape == mask.shape == (3, 5)
    assert torch.equal(mask, torch.tensor([[1.0, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]))
    torch.testing.assert_close((token_lp * mask).sum(-1), action_lp, atol=1e-5, rtol=0)
    padding = mask == 0
    assert torch.equal(token_lp[padding], torch.zeros(int(padding.sum()))), "padding log-probs must be exactly 0"
    assert torch.equal(token_ent[padding], torch.zeros(int(padding.sum()))), "padding entropies must be exactly 0"
    assert (token_lp[~padding] < 0).all()
