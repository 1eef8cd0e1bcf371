"""marft.py: command line, config validation, data plumbing, checkpoints, resume, and learning."""
import json
import shutil

import pytest
import torch

import marft
from conftest import SHARED_DATA


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        marft.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    docs = marft.field_docs()
    for field in marft.dataclasses.fields(marft.Config):
        assert f"--{field.name}" in text
        assert field.name in docs and docs[field.name].split()[0] in text


@pytest.mark.parametrize("argv, option", [
    (["--credit", "everyone"], "--credit"),
    (["--lam", "1.5"], "--lam"),
    (["--batch_size", "0"], "--batch_size"),
    (["--normalisation", "max"], "--normalisation"),
    (["--temperature", "0"], "--temperature"),
    (["--arithmetic_levels", "1,9"], "--arithmetic_levels"),
    (["--agents", "no-such-organisation"], "--agents"),
    (["--update_order", "alphabetical"], "--update_order"),
])
def test_bad_option_values_fail_at_start_naming_the_option(argv, option):
    with pytest.raises(SystemExit) as err:
        marft.parse_args(argv)
    assert str(err.value).startswith(option)


def test_cyclic_profile_file_is_rejected_at_start(tmp_path):
    profile = tmp_path / "cyclic.json"
    profile.write_text(json.dumps({
        "agents": [{"role": "a", "system_prompt": "A", "graded": True}, {"role": "b", "system_prompt": "B"}],
        "dependencies": [["a", "b"], ["b", "a"]],
    }))
    with pytest.raises(SystemExit) as err:
        marft.parse_args(["--agents", str(profile)])
    assert "--agents" in str(err.value) and "cycle" in str(err.value)


def test_resume_of_a_folder_without_config_fails_clearly(tmp_path):
    with pytest.raises(SystemExit) as err:
        marft.parse_args(["--resume", str(tmp_path)])
    assert "config.json" in str(err.value)


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------

def test_malformed_training_row_is_reported_with_file_and_line(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"problem": "1+1?", "solution": "$\\boxed{2}$"}) + "\n" + json.dumps({"problem": "no answer here"}) + "\n")
    cfg = marft.Config(data=str(data), eval_data=str(data))
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        marft.load_task(cfg)


def test_real_math_test_file_feeds_training_and_held_out_split():
    cfg = marft.Config(data=str(SHARED_DATA / "math_test.jsonl"), eval_problems=20)
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
# Checkpoints
# ---------------------------------------------------------------------------------------------

def tiny_config(tiny_model_dir, **overrides) -> marft.Config:
    return marft.Config(model=str(tiny_model_dir), lora_rank=2, lora_alpha=4.0, **overrides)


def perturb(model, value_heads, scale=0.1):
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(value_heads.named_parameters()):
            if p.requires_grad:
                p.add_(torch.randn_like(p) * scale)


def snapshot(model, value_heads):
    return {n: p.detach().clone() for n, p in list(model.named_parameters()) + list(value_heads.named_parameters())}


def test_checkpoint_round_trip_restores_trainable_adapters_and_optimisers(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir)
    org, model, tokenizer, heads, optimisers = marft.build(cfg)
    perturb(model, heads)
    for opt in optimisers.values():  # give Adam a state to restore
        for group in opt.param_groups:
            for p in group["params"]:
                p.grad = torch.ones_like(p)
        opt.step()
    saved = snapshot(model, heads)
    marft.save_checkpoint(tmp_path, 3, model, heads, optimisers, elapsed=12.5, keep=2)

    _, fresh, _, fresh_heads, fresh_opts = marft.build(cfg)
    state = marft.load_checkpoint(tmp_path, fresh, fresh_heads, fresh_opts)
    assert state == {"iteration": 3, "elapsed_seconds": 12.5}
    restored = snapshot(fresh, fresh_heads)
    assert all(torch.equal(saved[n], restored[n]) for n in saved)
    for name, opt in fresh_opts.items():
        assert opt.state_dict()["state"][0]["step"] == optimisers[name].state_dict()["state"][0]["step"]
    # The restored adapters are trainable (the reference repo resumed them frozen).
    lora = [p for n, p in fresh.named_parameters() if "lora_" in n]
    assert lora and all(p.requires_grad for p in lora)


def test_checkpoints_are_atomic_rotated_and_a_missing_adapter_is_named(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir)
    _, model, _, heads, optimisers = marft.build(cfg)
    for k in (1, 2, 3):
        marft.save_checkpoint(tmp_path, k, model, heads, optimisers, elapsed=float(k), keep=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.glob("iter_*")) == ["iter_000002", "iter_000003"]
    assert (root / "latest").read_text() == "iter_000003"
    assert not list(root.glob(".tmp*"))
    # A crash while writing leaves only a staging folder: the last complete checkpoint still loads.
    (root / ".tmp_iter_000004").mkdir()
    assert marft.load_checkpoint(tmp_path, model, heads, optimisers)["iteration"] == 3
    shutil.rmtree(root / "iter_000003" / "adapters" / "solver")
    with pytest.raises(SystemExit, match="adapter 'solver' is missing"):
        marft.load_checkpoint(tmp_path, model, heads, optimisers)


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
    marft.train(marft.parse_args(common + ["--iterations", "2", "--run_name", "straight"]))
    marft.train(marft.parse_args(common + ["--iterations", "1", "--run_name", "interrupted"]))
    marft.train(marft.parse_args(["--resume", str(tmp_path / "interrupted"), "--iterations", "2", "--threads", "1"]))
    straight = metrics_without_timings(tmp_path / "straight")
    resumed = metrics_without_timings(tmp_path / "interrupted")
    assert [r["iteration"] for r in resumed] == [0, 1, 2]
    # Compared as JSON text, so that a NaN metric (e.g. explained variance of constant returns) equals itself.
    assert json.dumps(straight) == json.dumps(resumed)


@pytest.mark.slow
def test_training_raises_the_reward_of_the_embedded_model(tmp_path):
    """A short real run: the two-agent chain on one-digit addition, held-out accuracy must rise."""
    summary = marft.train(marft.parse_args([
        "--arithmetic_levels", "1", "--iterations", "4", "--batch_size", "8", "--minibatch_size", "8",
        "--eval_problems", "12", "--eval_samples", "2", "--no-eval_greedy", "--max_new_tokens", "24",
        "--lr", "3e-4", "--output_dir", str(tmp_path), "--run_name", "learn", "--seed", "2", "--threads", "2",
    ]))
    rows = metrics_without_timings(tmp_path / "learn")
    assert summary["final"]["eval/accuracy"] >= summary["initial"]["eval/accuracy"] + 0.15, summary
    train_rewards = [r["charts/reward"] for r in rows[1:]]
    assert sum(train_rewards[2:]) > sum(train_rewards[:2]), train_rewards
