"""Devices on a machine without a GPU: which device each rank takes (torch.cuda mocked), the one
door to tensor collectives, random-weight models of a real architecture, and scripts/gpu_check.sh
saying in one line that it needs CUDA. What needs a GPU is in tests/test_gpu.py (skipped here)."""
import importlib.util
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import agents
import config as config_lib
import distributed
import generation
import marft

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# rank_device: every combination of (torchrun or not, LOCAL_RANK, GPUs seen, --device)
# ---------------------------------------------------------------------------------------------

# (requested, launched, local_rank, local_ranks, gpus) → device, or the words the error must hold
DEVICE_TABLE = [
    # one process
    ("cpu", False, 0, 1, 0, "cpu"),
    ("cpu", False, 0, 1, 4, "cpu"),
    ("auto", False, 0, 1, 0, "cpu"),
    ("auto", False, 0, 1, 1, "cuda:0"),
    ("auto", False, 0, 1, 4, "cuda:0"),
    ("cuda", False, 0, 1, 0, "sees no GPU"),
    ("cuda", False, 0, 1, 2, "cuda:0"),
    ("cuda:1", False, 0, 1, 2, "cuda:1"),
    ("cuda:2", False, 0, 1, 2, "cuda:0 to cuda:1"),
    ("cuda:0", False, 0, 1, 0, "sees no GPU"),
    ("tpu", False, 0, 1, 2, "use auto, cpu, cuda or cuda:k"),
    # torchrun: rank r of a node takes cuda:LOCAL_RANK
    ("cpu", True, 1, 2, 2, "cpu"),
    ("auto", True, 0, 2, 0, "cpu"),
    ("auto", True, 1, 2, 0, "cpu"),
    ("auto", True, 0, 2, 2, "cuda:0"),
    ("auto", True, 1, 2, 2, "cuda:1"),
    ("cuda", True, 3, 4, 8, "cuda:3"),
    ("cuda", True, 1, 2, 0, "sees no GPU"),
    ("auto", True, 2, 4, 2, "4 ranks on this node but torch sees 2 GPU(s)"),  # NCCL refuses two ranks on a GPU
    ("cuda", True, 0, 3, 2, "3 ranks on this node but torch sees 2 GPU(s)"),
    ("cuda:0", True, 1, 2, 2, "would put every rank on GPU 0"),
]


@pytest.mark.parametrize("requested, launched, local_rank, local_ranks, gpus, expected", DEVICE_TABLE)
def test_each_rank_takes_its_own_device_or_a_clear_error(requested, launched, local_rank, local_ranks, gpus, expected):
    def resolve():
        return distributed.rank_device(requested, launched=launched, local_rank=local_rank, local_ranks=local_ranks, gpus=gpus)
    if expected == "cpu" or expected.startswith("cuda:") and " " not in expected:
        assert resolve() == expected
    else:
        with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            resolve()


def mock_gpus(monkeypatch, count: int) -> list:
    """torch.cuda as it would look with `count` GPUs; returns the list set_device calls land in."""
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: current.append(str(device)))
    return current


def torchrun_env(monkeypatch, rank: int, local_rank: int, local_ranks: int, world: int) -> None:
    for name, value in (("RANK", rank), ("LOCAL_RANK", local_rank), ("LOCAL_WORLD_SIZE", local_ranks), ("WORLD_SIZE", world)):
        monkeypatch.setenv(name, str(value))


@pytest.mark.parametrize("device, backend", [("auto", "nccl"), ("cuda", "nccl"), ("cpu", "gloo")])
def test_init_makes_the_ranks_gpu_current_before_joining_nccl(monkeypatch, device, backend):
    """Rank 3 of 4 on a node of 4 GPUs: cuda:3 is made the current device, then the group is joined
    with NCCL bound to it; --device cpu joins gloo and touches no GPU."""
    current = mock_gpus(monkeypatch, 4)
    torchrun_env(monkeypatch, rank=3, local_rank=3, local_ranks=4, world=4)
    joined = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, timeout, device_id: joined.append((backend, device_id)))
    resolved = distributed.init(device)
    if backend == "nccl":
        assert resolved == "cuda:3" and current == ["cuda:3"] and joined == [("nccl", torch.device("cuda:3"))]
    else:
        assert resolved == "cpu" and current == [] and joined == [("gloo", None)]


