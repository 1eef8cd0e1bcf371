"""marft.py: data plumbing, the phases of the algorithm box, and whole runs (resume; the learning run is tests/test_learning.py)."""
import dataclasses
import json
import math
import shutil
import subprocess
import sys

import pytest
import torch

import agents
import config
import critic
import marft
import run
from conftest import ROOT, SHARED_DATA
from envs import make_arithmetic_problems
from flex_pomdp import load_organisation
from rollout import Rollout


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------

def test_bad_data_ends_the_run_at_start_with_a_message_naming_file_line_and_fix(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"problem": "1+1?", "solution": "$\\boxed{2}$"}) + "\n" + json.dumps({"problem": "no answer here"}) + "\n")
    with pytest.raises(SystemExit, match=r"--data=.*bad.jsonl:2.*--skip_malformed_rows"):
        run.load_task(config.Config(data=str(data)))
    with pytest.raises(SystemExit, match=r"--eval_data=.*no_such.jsonl"):
        run.load_task(config.Config(eval_data=str(tmp_path / "no_such.jsonl")))
    # From the command line: one paragraph, no traceback, and no run folder made.
    result = subprocess.run([sys.executable, str(ROOT / "marft.py"), "--data", str(tmp_path / "missing.jsonl"),
                             "--output_dir", str(tmp_path / "runs")], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "missing.jsonl" in result.stderr and not (tmp_path / "runs").exists()


def test_real_math_test_file_feeds_training_and_held_out_split():
    cfg = config.Config(data=str(SHARED_DATA / "math_test.jsonl"), eval_problems=20)
    train, held_out = run.load_task(cfg)
    assert len(held_out) == 20 and len(train) == 5000 - 20
    assert not {p.problem for p in held_out} & {p.problem for p in train}


def test_iteration_batches_cover_the_train_set_each_epoch_and_replay_by_iteration():
    problems = make_arithmetic_problems("train", seed=3, levels=(1, 2))[:140]  # a whole number of batches of 10
    per_epoch = len(problems) // 10
    seen = [p for k in range(per_epoch) for p in run.iteration_batch(problems, 10, seed=3, iteration=k)]
    assert sorted(p.problem for p in seen) == sorted(p.problem for p in problems)
    assert run.iteration_batch(problems, 10, 3, 7) == run.iteration_batch(problems, 10, 3, 7)
    assert run.iteration_batch(problems, 10, 3, 7) != run.iteration_batch(problems, 10, 4, 7)


# ---------------------------------------------------------------------------------------------
# The phases of the update, on a tiny random Llama and a hand-made rollout
# ---------------------------------------------------------------------------------------------

TARGETS = ["q_proj", "v_proj"]


def hand_made_rollout():
    """B = 2 episodes, T = 2 steps, agents planner (n = 0) → solver (n = 1). Episode 0 plays both
    steps; episode 1 ends after step 0, so (episode 1, step 1) is no joint action at all."""
    where = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1)]  # (episode, step, agent)
    prompts = [[1, 50, 60, 70], [1, 51, 61], [1, 52, 62, 72, 82], [1, 53], [1, 54, 64], [1, 55, 65, 75]]
    responses = [[100, 101, 2], [200], [300, 301, 302, 2], [400, 2], [500], [600, 601, 602, 603, 2]]
    return Rollout(prompt_ids=prompts, response_ids=responses, texts=[""] * 6, generation_logprobs=[[0.0] * len(r) for r in responses],
                   episode=[e for e, _, _ in where], step=[t for _, t, _ in where], agent_index=[n for _, _, n in where],
                   position=[n for _, _, n in where],
                   role_reward=[0.0] * 6, team_reward=torch.tensor([[0.0, 1.0], [1.0, 0.0]]), dones=torch.tensor([[0.0, 1.0], [1.0, 0.0]]),
                   step_mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]]), solved=[True, True], outcomes=[[], []])


def plain_action_logprob(model, adapter, prompt, response):
    """log π(a | ô) = Σ_k log π(w_k | ô, w_<k) from one plain forward pass of prompt ⊕ response."""
    with agents.active_adapter(model, adapter), torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0]
    logp = torch.log_softmax(logits.double(), -1)
    return sum(logp[len(prompt) - 1 + k, token].item() for k, token in enumerate(response))


@pytest.fixture()
def tiny_agents(tiny_model_dir):
    base, tokenizer = agents.load_base_model(str(tiny_model_dir))
    torch.manual_seed(0)
    model = agents.attach_adapters(base, ["policy_planner", "policy_solver"], agents.lora_config(4, 8.0, TARGETS))
    return model, tokenizer.pad_token_id


