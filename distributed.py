"""Data parallelism: one MARFT run over G processes launched by torchrun, on one node or several.

Not in the paper (its algorithm box is one learner); this module only spreads the work of each
phase over ranks so that the numbers stay those of one process. README: "More than one device".

Every rank holds the base model, every adapter, the critic and the optimiser states, all equal.
Per iteration:

    rollout     rank r plays episodes r, r + G, r + 2G, … of the batch with its own sampling
                seed (`rank_seed`); the parts are gathered and merged (rollout.merge_rollouts), so
                every rank holds the whole batch, in the order one process would have played it
    old policy  forward batches split round-robin over ranks, the tables summed (each entry is
                filled on exactly one rank)
    advantages  computed on every rank from the whole batch (same numbers everywhere)
    updates     every minibatch is the same on every rank; rank r computes rows r, r + G, … of it.
                Its loss is its share of the minibatch's masked mean,

                    L_r = Σ_{decisions d of rank r} ℓ_d / n_minibatch      (n over all ranks)

                so Σ_r ∇L_r = ∇L of one process: the active adapter's gradients are summed over
                ranks (one flat all-reduce) before the clip and the optimiser step. The KL early
                stop, the non-finite-step check and the logged losses use the summed values, so
                every rank takes the same decision (collectives stay in lockstep).
    writing     rank 0 alone writes metrics, summaries and checkpoints; all ranks read a checkpoint
                on --resume (several nodes need a shared file system for that).

Reductions use SUM (and divide): ReduceOp.AVG exists only for NCCL and is wrong on gloo. DDP is
not used: the active adapter changes at every agent's update, which DDP's fixed set of reduced
parameters does not allow. Without the torchrun environment (WORLD_SIZE unset or 1) every
function here is a no-op and `python marft.py` runs exactly as a single process.
"""
from __future__ import annotations

import hashlib
import os
from datetime import timedelta

import torch
import torch.distributed as dist


def world_size() -> int:
    """G: the number of ranks (1 without torchrun)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """r: this process's rank (0 without torchrun)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    """Rank 0: the one process that prints and writes files."""
    return rank() == 0


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(device: str, timeout_minutes: float) -> None:
    """Join the process group torchrun describes (gloo on a CPU, NCCL on CUDA devices); a
    collective that waits longer than `timeout_minutes` raises instead of hanging."""
    if not launched_by_torchrun() or dist.is_initialized():
        return
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, timeout=timedelta(minutes=timeout_minutes))


def local_threads(threads: int) -> int:
    """Torch threads of this process: `threads`, or (0) the cores shared evenly among the ranks of this node."""
    if threads:
        return threads
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, (os.cpu_count() or 1) // per_node)


def shard(items: list) -> list:
    """This rank's share of a list: items r, r + G, r + 2G, …"""
    return items[rank() :: world_size()]


def rows_of(minibatch: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """This rank's rows r, r + G, … of a minibatch (the same minibatch on every rank), and whether
    they count. A rank left with none (a minibatch shorter than G) computes on the first row with
    weight 0, so that it still joins every collective of the step."""
    mine = minibatch[rank() :: world_size()]
    return (mine, True) if len(mine) else (minibatch[:1], False)


def rank_seed(seed: int, r: int) -> int:
    """The torch seed of rank r's sampling noise when rank 0 samples from `seed`.

    Rank 0 keeps `seed` (a 1-rank run draws exactly as a plain process). Rank r > 0 gets a stable
    hash of (seed, r) (blake2b: the same on every machine and Python) in [2^62, 2^63), above every
    seed a run gives rank 0 (marft.seed_iteration's seed · 1_000_003 + iteration, for any run seed
    below 4·10^12): no rank's stream is another seed's rank-0 stream (a stride, seed + 1_000_003 · r,
    made rank r of run seed s rank 0 of run seed s + r), and two ranks > 0 share a stream only on
    a 62-bit hash collision."""
    if r == 0:
        return seed
    digest = hashlib.blake2b(f"marft-rank-seed/{seed}/{r}".encode(), digest_size=8).digest()
    return 2**62 + int.from_bytes(digest, "big") % 2**62


def reseed_sampling() -> None:
    """Give every rank its own sampling noise, continuing from the seed last set with
    torch.manual_seed (`rank_seed`: rank 0 keeps it)."""
    if rank() > 0:
        torch.manual_seed(rank_seed(torch.initial_seed(), rank()))


def all_gather_objects(obj) -> list:
    """[obj of rank 0, obj of rank 1, …] on every rank (pickled: for rollouts, not tensors of weights)."""
    if world_size() == 1:
        return [obj]
    gathered = [None] * world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj):
    """Rank 0's `obj` on every rank (decisions that must agree, e.g. the time limit)."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def sum_(tensor: torch.Tensor) -> torch.Tensor:
    """Σ over ranks, in place (and returned)."""
    if world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_ranks(flag: bool) -> bool:
    """True when `flag` holds on every rank (e.g. every rank's loss is finite)."""
    if world_size() == 1:
        return flag
    box = torch.tensor([0 if flag else 1], dtype=torch.long)
    dist.all_reduce(box, op=dist.ReduceOp.SUM)
    return int(box.item()) == 0


def max_int(value: int) -> int:
    """The largest value over ranks."""
    if world_size() == 1:
        return value
    box = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return int(box.item())


def sum_gradients(params: list[torch.Tensor]) -> None:
    """∇ ← Σ_r ∇_r for `params` (one flat all-reduce); a rank that computed nothing adds zeros."""
    if world_size() == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def close() -> None:
    """Leave the process group (at the end of a run)."""
    if world_size() > 1:
        dist.destroy_process_group()
