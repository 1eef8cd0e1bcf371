"""Speed and memory: the CPU-specific switch, and freed memory handed back to the OS.

Not in the paper: nothing here changes what is sampled or learned beyond float rounding. The
algorithm's own speed work stays with the concept it speeds up and is exact up to rounding:
the prompt prefix a batch shares is run once (agents.forward_responses, generation.generate),
and the gradient passes are cut into micro-batches of a token budget (marft.micro_batches).

    MARFT_CPU_PATHS=off   the one switch: every path that this CPU's instructions choose is off.
                          scripts/setup_env.sh then caps torch's, oneDNN's and MKL's kernels at
                          AVX2 (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS)
                          before torch loads, so a run computes as on a CPU without AVX-512 or
                          bf16 instructions. config.json records it (machine/cpu_paths).
    return_freed_memory   glibc's mmap threshold fixed at 1 MiB and malloc_trim after each phase,
                          so the resident memory follows the memory in use.

Every other CPU path measured here bought less than 1.15x on the default job's iteration and was
deleted: oneDNN's float32 products, the fused LoRA update, rows sorted by length, grouped key/value
attention, a reserved decoding cache, the inverse-transform sampler, gradient checkpointing, and
the merged bf16 copy as a sampler. docs/speed-and-memory.md keeps their figures.
"""
from __future__ import annotations

import ctypes
import functools
import os

CPU_PATHS_VARIABLE = "MARFT_CPU_PATHS"
# What scripts/setup_env.sh exports under MARFT_CPU_PATHS=off (each read once, when torch loads)
AVX2_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def cpu_paths_on() -> bool:
    """False under MARFT_CPU_PATHS=off: the kernels that this CPU's instructions choose are off."""
    return os.environ.get(CPU_PATHS_VARIABLE, "on") != "off"


def cpu_paths_record() -> str | None:
    """config.json's machine/cpu_paths: None with the paths on (the default), else what is off and
    whether the kernel caps took effect (they must be in the environment before torch loads)."""
    if cpu_paths_on():
        return None
    capped = all(os.environ.get(name) == value for name, value in AVX2_CAPS.items())
    return ("off (MARFT_CPU_PATHS=off): kernels capped at AVX2" if capped else
            "off (MARFT_CPU_PATHS=off), but the AVX2 caps were not in the environment when torch loaded: "
            "start through scripts/setup_env.sh")


@functools.cache
def _glibc():
    """glibc with its mmap threshold fixed at 1 MiB (mallopt M_MMAP_THRESHOLD), or None without glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    M_MMAP_THRESHOLD = -3  # glibc's <malloc.h>
    libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)
    return libc


def return_freed_memory() -> None:
    """Give the memory of freed tensors back to the OS, so that the resident memory follows the
    memory in use. glibc serves blocks below its mmap threshold from its heap and raises that
    threshold (up to 32 MiB) each time a larger mapped block is freed, so the heap keeps every
    large activation buffer it ever held. The first call fixes the threshold at 1 MiB, so every
    larger tensor is mapped on its own and unmapped when freed; every call returns the heap's free
    pages (malloc_trim, 60-70 ms a call here). Called at start and after every phase. No-op without glibc."""
    if (libc := _glibc()) is not None:
        libc.malloc_trim(0)