def tables_under(model, pad, rollout, adapter, cfg):
    """The OldPolicy tables of every sample under `adapter` (values unused)."""
    with torch.no_grad():
        out = marft.decision_logprobs(model, pad, rollout, list(range(len(rollout.prompt_ids))), adapter, cfg)
    return marft.OldPolicy(logprob=out.logprob, values=torch.zeros_like(out.logprob), mask=out.mask, token_mask=out.token_mask)


def perturb_adapter(model, adapter, scale=0.3):
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name and f".{adapter}." in name:
                param.normal_(0, scale)


@pytest.mark.parametrize("decision_unit, action_logprob", [("action", "sum"), ("action", "mean"), ("token", "sum")])
def test_happo_weight_uses_the_ratio_after_the_agents_own_update_indexed_by_joint_action(tiny_agents, decision_unit, action_logprob,
                                                                                     monkeypatch):
    model, pad = tiny_agents
    monkeypatch.setattr(marft, "FORWARD_BATCH_SIZE", 2)  # the agent's 3 samples in two no-grad batches
    rollout = hand_made_rollout()
    cfg = config.Config(decision_unit=decision_unit, action_logprob=action_logprob, happo_ratio_clip=0.0)
    solver_samples = rollout.agent_samples(1)  # samples 1, 3, 5: (0, 0), (0, 1), (1, 0)
    old_lp = {s: plain_action_logprob(model, "policy_solver", rollout.prompt_ids[s], rollout.response_ids[s]) for s in solver_samples}
    old = tables_under(model, pad, rollout, "policy_solver", cfg)  # π_old
    perturb_adapter(model, "policy_solver")  # the solver's update: its adapter moves, the planner's does not
    samples = torch.tensor(solver_samples)
    new_logprob = marft.logprobs_after_update(model, pad, rollout, old, samples, "policy_solver", cfg)
    happo_weight = torch.tensor([[1.5, 0.5], [2.0, 3.0]])  # M before the solver's factor
    new_weight = marft.happo_weight_after_update(rollout, old, samples, new_logprob, happo_weight, cfg)
    # ρ of the whole action, π_new(a) / π_old(a), whatever the --action_logprob of the PPO ratio
    ratio = {s: math.exp(plain_action_logprob(model, "policy_solver", rollout.prompt_ids[s], rollout.response_ids[s]) - old_lp[s])
             for s in solver_samples}
    assert all(abs(r - 1) > 1e-3 for r in ratio.values())  # the new weights really entered
    expected = [[1.5 * ratio[1], 0.5 * ratio[3]], [2.0 * ratio[5], 3.0]]  # (1, 1) is no joint action: M stays
    torch.testing.assert_close(new_weight, torch.tensor(expected), rtol=1e-4, atol=0)


def test_kl_early_stop_comes_before_the_optimiser_step(tiny_agents):
    model, pad = tiny_agents
    rollout = hand_made_rollout()
    cfg = config.Config(ppo_epochs=3, minibatch_size=8, target_kl=1e-12, lr=0.05)
    old = tables_under(model, pad, rollout, "policy_solver", cfg)
    advantages = torch.tensor([[0.0], [1.0], [0.0], [-1.0], [0.0], [2.0]])
    optimiser = torch.optim.Adam(agents.adapter_parameters(model, "policy_solver"), lr=cfg.lr)
    stats = marft.update_agent(model, pad, rollout, old, advantages, None, torch.ones(2, 2), torch.tensor(rollout.agent_samples(1)),
                               "solver", "policy_solver", cfg, optimiser, torch.Generator().manual_seed(0))
    # Epoch 1: π = π_old, KL = 0, one step. Epoch 2: KL > 1e-12 stops the agent before a second step.
    assert optimiser.state_dict()["state"][0]["step"] == 1
    assert stats["losses/early_stopped/solver"] == 1.0 and stats["losses/approx_kl/solver"] < 1e-12


