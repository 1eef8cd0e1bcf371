"""GPU memory of a training run, per base model: what can be counted exactly, what a GPU measured,
and the activations extrapolated to a larger micro-batch. Prints the table of docs/gpus.md.

    static      bf16 base (2 bytes a parameter) + every adapter's float32 LoRA weights and Adam
                states (4 + 8 bytes a LoRA parameter: N policies and one critic) + one adapter's
                gradient (4 bytes: one agent updates at a time, its gradients freed after its step)
    measured    the largest perf/peak_gpu_memory_gib of a run of scripts/gpu_check.sh
                (results/gpu.json, results/gpu-sizes.json): the default job (task math), --micro_batch_tokens 384
    activations measured − static, per micro-batch token; at another --micro_batch_tokens T the
                estimate is static + T × that (linear in T: an extrapolation, not a measurement)

    python scripts/memory_table.py [--agents 2] [--lora_rank 16] [--tokens 4096]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("q", "k", "v", "o", "gate", "up", "down")  # config.LORA_TARGETS
GIB = 2**30


def attention_widths(config: dict) -> tuple[int, int]:
    """(query width, key/value width) of a layer: heads × head_dim."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim


def parameters(config: dict) -> int:
    """Parameters of a Llama/Qwen2 decoder: embeddings (+ an untied head), per layer q/k/v/o (Qwen2:
    q/k/v biases), the SwiGLU MLP and two RMSNorms, the final norm. tests/test_devices.py checks it
    against the model cards' sizes and the built models."""
    h, inter, layers, vocab = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"], config["vocab_size"]
    q, kv = attention_widths(config)
    attention = 2 * h * q + 2 * h * kv + ((q + 2 * kv) if config["model_type"] == "qwen2" else 0)
    return vocab * h * (1 if config["tie_word_embeddings"] else 2) + layers * (attention + 3 * h * inter + 2 * h) + h


def lora_parameters(config: dict, rank: int) -> int:
    """One adapter's LoRA parameters: r × (in + out) for each target projection of each layer."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    q, kv = attention_widths(config)
    shapes = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, inter), "up": (h, inter), "down": (inter, h)}
    return config["num_hidden_layers"] * sum(rank * sum(shapes[t]) for t in TARGETS)


def measured_peaks() -> dict[str, tuple[float, str]]:
    """model → (largest peak GiB over its runs' iterations, 'GPU, date, commit')."""
    peaks = {}
    for file in sorted((ROOT / "results").glob("gpu*.json")):
        report = json.loads(file.read_text())
        where = f"{report['device']['name']}, {report['date'][:10]}, {report['commit']}"
        for run in report["runs"]:
            values = [it["peak_gpu_memory_gib"] for it in run["iterations"] if it.get("peak_gpu_memory_gib") is not None]
            if values and run["gpus"] == 1 and run["backend"] == "hf" and run.get("task", "math") == "math":
                peaks[run["model"]] = (max(values), where)
    return peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=2, help="policy adapters (the chain: 2), plus one critic")
    parser.add_argument("--lora_rank", type=int, default=16)
    parser.add_argument("--measured_tokens", type=int, default=384, help="--micro_batch_tokens of the measured runs")
    parser.add_argument("--tokens", type=int, default=4096, help="--micro_batch_tokens to extrapolate to")
    args = parser.parse_args()
    peaks = measured_peaks()
    print(f"| base (models/) | parameters | bf16 base | {args.agents} policies + critic: LoRA, Adam, one gradient | static | "
          f"measured peak, T = {args.measured_tokens} | activations per token | estimate, T = {args.tokens} |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for file in sorted((ROOT / "models").glob("*.json"), key=lambda f: parameters(json.loads(f.read_text()))):
        config = json.loads(file.read_text())
        n, lora = parameters(config), lora_parameters(config, args.lora_rank)
        base, adapters = 2 * n / GIB, ((args.agents + 1) * 12 + 4) * lora / GIB
        static = base + adapters
        row = [file.stem, f"{n / 1e9:.2f} B", f"{base:.2f} GiB", f"{adapters:.2f} GiB", f"{static:.2f} GiB"]
        if file.stem in peaks:
            peak = peaks[file.stem][0]
            per_token = (peak - static) / args.measured_tokens
            row += [f"{peak:.2f} GiB", f"{per_token * 1024:.2f} MiB", f"{static + per_token * args.tokens:.1f} GiB"]
        else:
            row += ["not run", "", ""]
        print("| " + " | ".join(row) + " |")
    for model, (_, where) in sorted(peaks.items()):
        print(f"\n{model}: measured on {where}", end="")
    print()


if __name__ == "__main__":
    main()
