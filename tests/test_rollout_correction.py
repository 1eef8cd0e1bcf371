"""A sampler μ other than the training model (vLLM; here a test backend on a copy of the model): its
rollout is weighed against π_old by min(π_old/μ, C), μ's distance per token is logged (rollout/*),
and a sampler that keeps serving an adapter from before an update stops the run with one line. The
default hf backend samples from the training model itself and is not weighed."""
import copy
import json

import pytest
import torch

import agents
import config
import generation
import marft


@pytest.fixture(scope="module")
def peaked_llama(tmp_path_factory):
    """A 2-layer, 64-wide Llama whose weights of std 0.5 make its next-token distributions peaked
    (the tiny model's are nearly uniform, where an update hardly moves a log-prob)."""
    from conftest import save_tiny_llama
    return save_tiny_llama(tmp_path_factory.mktemp("peaked-llama"), hidden_size=64, head_dim=32, initializer_range=0.5)


class CopySampler(generation.HFGenerator):
    """A sampler that is not the training model: the hf backend on a copy of it, whose adapters each
    sync copies in rounded to bfloat16 (so μ ≠ π_old by the rounding), or never after the first
    (`stale`: the failure other frameworks' users meet, rollouts that keep sampling the initial policy)."""

    exact = False
    description = "test copy"

    def __init__(self, model, tokenizer, stale: bool = False):
        super().__init__(copy.deepcopy(model), tokenizer, batch_size=64)
        self.stale, self.synced = stale, False
        self.sync(model)

    def sync(self, model) -> None:
        if self.stale and self.synced:
            return
        with torch.no_grad():
            for (name, theirs), ours in zip(model.named_parameters(), self.model.parameters()):
                if "lora_" in name:
                    ours.copy_(theirs.to(torch.bfloat16).float())
        self.synced = True


def short_run(model_dir, tmp_path, name, *options):
    return config.parse_args(["--model", str(model_dir), "--lora_rank", "2", "--batch_size", "4", "--iterations", "3",
                           "--max_new_tokens", "6", "--eval_problems", "2", "--eval_samples", "1", "--eval_interval", "0",
                           "--threads", "1", "--output_dir", str(tmp_path), "--run_name", name, *options])


def with_sampler(monkeypatch, stale: bool = False) -> None:
    monkeypatch.setattr(generation, "make_backend",
                        lambda cfg, model, tokenizer, *args, **kwargs: CopySampler(model, tokenizer, stale))


def metrics(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_a_sampler_other_than_the_training_model_is_corrected_and_measured(peaked_llama, tmp_path, monkeypatch, varied_rewards):
    """Its rollout samples μ ≠ π_old: the run weighs each decision by min(π_old/μ, 2), logs μ's
    distance per token, and the check after every sync finds the sampler serving the updated
    adapters (the stale share of each updated agent near 0). Rewards vary with the response
    (conftest.varied_rewards), so every agent has a signal and moves."""
    with_sampler(monkeypatch)
    marft.train(short_run(peaked_llama, tmp_path, "copy", "--lr", "0.003"))
    trained = [row for row in metrics(tmp_path / "copy") if row["iteration"] > 0]
    for row in trained:
        assert 0 < row["rollout/logprob_abs_diff"] < 0.5  # the copy's bf16 rounding, per token
        assert row["rollout/max_abs_diff"] >= row["rollout/logprob_abs_diff"] and row["rollout/kl_sampler_old"] >= 0
        assert 0 <= row["rollout/beyond_cap"] <= 1
    for row in trained[1:]:  # after a sync: both agents moved, and the sampler serves their new adapters
        shares = {k: v for k, v in row.items() if k.startswith("rollout/stale_share/")}
        assert set(shares) == {"rollout/stale_share/planner", "rollout/stale_share/solver"}
        assert all(abs(v) < 0.5 for v in shares.values())


def test_a_sampler_that_keeps_serving_the_old_adapter_stops_the_run_with_one_line_naming_agent_and_backend(
        peaked_llama, tmp_path, monkeypatch, varied_rewards):
    """Caught at the rollout after the first update; what was written stays."""
    with_sampler(monkeypatch, stale=True)
    with pytest.raises(SystemExit, match=r"stale sampler: the test copy still serves agent '(planner|solver)' as it was "
                                         r"before the update of iteration 1"):
        marft.train(short_run(peaked_llama, tmp_path, "stale", "--lr", "0.003"))
    assert (tmp_path / "stale" / "checkpoints" / "iter_000001").is_dir()


def test_the_exact_path_is_not_weighed_and_its_sampler_matches_the_training_model(tiny_model_dir, tmp_path):
    """The default hf backend samples from the training model itself: μ = π_old up to the rounding of
    another batch shape, so no decision is beyond the cap and no stale check runs."""
    cfg = short_run(tiny_model_dir, tmp_path, "exact")
    backend = generation.make_backend(cfg, *agents.build_model(cfg, ["policy_planner", "policy_solver"]),
                                      ["policy_planner", "policy_solver"], tmp_path)
    assert backend.exact
    marft.train(cfg)
    for row in metrics(tmp_path / "exact")[1:]:
        assert row["rollout/logprob_abs_diff"] < 1e-4 and row["rollout/beyond_cap"] == 0.0
        assert not any(k.startswith("rollout/stale_share/") for k in row)
