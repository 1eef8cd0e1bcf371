"""Data parallelism under torchrun (distributed.py), tested on CPU with gloo and 2 processes.

The scripted backend (tests/scripted.py) proposes the same responses whatever the rank or the
sampling noise, so a 1-process run and a 2-rank run train on the same rollouts: their weights
after each update must agree to float rounding (1e-6), the ranks' weights must be identical,
and only rank 0 may write. What this proves: the arithmetic of the split (each rank's share of a
minibatch's loss, gradients summed over ranks, merged rollouts, reduced statistics), lockstep and
rank-0 I/O. What it cannot prove: NCCL, GPUs, several nodes, speed."""
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import config as config_lib
import distributed
import generation
import marft
import run as run_lib
from envs import Grader, make_arithmetic_problems
from flex_pomdp import load_organisation
from rollout import merge_rollouts, play_episodes
from scripted import ScriptedTeam

ROOT = Path(__file__).resolve().parents[1]


def tiny_options(model_dir, out, name, *extra):
    return ["--model", str(model_dir), "--lora_rank", "2", "--batch_size", "4",
            "--max_new_tokens", "16", "--eval_problems", "3", "--eval_samples", "1", "--eval_interval", "1",
            "--threads", "1", "--output_dir", str(out), "--run_name", name, *extra]


def torchrun(options, timeout=300, env=None):
    """2 gloo ranks of tests/distributed_worker.py; fails the test with their output when they fail."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(ROOT / "tests" / "distributed_worker.py"), *options],
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def metrics_rows(folder):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))}
            for line in (folder / "metrics.jsonl").read_text().splitlines()]


def trained_weights(folder):
    """Every adapter's and value head's weights of a checkpoint, by file and tensor name."""
    from safetensors.torch import load_file
    weights = {}
    for file in sorted(folder.rglob("*")):
        if file.suffix == ".safetensors":
            weights |= {f"{file.parent.name}/{k}": v for k, v in load_file(file).items()}
        elif file.name == "value_heads.pt":
            weights |= {f"value_heads/{k}": v for k, v in torch.load(file).items()}
    return weights


def assert_close_weights(a, b, tolerance=1e-6):
    assert a.keys() == b.keys() and a
    for key in a:
        assert (a[key] - b[key]).abs().max().item() <= tolerance, key


@pytest.mark.parametrize("agents_option", ["chain", "orchestrated"])
def test_merged_rank_parts_are_the_rollout_one_process_plays(tiny_model_dir, agents_option):
    """7 problems over 3 ranks (3, 2, 2 episodes), 2 steps: every field of the merged rollout, sample
    order included, equals the rollout of one process."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    org, team = load_organisation(agents_option), ScriptedTeam(tokenizer)
    cfg = config_lib.Config(agents=agents_option, horizon=2)
    problems = make_arithmetic_problems("train", seed=1, levels=(1, 3))[:7]
    sampling = generation.Sampling(1.0, 1.0, 16)
    with Grader() as grader:
        whole = play_episodes(team.generate, tokenizer, org, problems, grader, sampling, cfg)
        parts = [play_episodes(team.generate, tokenizer, org, problems[r::3], grader, sampling, cfg) for r in range(3)]
    merged = merge_rollouts(parts)
    for name, value in vars(whole).items():
        if name == "generation_seconds":
            continue
        other = getattr(merged, name)
        assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, name


