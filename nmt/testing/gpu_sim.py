"""The GPU simulation harness: the GPU paths without a GPU, a simulated CUDA device and a
simulated world of ranks, in one CPU process, and what they measure. Tests and scripts use it
(tests/system/test_gpu_sim.py; nmt.testing.gpu_cost measures nmt's own work with it; docs/gpu.md);
no command of nmt imports it, and it is the one module besides nmt.system.private_ops that reaches
into torch's internals (it checks them itself: `MISSING`).

Simulated CUDA (`simulated_cuda`). torch's FakeTensorMode makes tensors that have a shape, a
dtype and a device but no data. On the CPU wheel it makes them on "cuda" once three things
hold: a device guard is registered for CUDA (the wheel registers none; c10's no-op guard of the
Meta device is copied into c10's registry through ctypes), torch.cuda reports a GPU (else
autocast("cuda") silently turns itself off), and the mode avoids device initialisation (else
it runs real CUDA kernels). Reading data then raises (.item(), .tolist(), bool(), nonzero): a
run that completes read nothing from the device. A CUDA operator given a CPU tensor raises a
device mismatch. Three more stand-ins: Module.to rebuilds parameters and buffers on the device
(fake tensors cannot be swapped in place), pin_memory is the identity, and backward, which
autograd's engine runs only on a real accelerator, either sets each leaf's gradient to zeros
(`backward="zeros"`) or runs the graph's own backward formulas node by node in Python
(`backward="graph"`), releasing each node's saved tensors after it as the engine does.

Simulated ranks (`World`). torch's fake process group lets one process be rank r of N: its
collectives move no data. DDP's reducer gets a pass-through communication hook; the object
collectives are faked per rank (a rank receives what rank 0, simulated first, sent). Every
collective is recorded as (operator, shape, dtype, device).

Measurements. `HostReads` counts host reads of real tensors (what makes a GPU's queue drain);
`DeviceProfile` counts operators launched per phase of an update and follows the live device
memory and its peak (storages freed when their last reference goes, as the caching
allocator's blocks; blocks rounded to 512 bytes).

These lean on torch internals; `MISSING` names the first one absent (tests skip with it).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import heapq
import os
import warnings
import weakref
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_C10 = Path(torch.__file__).parent / "lib" / "libc10.so"
_GUARDS = "_ZN3c104impl26device_guard_impl_registryE"  # c10::impl::device_guard_impl_registry


def _missing() -> str | None:
    """The first torch internal this harness needs that this torch lacks, or None."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: F401
        from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401
    except ImportError as e:
        return f"torch internal missing: {e}"
    try:
        ctypes.c_void_p.in_dll(ctypes.CDLL(str(_C10)), _GUARDS)
    except (OSError, ValueError):
        return f"torch internal missing: {_GUARDS} in {_C10.name}"
    for name in ("_input_metadata", "_sequence_nr"):
        if not hasattr(torch.autograd.graph.Node, name):
            return f"torch internal missing: torch.autograd.graph.Node.{name}"
    return None


MISSING = _missing()
if MISSING is None:
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        FakeTensorMode,
        UnsupportedOperatorException,
    )
    from torch.testing._internal.distributed.fake_pg import FakeStore

    HOST_READ = (DataDependentOutputException, DynamicOutputShapeException)  # what reads raise
    NO_GPU_KERNEL = UnsupportedOperatorException  # what a CPU-only operator raises

    class _SimulatedMode(FakeTensorMode):
        """FakeTensorMode that never initialises a real CUDA device."""

        avoid_device_init = property(lambda self: True)


# ----------------------------------------------------------------------------- simulated CUDA
_FUSED_ADAM_TENSOR_LR = ("_fused_adam_.tensor_lr", "_fused_adamw_.tensor_lr")


