"""config.py and run.py: the command line, config validation, resume rules, the run folder and atomic checkpoints."""
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import agents
import config
import critic
import marft
import ppo
import run
import speed
from conftest import ROOT


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        config.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    docs = config.field_docs()
    for field in dataclasses.fields(config.Config):
        assert f"--{field.name}" in text
        assert field.name in docs and docs[field.name].split()[0] in text


@pytest.mark.parametrize("argv, option", [
    (["--credit", "everyone"], "--credit"),
    (["--lam", "1.5"], "--lam"),
    (["--batch_size", "0"], "--batch_size"),
    (["--action_logprob", "max"], "--action_logprob"),
    (["--temperature", "0"], "--temperature"),
    (["--arithmetic_levels", "1,9"], "--arithmetic_levels"),
    (["--agents", "no-such-organisation"], "--agents"),
    (["--advantage", "critic"], "--advantage"),
    (["--advantage", "group", "--group_size", "1"], "--group_size"),  # G = 1 has no baseline
    (["--advantage", "group", "--group_size", "4", "--credit", "last"], "--credit"),  # `last` leaves the planner no signal
    (["--config", "runs/x/config.json", "--resume", "runs/x"], "--config"),
    (["--lr_schedule", "step"], "--lr_schedule"),
    (["--frozen_agents", "critic"], "--frozen_agents"),  # not a learning agent of the chain
    (["--frozen_agents", "planner,solver"], "--frozen_agents"),  # nobody left to train
    (["--role_temperatures", "planner"], "--role_temperatures"),  # no =T
    (["--role_temperatures", "planner=hot"], "--role_temperatures"),
    (["--role_temperatures", "planner=nan"], "--role_temperatures"),
    (["--role_temperatures", "planner=-1"], "--role_temperatures"),
    (["--role_temperatures", "critic=1.0"], "--role_temperatures"),  # not a learning agent of the chain
    (["--role_temperatures", "planner=0"], "--role_temperatures"),  # greedy, but the planner learns: no PPO ratio
    (["--role_temperatures", "planner=1.5", "--shared_adapter"], "--role_temperatures"),
    (["--lr_schedule", "constant", "--lr_final_ratio", "0.1"], "--lr_final_ratio"),  # a floor without a decay to reach it
    (["--lr_schedule", "cosine", "--lr_final_ratio", "1.5"], "--lr_final_ratio"),
    (["--skip_zero_signal_groups"], "--skip_zero_signal_groups"),  # critic + GAE by default: no groups to filter
    (["--group_baseline", "batch"], "--group_baseline"),  # critic + GAE by default: the critic is the baseline
    (["--advantage", "group", "--group_size", "4", "--credit", "shared", "--group_baseline", "global"], "--group_baseline"),
    (["--decision_unit", "sentence"], "--decision_unit"),
    (["--eval_samples", "0", "--no-eval_greedy"], "--eval_samples"),  # nothing left to evaluate
    (["--eval_samples", "-1"], "--eval_samples"),
])
def test_bad_option_values_fail_at_start_naming_the_option(argv, option):
    with pytest.raises(SystemExit) as err:
        config.parse_args(argv)
    assert str(err.value).startswith(option)


def test_role_temperatures_give_the_listed_roles_their_own_t():
    cfg = config.parse_args(["--temperature", "0.4", "--frozen_agents", "planner", "--role_temperatures", "planner=0,solver=1.5"])
    assert config.role_temperatures(cfg) == {"planner": 0.0, "solver": 1.5}
    assert config.role_temperatures(config.parse_args(["--temperature", "0.4"])) == {}  # every role at --temperature


def test_the_rate_decays_to_a_tenth_over_24_iterations_by_default_and_constant_means_no_decay():
    cfg = config.parse_args([])
    assert (cfg.lr_schedule, cfg.lr_decay_iterations, cfg.lr_final_ratio) == ("cosine", 24, 0.1)
    # half a cosine: 2e-4 at the start, 2e-5 + 1.8e-4 · ½(1 + cos(π/2)) = 1.1e-4 half way, 2e-5 from iteration 24 on
    assert [ppo.scheduled_lr(2e-4, t, 24, "cosine", 0.1) for t in (0, 12, 24, 100)] == pytest.approx([2e-4, 1.1e-4, 2e-5, 2e-5])
    constant = config.parse_args(["--lr_schedule", "constant"])  # the decay's defaults step aside, and the run says why
    assert (constant.lr_decay_iterations, constant.lr_final_ratio) == (0, 0.0)
    assert constant.chosen["lr_final_ratio"].startswith("0.0: --lr_schedule constant")
    assert [ppo.scheduled_lr(2e-4, t, 50, "constant", 0.0) for t in (0, 49)] == [2e-4, 2e-4]


def test_a_batch_baseline_allows_one_episode_per_problem():
    cfg = config.parse_args(["--advantage", "group", "--group_baseline", "batch", "--group_size", "1", "--credit", "shared"])
    assert (cfg.group_size, cfg.group_baseline) == (1, "batch")


