"""nmt.decoding.fast_model (with its linear maps, nmt.decoding.affine, and its state,
nmt.decoding.fast_state): the decoding speed path gives the reference model's results (tokens,
logits), on every CPU kind: these tests run again under AVX2 dispatch (tests/system/test_isa.py)."""

import collections
import dataclasses
import functools
import itertools
import os

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from translate_helpers import random_sources, run, search, tiny_model, tiny_model_cfg, tokens

from nmt.config import SearchConfig
from nmt.decoding import affine as affine_module
from nmt.decoding import attention_op, strategies
from nmt.decoding.affine import (
    FBGEMM_OUTPUTS,
    Affine,
    Int8Affine,
    PackedAffine,
    few_rows,
    int8_engines,
    int8_rows_layout,
    int8_saturates,
    packing_works,
    rows_alone,
)
from nmt.decoding.batches import pad_batch
from nmt.decoding.fast_model import PAD_ALLOWANCE, PAD_SLACK, FastModel, source_groups
from nmt.decoding.strategies import choose_beam, choose_beam_logits, row_argmax, row_max, top_k
from nmt.errors import ConfigError
from nmt.model import make_model
from nmt.system import private_ops

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.isa]

PAD, BOS, EOS = 0, 2, 3
V = 24
INT8_TOL = 0.03  # int8's error, as a share of the largest output, on every CPU kind


@pytest.fixture(scope="module")
def model():
    return tiny_model(V, seed=1, stops=True, N=2)


@pytest.fixture(scope="module")
def sources():
    return random_sources(24, V, seed=1)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_fast_logits_equal_the_reference(norm):
    """Encoder output, teacher-forced logits and cached steps of FastModel (fp32) match."""
    torch.manual_seed(2)
    model = make_model(dataclasses.replace(tiny_model_cfg(N=2), norm=norm), V, V, PAD, True).eval()
    fast = FastModel(model)
    src = pad_batch([[5, 6, 7, 8], [9, 10]], PAD, "cpu")
    tgt = torch.tensor([[BOS, 4, 5, 6], [BOS, 7, 8, 9]])
    with torch.inference_mode():
        memory, mask = model.encode(src)
        fast_memory, fast_mask = fast.encode(src)
        torch.testing.assert_close(fast_memory, memory, atol=1e-4, rtol=1e-4)
        full = model.decode(tgt, memory, mask)
        torch.testing.assert_close(fast.decode(tgt, fast_memory, fast_mask), full,
                                   atol=1e-4, rtol=1e-4)
        state = fast.start_decoding(fast_memory, fast_mask)
        for t in range(tgt.size(1)):
            torch.testing.assert_close(fast.decode_step(tgt[:, t:t + 1], state)[:, 0],
                                       full[:, t], atol=1e-4, rtol=1e-4)


def test_sentences_that_end_leave_their_memory_rows_until_most_are_dead(model):
    """With the fused operator, a retiring sentence's memory row stays where it is (no copy of
    the live ones') while more than a quarter of the rows live, then the live ones are
    gathered; the logits are those of the reference model's copied rows throughout."""
    if not attention_op.available():
        pytest.skip("the fused attention operator did not build")
    fast = FastModel(model, fused=True)
    src = pad_batch([[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]], PAD, "cpu")
    tgt = torch.randint(4, V, (4, 3), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        state = fast.start_decoding(*fast.encode(src))
        ref = model.start_decoding(*model.encode(src))
        buffer = state.memory_kv[0][0].data_ptr()
        live = [0, 1, 2, 3]  # the live sentences, one row each
        for t, keep in enumerate([None, [1, 2, 3], [2]]):  # of the live ones, by position
            if keep is not None:
                state.reorder(torch.tensor(keep), 1, torch.tensor(keep))
                ref.reorder(torch.tensor(keep))
                live = [live[i] for i in keep]
            torch.testing.assert_close(fast.decode_step(tgt[live, t:t + 1], state),
                                       model.decode_step(tgt[live, t:t + 1], ref),
                                       atol=1e-4, rtol=1e-4)
            if t == 1:  # 3 of 4 live: not copied
                assert state.memory_kv[0][0].data_ptr() == buffer
                assert state.memory_rows.tolist() == [1, 2, 3]
        assert state.memory_rows is None and state.memory_kv[0][0].size(0) == 1  # 1 of 4


def test_sentences_that_join_take_the_memory_rows_of_ended_ones(model):
    """With the fused operator, newcomers' encoder keys and values go into the rows of ended
    sentences (the live ones' stay where they are), and into grown buffers, the live rows
    gathered, when too few are free or a source is longer; the logits are those of batched
    products over rows copied and padded (fused=False) throughout."""
    if not attention_op.available():
        pytest.skip("the fused attention operator did not build")
    fast, plain = FastModel(model, fused=True), FastModel(model, fused=False)
    sources = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [15, 16], [17, 5, 6, 7, 8, 9]]
    tgt = torch.randint(4, V, (6, 4), generator=torch.Generator().manual_seed(0))
    S = 4  # the first sources' width, which the reference pads every memory to
    with torch.inference_mode():
        src = pad_batch(sources[:4], PAD, "cpu")
        state, ref = (m.start_decoding(*m.encode(src)) for m in (fast, plain))
        live, start = [0, 1, 2, 3], [0, 0, 0, 0]  # live sentences and the step each joined
        buffer = state.memory_kv[0][0].data_ptr()
        for t, (keep, new) in enumerate([(None, []), ([0, 2, 3], [4]), (None, [5])]):
            if keep is not None:
                for s in (state, ref):
                    s.reorder(torch.tensor(keep), 1, torch.tensor(keep))
                live, start = [live[i] for i in keep], [start[i] for i in keep]
            if new:
                src = pad_batch([sources[i] for i in new], PAD, "cpu")
                width = max(S, src.size(1))
                state.join(fast.start_decoding(*fast.encode(src)), len(new), width)
                ref.join(plain.start_decoding(*plain.encode(src)), len(new), width)
                S = width
                live, start = live + new, start + [t] * len(new)
                masks = pad_batch([sources[i] for i in live], PAD, "cpu") != PAD
                state.set_source(masks)
                ref.set_source(masks)
            positions = torch.tensor([t - s for s in start])
            ids = tgt[live, t:t + 1]
            torch.testing.assert_close(fast.decode_step(ids, state, positions=positions),
                                       plain.decode_step(ids, ref, positions=positions),
                                       atol=1e-4, rtol=1e-4)
            if t == 1:  # sentence 4 took sentence 1's row, nothing copied
                assert state.memory_kv[0][0].data_ptr() == buffer
                assert state.memory_rows.tolist() == [0, 2, 3, 1]
        # sentence 5 found no free row and is longer: the live rows gathered, room made
        assert state.memory_rows.tolist() == [0, 1, 2, 3, 4]
        assert state.memory_kv[0][0].shape[0] == 6 and state.memory_kv[0][0].shape[2] == 6