def _fused_adam_tensor_lr_meta(params, grads, *args, lr: Tensor, **kwargs) -> None:
    """Fused Adam(W) with a tensor learning rate (nmt's NoamSchedule on GPUs), for fake
    tensors: torch registers a Meta kernel for the float-lr overload only. Checks what the
    CUDA kernel needs of the rate (float32, a single value on the parameters' device; it
    reads it there) and writes nothing, as torch's float-lr Meta kernel."""
    torch._check(lr.dtype == torch.float32 and lr.numel() == 1,
                 lambda: f"fused Adam reads a tensor lr as float32, got {lr.dtype}")
    torch._check(lr.device == params[0].device,
                 lambda: f"tensor lr on {lr.device}, parameters on {params[0].device}")


def _register_fused_adam_tensor_lr() -> list:
    """The Meta kernels above, for the overloads this torch lacks one for (kept registered)."""
    libraries = []
    for op in _FUSED_ADAM_TENSOR_LR:
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "Meta"):
            lib = torch.library.Library("aten", "IMPL")
            lib.impl(op, _fused_adam_tensor_lr_meta, "Meta")
            libraries.append(lib)
    return libraries


_META_LIBRARIES = _register_fused_adam_tensor_lr() if MISSING is None else []


def _guard_registry():
    """c10's device guard registry: one pointer per device type."""
    base = ctypes.c_void_p.in_dll(ctypes.CDLL(str(_C10)), _GUARDS)
    return (ctypes.c_void_p * 64).from_address(ctypes.addressof(base))


@contextlib.contextmanager
def _cuda_device_guard():
    """Register the Meta device's no-op guard for CUDA while inside (if none is registered)."""
    registry = _guard_registry()
    cuda, meta = int(torch._C._autograd.DeviceType.CUDA), int(torch._C._autograd.DeviceType.Meta)
    before = registry[cuda]
    if not before:
        registry[cuda] = registry[meta]
    try:
        yield
    finally:
        registry[cuda] = before


def _module_to(module: nn.Module, *args, **kwargs) -> nn.Module:
    """nn.Module.to for fake tensors: each parameter and buffer not yet on the device (or in
    the dtype) is rebuilt there; tied parameters stay tied."""
    device, dtype, *_ = torch._C._nn._parse_to(*args, **kwargs)
    moved: dict[int, Tensor] = {}

    def move(t: Tensor) -> Tensor:
        if id(t) not in moved:
            want = dtype if dtype is not None and t.is_floating_point() else t.dtype
            if (device is None or t.device == device) and t.dtype == want:
                moved[id(t)] = t
            else:
                new = t.detach().to(device=device, dtype=want)
                moved[id(t)] = nn.Parameter(new, t.requires_grad) if isinstance(
                    t, nn.Parameter) else new
        return moved[id(t)]

    for m in module.modules():
        for table in (m._parameters, m._buffers):
            for name, t in table.items():
                if t is not None:
                    table[name] = move(t)
    return module


def _leaves(root: Tensor):
    """The leaf tensors (parameters) that root's autograd graph accumulates gradients into."""
    seen, todo = set(), [root.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):  # AccumulateGrad
            yield node.variable
        todo.extend(child for child, _ in node.next_functions)


def zeros_backward(self: Tensor, *args, **kwargs) -> None:
    """Tensor.backward standing in for autograd's engine: every leaf gets zero gradients."""
    for leaf in _leaves(self):
        if leaf.grad is None:
            leaf.grad = torch.zeros_like(leaf)