def update_chain_watching_m(model, pad, rollout, old, cfg, monkeypatch):
    """One `update_agents` of the chain on hand advantages, with Adam per policy adapter; returns its
    stats, the M each agent's update received (by label) and the optimisers."""
    weights_seen = {}
    real_update_agent = marft.update_agent
    def spy(model_, pad_, rollout_, old_, advantages_, signal, happo_weight, samples, label, *rest):
        weights_seen[label] = happo_weight.clone()
        return real_update_agent(model_, pad_, rollout_, old_, advantages_, signal, happo_weight, samples, label, *rest)
    monkeypatch.setattr(marft, "update_agent", spy)
    optimisers = {a: torch.optim.Adam(agents.adapter_parameters(model, a), lr=cfg.lr) for a in ("policy_planner", "policy_solver")}
    advantages = torch.tensor([[1.0], [0.5], [-1.0], [2.0], [0.5], [-0.5]])
    stats = marft.update_agents(model, pad, load_organisation("chain"), rollout, old, advantages, None, cfg, optimisers,
                                torch.Generator().manual_seed(0))  # seed 0 draws the order planner → solver
    return stats, weights_seen, optimisers


def test_update_agents_weights_each_agent_by_the_factor_of_those_updated_before_it(tiny_agents, monkeypatch):
    """Order planner → solver: the solver's surrogate gets the M that the planner's ratio, recomputed
    after the planner's own update, made; the KL after each update is logged."""
    model, pad = tiny_agents
    rollout = hand_made_rollout()
    cfg = config.Config(happo_ratio_clip=0.0, minibatch_size=8, lr=0.05, target_kl=0.0)
    old = tables_under(model, pad, rollout, "policy_planner", cfg)
    solver = rollout.agent_samples(1)
    old.logprob[solver] = tables_under(model, pad, rollout, "policy_solver", cfg).logprob[solver]
    planner_before = {s: plain_action_logprob(model, "policy_planner", rollout.prompt_ids[s], rollout.response_ids[s]) for s in range(6)}
    stats, weights_seen, optimisers = update_chain_watching_m(model, pad, rollout, old, cfg, monkeypatch)
    assert torch.equal(weights_seen["planner"], torch.ones(2, 2))
    ratio = {s: math.exp(plain_action_logprob(model, "policy_planner", rollout.prompt_ids[s], rollout.response_ids[s]) - planner_before[s])
             for s in rollout.agent_samples(0)}  # samples 0, 2, 4: (0, 0), (0, 1), (1, 0)
    assert all(abs(r - 1) > 1e-3 for r in ratio.values())
    torch.testing.assert_close(weights_seen["solver"], torch.tensor([[ratio[0], ratio[2]], [ratio[4], 1.0]]), rtol=1e-4, atol=0)
    # losses/kl_after_update: the k3 estimate (ρ − 1) − log ρ of the PPO ratio (default --action_logprob
    # mean: ρ = (π_new(a) / π_old(a))^(1/|a|)) over the planner's actions, after its update
    per_token = [ratio[s] ** (1 / len(rollout.response_ids[s])) for s in ratio]
    k3 = sum(r - 1 - math.log(r) for r in per_token) / 3
    assert stats["losses/kl_after_update/planner"] == pytest.approx(k3, rel=1e-3)
    assert "losses/kl_after_update/solver" not in stats  # the last agent's ratio weights no one: no M pass


def test_a_frozen_agent_takes_no_step_and_leaves_the_next_agent_m_equal_to_one(tiny_agents, monkeypatch):
    """--frozen_agents planner: the planner's adapter takes no optimiser step and its log-probs stay
    as they were; the solver is updated with M = 1 (a fixed π^planner has ratio 1)."""
    model, pad = tiny_agents
    rollout = hand_made_rollout()
    cfg = config.Config(minibatch_size=8, lr=0.05, target_kl=0.0, frozen_agents="planner")
    old = tables_under(model, pad, rollout, "policy_planner", cfg)
    planner_before = [plain_action_logprob(model, "policy_planner", rollout.prompt_ids[s], rollout.response_ids[s]) for s in range(6)]
    stats, weights_seen, optimisers = update_chain_watching_m(model, pad, rollout, old, cfg, monkeypatch)
    assert list(weights_seen) == ["solver"] and torch.equal(weights_seen["solver"], torch.ones(2, 2))
    assert not optimisers["policy_planner"].state and optimisers["policy_solver"].state_dict()["state"][0]["step"] == 1
    assert [plain_action_logprob(model, "policy_planner", rollout.prompt_ids[s], rollout.response_ids[s]) for s in range(6)] == planner_before
    assert "losses/policy_loss/solver" in stats and not any(key.endswith("/planner") for key in stats)


