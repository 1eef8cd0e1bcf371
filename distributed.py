"""Data parallelism: one MARFT run over G processes launched by torchrun, on one node or several.

Not in the paper (its algorithm box is one learner): each phase's work is spread over ranks so that
the numbers stay those of one process (README: "More than one device"). Every rank holds the base
model, every adapter, the critic and the optimiser states, all equal. Per iteration:

    rollout     rank r plays episodes r, r + G, … with its own sampling seed (`rank_seed`); the parts
                are gathered and merged in one process's order (rollout.merge_rollouts)
    old policy  forward batches split round-robin over ranks, the tables summed
    advantages  on every rank, from the whole batch
    updates     every rank has the same minibatch and computes its rows r, r + G, …; its loss is its
                share of the minibatch's masked mean,

                    L_r = Σ_{decisions d of rank r} ℓ_d / n_minibatch      (n over all ranks)

                so Σ_r ∇L_r = ∇L of one process: the gradients are summed (`sum_gradients`) before
                the clip and the step; the early stop, the non-finite check and the logged losses use
                summed values, so every rank decides alike (collectives stay in lockstep)
    writing     rank 0 alone writes; all ranks read a checkpoint on --resume (a shared file system)

Devices: `rank_device`. Reductions use SUM (and divide): ReduceOp.AVG exists only for NCCL. No DDP:
the active adapter changes at every agent's update, which DDP's fixed set of reduced parameters does
not allow. Without torchrun (WORLD_SIZE unset or 1) every function here is a no-op.
"""
from __future__ import annotations

import hashlib
import os
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT_MINUTES = 30.0  # a collective that waits longer raises an error instead of hanging


def world_size() -> int:
    """G: the number of ranks (1 without torchrun)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """r: this process's rank (0 without torchrun)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    """Rank 0: the one process that prints and writes files."""
    return rank() == 0


def rank_device(requested: str, *, launched: bool, local_rank: int, local_ranks: int, gpus: int) -> str:
    """The torch device of this rank for --device `requested` (a pure function of its arguments).

        requested   one process                 under torchrun (rank `local_rank` of `local_ranks` on this node)
        cpu         cpu                         cpu
        auto        cuda:0, or cpu without GPU  cuda:LOCAL_RANK, or cpu without GPU
        cuda        cuda:0                      cuda:LOCAL_RANK
        cuda:k      cuda:k                      an error (every rank would share GPU k): use cuda

    ValueError (naming the fix) for a GPU asked of a machine without one, a cuda:k beyond the GPUs
    seen, and more ranks on a node than GPUs (NCCL refuses two ranks on one GPU)."""
    if requested == "cpu" or (requested == "auto" and gpus == 0):
        return "cpu"
    if gpus == 0:
        raise ValueError(f"--device {requested}: torch sees no GPU here; use --device cpu (or auto)")
    if requested in ("auto", "cuda"):
        if not launched:
            return "cuda:0"
        if local_ranks > gpus:
            raise ValueError(f"{local_ranks} ranks on this node but torch sees {gpus} GPU(s): launch at most {gpus} "
                             f"(NPROC={gpus}), one rank per GPU, or use --device cpu")
        return f"cuda:{local_rank}"
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
    """This rank's device (returned), made the current CUDA device before anything touches CUDA; then,
    under torchrun, join the process group: NCCL on a GPU, gloo on a CPU."""
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
    """This rank's rows r, r + G, … of a minibatch, and whether they count: a rank left with none computes
    on the first row with weight 0, so that it still joins every collective of the step."""
    mine = minibatch[rank() :: world_size()]
    return (mine, True) if len(mine) else (minibatch[:1], False)


def rank_seed(seed: int, r: int) -> int:
    """The torch seed of rank r's sampling noise when rank 0 samples from `seed`: rank 0 keeps it (a 1-rank
    run draws as a plain process); rank r > 0 gets a stable hash of (seed, r) in [2^62, 2^63), above every
    seed run.seed_iteration gives rank 0, so no rank's stream is another run's rank-0 stream."""
    if r == 0:
        return seed
    digest = hashlib.blake2b(f"marft-rank-seed/{seed}/{r}".encode(), digest_size=8).digest()
    return 2**62 + int.from_bytes(digest, "big") % 2**62


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
    """The one door to tensor collectives: reduce `tensor` over ranks (SUM by default) in place, via
    the backend's device, and return it (callers hold tables anywhere). A no-op without a group."""
    if not (dist.is_available() and dist.is_initialized()):
        return tensor
    on_backend = tensor.to(backend_device())  # the same tensor when it is already there
    dist.all_reduce(on_backend, op=dist.ReduceOp.SUM if op is None else op)
    if on_backend is not tensor:
        tensor.copy_(on_backend)
    return tensor


sum_ = all_reduce  # Σ over ranks, in place (and returned)


def all_ranks(flag: bool) -> bool:
    """True when `flag` holds on every rank (e.g. every rank's loss is finite)."""
    return int(all_reduce(torch.tensor([0 if flag else 1], dtype=torch.long)).item()) == 0


def max_int(value: int) -> int:
    """The largest value over ranks."""
    return int(all_reduce(torch.tensor([value], dtype=torch.long), dist.ReduceOp.MAX).item())


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
    """Leave the process group (at the end of a run)."""
    if world_size() > 1:
        dist.destroy_process_group()
