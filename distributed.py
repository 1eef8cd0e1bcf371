"""Data parallelism: one MARFT run over G processes launched by torchrun, on one node or several.

Not in the paper (one learner there; README: "More than one device"): every rank holds equal copies of the
model, adapters, critic and optimisers, and each phase is spread so that the numbers stay one process's:

    rollout     rank r plays episodes r, r + G, … (`rank_seed`), merged in one process's order (rollout.merge_rollouts)
    old policy  forward batches split round-robin over ranks, the tables summed
    advantages  on every rank, from the whole batch
    updates     rank r computes rows r, r + G, … of the same minibatch, its loss its share of the mean:
                    L_r = Σ_{decisions d of rank r} ℓ_d / n_minibatch      (n over all ranks)
                so Σ_r ∇L_r = ∇L of one process (`sum_gradients` before the clip and the step); the early
                stop, the non-finite check and the logged losses are summed too: every rank decides alike
    writing     rank 0 alone writes; all ranks read a checkpoint on --resume (a shared file system)

Reductions are SUM (then divide): ReduceOp.AVG exists only for NCCL, never on gloo. No DDP: it reduces a fixed
set of parameters, and the active adapter changes at every update. Without torchrun every function is a no-op.
"""
from __future__ import annotations

import hashlib
import os
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT_MINUTES = 30.0  # a collective that waits longer raises an error instead of hanging


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1  # G (1 without torchrun)


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0  # r (0 without torchrun)


def is_main() -> bool:
    return rank() == 0  # the one process that prints and writes files


def rank_device(requested: str, *, launched: bool, local_rank: int, local_ranks: int, gpus: int) -> str:
    """This rank's torch device for --device `requested` (rank `local_rank` of `local_ranks` on this node): cpu;
    auto: cpu without a GPU, else as cuda; cuda: cuda:0, under torchrun cuda:LOCAL_RANK (more ranks than GPUs: an
    error, as NCCL refuses); cuda:k: cuda:k, under torchrun an error (every rank would share GPU k): use cuda."""
    if requested == "cpu" or (requested == "auto" and gpus == 0):
        return "cpu"
    if gpus == 0:
        raise ValueError(f"--device {requested}: torch sees no GPU here; use --device cpu (or auto)")
    if requested in ("auto", "cuda"):
        if launched and local_ranks > gpus:
            raise ValueError(f"{local_ranks} ranks on this node but torch sees {gpus} GPU(s): launch at most {gpus} "
                             f"(NPROC={gpus}), one rank per GPU, or use --device cpu")
        return f"cuda:{local_rank}" if launched else "cuda:0"
    index = requested.removeprefix("cuda:")
    if not requested.startswith("cuda:") or not index.isdigit():
        raise ValueError(f"--device {requested}: use auto, cpu, cuda or cuda:k")
    if launched:
        raise ValueError(f"--device {requested} under torchrun would put every rank on GPU {index}: use --device cuda "
                         "(rank r takes cuda:LOCAL_RANK; CUDA_VISIBLE_DEVICES picks which GPUs)")
    if int(index) >= gpus:
        raise ValueError(f"--device {requested}: torch sees {gpus} GPU(s), cuda:0 to cuda:{gpus - 1}")
    return requested


def device_of_this_rank(requested: str) -> str:
    """rank_device for this process: torchrun's LOCAL_RANK / LOCAL_WORLD_SIZE, the GPUs torch sees."""
    return rank_device(requested, launched=int(os.environ.get("WORLD_SIZE", "1")) > 1,
                       local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                       local_ranks=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                       gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0)


def init(device: str) -> str:
    """This rank's device, made the current CUDA device first; under torchrun, join the group (NCCL or gloo)."""
    resolved = device_of_this_rank(device)
    if resolved.startswith("cuda"):
        torch.cuda.set_device(resolved)  # NCCL, vLLM and `cuda` without an index now mean this rank's GPU
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():  # launched by torchrun
        backend = "nccl" if resolved.startswith("cuda") else "gloo"
        dist.init_process_group(backend, timeout=timedelta(minutes=TIMEOUT_MINUTES),
                                device_id=torch.device(resolved) if backend == "nccl" else None)
    return resolved


def local_threads(threads: int) -> int:
    """Torch threads of this process: `threads`, or (0) the cores shared evenly among the ranks of this node."""
    return threads or max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def shard(items: list) -> list:
    """This rank's share of a list: items r, r + G, r + 2G, …"""
    return items[rank() :: world_size()]


def rows_of(minibatch: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """This rank's rows r, r + G, … of a minibatch and whether they count (none left: row 0 at weight 0)."""
    mine = minibatch[rank() :: world_size()]
    return (mine, True) if len(mine) else (minibatch[:1], False)


def rank_seed(seed: int, r: int) -> int:
    """Rank r's sampling seed: `seed` on rank 0; else a hash of (seed, r) in [2^62, 2^63), which no rank-0 seed reaches."""
    digest = hashlib.blake2b(f"marft-rank-seed/{seed}/{r}".encode(), digest_size=8).digest()
    return seed if r == 0 else 2**62 + int.from_bytes(digest, "big") % 2**62


def reseed_sampling() -> None:
    """Give every rank its own sampling noise from the seed last set (`rank_seed`: rank 0 keeps it)."""
    if rank() > 0:
        torch.manual_seed(rank_seed(torch.initial_seed(), rank()))


def all_gather_objects(obj) -> list:
    """[obj of rank 0, obj of rank 1, …] on every rank (pickled: for rollouts, not tensors of weights)."""
    gathered = [obj] * world_size()
    if world_size() > 1:
        dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj):
    """Rank 0's `obj` on every rank (decisions that must agree, e.g. the time limit)."""
    box = [obj]
    if world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]


def backend_device() -> torch.device:
    """Where the process group's collectives want their tensors: this rank's GPU for NCCL, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce(tensor: torch.Tensor, op=None) -> torch.Tensor:
    """The one door to tensor collectives: `tensor` (any device) reduced over ranks in place, SUM by default; returned."""
    if not (dist.is_available() and dist.is_initialized()):
        return tensor
    on_backend = tensor.to(backend_device())  # the same tensor when it is already there
    dist.all_reduce(on_backend, op=dist.ReduceOp.SUM if op is None else op)
    if on_backend is not tensor:
        tensor.copy_(on_backend)
    return tensor


sum_ = all_reduce  # Σ over ranks, in place (and returned)


def all_ranks(flag: bool) -> bool:
    return int(all_reduce(torch.tensor([0 if flag else 1], dtype=torch.long)).item()) == 0  # `flag` on every rank


def max_int(value: int) -> int:
    return int(all_reduce(torch.tensor([value], dtype=torch.long), dist.ReduceOp.MAX).item())  # the largest over ranks


def sum_gradients(params: list[torch.Tensor]) -> None:
    """∇ ← Σ_r ∇_r for `params` (one flat all-reduce); a rank that computed nothing adds zeros."""
    if world_size() == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = all_reduce(torch.cat([g.reshape(-1) for g in grads]))
    for p, summed in zip(params, flat.split([p.numel() for p in params])):
        p.grad = summed.view_as(p).clone()


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def close() -> None:
    if world_size() > 1:  # leave the process group at the end of a run
        dist.destroy_process_group()
