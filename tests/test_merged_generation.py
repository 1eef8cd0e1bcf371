"""Merged generation (--merged_generation, generation.MergedHFGenerator): each agent's adapter folded
into a scratch copy of the base, W + ΔW, for decoding. The actions and the sampled tokens'
log-probs must be those of the adapter path (float32: within float rounding), for every agent and
for the bare base; a synced update must reach the copy; the training model must stay untouched;
and a training run must log the plain run's metrics. The copy is opt-in on every CPU; its rollout
is corrected (min(π_old/μ, C)) and a copy that misses a sync stops the run."""
import json
import math

import pytest
import torch

import agents
import generation
import marft
import run
from conftest import assert_runs_log_alike
from envs import make_arithmetic_problems
from flex_pomdp import load_organisation, unrolled_messages

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture()
def chain_model(tiny_model_dir):
    """The tiny Llama with the chain's two adapters, each with its own nonzero LoRA weights, and the
    solver's real prompts for four problems."""
    base, tokenizer = agents.load_base_model(str(tiny_model_dir))
    org = load_organisation("chain")
    torch.manual_seed(4)
    model = agents.attach_adapters(base, list(org.order), agents.lora_config(4, 8, TARGETS))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    problems = make_arithmetic_problems("train", seed=1)[:4]
    messages = [unrolled_messages(org, org.order[0], p.problem, {}) for p in problems]
    return model, tokenizer, org, agents.tokenize_prompts(tokenizer, messages, 1024)[0]


def _generate(generator, prompts, adapter, temperature):
    torch.manual_seed(11)
    return generator.generate(prompts, adapter, generation.Sampling(temperature, 1.0, 8))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_merged_generation_gives_the_adapter_paths_actions_and_log_probs(chain_model, temperature):
    model, tokenizer, org, prompts = chain_model
    plain = generation.HFGenerator(model, tokenizer, batch_size=3)
    merged = generation.MergedHFGenerator(model, tokenizer, batch_size=3)
    for adapter in [*org.order, None, org.order[0]]:  # each agent, the bare base, and back (a fresh merge each switch)
        want, got = _generate(plain, prompts, adapter, temperature), _generate(merged, prompts, adapter, temperature)
        assert got.token_ids == want.token_ids, adapter
        for row, (a, b) in enumerate(zip(got.logprobs, want.logprobs)):
            assert a == pytest.approx(b, rel=1e-4, abs=1e-5), (adapter, row)
    # the two agents' adapters really differ here, so the test could tell them apart
    assert _generate(plain, prompts, org.order[0], 1.0).logprobs != _generate(plain, prompts, org.order[1], 1.0).logprobs


def test_an_update_reaches_the_merged_copy_after_sync_and_the_training_model_is_untouched(chain_model):
    model, tokenizer, org, prompts = chain_model
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    grad_flags = {name: p.requires_grad for name, p in model.named_parameters()}
    merged = generation.MergedHFGenerator(model, tokenizer, batch_size=4)
    role = org.order[1]
    _generate(merged, prompts, role, 1.0)
    for name, p in model.named_parameters():  # merging wrote only into the copy
        assert torch.equal(p, before[name]) and p.requires_grad == grad_flags[name], name
    with torch.no_grad():  # an "update" of the solver's adapter
        for name, p in model.named_parameters():
            if "lora_B" in name and f".{role}." in name:
                p.add_(torch.randn_like(p) * 0.3)
    merged.sync(model)
    want = _generate(generation.HFGenerator(model, tokenizer, batch_size=4), prompts, role, 1.0)
    got = _generate(merged, prompts, role, 1.0)
    assert got.token_ids == want.token_ids
    for a, b in zip(got.logprobs, want.logprobs):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)


def test_bfloat16_weights_in_the_copy_decode_within_a_stated_gap_of_the_training_models_log_probs(chain_model):
    """--merged_weight_dtype bfloat16: every linear layer of the copy holds W + ΔW summed in float32
    and rounded once to bfloat16, the rest of the copy stays float32; the sampled tokens' log-probs it
    reports stay within 0.02 nats per token (mean) of the float32 training model's on the same tokens
    (what the PPO update recomputes), and the training model is untouched."""
    model, tokenizer, org, prompts = chain_model
    role = org.order[0]
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    merged = generation.MergedHFGenerator(model, tokenizer, batch_size=4, weight_dtype=torch.bfloat16)
    got = _generate(merged, prompts, role, 1.0)
    lora, plain = merged.pairs[0]
    assert isinstance(plain, generation.LowPrecisionLinear) and plain.weight.dtype == torch.bfloat16
    assert torch.equal(plain.dense_weight(), (lora.get_base_layer().weight + lora.get_delta_weight(role)).to(torch.bfloat16))
    assert merged.scratch.get_output_embeddings().weight.dtype == torch.bfloat16  # the head too
    assert merged.scratch.get_input_embeddings().weight.dtype == torch.float32  # the rest keeps the base's dtype
    gaps = []
    with torch.no_grad(), agents.active_adapter(model, role):
        for prompt, tokens, logprobs in zip(prompts, got.token_ids, got.logprobs):
            logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()  # [P + n, V]
            table = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # [n, V]: each sampled token's distribution
            recomputed = table.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)  # [n]
            gaps += (recomputed - torch.tensor(logprobs)).abs().tolist()
    assert len(gaps) >= 8 and sum(gaps) / len(gaps) < 0.02 and max(gaps) < 0.1
    assert max(gaps) > 0  # the rounding is really there: the copy's products ran in bfloat16
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]) and p.dtype == before[name].dtype, name