def test_beam_rows_share_the_encoder_memory(model):
    """k consecutive rows per sentence share one memory row and give what k copies give."""
    src = pad_batch([[5, 6, 7], [8, 9]], PAD, "cpu")
    k, steps = 3, 4
    g = torch.Generator().manual_seed(0)
    tgt = torch.randint(4, V, (2 * k, steps), generator=g)
    fast = FastModel(model)
    with torch.inference_mode():
        memory, mask = fast.encode(src)
        shared = fast.start_decoding(memory, mask)
        shared.reorder(torch.arange(2).repeat_interleave(k), k)
        assert shared.g == k and shared.memory_kv[0][0].size(0) == 2  # not copied
        ref_memory, ref_mask = model.encode(src)
        copied = model.start_decoding(ref_memory, ref_mask)
        copied.reorder(torch.arange(2).repeat_interleave(k))
        reorder = torch.tensor([2, 2, 0, 4, 3, 3])  # beams move within their sentence
        for t in range(steps):
            a = fast.decode_step(tgt[:, t:t + 1], shared)
            b = model.decode_step(tgt[:, t:t + 1], copied)
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
            shared.reorder(reorder, k)
            copied.reorder(reorder)
        shared.reorder(torch.tensor([3, 4, 5]), k, torch.tensor([1]))  # the first one retires
        copied.reorder(torch.tensor([3, 4, 5]))
        assert shared.g == k  # the fused operator reads the live row where it is
        assert (shared.memory_rows.tolist() == [1] if shared.fused
                else shared.memory_kv[0][0].size(0) == 1)
        torch.testing.assert_close(fast.decode_step(tgt[3:, :1], shared),
                                   model.decode_step(tgt[3:, :1], copied), atol=1e-4, rtol=1e-4)