def test_each_role_s_log_probs_are_taken_at_its_own_temperature(tiny_agents):
    """--role_temperatures solver=2.0 (the rest at --temperature 0.5): the solver's PPO log-probs are
    Σ_k log softmax(logits / 2)[w_k] and the planner's Σ_k log softmax(logits / 0.5)[w_k], each by a
    plain forward pass; the old policy's table holds the same numbers."""
    model, pad = tiny_agents
    rollout = hand_made_rollout()
    cfg = config.Config(temperature=0.5, role_temperatures="solver=2.0", action_logprob="sum")

    def at(adapter, T, s):
        prompt, response = rollout.prompt_ids[s], rollout.response_ids[s]
        with agents.active_adapter(model, adapter), torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + response])).logits[0].double() / T
        return sum(torch.log_softmax(logits, -1)[len(prompt) - 1 + k, w].item() for k, w in enumerate(response))

    for adapter, T, samples in (("policy_planner", 0.5, [0, 2, 4]), ("policy_solver", 2.0, [1, 3, 5])):
        got = marft.decision_logprobs(model, pad, rollout, samples, adapter, cfg).logprob[:, 0]
        torch.testing.assert_close(got, torch.tensor([at(adapter, T, s) for s in samples], dtype=got.dtype), rtol=1e-5, atol=1e-5)
    old = marft.old_policy_and_values(model, None, pad, load_organisation("chain"), rollout,
                                      dataclasses.replace(cfg, advantage="group"))
    assert old.logprob[1, 0].item() == pytest.approx(at("policy_solver", 2.0, 1), abs=1e-5)
    assert old.logprob[0, 0].item() == pytest.approx(at("policy_planner", 0.5, 0), abs=1e-5)


def test_a_shared_adapter_gets_one_joint_update_over_all_samples(tiny_agents):
    model, pad = tiny_agents
    rollout = hand_made_rollout()
    model.add_adapter("policy", agents.lora_config(4, 8.0, TARGETS))
    cfg = config.Config(shared_adapter=True, minibatch_size=2, ppo_epochs=1, target_kl=0.0)
    old = tables_under(model, pad, rollout, "policy", cfg)
    optimiser = torch.optim.Adam(agents.adapter_parameters(model, "policy"), lr=1e-3)
    stats = marft.update_agents(model, pad, load_organisation("chain"), rollout, old, torch.randn(6, 1), None, cfg,
                                {"policy": optimiser}, torch.Generator().manual_seed(0))
    # One agent-by-agent pass per role would take 2 steps per role on 3 samples each (4 in all);
    # the joint update takes ⌈6 / 2⌉ = 3 steps over every sample, and no HAPPO factor.
    assert optimiser.state_dict()["state"][0]["step"] == 3
    assert stats["losses/happo_weight_mean"] == 1.0 and "losses/policy_loss/shared" in stats


def test_a_nonfinite_loss_skips_its_step_is_counted_and_repeated_ones_stop_the_run(tiny_agents, monkeypatch):
    model, pad = tiny_agents
    rollout = hand_made_rollout()
    cfg = config.Config(minibatch_size=1, ppo_epochs=1, target_kl=0.0)
    assert marft.MAX_NONFINITE_STEPS == 3
    old = tables_under(model, pad, rollout, "policy_solver", cfg)
    advantages = torch.tensor([[0.0], [1.0], [0.0], [float("nan")], [0.0], [2.0]])  # sample 3 poisons its minibatch
    params = agents.adapter_parameters(model, "policy_solver")
    optimiser = torch.optim.Adam(params, lr=0.05)
    update = lambda cfg_: marft.update_agent(model, pad, rollout, old, advantages, None, torch.ones(2, 2), torch.tensor([1, 3, 5]),
                                             "solver", "policy_solver", cfg_, optimiser, torch.Generator().manual_seed(0))
    # Normalising a NaN advantage makes every advantage of the agent NaN: all 3 steps are skipped.
    with pytest.raises(SystemExit, match="solver: 3 optimiser steps .* non-finite"):
        update(cfg)
    assert all(torch.isfinite(p).all() for p in params) and not optimiser.state  # no step was taken
    monkeypatch.setattr(marft, "MAX_NONFINITE_STEPS", 4)
    stats = update(cfg)
    assert stats["losses/nonfinite_steps/solver"] == 3.0 and math.isnan(stats["losses/policy_loss/solver"])
    assert all(torch.isfinite(p).all() for p in params)


