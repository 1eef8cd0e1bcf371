"""The GPU paths. What only a GPU can show (`on_a_gpu`: marked gpu, skipped without CUDA;
scripts/gpu_check.sh runs them): the model and every trainable state on the rank's GPU in the
dtypes the README promises, the log-probs training recomputes against those generation recorded,
prefix sharing on CUDA's attention kernels, the collectives under NCCL. What a CPU can check of
them (run everywhere): log-probs from float32 logits under a bfloat16 base (agents.float32_head,
on the CPU and, marked, on CUDA), the options a GPU gets (config.device_choices, CUDA mocked), and
the GPU check's decoding floor (scripts/gpu_check.py) by hand. The rest of the CPU side is
tests/test_devices.py."""
import importlib.util
import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import agents
import config as config_lib
import critic
import distributed
import generation
import run as run_lib

MODEL = "random:models/smollm2-135m.json"
ON_A_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def on_a_gpu(test):
    """A test that needs a CUDA GPU: marked gpu (what scripts/gpu_check.sh selects), skipped without one."""
    for mark in ON_A_GPU:
        test = mark(test)
    return test


def config(tmp_path, *extra):
    return config_lib.parse_args(["--model", MODEL, "--device", "cuda", "--lora_rank", "4", "--batch_size", "2",
                               "--max_new_tokens", "8", "--eval_problems", "2", "--eval_samples", "1", "--iterations", "1",
                               "--output_dir", str(tmp_path), "--run_name", "gpu", *extra])


def chat_prompts(tokenizer, n=6):
    return [tokenizer.apply_chat_template([{"role": "user", "content": f"What is {k} + {2 * k + 1}? Think, then answer."}],
                                          add_generation_prompt=True, tokenize=True, return_dict=False) for k in range(n)]


def nudge_adapter(model, adapter, seed=0):
    """LoRA B starts at 0 (the adapter is the base model): give it weights, so the adapter's path counts."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name and f".{adapter}." in name:
                p.copy_(torch.randn(p.shape, generator=generator).to(p) * 0.02)


@on_a_gpu
def test_the_base_is_bfloat16_on_the_gpu_and_every_trainable_state_float32_there(tmp_path):
    cfg = config(tmp_path, "--base_dtype", "bfloat16")
    assert distributed.init(cfg.device) == "cuda:0" and torch.cuda.current_device() == 0
    org, model, tokenizer, heads, optimisers = run_lib.build(cfg)
    frozen = [p for n, p in model.named_parameters() if "lora_" not in n]
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    assert frozen and all(p.dtype == torch.bfloat16 and p.device == torch.device("cuda:0") for p in frozen)
    assert lora and all(p.dtype == torch.float32 and p.device == torch.device("cuda:0") for p in lora)
    assert all(p.dtype == torch.float32 and p.device == torch.device("cuda:0") for p in heads.parameters())
    prompts = chat_prompts(tokenizer, 3)
    responses = [[10, 11, 12], [13, 14], [15]]
    logprob = agents.policy_logprobs(model, prompts, responses, "policy_solver", 2, "action", "sum", 1.0).logprob
    values = critic.decision_values(model, heads, "critic", prompts, responses, 2, "action")
    assert logprob.device.type == "cpu" and values.device.type == "cpu"  # the trainer's tables live on the CPU
    (logprob.sum() + values.sum()).backward()
    for adapter in ("policy_solver", "critic"):
        optimisers[adapter].step()
        states = list(optimisers[adapter].state.values())
        assert states and all(s["exp_avg"].dtype == torch.float32 and s["exp_avg"].device.type == "cuda" for s in states)


@on_a_gpu
@pytest.mark.parametrize("base_dtype, bound", [("float32", 2e-3), ("bfloat16", 5e-2)])
def test_training_recomputes_the_log_probs_generation_recorded(tmp_path, base_dtype, bound):
    """The hf backend records log p of each sampled token while generating (KV cache, left padding,
    a shared prefix); training recomputes them in one right-padded pass. On the GPU the kernels
    differ between the two: the gap per token must stay within `bound` (float32: rounding only;
    bfloat16: the base's rounding, which the rollout_logprob_gap metric reports in a run)."""
    cfg = config(tmp_path, "--base_dtype", base_dtype)
    torch.manual_seed(0)
    model, tokenizer = agents.build_model(cfg, ["policy_solver"])
    nudge_adapter(model, "policy_solver")
    prompts = chat_prompts(tokenizer)
    actions = generation.generate(model, tokenizer, prompts, "policy_solver", generation.Sampling(1.0, 1.0, 12), batch_size=6)
    with torch.no_grad():
        recomputed, _, mask = agents.token_logprobs(model, prompts, actions.token_ids, "policy_solver",
                                                    tokenizer.pad_token_id, 1.0)
    gaps = [abs(recomputed[row, k].item() - lp) for row, lps in enumerate(actions.logprobs) for k, lp in enumerate(lps)]
    assert gaps and max(gaps) < bound, (max(gaps), sum(gaps) / len(gaps))


@on_a_gpu
def test_prefix_sharing_gives_the_plain_pass_numbers_on_cuda_kernels(tmp_path):
    """Log-probs, values and the gradient with the shared prefix run once equal the plain pass
    (float32 base) to 1e-4: the CUDA attention path keeps causal masking over the cached prefix."""
    cfg = config(tmp_path, "--base_dtype", "float32")  # given: a GPU's own choice is bfloat16 (config.device_choices)
    org, model, tokenizer, heads, _ = run_lib.build(cfg)
    nudge_adapter(model, "policy_solver")
    prompts = chat_prompts(tokenizer)
    responses = [[10 + k, 20 + k, 30 + k][: 1 + k % 3] for k in range(len(prompts))]
    out = {}
    for shared in (True, False):
        model.zero_grad(set_to_none=True)
        policy = agents.policy_logprobs(model, prompts, responses, "policy_solver", 2, "token", "sum", 1.0, shared)
        values = critic.decision_values(model, heads, "critic", prompts, responses, 2, "token", shared)
        policy.logprob.sum().backward()
        grads = torch.cat([p.grad.flatten() for p in agents.adapter_parameters(model, "policy_solver") if p.grad is not None])
        out[shared] = (policy.logprob.detach(), values.detach(), grads.cpu())
    for a, b in zip(out[True], out[False]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.fixture
def one_rank_nccl_group():
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60),
                            device_id=torch.device("cuda:0"))
    yield
    dist.destroy_process_group()