class _Saved:
    """A tensor autograd saved for backward, held here so that it can be released."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Tensor):
        self.tensor = tensor


class GraphBackward:
    """Tensor.backward run node by node in Python: each node's backward formula (C++ nodes are
    callable, custom Functions have apply) in the engine's order (highest sequence number of
    the ready nodes first), gradients summed per input and cast/reduced to its metadata as the
    engine does, AccumulateGrad filling .grad. While installed, saved tensors are packed into
    _Saved holders, and the holders a node unpacks are emptied after it runs: the engine's
    release of saved variables, so that device memory falls as it would."""

    def __init__(self):
        self.unpacked: list[_Saved] = []
        self.hooks = torch.autograd.graph.saved_tensors_hooks(_Saved, self._unpack)

    def _unpack(self, saved: _Saved) -> Tensor:
        self.unpacked.append(saved)
        return saved.tensor

    def __call__(self, root: Tensor, gradient: Tensor | None = None, *args, **kwargs) -> None:
        """root.backward(gradient)."""
        deps: dict = {}
        todo, seen = [root.grad_fn], {root.grad_fn}
        while todo:  # count each node's incoming edges
            for child, _ in todo.pop().next_functions:
                if child is not None:
                    deps[child] = deps.get(child, 0) + 1
                    if child not in seen:
                        seen.add(child)
                        todo.append(child)
        inputs = {root.grad_fn: self._buffer(root.grad_fn)}
        inputs[root.grad_fn][root.output_nr] = (torch.ones_like(root) if gradient is None
                                                else gradient)
        ready = [(-root.grad_fn._sequence_nr(), id(root.grad_fn), root.grad_fn)]
        with torch.no_grad():  # as the engine runs backward (create_graph=False)
            self._drain(ready, inputs, deps)

    def _drain(self, ready: list, inputs: dict, deps: dict) -> None:
        """Run the ready nodes, and those they make ready, until none is left."""
        while ready:
            node = heapq.heappop(ready)[2]
            grads = self._run(node, inputs.pop(node))
            for (child, nr), grad in zip(node.next_functions, grads, strict=False):
                if child is None:
                    continue
                if grad is not None:
                    buffer = inputs.setdefault(child, self._buffer(child))
                    grad = _fit(grad, child._input_metadata[nr])
                    buffer[nr] = grad if buffer[nr] is None else buffer[nr] + grad
                deps[child] -= 1
                if deps[child] == 0:
                    if child in inputs:
                        heapq.heappush(ready, (-child._sequence_nr(), id(child), child))
                    else:  # no gradient reached it: nothing to do below it either
                        self._skip(child, deps)

    @staticmethod
    def _buffer(node) -> list:
        return [None] * len(node._input_metadata)

    def _skip(self, node, deps: dict) -> None:
        """Count down the edges of a node that receives no gradient."""
        for child, _ in node.next_functions:
            if child is not None:
                deps[child] -= 1
                if deps[child] == 0:
                    self._skip(child, deps)

    def _run(self, node, grads: list) -> tuple:
        """One node's backward: the gradients of its inputs (one per next_functions edge)."""
        if hasattr(node, "variable"):  # AccumulateGrad
            leaf, grad = node.variable, grads[0]
            if grad is not None:
                leaf.grad = grad.detach() if leaf.grad is None else leaf.grad + grad
            return ()
        if hasattr(node, "apply"):  # a custom autograd.Function (grads materialised)
            grads = [torch.zeros(m.shape, dtype=m.dtype, device=m.device) if g is None else g
                     for g, m in zip(grads, node._input_metadata, strict=True)]
            out = node.apply(*grads)
        else:
            out = node(*grads)
        for saved in self.unpacked:  # release what the node saved
            saved.tensor = None
        self.unpacked.clear()
        return out if isinstance(out, tuple) else (out,)


def _fit(grad: Tensor, meta) -> Tensor:
    """A gradient summed to its input's shape and cast to its dtype (the engine's checks)."""
    if grad.shape != meta.shape:
        grad = grad.sum_to_size(meta.shape)
    return grad if grad.dtype == meta.dtype else grad.to(meta.dtype)