def test_cyclic_profile_file_is_rejected_at_start(tmp_path):
    profile = tmp_path / "cyclic.json"
    profile.write_text(json.dumps({
        "agents": [{"role": "a", "system_prompt": "A", "graded": True}, {"role": "b", "system_prompt": "B"}],
        "dependencies": [["a", "b"], ["b", "a"]],
    }))
    with pytest.raises(SystemExit) as err:
        config.parse_args(["--agents", str(profile)])
    assert "--agents" in str(err.value) and "cycle" in str(err.value)


def test_unknown_role_reward_term_is_rejected_at_start_naming_the_terms(tmp_path):
    profile = tmp_path / "terms.json"
    profile.write_text(json.dumps({
        "agents": [{"role": "planner", "system_prompt": "P", "rewards": {"brevity": 0.1}},
                   {"role": "solver", "system_prompt": "S", "graded": True}],
        "dependencies": [["planner", "solver"]],
    }))
    with pytest.raises(SystemExit) as err:
        config.parse_args(["--agents", str(profile)])
    assert str(err.value).startswith("--agents") and "brevity" in str(err.value) and "no_boxed" in str(err.value)


def test_a_group_run_builds_and_checkpoints_no_critic(tiny_model_dir, tmp_path):
    cfg = config.Config(model=str(tiny_model_dir), advantage="group", group_size=2, credit="shared")
    org, model, tokenizer, value_heads, optimisers = run.build(cfg)
    assert sorted(model.peft_config) == ["policy_planner", "policy_solver"] and len(value_heads) == 0
    assert sorted(optimisers) == ["policy_planner", "policy_solver"]
    run.save_checkpoint(tmp_path, 1, model, value_heads, optimisers, 0.0, keep=2)
    folder = tmp_path / "checkpoints" / "iter_000001"
    assert sorted(p.name for p in (folder / "adapters").iterdir() if p.is_dir()) == ["policy_planner", "policy_solver"]
    assert not (folder / "value_heads.pt").exists()
    assert run.load_checkpoint(tmp_path, model, value_heads, optimisers)["iteration"] == 1


def test_resume_of_a_folder_without_config_fails_clearly(tmp_path):
    with pytest.raises(SystemExit) as err:
        config.parse_args(["--resume", str(tmp_path)])
    assert "config.json" in str(err.value)


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------

def tiny_config(tiny_model_dir, **overrides) -> config.Config:
    return config.Config(model=str(tiny_model_dir), lora_rank=2, **overrides)


def perturb(model, value_heads, scale=0.1):
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(value_heads.named_parameters()):
            if p.requires_grad:
                p.add_(torch.randn_like(p) * scale)


def snapshot(model, value_heads):
    return {n: p.detach().clone() for n, p in list(model.named_parameters()) + list(value_heads.named_parameters())}


def test_checkpoint_round_trip_restores_trainable_adapters_and_optimisers(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir)
    org, model, tokenizer, heads, optimisers = run.build(cfg)
    perturb(model, heads)
    for opt in optimisers.values():  # give Adam a state to restore
        for group in opt.param_groups:
            for p in group["params"]:
                p.grad = torch.ones_like(p)
        opt.step()
    saved = snapshot(model, heads)
    run.save_checkpoint(tmp_path, 3, model, heads, optimisers, elapsed=12.5, keep=2)

    _, fresh, _, fresh_heads, fresh_opts = run.build(cfg)
    state = run.load_checkpoint(tmp_path, fresh, fresh_heads, fresh_opts)
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
    _, model, _, heads, optimisers = run.build(cfg)
    for k in (1, 2, 3):
        run.save_checkpoint(tmp_path, k, model, heads, optimisers, elapsed=float(k), keep=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.glob("iter_*")) == ["iter_000002", "iter_000003"]
    assert (root / "latest").read_text() == "iter_000003"
    assert not list(root.glob(".tmp*"))
    # A crash while writing leaves only a staging folder: the last complete checkpoint still loads.
    (root / ".tmp_iter_000004").mkdir()
    assert run.load_checkpoint(tmp_path, model, heads, optimisers)["iteration"] == 3
    shutil.rmtree(root / "iter_000003" / "adapters" / "policy_solver")
    with pytest.raises(SystemExit, match="no adapter 'policy_solver'"):
        run.load_checkpoint(tmp_path, model, heads, optimisers)


