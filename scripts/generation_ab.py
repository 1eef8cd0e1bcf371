"""Generation with the adapter applied per step (HFGenerator) against the merged copy
(MergedHFGenerator, --merged_generation), side by side in one process: seconds and tokens/s of
one agent's turn for a batch of the default task's planner prompts, each measured `--repeats`
times alternately after a warm-up; a third path, the merged copy with its linear layers' weights in
bfloat16 (--merged_weight_dtype); and a fourth, that bf16 copy as it decoded before commit f6b819a: its
weights in the plain [out, in] layout (not oneDNN's, generation.LowPrecisionLinear) and transformers'
concatenating key/value cache (not generation.ReservedLayer). Those two changes give the same
products and cache bit for bit, so the third and fourth paths must sample the same tokens with the
same log-probs (printed). A fifth, the bf16 copy drawing by the inverse transform (--sampler
inverse, generation.sample_tokens) instead of torch.multinomial: the same distribution, other
tokens, so it is compared per decoding step. `--model random:models/<x>.json` measures a shape
without its weights (as the GPU check does). Prints one line per measurement, each path's rollout
log-prob gap (the sampled tokens' log-probs against the training model's) and the median ratios."""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import agents  # noqa: E402
import generation  # noqa: E402
from envs import make_arithmetic_problems  # noqa: E402
from flex_pomdp import load_organisation, unrolled_messages  # noqa: E402
from run import Config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=Config.model)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--base_dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = Config()
    base, tokenizer = agents.load_base_model(args.model, getattr(torch, args.base_dtype), args.device)
    model = agents.attach_adapters(base, ["policy_planner"], agents.lora_config(cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets.split(",")))
    with torch.no_grad():  # a trained-looking adapter: nonzero B
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    org = load_organisation("chain")
    problems = make_arithmetic_problems("train", seed=1)[: args.prompts]
    prompts = agents.tokenize_prompts(tokenizer, [unrolled_messages(org, "planner", p.problem, {}) for p in problems], 1024)[0]
    sampling = generation.Sampling(1.0, 1.0, args.new_tokens)
    generators = {"adapter": generation.HFGenerator(model, tokenizer, 64),
                  "merged": generation.MergedHFGenerator(model, tokenizer, 64),
                  "merged-bf16": generation.MergedHFGenerator(model, tokenizer, 64, weight_dtype=torch.bfloat16)}
    with mock.patch.object(generation, "onednn_packing_available", lambda: False):  # weights in the plain layout
        generators["merged-bf16-before"] = generation.MergedHFGenerator(model, tokenizer, 64, weight_dtype=torch.bfloat16)
        generators["merged-bf16-before"].merge("policy_planner")  # merged here, while packing is off
    generators["merged-bf16-inverse"] = generators["merged-bf16"]
    sampling_of = {"merged-bf16-inverse": generation.Sampling(1.0, 1.0, args.new_tokens, "inverse")}
    before = {"merged-bf16-before": lambda: mock.patch.object(generation, "ReservedLayer",
                                                              lambda capacity: generation.DynamicLayer())}
    actions_of: dict[str, list] = {name: [] for name in generators}
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    seconds: dict[str, list[float]] = {name: [] for name in generators}
    step_seconds: dict[str, list[float]] = {name: [] for name in generators}  # per decoding step: the samplers' tokens differ
    for repeat in range(args.repeats + 1):
        for name, generator in generators.items():
            torch.manual_seed(repeat)
            sync()
            with before.get(name, contextlib.nullcontext)():  # the concatenating cache for the "before" path
                start = time.perf_counter()
                actions = generator.generate(prompts, "policy_planner", sampling_of.get(name, sampling))
                sync()
                elapsed = time.perf_counter() - start
            actions_of[name].append(actions)
            tokens = sum(map(len, actions.token_ids))
            steps = max(map(len, actions.token_ids), default=0)  # decoding steps: all prompts are one batch (of 64)
            if repeat > 0:  # the first round warms up
                seconds[name].append(elapsed / max(tokens, 1))
                step_seconds[name].append(elapsed / max(steps, 1))
                print(f"{name}: {elapsed:.2f} s, {tokens} tokens, {tokens / elapsed:.0f} tokens/s, {steps} steps", flush=True)
            if repeat == args.repeats:  # what the training model says of the sampled tokens (rollout/logprob_abs_diff)
                with torch.no_grad():
                    recomputed, _, mask = agents.token_logprobs(model, prompts, actions.token_ids, "policy_planner",
                                                                tokenizer.pad_token_id, sampling.temperature)
                sampled = torch.zeros_like(recomputed)
                for row, logprobs in enumerate(actions.logprobs):
                    sampled[row, : len(logprobs)] = torch.tensor(logprobs)
                gap = ((recomputed - sampled).abs() * mask).sum() / mask.sum()
                print(f"{name}: rollout log-prob gap {gap:.5f} nats per token (mean |sampled − training model's|)", flush=True)
    for name in [name for name in generators if name not in ("adapter", "merged-bf16-inverse")]:
        ratio = statistics.median(seconds["adapter"]) / statistics.median(seconds[name])
        print(f"{name} generation: {ratio:.2f}× the adapter path's tokens/s (median of {args.repeats}, {args.device}, "
              f"{args.model}, {args.base_dtype})", flush=True)
    ratio = statistics.median(seconds["merged-bf16-before"]) / statistics.median(seconds["merged-bf16"])
    same = all(a.token_ids == b.token_ids and a.logprobs == b.logprobs
               for a, b in zip(actions_of["merged-bf16"], actions_of["merged-bf16-before"]))
    print(f"merged-bf16 against merged-bf16-before: {ratio:.2f}× the tokens/s; the same tokens and log-probs in every "
          f"round: {same}", flush=True)
    ratio = statistics.median(step_seconds["merged-bf16"]) / statistics.median(step_seconds["merged-bf16-inverse"])
    print(f"merged-bf16-inverse (--sampler inverse) against merged-bf16 (multinomial): {ratio:.2f}× the decoding steps per "
          "second (they draw other tokens, so their responses differ in length; a step decodes every row of the batch)",
          flush=True)


if __name__ == "__main__":
    main()