def test_skip_zero_signal_groups_leaves_the_samples_without_signal_out_of_the_update(tiny_agents):
    """--skip_zero_signal_groups: of the solver's samples 1, 3, 5 with group advantages 1, 0, 2, sample 3 (its
    group had no signal) takes no optimiser step: 2 steps of one sample instead of 3; with no
    signal at all, no step is taken and the adapter does not move (Adam's momentum would move it)."""
    model, pad = tiny_agents
    rollout = hand_made_rollout()
    base = dict(advantage="group", group_size=2, credit="shared", minibatch_size=1, ppo_epochs=1, target_kl=0.0)
    old = tables_under(model, pad, rollout, "policy_solver", config.Config(**base))
    params = agents.adapter_parameters(model, "policy_solver")
    def update(advantages, **options):
        optimiser = torch.optim.Adam(params, lr=0.05)
        stats = marft.update_agent(model, pad, rollout, old, torch.tensor(advantages), torch.tensor(advantages)[:, 0] != 0,
                                   torch.ones(2, 2), torch.tensor([1, 3, 5]),
                                   "solver", "policy_solver", config.Config(**base, **options), optimiser,
                                   torch.Generator().manual_seed(0))
        return stats, (optimiser.state_dict()["state"][0]["step"] if optimiser.state else 0)
    signal = [[0.0], [1.0], [0.0], [0.0], [0.0], [2.0]]
    assert update(signal)[1] == 3  # unfiltered: one step per sample
    stats, steps = update(signal, skip_zero_signal_groups=True)
    assert steps == 2 and stats["losses/update_samples/solver"] == 2.0
    before = [p.detach().clone() for p in params]
    stats, steps = update([[0.0]] * 6, skip_zero_signal_groups=True)
    assert steps == 0 and stats["losses/update_samples/solver"] == 0.0 and math.isnan(stats["losses/policy_loss/solver"])
    assert all(torch.equal(p, q) for p, q in zip(params, before))


def test_an_agent_the_filter_empties_takes_no_step_on_any_rank_even_with_momentum(tiny_agents, monkeypatch):
    """Under torchrun a rank that computed nothing adds zero gradients (distributed.sum_gradients), and
    Adam's momentum from earlier iterations would then move the adapter: an agent whose every sample
    the filter drops must take no step at all. Two ranks are stood in for by collectives that return
    this rank's values."""
    model, pad = tiny_agents
    rollout = hand_made_rollout()
    base = dict(advantage="group", group_size=2, credit="shared", minibatch_size=1, ppo_epochs=1, target_kl=0.0,
                skip_zero_signal_groups=True)
    old = tables_under(model, pad, rollout, "policy_solver", config.Config(**base))
    params = agents.adapter_parameters(model, "policy_solver")
    optimiser = torch.optim.Adam(params, lr=0.05)
    import distributed
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "all_reduce", lambda tensor: tensor)
    monkeypatch.setattr(distributed, "sum_", lambda tensor: tensor)
    update = lambda advantages: marft.update_agent(model, pad, rollout, old, torch.tensor(advantages),
                                                   torch.tensor(advantages)[:, 0] != 0, torch.ones(2, 2), torch.tensor([1, 3, 5]),
                                                   "solver", "policy_solver", config.Config(**base), optimiser,
                                                   torch.Generator().manual_seed(0))
    update([[0.0], [1.0], [0.0], [-1.0], [0.0], [2.0]])  # an iteration with signal: Adam now has momentum
    steps, before = optimiser.state_dict()["state"][0]["step"], [p.detach().clone() for p in params]
    stats = update([[0.0]] * 6)  # nothing to learn from
    assert stats["losses/update_samples/solver"] == 0.0 and optimiser.state_dict()["state"][0]["step"] == steps
    assert all(torch.equal(p, q) for p, q in zip(params, before))


@pytest.mark.parametrize("lengths, groups, budget, expected", [
    # per agent, its rows in order; rows × longest ≤ budget (3 × 20 = 60 fits, 2 × 50 does not)
    ([10, 30, 20, 20, 50], [0, 1, 0, 0, 1], 60, [[[0, 2, 3]], [[1], [4]]]),
    ([100, 5, 5], [0, 0, 0], 60, [[[0], [1, 2]]]),  # a row over the budget is a micro-batch of its own
    ([10, 10, 10, 10], [0, 0, 0, 0], 10_000, [[[0, 1, 2, 3]]]),  # a minibatch within the budget: one pass
    ([10, 50, 10, 50], [0, 0, 0, 0], 100, [[[0, 1], [2, 3]]]),  # 2 × 50 each: the rows stay in the rollout's order
])
def test_micro_batches_by_hand(lengths, groups, budget, expected):
    prompts = [[7] * (length - 1) for length in lengths]  # responses of 1 token; no prefix sharing here
    as_lists = [[m.tolist() for m in agent] for agent in marft.micro_batches(prompts, lengths, groups, budget, share_prefix=False)]
    assert as_lists == expected