def test_init_from_starts_the_agents_of_the_same_role_from_another_runs_checkpoint(tiny_model_dir, tmp_path):
    """--init_from: the planner → solver chain's solver adapter starts the lone solver (single); the
    critic stays as built; a checkpoint sharing no role with the run, or a missing one, is named."""
    _, chain, _, chain_heads, chain_opts = run.build(tiny_config(tiny_model_dir))
    perturb(chain, chain_heads)
    trained = snapshot(chain, chain_heads)
    run.save_checkpoint(tmp_path, 2, chain, chain_heads, chain_opts, elapsed=1.0, keep=2)
    perturb(chain, chain_heads)  # iteration 3 differs from iteration 2
    run.save_checkpoint(tmp_path, 3, chain, chain_heads, chain_opts, elapsed=2.0, keep=2)

    _, single, _, single_heads, _ = run.build(tiny_config(tiny_model_dir, agents="single"))
    built = snapshot(single, single_heads)
    assert run.init_policy_adapters(f"{tmp_path}:iter_000002", single, ["policy_solver"]) == ["policy_solver"]
    loaded = snapshot(single, single_heads)
    solver = [n for n in loaded if ".policy_solver." in n]
    assert solver and all(torch.equal(loaded[n], trained[n]) for n in solver)
    assert all(torch.equal(loaded[n], built[n]) for n in loaded if n not in solver)  # the critic as built
    assert all(p.requires_grad for n, p in single.named_parameters() if n in solver)
    run.init_policy_adapters(str(tmp_path), single, ["policy_solver"])  # no checkpoint named: the latest
    assert not all(torch.equal(snapshot(single, single_heads)[n], trained[n]) for n in solver)

    with pytest.raises(SystemExit, match=r"holds \['critic', 'policy_planner', 'policy_solver'\], none of"):
        run.init_policy_adapters(str(tmp_path), single, ["policy_checker"])
    with pytest.raises(SystemExit, match="checkpoint 'iter_000009' not found"):
        run.init_policy_adapters(f"{tmp_path}:iter_000009", single, ["policy_solver"])
    with pytest.raises(SystemExit, match="^--init_from=.*no such run folder"):
        config.parse_args(["--init_from", str(tmp_path / "elsewhere")])

    # Several sources, the first that saved an adapter giving it: the solver from a lone-solver run,
    # the planner from the chain's iteration 2 (whose solver is not loaded again).
    perturb(single, single_heads)
    lone = snapshot(single, single_heads)
    run.save_checkpoint(tmp_path / "lone", 1, single, single_heads, {}, elapsed=1.0, keep=2)
    _, fresh_chain, _, fresh_heads, _ = run.build(tiny_config(tiny_model_dir))
    assert run.init_policy_adapters(f"{tmp_path / 'lone'},{tmp_path}:iter_000002", fresh_chain,
                                    ["policy_planner", "policy_solver"]) == ["policy_solver", "policy_planner"]
    both = snapshot(fresh_chain, fresh_heads)
    assert solver and all(torch.equal(both[n], lone[n]) for n in solver)
    planner = [n for n in both if ".policy_planner." in n]
    assert planner and all(torch.equal(both[n], trained[n]) for n in planner)
    with pytest.raises(SystemExit, match=r"none of this run's policy adapters \[\] \(not loaded from an earlier source\)"):
        run.init_policy_adapters(f"{tmp_path}:iter_000002,{tmp_path / 'lone'}", fresh_chain, ["policy_planner", "policy_solver"])
    with pytest.raises(SystemExit, match="^--init_from=.*no such run folder '.*elsewhere'"):
        config.parse_args(["--init_from", f"{tmp_path},{tmp_path / 'elsewhere'}"])


def test_roles_named_like_adapters_get_their_own_adapters(tiny_model_dir, tmp_path):
    """Policy and critic adapters live in separate namespaces: roles called critic, critic_x or
    default (peft's own adapter name) build, train and round-trip through a checkpoint."""
    profile = tmp_path / "names.json"
    profile.write_text(json.dumps({"agents": [{"role": "critic", "system_prompt": "A"}, {"role": "critic_x", "system_prompt": "B"},
                                              {"role": "default", "system_prompt": "C", "graded": True}],
                                   "dependencies": [["critic", "default"], ["critic_x", "default"]]}))
    cfg = tiny_config(tiny_model_dir, agents=str(profile))
    org, model, _, heads, optimisers = run.build(cfg)
    policies = agents.policy_adapter_names(org.order, False)
    assert len(set(policies) | {critic.SHARED_CRITIC}) == 4 and set(model.peft_config) == {*policies, critic.SHARED_CRITIC}
    perturb(model, heads)
    saved = snapshot(model, heads)
    run.save_checkpoint(tmp_path, 1, model, heads, optimisers, elapsed=1.0, keep=1)
    _, fresh, _, fresh_heads, fresh_opts = run.build(cfg)
    run.load_checkpoint(tmp_path, fresh, fresh_heads, fresh_opts)
    restored = snapshot(fresh, fresh_heads)
    assert all(torch.equal(saved[n], restored[n]) for n in saved)


def test_resume_drops_the_tensorboard_events_written_after_the_checkpoint(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = run.MetricsLog(tmp_path, keep_before=0)
    for iteration in range(4):  # the first process reached iteration 3, its last checkpoint was iteration 1
        log.write(iteration, {"charts/reward": float(iteration)})
    log.close()
    # TensorBoard reads event files in name order: <seconds>.<host>.<pid>.<counter>. A resume is a later
    # process, so its file sorts after; in one test process the counter may roll from 9 to 10 and sort first.
    (first,) = (tmp_path / "tensorboard").glob("*tfevents*")
    first.rename(first.with_name("events.out.tfevents.0000000001.earlier-process"))
    resumed = run.MetricsLog(tmp_path, keep_before=2)  # resumed from the checkpoint of iteration 1
    for iteration in (2, 3):
        resumed.write(iteration, {"charts/reward": 10.0 + iteration})
    resumed.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("charts/reward")] == [(0, 0.0), (1, 1.0), (2, 12.0), (3, 13.0)]
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(l["iteration"], l["charts/reward"]) for l in lines] == [(0, 0.0), (1, 1.0), (2, 12.0), (3, 13.0)]


