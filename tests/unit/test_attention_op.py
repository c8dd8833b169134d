"""nmt.decoding.attention_op: the fused one-query attention operator equals its PyTorch
reference (random shapes, ragged lengths, beam parents, fp32 and bf16), decoding through it
equals decoding through batched products, a beam's reorder copies no keys, and without a C++
compiler nmt says so in one line and decodes as before. The build: its folder is keyed by what
the object is built from; a killed build blocks no later run, two first runs share one build,
and a wait on a live builder is bounded. Marked isa: tests/system/test_isa.py runs them again under
AVX2 dispatch, which builds and tests the AVX2 object."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from translate_helpers import random_sources, search, tiny_model

from nmt.data.tokenizer import SPECIALS
from nmt.decoding import attention_op
from nmt.decoding.affine import packing_works
from nmt.decoding.batches import pad_batch, translate_nbest
from nmt.decoding.fast_model import DTYPES, FastModel
from nmt.decoding.fast_state import FastState, TableKVCache, additive_source_mask

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.isa]

V = 24
# The build's lock does not depend on the instruction set: tests/system/test_isa.py's tier skips it.
UNCAPPED = pytest.mark.skipif(bool(os.environ.get("ATEN_CPU_CAPABILITY")),
                              reason="the build's lock is the same under every ISA")
AVAILABLE = "from nmt.decoding import attention_op; print(attention_op.available())"


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


@pytest.mark.parametrize("fused", [True, False])
def test_the_source_mask_follows_from_the_lengths_through_reorders(fused):
    """FastState.mask, made from the source lengths when read: the additive mask of the
    sources given, of the sentences a reorder keeps, and none for one unpadded source."""
    memory = [(torch.zeros(3, 2, 5, 4), torch.zeros(3, 2, 5, 4))]  # 3 sources, 5 positions
    src_mask = torch.arange(5) < torch.tensor([5, 2, 4])[:, None]  # (3, 5)
    state = FastState(memory, src_mask, torch.float32, fused)
    assert torch.equal(state.mask, additive_source_mask(src_mask[:, None, None, :],
                                                        torch.float32))
    keep = torch.tensor([2, 0])
    state.reorder(keep, 1, keep)
    assert torch.equal(state.mask, additive_source_mask(src_mask[keep][:, None, None, :],
                                                        torch.float32))
    state.reorder(torch.tensor([1]), 1, torch.tensor([1]))  # the whole source alone
    assert state.mask is None
    one = FastState([(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4))], None, torch.float32,
                    fused)
    assert one.mask is None and one.src_len.tolist() == [5]


@pytest.mark.parametrize("first", [2, 3, 7])
def test_a_trim_in_place_keeps_the_buffers_and_moves_what_the_view_would_read(first):
    """TableKVCache.trim with the positions stored (a loop's own rows): the same buffers,
    whole, every stored position from `first` on at the front (also where more remain than
    it drops), as the trim's views have them; the table shifted, its width kept."""
    g = torch.Generator().manual_seed(4)
    cache = TableKVCache()
    cache._reserve(torch.zeros(1, 2, 1, 4), 3, 12)  # 3 buffer rows, 2 heads, d_k 4
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    cache.table.copy_(torch.randint(0, 3, cache.table.shape, generator=g))
    cache.length = stored = 11
    views = TableKVCache()
    views.k, views.v, views.table = (x.clone() for x in (cache.k, cache.v, cache.table))
    views.length = stored
    buffers, width = (cache.k.data_ptr(), cache.v.data_ptr()), cache.table.size(1)
    cache.trim(first, stored)
    views.trim(first)
    assert (cache.k.data_ptr(), cache.v.data_ptr()) == buffers
    assert cache.k.is_contiguous() and cache.table.size(1) == width
    kept = stored - first
    for name in ("k", "v"):
        assert torch.equal(getattr(cache, name)[:, :, :kept], getattr(views, name)[:, :, :kept])
    assert torch.equal(cache.table[:, :kept], views.table[:, :kept])
    assert cache.length == views.length == kept


def test_a_loops_reorder_in_place_is_reorder_then_moved(op):
    """FastState.reorder_own (nmt::reorder_tables): every layer's table as reorder's gather
    and moved's own rows from `keep` on would make it, in the same tensors; refused (False,
    nothing changed) where the rows' number or grouping changes; an index past the rows is
    an error."""
    model = tiny_model(V, seed=1, stops=True, N=2)
    fast = FastModel(model, fused=True)
    src = pad_batch([[5, 6, 7], [8, 9]], SPECIALS.pad, "cpu")
    with torch.inference_mode():
        state = fast.start_decoding(*fast.encode(src))
        state.reorder(torch.arange(2).repeat_interleave(3), group=3)
        own = torch.arange(6)[:, None]
        caches = state.own_rows(6, 9, 6, own)
        for cache in state.self_kv:  # a past to gather: distinct entries
            cache.table.copy_(torch.arange(6 * cache.table.size(1)).view(6, -1) % 6)
        before = [cache.table.clone() for cache in state.self_kv]
        index = torch.tensor([2, 2, 0, 4, 3, 3])
        assert state.reorder_own(index, 4, group=3)
        for cache, table, (_, _, held) in zip(state.self_kv, before, caches, strict=True):
            want = table.index_select(0, index)
            want[:, 4:] = own
            assert cache.table is held and torch.equal(cache.table, want)
        now = [cache.table.clone() for cache in state.self_kv]
        assert not state.reorder_own(index[:4], 4, group=3)  # fewer rows
        assert not state.reorder_own(index, 4, group=2)  # grouped anew
        assert all(torch.equal(c.table, t) for c, t in zip(state.self_kv, now, strict=True))
        with pytest.raises(RuntimeError, match="index past the rows"):
            state.reorder_own(torch.full((6,), 6), 4, group=3)


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
    code = ("import torch; from nmt.decoding import attention_op; "
            "from nmt.decoding.fast_model import FastModel; from nmt.model import make_model; "
            "from nmt.config import ModelConfig; "
            "cfg = ModelConfig(N=1, d_model=16, d_ff=32, h=2, dropout=0.0); "
            "m = make_model(cfg, 8, 8, 0, True).eval(); "
            "print(attention_op.available(), FastModel(m).fused)\n"
            "try: FastModel(m, compile=True)\n"
            "except Exception as e: print(type(e).__name__, e)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0].split() == ["False", "False"]
    # search.compile needs the operator (and Inductor a compiler): refused, not silently off
    assert out[1].startswith("ConfigError search.compile=true: needs a C++ compiler and the "
                             "fused attention operator (no C++ compiler (") and len(out) == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "fused attention operator is not available (no C++ compiler" \
        in lines[0]


def test_another_source_flag_or_torch_build_gives_another_build_directory(tmp_path,
                                                                           monkeypatch):
    """An upgrade that keeps the files' times, or another torch build of the same version,
    never finds the old object: the folder is keyed by contents, not times or paths."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    isa = attention_op.capability()
    here = attention_op.build_directory(isa)
    times = attention_op.SOURCE.stat()
    copy, edited = tmp_path / "copy.cpp", tmp_path / "edited.cpp"
    copy.write_bytes(attention_op.SOURCE.read_bytes())
    edited.write_bytes(attention_op.SOURCE.read_bytes() + b"// changed\n")
    for path in (copy, edited):
        os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    rest = attention_op.SOURCES[1:]  # the other operators' sources, built into the object
    monkeypatch.setattr(attention_op, "SOURCES", [copy, *rest])
    assert attention_op.build_directory(isa) == here  # the same contents elsewhere
    monkeypatch.setattr(attention_op, "SOURCES", [edited, *rest])
    others = [attention_op.build_directory(isa)]
    monkeypatch.setattr(attention_op, "SOURCES", [copy, *rest])
    monkeypatch.setitem(attention_op.ISA_FLAGS, isa, [*attention_op.ISA_FLAGS[isa], "-DX"])
    others.append(attention_op.build_directory(isa))
    monkeypatch.setitem(attention_op.ISA_FLAGS, isa, attention_op.ISA_FLAGS[isa][:-1])
    assert attention_op.build_directory(isa) == here
    monkeypatch.setattr(torch.version, "git_version", "0" * 40)
    others.append(attention_op.build_directory(isa))
    assert len({here, *others}) == 4


def test_a_build_leaves_the_build_key_as_it_was(tmp_path, monkeypatch):
    """torch's cpp_extension.load appends its libraries to the linker flags it is given: a
    build must not change the key (and so the folder, and every search.compile package's
    key) that later lookups in the same process compute, or the process that built the
    operator would name packages that no other process finds."""
    from torch.utils import cpp_extension

    def load(name, sources, extra_cflags, extra_ldflags, build_directory, **kwargs):
        extra_ldflags.append("-ltorch_cpu")  # as torch's _prepare_ldflags does
        (Path(build_directory) / f"{name}.so").write_bytes(b"")

    monkeypatch.setattr(cpp_extension, "load", load)
    isa = attention_op.capability()
    key = attention_op.build_key(isa)
    attention_op._compile(isa, tmp_path / "nmt_ops.so")
    assert (tmp_path / "nmt_ops.so").exists() and attention_op.build_key(isa) == key


def test_an_unreadable_build_wait_is_named(monkeypatch):
    monkeypatch.setenv("NMT_OP_BUILD_WAIT", "soon")
    with pytest.raises(attention_op.NotBuilt, match="NMT_OP_BUILD_WAIT='soon' is not a number"):
        attention_op._wait_bound()


def finish(runs: list[subprocess.Popen], timeout: float) -> list[tuple[str, str]]:
    """Each run's (stdout, stderr), all of them killed (and the test failed) past `timeout`."""
    try:
        return [run.communicate(timeout=timeout) for run in runs]
    except subprocess.TimeoutExpired:
        pytest.fail(f"a run was still waiting after {timeout} s")
    finally:
        for run in runs:
            run.kill()
            run.wait()


def stand_in_source(path: Path) -> Path:
    """A source at `path` that declares the operators' schemas (every TORCH_LIBRARY block of the
    real sources) without their kernels: its build takes the real one's path and locks in a
    fraction of its compile (every other test loads the real object)."""
    texts = [source.read_text() for source in attention_op.SOURCES]
    blocks = [block for text in texts for block in re.findall(
        r"^TORCH_LIBRARY(?:_FRAGMENT)?\(nmt, m\) \{.*?^\}", text, re.S | re.M)]
    heads = [h for text in texts
             for h in re.findall(r"^TORCH_LIBRARY(?:_FRAGMENT)?\(nmt, m\) \{", text, re.M)]
    assert len(blocks) == len(heads) >= 3  # every block whole (int8_amx.cpp registers none)
    path.write_text("#include <torch/library.h>\n\n" + "\n\n".join(blocks) + "\n")
    return path


# attention_op.available() in a run that builds `sys.argv[1]` in place of the real sources
AVAILABLE_STAND_IN = ("import sys; from pathlib import Path; "
                      "from nmt.decoding import attention_op; "
                      "attention_op.SOURCES = [Path(sys.argv[1])]; print(attention_op.available())")


@pytest.mark.long
@UNCAPPED
def test_a_killed_build_blocks_no_later_run_and_two_first_runs_share_one_build(tmp_path):
    """A first run killed (with its compilers, as timeout, Ctrl-C or a CI limit do) once torch's
    lock file is there: two fresh runs at once both load the operator, one build between them,
    the stale lock named and gone (before, every later run waited on it forever). The runs build
    a stand-in of the operators' schemas (stand_in_source)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    run = [sys.executable, "-c", AVAILABLE_STAND_IN, str(stand_in_source(tmp_path / "ops.cpp"))]
    first = subprocess.Popen(run, env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (stale := list(tmp_path.rglob("lock"))) and time.monotonic() < deadline:
        assert first.poll() is None, "the first run ended before its build took the lock"
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert len(stale) == 1 and stale[0].exists()
    runs = [subprocess.Popen(run, env=env, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE) for _ in range(2)]
    outputs = finish(runs, timeout=400)  # the stand-in's build is ~20 s on 2 busy cores
    assert [out.split() for out, _ in outputs] == [["True"], ["True"]], outputs
    lines = [line for _, err in outputs for line in err.splitlines()]
    assert all(line.startswith("nmt: ") for line in lines), lines
    assert sum("building the fused attention operator" in line for line in lines) == 1, lines
    assert sum(f"removed the stale lock {stale[0]}" in line for line in lines) == 1, lines
    library = f"nmt_one_query_attention_{attention_op.capability().lower()}.so"
    assert sorted(p.name for p in stale[0].parents[1].iterdir()) == ["nmt.lock", library]


@pytest.mark.slow
@UNCAPPED
def test_a_wait_on_a_live_builder_is_bounded_and_names_its_lock(tmp_path, monkeypatch):
    """A builder that holds the lock past NMT_OP_BUILD_WAIT: the run goes without the operator
    after that bound, one line naming the lock, and leaves the builder's folder alone."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    directory = attention_op.build_directory(attention_op.capability())
    (directory / "build-live").mkdir(parents=True)
    for lock in (directory / "lock", directory / "build-live" / "lock"):  # torch's, then and now
        lock.touch()
    env = {**os.environ, "NMT_OP_BUILD_WAIT": "1"}
    with open(directory / attention_op.LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        run = subprocess.Popen([sys.executable, "-c", AVAILABLE], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        [(out, err)] = finish([run], timeout=120)
    assert run.returncode == 0 and out.split() == ["False"], err
    lock = directory / attention_op.LOCK
    assert err.splitlines() == [
        f"nmt: waiting (at most 1 s) for another process's build of the fused attention "
        f"operator (lock {lock})",
        f"nmt: the fused attention operator is not available (another process held its build "
        f"lock {lock} for over 1 s); decoding uses batched matrix products"]
    assert (directory / "build-live" / "lock").exists()