def test_one_process_on_a_gpu_machine_joins_no_group_and_takes_cuda_0(monkeypatch):
    current = mock_gpus(monkeypatch, 2)
    for name in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: pytest.fail("a single process joined a group"))
    assert distributed.init("auto") == "cuda:0" and current == ["cuda:0"]
    assert agents.resolve_device("auto") == "cuda:0"


@pytest.mark.parametrize("gpus, env, device, words", [
    (2, dict(rank=0, local_rank=0, local_ranks=4, world=4), "auto", "4 ranks on this node but torch sees 2 GPU(s): launch at most 2"),
    (0, None, "cuda", "torch sees no GPU here; use --device cpu"),
    (2, dict(rank=1, local_rank=1, local_ranks=2, world=2), "cuda:1", "would put every rank on GPU 1: use --device cuda"),
    (1, None, "cuda:1", "torch sees 1 GPU(s), cuda:0 to cuda:0"),
])
def test_a_device_that_cannot_work_stops_the_run_at_start_naming_the_fix(monkeypatch, gpus, env, device, words):
    mock_gpus(monkeypatch, gpus)
    if env:
        torchrun_env(monkeypatch, **env)
    with pytest.raises(SystemExit) as stop:
        config_lib.parse_args(["--device", device])
    assert str(stop.value).startswith(f"--device={device!r}: ") and words in str(stop.value)


# ---------------------------------------------------------------------------------------------
# The collective helper
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def one_rank_gloo_group():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def test_every_collective_goes_through_all_reduce_and_comes_back_where_it_was(monkeypatch, one_rank_gloo_group):
    """sum_, all_ranks and max_int hand all_reduce their tensor; it reaches torch.distributed on the
    backend's device (gloo: the CPU) and the reduced value is written into the caller's tensor."""
    seen = []
    real = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda t, op: (seen.append((t.device, op)), real(t, op=op))[1])
    table = torch.arange(6, dtype=torch.float32).view(2, 3)
    assert distributed.sum_(table) is table and table.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert distributed.all_ranks(True) and not distributed.all_ranks(False)
    assert distributed.max_int(7) == 7
    assert [device.type for device, _ in seen] == ["cpu"] * 4
    assert [op for _, op in seen] == [dist.ReduceOp.SUM] * 3 + [dist.ReduceOp.MAX]
    assert distributed.backend_device() == torch.device("cpu")


def test_all_reduce_writes_back_into_a_tensor_that_had_to_move(monkeypatch, one_rank_gloo_group):
    """A tensor not on the backend's device (under NCCL: a CPU table) is reduced as a copy there and
    the result copied back into it. Here the backend's 'device' is faked by a dtype change the
    helper cannot tell from a device move: the copy is reduced (doubled by the fake collective),
    and the caller's own tensor holds the result."""
    moved = []

    def fake_all_reduce(tensor, op):
        moved.append(tensor)
        tensor.mul_(2)

    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    original_to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: original_to(self, torch.float64))  # "another device"
    table = torch.tensor([1.0, 2.5])
    assert distributed.all_reduce(table) is table
    assert moved[0] is not table and moved[0].dtype == torch.float64
    assert table.tolist() == [2.0, 5.0]


def test_without_a_group_the_collectives_are_identities():
    assert not dist.is_initialized()
    table = torch.tensor([1.0, 2.0])
    assert distributed.sum_(table) is table and table.tolist() == [1.0, 2.0]
    assert distributed.max_int(3) == 3 and distributed.all_ranks(False) is False


# ---------------------------------------------------------------------------------------------
# random:<config.json>: a real architecture with random weights
# ---------------------------------------------------------------------------------------------

SHIPPED = {"smollm2-135m": 134_515_008, "qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304,
           "qwen2.5-3b": 3_085_938_688, "qwen2.5-7b": 7_615_616_512}


def load_memory_table():
    spec = importlib.util.spec_from_file_location("memory_table", ROOT / "scripts" / "memory_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The parameter count of a Llama/Qwen2 decoder from its config, as scripts/memory_table.py counts it
# for the memory table: checked below against the model cards' published sizes and the built model.
parameter_count = load_memory_table().parameters


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_shipped_configs_have_the_published_sizes(name):
    """models/*.json: the counts the model cards give (SmolLM2-135M: 134.5M; Qwen2.5: 0.49B, 1.54B,
    3.09B, 7.62B), and the embedded tokenizer's special ids."""
    config = json.loads((ROOT / "models" / f"{name}.json").read_text())
    assert parameter_count(config) == SHIPPED[name]
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 2)