def test_a_group_run_on_a_tiny_model_trains_without_a_critic_and_resumes_to_the_same_metrics(tiny_model_dir, tmp_path):
    """The whole loop with --advantage group, horizon 2 and a planner paid by a per-role term
    under `last` credit: no critic metrics, zero-signal groups counted, resume replays iteration 2."""
    profile = tmp_path / "paid_planner.json"
    profile.write_text(json.dumps({"agents": [{"role": "planner", "system_prompt": "Plan.", "rewards": {"no_boxed": 0.5}},
                                              {"role": "solver", "system_prompt": "Solve.", "graded": True}],
                                   "dependencies": [["planner", "solver"]]}))
    common = ["--model", str(tiny_model_dir), "--lora_rank", "2", "--agents", str(profile),
              "--advantage", "group", "--group_size", "2", "--batch_size", "2", "--horizon", "2", "--max_new_tokens", "4",
              "--eval_problems", "2", "--eval_samples", "1", "--no-eval_greedy", "--threads", "1", "--output_dir", str(tmp_path),
              "--lr_schedule", "linear", "--lr_decay_iterations", "4", "--lr_final_ratio", "0.5"]
    marft.train(config.parse_args(common + ["--iterations", "2", "--run_name", "straight"]))
    rows = [json.loads(l) for l in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    # linear over 4 iterations to half the rate: η (0.5 + 0.5 (1 − t/4)) = 2e-4, 1.75e-4 at t = 0, 1; resumed below
    assert [r["charts/lr"] for r in rows[1:]] == pytest.approx([2e-4, 1.75e-4], rel=1e-12)
    assert all("losses/value_loss" not in r and "losses/explained_variance" not in r for r in rows)
    assert all(0 <= r["charts/zero_signal_groups"] <= 1 and r["charts/role_reward/planner"] > 0 for r in rows[1:])
    killed = tmp_path / "killed"  # as a kill -9 after iteration 2's metrics line, before its checkpoint
    shutil.copytree(tmp_path / "straight", killed)
    shutil.rmtree(killed / "checkpoints" / "iter_000002")
    (killed / "checkpoints" / "latest").write_text("iter_000001")
    marft.train(config.parse_args(["--resume", str(killed), "--threads", "1"]))
    strip = lambda folder: [{k: v for k, v in json.loads(l).items() if not k.startswith(("time/", "perf/"))}
                            for l in (folder / "metrics.jsonl").read_text().splitlines()]
    assert json.dumps(strip(killed)) == json.dumps(strip(tmp_path / "straight"))


def test_last_third_mean_of_a_metric_skips_nan_and_rows_without_it():
    nan = float("nan")
    rows = [{"iteration": 0, "eval/accuracy": 0.1}] + [{"iteration": i, "ev": v} for i, v in
                                                       zip(range(1, 10), [9, 9, 9, 9, 9, 9, 0.3, nan, 0.1])]
    rows.append({"iteration": 9, "eval/accuracy": 0.5})  # 9 iterations: the last third is 7, 8, 9
    assert run.last_third_mean(rows, "ev") == pytest.approx((0.3 + 0.1) / 2)
    assert run.last_third_mean(rows, "losses/value_loss") is None  # a run without a critic


# ---------------------------------------------------------------------------------------------
# Options that follow the given ones, and --config
# ---------------------------------------------------------------------------------------------

def test_options_not_given_follow_the_given_ones_and_the_run_records_why(tmp_path, capsys):
    """`--advantage group` alone: G = 4 episodes per problem and `shared` credit (under `last` the
    planner's return is always 0); given values are kept (and checked); config.json says why."""
    cfg = config.parse_args(["--advantage", "group", "--output_dir", str(tmp_path), "--run_name", "g"])
    assert (cfg.group_size, cfg.credit) == (4, "shared")
    assert "--credit shared" in capsys.readouterr().err
    assert config.parse_args(["--advantage", "group", "--group_size", "2", "--credit", "equal"]).credit == "equal"
    single = config.parse_args(["--advantage", "group", "--agents", "single"])  # the recipe's batch baseline needs no G
    assert (single.group_size, single.group_baseline, single.credit) == (1, "batch", "last")
    assert config.parse_args([]).chosen == {}  # the default run: nothing to follow
    run.Run(cfg)
    saved = json.loads((tmp_path / "g" / "config.json").read_text())
    assert saved["chosen/credit"].startswith("shared: ") and "planner" in saved["chosen/credit"]
    assert saved["chosen/group_size"].startswith("4: ")
    assert (config.read_config(tmp_path / "g", "--resume").credit, config.read_config(tmp_path / "g", "--resume").group_size) == ("shared", 4)


def test_no_default_depends_on_the_cpu_and_the_sampler_is_what_the_command_says(monkeypatch, tmp_path):
    """The same command gives the same options on every machine: with or without bf16 instructions
    nothing is chosen, and config.json says what drew the rollouts and how they are weighed."""
    monkeypatch.delenv("MARFT_CPU_PATHS", raising=False)  # the suite may run with the paths off
    for capabilities in ({}, {"avx512_bf16": True}, {"avx512_bf16": False, "amx_bf16": True}, {"bf16": True}):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: capabilities)
        assert config.parse_args([]).chosen == {}
    run.Run(config.parse_args(["--output_dir", str(tmp_path), "--run_name", "exact"]))
    saved = json.loads((tmp_path / "exact" / "config.json").read_text())
    assert saved["rollout/sampler"] == "hf backend (the training model itself): μ = π_old, no correction"
    assert "machine/cpu_paths" not in saved
    run.Run(config.parse_args(["--output_dir", str(tmp_path), "--run_name", "vllm", "--backend", "vllm"]))
    saved = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert saved["rollout/sampler"] == ("vLLM engine (float32 weights): μ ≠ π_old (another implementation or dtype), "
                                        "each decision weighed by min(π_old/μ, 2)")
    monkeypatch.setenv("MARFT_CPU_PATHS", "off")
    for name, value in speed.AVX2_CAPS.items():
        monkeypatch.setenv(name, value)
    run.Run(config.parse_args(["--output_dir", str(tmp_path), "--run_name", "off"]))
    assert json.loads((tmp_path / "off" / "config.json").read_text())["machine/cpu_paths"] == (
        "off (MARFT_CPU_PATHS=off): kernels capped at AVX2")