def test_source_groups_bound_each_groups_padding():
    """Every row in one group, longest first; a group's padding within the bound; sources of
    like length, or one, are one group (None)."""
    g = torch.Generator().manual_seed(3)
    lengths = torch.cat([torch.randint(1, 20, (40,), generator=g), torch.tensor([150, 90, 60])])
    mask = torch.arange(150)[None, :] < lengths[:, None]  # (B, S), padding last
    groups = source_groups(mask)
    rows = torch.cat([r for r, _ in groups]).tolist()
    assert sorted(rows) == list(range(len(lengths))) and len(groups) > 1
    tops = [L for _, L in groups]
    assert tops == sorted(tops, reverse=True) and tops[0] == 150
    for r, L in groups:
        real = int(lengths[r].sum())
        assert int(lengths[r].max()) == L
        assert len(r) * L - real <= PAD_SLACK * real + PAD_ALLOWANCE or len(r) == 1
    assert source_groups(torch.ones(8, 30, dtype=torch.bool)) is None
    assert source_groups(mask[:1]) is None


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8"])
def test_sources_of_unequal_lengths_encode_as_each_alone(model, dtype):
    """Encoded in groups of like length, every sentence's memory and its keys and values are
    its own encoding's (fp32 and bf16: as alone, to rounding; int8: close, its activations'
    scales per group)."""
    g = torch.Generator().manual_seed(4)
    srcs = [torch.randint(4, V, (L,), generator=g).tolist() for L in (3, 80, 5, 2, 40, 38)]
    src = pad_batch(srcs, PAD, "cpu")
    assert source_groups(src != PAD) is not None
    fast = FastModel(model, dtype)
    tol = dict(atol=0.1, rtol=0.1) if dtype == "int8" else dict(atol=1e-2, rtol=1e-2) \
        if dtype == "bf16" else dict(atol=1e-5, rtol=1e-5)
    with torch.inference_mode():
        memory, mask = fast.encode(src)
        state = fast.start_decoding(memory, mask)
        for i, s in enumerate(srcs):
            alone, alone_mask = fast.encode(pad_batch([s], PAD, "cpu"))
            torch.testing.assert_close(memory[i, :len(s)], alone[0], **tol)
            for (k, v), (k1, v1) in zip(state.memory_kv,
                                        fast.start_decoding(alone, alone_mask).memory_kv,
                                        strict=True):
                torch.testing.assert_close(k[i, :, :len(s)], k1[0], **tol)
                torch.testing.assert_close(v[i, :, :len(s)], v1[0], **tol)


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_batch_of_unequal_lengths_gives_each_sentences_own_outputs(model, beam, dtype):
    """Batched equals one at a time where the batch is encoded in groups: in fp32, and in int8
    where each row's activations are rounded by their own range (rows_alone; with one scale a
    call, a sentence's batch mates moved its outputs)."""
    if dtype == "int8" and not rows_alone():
        pytest.skip("int8 rows are not rounded alone here (no operator, or no oneDNN)")
    if dtype == "int8" and int8_rows_layout() == "pairs":  # int8_rows takes one row: a batch's
        pytest.skip("maps go through oneDNN's product, the same to float rounding only, which "
                    "moves the tiny model's argmax")
    g = torch.Generator().manual_seed(5)
    srcs = [torch.randint(4, V, (L,), generator=g).tolist() for L in (60, 2, 3, 45, 5, 7)]
    assert source_groups(pad_batch(srcs, PAD, "cpu") != PAD) is not None
    cfg = search(beam_size=beam, nbest=min(beam, 2), max_len_a=0.0, max_len_b=12, dtype=dtype)
    batched = run(model, srcs, cfg)
    single = run(model, srcs, dataclasses.replace(cfg, max_tokens=1))
    assert tokens(batched) == tokens(single)
    for b, s in zip(batched, single, strict=True):
        assert [h.score for h in b] == pytest.approx([h.score for h in s], abs=1e-4)


@pytest.mark.parametrize("kw", [dict(beam_size=1), dict(beam_size=4, nbest=3),
                                dict(sampling=True, nbest=3, top_k=5),
                                dict(beam_size=4, no_repeat_ngram_size=2)])
def test_the_fast_path_gives_the_reference_tokens(model, sources, kw):
    cfg = search(**kw)
    fast = run(model, sources, cfg)
    reference = run(model, sources, cfg, fast=False)
    assert tokens(fast) == tokens(reference)
    for f, r in zip(fast, reference, strict=True):
        assert [h.score for h in f] == pytest.approx([h.score for h in r], abs=1e-4)


@pytest.mark.parametrize("relu", [False, True])
def test_affine_forms_compute_the_same_maps(relu):
    """F.linear, oneDNN with packed weights and int8: x W^T + b, ReLU or + residual."""
    torch.manual_seed(0)
    x, w, b, r = torch.randn(5, 1, 16), torch.randn(32, 16), torch.randn(32), torch.randn(5, 1, 32)
    want = F.linear(x, w, b)
    want = want.relu() if relu else want + r
    forms = [(Affine(w, b, relu), 1e-5), (Int8Affine(w, b, relu), INT8_TOL)]
    if packing_works(torch.float32):
        forms.append((PackedAffine(w, b, relu, rows=5), 1e-5))
    for affine, tol in forms:
        got = affine(x) if relu else affine(x, r)
        torch.testing.assert_close(got, want, atol=tol * want.abs().max(), rtol=0)
    assert packing_works(torch.float32) or not torch.backends.mkldnn.is_available()