@on_a_gpu
def test_nccl_collectives_take_cpu_tables_and_give_them_back_on_the_cpu(one_rank_nccl_group):
    """NCCL reduces only GPU tensors: the helper carries the trainer's CPU tables to the GPU and
    back into the same tensor; a GPU tensor is reduced where it is."""
    assert distributed.backend_device() == torch.device("cuda", 0)
    table = torch.arange(6, dtype=torch.float32).view(2, 3)
    assert distributed.sum_(table) is table and table.device.type == "cpu" and table.tolist() == [[0, 1, 2], [3, 4, 5]]
    on_gpu = torch.ones(3, device="cuda")
    assert distributed.sum_(on_gpu) is on_gpu and on_gpu.device.type == "cuda"
    assert distributed.all_ranks(True) and not distributed.all_ranks(False)
    assert distributed.max_int(5) == 5


# ---------------------------------------------------------------------------------------------
# Log-probs from float32 logits under a bfloat16 base (agents.float32_head)
# ---------------------------------------------------------------------------------------------

DEVICES = ["cpu", pytest.param("cuda", marks=ON_A_GPU)]


def tiny_policy(model_dir, tmp_path, device, base_dtype):
    """The tiny Llama in `base_dtype` on `device` with one float32 adapter of nonzero B."""
    cfg = config_lib.parse_args(["--model", str(model_dir), "--device", device, "--base_dtype", base_dtype, "--lora_rank", "2",
                              "--output_dir", str(tmp_path), "--run_name", "tiny"])
    model, tokenizer = agents.build_model(cfg, ["policy_solver"])
    nudge_adapter(model, "policy_solver")
    return model, tokenizer


def head_weight(model) -> torch.Tensor:
    return agents.backbone(model).get_output_embeddings().weight  # [V, H], tied to the input embedding here