@contextlib.contextmanager
def simulated_cuda(backward: str = "zeros", capability: tuple[int, int] = (9, 0)):
    """Inside: tensors made on "cuda" are fake tensors of a simulated GPU of this compute
    capability; backward is zeros_backward or GraphBackward ("zeros" or "graph")."""
    engine = GraphBackward() if backward == "graph" else None
    run_backward = zeros_backward if engine is None else (
        lambda self, *args, **kwargs: engine(self, *args, **kwargs))
    patches = [
        mock.patch.object(torch.cuda, "is_available", lambda: True),
        mock.patch.object(torch.cuda, "device_count", lambda: 1),
        mock.patch.object(torch.cuda, "is_bf16_supported", lambda *a, **k: capability >= (8, 0)),
        mock.patch.object(torch.cuda, "get_device_capability", lambda *a, **k: capability),
        mock.patch.object(torch.cuda, "get_device_name", lambda *a, **k: "simulated GPU"),
        mock.patch.object(torch.Tensor, "pin_memory", lambda self, *a, **k: self),
        mock.patch.object(nn.Module, "to", _module_to),
        mock.patch.object(torch.Tensor, "backward", run_backward),
    ]
    with contextlib.ExitStack() as stack, _cuda_device_guard(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Accessing the data pointer of FakeTensor")  # deepcopy
        for patch in patches:
            stack.enter_context(patch)
        if engine is not None:
            stack.enter_context(engine.hooks)
        stack.enter_context(_SimulatedMode(allow_non_fake_inputs=True))
        yield


def fused_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                    dropout_p: float = 0.0, is_causal: bool = False, scale=None,
                    **kwargs) -> Tensor:
    """F.scaled_dot_product_attention as CUDA runs it for nmt (the simulated device always
    falls back to the math kernel, which keeps the (B, h, T, S) weights): flash attention
    without a mask in half precision, else the memory-efficient kernel; their operators,
    saved tensors (q, k, v, the output and the log-sum-exp) and backward formulas."""
    if attn_mask is None and q.dtype in (torch.bfloat16, torch.float16):
        return torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, dropout_p, is_causal, scale=scale)[0]
    if attn_mask is not None:
        attn_mask = attn_mask.expand(q.size(0), q.size(1), q.size(2), k.size(2))
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, attn_mask, True, dropout_p, is_causal, scale=scale)[0]


# ----------------------------------------------------------------------------- measurements
_READS = {"_local_scalar_dense", "item", "is_nonzero", "nonzero", "equal", "masked_select",
          "_unique2", "unique_consecutive", "unique_dim"}


def _is_read(func, args) -> bool:
    """Whether an operator reads tensor data on the host (or sizes an output by it)."""
    name = func._schema.name.split("::")[-1]
    if name in _READS:
        return True
    return name == "index" and any(isinstance(i, Tensor) and i.dtype == torch.bool
                                   for i in tree_leaves(args[1:]))


class HostReads(TorchDispatchMode):
    """Counts host reads of tensor data: .item(), bool(), int(), .tolist(), .numpy() (one each),
    torch.equal, nonzero and boolean masks, where a GPU's queue must drain. `per_step`:
    reads recorded after each call of `step()` (the decoding steps), `before`: before the
    first step."""

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []
        self.steps, self.before = 0, 0
        self.per_step: list[int] = []

    def step(self) -> None:
        """A decoding step begins."""
        if self.steps == 0:
            self.before = len(self.reads)
        self.steps += 1
        self.per_step.append(0)

    def _add(self, what: str) -> None:
        self.reads.append(what)
        if self.per_step:
            self.per_step[-1] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _is_read(func, args):
            self._add(func._schema.name)
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._patches = [mock.patch.object(torch.Tensor, name, self._counted(name))
                         for name in ("tolist", "numpy")]
        for patch in self._patches:
            patch.__enter__()
        return super().__enter__()

    def _counted(self, name: str):
        """Tensor.<name> counted as one read: a CPU tensor's tolist and numpy do not dispatch
        (on a GPU, numpy's tensor comes from a .cpu() copy, the read)."""
        real = getattr(torch.Tensor, name)

        def read(t: Tensor, *args, **kwargs):
            self._add(name)
            with torch.utils._python_dispatch._disable_current_modes():
                return real(t, *args, **kwargs)
        return read

    def __exit__(self, *exc):
        for patch in reversed(self._patches):
            patch.__exit__(*exc)
        return super().__exit__(*exc)


