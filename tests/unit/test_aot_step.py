"""search.compile's int8 decoding step of a few rows, compiled ahead of time by AOTInductor
(nmt.decoding.aot_step): eager's choices, one package per machine and model."""

import os
import tempfile

import pytest
import torch
from test_stepping import run_continuous
from translate_helpers import random_sources, search, tiny_model

from nmt.data.tokenizer import Specials
from nmt.decoding import affine, aot_step, attention_op, loop_steps, tight_loops
from nmt.decoding.batches import decoding_models, pad_batch
from nmt.decoding.core import decode_all
from nmt.decoding.fast_model import FastModel, source_groups
from nmt.decoding.fast_state import FastState, TableKVCache
from nmt.decoding.messages import Sentence
from nmt.decoding.strategies import row_max
from nmt.engines.translator import Translator
from nmt.system import private_ops

pytestmark = [pytest.mark.long, pytest.mark.usefixtures("one_thread"), pytest.mark.isa]

PAD, BOS, EOS = 0, 2, 3
V = 24
# the package's norms and additions are Inductor's (another order of float sums), its int8
# maps eager's: logits within a hair (an aliased input, or a step read wrong, is 5-10% off)
TOL = 1e-4


def packages_under(root, monkeypatch):
    """Packages under `root` (the fused operator loaded first from the usual cache), their
    C++ wrapper built at -O0 (the tests' ~4 s less a package: it only calls the kernels, which
    are built as they are for users); the folder they go in."""
    if not attention_op.available():
        pytest.skip(f"nmt's operators are not built here ({attention_op.status()})")
    if affine.int8_rows_layout() == "quads" and not affine.int8_saturates():
        pytest.skip("8-bit activations without VNNI (ATen capped, fbgemm not): int8_rows takes "
                    "no map, and fbgemm's do not export")
    monkeypatch.setenv("XDG_CACHE_HOME", str(root))
    import torch._inductor.config as inductor_config  # not at collection: ~1 s a worker

    at_o0 = inductor_config.patch({"aot_inductor.compile_wrapper_opt_level": "O0"})
    monkeypatch.setattr(private_ops, "aoti_compile", at_o0(private_ops.aoti_compile))
    return root / "nmt" / "steps"