@pytest.mark.long  # an Inductor build for each of the step's variants, ~10 s each
def test_a_compiled_step_gives_the_eager_steps_logits():
    """search.compile (fp32; int8's is tests/unit/test_aot_step.py's): the fused step through
    torch.compile gives eager's logits, compiled once with all outputs and once with a
    shortlist's: never again as the cache grows, the rows reorder or the batch and its
    sources change size. One decoder layer: the second would compile to the same kernels."""
    tol, shortlist = 1e-5, True
    if not attention_op.available():
        pytest.skip("the fused attention operator did not build")
    model = tiny_model(V, seed=1, stops=True)
    fast, compiled = FastModel(model), FastModel(model, compile=True)
    batches = [pad_batch([[5, 6, 7, 8, 9], [9, 10], [11, 12, 4]], PAD, "cpu"),
               pad_batch([[4, 5], [6, 7, 8, 9, 10, 11, 12]], PAD, "cpu"),
               pad_batch([[6, 7, 8]], PAD, "cpu")]  # one row: eager
    shortlists = (None, torch.tensor([3, 5, 7, 11, 4, 20]))[:1 + shortlist]  # all, then six
    with torch.inference_mode():
        for vocab in shortlists:  # the compilations
            state = compiled.start_decoding(*compiled.encode(batches[0]), vocab)
            compiled.decode_step(torch.full((3, 1), BOS), state)
        with torch.compiler.set_stance("fail_on_recompile"):
            for src, vocab in itertools.product(batches, shortlists):
                states = [m.start_decoding(*m.encode(src), vocab) for m in (fast, compiled)]
                y = torch.full((len(src), 1), BOS)
                for t in range(9):
                    want, got = (m.decode_step(y, s)[:, 0]
                                 for m, s in zip((fast, compiled), states, strict=True))
                    torch.testing.assert_close(got, want, atol=tol * want.abs().max(), rtol=0)
                    best = want.argmax(1)  # (B,) columns: the shortlist's, or ids
                    assert got.argmax(1).tolist() == best.tolist()
                    y = (best if vocab is None else vocab[best])[:, None]
                    if t == 3:  # a reorder, as beam search's: the rows reversed
                        for s in states:
                            s.reorder(torch.arange(len(src) - 1, -1, -1), 1)


def test_search_compile_without_the_fused_operator_is_refused_naming_the_key(monkeypatch):
    """search.compile compiles the fused operator's step (and Inductor needs a C++ compiler):
    without them a one-line ConfigError naming the key, where it was silently off."""
    monkeypatch.setattr(attention_op, "available", lambda: False)
    monkeypatch.setattr(attention_op, "status", lambda: "no C++ compiler (c++)")
    model = tiny_model(V, seed=1)
    with pytest.raises(ConfigError, match=r"^search\.compile=true: needs a C\+\+ compiler and "
                       r"the fused attention operator \(no C\+\+ compiler \(c\+\+\)\); use "
                       r"search\.compile=false$") as refused:
        FastModel(model, "int8", compile=True)
    assert refused.value.key == "search.compile"
    with pytest.raises(ConfigError, match=r"fused=False"):
        FastModel(model, fused=False, compile=True)
    assert not FastModel(model).compiled  # without search.compile: batched products, as before