def test_training_takes_no_nucleus_and_evaluation_still_does(tmp_path, capsys):
    """π_old and π_θ are the full softmax, so a rollout from the nucleus (top_p < 1) would be weighed
    against the wrong policy: training has no --top_p (an old run's config.json with one is refused,
    naming why); evaluate.py keeps --top_p."""
    with pytest.raises(SystemExit):
        config.parse_args(["--top_p", "0.9"])
    older = {**dataclasses.asdict(config.Config()), "top_p": 0.9}
    (tmp_path / "config.json").write_text(json.dumps(older))
    with pytest.raises(SystemExit, match="nucleus .*top_p < 1.* Start a new run without it"):
        config.parse_args(["--config", str(tmp_path / "config.json")])
    older["top_p"] = 1.0  # the value every earlier run had: nothing to honour
    (tmp_path / "config.json").write_text(json.dumps(older))
    assert config.parse_args(["--config", str(tmp_path / "config.json")]).temperature == 1.0
    import evaluate
    assert evaluate.parse_args(["--top_p", "0.9"]).top_p == 0.9
    with pytest.raises(SystemExit, match=r"--top_p=1.5: must lie in \(0, 1\]"):
        evaluate.parse_args(["--top_p", "1.5"])


SINGLE_RECIPE = {"advantage": "group", "group_baseline": "batch", "group_size": 1, "minibatch_size": 16}


def test_an_option_given_beside_the_single_agents_recipe_overrides_only_itself(capsys, tmp_path):
    """--agents single on the math task: 16 problems x 1 episode against the batch's mean in one
    optimiser step (docs/learning-per-minute.md), each option recorded with its reason. An option
    given on the command line replaces only its own value (at e66f9f0 it set the whole recipe aside,
    silently switching the estimator to critic + GAE); a recipe value the given options leave
    without effect (the batch baseline under --advantage gae) steps aside in one line; a --config
    file's options are what its run used; other organisations and tasks keep the global defaults."""
    single = config.parse_args(["--agents", "single"])
    assert {option: getattr(single, option) for option in SINGLE_RECIPE} == SINGLE_RECIPE
    assert set(single.chosen) == set(SINGLE_RECIPE)
    assert single.chosen["group_baseline"] == "batch: the math task's default for --agents single"
    assert single.batch_size == 16 and single.credit == "last"  # one agent: last and shared put R on the same action
    for given, changed in ((["--minibatch_size", "8"], {"minibatch_size": 8}), (["--group_size", "4"], {"group_size": 4})):
        cfg = config.parse_args(["--agents", "single", *given])
        assert {option: getattr(cfg, option) for option in SINGLE_RECIPE} == SINGLE_RECIPE | changed
        assert set(cfg.chosen) == set(SINGLE_RECIPE) - set(changed)
    capsys.readouterr()
    critic = config.parse_args(["--agents", "single", "--advantage", "gae"])
    assert (critic.advantage, critic.group_baseline, critic.minibatch_size) == ("gae", "group", 16)
    assert ("--group_baseline batch (the math task's default for --agents single) steps aside: --advantage gae has no groups"
            in capsys.readouterr().err)
    run.Run(config.parse_args(["--agents", "single", "--advantage", "gae", "--minibatch_size", "8", "--output_dir", str(tmp_path),
                            "--run_name", "old"]))
    older = config.parse_args(["--config", str(tmp_path / "old"), "--run_name", "again"])  # its file gave every option
    assert (older.advantage, older.minibatch_size, older.chosen) == ("gae", 8, {})
    for argv in ([], ["--agents", "chain3"], ["--task", "word", "--agents", "single"], ["--agents", "parallel"]):
        cfg = config.parse_args(argv)
        assert (cfg.advantage, cfg.group_baseline, cfg.minibatch_size) == ("gae", "group", 8)


