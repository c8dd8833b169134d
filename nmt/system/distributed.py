"""Data-parallel training across processes started by torchrun (NCCL on GPUs, gloo on CPUs).

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (on one machine, or
on several through its c10d rendezvous); a SLURM job that Hydra's submitit launcher started
(hydra/launcher=slurm) gets them from submitit, one task per rank. Without them training runs
in one process and every helper here is a no-op. Every collective of nmt goes
through this module: tensors through the default group on the training device (NCCL needs
them on the GPU), Python objects pickled through a gloo group on the CPU. Only rank 0 writes
files; what it reads (the checkpoint to start from) reaches the other ranks by broadcast, so
that ranks never disagree and need no shared file system.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from nmt.errors import NmtError, first_line
from nmt.system.runtime import pick_device

_objects_group = None  # gloo group for Python objects (None: the default group is gloo)
# A failed or timed-out NCCL collective ends the process from the watchdog thread, without
# waiting on the communicators (which can hang): PyTorch's default, made explicit here because
# torchrun sets 1 (abort the communicators first) when the variable is unset, submitit nothing.
NCCL_ERROR_HANDLING = "3"


@dataclass
class DistInfo:
    """Where this process stands: its rank among world_size processes, and its device."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """True on the process that writes checkpoints and logs."""
        return self.rank == 0


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


def init(device: str = "auto", timeout_s: float = 600.0, key: str = "device") -> DistInfo:
    """Join the process group that torchrun (or submitit) describes, if any, on the device
    that config key `key` names (auto, cpu or cuda: runtime.pick_device).

    Under NCCL the group is bound to this rank's GPU (device_id) and a gloo group is made
    for Python objects. A collective that waits longer than timeout_s fails on every rank:
    under gloo it raises (collective_errors makes it one line); under NCCL the watchdog thread
    ends the process instead, with PyTorch's "Watchdog caught collective operation timeout"
    on stderr (TORCH_NCCL_ASYNC_ERROR_HANDLING, set here to NCCL_ERROR_HANDLING unless the
    environment sets it; docs/gpu.md lists the NCCL variables).
    """
    global _objects_group
    export_submitit_ranks()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local_rank, key)
    launched = world_size > 1 or "TORCHELASTIC_RUN_ID" in os.environ  # torchrun, even of 1
    if launched and not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s)
        try:
            if dev.type == "cuda":
                os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", NCCL_ERROR_HANDLING)
                torch.cuda.set_device(dev)
                dist.init_process_group("nccl", timeout=timeout, device_id=dev)
                _objects_group = dist.new_group(backend="gloo", timeout=timeout)
            else:
                dist.init_process_group("gloo", timeout=timeout)
        except (RuntimeError, ValueError) as e:
            raise NmtError(f"rank {rank}: cannot join the process group "
                           f"({first_line(e)})") from None
    return DistInfo(rank, world_size, dev)


def shutdown() -> None:
    """Leave the process group (at the end of training)."""
    global _objects_group
    if dist.is_initialized():
        dist.destroy_process_group()
    _objects_group = None


# What gloo and NCCL errors say (DDP's reducer raises them as plain RuntimeErrors).
_COLLECTIVE_FAILURE = re.compile(r"gloo|nccl|ProcessGroup|connection (closed|reset)|timed? ?out",
                                 re.IGNORECASE)


@contextlib.contextmanager
def collective_errors(rank: int) -> Iterator[None]:
    """Turn a failed or timed-out collective into a one-line NmtError (another rank died,
    raised or ran out of memory: its own error says why): every error of gloo, and those of
    NCCL that reach Python (a group that cannot be made, a communicator already aborted);
    NCCL's timeouts end the process from its watchdog instead (see init)."""
    try:
        yield
    except RuntimeError as e:  # dist.DistError is one
        if not (isinstance(e, dist.DistError) or (dist.is_initialized()
                                                   and _COLLECTIVE_FAILURE.search(str(e)))):
            raise
        raise NmtError(f"rank {rank}: a collective operation failed ({first_line(e)}); "
                       f"another rank probably stopped first (see its error), or "
                       f"train.collective_timeout passed") from None


# ----------------------------------------------------------------------------- collectives
def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum `t` (on the training device) over all ranks, in place; returns it."""
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_object(obj, src: int = 0):
    """Rank src's picklable `obj` on every rank."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=_objects_group)
    return box[0]


def all_gather_objects(obj) -> list:
    """Every rank's picklable `obj`, in rank order."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=_objects_group)
    return out


def barrier() -> None:
    """Wait for every rank."""
    if dist.is_initialized():
        dist.barrier(group=_objects_group)


class _TensorSlot(NamedTuple):
    """Where a tensor was in a broadcast structure: its index, shape and dtype."""

    index: int
    shape: tuple
    dtype: torch.dtype


def _map(x, fn):
    """x with fn applied to every tensor / _TensorSlot inside dicts, lists and tuples."""
    if isinstance(x, torch.Tensor | _TensorSlot):
        return fn(x)
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(_map(v, fn) for v in x)
    return x


def from_main(load: Callable[[], dict | None], device: torch.device) -> dict | None:
    """load() run on rank 0 and its result on every rank: a nested dict of tensors (returned
    on the CPU) and plain values, or None. An NmtError that load() raises on rank 0 is
    raised on every rank, so no rank waits for a state that never comes."""
    if not dist.is_initialized():
        return load()
    main, tensors, error, skeleton = dist.get_rank() == 0, [], None, None

    def slot(t: torch.Tensor) -> _TensorSlot:
        tensors.append(t)
        return _TensorSlot(len(tensors) - 1, tuple(t.shape), t.dtype)

    if main:
        try:
            skeleton = _map(load(), slot)
        except NmtError as e:
            error = str(e)
    error, skeleton = broadcast_object((error, skeleton))
    if error is not None:
        raise NmtError(error)

    def receive(slot: _TensorSlot) -> torch.Tensor:
        t = (tensors[slot.index].to(device).contiguous() if main
             else torch.empty(slot.shape, dtype=slot.dtype, device=device))
        dist.broadcast(t, src=0)
        return t.cpu()

    return _map(skeleton, receive)