def test_a_random_model_is_built_from_its_config_with_the_embedded_tokenizer_seeded():
    config = json.loads((ROOT / "models" / "smollm2-135m.json").read_text())
    torch.manual_seed(3)
    model, tokenizer = agents.load_base_model("random:models/smollm2-135m.json", torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(config)
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in model.parameters())
    assert tokenizer.chat_template and len(tokenizer) == 49152
    torch.manual_seed(3)
    again, _ = agents.load_base_model("random:models/smollm2-135m.json", torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


@pytest.mark.parametrize("content, words", [
    (None, "no such file"),
    ("{not json", "is not JSON"),
    ('{"hidden_size": 8}', "has no model_type"),
])
def test_a_random_model_config_that_cannot_work_stops_the_run_at_start(tmp_path, content, words):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as stop:
        config_lib.parse_args(["--model", f"random:{path}"])
    assert words in str(stop.value) and "random:models/qwen2.5-0.5b.json" in str(stop.value)


@pytest.mark.slow
def test_the_135m_shaped_random_model_trains_one_iteration_end_to_end(tmp_path, capsys):
    """The default job (the chain, critic and both updates) with --model random:models/smollm2-135m.json
    on the CPU: one iteration, the run says its weights are random and records it in config.json."""
    cfg = config_lib.parse_args(["--model", "random:models/smollm2-135m.json", "--batch_size", "2", "--max_new_tokens", "4",
                              "--eval_problems", "2", "--eval_samples", "1", "--no-eval_greedy", "--iterations", "1",
                              "--lora_rank", "2", "--threads", "1", "--device", "cpu", "--output_dir", str(tmp_path),
                              "--run_name", "random"])
    summary = marft.train(cfg)
    assert summary["final_iteration"] == 1
    assert "RANDOM weights on cpu" in capsys.readouterr().out
    recorded = json.loads((tmp_path / "random" / "config.json").read_text())
    assert recorded["model/weights"].startswith("random") and recorded["model"] == "random:models/smollm2-135m.json"
    row = json.loads((tmp_path / "random" / "metrics.jsonl").read_text().splitlines()[1])
    assert row["perf/update_tokens_per_second"] > 0 and "perf/peak_gpu_memory_gib" not in row
    assert all(row[f"losses/nonfinite_steps/{name}"] == 0.0 for name in ("planner", "solver", "critic"))


# ---------------------------------------------------------------------------------------------
# scripts/gpu_check.sh without CUDA
# ---------------------------------------------------------------------------------------------

def test_gpu_check_without_cuda_stops_with_one_line(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable}, timeout=120)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2, lines
    assert len(lines) == 1 and "needs a GPU" in lines[0] and "torch sees no CUDA device" in lines[0]


# ---------------------------------------------------------------------------------------------
# vLLM colocated on the GPU: dummy weights for random models, one LoRA slot per agent
# ---------------------------------------------------------------------------------------------

def test_the_vllm_engine_is_asked_for_dummy_weights_and_a_lora_slot_per_agent(monkeypatch, tmp_path):
    """What VLLMGenerator hands vLLM's LLM (arguments of vLLM 0.32.0, the version both installs
    pin), with the engine itself faked: this machine has no GPU."""
    vllm = pytest.importorskip("vllm")
    calls = []

    class FakeLLM:
        def __init__(self, **kwargs):
            calls.append(("init", kwargs))

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    generation.VLLMGenerator("folder", ["policy_planner", "policy_solver"], 16, stop_ids=[2], seed=0, max_model_len=256,
                             dtype="bfloat16", gpu_memory_utilization=0.3, tensor_parallel_size=1, enforce_eager=False,
                             sync_root=tmp_path, threads=1, random_weights=True)
    kwargs = calls[0][1]
    assert kwargs["load_format"] == "dummy"
    assert kwargs["enable_lora"] is True and kwargs["max_loras"] == 2 and kwargs["max_lora_rank"] == 16
    assert kwargs["gpu_memory_utilization"] == 0.3
    calls.clear()
    generation.VLLMGenerator("folder", ["policy"], 20, stop_ids=[2], seed=0, max_model_len=256, dtype="bfloat16",
                             gpu_memory_utilization=0.3, tensor_parallel_size=1, enforce_eager=False, sync_root=tmp_path,
                             threads=1)
    assert calls[0][1]["load_format"] == "auto"
    assert calls[0][1]["max_lora_rank"] == 32  # the next rank vLLM serves