_NO_KERNEL = {"empty", "empty_strided", "empty_like", "detach", "lift_fresh", "alias", "set_",
              "_local_scalar_dense"}  # no kernel, or not one of the device's
_MATMULS = {"mm", "addmm", "bmm", "baddbmm"}
_ATTENTION = {"_scaled_dot_product_flash_attention": 1.0,  # its FLOPs / 4 B h T S d_k
              "_scaled_dot_product_efficient_attention": 1.0,
              "_scaled_dot_product_flash_attention_backward": 2.5,
              "_scaled_dot_product_efficient_attention_backward": 2.5}


def _flops(name: str, args) -> int:
    """Multiply-adds x 2 of a matrix product or a fused attention operator (else 0)."""
    if name in _MATMULS:
        a, b = args[-2], args[-1]
        batch = a.shape[0] if a.dim() == 3 else 1
        return 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]
    if name in _ATTENTION:
        q, k = args[1], args[2]  # backward: (grad_out, q, k, v, ...)
        if name.endswith("attention"):
            q, k = args[0], args[1]
        B, h, T, d = q.shape
        return int(4 * B * h * T * k.shape[2] * d * _ATTENTION[name])
    return 0


def _bytes(tensors) -> int:
    """Bytes an operator reads and writes: each tensor's elements (at most its storage)."""
    total, seen = 0, set()
    for t in tensors:
        if isinstance(t, Tensor) and id(t) not in seen:
            seen.add(id(t))
            total += min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
    return total