@pytest.mark.parametrize("argv, message", [
    (["--group_std"], "--group_std=True has no effect here: --advantage gae has no groups"),
    (["--advantage", "group", "--lam", "0.9"], "--lam=0.9 has no effect here: --advantage group builds no critic"),
    (["--advantage", "group", "--value_clip", "0.1"], "--value_clip=0.1 has no effect here"),
    (["--advantage", "group", "--critic_lr", "0.01"], "--critic_lr=0.01 has no effect here"),
    (["--rollout_correction", "mis"], "--rollout_correction='mis' has no effect here: it weighs a rollout drawn by a sampler"),
    (["--vllm_gpu_memory_utilization", "0.5"], "--vllm_gpu_memory_utilization=0.5 has no effect here: it is an option of the vLLM engine"),
    (["--agents", "single", "--happo_ratio_clip", "3"], "--happo_ratio_clip=3.0 has no effect here"),
])
def test_an_option_that_has_no_effect_in_the_chosen_configuration_is_an_error_naming_why(argv, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        config.parse_args(argv)


def test_options_that_do_have_an_effect_are_accepted():
    """The same options where they act: each run's configuration takes them without a word."""
    for argv in (["--advantage", "group", "--group_std"], ["--lam", "0.9", "--critic_lr", "0.01"],
                 ["--backend", "vllm", "--rollout_correction", "mis"], ["--agents", "chain3", "--happo_ratio_clip", "3"],
                 ["--backend", "vllm", "--vllm_gpu_memory_utilization", "0.5"]):
        config.parse_args(argv)


def test_one_agent_gets_the_same_returns_under_last_and_shared_credit():
    """The recipe leaves --credit at last; the stability runs that chose it gave --credit shared."""
    team_reward = torch.tensor([[1.0, 0.0], [0.5, 1.0]])  # [B, T]
    one_action = torch.ones(2, 2, 1, dtype=torch.bool)  # [B, T, P = 1]
    assert torch.equal(ppo.place_team_reward(team_reward, one_action, "last"),
                       ppo.place_team_reward(team_reward, one_action, "shared"))


def test_config_reproduces_a_run_and_the_command_line_overrides_it(tiny_model_dir, tmp_path):
    """`--config runs/a/config.json` starts a new run with every option of run a: its metrics are
    run a's, line for line (time and speed aside). An option given beside it wins."""
    options = ["--model", str(tiny_model_dir), "--lora_rank", "2", "--batch_size", "2",
               "--max_new_tokens", "4", "--eval_problems", "2", "--eval_samples", "1", "--iterations", "2", "--lr", "1e-3",
               "--seed", "7", "--threads", "1", "--output_dir", str(tmp_path), "--run_name", "a"]
    marft.train(config.parse_args(options))
    again = config.parse_args(["--config", str(tmp_path / "a" / "config.json")])
    assert again.run_name == "" and again.seed == 7 and again.lr == 1e-3 and again.config.endswith("config.json")
    marft.train(config.parse_args(["--config", str(tmp_path / "a"), "--run_name", "b"]))
    strip = lambda folder: [{k: v for k, v in json.loads(l).items() if not k.startswith(("time/", "perf/"))}
                            for l in (folder / "metrics.jsonl").read_text().splitlines()]
    assert len(strip(tmp_path / "a")) == 3 and strip(tmp_path / "b") == strip(tmp_path / "a")
    changed = config.parse_args(["--config", str(tmp_path / "a"), "--seed", "8", "--no-eval_greedy"])
    assert (changed.seed, changed.eval_greedy, changed.lr) == (8, False, 1e-3)


@pytest.mark.parametrize("content, words", [(None, "no such file"), ("[1, 2]", "not a JSON object"), ("{oops", "not a config.json"),
                                            ('{"learning_rate": 1}', "does not know: ['learning_rate']")])
def test_a_config_file_that_cannot_be_read_stops_at_start(tmp_path, content, words):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as stop:
        config.parse_args(["--config", str(path)])
    assert words in str(stop.value)


# ---------------------------------------------------------------------------------------------
# A user's mistake: one line naming the option and the fix, before any run folder
# ---------------------------------------------------------------------------------------------

MODEL_FIX = 'give "smollm2" (the embedded SmolLM2-135M-Instruct), a local HF folder holding config.json, a hub id'


@pytest.mark.parametrize("model, why", [("/no/such/path", "no such folder"), ("./no_such_model", "no such folder"),
                                        ("a/b/c", "no such folder"),  # no hub id's shape: a path
                                        ("FILE", "a file, not a model folder"),
                                        ("EMPTY", "the folder holds no config.json")])
def test_a_model_that_is_not_there_stops_at_start_in_one_line(model, why, tmp_path, tiny_model_dir):
    (tmp_path / "weights.bin").write_text("")
    (tmp_path / "empty").mkdir()
    model = {"FILE": str(tmp_path / "weights.bin"), "EMPTY": str(tmp_path / "empty")}.get(model, model)
    with pytest.raises(SystemExit) as stop:
        config.parse_args(["--model", model])
    assert str(stop.value).startswith(f"--model={model!r}: {why}") and MODEL_FIX in str(stop.value)
    assert "\n" not in str(stop.value)
    assert config.parse_args(["--model", str(tiny_model_dir)]).model == str(tiny_model_dir)  # a folder with config.json


def test_a_hub_id_is_taken_from_the_cache_and_otherwise_asked_of_the_hub_in_one_request(tmp_path, monkeypatch):
    """A hub id (owner/name) in the local cache is accepted without a request; one that is not, with
    the hub out of reach (here: the request raises as with no network) or HF_HUB_OFFLINE set, stops
    in one line naming --model, the cache and the fix."""
    import huggingface_hub

    requests = []

    def unreachable(url, timeout=None, **kwargs):
        requests.append(url)
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", unreachable)
    snapshot = tmp_path / "models--owner--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--owner--cached" / "refs").mkdir()
    (tmp_path / "models--owner--cached" / "refs" / "main").write_text("abc123")
    assert config.parse_args(["--model", "owner/cached"]).model == "owner/cached" and requests == []
    with pytest.raises(SystemExit) as stop:
        config.parse_args(["--model", "owner/elsewhere"])
    assert str(stop.value).startswith(f"--model='owner/elsewhere': neither a local folder nor a hub id in the local "
                                      f"Hugging Face cache ({tmp_path}), and https://huggingface.co cannot be reached "
                                      "(OSError: [Errno -2] Name or service not known)")
    assert "hf download owner/elsewhere" in str(stop.value) and MODEL_FIX in str(stop.value)
    assert len(requests) == 1 and requests[0].endswith("owner/elsewhere/resolve/main/config.json")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SystemExit, match=r"^--model='owner/elsewhere': .* and HF_HUB_OFFLINE is set: download it once online"):
        config.parse_args(["--model", "owner/elsewhere"])
    assert len(requests) == 1


