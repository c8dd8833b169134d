"""nmt.inference.attention_op: the fused one-query attention operator equals its PyTorch
reference (random shapes, ragged lengths, beam parents, fp32 and bf16), decoding through it
equals decoding through batched products, a beam's reorder copies no keys, and without a C++
compiler nmt says so in one line and decodes as before. Marked isa: tests/test_isa.py runs
them again under AVX2 dispatch, which builds and tests the AVX2 object."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from translate_helpers import random_sources, search, tiny_model

from nmt.data.tokenizer import SPECIALS
from nmt.inference import attention_op
from nmt.inference.batches import pad_batch, translate_nbest
from nmt.inference.fast_model import DTYPES, FastModel, TableKVCache, packing_works

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.isa]

V = 24


@pytest.fixture(scope="module")
def op():
    if not attention_op.available():
        pytest.skip("the operator did not build here (no C++ compiler)")
    objects = {line.split()[-1] for line in open("/proc/self/maps") if "nmt_one_query" in line}
    name = f"nmt_one_query_attention_{attention_op.capability().lower()}.so"
    assert [Path(o).name for o in objects] == [name]  # the object of this process's ISA
    return attention_op.one_query_attention


def random_case(g: torch.Generator, dtype: torch.dtype, cross: bool, D: int = 0,
                kv_dtype: torch.dtype | None = None):
    """Random operator arguments: self-attention (each row's positions in random buffer rows,
    as beam parents leave them, from a random start) or cross-attention (a stride-0 table to
    each row's memory row, up to its own length); some rows with no position at all. D: the
    head size (0: random, off the vector width too); kv_dtype: the keys' and values' (None:
    dtype)."""
    R, H = int(torch.randint(1, 9, (), generator=g)), int(torch.randint(1, 5, (), generator=g))
    D = D or int(torch.randint(1, 70, (), generator=g))
    N, C = int(torch.randint(1, 7, (), generator=g)), int(torch.randint(1, 40, (), generator=g))
    q, k, v = (torch.randn(*shape, generator=g).to(dt) for shape, dt in (
        ((R, H, D), dtype), ((N, H, C, D), kv_dtype or dtype), ((N, H, C, D), kv_dtype or dtype)))
    end = torch.randint(0, C + 1, (R,), generator=g)
    if cross:
        table = torch.randint(0, N, (R, 1), generator=g).expand(R, C)
        start = torch.zeros(R, dtype=torch.long)
    else:
        table = torch.randint(0, N, (R, C), generator=g)
        start = (torch.rand(R, generator=g) * (end + 1)).long().clamp(max=end)
    return q, k, v, table, start, end


KV_DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
             (torch.float32, torch.bfloat16)]  # queries', keys and values' (int8's cache)


@pytest.mark.parametrize("dtype, kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("cross", [False, True])
def test_the_operator_equals_its_reference(op, dtype, kv_dtype, cross):
    g = torch.Generator().manual_seed(0)
    # random head sizes, then each of 1, 2, 4, 8 and 16 vectors of AVX2 or AVX-512 (the
    # operator's unrolled forms, its registers holding the query and the sums)
    for D in [0] * 40 + [8, 16, 32, 64, 128, 256]:
        args = random_case(g, dtype, cross, D, kv_dtype)
        got, want = op(*args), attention_op.one_query_attention_reference(*args)
        assert got.dtype == dtype and got.shape == args[0].shape
        tol = {"atol": 2e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-5,
                                                                           "rtol": 8e-3}
        torch.testing.assert_close(got.float(), want.float(), **tol)  # bf16: its rounding
    R = args[0].size(0)  # a row without positions gives zeros, not NaN
    empty = (*args[:4], torch.zeros(R, dtype=torch.long), torch.zeros(R, dtype=torch.long))
    assert not op(*empty).abs().any()


@pytest.mark.parametrize("dtype, kv_dtype", KV_DTYPES)
def test_the_unrolled_head_sizes_add_as_the_general_loop(op, dtype, kv_dtype):
    """Head sizes of whole vectors (registers, unrolled) give exactly what the general loop
    gives them padded with zeros to a size off the vector width (4 more: 68 is no whole
    number of AVX2's 8 or AVX-512's 16), which adds the same products and zeros."""
    g = torch.Generator().manual_seed(2)
    for D in (8, 16, 32, 64):
        q, k, v, table, start, end = random_case(g, dtype, False, D, kv_dtype)
        padded = [F.pad(x, (0, 4)) for x in (q, k, v)]
        assert torch.equal(op(q, k, v, table, start, end),
                           op(*padded, table, start, end)[..., :D])


def test_the_operator_refuses_reads_outside_its_buffers(op):
    q, k, v, table, start, end = random_case(torch.Generator().manual_seed(1), torch.float32,
                                             False)
    with pytest.raises(RuntimeError, match="reads positions"):
        op(q, k, v, table, start, torch.full_like(end, k.size(2) + 1))
    with pytest.raises(RuntimeError, match="names buffer row"):
        op(q, k, v, torch.full_like(table, k.size(0)), torch.zeros_like(start),
           torch.full_like(end, 1))


def test_a_beam_reorder_gathers_the_table_and_copies_no_keys(op):
    """FastState.reorder with the fused cache, beams moving within their sentences: the same
    buffers, a gathered table, and the logits of batched products over copied rows."""
    model = tiny_model(V, seed=1, stops=True, N=2)
    src = pad_batch([[5, 6, 7], [8, 9]], SPECIALS.pad, "cpu")
    fused, plain = FastModel(model, fused=True), FastModel(model, fused=False)
    steps = torch.arange(4, 22).view(6, 3)  # (6 rows, 3 steps)
    with torch.inference_mode():
        states = [m.start_decoding(*m.encode(src)) for m in (fused, plain)]
        for m, state in zip((fused, plain), states, strict=True):
            state.reorder(torch.arange(2).repeat_interleave(3), group=3)  # 3 beams each
            m.decode_step(steps[:, :1], state)
        cache = states[0].self_kv[0]
        assert isinstance(cache, TableKVCache)
        buffers = cache.k.data_ptr(), cache.v.data_ptr()
        index = torch.tensor([2, 2, 0, 4, 3, 3])
        for t in (1, 2):
            for state in states:
                state.reorder(index, group=3)
            got, want = (m.decode_step(steps[:, t:t + 1], s)
                         for m, s in zip((fused, plain), states, strict=True))
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert (cache.k.data_ptr(), cache.v.data_ptr()) == buffers  # not copied
        assert cache.table[:, 0].tolist() == index[index].tolist()  # the first position's row


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("beam", [1, 4])
def test_decoding_through_the_operator_equals_batched_products(op, beam, dtype):
    if dtype == "bf16" and not packing_works(torch.bfloat16):
        pytest.skip("no bf16 on this CPU")
    cfg = search(beam_size=beam, nbest=min(beam, 2), max_len_b=6, dtype=dtype)
    model = tiny_model(V, seed=2, stops=True, N=2)
    sources = random_sources(12, V, seed=5)
    kv = DTYPES[dtype]  # the operator over the same keys and values (int8's default: bf16)
    fused, plain = ([FastModel(model, dtype, fused=f, kv_dtype=kv)] for f in (True, False))
    got, want = (translate_nbest(m, sources, cfg, SPECIALS) for m in (fused, plain))
    for g, w in zip(got, want, strict=True):
        assert [h.tokens for h in g] == [h.tokens for h in w]
        # bf16: the operator's fp32 softmax against bf16 products; int8: activations
        # rounded to 8 bits from ranges that move with the attention's last digits
        tol = {"fp32": 1e-4, "bf16": 5e-2, "int8": 5e-3}[dtype]
        assert [h.score for h in g] == pytest.approx([h.score for h in w], abs=tol)


def test_int8_decodes_over_bf16_keys_and_values_as_closely_as_int8_is_to_fp32(op):
    """int8's default cache (FastModel.kv_dtype): bf16 keys and values, the self-attention
    cache's and the memory's, whose logits stay as close to fp32 keys and values' as int8's
    own are to fp32's (teacher-forced steps of one sentence pair and a shorter one)."""
    model = tiny_model(V, seed=2, stops=True, N=2)
    src = pad_batch([[5, 6, 7, 9, 11], [8, 9]], SPECIALS.pad, "cpu")
    models = [FastModel(model, "int8", fused=True), FastModel(model, "int8", fused=True,
                                                              kv_dtype=torch.float32),
              FastModel(model, "fp32", fused=True)]
    assert [m.kv_dtype for m in models] == [torch.bfloat16, torch.float32, None]
    steps = torch.arange(4, 22).view(2, 9)  # (2 rows, 9 steps)
    with torch.inference_mode():
        states = [m.start_decoding(*m.encode(src)) for m in models]
        assert states[0].memory_kv[0][0].dtype == torch.bfloat16
        for t in range(steps.size(1)):
            bf16_kv, int8, fp32 = (m.decode_step(steps[:, t:t + 1], s)
                                   for m, s in zip(models, states, strict=True))
            spread = fp32.std()
            assert (bf16_kv - int8).abs().max() < 0.05 * spread  # measured: 0.8-2.3%
            assert (int8 - fp32).abs().max() < 0.05 * spread  # measured: 1.7-2.8%
        assert states[0].self_kv[0].k.dtype == torch.bfloat16


@pytest.mark.slow
def test_without_a_compiler_nmt_says_so_in_one_line_and_decodes_as_before(tmp_path):
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    code = ("import torch; from nmt.inference import attention_op; "
            "from nmt.inference.fast_model import FastModel; from nmt.model import make_model; "
            "from nmt.config import ModelConfig; "
            "cfg = ModelConfig(N=1, d_model=16, d_ff=32, h=2, dropout=0.0); "
            "m = make_model(cfg, 8, 8, 0, True).eval(); "
            "print(attention_op.available(), FastModel(m).fused)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "fused attention operator is not available (no C++ compiler" \
        in lines[0]