def test_the_prefix_an_agents_rows_share_counts_once_in_each_micro_batch():
    """Prompts of 12 tokens of which the agent's 4 rows share 10, responses of 3 (15 tokens): with
    prefix sharing a micro-batch of k rows costs 10 + k × (15 − 10) tokens (4 rows: 30, 3 rows:
    25), without it k × 15 (2 rows: 30). The other agent's 2 rows share 6 of their 9-token prompts:
    6 + 2 × (12 − 6) = 18, within a budget of 20, over one of 17 (then one row each; the prefix
    is the one all the agent's rows of the minibatch share, whatever the micro-batch)."""
    prompts = [[1] * 10 + [row, 2] for row in range(4)] + [[3] * 6 + [row, 4, 4] for row in range(2)]
    lengths, groups = [15] * 4 + [12] * 2, [0] * 4 + [1] * 2
    split = lambda n, budget, share: [[m.tolist() for m in agent] for agent in
                                      marft.micro_batches(prompts[:n], lengths[:n], groups[:n], budget, share_prefix=share)]
    assert split(4, 30, True) == [[[0, 1, 2, 3]]]
    assert split(4, 29, True) == [[[0, 1, 2], [3]]]
    assert split(4, 30, False) == [[[0, 1], [2, 3]]]
    assert split(6, 20, True) == [[[0, 1], [2, 3]], [[4, 5]]]
    assert split(6, 17, True) == [[[0], [1], [2], [3]], [[4], [5]]]


@pytest.mark.parametrize("level", ["action", "token"])
def test_micro_batches_accumulate_the_gradient_of_the_whole_minibatch(tiny_agents, level):
    """An agent's and the shared critic's update with every row in its own micro-batch take the
    step that one pass over each minibatch takes: the same weights and the same logged losses."""
    model, pad = tiny_agents
    model.add_adapter("critic", agents.lora_config(4, 8.0, TARGETS))
    rollout = hand_made_rollout()
    perturb_adapter(model, "policy_solver")
    heads = critic.make_value_heads(model.config.hidden_size, ["critic"])
    with torch.no_grad():
        heads["critic"].weight.normal_(0, 1.0)
    start = {n: p.detach().clone() for n, p in list(model.named_parameters()) + list(heads.named_parameters())}
    advantages = torch.tensor([[0.5], [1.0], [-0.5], [-1.0], [0.2], [2.0]])
    outcome = {}
    for budget in (1, 10_000):  # 1 token: every row alone; 10 000: each minibatch in one pass
        with torch.no_grad():
            for n, p in list(model.named_parameters()) + list(heads.named_parameters()):
                p.copy_(start[n])
        cfg = config.Config(decision_unit=level, minibatch_size=3, ppo_epochs=2, target_kl=0.0, micro_batch_tokens=budget)
        old = tables_under(model, pad, rollout, "policy_solver", cfg)
        old.values = torch.rand(old.logprob.shape, generator=torch.Generator().manual_seed(1)) * old.mask
        returns = old.values + 1.0
        if level == "token":
            advantages_l = advantages.expand(-1, old.logprob.shape[1]) * old.mask
        else:
            advantages_l = advantages
        optimiser = torch.optim.Adam(agents.adapter_parameters(model, "policy_solver"), lr=0.05)
        stats = marft.update_agent(model, pad, rollout, old, advantages_l, None, torch.ones(2, 2), torch.tensor(rollout.agent_samples(1)),
                                   "solver", "policy_solver", cfg, optimiser, torch.Generator().manual_seed(0))
        critic_optimiser = {"critic": torch.optim.Adam(critic.critic_parameters(model, heads, "critic"), lr=0.05)}
        stats |= marft.update_critic(model, heads, pad, rollout, old, returns, cfg, critic_optimiser,
                                     torch.Generator().manual_seed(0))
        weights = {n: p.detach().clone() for n, p in list(model.named_parameters()) + list(heads.named_parameters())
                   if p.requires_grad}
        outcome[budget] = stats, weights
    (split_stats, split), (whole_stats, whole) = outcome[1], outcome[10_000]
    assert any(not torch.equal(split[n], start[n]) for n in split if "critic" in n)  # both updates moved their weights
    assert any(not torch.equal(split[n], start[n]) for n in split if "policy_solver" in n)
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], rtol=1e-4, atol=1e-6)
    for key, value in whole_stats.items():
        assert split_stats[key] == pytest.approx(value, rel=1e-4, abs=1e-7), key


