"""Speed paths beside the reference model of nmt/model.py; tests check that they agree with it.

Training on the CPU (build_model installs it): a dropout whose random mask costs less, and
plain matmul attention in bf16/fp16, where the CPU's fused attention kernel is slower.

Decoding: `FastModel` runs a trained Transformer's weights for inference only, through the
model's decoding interface (encode, start_decoding, decode_step, decode): in fp32 (the linear
maps' weights packed once for oneDNN on the CPU), bf16, fp16 (CUDA) or int8 (the linear maps
quantized by torch.ao.quantization.quantize_dynamic), with the beams or samples of one
sentence sharing one copy of its encoder memory. `parallel_batches` translates whole batches
in forked single-threaded worker processes side by side.

Shapes: B decoder rows, M = B / g sentences (g rows per sentence), S source length, T target
length, V vocabulary, h heads, d_k = d_model / h.
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from nmt.model import Transformer, causal_mask

HALF = (torch.bfloat16, torch.float16)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "int8": torch.float32}  # int8: int8 weights and matmuls, float32 everything else


# ----------------------------------------------------------------------------- training
class CpuDropout(nn.Dropout):
    """Dropout whose mask costs less on CPU: 16 random bits per element, four per 64-bit draw.

    torch's CPU dropout draws one random number per element (~10% of a training step). Here an
    element is dropped when its 16 uniform bits fall below round(p * 2^16): probability p up to
    2^-16, survivors scaled by 1 / (1 - p). On GPUs, whose random numbers are cheap, F.dropout.
    """

    def __init__(self, p: float):
        super().__init__(p)
        self.threshold = -2 ** 15 + round(p * 2 ** 16)  # int16 draws below it are dropped

    def forward(self, x: Tensor) -> Tensor:
        """x with a random share p of its elements zeroed and the rest scaled (training only)."""
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-2 ** 63, None)
        bits = words.view(torch.int16)[:x.numel()].view(x.shape)  # uniform in [-2^15, 2^15)
        scale = (bits >= self.threshold).to(x.dtype).mul_(1.0 / (1.0 - self.p))
        return x * scale


def speed_up_training(model: Transformer) -> Transformer:
    """Install the CPU training speed paths in `model` (in place; returns it): every
    nn.Dropout becomes a CpuDropout, and forward passes on the CPU in bf16/fp16 (autocast or
    half weights) attend with matmul + softmax (the fused CPU kernel is 2-4x slower there and
    its bf16 backward took 23% of a training step)."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is nn.Dropout:
                setattr(module, name, CpuDropout(child.p))
    model.register_forward_pre_hook(_plain_attention_on)
    model.register_forward_hook(_plain_attention_off, always_call=True)
    return model


def _plain_attention_on(model: Transformer, args: tuple) -> None:
    """Forward pre-hook: on the CPU in half precision, select SDPBackend.MATH until the end."""
    half = ((torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") in HALF)
            or model.generator.weight.dtype in HALF)
    if args and args[0].device.type == "cpu" and half:
        model._attention_kernel = sdpa_kernel(SDPBackend.MATH)
        model._attention_kernel.__enter__()


def _plain_attention_off(model: Transformer, args: tuple, output) -> None:
    """Forward hook (also after an exception): leave the backend selection of the pre-hook."""
    kernel = model.__dict__.pop("_attention_kernel", None)
    if kernel is not None:
        kernel.__exit__(None, None, None)


# ----------------------------------------------------------------------------- decoding
def _linear(weight: Tensor, bias: Tensor | None) -> nn.Linear:
    """An inference nn.Linear over these weights (shared, not copied; no random init)."""
    linear = nn.Linear(weight.size(1), weight.size(0), bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight.detach(), requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias.detach(), requires_grad=False)
    return linear


class PackedLinear(nn.Module):
    """x W^T + b through oneDNN with W packed once for `rows`-row inputs (what torch.compile's
    freezing does; 10-25% faster than MKL re-packing W inside every call at decoding sizes).
    PyTorch offers this only as torch.ops.mkldnn ops; `pack_linears` checks them first."""

    def __init__(self, linear: nn.Linear, rows: int):
        super().__init__()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows)
        self.bias = linear.bias
        self.out_features = linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        """(..., in_features) -> (..., out_features)."""
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def pack_linears(module: nn.Module, rows: int) -> bool:
    """Replace every float nn.Linear of `module` (on the CPU) with a PackedLinear, in place,
    if this PyTorch has the oneDNN ops and they compute x W^T + b; returns whether it did."""
    linears = [(parent, name, child) for parent in module.modules()
               for name, child in parent.named_children() if type(child) is nn.Linear]
    if not (linears and torch.backends.mkldnn.is_available()):
        return False
    try:
        _, _, first = linears[0]
        x = torch.linspace(-1.0, 1.0, 3 * first.in_features, dtype=first.weight.dtype)
        x = x.view(3, -1)  # no random draws
        if not torch.allclose(PackedLinear(first, rows)(x).float(), first(x).float(),
                              rtol=1e-2, atol=1e-2):
            return False
        for parent, name, child in linears:
            setattr(parent, name, PackedLinear(child, rows))
    except (AttributeError, RuntimeError):  # ops missing, or refusing these shapes or types
        return False
    return True