def picked(log_probs: torch.Tensor, responses: list[list[int]]) -> torch.Tensor:
    """log π of each response token from log-softmaxed logits [n, L, V], 0 past a row's end: [n, L]."""
    longest = log_probs.shape[1]
    targets = torch.tensor([r + [0] * (longest - len(r)) for r in responses], device=log_probs.device)
    mask = torch.tensor([[k < len(r) for k in range(longest)] for r in responses], device=log_probs.device)
    return log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * mask


@pytest.mark.parametrize("device", DEVICES)
def test_a_bfloat16_base_s_training_log_probs_come_from_float32_logits(tiny_model_dir, tmp_path, device):
    """log π = log_softmax(h Wᵀ / T) with the bf16 last hidden state h and the bf16 head W both cast
    to float32 for the product: the log-probs and the LoRA gradient equal that computation from the
    same hidden states (forward_responses' "hidden"), and differ from the old path, whose bf16 head
    rounded h Wᵀ to bf16 before the cast."""
    model, tokenizer = tiny_policy(tiny_model_dir, tmp_path, device, "bfloat16")
    prompts, T = chat_prompts(tokenizer, 4), 0.7
    responses = [[10, 11, 12, 13], [14, 15], [16], [17, 18, 19]]
    pad = tokenizer.pad_token_id
    out = {}
    for path in ("marft", "float32 by hand"):
        model.zero_grad(set_to_none=True)
        if path == "marft":
            logprob = agents.token_logprobs(model, prompts, responses, "policy_solver", pad, T)[0]
        else:
            with agents.active_adapter(model, "policy_solver"):
                hidden = agents.forward_responses(model, prompts, responses, pad, "hidden")  # [n, L, H]
            assert hidden.dtype == torch.bfloat16 and head_weight(model).dtype == torch.bfloat16
            logits = F.linear(hidden.float(), head_weight(model).float())  # [n, L, V]
            logprob = picked(torch.log_softmax(logits / T, dim=-1), responses).cpu()
            with torch.no_grad():
                old = picked(torch.log_softmax(F.linear(hidden, head_weight(model)).float() / T, dim=-1), responses).cpu()
        logprob.sum().backward()
        grads = torch.cat([p.grad.flatten() for p in agents.adapter_parameters(model, "policy_solver")]).cpu()
        out[path] = (logprob.detach(), grads)
    (marft_logprob, marft_grads), (hand_logprob, hand_grads) = out["marft"], out["float32 by hand"]
    torch.testing.assert_close(marft_logprob, hand_logprob, rtol=0, atol=1e-6)
    # the same gradient: to float rounding on the CPU; on CUDA the bf16 base's backward (its attention
    # kernels add in an order of their own) rounds at bf16's 2^-8 from one pass to the next
    bound = 1e-5 if device == "cpu" else 2e-2
    assert hand_grads.norm() > 0 and (marft_grads - hand_grads).norm() <= bound * hand_grads.norm()
    assert (marft_logprob - old).abs().max() > 1e-4  # the bf16 rounding of the logits that is gone


def test_a_float32_base_s_log_probs_are_its_head_s_own_bit_for_bit(tiny_model_dir, tmp_path):
    """A float32 head runs untouched (no cast, no patched forward): the log-probs are exactly
    log_softmax(h Wᵀ / T) of the model's own float32 product."""
    model, tokenizer = tiny_policy(tiny_model_dir, tmp_path, "cpu", "float32")
    prompts, T = chat_prompts(tokenizer, 3), 0.7
    responses = [[10, 11, 12], [13, 14], [15]]
    with torch.no_grad():
        logprob = agents.token_logprobs(model, prompts, responses, "policy_solver", tokenizer.pad_token_id, T)[0]
        with agents.active_adapter(model, "policy_solver"):
            hidden = agents.forward_responses(model, prompts, responses, tokenizer.pad_token_id, "hidden")
    expected = picked(torch.log_softmax(F.linear(hidden, head_weight(model)) / T, dim=-1), responses)
    assert torch.equal(logprob, expected)
    head = agents.backbone(model).get_output_embeddings()
    with agents.float32_head(agents.backbone(model)):
        assert "forward" not in vars(head)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("base_dtype", ["bfloat16", "float32"])
