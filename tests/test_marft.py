"""marft.py: data plumbing, the phases of the algorithm box, and whole runs (resume, learning)."""
import json
import math

import pytest
import torch

import agents
import marft
import run
from conftest import SHARED_DATA
from rollout import Rollout


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------

def test_malformed_training_row_is_reported_with_file_and_line(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"problem": "1+1?", "solution": "$\\boxed{2}$"}) + "\n" + json.dumps({"problem": "no answer here"}) + "\n")
    cfg = run.Config(data=str(data), eval_data=str(data))
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        marft.load_task(cfg)


def test_real_math_test_file_feeds_training_and_held_out_split():
    cfg = run.Config(data=str(SHARED_DATA / "math_test.jsonl"), eval_problems=20)
    train, held_out = marft.load_task(cfg)
    assert len(held_out) == 20 and len(train) == 5000 - 20
    assert not {p.problem for p in held_out} & {p.problem for p in train}


def test_iteration_batches_cover_the_train_set_each_epoch_and_replay_by_iteration():
    problems = marft.make_arithmetic_problems("train", seed=3)
    per_epoch = len(problems) // 10
    seen = [p for k in range(per_epoch) for p in marft.iteration_batch(problems, 10, seed=3, iteration=k)]
    assert sorted(p.problem for p in seen) == sorted(p.problem for p in problems)
    assert marft.iteration_batch(problems, 10, 3, 7) == marft.iteration_batch(problems, 10, 3, 7)
    assert marft.iteration_batch(problems, 10, 3, 7) != marft.iteration_batch(problems, 10, 4, 7)


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
                   team_reward=torch.tensor([[0.0, 1.0], [1.0, 0.0]]), dones=torch.tensor([[0.0, 1.0], [1.0, 0.0]]),
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
    model = agents.attach_adapters(base, ["planner", "solver"], agents.lora_config(4, 8.0, TARGETS))
    return model, tokenizer.pad_token_id


@pytest.mark.parametrize("level", ["action", "token"])
def test_happo_weight_uses_the_ratio_after_the_agents_own_update_indexed_by_joint_action(tiny_agents, level):
    model, pad = tiny_agents
    rollout, cfg = hand_made_rollout(), run.Config(level=level, normalisation="sum", happo_ratio_clip=0.0, forward_batch_size=2)
    solver_samples = rollout.agent_samples(1)  # samples 1, 3, 5: (0, 0), (0, 1), (1, 0)
    old_lp = {s: plain_action_logprob(model, "solver", rollout.prompt_ids[s], rollout.response_ids[s]) for s in solver_samples}
    old_table, _, mask = marft.decision_logprobs(model, pad, rollout, list(range(6)), "solver", cfg)  # [6, L] under π_old
    old = marft.OldPolicy(logprob=old_table, values=torch.zeros_like(old_table), ref_logprob=torch.zeros_like(old_table), mask=mask)
    # The solver's update: its adapter moves, the planner's does not.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name and ".solver." in name:
                param.normal_(0, 0.3)
    happo_weight = torch.tensor([[1.5, 0.5], [2.0, 3.0]])  # M before the solver's factor
    new_weight = marft.happo_weight_after_update(model, pad, rollout, old, torch.tensor(solver_samples), "solver",
                                                 happo_weight, cfg)
    ratio = {s: math.exp(plain_action_logprob(model, "solver", rollout.prompt_ids[s], rollout.response_ids[s]) - old_lp[s])
             for s in solver_samples}
    assert all(abs(r - 1) > 1e-3 for r in ratio.values())  # the new weights really entered
    expected = [[1.5 * ratio[1], 0.5 * ratio[3]], [2.0 * ratio[5], 3.0]]  # (1, 1) is no joint action: M stays
    torch.testing.assert_close(new_weight, torch.tensor(expected), rtol=1e-4, atol=0)


def test_kl_early_stop_comes_before_the_optimiser_step(tiny_agents):
    model, pad = tiny_agents
    rollout = hand_made_rollout()
    cfg = run.Config(ppo_epochs=3, minibatch_size=8, target_kl=1e-12, lr=0.05)
    table, _, mask = marft.decision_logprobs(model, pad, rollout, list(range(6)), "solver", cfg)
    old = marft.OldPolicy(logprob=table, values=torch.zeros_like(table), ref_logprob=torch.zeros_like(table), mask=mask)
    advantages = torch.tensor([[0.0], [1.0], [0.0], [-1.0], [0.0], [2.0]])
    optimiser = torch.optim.Adam(agents.adapter_parameters(model, "solver"), lr=cfg.lr)
    stats = marft.update_agent(model, pad, rollout, old, advantages, torch.ones(2, 2), torch.tensor(rollout.agent_samples(1)),
                               "solver", cfg, optimiser, torch.Generator().manual_seed(0))
    # Epoch 1: π = π_old, KL = 0, one step. Epoch 2: KL > 1e-12 stops the agent before a second step.
    assert optimiser.state_dict()["state"][0]["step"] == 1
    assert stats["losses/early_stopped/solver"] == 1.0 and stats["losses/approx_kl/solver"] < 1e-12


# ---------------------------------------------------------------------------------------------
# Whole runs on the embedded model
# ---------------------------------------------------------------------------------------------

def metrics_without_timings(run_dir):
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]


@pytest.mark.slow
def test_interrupted_and_resumed_run_equals_the_uninterrupted_run(tmp_path):
    # Evaluate every iteration so both runs log the same keys; 24 tokens leave room for real answers.
    common = ["--batch_size", "4", "--eval_problems", "2", "--eval_samples", "1", "--max_new_tokens", "24", "--eval_interval", "1", "--no-eval_greedy",
              "--minibatch_size", "4", "--ppo_epochs", "1", "--threads", "1", "--output_dir", str(tmp_path), "--seed", "5"]
    marft.train(run.parse_args(common + ["--iterations", "2", "--run_name", "straight"]))
    marft.train(run.parse_args(common + ["--iterations", "1", "--run_name", "interrupted"]))
    marft.train(run.parse_args(["--resume", str(tmp_path / "interrupted"), "--iterations", "2", "--threads", "1"]))
    straight = metrics_without_timings(tmp_path / "straight")
    resumed = metrics_without_timings(tmp_path / "interrupted")
    assert [r["iteration"] for r in resumed] == [0, 1, 2]
    # Compared as JSON text, so that a NaN metric (e.g. explained variance of constant returns) equals itself.
    assert json.dumps(straight) == json.dumps(resumed)


@pytest.mark.slow
def test_training_raises_the_reward_of_the_embedded_model(tmp_path):
    """A short real run: the two-agent chain on one-digit addition, held-out accuracy must rise."""
    summary = marft.train(run.parse_args([
        "--arithmetic_levels", "1", "--iterations", "4", "--batch_size", "8", "--minibatch_size", "8",
        "--eval_problems", "12", "--eval_samples", "2", "--no-eval_greedy", "--max_new_tokens", "24",
        "--lr", "3e-4", "--output_dir", str(tmp_path), "--run_name", "learn", "--seed", "2", "--threads", "2",
    ]))
    rows = metrics_without_timings(tmp_path / "learn")
    assert summary["final"]["eval/accuracy"] >= summary["initial"]["eval/accuracy"] + 0.15, summary
    train_rewards = [r["charts/reward"] for r in rows[1:]]
    assert sum(train_rewards[2:]) > sum(train_rewards[:2]), train_rewards