def test_a_missing_model_on_the_command_line_is_one_line_and_makes_no_run_folder(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "marft.py"), "--model", "/no/such/path", "--output_dir",
                             str(tmp_path / "runs")], capture_output=True, text=True, cwd=tmp_path)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("[options]")]
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("--model='/no/such/path': no such folder")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv, line", [
    (["--lr_shedule", "cosine"], "unknown option --lr_shedule: did you mean --lr_schedule?"),
    (["--learning_rate", "1e-3"], "unknown option --learning_rate: did you mean --lr?"),  # the initials of its words
    (["--seed", "2", "--no_eval_greedy"], "unknown option --no_eval_greedy: did you mean --no-eval_greedy?"),
    (["--batchsize=4"], "unknown option --batchsize: did you mean --batch_size?"),
    (["--iter", "20"], "unknown option --iter: did you mean --iterations?"),  # no abbreviations: --resume would miss it
    (["--zzz"], "unknown option --zzz: "),
    (["--seed", "2", "stray"], "'stray' follows no option"),
])
def test_an_unknown_option_is_one_line_with_the_nearest_name_and_exit_code_2(argv, line, capsys):
    with pytest.raises(SystemExit) as stop:
        config.parse_args(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and f"error: {line}" in err


@pytest.mark.parametrize("argv, line", [
    (["--kl_coef", "0.1"], "--kl_coef was retired: no KL penalty to the base model (its finding: "
                           "docs/learning-per-minute.md); drop it (commit 716d5c8 still has it)"),
    (["--no-anonymous"], "--anonymous was retired: "),
    (["--level", "token"], "--level was renamed --decision_unit: give --decision_unit token"),
    (["--normalisation=sum"], "--normalisation was renamed --action_logprob: give --action_logprob sum"),
    (["--filter_groups"], "--filter_groups was renamed --skip_zero_signal_groups: give --skip_zero_signal_groups"),
])
def test_an_option_of_an_earlier_version_on_the_command_line_is_one_line_saying_what_became_of_it(argv, line, capsys):
    with pytest.raises(SystemExit) as stop:
        config.parse_args(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and f"error: {line}" in err


def test_an_earlier_versions_config_json_loads_renamed_options_and_stops_only_at_a_retired_one_in_use(tmp_path):
    """A run's config.json from before the renames and retirements (results/**/config.json): renamed
    keys take their new names, retired keys at the value this version reproduces are ignored, and a
    retired key at any other value stops in one line naming it, its value and where its finding lives."""
    older = {**dataclasses.asdict(config.Config()), "level": "token", "normalisation": "sum", "filter_groups": True,
             "advantage": "group", "group_size": 4, "credit": "shared", "kl_coef": 0.0, "lora_alpha": 32.0,
             "update_order": "random", "vllm_dtype": "bfloat16", "gamma_agent": 1.0, "anonymous": False}
    for new in ("decision_unit", "action_logprob", "skip_zero_signal_groups"):
        del older[new]
    (tmp_path / "config.json").write_text(json.dumps(older))
    cfg = config.parse_args(["--config", str(tmp_path / "config.json")])
    assert (cfg.decision_unit, cfg.action_logprob, cfg.skip_zero_signal_groups) == ("token", "sum", True)
    assert config.read_config(tmp_path, "--run").decision_unit == "token"
    for retired, value in (("kl_coef", 0.02), ("update_order", "topological"), ("gamma_agent", 0.9), ("credit", "step_discount")):
        (tmp_path / "config.json").write_text(json.dumps({**older, retired: value}))
        for option in ("--config", "--resume"):
            with pytest.raises(SystemExit) as stop:
                config.parse_args([option, str(tmp_path / ("config.json" if option == "--config" else ""))])
            assert "was retired" in str(stop.value) and "use commit 716d5c8" in str(stop.value)
            assert len(str(stop.value).splitlines()) == 1
    (tmp_path / "config.json").write_text(json.dumps({**older, "kl_coef": 0.02}))
    with pytest.raises(SystemExit, match=re.escape(f"--config {tmp_path / 'config.json'}: kl_coef 0.02 was retired: no KL "
                                                   "penalty to the base model (its finding: docs/learning-per-minute.md); "
                                                   "this version cannot reproduce that run: use commit 716d5c8")):
        config.parse_args(["--config", str(tmp_path / "config.json")])
    assert config.read_config(tmp_path, "--run").decision_unit == "token"  # evaluate.py: a training-only option is no matter
    (tmp_path / "config.json").write_text(json.dumps({**older, "lora_alpha": 8.0}))  # but the adapters' scaling is
    with pytest.raises(SystemExit, match="lora_alpha 8.0 was retired"):
        config.read_config(tmp_path, "--run")


def test_help_groups_the_options_by_the_phases_of_the_algorithm_box(capsys):
    with pytest.raises(SystemExit):
        config.parse_args(["--help"])
    out = capsys.readouterr().out
    titles = ["model & agents:", "task & data:", "1. rollout:", "3. advantages & credit:",
              "4–5. PPO update (policies and critic):", "6. evaluation:", "run, checkpoints & machine:", "speed and memory:"]
    positions = [out.index(f"\n{title}\n") for title in titles]
    assert positions == sorted(positions)
    assert out.index("\n  --decision_unit") > out.index("3. advantages & credit:") > out.index("\n  --backend")
    groups = config.field_groups()
    assert list(groups) == [title.removesuffix(":") for title in titles]
    assert sorted(sum(groups.values(), [])) == sorted(f.name for f in dataclasses.fields(config.Config))


def test_the_options_stay_few():
    # Every option earns its place (a default, a built-in task or a documented result uses it):
    # at most 60. The CPU-specific switch is MARFT_CPU_PATHS, not an option (speed.py).
    assert len(dataclasses.fields(config.Config)) <= 60


def test_an_unknown_name_in_a_config_file_is_named_with_the_nearest_option(tmp_path):
    (tmp_path / "config.json").write_text('{"lr_shedule": "cosine", "seed": 3}')
    with pytest.raises(SystemExit, match=r"does not know: \['lr_shedule'\] \(lr_shedule: did you mean lr_schedule\?\)"):
        config.parse_args(["--config", str(tmp_path / "config.json")])


@pytest.mark.parametrize("argv, left_out", [
    ([], set()),  # math: its data, levels and malformed rows are read
    (["--data", "code"], {"arithmetic_levels"}),  # code: no levels
    (["--task", "word"], {"data", "eval_data", "arithmetic_levels", "skip_malformed_rows"}),
])
def test_a_builtin_tasks_config_json_records_the_options_it_reads_and_reads_back(argv, left_out, tmp_path):
    cfg = config.parse_args([*argv, "--output_dir", str(tmp_path), "--run_name", "r"])
    run.Run(cfg)
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    data_options = {"data", "eval_data", "arithmetic_levels", "skip_malformed_rows"}
    assert data_options - set(saved) == left_out and not left_out & set(saved)
    again = config.parse_args(["--config", str(tmp_path / "r")])
    resumed = config.parse_args(["--resume", str(tmp_path / "r")])
    for option in data_options:
        expected = getattr(config.Config(), option) if option in left_out else getattr(cfg, option)
        assert getattr(again, option) == getattr(resumed, option) == expected, option


def test_the_start_line_says_how_openmps_threads_wait(monkeypatch):
    """What a competing process costs depends on how idle OpenMP threads wait: the line names it."""
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MARFT_SHARED_CPU"):
        monkeypatch.delenv(name, raising=False)
    assert run.threads_line(2).startswith("[threads] 2 torch threads; OpenMP's idle threads spin 300,000 rounds")
    monkeypatch.setenv("GOMP_SPINCOUNT", "3000")
    monkeypatch.setenv("MARFT_SHARED_CPU", "1.78")
    assert run.threads_line(2) == ("[threads] 2 torch threads; OpenMP's idle threads spin 3000 rounds, then sleep "
                                   "(other processes kept 1.78 cores busy at start)")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert run.threads_line(1) == "[threads] 1 torch threads; OpenMP's idle threads OMP_WAIT_POLICY=PASSIVE"


def test_setup_env_chooses_the_short_spin_only_on_a_machine_others_keep_busy(tmp_path):
    """scripts/setup_env.sh measures the cores other processes keep busy over half a second: none
    (this test's machine at rest is not guaranteed, so a busy loop makes it busy) → GOMP_SPINCOUNT=3000."""
    import subprocess
    from conftest import ROOT
    probe = f'. "{ROOT}/scripts/setup_env.sh"; echo "${{GOMP_SPINCOUNT:-none}}"'
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MARFT_VLLM")}
    busy = [subprocess.Popen(["python3", "-c", "while True: pass"]) for _ in range(2)]
    try:
        assert subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True).stdout.split()[-1] == "3000"
    finally:
        for process in busy:
            process.kill()
    env["GOMP_SPINCOUNT"] = "50"  # the user's own choice is kept
    assert subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True).stdout.split()[-1] == "50"