def test_the_sampler_records_log_probs_of_float32_logits(tiny_model_dir, tmp_path, device, base_dtype):
    """generation.decode: each step's recorded log-prob is log_softmax(h Wᵀ / T)[token] with the
    hidden state h the head received at that step (caught by a hook) and W in float32: within 1e-6
    (and, for a bf16 base, not the bf16 product's). A float32 base's head is its own product, which
    torch's CPU library may round differently for a copy of h at another address."""
    model, tokenizer = tiny_policy(tiny_model_dir, tmp_path, device, base_dtype)
    prompts, T = chat_prompts(tokenizer, 4), 0.7
    seen = []  # per step: the head's input, [n, 1, H]
    head = agents.backbone(model).get_output_embeddings()
    handle = head.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0].detach().clone()))
    try:
        torch.manual_seed(0)
        actions = generation.generate(model, tokenizer, prompts, "policy_solver", generation.Sampling(T, 1.0, 6), batch_size=4)
    finally:
        handle.remove()
    W = head.weight.detach()
    with torch.no_grad():  # per step [n, V]: float32 (a float32 head: its own product), and bf16's
        by_hand = [torch.log_softmax((F.linear(h.float(), W.float()) if base_dtype == "bfloat16" else head(h))[:, -1] / T, -1)
                   for h in seen]
        old = [torch.log_softmax(F.linear(h, W)[:, -1].float() / T, dim=-1) for h in seen]
    steps = [(row, k, token) for row, tokens in enumerate(actions.token_ids) for k, token in enumerate(tokens)]
    recorded = torch.tensor([actions.logprobs[row][k] for row, k, _ in steps])
    by_hand = torch.stack([by_hand[k][row, token] for row, k, token in steps]).cpu()
    old = torch.stack([old[k][row, token] for row, k, token in steps]).cpu()
    assert len(recorded) >= 4 * 2 and seen[0].dtype == getattr(torch, base_dtype)
    torch.testing.assert_close(recorded, by_hand, rtol=0, atol=1e-6)
    if base_dtype == "bfloat16":
        assert (recorded - old).abs().max() > 1e-4


# ---------------------------------------------------------------------------------------------
# The options a GPU gets (config.device_choices), CUDA mocked
# ---------------------------------------------------------------------------------------------

def mock_cuda(monkeypatch, gpus: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)


GPU_CHOICES = {"base_dtype": "bfloat16", "micro_batch_tokens": 4096}


@pytest.mark.parametrize("device", ["auto", "cuda", "cuda:0"])
def test_on_a_gpu_the_options_not_given_take_a_gpu_s_values_and_say_why(monkeypatch, tmp_path, capsys, device):
    mock_cuda(monkeypatch, 1)
    cfg = config_lib.parse_args(["--device", device, "--output_dir", str(tmp_path), "--run_name", "gpu"])
    assert {option: getattr(cfg, option) for option in GPU_CHOICES} == GPU_CHOICES
    assert set(GPU_CHOICES) <= set(cfg.chosen)
    assert cfg.chosen["base_dtype"].startswith("bfloat16: on a GPU") and "--rollout_correction" in cfg.chosen["base_dtype"]
    assert "float32_head" in cfg.chosen["base_dtype"]  # the log-probs stay float32's
    assert config_lib.vllm_dtype(cfg) == "bfloat16"  # the vLLM engine's weights follow the base's on a GPU
    assert cfg.chosen["micro_batch_tokens"].startswith("4096: on a GPU")
    assert "[options] --micro_batch_tokens 4096: on a GPU" in capsys.readouterr().err
    run_lib.Run(cfg)  # the run folder records each choice and why
    saved = json.loads((tmp_path / "gpu" / "config.json").read_text())
    assert {option: saved[option] for option in GPU_CHOICES} == GPU_CHOICES
    assert all(saved[f"chosen/{option}"] == cfg.chosen[option] for option in GPU_CHOICES)