@pytest.mark.slow
def test_two_ranks_take_the_one_process_steps_write_once_and_resume(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(generation, "make_backend", lambda cfg, model, tokenizer, *args, **kwargs: ScriptedTeam(tokenizer))
    options = lambda name: tiny_options(tiny_model_dir, tmp_path, name, "--iterations", "2")
    marft.train(config_lib.parse_args(options("one")))
    torchrun(options("two"))  # exits 3 unless both ranks hold identical weights after 2 iterations
    one, two = tmp_path / "one", tmp_path / "two"
    # The same update of every adapter and of the critic (adapter + value head), iteration after iteration.
    for checkpoint in ("iter_000001", "iter_000002"):
        assert_close_weights(trained_weights(one / "checkpoints" / checkpoint), trained_weights(two / "checkpoints" / checkpoint))
    # Only rank 0 wrote: the same files as one process, one metrics line per iteration.
    files = lambda folder: sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if "tensorboard" not in p.parts)
    assert files(one) == files(two)
    rows_one, rows_two = metrics_rows(one), metrics_rows(two)
    assert [r["iteration"] for r in rows_two] == [0, 1, 2]
    for a, b in zip(rows_one, rows_two):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5, nan_ok=True), key  # float noise of other batch shapes
    # kill -9 after iteration 2's metrics line, before its checkpoint; resumed on 2 ranks.
    killed = tmp_path / "killed"
    shutil.copytree(two, killed)
    shutil.rmtree(killed / "checkpoints" / "iter_000002")
    (killed / "checkpoints" / "latest").write_text("iter_000001")
    torchrun(["--resume", str(killed), "--threads", "1"])
    assert json.dumps(metrics_rows(killed)) == json.dumps(rows_two)
    assert_close_weights(trained_weights(killed / "checkpoints" / "iter_000002"), trained_weights(two / "checkpoints" / "iter_000002"), 0.0)


@pytest.mark.slow
def test_unequal_ranks_and_an_early_stop_finish_without_a_hang(tiny_model_dir, tmp_path, monkeypatch):
    """3 problems on 2 ranks (2 and 1 episodes), minibatches of 2 (the last one gives rank 1 no row),
    and a KL bound that stops every agent after its first step: the run ends, as one process's does."""
    monkeypatch.setattr(generation, "make_backend", lambda cfg, model, tokenizer, *args, **kwargs: ScriptedTeam(tokenizer))
    options = lambda name: tiny_options(tiny_model_dir, tmp_path, name, "--iterations", "1", "--batch_size", "3",
                                        "--minibatch_size", "2", "--ppo_epochs", "2", "--target_kl", "1e-9")
    marft.train(config_lib.parse_args(options("one")))
    torchrun(options("two"), timeout=240)
    one, two = metrics_rows(tmp_path / "one")[1], metrics_rows(tmp_path / "two")[1]
    assert one["losses/early_stopped/planner"] == two["losses/early_stopped/planner"] == 1.0
    assert one["losses/early_stopped/solver"] == two["losses/early_stopped/solver"] == 1.0
    assert_close_weights(trained_weights(tmp_path / "one" / "checkpoints" / "iter_000001"),
                         trained_weights(tmp_path / "two" / "checkpoints" / "iter_000001"))


def test_every_run_seed_and_rank_starts_its_own_sampling_stream(monkeypatch):
    """An iteration seeds torch from (run seed, iteration) (run.seed_iteration), then rank r
    re-seeds its sampling noise (distributed.reseed_sampling). For run seeds 0…50, iterations
    0…2 and ranks 0…7 every (seed, iteration, rank) starts from a torch seed of its own; rank 0
    keeps the iteration's seed (a 1-rank run samples as a plain process); and rank r of seed s is
    not rank 0 of seed s + r, which a re-seed by a multiple of the rank made it."""
    started = {}
    python_state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        for r in range(8):
            monkeypatch.setattr(distributed, "rank", lambda r=r: r)
            for s in range(51):
                for k in range(3):
                    run_lib.seed_iteration(s, k)
                    iteration_seed = torch.initial_seed()
                    distributed.reseed_sampling()
                    started[s, k, r] = torch.initial_seed()
                    assert r > 0 or started[s, k, r] == iteration_seed
    random.setstate(python_state)
    assert len(set(started.values())) == len(started) == 51 * 3 * 8
    assert all(started[s, k, r] != started[s + r, k, 0] for s, k, r in started if 0 < r and s + r <= 50)


def test_rank_seeds_of_other_ranks_lie_above_every_rank_0_seed():
    """distributed.rank_seed: the identity on rank 0; on ranks 1…7 of seeds 0…50, 51 · 7 distinct
    seeds in [2^62, 2^63), where no seed a run gives rank 0 lies, so no rank's stream is another
    seed's rank-0 stream."""
    assert [distributed.rank_seed(s, 0) for s in (0, 1, 50, 2**62 - 1)] == [0, 1, 50, 2**62 - 1]
    others = [distributed.rank_seed(s, r) for s in range(51) for r in range(1, 8)]
    assert len(set(others)) == len(others) and all(2**62 <= seed < 2**63 for seed in others)
