"""Data-parallel training across processes started by torchrun (NCCL on GPUs, gloo on CPUs).

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK (on one machine, or on several through its c10d
rendezvous); a SLURM job that Hydra's submitit launcher started (hydra/launcher=slurm) gets them
from submitit, one task per rank. Without them training runs in one process and every helper
here is a no-op. Only rank 0 writes files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from nmt.errors import NmtError


@dataclass
class DistInfo:
    """Where this process stands: its rank among world_size processes, and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """True on the process that writes checkpoints and logs."""
        return self.rank == 0


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """"auto" -> cuda:<local_rank> when CUDA is available, else cpu."""
    if name == "cuda" and not torch.cuda.is_available():
        raise NmtError("train.device: cuda requested but torch.cuda.is_available() is false")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", local_rank)


def export_submitit_ranks() -> None:
    """In a task that submitit started (SLURM, or its local executor), set the variables torchrun
    would: MASTER_ADDR (the job's first node), MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK.
    Variables already set win (e.g. MASTER_PORT chosen by the user)."""
    if "WORLD_SIZE" in os.environ or not os.environ.get("SUBMITIT_EXECUTOR"):
        return
    from submitit.helpers import TorchDistributedEnvironment

    env = TorchDistributedEnvironment()
    for key, value in (("MASTER_ADDR", env.master_addr), ("MASTER_PORT", env.master_port),
                       ("RANK", env.rank), ("WORLD_SIZE", env.world_size),
                       ("LOCAL_RANK", env.local_rank)):
        os.environ.setdefault(key, str(value))


def init(device: str = "auto") -> DistInfo:
    """Join the process group that torchrun (or submitit) describes in the environment, if any."""
    export_submitit_ranks()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local_rank)
    if world_size > 1 and not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return DistInfo(rank, world_size, local_rank, dev)


def shutdown() -> None:
    """Leave the process group (at the end of training)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum `t` over all ranks, in place; returns it."""
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_object(obj, src: int = 0):
    """Rank src's `obj` on every rank."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_objects(obj) -> list:
    """Every rank's `obj`, in rank order."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    """Wait for every rank."""
    if dist.is_initialized():
        dist.barrier()