def test_a_given_option_wins_over_the_gpu_s_and_a_cpu_changes_nothing(monkeypatch, tmp_path):
    mock_cuda(monkeypatch, 1)
    cfg = config_lib.parse_args(["--base_dtype", "float32", "--micro_batch_tokens", "512"])
    assert (cfg.base_dtype, cfg.micro_batch_tokens, config_lib.vllm_dtype(cfg)) == ("float32", 512, "float32")
    assert not set(GPU_CHOICES) & set(cfg.chosen)
    defaults = {option: getattr(config_lib.Config, option) for option in GPU_CHOICES}
    assert defaults == {"base_dtype": "float32", "micro_batch_tokens": 384}
    cpu = config_lib.parse_args(["--device", "cpu", "--output_dir", str(tmp_path), "--run_name", "cpu"])  # a GPU there, not used
    assert {option: getattr(cpu, option) for option in GPU_CHOICES} == defaults and not set(GPU_CHOICES) & set(cpu.chosen)
    # a --config file records what its run used: a CPU run's options stay, run again on the GPU
    run_lib.Run(cpu)
    again = config_lib.parse_args(["--config", str(tmp_path / "cpu"), "--device", "auto"])
    assert again.device == "auto" and {option: getattr(again, option) for option in GPU_CHOICES} == defaults
    mock_cuda(monkeypatch, 0)  # no GPU: auto is the CPU
    assert {option: getattr(config_lib.parse_args([]), option) for option in GPU_CHOICES} == defaults


# ---------------------------------------------------------------------------------------------
# The GPU check's decoding floor (scripts/gpu_check.py), by hand
# ---------------------------------------------------------------------------------------------

def gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_decoding_floor_of_smollm2_135m_s_shape_on_an_h200_by_hand():
    """SmolLM2-135M's shape (models/smollm2-135m.json: 30 layers, 3 key/value heads of 64) in bf16:
    one cached position of one row is keys and values, 2 · 30 · 3 · 64 · 2 bytes = 23,040 B; 16
    rows at 200 positions: 73,728,000 B. With its 134,515,008 parameters in bf16, 269,030,016 B
    (tied head: the embedding is read once, by the head), a step reads 342,758,016 B; at an
    H200's 4.8 TB/s that is 0.0714079 ms. The hf path's 80 ms a step is 1120 such floors."""
    gpu_check = gpu_check_module()
    config = json.loads((Path(__file__).resolve().parents[1] / "models" / "smollm2-135m.json").read_text())
    assert gpu_check.kv_bytes_per_position(config, 2) == 23_040
    assert gpu_check.kv_bytes_per_position({**config, "head_dim": None}, 2) == 23_040  # 576 / 9 heads
    assert gpu_check.kv_bytes_per_position({"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2}, 4) == 512
    bandwidth = gpu_check.memory_bandwidth("NVIDIA H200")
    assert bandwidth == 4.8e12
    assert gpu_check.decoding_floor_ms(269_030_016, 23_040 * 16 * 200, bandwidth) == pytest.approx(0.0714079, rel=1e-6)
    step = gpu_check.step_against_floor([79.0, 80.0, 81.0], 269_030_016, [23_040 * 16 * 199, 23_040 * 16 * 200,
                                                                         23_040 * 16 * 201], bandwidth)
    assert step == {"steps": 3, "step_ms": 80.0, "weight_bytes": 269_030_016, "kv_bytes_mean": 73_728_000,
                    "floor_ms": 0.0714, "times_floor": 1120.3}
    assert gpu_check.step_against_floor([80.0], 1, [1], None)["times_floor"] is None  # no bandwidth, no floor


def test_the_bandwidth_table_takes_the_most_specific_name_and_an_override_wins():
    gpu_check = gpu_check_module()
    assert gpu_check.memory_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12  # the SXM card's name
    assert gpu_check.memory_bandwidth("NVIDIA H100 PCIe") == 2.0e12
    assert gpu_check.memory_bandwidth("NVIDIA L40S") == 0.864e12 and gpu_check.memory_bandwidth("NVIDIA L4") == 0.3e12
    assert gpu_check.memory_bandwidth("NVIDIA A100-SXM4-40GB") == 1.555e12
    assert gpu_check.memory_bandwidth("NVIDIA GH200 480GB") is None  # two kinds: not guessed
    assert gpu_check.memory_bandwidth("Some GPU") is None
    assert gpu_check.memory_bandwidth("NVIDIA H200", 2.5) == 2.5e12


def test_the_weights_a_decoding_step_reads_by_hand(tiny_model_dir):
    """The tiny Llama (2 layers of width 32, 2 heads of 16, 1 key/value head, MLP 64, vocabulary
    49,152, tied head): per layer q 1024 + k 512 + v 512 + o 1024 + gate, up, down 3 · 2048 + two
    norms 64 = 9,280; 2 layers, the final norm 32 and the table 49,152 · 32 = 1,572,864 make
    1,591,456 parameters. A LoRA adapter of rank 2 on the seven projections adds per layer
    q, o 2 · (2·32 + 32·2) + k, v 2 · (2·32 + 16·2) + gate, up 2 · (2·32 + 64·2) + down (2·64 + 32·2)
    = 1,024, 2,048 float32 in all. Untied, the input table is left out: a step reads only its rows."""
    from transformers import LlamaConfig, LlamaForCausalLM

    gpu_check = gpu_check_module()
    base, _ = agents.load_base_model(str(tiny_model_dir), torch.bfloat16)
    assert gpu_check.weight_bytes_per_step(base) == 1_591_456 * 2
    model = agents.attach_adapters(base, ["policy"], agents.lora_config(2, 4.0, config_lib.LORA_TARGETS.split(",")))
    assert gpu_check.weight_bytes_per_step(model) == 1_591_456 * 2 + 2_048 * 4
    untied = LlamaForCausalLM(LlamaConfig(vocab_size=49_152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False))
    assert sum(p.numel() for p in untied.parameters()) == 1_591_456 + 1_572_864  # a head of its own
    assert gpu_check.weight_bytes_per_step(untied) == 1_591_456 * 4


def test_the_corrected_run_records_its_rollout_metrics_and_notes_their_absence(tmp_path, monkeypatch):
    """scripts/gpu_check.py's corrected run (marft.py faked: it writes the run folder): the command
    carries --base_dtype bfloat16 once and the vLLM backend, every rollout/* value of each
    iteration and the chosen/* options reach the report; a marft.py that logs no rollout/* gets
    a note naming the missing metrics."""
    gpu_check = gpu_check_module()
    args = gpu_check.argparse.Namespace(base_dtype="bfloat16", iterations=2, eval_problems=4)
    extra = tuple(gpu_check.shlex.split("--base_dtype bfloat16"))
    commands = []

    def fake_marft(rollout):
        def run(command, **kwargs):
            commands.append(command)
            folder = Path(command[command.index("--output_dir") + 1]) / command[command.index("--run_name") + 1]
            folder.mkdir(parents=True)
            rows = [{"iteration": k, "time/iteration": 10.0 + k, "time/rollout": 2.0, "perf/rollout_tokens_per_second": 300.0,
                     "perf/update_tokens_per_second": 1400.0, "charts/response_tokens": 32.0, **rollout(k)} for k in (1, 2)]
            (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
            (folder / "config.json").write_text(json.dumps({"base_dtype": "bfloat16", "chosen/micro_batch_tokens": "4096: why"}))
            return gpu_check.subprocess.CompletedProcess(command, 0, "", "")
        return run

    measured = lambda k: {"rollout/logprob_abs_diff": 0.001 * k, "rollout/kl_sampler_old": 1e-6 * k,
                          "rollout/max_abs_diff": 0.01 * k, "rollout/beyond_cap": 0.0}
    monkeypatch.setattr(gpu_check.subprocess, "run", fake_marft(measured))
    out = gpu_check.run_job("smollm2-135m", "vllm", 1, "math", args, tmp_path / "a", extra)
    assert commands[-1].count("--base_dtype") == 1 and commands[-1][commands[-1].index("--backend") + 1] == "vllm"
    assert out["base_dtype"] == "bfloat16" and out["chosen"] == {"chosen/micro_batch_tokens": "4096: why"}
    assert [it["rollout"] for it in out["iterations"]] == [measured(1), measured(2)] and "note" not in out
    monkeypatch.setattr(gpu_check.subprocess, "run", fake_marft(lambda k: {}))
    out = gpu_check.run_job("smollm2-135m", "vllm", 1, "math", args, tmp_path / "b", extra)
    assert [it["rollout"] for it in out["iterations"]] == [None, None]
    assert all(key in out["note"] for key in gpu_check.ROLLOUT_CORRECTION_KEYS)
    plain = gpu_check.run_job("smollm2-135m", "hf", 1, "math", args, tmp_path / "c")  # not the corrected run: no note
    assert "note" not in plain and commands[-1][commands[-1].index("--base_dtype") + 1] == "bfloat16"