@pytest.mark.skipif(not generation.onednn_packing_available(), reason="needs oneDNN's packed weights (an x86 CPU)")
def test_a_bfloat16_weight_in_onednns_layout_gives_the_plain_layouts_products_bit_for_bit():
    """generation.LowPrecisionLinear holds a bfloat16 weight in oneDNN's blocked layout: its output
    equals torch's product with the plain [out, in] weight exactly, for one row, a decoding step's
    16, and a prompt's [3, 88] (the layout was chosen for 16), also after `load` replaces the
    weight (a new merge); `dense_weight` reads back the rounded weight."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 160, bias=True)
    layer = generation.LowPrecisionLinear(linear, torch.bfloat16)
    assert layer.packed and layer.weight.layout == torch._mkldnn
    for weight in (linear.weight.detach(), torch.randn(160, 96)):
        layer.load(weight)
        rounded = weight.to(torch.bfloat16)
        assert torch.equal(layer.dense_weight(), rounded)
        for shape in ((1, 1, 96), (16, 1, 96), (3, 88, 96)):
            x = torch.randn(shape)
            plain = torch.nn.functional.linear(x.to(torch.bfloat16), rounded).float() + linear.bias.detach()
            assert torch.equal(layer(x), plain), shape


def test_training_iterations_with_and_without_merged_generation_log_the_same_metrics(tiny_model_dir, tmp_path,
                                                                                  varied_rewards):
    """Two iterations of the chain on the tiny model, critic + GAE: the same sampled tokens, so every
    PPO number (rewards, losses, KL, values) and the held-out accuracy agree to float rounding."""
    common = ["--model", str(tiny_model_dir), "--lora_rank", "2", "--agents", "chain", "--batch_size", "3", "--iterations", "2", "--max_new_tokens", "5",
              "--eval_problems", "2", "--eval_samples", "1", "--threads", "1", "--output_dir", str(tmp_path)]
    for name, flag in (("plain", "--no-merged_generation"), ("merged", "--merged_generation")):
        marft.train(run.parse_args(common + [flag, "--run_name", name]))
    plain = assert_runs_log_alike(tmp_path / "plain", tmp_path / "merged", lines=3,
                                  loose=("rollout/",))  # μ's distance from π_old is rounding itself
    assert plain[-1]["losses/value_loss"] > 0


@pytest.fixture(scope="module")
def peaked_llama(tmp_path_factory):
    """A 2-layer, 64-wide Llama whose weights of std 0.5 make its next-token distributions peaked
    (the tiny model's are nearly uniform, where an update hardly moves a log-prob)."""
    from conftest import save_tiny_llama
    return save_tiny_llama(tmp_path_factory.mktemp("peaked-llama"), hidden_size=64, head_dim=32, initializer_range=0.5)


class StaleCopy(generation.MergedHFGenerator):
    """Merges each agent's adapter as it was when the copy was built: the syncs never reach it."""

    def __init__(self, model, *args, **kwargs):
        super().__init__(model, *args, **kwargs)
        self.first = {a: [p.detach().clone() for p in agents.adapter_parameters(model, a)] for a in model.peft_config}

    def merge(self, adapter):
        if adapter is None or self.merged == adapter:
            return super().merge(adapter)
        with marft.adapter_weights(self.model, adapter, self.first[adapter]):
            super().merge(adapter)


def short_run(model_dir, tmp_path, name, *options):
    return run.parse_args(["--model", str(model_dir), "--lora_rank", "2", "--batch_size", "4", "--iterations", "3", "--max_new_tokens", "6", "--eval_problems", "2",
                           "--eval_samples", "1", "--eval_interval", "0", "--threads", "1", "--output_dir", str(tmp_path),
                           "--run_name", name, *options])


def test_the_bf16_copy_is_opt_in_on_every_cpu_and_its_rollout_is_corrected_and_measured(peaked_llama, tmp_path, monkeypatch,
                                                                                         varied_rewards):
    """No CPU makes the bf16 copy the default (whatever its instructions); asked for, it samples μ ≠ π_old,
    so the run weighs each decision by min(π_old/μ, 2) and logs μ's distance per token, and the check
    after every sync finds the copy serving the updated adapters (β of the stale check near 0)."""
    for capabilities in ({}, {"avx512_bf16": True}, {"amx_bf16": True}):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: capabilities)
        cfg = run.parse_args([])
        assert (cfg.merged_generation, cfg.merged_weight_dtype, cfg.chosen) == (False, "", {})
    cfg = short_run(peaked_llama, tmp_path, "bf16", "--merged_generation", "--merged_weight_dtype", "bfloat16", "--lr", "0.003")
    marft.train(cfg)
    rows = [json.loads(line) for line in (tmp_path / "bf16" / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in rows if row["iteration"] > 0]
    for row in trained:
        assert 0 < row["rollout/logprob_abs_diff"] < 0.5  # the copy's bf16 rounding, per token
        assert row["rollout/max_abs_diff"] >= row["rollout/logprob_abs_diff"] and row["rollout/kl_sampler_old"] >= 0
        assert 0 <= row["rollout/beyond_cap"] <= 1
    for row in trained[1:]:  # after a sync: both agents moved (the varied rewards), and the copy serves their new adapters
        assert set(k for k in row if k.startswith("rollout/stale_share/")) == {"rollout/stale_share/planner",
                                                                             "rollout/stale_share/solver"}
        assert all(abs(row[f"rollout/stale_share/{role}"]) < 0.5 for role in ("planner", "solver"))


def test_a_sampler_that_keeps_serving_the_old_adapter_stops_the_run_with_one_line_naming_agent_and_backend(
        peaked_llama, tmp_path, monkeypatch, varied_rewards):
    """A merged copy whose sync never reaches it (the failure other frameworks' users meet: rollouts
    that silently keep sampling the initial policy) is caught at the rollout after the first update."""
    monkeypatch.setattr(generation, "MergedHFGenerator", StaleCopy)
    cfg = short_run(peaked_llama, tmp_path, "stale", "--merged_generation", "--lr", "0.003")
    with pytest.raises(SystemExit, match=r"stale sampler: the hf backend's merged copy \(float32 weights\) still serves "
                                         r"agent '(planner|solver)' as it was before the update of iteration 1"):
        marft.train(cfg)
    assert (tmp_path / "stale" / "checkpoints" / "iter_000001").is_dir()  # what was written stays


def test_a_bf16_copy_that_lags_by_rounding_is_said_once_and_weighed_not_stopped(peaked_llama, tmp_path, monkeypatch, capsys,
                                                                                varied_rewards):
    """Rounded to bf16, W + ΔW drops an update below half a unit in the last place of W: the copy
    lags with its sync intact (the default run's late, small updates). A lagging bf16 copy (here: one
    that never takes an update) is said once per agent and the run goes on, corrected."""
    marft.LAGGING.clear()
    monkeypatch.setattr(generation, "MergedHFGenerator", StaleCopy)
    marft.train(short_run(peaked_llama, tmp_path, "lags", "--merged_generation", "--merged_weight_dtype", "bfloat16",
                          "--lr", "0.005"))  # updates large enough that both agents' lag is measured
    out = capsys.readouterr().out
    assert out.count("[rollout] the bf16 merged copy misses") == 2  # once per agent, though it lagged at iterations 2 and 3
    rows = [json.loads(line) for line in (tmp_path / "lags" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["rollout/stale_share/solver"] > 0.5 and rows[-1]["rollout/beyond_cap"] >= 0
    assert marft.lags_by_rounding(run.parse_args(["--merged_generation", "--merged_weight_dtype", "bfloat16"]))
    assert not marft.lags_by_rounding(run.parse_args(["--merged_generation"]))
    assert not marft.lags_by_rounding(run.parse_args(["--backend", "vllm"]))


def test_the_exact_path_is_not_weighed_and_its_sampler_matches_the_training_model(tiny_model_dir, tmp_path):
    """The default hf backend samples from the training model itself: μ = π_old up to the rounding of
    another batch shape, so no decision is beyond the cap and the weights are 1 exactly."""
    cfg = short_run(tiny_model_dir, tmp_path, "exact")
    job_backend = generation.make_backend(cfg, *agents.build_model(cfg, ["policy_planner", "policy_solver"]),
                                          ["policy_planner", "policy_solver"], tmp_path)
    assert job_backend.exact
    marft.train(cfg)
    rows = [json.loads(line) for line in (tmp_path / "exact" / "metrics.jsonl").read_text().splitlines()]
    for row in rows[1:]:
        assert row["rollout/logprob_abs_diff"] < 1e-4 and row["rollout/beyond_cap"] == 0.0
        assert not any(k.startswith("rollout/stale_share/") for k in row)


def test_on_a_cpu_whose_onednn_has_no_bf16_the_copy_keeps_the_plain_layout(monkeypatch):
    """oneDNN refuses to pack a bf16 weight on a CPU without AVX-512 (an AVX2 laptop or runner, where
    --merged_weight_dtype bfloat16 is still allowed): there the layer keeps the plain layout and
    gives torch's product."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert not generation.onednn_packing_available()
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 160, bias=False)
    layer = generation.LowPrecisionLinear(linear, torch.bfloat16)
    assert not layer.packed and layer.weight.layout == torch.strided
    x = torch.randn(4, 96)
    assert torch.equal(layer(x), torch.nn.functional.linear(x.to(torch.bfloat16), linear.weight.to(torch.bfloat16)).float())