def plain_token_logprobs(model, adapter, prompt, response):
    """[log π(w_k | ô, w_<k)] from one plain forward under `adapter`."""
    with agents.active_adapter(model, adapter), torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0]
    logp = torch.log_softmax(logits.double(), -1)
    return [logp[len(prompt) - 1 + k, token].item() for k, token in enumerate(response)]


# ---------------------------------------------------------------------------------------------
# Group advantages (no critic) and per-role reward terms
# ---------------------------------------------------------------------------------------------

def one_step_rollout(prompts, responses, agent_index, episode, team_reward, role_reward):
    """H = 1: sample s is agent agent_index[s] in episode episode[s]; team_reward [B]."""
    B = len(team_reward)
    return Rollout(prompt_ids=prompts, response_ids=responses, texts=[""] * len(prompts),
                   generation_logprobs=[[0.0] * len(r) for r in responses], episode=episode, step=[0] * len(prompts),
                   agent_index=agent_index, position=agent_index, role_reward=role_reward,
                   team_reward=torch.tensor(team_reward).unsqueeze(1),
                   dones=torch.ones(B, 1), step_mask=torch.ones(B, 1), solved=[r > 0 for r in team_reward], outcomes=[[]] * B)


@pytest.mark.parametrize("level", ["action", "token"])
def test_group_advantages_add_the_role_terms_and_reach_every_token_of_the_action(tiny_agents, level):
    model, pad = tiny_agents
    # One problem played twice (G = 2) by planner → solver; the team is right in episode 0 only, and
    # the planner's per-role term paid 0.1 in episode 0 (e.g. no_boxed with weight 0.1).
    rollout = one_step_rollout([[1, 50], [1, 51, 52], [1, 50], [1, 53]], [[100, 101, 2], [200, 2], [300], [400, 401, 402, 2]],
                               agent_index=[0, 1, 0, 1], episode=[0, 0, 1, 1], team_reward=[1.0, 0.0], role_reward=[0.1, 0.0, 0.0, 0.0])
    cfg = config.Config(advantage="group", group_size=2, credit="shared", group_std=False, decision_unit=level)
    old = tables_under(model, pad, rollout, "policy_solver", cfg)
    advantages, returns, _, stats = marft.compute_advantages(load_organisation("chain"), rollout, old, cfg)
    # Returns: planner 1.1 and 0 (mean 0.55), solver 1 and 0 (mean 0.5).
    per_action = [0.55, 0.5, -0.55, -0.5]
    expected = torch.tensor(per_action).unsqueeze(1) * old.mask  # [S, L]: the action's Â on each of its tokens
    torch.testing.assert_close(advantages, expected)
    assert returns is None and stats == {"charts/zero_signal_groups": 0.0}
    if level == "token":
        assert advantages.shape[1] == 4 and (advantages[3] == -0.5).all()


def test_a_batch_baseline_pays_a_problem_solved_every_time(tiny_agents):
    model, pad = tiny_agents
    # Two problems × G = 2, one agent: problem A right twice (returns 1, 1), problem B once (1, 0).
    # Group baseline: A's episodes agree (Â = 0), B's get ±0.5. Batch baseline (mean 0.75): 0.25 for
    # every right answer, A's included, and −0.75 for the wrong one.
    rollout = one_step_rollout([[1, 50]] * 4, [[100, 2], [100, 2], [200, 2], [300, 2]], agent_index=[0] * 4,
                               episode=[0, 1, 2, 3], team_reward=[1.0, 1.0, 1.0, 0.0], role_reward=[0.0] * 4)
    for baseline, expected in (("group", [0.0, 0.0, 0.5, -0.5]), ("batch", [0.25, 0.25, 0.25, -0.75])):
        cfg = config.Config(agents="single", advantage="group", group_size=2, group_std=False, group_baseline=baseline)
        old = tables_under(model, pad, rollout, "policy_solver", cfg)
        advantages, _, _, _ = marft.compute_advantages(load_organisation("single"), rollout, old, cfg)
        torch.testing.assert_close(advantages[:, 0], torch.tensor(expected))


