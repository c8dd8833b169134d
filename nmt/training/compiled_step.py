"""The compiled update of train.compile: the forward pass, the loss and their backward as one
graph per batch shape, with Adam fused (nmt/commands/train.py builds it in build_run).

`LossModule` holds the model and its training loss: (src, tgt_in, tgt_out) -> the summed
label-smoothed loss and NLL of the batch's target tokens. Every position is projected and
padding masked (nmt.training.loss.label_smoothed_nll_loss), so that no shape depends on the
data and torch.compile captures the whole of it without a break; AOTAutograd compiles its
backward with it. Under DDP it is the module DDP wraps (DDPOptimizer then splits the graph at
the gradient buckets). On the CPU, dropout draws its mask inside the compiled kernels
(nmt.training.cpu_training.CpuDropout). Adam is fused on every device (one kernel, which
skips an update on the device: nmt.system.private_ops.step_unless).

The shapes it meets (train.shapes): static, each batch padded to one of a few bucket shapes
fitted to the data (nmt.data.batches.Buckets), a graph per bucket, which CUDA graphs need;
or dynamic, one graph with symbolic sizes. auto is static on GPUs and dynamic on CPUs, where
Inductor's C++ build of a graph takes a minute or more on 2 cores and static buckets pad the
batches more than the compiled kernels gain (docs/results.md, "Compiled training on the CPU").
train.compile_mode is torch.compile's mode: reduce-overhead replays static graphs as CUDA
graphs, which pays where launching kernels bounds an update (docs/gpu.md's cost model: not
at the recipes' batches once compiled, so the default is off).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import Tensor, nn

from nmt.config import TrainLoopConfig
from nmt.data.batches import Batch
from nmt.system.private_ops import recompile_limit, symbolic_sizes
from nmt.training.loss import label_smoothed_nll_loss

# The modes of torch.compile that capture CUDA graphs (whose outputs a later replay overwrites)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


class LossModule(nn.Module):
    """The model and its label-smoothed loss as one module, with the run's numerics."""

    def __init__(self, model: nn.Module, epsilon: float, pad_id: int,
                 precision: Callable[[], contextlib.AbstractContextManager]):
        super().__init__()
        self.model, self.epsilon, self.pad_id, self.precision = model, epsilon, pad_id, precision

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S) source ids, (B, T) target input and output ids -> the summed loss and NLL
        of the target tokens (tgt_out's that are not padding), not normalised."""
        with self.precision():
            logits = self.model(src, tgt_in)  # (B, T, V)
        return label_smoothed_nll_loss(logits, tgt_out, self.epsilon, self.pad_id)


def static_shapes(tc: TrainLoopConfig, device: torch.device) -> bool:
    """Whether the compiled step runs on static bucket shapes (train.shapes; auto: on GPUs)."""
    return tc.shapes == "static" or (tc.shapes == "auto" and device.type == "cuda")


def compile_loss(module: nn.Module, tc: TrainLoopConfig, device: torch.device
                 ) -> Callable[[Batch], tuple[Tensor, Tensor]]:
    """`module` (a LossModule, or DDP around one) compiled as train.shapes and
    train.compile_mode say; returns what an update calls on each batch: its summed loss and
    NLL. Static shapes: a graph per bucket (a few more allowed for DDP's splits)."""
    static = static_shapes(tc, device)
    if static:
        recompile_limit(2 * tc.buckets + 2)
    whole = not isinstance(module, nn.parallel.DistributedDataParallel)  # DDP's own frame
    compiled = torch.compile(module, dynamic=not static, fullgraph=whole,
                             mode=None if tc.compile_mode == "default" else tc.compile_mode)
    graphs = device.type == "cuda" and tc.compile_mode in CUDA_GRAPH_MODES

    def step_loss(batch: Batch) -> tuple[Tensor, Tensor]:
        if graphs:  # a new iteration: the last replay's outputs were consumed
            torch.compiler.cudagraph_mark_step_begin()
        with contextlib.nullcontext() if static else symbolic_sizes():
            return compiled(batch.src, batch.tgt_in, batch.tgt_out)

    return step_loss