@pytest.fixture
def steps_cache(tmp_path, monkeypatch):
    """An empty cache of packages: for the tests of what is compiled when."""
    return packages_under(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def kept_root(tmp_path_factory):
    """One cache for this module's tests, shared by pytest-xdist's workers of one run (under
    the run's temporary folder, named by its id): a package either worker compiled the other
    loads (written whole, renamed into place)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return tmp_path_factory.mktemp("packages")
    root = tmp_path_factory.getbasetemp().parent / f"packages-{run}"
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture
def kept_packages(kept_root, monkeypatch):
    """A cache that keeps its packages from test to test, as a machine's does (named by the
    weights: each model's compiled once a worker, ~30-60 s on a slow 2-core machine)."""
    return packages_under(kept_root, monkeypatch)


def greedy_pairs(eager: FastModel, compiled: FastModel, sources, steps: int):
    """Each source alone (one row), greedy on eager's choices: (eager's, compiled's) logits
    of every step."""
    with torch.inference_mode():
        for src in sources:
            batch = pad_batch([src], PAD, "cpu")
            states = [m.start_decoding(*m.encode(batch)) for m in (eager, compiled)]
            y = torch.full((1, 1), BOS)
            for _ in range(steps):
                want, got = (m.decode_step(y, s)[:, 0]
                             for m, s in zip((eager, compiled), states, strict=True))
                yield want, got
                y = want.argmax(1)[:, None]


def test_the_package_of_a_few_rows_gives_eagers_choices(kept_packages):
    """Every step of one row goes through the package, with eager's choices and logits (to a
    float sum's rounding: the int8 maps are the same operator); so do steps of up to
    most_rows rows (three where the operator has VNNI's layout or its quads), and steps of
    more rows are eager's own, exactly (no torch.compile in int8)."""
    model = tiny_model(V, seed=1, stops=True, N=2)
    eager, compiled = FastModel(model, "int8"), FastModel(model, "int8", compile=True)
    assert compiled._packaged.path in kept_packages.glob("*/step-*.pt2")
    for want, got in greedy_pairs(eager, compiled, random_sources(4, V, seed=3), 8):
        torch.testing.assert_close(got, want, atol=TOL * float(want.abs().max()), rtol=0)
        assert got.argmax(1).tolist() == want.argmax(1).tolist()
    assert compiled._packaged.calls == 4 * 8
    several = compiled._packaged.rows >= 3  # the CPU's int8_rows layout: VNNI or quads
    assert several == (affine.int8_rows_layout() != "pairs")
    # a batch whose other sentences ended: one row over three buffer rows and memory rows
    assert not compiled.compiled
    src = pad_batch([[5, 6, 7, 8, 9], [9, 10], [11, 12, 4, 7]], PAD, "cpu")
    with torch.inference_mode():
        states = [m.start_decoding(*m.encode(src)) for m in (eager, compiled)]
        y = torch.full((3, 1), BOS)
        for t in range(8):
            if t == 3:  # sentences 0 and 2 end
                y = y[1:2]
                for s in states:
                    s.reorder(torch.tensor([1]), 1)
            want, got = (m.decode_step(y, s)[:, 0]
                         for m, s in zip((eager, compiled), states, strict=True))
            if t < 3 and not several:  # three rows: eager's step
                assert torch.equal(got, want)
            torch.testing.assert_close(got, want, atol=TOL * float(want.abs().max()), rtol=0)
            y = want.argmax(1)[:, None]
    assert compiled._packaged.calls == 4 * 8 + 5 + 3 * several


def test_a_loaded_package_leaves_nothing_in_the_temporary_folder(kept_packages, tmp_path,
                                                                 monkeypatch):
    """AOTInductor's loader unpacks a package into the temporary folder and removes it only
    in its destructor, which a process's package never reaches: nmt unpacks it itself and
    removes the folder once it is loaded, and the package still runs."""
    model = tiny_model(V, seed=1, stops=True, N=2)
    eager, compiled = FastModel(model, "int8"), FastModel(model, "int8", compile=True)
    temp = tmp_path / "temp"  # after the compile (Inductor's own cache is in the temporary one)
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    for want, got in greedy_pairs(eager, compiled, random_sources(2, V, seed=3), 3):
        torch.testing.assert_close(got, want, atol=TOL * float(want.abs().max()), rtol=0)
    assert compiled._packaged.calls == 2 * 3
    assert list(temp.iterdir()) == []


def test_a_package_is_compiled_once_per_model(kept_packages, monkeypatch):
    """Once a FastModel of some weights has its package (compiled by it, or by another test
    of this cache), a second FastModel of the same weights loads it (compiles nothing), and so
    does search.compile=auto's (compile=None; in fp32, or without the fused operator, auto
    compiles nothing and refuses nothing); other weights or another precision of keys name
    another package."""
    model = tiny_model(V, seed=1, stops=True, N=2)
    package = FastModel(model, "int8", compile=True)._packaged.path
    assert package in kept_packages.glob("*/step-*.pt2")

    def refuse(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", refuse)
    again = FastModel(model, "int8", compile=True)
    eager = FastModel(model, "int8")
    for want, got in greedy_pairs(eager, again, random_sources(1, V, seed=4), 3):
        assert got.argmax(1).tolist() == want.argmax(1).tolist()
    assert again._packaged.path == package
    assert FastModel(model, "int8", compile=None)._packaged.path == package
    fp32, unfused = FastModel(model, compile=None), FastModel(model, "int8", fused=False,
                                                           compile=None)
    assert not fp32.compiled and fp32._packaged is None and unfused._packaged is None
    rows = again._packaged.rows
    weights = aot_step.weights_digest(model)
    key = aot_step.package_key(weights, "int8", torch.bfloat16, rows)
    other = aot_step.weights_digest(tiny_model(V, seed=2, stops=True))
    assert key != aot_step.package_key(other, "int8", torch.bfloat16, rows)
    assert key != aot_step.package_key(weights, "int8", torch.float32, rows)
    assert key != aot_step.package_key(weights, "int8", torch.bfloat16, rows + 1)


def test_a_package_that_cannot_be_built_leaves_the_step_eager(steps_cache, monkeypatch,
                                                               capsys):
    """Where the package cannot be built (an export Inductor refuses, a cache it cannot
    write), one line says so and the steps run eager (eager's logits)."""
    def fail(*args, **kwargs):
        raise OSError("No space left on device\nmore detail")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", fail)
    model = tiny_model(V, seed=1, stops=True)
    compiled = FastModel(model, "int8", compile=True)
    assert compiled._packaged is None and not list(steps_cache.glob("*/step-*.pt2"))
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == ("nmt: search.compile's step of a few rows is not built (OSError: No "
                       "space left on device); it runs eager")
    for want, got in greedy_pairs(FastModel(model, "int8"), compiled, random_sources(1, V), 3):
        assert torch.equal(got, want)


def test_beams_and_batches_through_the_package_give_eagers_outputs(kept_packages):
    """Beam search of one sentence (tight_loops.beam: 4 rows of one memory row) and greedy
    search of a few sentences (tight_loops.greedy, rows leaving as sentences end) step
    through the package where it takes their rows: eager's outputs."""
    model = tiny_model(V, seed=1, stops=True, N=2)
    eager, compiled = FastModel(model, "int8"), FastModel(model, "int8", compile=True)
    specials = Specials(BOS, 3, PAD)
    sentences = [Sentence(i, s) for i, s in enumerate(random_sources(8, V, seed=6))]
    for cfg, batches in [(search(beam_size=4, max_len_b=6), [[s] for s in sentences]),
                         (search(beam_size=1, max_len_b=6), [sentences[:3], sentences[3:]])]:
        for batch in batches:
            want, got = (decode_all([m], batch, cfg, specials) for m in (eager, compiled))
            assert [[h.tokens for h in hyps] for hyps in got] == \
                [[h.tokens for h in hyps] for hyps in want]
    assert compiled._packaged.calls > 0


def test_the_beam_package_gives_eagers_beams(kept_packages, monkeypatch):
    """tight_loops.beam's steps through int8's beam package (the last step's reorder, the
    step and the beam's choice in one call, for any beam of 2 or more): eager's hypotheses,
    their scores within a float sum's rounding, for one sentence and for a few (units
    ending, rows leaving), with the caches grown while a reorder waits for the next step;
    built once (translate_ids asks before its workers), not for beams of 1. The encoder
    eager: its package's memory is eager's to bf16's rounding, which moved a score by 0.005
    on an Intel Xeon with AMX. One step a call (several: the next test)."""
    monkeypatch.setattr(aot_step, "encoder_rows", lambda eager: 1)  # below 2: no package
    monkeypatch.setattr(FastModel, "packaged_beam_steps", lambda fast, B: None)
    monkeypatch.setattr(loop_steps.LoopSteps, "FIRST_POSITIONS", 3)
    model = tiny_model(V, seed=1, stops=True, N=2)
    eager, compiled = FastModel(model, "int8"), FastModel(model, "int8", compile=True)
    specials = Specials(BOS, EOS, PAD)
    # the reorders done outside the package: only where the caches grow (at 8 positions)
    flushed, reorder_own = [], FastState.reorder_own
    monkeypatch.setattr(FastState, "reorder_own", lambda state, index, keep, group: (
        done := reorder_own(state, index, keep, group), done and flushed.append(keep))[0])
    sentences = [Sentence(i, s) for i, s in enumerate(random_sources(7, V, seed=6))]
    grown = []
    for k, batches in [(4, [sentences[:1], sentences[1:4]]), (2, [sentences[4:]]),
                       (5, [sentences[:2]])]:
        cfg = search(beam_size=k, nbest=2, max_len_b=8)
        for batch in batches:
            want = tight_loops.beam(eager, batch, cfg, specials)
            flushed.clear()
            got = tight_loops.beam(compiled, batch, cfg, specials)
            grown += flushed
            assert [[h.tokens for h in hyps] for hyps in got] == \
                [[h.tokens for h in hyps] for hyps in want]
            for g, w in zip(sum(got, []), sum(want, []), strict=True):
                assert g.logprob == pytest.approx(w.logprob, abs=1e-4)
    beam = compiled.packaged_beam(4)
    assert beam.path in kept_packages.glob("*/beam-*.pt2") and beam.calls > 0
    assert set(grown) == {8}  # reorders that waited, done before the caches grew
    assert eager.packaged_beam(4) is None
    assert compiled.packaged_beam(compiled._packaged.rows + 1) is None
    calls = beam.calls
    tight_loops.beam(compiled, sentences[:1], search(beam_size=1), specials)
    assert beam.calls == calls


def test_greedys_package_of_several_steps_gives_eagers_outputs(kept_packages, monkeypatch):
    """tight_loops.greedy through int8's package of GREEDY_STEPS steps a call (EOS's ban
    ending inside a call at search.min_len; single steps near the longest limit and where
    scores are asked for; rows that end inside a call leave after it; the caches grown for a
    call's last position): eager's outputs, for one sentence and for a few."""
    monkeypatch.setattr(loop_steps.LoopSteps, "FIRST_POSITIONS", 3)
    lengths, run_length = [], loop_steps.LoopSteps.run_length
    monkeypatch.setattr(loop_steps.LoopSteps, "run_length", lambda steps, t, end: (
        k := run_length(steps, t, end), lengths.append((t, k)))[0])
    model = tiny_model(V, seed=1, stops=True, N=2)
    eager, compiled = FastModel(model, "int8"), FastModel(model, "int8", compile=True)
    specials = Specials(BOS, EOS, PAD)
    sentences = [Sentence(i, s) for i, s in enumerate(random_sources(9, V, seed=6))]
    ends = set()
    for cfg in (search(beam_size=1, max_len_b=9), search(beam_size=1, max_len_b=9, min_len=3)):
        for batch, scores in [([sentences[0]], False), (sentences[:4], False),
                              (sentences[4:], False), (sentences[4:], True)]:
            want, got = (tight_loops.greedy(m, batch, cfg, specials, scores)
                         for m in (eager, compiled))
            assert [[h.tokens for h in hyps] for hyps in got] == \
                [[h.tokens for h in hyps] for hyps in want]
            ends |= {len(hyps[0].tokens) % aot_step.GREEDY_STEPS for hyps in got if hyps}
    K = aot_step.GREEDY_STEPS
    assert compiled.packaged_greedy(1).calls > 0 and eager.packaged_greedy(1) is None
    assert (0, K) in lengths and (K, K) in lengths  # min_len 1 and 3 inside the first call
    assert any(k == 1 for _, k in lengths)  # near the limit, and with scores
    assert len(ends) > 1  # outputs that ended inside a call, not only at its last step


def test_the_beams_package_of_several_steps_gives_eagers_beams(kept_packages, monkeypatch):
    """tight_loops.beam through int8's package of BEAM_STEPS steps a call (from the first step,
    EOS's ban ending inside a call at search.min_len; single steps near the longest limit;
    units that end inside a call, or whose candidates end or die, as the host would choose):
    eager's hypotheses and scores, for beams of 2, 4 and 5, for one sentence and for a few.
    (The encoder eager, as in the beam package's test.)"""
    monkeypatch.setattr(aot_step, "encoder_rows", lambda eager: 1)  # below 2: no package
    monkeypatch.setattr(loop_steps.LoopSteps, "FIRST_POSITIONS", 3)
    lengths, run_length = [], loop_steps.LoopSteps.run_length
    monkeypatch.setattr(loop_steps.LoopSteps, "run_length", lambda steps, t, end: (
        k := run_length(steps, t, end), lengths.append(k))[0])
    model = tiny_model(V, seed=1, stops=True, N=2)
    eager, compiled = FastModel(model, "int8"), FastModel(model, "int8", compile=True)
    specials = Specials(BOS, EOS, PAD)
    sentences = [Sentence(i, s) for i, s in enumerate(random_sources(7, V, seed=6))]
    for k, min_len, batches in [(4, 1, [sentences[:1], sentences[1:4]]),
                                (2, 3, [sentences[4:]]), (5, 1, [sentences[:2]])]:
        cfg = search(beam_size=k, nbest=2, max_len_b=11, min_len=min_len)
        for batch in batches:
            want, got = (tight_loops.beam(m, batch, cfg, specials) for m in (eager, compiled))
            assert [[h.tokens for h in hyps] for hyps in got] == \
                [[h.tokens for h in hyps] for hyps in want]
            for g, w in zip(sum(got, []), sum(want, []), strict=True):
                assert g.logprob == pytest.approx(w.logprob, abs=1e-4)
    assert compiled.packaged_beam_steps(4).calls > 0 and eager.packaged_beam_steps(4) is None
    assert aot_step.BEAM_STEPS in lengths and 1 in lengths


def test_a_translator_builds_its_tight_loops_package_before_its_workers_ask(kept_packages):
    """Translator.ready (translate_ids', nmt-serve's before its workers' warm-up) builds the
    packages of the tight loop that runs a search in int8 under search.compile, in the
    calling process: the beam's step and steps for a beam search, greedy's steps for greedy
    search, none before a search asks."""
    model = tiny_model(V, seed=1, stops=True, N=2)
    with Translator([model], Specials(BOS, EOS, PAD), dtype="int8", compile="true") as tr:
        fast = tr.prepared("int8", "true")[0]
        assert all(callable(made) for made in fast._loops.values())  # not made yet
        tr.ready(search(beam_size=1, dtype="int8", compile="true"))
        assert callable(fast._loops["beam"]) and not callable(fast._loops["greedy"])
        assert fast._loops["greedy"].path in kept_packages.glob("*/greedy-*")
        tr.ready(search(beam_size=4, dtype="int8", compile="true"))
        beam, steps = fast._loops["beam"], fast._loops["beam_steps"]
        assert beam.path.exists() and beam.path in kept_packages.glob("*/beam-*")
        assert steps.path.exists() and steps.path in kept_packages.glob("*/beam_steps-*")


def test_continuous_batching_through_the_package_gives_eagers_outputs(kept_packages,
                                                                     monkeypatch):
    """Sentences that join a running batch at different steps (nmt.decoding.core's Decoding,
    nmt-serve's continuous=true) step through the package where it takes their rows, after
    rows retired and the caches were trimmed (views with the untrimmed strides, which the
    package read as whole tensors: other tokens for 6 of these 15 sentences): eager's
    outputs."""
    trims, whole = [], []
    trim, run = TableKVCache.trim, aot_step.Package.run
    monkeypatch.setattr(TableKVCache, "trim", lambda c, first, *stored: (
        trims.append(first), trim(c, first, *stored)))
    monkeypatch.setattr(aot_step.Package, "run", lambda p, inputs: (
        whole.append(all(t.is_contiguous() for t in inputs)), run(p, inputs))[1])
    model = tiny_model(V, seed=1, stops=True, N=2)
    sources = random_sources(14, V, seed=3) + [[]]
    joins = {0: [0, 1, 2], 1: [3, 4], 3: [5, 6, 7, 8], 4: [9], 6: [10, 11, 12, 13, 14]}
    got = []
    for compile in ("false", "true"):
        cfg = search(beam_size=4, nbest=2, max_len_b=4, dtype="int8", compile=compile)
        models = decoding_models([model], cfg)
        hyps = run_continuous(models, sources, cfg, joins)[0]
        got.append([[h.tokens for h in hyps[i]] for i in range(len(sources))])
    assert got[1] == got[0]
    assert models[0]._packaged.calls > 0 and any(trims) and all(whole)


def test_sentences_joining_a_beam_loop_through_the_packages_get_eagers_outputs(
        kept_packages, monkeypatch):
    """Continuous batching's BeamLoop (nmt-serve's continuous=true for plain beam search):
    sentences that join its running units between calls, at later positions, through int8's
    beam package and its package of several steps (a pending reorder done before each join,
    the caches trimmed of the positions before every live unit's start): eager's outputs."""
    monkeypatch.setattr(aot_step, "encoder_rows", lambda eager: 1)  # below 2: no package
    monkeypatch.setattr(loop_steps.LoopSteps, "FIRST_POSITIONS", 3)
    model = tiny_model(V, seed=1, stops=True, N=2)
    eager, compiled = FastModel(model, "int8"), FastModel(model, "int8", compile=True)
    cfg = search(beam_size=4, nbest=2, max_len_b=5, min_len=2)
    sentences = [Sentence(i, s) for i, s in enumerate(random_sources(30, V, seed=9))]
    got = []
    for fast in (eager, compiled):
        loop = tight_loops.BeamLoop(fast, cfg, Specials(BOS, EOS, PAD))
        out, todo, calls = {}, list(sentences), 0
        while todo or loop.sentences:
            n = (3, 0, 1, 2, 0)[calls % 5]
            loop.admit(todo[:n])
            todo, calls = todo[n:], calls + 1
            out.update((e.tag, e.hypotheses) for e in loop.step())
        got.append([[h.tokens for h in out[s.tag]] for s in sentences])
    assert got[1] == got[0]
    assert compiled.packaged_beam_steps(8).calls > 0 and compiled.packaged_beam(8).calls > 0


def test_the_packages_choice_is_row_max_after_the_bans(kept_packages, monkeypatch):
    """The package's best token of each row is strategies.row_max's over its own logits after
    the bans: the first of two tied maxima, and NaN where a row has one, unless its column is
    banned. (Weights of its own: a package of its own, the step's alone, the encoder eager.)"""
    monkeypatch.setattr(aot_step, "encoder_rows", lambda eager: 1)  # below 2: no package
    model = tiny_model(V, seed=1, stops=True)
    with torch.no_grad():
        W = model.generator.weight  # (V, d_model)
        W[7] = W[9] = 50 * W[EOS] / W[EOS].norm()  # two equal rows, along EOS's (they win
        # in most rows)
        W[11] = torch.nan
    compiled = FastModel(model, "int8", compile=True)
    sources = [[5 if t == 11 else t for t in s] for s in random_sources(3, V, seed=5)]
    src = pad_batch(sources, PAD, "cpu")  # without 11, whose embedding (tied) is NaN now
    tokens = torch.tensor([BOS, 5, 6])
    for banned in ([0, 2], [0, 2, 11]):
        columns = torch.tensor(banned)
        mask = torch.zeros(V, dtype=torch.bool).index_fill_(0, columns, True)
        with torch.inference_mode():
            state = compiled.start_decoding(*compiled.encode(src))
            steps = loop_steps.LoopSteps(compiled, state, 4, 3)
            assert steps.package is not None or affine.int8_rows_layout() == "pairs"
            if steps.package is None:
                pytest.skip("this CPU's package takes one row")
            out = steps._packaged(tokens, 0, mask)
            best, token = row_max(out.logits[:, 0].index_fill(1, columns, -torch.inf))
        assert out.token.tolist() == token.tolist()
        torch.testing.assert_close(out.best, best, rtol=0, atol=0, equal_nan=True)
        if 11 in banned:  # the first of the tied columns, in most rows
            assert token.tolist().count(7) >= 2 and 9 not in token.tolist()
        else:  # NaN in every row
            assert token.tolist() == [11] * 3 and best.isnan().all()


def test_the_encoder_package_gives_eagers_memory(kept_packages):
    """One source, a few of like lengths padded, or more or of very unequal lengths (eager
    encodes those apart) in chunks, are encoded through the encoder's package (its memory's
    keys and values within bf16's rounding of eager's, their dtype and shape eager's, and
    greedy search on them chooses alike); a batch of more than ENCODER_CALLS calls, or a
    source of one position, is eager's own."""
    model = tiny_model(V, seed=1, stops=True, N=2)
    eager, compiled = FastModel(model, "int8"), FastModel(model, "int8", compile=True)
    if compiled._encoder is None:  # the operator takes no rows of some map here
        assert aot_step.encoder_rows(eager) < 2
        pytest.skip("nmt::int8_rows takes no encoder map's rows here")
    assert compiled._encoder.path in kept_packages.glob("*/encoder-*.pt2")
    sources = [s + [EOS] for s in random_sources(6, V, seed=7)]
    # padding past source_groups' slack: a group of two sources shorter than the batch
    unequal = [(sources[0] * 60)[:60], sources[1], sources[2]]
    chunked = [unequal, sources[:aot_step.ENCODER_SOURCES + 1]]  # two calls each
    batches = [[s] for s in sources] + [sources[:2], sources[2:5]] + chunked
    calls = len(batches) + len(chunked)
    with torch.inference_mode():
        for batch in batches:
            src = pad_batch(batch, PAD, "cpu")
            assert len(source_groups(src != PAD) or [src]) == 1 + (batch is unequal)
            want, got = (m.start(src) for m in (eager, compiled))
            for (k0, v0), (k1, v1) in zip(want.memory_kv, got.memory_kv, strict=True):
                for a, b in ((k0, k1), (v0, v1)):
                    assert a.dtype == b.dtype and a.shape == b.shape
                    torch.testing.assert_close(b.float(), a.float(), rtol=0,
                                               atol=1e-2 * float(a.abs().max()))
            assert torch.equal(got.src_len, want.src_len)
            assert got.mask is None if len(batch) == 1 else torch.equal(got.mask, want.mask)
        assert compiled._encoder.calls == calls
        many = sources * aot_step.ENCODER_CALLS  # more than ENCODER_CALLS calls of 4
        for batch in (many, [[EOS]]):
            compiled.start(pad_batch(batch, PAD, "cpu"))  # too many calls, one position
    assert compiled._encoder.calls == calls
    specials = Specials(BOS, EOS, PAD)
    cfg = search(beam_size=1, max_len_b=6)
    for sentence in [Sentence(i, s) for i, s in enumerate(random_sources(6, V, seed=8))]:
        want, got = (decode_all([m], [sentence], cfg, specials) for m in (eager, compiled))
        assert [h.tokens for h in got[0]] == [h.tokens for h in want[0]]
