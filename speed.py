"""Speed and memory: the CPU paths behind one switch, and freed memory handed back to the OS.

Not in the paper: nothing here changes what is sampled or learned (the same tokens, bit for bit:
tests/test_agents.py). Prefix sharing (agents.py) and micro-batches (marft.py) stay with their concept.

    MARFT_CPU_PATHS=off    the one switch: the CPU path below off, and scripts/setup_env.sh caps torch's,
                           oneDNN's and MKL's kernels at AVX2 before torch loads; config.json records it
    sdpa_grouped_kv        attention reads grouped key/value heads as they are (no copy per query head)
    return_freed_memory    malloc_trim after each phase: the resident memory follows the memory in use

docs/speed-and-memory.md has the measurements, and the CPU paths tried and deleted.
"""
from __future__ import annotations

import ctypes
import functools
import os

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

CPU_PATHS_VARIABLE = "MARFT_CPU_PATHS"
# What scripts/setup_env.sh exports under MARFT_CPU_PATHS=off (each read once, when torch loads)
AVX2_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def cpu_paths_on() -> bool:
    """False under MARFT_CPU_PATHS=off: the kernels that this CPU's instructions choose are off."""
    return os.environ.get(CPU_PATHS_VARIABLE, "on") != "off"


def cpu_paths_record() -> str | None:
    """config.json's machine/cpu_paths: None with the paths on (the default), else whether the caps took effect."""
    if cpu_paths_on():
        return None
    capped = all(os.environ.get(name) == value for name, value in AVX2_CAPS.items())
    return ("off (MARFT_CPU_PATHS=off): kernels capped at AVX2" if capped else
            "off (MARFT_CPU_PATHS=off), but the AVX2 caps were not in the environment when torch loaded: "
            "start through scripts/setup_env.sh")


@functools.cache
def _glibc():
    """glibc, or None without it."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def return_freed_memory() -> None:
    """Give the free pages of glibc's heap back to the OS (malloc_trim; no-op without glibc). glibc's own mmap
    threshold is kept: a fixed 1 MiB one doubled the system time (docs/speed-and-memory.md)."""
    if (libc := _glibc()) is not None:
        libc.malloc_trim(0)


# ---- Attention over grouped key/value heads --------------------------------------------------

def sdpa_grouped_kv(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' "sdpa" attention, except that on the CPU a masked grouped-query attention (SmolLM2: 9
    query heads read 3 key/value heads) hands torch's kernel the key/value heads as they are (`enable_gqa`),
    not a copy per query head: the same numbers. Elsewhere (no mask; CUDA) the library's function.
    query [n, heads, q, d], key/value [n, kv_heads, k, d] → ([n, q, heads, d], None)."""
    if attention_mask is None or query.device.type != "cpu" or query.shape[1] == key.shape[1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                                           scale=scaling, enable_gqa=True)  # a mask: never is_causal
    return out.transpose(1, 2).contiguous(), None


GROUPED_KV_SDPA = "sdpa_grouped_kv"
AttentionInterface.register(GROUPED_KV_SDPA, sdpa_grouped_kv)
AttentionMaskInterface.register(GROUPED_KV_SDPA, sdpa_mask)  # the masks "sdpa" gets


def use_grouped_kv_attention(model) -> None:
    """A model loaded with "sdpa" attention on the CPU reads grouped heads in place (agents.load_base_model)."""
    if model.config._attn_implementation == "sdpa" and torch.device(model.device).type == "cpu" and cpu_paths_on():
        model.set_attn_implementation(GROUPED_KV_SDPA)