class DeviceProfile(TorchDispatchMode):
    """Per phase of an update ("forward" before a backward, "backward" inside one,
    "optimizer" after the last: the all-reduce, clipping, Adam and the EMA): the operators
    launched on the device (views and allocations excepted; a fused or foreach operator
    launches several kernels), their matrix-product FLOPs and the bytes the other operators
    read and write. And live device memory (the storages alive) with its peak. Use it inside
    simulated_cuda through `profiled`, which tells it where backward passes begin and end."""

    PHASES = ("forward", "backward", "optimizer")

    def __init__(self):
        super().__init__()
        self.totals = {p: {"ops": 0, "flops": 0, "bytes": 0} for p in self.PHASES}
        self.pending = {"ops": 0, "flops": 0, "bytes": 0}  # since the last backward
        self.by_name: dict[str, int] = {}
        self.in_backward = False
        self.live, self.peak = 0, 0
        self._storages: dict[int, weakref.ref] = {}

    def track(self, tensors) -> None:
        """Count these tensors' storages as live device memory (parameters, optimizer state)."""
        for t in tensors:
            self._track(t)
        self.peak = max(self.peak, self.live)

    def _track(self, t) -> None:
        if not isinstance(t, Tensor) or t.device.type != "cuda":
            return
        storage = t.untyped_storage()
        key = id(storage)
        if key not in self._storages:
            size = -(-storage.nbytes() // 512) * 512
            self._storages[key] = weakref.ref(storage, functools.partial(self._free, key, size))
            self.live += size

    def _free(self, key: int, size: int, _ref) -> None:
        self.live -= size
        self._storages.pop(key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        space, _, name = func._schema.name.partition("::")
        tensors = tree_leaves((args, kwargs, out))
        if space == "aten" and not (func.is_view or name in _NO_KERNEL):
            self.by_name[name] = self.by_name.get(name, 0) + 1
            into = self.totals["backward"] if self.in_backward else self.pending
            flops = _flops(name, args)
            into["ops"] += 1
            into["flops"] += flops
            into["bytes"] += 0 if flops else _bytes(tensors)
        self.track(tensors)
        return out

    def _close(self, phase: str) -> None:
        for key, value in self.pending.items():
            self.totals[phase][key] += value
            self.pending[key] = 0

    def backward_begins(self) -> None:
        """The operators since the last backward were a forward pass."""
        self._close("forward")
        self.in_backward = True

    def backward_ends(self) -> None:
        """Operators from here on are a forward pass or the optimizer's (told at the next
        backward, or at finish)."""
        self.in_backward = False

    def finish(self) -> dict:
        """The operators after the last backward go to the optimizer; the figures: per phase
        its operators, and in all the FLOPs, the bytes and the peak of live memory."""
        self._close("optimizer")
        return {**{p: self.totals[p]["ops"] for p in self.PHASES},
                "flops": sum(t["flops"] for t in self.totals.values()),
                "bytes": {p: self.totals[p]["bytes"] for p in self.PHASES},
                "peak_bytes": self.peak}


@contextlib.contextmanager
def profiled(profile: DeviceProfile):
    """Inside simulated_cuda: profile's operators and memory, its phases set around every
    Tensor.backward."""
    backward = torch.Tensor.backward

    def phased(self, *args, **kwargs):
        profile.backward_begins()
        try:
            return backward(self, *args, **kwargs)
        finally:
            profile.backward_ends()

    with mock.patch.object(torch.Tensor, "backward", phased), profile:
        yield profile


# ----------------------------------------------------------------------------- simulated ranks
class World:
    """N ranks simulated one after the other in this process over torch's fake process group.
    Rank 0 must run first: the objects it broadcasts are what the others receive."""

    def __init__(self, size: int):
        self.size = size
        self.sent: list = []  # the objects rank 0 broadcast, in order
        self.traces: dict[int, list[tuple]] = {}  # rank -> its collectives

    @contextlib.contextmanager
    def rank(self, rank: int):
        """Inside: this process is rank `rank` (RANK, WORLD_SIZE, LOCAL_RANK set, the default
        group initialised), its collectives recorded in self.traces[rank]."""
        trace = self.traces.setdefault(rank, [])
        received = iter(self.sent)

        def record(op: str, t: Tensor) -> None:
            trace.append((op, tuple(t.shape), t.dtype, t.device.type))

        def tensor_op(op: str, real):
            def run(t: Tensor, *args, **kwargs):
                record(op, t)
                return real(t, *args, **kwargs)
            return run

        def broadcast_object_list(objects: list, src: int = 0, group=None, **kwargs) -> None:
            trace.append(("broadcast_object_list", len(objects)))
            if rank == src:
                self.sent.extend(objects)
            else:
                objects[:] = [next(received) for _ in objects]

        def all_gather_object(out: list, obj, group=None) -> None:
            trace.append(("all_gather_object",))
            out[:] = [obj] * len(out)  # the others' objects are not known here

        def barrier(group=None, **kwargs) -> None:
            trace.append(("barrier",))

        env = {"RANK": str(rank), "WORLD_SIZE": str(self.size), "LOCAL_RANK": str(rank)}
        patches = [mock.patch.dict(os.environ, env),
                   mock.patch.object(dist, "all_reduce", tensor_op("all_reduce", dist.all_reduce)),
                   mock.patch.object(dist, "broadcast", tensor_op("broadcast", dist.broadcast)),
                   mock.patch.object(dist, "broadcast_object_list", broadcast_object_list),
                   mock.patch.object(dist, "all_gather_object", all_gather_object),
                   mock.patch.object(dist, "barrier", barrier),
                   _pass_through_ddp()]
        with contextlib.ExitStack() as stack:
            for patch in patches:
                stack.enter_context(patch)
            dist.init_process_group("fake", rank=rank, world_size=self.size, store=FakeStore())
            try:
                yield
            finally:
                dist.destroy_process_group()


def _pass_through_ddp():
    """DDP with a communication hook that all-reduces each gradient bucket through
    dist.all_reduce (recorded; the fake group moves nothing) and hands the bucket back as it
    is: the fake group's futures carry no tensor, which DDP's reducer needs."""
    DDP = nn.parallel.DistributedDataParallel
    init = DDP.__init__

    def hook(state, bucket):
        dist.all_reduce(bucket.buffer())
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    @functools.wraps(init)  # nmt reads DDP's signature
    def ddp_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.register_comm_hook(None, hook)

    return mock.patch.object(DDP, "__init__", ddp_init)