class FastLayer(nn.Module):
    """One encoder or decoder layer's weights, laid out for decoding: encoder-decoder attention
    has W^Q alone and W^K, W^V together (the memory's keys and values are computed once)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.h = layer.self_attn.h
        self.norms = nn.ModuleList(copy.deepcopy(s.norm) for s in layer.sublayer)
        attn = layer.self_attn
        self.qkv, self.o = _linear(attn.W_qkv.weight, attn.W_qkv.bias), _linear(
            attn.W_o.weight, attn.W_o.bias)
        if hasattr(layer, "src_attn"):
            W, d = layer.src_attn.W_qkv, layer.src_attn.W_o.in_features
            self.q, self.kv = _linear(W.weight[:d], W.bias[:d]), _linear(W.weight[d:], W.bias[d:])
            self.o2 = _linear(layer.src_attn.W_o.weight, layer.src_attn.W_o.bias)
        ff = layer.feed_forward
        self.W_1, self.W_2 = _linear(ff.W_1.weight, ff.W_1.bias), _linear(ff.W_2.weight,
                                                                           ff.W_2.bias)

    def self_attention(self, x: Tensor, mask: Tensor | None, cache: FastKVCache | None,
                       plain: bool) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model); with a cache, after its past positions."""
        B, T, d = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.h, d // self.h)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # 3 x (B, h, T, d_k)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, h, L, d_k): L = past + T
        causal = mask is None and T > 1  # decoder: no future positions
        if causal and k.size(2) != T:
            mask, causal = causal_mask(T, k.size(2), x.device), False
        out = attend(q, k, v, mask, causal, plain)  # (B, h, T, d_k)
        return self.o(out.transpose(1, 2).reshape(B, T, d))

    def cross_attention(self, x: Tensor, memory_kv: tuple[Tensor, Tensor], src_mask: Tensor,
                        plain: bool) -> Tensor:
        """(B, T, d_model) queries, g = B / M consecutive rows per memory row -> same shape.

        The queries of a sentence's g rows attend together: (M, h, g T, d_k) against its
        keys (M, h, S, d_k), never copied per row."""
        B, T, d = x.shape
        k, v = memory_kv
        M = k.size(0)
        q = self.q(x).view(M, B // M * T, self.h, d // self.h).transpose(1, 2)  # (M, h, gT, d_k)
        out = attend(q, k, v, src_mask, False, plain)  # (M, h, g T, d_k)
        return self.o2(out.transpose(1, 2).reshape(B, T, d))

    def feed_forward(self, x: Tensor) -> Tensor:
        """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2."""
        return self.W_2(F.relu(self.W_1(x)))

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """(M, S, d_model) encoder output -> keys and values (M, h, S, d_k) each."""
        M, S, d = memory.shape
        kv = self.kv(memory).view(M, S, 2, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        k, v = kv.contiguous()  # contiguous: matmul reads them at every step without a copy
        return k, v


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
           plain: bool) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V: the fused kernel, or matmul + softmax when `plain`."""
    if not plain:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    scores = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5  # (B, h, T_q, T_k)
    if causal:
        mask = causal_mask(q.size(2), k.size(2), q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


class FastKVCache:
    """One self-attention layer's past keys and values in (B, h, capacity, d_k) buffers: the
    first L positions are a strided view that matmul reads without a copy (nmt.model.KVCache
    keeps the layout the fused kernel prefers)."""

    chunk = 8  # positions added whenever the buffers are full

    def __init__(self):
        self.k: Tensor | None = None  # (B, h, capacity, d_k)
        self.v: Tensor | None = None
        self.length = 0  # positions stored

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store (B, h, T, d_k) new keys and values; return all so far, (B, h, L, d_k) each."""
        B, h, T, d_k = k.shape
        end = self.length + T
        if self.k is None or end > self.k.size(2):
            capacity = -(-end // self.chunk) * self.chunk
            new_k, new_v = k.new_empty(B, h, capacity, d_k), v.new_empty(B, h, capacity, d_k)
            if self.k is not None:
                new_k[:, :, :self.length] = self.k[:, :, :self.length]
                new_v[:, :, :self.length] = self.v[:, :, :self.length]
            self.k, self.v = new_k, new_v
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Keep (and repeat) rows `index`."""
        if self.k is not None:
            self.k, self.v = _gather_rows(self.k, index), _gather_rows(self.v, index)


class FastState:
    """FastModel's decoding state: per-layer FastKVCaches, and encoder keys and values
    with one row per sentence that the g consecutive rows of the sentence share."""

    def __init__(self, memory_kv: list[tuple[Tensor, Tensor]], src_mask: Tensor):
        self.memory_kv = memory_kv  # per layer: (M, h, S, d_k) keys and values
        self.src_mask = src_mask  # (M, 1, 1, S)
        self.self_kv = [FastKVCache() for _ in memory_kv]
        self.step = 0  # target positions decoded so far
        self.g = 1  # decoder rows per memory row

    def reorder(self, index: Tensor) -> None:
        """Keep (and repeat) rows `index`, as DecoderState.reorder does. Rows that come in equal,
        consecutive groups per sentence (beam search, samples) keep sharing its memory row."""
        for cache in self.self_kv:
            cache.reorder(index)
        rows = torch.div(index, self.g, rounding_mode="floor")  # memory row of each new row
        g = int((rows == rows[0]).sum()) if len(rows) else 1
        if len(rows) % g or not torch.equal(rows.view(-1, g), rows[::g, None].expand(-1, g)):
            g = 1
        sentences, self.g = rows[::g], g
        if len(sentences) == self.src_mask.size(0) and torch.equal(
                sentences, torch.arange(len(sentences), device=index.device)):
            return  # rows moved within their sentences: the memory stays as it is
        self.memory_kv = [(_gather_rows(k, sentences), _gather_rows(v, sentences))
                          for k, v in self.memory_kv]
        self.src_mask = self.src_mask.index_select(0, sentences)


def _gather_rows(x: Tensor, index: Tensor) -> Tensor:
    """x[index] along dim 0, as a 2-D gather (much faster on CPU than on a 4-D tensor)."""
    return x.reshape(x.size(0), -1).index_select(0, index).view(len(index), *x.shape[1:])


class FastModel(nn.Module):
    """A trained Transformer prepared for decoding in `dtype` (fp32, bf16, fp16 or int8).

    The weights are the model's (shared in fp32, converted otherwise); the model is not
    changed. Inference only: no dropout, no gradients. rows: the batch rows oneDNN packs the
    fp32 weights for (a hint; any batch works).
    """

    def __init__(self, model: Transformer, dtype: str = "fp32", rows: int = 64):
        super().__init__()
        self.cfg, self.pad_id, self.dtype = model.cfg, model.pad_id, dtype
        device = model.generator.weight.device
        if dtype == "int8" and device.type != "cpu":
            raise ValueError("search.dtype=int8 runs on the CPU only (use bf16 or fp16 on GPUs)")
        if dtype == "fp16" and device.type == "cpu":
            raise ValueError("search.dtype=fp16 needs CUDA (use bf16 on the CPU)")
        self.pre_norm = model.cfg.norm == "pre"
        self.register_buffer("src_lut", model.src_embed.lut.weight.detach() * model.src_embed.scale)
        self.register_buffer("tgt_lut", model.tgt_embed.lut.weight.detach() * model.tgt_embed.scale)
        self.register_buffer("pe", model.positions.pe)  # (max_positions, d_model)
        self.encoder = nn.ModuleList(FastLayer(layer) for layer in model.encoder)
        self.decoder = nn.ModuleList(FastLayer(layer) for layer in model.decoder)
        self.encoder_norm = copy.deepcopy(model.encoder_norm)
        self.decoder_norm = copy.deepcopy(model.decoder_norm)
        self.generator = _linear(model.generator.weight, None)
        self.requires_grad_(False)
        self.packed = False
        if dtype == "int8":
            with warnings.catch_warnings():  # the eager API warns that torchao succeeds it
                warnings.simplefilter("ignore")
                torch.ao.quantization.quantize_dynamic(
                    self, {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
                    inplace=True)
        elif dtype != "fp32":
            self.to(DTYPES[dtype])
        if device.type == "cpu" and dtype != "int8" and not torch.is_autocast_enabled("cpu"):
            self.packed = pack_linears(self, rows)
        # On the CPU, matmul + softmax beats the fused kernel at decoding sizes (2x for one
        # query per row), and by more in bf16.
        self.plain_attention = device.type == "cpu"

    def _embed(self, lut: Tensor, ids: Tensor, start: int) -> Tensor:
        """(B, T) ids at positions start.. -> (B, T, d_model) scaled embeddings + positions."""
        T = ids.size(1)
        if start + T > self.pe.size(0):
            raise ValueError(f"sequence of {start + T} positions exceeds model.max_positions "
                             f"({self.pe.size(0)})")
        return F.embedding(ids, lut) + self.pe[start:start + T]

    def _residual(self, x: Tensor, norm: nn.Module, sublayer, *args) -> Tensor:
        """x + Sublayer(LN(x)) (pre-norm) or LN(x + Sublayer(x)) (post-norm)."""
        if self.pre_norm:
            return x + sublayer(norm(x), *args)
        return norm(x + sublayer(x, *args))

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S) source ids -> memory (B, S, d_model) and src_mask (B, 1, 1, S)."""
        src_mask = (src != self.pad_id)[:, None, None, :]  # (B, 1, 1, S)
        x = self._embed(self.src_lut, src, 0)
        for layer in self.encoder:
            x = self._residual(x, layer.norms[0], layer.self_attention, src_mask, None,
                               self.plain_attention)
            x = self._residual(x, layer.norms[1], layer.feed_forward)
        return self.encoder_norm(x), src_mask

    def start_decoding(self, memory: Tensor, src_mask: Tensor) -> FastState:
        """The encoder-decoder keys and values of every layer, once; the state to decode."""
        return FastState([layer.memory_kv(memory) for layer in self.decoder], src_mask)

    def decode_step(self, tgt_new: Tensor, state: FastState) -> Tensor:
        """(B, T_new) next ids -> logits (B, T_new, V); updates `state`."""
        x = self._embed(self.tgt_lut, tgt_new, state.step)
        plain = self.plain_attention
        for layer, memory_kv, cache in zip(self.decoder, state.memory_kv, state.self_kv,
                                           strict=True):
            x = self._residual(x, layer.norms[0], layer.self_attention, None, cache, plain)
            x = self._residual(x, layer.norms[1], layer.cross_attention, memory_kv,
                               state.src_mask, plain)
            x = self._residual(x, layer.norms[2], layer.feed_forward)
        state.step += tgt_new.size(1)
        return self.generator(self.decoder_norm(x))

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Teacher-forced decoding: (B, T) shifted target ids -> logits (B, T, V)."""
        return self.decode_step(tgt_in, self.start_decoding(memory, src_mask))


# ----------------------------------------------------------------------------- worker processes
def parallel_batches(job, batches: list[list[int]], seqs, workers: int):
    """Yield (batch number, job(seqs of the batch)) for every batch, in completion order.

    workers > 1 on the CPU: forked single-threaded processes translate whole batches side by
    side (data parallelism, like Marian's --cpu-threads: no per-operation thread
    synchronisation, which small decoding steps pay dearly for; one thread each, as GNU
    OpenMP cannot start a thread team in a process forked from one that had one).
    seqs: an iterable of each batch's inputs, in batch order.
    """
    if (workers <= 1 or len(batches) <= 1 or job.device.type != "cpu"
            or "fork" not in mp.get_all_start_methods()):
        for n, batch in enumerate(seqs):
            yield n, job(batch)
        return
    with mp.get_context("fork").Pool(min(workers, len(batches)), _start_worker,
                                     (job,)) as pool:
        yield from pool.imap_unordered(_work, enumerate(seqs))


_JOB = None  # in a worker process: the job it inherited when forked


def _start_worker(job) -> None:
    """Worker process set-up: keep the (inherited, unpickled) job; run one thread."""
    global _JOB
    _JOB = job
    torch.set_num_threads(1)


def _work(task: tuple[int, list]) -> tuple[int, list]:
    """Worker process: run the job on batch number n."""
    n, seqs = task
    return n, _JOB(seqs)