def test_one_agent_with_group_advantages_takes_the_grpo_objective(tiny_agents):
    """Single agent, G = 4 samples of one problem, no M: the loss is −J of GRPO without its KL term,
    J = 1/Σ|o_i| Σ_i Σ_t min(ρ_it Â_i, clip(ρ_it, 1 ± ε) Â_i), Â_i = (R_i − mean R) / (std R + ε')
    (token-mean aggregation over the group, as DAPO and TRL)."""
    model, pad = tiny_agents
    perturb_adapter(model, "policy_solver")
    prompt = [1, 50, 60, 70]
    responses = [[100, 101, 2], [200, 2], [300, 301, 302, 303, 2], [400]]
    rollout = one_step_rollout([prompt] * 4, responses, agent_index=[0] * 4, episode=[0, 1, 2, 3],
                               team_reward=[1.0, 0.0, 0.0, 1.0], role_reward=[0.0] * 4)
    eps = 0.2
    cfg = config.Config(agents="single", advantage="group", group_size=4, decision_unit="token", clip_eps=eps,
                     minibatch_size=4, ppo_epochs=1, target_kl=0.0, lr=1e-6)
    old = tables_under(model, pad, rollout, "policy_solver", cfg)
    offsets = [[0.3, -0.4, 0.05, 0.0, 0.0], [-0.3, 0.1, 0.0, 0.0, 0.0], [0.5, 0.02, -0.6, 0.1, 0.0], [0.25, 0.0, 0.0, 0.0, 0.0]]
    old.logprob = (old.logprob + torch.tensor(offsets)) * old.mask  # π_old ≠ π: ratios inside and outside the clip
    advantages, _, _, _ = marft.compute_advantages(load_organisation("single"), rollout, old, cfg)
    optimisers = {"policy_solver": torch.optim.Adam(agents.adapter_parameters(model, "policy_solver"), lr=cfg.lr)}
    stats = marft.update_agents(model, pad, load_organisation("single"), rollout, old, advantages, None, cfg, optimisers,
                                torch.Generator().manual_seed(0))
    # By hand: rewards 1, 0, 0, 1 → mean 0.5, sample std √(4 · 0.25 / 3); Â = ±0.5 / (std + 1e-4).
    std = math.sqrt(1.0 / 3.0)
    adv = [a * 0.5 / (std + 1e-4) for a in (1, -1, -1, 1)]
    surrogate, tokens = 0.0, 0
    for i, response in enumerate(responses):
        new = plain_token_logprobs(model, "policy_solver", prompt, response)
        for k in range(len(response)):
            ratio = math.exp(new[k] - (old.logprob[i, k].item()))
            surrogate += min(ratio * adv[i], min(max(ratio, 1 - eps), 1 + eps) * adv[i])
            tokens += 1
    assert stats["losses/clip_fraction/solver"] > 0  # some ratios were clipped
    assert stats["losses/policy_loss/solver"] == pytest.approx(-surrogate / tokens, rel=1e-4)


# ---------------------------------------------------------------------------------------------
# Whole runs on the embedded model
# ---------------------------------------------------------------------------------------------

def metrics_without_timings(run_dir):
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]


def test_a_run_killed_before_its_checkpoint_and_resumed_equals_the_uninterrupted_run(tiny_model_dir, tmp_path, varied_rewards):
    # The default organisation and estimator (chain, critic + GAE) on the tiny model. Evaluate every
    # iteration so both runs log the same keys; the varied rewards make every reward, advantage
    # and loss nonzero even when no answer is right.
    marft.train(config.parse_args(["--model", str(tiny_model_dir), "--batch_size", "2", "--eval_problems", "1",
                                "--eval_samples", "1", "--max_new_tokens", "24",
                                "--eval_interval", "1", "--no-eval_greedy", "--minibatch_size", "2",
                                "--threads", "1", "--output_dir", str(tmp_path), "--seed", "5", "--iterations", "2",
                                "--run_name", "straight"]))
    # The state a kill -9 leaves between iteration 2's metrics line (and TensorBoard events, summary)
    # and its checkpoint: the run folder as it is, with checkpoints/latest still naming iteration 1.
    killed = tmp_path / "killed"
    shutil.copytree(tmp_path / "straight", killed)
    shutil.rmtree(killed / "checkpoints" / "iter_000002")
    (killed / "checkpoints" / "latest").write_text("iter_000001")
    marft.train(config.parse_args(["--resume", str(killed), "--threads", "1"]))
    straight, resumed = metrics_without_timings(tmp_path / "straight"), metrics_without_timings(killed)
    assert [r["iteration"] for r in resumed] == [0, 1, 2]  # iteration 2's first line was dropped, then replayed
    # Compared as JSON text, so that a NaN metric (e.g. explained variance of constant returns) equals itself.
    assert json.dumps(straight) == json.dumps(resumed)