class Operators(TorchDispatchMode):
    """The operators dispatched while it is on, counted by name (views too)."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func._schema.name] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("rows", [4, FBGEMM_OUTPUTS // 64 + 1])  # fbgemm's, oneDNN's
@pytest.mark.parametrize("alone", [False, True])
def test_an_int8_relu_map_has_the_relu_in_its_epilogue(rows, alone, monkeypatch):
    """Int8Affine(relu=True): the ReLU in the product's dequantizing epilogue (no relu_ after
    it: one operator, or int8_rows_rescale's among the three of a map of many rows alone), the
    same outputs as the product and then the ReLU; again at the same shape (oneDNN keeps the
    primitive of a weight's first call, post-op included)."""
    if alone and not rows_alone():
        pytest.skip("rows are not rounded alone here (no operator, or no oneDNN)")
    monkeypatch.setattr(affine_module, "rows_alone", lambda: alone)
    torch.manual_seed(0)
    w, b = torch.randn(64, 32), torch.randn(64)
    relu, plain = Int8Affine(w, b, relu=True), Int8Affine(w, b)
    for _ in range(2):
        x = torch.randn(rows, 32)
        with Operators() as ops:
            got = relu(x)
        assert "aten::relu_" not in ops.counts
        assert sum(ops.counts.values()) == (3 if alone and rows > relu.few_rows else 1)
        torch.testing.assert_close(got, plain(x).relu(), rtol=0, atol=0)


@pytest.mark.parametrize("sentences", [1, 3, 9])
def test_an_int8_step_runs_fp32s_operators_with_int8_products(model, sentences):
    """One int8 decoding step dispatches the operators of fp32's (whose packed maps fuse the
    ReLU and the residual addition), an int8 product for each packed product, and no ReLU.
    A few rows (few_rows: by its layout on this CPU) go through nmt::int8_rows, the residual in
    its epilogue: exactly fp32's operators; more through fbgemm, with one residual addition
    after each sub-layer's last map (3 a decoder layer)."""
    if not packing_works(torch.float32):
        pytest.skip("fp32's maps are not packed here: no fused epilogues to compare with")
    src = pad_batch(([[5, 6, 7, 8, 9], [9, 10], [11, 12, 4], [6, 7], [8, 9, 10]] * 2)[:sentences],
                    PAD, "cpu")
    counts = {}
    with torch.inference_mode():
        for dtype in ("fp32", "int8"):
            fast = FastModel(model, dtype)
            state = fast.start_decoding(*fast.encode(src))
            fast.decode_step(torch.full((sentences, 1), BOS), state)
            with Operators() as ops:
                fast.decode_step(torch.full((sentences, 1), BOS), state)
            counts[dtype] = ops.counts
    fp32, int8 = counts["fp32"], counts["int8"]
    maps = [fast.generator] + [getattr(layer, name) for layer in fast.decoder
                               for name in ("qkv", "o", "q", "o2", "W_1", "W_2")]
    few = sentences <= min(m.few_rows for m in maps)  # every map's (the tiny model's: alike)
    many = int8.pop("onednn::qlinear_pointwise", 0)  # maps of many rows, each rounded alone
    assert int8.pop("nmt::int8_rows_quantize", 0) == int8.pop("nmt::int8_rows_rescale", 0) == many
    products = many + sum(int8.pop(op, 0) for op in ("nmt::int8_rows", "quantized::linear_dynamic",
                                                     "quantized::linear_relu_dynamic"))
    assert fp32.pop("mkldnn::_linear_pointwise") == products
    assert int8 - fp32 == ({} if few or rows_alone() else {"aten::add_": 3 * len(model.decoder)})
    assert not fp32 - int8


# N and K odd sizes too; K a multiple of 64 (AMX's tiles where the CPU has them: 3 rows or more)
@pytest.mark.parametrize("shape", [(64, 32), (100, 33), (100, 192), (4000, 256)])
def test_int8_rows_gives_fbgemms_outputs_of_each_row_alone_bit_for_bit(shape):
    """nmt::int8_rows rounds and sums as fbgemm does a call of one row: an Int8Affine's few
    rows (its ReLU, or its residual, in the epilogue) equal fbgemm's product of each row alone
    (then the addition) bit for bit, and so does the operator at more rows, with 8- and 7-bit
    activations, under every ISA's build (the VNNI layout where this CPU has it, its sums through
    AMX's tiles where it has those, else quads; test_isa reruns it under AVX2 dispatch)."""
    if not attention_op.available():
        pytest.skip(f"nmt's operators are not built here ({attention_op.status()})")
    torch.manual_seed(0)
    w, b = torch.randn(*shape) / 16, torch.randn(shape[0])
    plain, relu = Int8Affine(w, b), Int8Affine(w, b, relu=True)
    assert plain.few_rows == few_rows(*shape)
    # none only where the quads' kernel would take 8-bit activations (ATen without AVX-512, an
    # fbgemm that does not saturate: the operator's plain loops, tested below)
    assert plain.few_rows >= 1 or (int8_rows_layout() == "quads" and not plain.reduce_range)
    for rows in sorted({r for r in (1, 2, 5, plain.few_rows) if 1 <= r <= plain.few_rows}):
        x, residual = torch.randn(rows, 1, shape[1]) * 3, torch.randn(rows, 1, shape[0])
        with Operators() as ops:
            got = plain(x), relu(x), plain(x, residual)
        assert ops.counts == {"nmt::int8_rows": 3}
        want = (each_alone(plain.product, x), each_alone(relu.product, x),
                each_alone(plain.product, x).add_(residual))
        assert all(torch.equal(g, y) for g, y in zip(got, want, strict=True))
    for rows in (2, 3, 4, 5, 8, 9, 16, 33):  # the kernels' blocks of 2 or 4 rows, the rest
        x = torch.randn(rows, shape[1])
        for reduce_range in {plain.reduce_range, True}:  # 8 bits where no engine saturates
            ours = torch.ops.nmt.int8_rows(x, *plain._few(), b, None, False, reduce_range)
            want = each_alone(functools.partial(
                private_ops.quantized_linear, packed=plain._packed(int8_engines()[0]),
                reduce_range=reduce_range), x)
            assert torch.equal(ours, want)


def each_alone(product, x: torch.Tensor) -> torch.Tensor:
    """product(x) row by row: each of x's rows (along its first dimension) given alone."""
    return torch.cat([product(x[i:i + 1]) for i in range(len(x))])


@pytest.mark.parametrize("shape", [(64, 32), (100, 33), (4000, 256)])
def test_int8_maps_of_many_rows_round_each_row_alone(shape):
    """Past int8_rows' few rows, each row is rounded alone too (int8_rows_quantize, oneDNN's
    sums, int8_rows_rescale): a row's outputs are its own alone, to float rounding, whatever its
    batch mates (one scale a call moved them by ~1% of the largest); ReLU and residual in
    the epilogue."""
    if not rows_alone():
        pytest.skip("rows are not rounded alone here (no operator, or no oneDNN)")
    torch.manual_seed(0)
    w, b = torch.randn(*shape) / 16, torch.randn(shape[0])
    plain, relu = Int8Affine(w, b), Int8Affine(w, b, relu=True)
    rows = plain.few_rows + 7
    x = torch.randn(rows, shape[1]) * torch.linspace(0.1, 10, rows)[:, None]  # unlike ranges
    residual = torch.randn(rows, shape[0])
    with Operators() as ops:
        got = plain(x), relu(x), plain(x, residual)
    assert ops.counts == {"nmt::int8_rows_quantize": 3, "onednn::qlinear_pointwise": 3,
                          "nmt::int8_rows_rescale": 3}
    want = (each_alone(plain, x), each_alone(relu, x), each_alone(plain, x) + residual)
    for g, y in zip(got, want, strict=True):
        torch.testing.assert_close(g, y, rtol=1e-6, atol=1e-6 * float(y.abs().max()))
    assert (plain.product(x) - want[0]).abs().max() > 1e-3 * want[0].abs().max()


def test_int8_shortlist_rows_are_gathered_not_quantized_again():
    """Int8Affine.rows: the int8 rows and scales of the whole map, gathered (CTranslate2's
    select_weights), give what quantizing those rows anew gives (one scale per row)."""
    torch.manual_seed(0)
    x, w, b = torch.randn(6, 1, 16), torch.randn(40, 16), torch.randn(40)
    index = torch.tensor([31, 2, 7, 7, 19])
    whole, part = Int8Affine(w, b), Int8Affine(w[index], b[index])
    rows = whole.rows(index, b[index])
    assert torch.equal(rows.ints, part.ints) and torch.equal(rows(x), part(x))
    assert torch.equal(rows(x), whole(x)[..., index])  # the whole map's columns


def test_int8_products_by_size_go_to_either_engine_alike(monkeypatch):
    """Where rows are not rounded alone (one scale a call: no operator), small products
    through fbgemm, large ones through oneDNN (FBGEMM_OUTPUTS), the same map either way (the
    same int32 products, rescaled; an activation may round to the other level); a
    shortlist's rows pack only the engine that is called."""
    monkeypatch.setattr(affine_module, "rows_alone", lambda: False)
    if int8_engines() != ("fbgemm", "onednn"):
        pytest.skip(f"Int8Affine takes {int8_engines()} here (fbgemm only where it saturates "
                    f"as oneDNN does)")
    torch.manual_seed(0)
    w, b = torch.randn(512, 1024) * 0.03, torch.randn(512)
    affine = Int8Affine(w, b)
    small = torch.randn(few_rows(*w.shape) + 1, 1024)  # past int8_rows' few rows
    large = torch.randn(FBGEMM_OUTPUTS // 512 + 1, 1024)
    for x in (small, large):
        by = {engine: private_ops.quantized_linear(x, affine._packed(engine), True)
              for engine in ("fbgemm", "onednn")}  # 7 bits: no kernel saturates
        level = 0.01 * by["onednn"].abs().max()  # far below a missing bias or a wrong scale
        torch.testing.assert_close(by["fbgemm"], by["onednn"], rtol=0, atol=float(level))
        engine = "fbgemm" if x is small else "onednn"
        torch.testing.assert_close(affine(x), private_ops.quantized_linear(
            x, affine._packed(engine), affine.reduce_range), rtol=0, atol=0)
    part = affine.rows(torch.arange(0, 512, 2), b[::2])
    part(torch.randn(part.few_rows + 1, 1024))  # past its own few rows
    assert set(part.packed) == {"fbgemm"}
    part(torch.randn(FBGEMM_OUTPUTS // 256 + 1, 1024))
    assert set(part.packed) == {"fbgemm", "onednn"}


def test_8bit_activations_saturate_exactly_where_the_probe_says():
    """The one int8 tolerance holds on every CPU kind, in each engine; the probe asks each
    engine's kernel itself: with 8-bit activations a 256 -> 512 map is off by ~0.1x its largest
    output where the u8 x s8 products saturate (no VNNI, or under ONEDNN_MAX_CPU_ISA /
    FBGEMM_ENABLE_INSTRUCTIONS=AVX2), by ~0.01x where they don't, and Int8Affine uses 7 bits
    exactly there."""
    torch.manual_seed(0)
    x, w, b = torch.randn(64, 256), torch.randn(512, 256) * 0.05, torch.zeros(512)
    want = F.linear(x, w, b)
    tol = INT8_TOL * want.abs().max()
    affine = Int8Affine(w, b)
    assert (affine(x) - want).abs().max() < tol
    assert affine.reduce_range == int8_saturates() == int8_saturates(int8_engines()[0])
    for engine in set(torch.backends.quantized.supported_engines) & {"fbgemm", "onednn"}:
        packed = affine._packed(engine)
        saturates = int8_saturates(engine)
        assert (private_ops.quantized_linear(x, packed, saturates) - want).abs().max() < tol
        error = (private_ops.quantized_linear(x, packed, False) - want).abs().max()  # 8 bits
        assert error > 3 * tol if saturates else error < tol
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() == "AVX2":
        assert int8_saturates("onednn")  # the cap reaches the int8 kernels: this test can fail
    if os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS", "").upper() == "AVX2":
        assert int8_saturates("fbgemm")


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_bf16_and_int8_stay_close_to_fp32(dtype):
    """Logits within a few percent; on a peaked model the same greedy and beam outputs."""
    model = tiny_model(V, seed=4, N=2)
    with torch.no_grad():
        model.generator.weight.mul_(6.0)  # a confident model, as trained ones are
    src = pad_batch([[5, 6, 7, 8], [9, 10]], PAD, "cpu")
    tgt = torch.tensor([[BOS, 4, 5, 6], [BOS, 7, 8, 9]])
    with torch.inference_mode():
        ref = model.decode(tgt, *model.encode(src))
        low = FastModel(model, dtype)
        out = low.decode(tgt, *low.encode(src)).float()
    assert (out - ref).abs().max() < 0.05 * ref.abs().max()
    sources = random_sources(16, V, seed=5)
    for beam in (1, 4):
        cfg = search(beam_size=beam)
        same = [a == b for a, b in zip(tokens(run(model, sources, SearchConfig(**{
            **vars(cfg), "dtype": dtype}))), tokens(run(model, sources, cfg)), strict=True)]
        assert sum(same) >= 0.8 * len(same)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_cuda_decoding_in_half_precision(dtype):
    """On a GPU: the CPU's outputs in fp32, nearly all of them in bf16 and fp16."""
    model = tiny_model(V, seed=4, N=2)
    with torch.no_grad():
        model.generator.weight.mul_(6.0)
    sources = random_sources(16, V, seed=5)
    cpu = tokens(run(model, sources, search()))
    gpu = tokens(run(model.cuda(), sources, search(dtype=dtype), device="cuda"))
    same = [a == b for a, b in zip(gpu, cpu, strict=True)]
    assert all(same) if dtype == "fp32" else sum(same) >= 0.8 * len(same)


def test_fast_model_leaves_the_model_unchanged(model):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for dtype in ("fp32", "bf16", "int8"):
        FastModel(model, dtype)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) and before[k].dtype == after[k].dtype
               for k in before)


def test_int8_and_fp16_say_where_they_run(model):
    with pytest.raises(ValueError, match="fp16 needs CUDA"):
        FastModel(model, "fp16")


# ----------------------------------------------------------------------------- search helpers
@pytest.mark.parametrize("V", [24, 8000, 8001, 4 * 1000 + 7])
def test_row_argmax_and_top_k_equal_torch(V, monkeypatch):
    """All give torch's answer: random rows, rows with -inf, tied maxima (and NaN)."""
    g = torch.Generator().manual_seed(V)
    x = torch.randn(6, V, generator=g)
    x[1, V // 3:] = -torch.inf  # a dead beam's candidates
    x[2, :] = -torch.inf
    x[2, [V - 1, 5]] = 0.0  # fewer finite values than asked for, tied
    x[3, [V // 2, V // 5, V - 1]] = 9.0  # a tied maximum: the first one counts
    assert torch.equal(row_argmax(x), x.argmax(dim=1))
    assert row_argmax(x)[3] == V // 5
    for n in (1, 8):
        values, cols = top_k(x, n)
        want, _ = x.topk(n, dim=1)
        assert torch.equal(values, want)
        assert torch.equal(x.gather(1, cols), values)  # the columns hold those values
        finite = values.isfinite()
        assert all(len(set(c[f].tolist())) == int(f.sum()) for c, f in zip(cols, finite,
                                                                              strict=True))
    x[4, [V // 2, V - 1]] = torch.nan  # a row with NaN: NaN at its first
    best, cols = row_max(x)
    want = x.max(dim=1)
    torch.testing.assert_close(best, want.values, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(cols, want.indices) and cols[3] == V // 5 and cols[4] == V // 2
    monkeypatch.setattr(attention_op, "available", lambda: False)  # x.max or row_argmax
    torch.testing.assert_close(row_max(x)[0], best, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(row_max(x)[1], cols)


@pytest.mark.parametrize("V", [3, 24, 8000, 16_007])
def test_the_top_k_operator_equals_torch(V):
    """nmt::top_k (each build's vector width): torch.topk's values, NaN first, each column
    holding its value once, equal values in column order; n from 1 to V; banned columns
    (greedy's choice in int8's package) as if at -inf."""
    if not attention_op.available():
        pytest.skip(f"nmt's operators are not built here ({attention_op.status()})")
    g = torch.Generator().manual_seed(V)
    x = torch.randn(5, V, generator=g)
    x[1, V // 3:] = -torch.inf
    x[2, [V - 1, 0, V // 2]] = 9.0  # tied
    x[3, [V // 2, V - 1]] = torch.nan  # a dead row's log-softmax
    x[4, :] = torch.nan
    for n in sorted({n for n in (1, 2, 8, V) if n <= V}):
        values, cols = torch.ops.nmt.top_k(x, n)
        want, _ = x.topk(n, dim=1)
        torch.testing.assert_close(values, want, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(x.gather(1, cols), values, rtol=0, atol=0, equal_nan=True)
        assert all(len(set(c)) == n for c in cols.tolist())
        tied = cols[2, :min(n, 3)].tolist()
        assert tied == sorted([V - 1, 0, V // 2])[:len(tied)]
    every_other = x[::2, :V - 1]  # rows 2 V apart, one column short
    values, cols = torch.ops.nmt.top_k(every_other, 1)
    torch.testing.assert_close(values[:, 0], every_other.max(dim=1).values, rtol=0, atol=0,
                               equal_nan=True)
    wide = torch.randn(3, 2 * V, generator=g)[:, ::2]  # columns not contiguous: refused
    with pytest.raises(RuntimeError, match="contiguous columns"):
        torch.ops.nmt.top_k(wide, 1)
    banned = torch.zeros(V, dtype=torch.bool)
    banned[[0, V // 2, V - 1]] = True  # the tied and NaN columns among them
    for n in sorted({n for n in (1, 2, 8, V) if n <= V}):
        masked = x.masked_fill(banned, -torch.inf)
        want = torch.ops.nmt.top_k(masked, n)
        got = torch.ops.nmt.top_k(x, n, banned)  # as if masked, x unchanged
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, equal_nan=True)
        assert torch.equal(got[1], want[1])
    torch.testing.assert_close(torch.ops.nmt.top_k(x, 1, banned)[0][:, 0],
                               x.masked_fill(banned, -torch.inf).max(dim=1).values, rtol=0,
                               atol=0, equal_nan=True)
    with pytest.raises(RuntimeError, match="banned must be"):
        torch.ops.nmt.top_k(x, 1, banned[1:])


@pytest.mark.parametrize("kb", [1, 4])
def test_the_beam_operator_chooses_as_choose_beam(kb, monkeypatch):
    """nmt::beam_top_k (strategies.choose_beam_logits): choose_beam's candidates of the
    log-softmax after the bans, bit for bit: ties (row, then column), a dead row, a NaN row,
    a NaN score."""
    if not attention_op.available():
        pytest.skip(f"nmt's operators are not built here ({attention_op.status()})")
    g = torch.Generator().manual_seed(kb)
    b, k, V = 3, 4, 300
    logits = torch.randn(b * kb, V, generator=g).mul_(4).round_()  # ties within and across rows
    logits[-1] = -torch.inf  # a dead row
    logits[0, 7] = torch.nan
    scores = torch.randn(b, kb, generator=g).round_()
    scores[1, 0] = torch.nan
    banned = torch.tensor([0, 2, 5])
    lprobs = torch.log_softmax(logits, dim=-1).index_fill_(1, banned, -torch.inf)
    want = choose_beam(lprobs, scores, k)
    with Operators() as ops:
        step = choose_beam_logits(logits, scores, banned, k)
    assert ops.counts == {"nmt::beam_top_k": 1}
    for name in ("scores", "parents", "tokens"):
        torch.testing.assert_close(getattr(step.choice, name), getattr(want, name), rtol=0,
                                   atol=0, equal_nan=True)
    # the first k as the next step's rows: scores (b, k), u kb + parent and tokens (b k,)
    torch.testing.assert_close(step.scores, want.scores[:, :k], rtol=0, atol=0, equal_nan=True)
    assert step.rows.tolist() == [u * kb + p for u in range(b)
                                  for p in want.parents[u, :k].tolist()]
    assert torch.equal(step.tokens, want.tokens[:, :k].reshape(-1))
    # a model's logits (4,000 columns, their log-softmax's sums of many terms), bit for bit
    for scale in (1.0, 8.0):
        wide = torch.randn(b * kb, 4000, generator=g) * scale
        prefix = -torch.rand(b, kb, generator=g)
        want = choose_beam(torch.log_softmax(wide, dim=-1).index_fill_(1, banned, -torch.inf),
                           prefix, k)
        got = choose_beam_logits(wide, prefix, banned, k).choice
        for name in ("scores", "parents", "tokens"):
            assert torch.equal(getattr(got, name), getattr(want, name))
    # without the operator, the same (without ties or NaN, whose order torch.topk's may differ)
    untied, finite = torch.randn(b * kb, V, generator=g), torch.randn(b, kb, generator=g)
    step = choose_beam_logits(untied, finite, banned, k)
    monkeypatch.setattr(strategies, "_one_pass", lambda x: False)
    calls = choose_beam_logits(untied, finite, banned, k)
    for x, y in zip([*vars(calls.choice).values(), *calls[1:]],
                    [*vars(step.choice).values(), *step[1:]], strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(RuntimeError, match="banned column past V"):
        torch.ops.nmt.beam_top_k(logits, scores, torch.tensor([V]), 2 * k)
