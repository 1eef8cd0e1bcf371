"""Shared fixtures: one torch thread, a tiny random Llama with the real SmolLM2 tokenizer."""
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

torch.set_num_threads(1)


# The files that take minutes, longest first (measured with --durations). scripts/test.sh hands
# whole files to its workers in collection order (--dist loadfile --no-loadscope-reorder): the
# long files start first and the many short ones fill in behind them, so no worker is left with
# a long file at the end while the other idles.
LONGEST_FIRST = ("test_vllm.py", "test_learning.py", "test_bench.py", "test_orchestration.py", "test_sandbox_attacks.py",
                 "test_distributed.py", "test_devices.py", "test_sandbox.py")


def pytest_collection_modifyitems(items):
    position = {name: rank for rank, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: position.get(item.path.name, len(LONGEST_FIRST)))  # stable: each file keeps its order


def save_tiny_llama(folder: Path, hidden_size: int, **config) -> Path:
    """A 2-layer Llama of width `hidden_size` (2 heads, 1 key/value head; random weights from seed 0,
    `config` overriding LlamaConfig's other fields) saved in `folder` with the embedded model's
    tokenizer and chat template."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    import agents

    tokenizer = AutoTokenizer.from_pretrained(agents.embedded_tokenizer_folder())
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2, **config)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def varied_step(step):
    """MathEnv.step whose reward also pays the graded responses' mean length in characters / 100: a
    learning signal from a model whose answers never parse (the tiny and random ones), that differs
    between responses (so every advantage and loss of a short run is nonzero) and points the same
    way at every iteration (longer responses), as an entropy bonus's did."""
    def step_with_varied_reward(env, joint_action):
        observation, reward, done, info = step(env, joint_action)
        graded = [role for role in env.graded_roles if role in joint_action]
        extra = sum(len(joint_action[role]) for role in graded) / (100 * max(len(graded), 1))
        return observation, reward + extra, done, info
    return step_with_varied_reward


@pytest.fixture
def varied_rewards(monkeypatch):
    """The math environment pays `varied_step`'s reward in this test (training and evaluation alike)."""
    from envs import MathEnv
    monkeypatch.setattr(MathEnv, "step", varied_step(MathEnv.step))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A 2-layer, 32-wide Llama (random weights) saved with the embedded model's tokenizer and
    chat template: the whole agents/critic machinery in a fraction of a second per pass."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), hidden_size=32)


def assert_runs_log_alike(plain_dir: Path, other_dir: Path, lines: int, loose: tuple[str, ...] = ()) -> list[dict]:
    """Two runs of the same options but one exact-in-principle switch: the same number of
    metrics.jsonl lines and keys (time/ and perf/ aside), every value equal to float rounding
    (rel 1e-4, abs 1e-6; abs 1e-4 for the keys in `loose`, a name or a prefix ending in "/").
    rollout/stale_share/ is logged only where the sampler is not the training model. Returns the
    plain run's rows."""
    import json

    read = lambda folder: [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    plain_rows, other_rows = read(plain_dir), read(other_dir)
    assert len(plain_rows) == len(other_rows) == lines
    is_loose = lambda key: any(key == l or (l.endswith("/") and key.startswith(l)) for l in loose)
    aside = ("time/", "perf/", "rollout/stale_share/")
    for plain, other in zip(plain_rows, other_rows):
        keys = {k for k in plain if not k.startswith(aside)}
        assert keys == {k for k in other if not k.startswith(aside)}
        for key in keys:
            assert other[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-4 if is_loose(key) else 1e-6, nan_ok=True), key
    return plain_rows
