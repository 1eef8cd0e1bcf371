"""What only a GPU can show: the model and every trainable state on the rank's GPU in the dtypes
the README promises, the log-probs training recomputes against those generation recorded, prefix
sharing on CUDA's attention kernels, and the collectives under NCCL. Skipped without CUDA;
scripts/gpu_check.sh runs them (and the CPU side is tests/test_devices.py)."""
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import agents
import critic
import distributed
import generation
import marft
import run as run_lib

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MODEL = "random:models/smollm2-135m.json"


def config(tmp_path, *extra):
    return run_lib.parse_args(["--model", MODEL, "--device", "cuda", "--lora_rank", "4", "--batch_size", "2",
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


def test_the_base_is_bfloat16_on_the_gpu_and_every_trainable_state_float32_there(tmp_path):
    cfg = config(tmp_path, "--base_dtype", "bfloat16")
    assert distributed.init(cfg.device, 1.0) == "cuda:0" and torch.cuda.current_device() == 0
    org, model, tokenizer, heads, optimisers = marft.build(cfg)
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


def test_prefix_sharing_gives_the_plain_pass_numbers_on_cuda_kernels(tmp_path):
    """Log-probs, values and the gradient with the shared prefix run once equal the plain pass
    (float32 base) to 1e-4: the CUDA attention path keeps causal masking over the cached prefix."""
    cfg = config(tmp_path)
    org, model, tokenizer, heads, _ = marft.build(cfg)
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


@pytest.mark.parametrize("base_dtype, bound", [("float32", 1e-4), ("bfloat16", 0.0)])
def test_fused_lora_update_gives_peft_s_numbers_on_cuda_kernels(tmp_path, base_dtype, bound):
    """--fused_lora on CUDA's matrix kernels: log-probs, values and every LoRA gradient of the same
    weights with peft's own forward and then with the fused update (addmm) agree within `bound`
    (float32 base: rounding only; bfloat16 base: the fused layer takes the plain sum, peft's numbers)."""
    cfg = config(tmp_path, "--base_dtype", base_dtype, "--no-fused_lora")
    org, model, tokenizer, heads, _ = marft.build(cfg)
    nudge_adapter(model, "policy_solver")
    nudge_adapter(model, "critic", seed=1)
    prompts = chat_prompts(tokenizer)
    responses = [[10 + k, 20 + k, 30 + k][: 1 + k % 3] for k in range(len(prompts))]
    out = {}
    for fused in (False, True):
        if fused:
            assert agents.fuse_lora_updates(model) > 0
        model.zero_grad(set_to_none=True)
        policy = agents.policy_logprobs(model, prompts, responses, "policy_solver", 2, "token", "sum", 1.0)
        values = critic.decision_values(model, heads, "critic", prompts, responses, 2, "token")
        (policy.logprob.sum() + values.sum()).backward()
        grads = torch.cat([p.grad.flatten() for adapter in ("policy_solver", "critic")
                           for p in agents.adapter_parameters(model, adapter) if p.grad is not None])
        out[fused] = (policy.logprob.detach(), values.detach(), grads.cpu())
    assert out[False][2].abs().sum() > 0
    for plain, fused in zip(out[False], out[True]):
        torch.testing.assert_close(fused, plain, rtol=bound, atol=bound)
