"""Continuous batching (nmt.decoding.core's Decoding, run by nmt.decoding.stepping's
workers): sentences that join a running batch at different steps get translate_nbest's
outputs under every search option, and a short one leaves before a long one; the workers'
loop answers whole batches (dynamic batching) as nmt-translate's batches."""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Iterable
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from translate_helpers import plain_beam, random_sources, search, tiny_model

from nmt.data.shortlist import Shortlist, load_shortlist
from nmt.data.tokenizer import SPECIALS, Specials
from nmt.decoding import attention_op, stepping, tight_loops
from nmt.decoding.affine import packing_works, rows_alone
from nmt.decoding.batches import decoding_models, translate_nbest
from nmt.decoding.core import Decoding
from nmt.decoding.messages import ADMIT_GROUP, Batch, Done, Ended, Failed, Hypothesis, Sentence
from nmt.decoding.stepping import HOLD_CALLS, HOLD_ENDED, STOP, send_now, step_loop

V = 24
pytestmark = pytest.mark.usefixtures("one_thread")


def by_tag(ended: Iterable[Ended]) -> dict:
    """Each ended sentence's hypotheses by its tag."""
    return {e.tag: e.hypotheses for e in ended}


def run_continuous(models, sources, cfg, joins: dict[int, list[int]]) -> tuple[dict, dict]:
    """Add sources[i] for i in joins[s] before step s; step until every sentence ended.
    Returns each sentence's hypotheses and the step count at which it ended."""
    dec = Decoding(models, cfg, SPECIALS)
    results, ended = {}, {}
    while len(results) < len(sources):
        if dec.steps in joins:
            dec.admit([Sentence(i, sources[i]) for i in joins[dec.steps]])
        for i, hyps in by_tag(dec.step()).items():
            results[i], ended[i] = hyps, dec.steps
        assert dec.steps < 100
    assert dec.rows == 0 and dec.length == 0  # every row retired, the cache emptied
    return results, ended


def run_loop(translator, batches: list[Batch], answers: int) -> list:
    """step_loop in a thread given `batches` at once; its messages until `answers` sentences
    are answered (and whatever else it put before STOP ended it)."""
    inbox, outbox = queue.Queue(), queue.Queue()
    for batch in batches:
        inbox.put(batch)
    worker = threading.Thread(target=step_loop, args=(translator, inbox, outbox, 0))
    worker.start()
    messages, answered = [], 0
    while answered < answers:
        messages.append(outbox.get(timeout=60))
        m = messages[-1]
        answered += len(m.results) if isinstance(m, Done) else len(m.tags)
    inbox.put(STOP)
    worker.join(timeout=60)
    while not outbox.empty():
        messages.append(outbox.get())
    return messages


def stand_in(model) -> SimpleNamespace:
    """What step_loop needs of a Translator, over one prepared model."""
    return SimpleNamespace(prepared=lambda dtype, compile: [model], specials=SPECIALS,
                           device=torch.device("cpu"), continuations=None)


@pytest.mark.parametrize(("dtype", "fused"), [("fp32", True), ("fp32", False), ("bf16", True),
                                             ("int8", True)])
@pytest.mark.parametrize("beam", [1, 4])
def test_sentences_joining_at_different_steps_get_a_plain_beam_searchs_outputs(beam, dtype,
                                                                               fused,
                                                                               monkeypatch):
    """fused: attention through the fused operator where it builds (nmt.decoding.attention_op),
    else batched products (what runs where no C++ compiler is)."""
    if dtype == "bf16" and not packing_works(__import__("torch").bfloat16):
        pytest.skip("no bf16 on this CPU")
    if dtype == "int8" and not rows_alone():
        pytest.skip("int8 rows are not rounded alone here (no operator, or no oneDNN)")
    if not fused:
        monkeypatch.setattr(attention_op, "available", lambda: False)
    cfg = search(beam_size=beam, nbest=min(beam, 2), max_len_b=4, dtype=dtype)
    model = tiny_model(V, seed=1, stops=True, N=2)
    models = decoding_models([model], cfg)
    sources = random_sources(14, V, seed=3) + [[]]
    # some join the first step, others while earlier ones run, one after a pause
    joins = {0: [0, 1, 2], 1: [3, 4], 3: [5, 6, 7, 8], 4: [9], 6: [10, 11, 12, 13, 14]}
    got, _ = run_continuous(models, sources, cfg, joins)
    if dtype == "fp32":  # fairseq's search written plainly, on the reference model
        want = [plain_beam(model, s, cfg) if s else [(0.0, [])] for s in sources]
        for i, hyps in enumerate(want):
            assert [h.tokens for h in got[i]] == [ids for _, ids in hyps], i
            assert [h.score for h in got[i]] == pytest.approx([s for s, _ in hyps], abs=1e-5)
        # and nmt-translate's batches
        batched = translate_nbest(models, sources, cfg, SPECIALS)
        assert [[h.tokens for h in got[i]] for i in range(len(sources))] == [
            [h.tokens for h in hyps] for hyps in batched]
        return
    if dtype == "int8":  # each row rounded alone: nmt-translate's batches, and each sentence alone
        batched = translate_nbest(models, sources, cfg, SPECIALS)
        alone = [translate_nbest(models, [s], cfg, SPECIALS)[0] for s in sources]
        assert [[h.tokens for h in got[i]] for i in range(len(sources))] == [
            [h.tokens for h in hyps] for hyps in batched] == [
            [h.tokens for h in hyps] for hyps in alone]
        return
    # bf16: nmt-translate's outputs, each sentence alone (batch mates change the rounding)
    want = [translate_nbest(models, [s], cfg, SPECIALS)[0] for s in sources]
    for i, hyps in enumerate(want):
        assert [h.tokens for h in got[i]] == [h.tokens for h in hyps], i
        for g, w in zip(got[i], hyps, strict=True):
            assert math.isclose(g.score, w.score, rel_tol=2e-2, abs_tol=2e-2), (i, g, w)


@pytest.mark.parametrize("beam", [1, 4])
def test_a_short_sentence_ends_before_a_long_one_that_started_with_it(beam):
    """Counted in decoding steps: a random model without `stops` runs to the maximum length,
    max_len_a * source length, so the short sentence ends at its own length."""
    cfg = search(beam_size=beam, nbest=1, max_len_a=1.0, max_len_b=0, min_len=0)
    models = decoding_models([tiny_model(V, seed=4)], cfg)
    long, short = list(range(4, 20)), [5, 6]
    _, ended = run_continuous(models, [long, short], cfg, {0: [0, 1]})
    assert ended[1] <= len(short) < ended[0]
    # one that joins while the long one runs also ends within its own length
    _, ended = run_continuous(models, [long, short], cfg, {0: [0], 5: [1]})
    assert ended[1] <= 5 + len(short) < ended[0]


def test_a_failing_step_still_answers_the_empty_sources_admitted_with_it():
    """A decoding step raises: its sentences fail, and an empty source admitted in the same
    step still gets its empty hypothesis (it was lost, and its request waited for the 504)."""
    cfg = search(beam_size=1)
    model = decoding_models([tiny_model(V, seed=1)], cfg)[0]

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    model.decode_step = broken
    for whole in (False, True):
        messages = run_loop(stand_in(model), [Batch(cfg, [Sentence("a", [5, 6]),
                                                          Sentence("empty", [])], whole)], 2)
        errors = [m for m in messages if isinstance(m, Failed)]
        assert [(m.tags, str(m.error)) for m in errors] == [(["a"], "out of memory")]
        assert [r for m in messages if isinstance(m, Done) for r in m.results] == [
            Ended("empty", [Hypothesis([], 0.0, 0.0)])]


OPTIONS = {  # every search option of nmt-translate, each through continuous batching
    "sampling": dict(beam_size=1, sampling=True, top_k=5, top_p=0.9, temperature=0.8, seed=3,
                     nbest=2),
    "no_repeat_ngram": dict(beam_size=4, nbest=2, no_repeat_ngram_size=2),
    "greedy_ngram": dict(beam_size=1, no_repeat_ngram_size=1),
    "prefix": dict(beam_size=4, nbest=2),
    "constraints": dict(beam_size=3, nbest=2),
    "prefix+constraints": dict(beam_size=1),  # a forced piece goes on after a phrase
    "min_len": dict(beam_size=2, min_len=5, alpha=1.0),
}


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_every_search_option_joins_a_running_batch_with_translate_nbests_outputs(option):
    cfg = search(max_len_b=4, **OPTIONS[option])
    models = decoding_models([tiny_model(V, seed=1, stops=True, N=2)], cfg)
    sources = random_sources(8, V, seed=5)
    prefixes = [[7, 8][:i % 3] for i in range(8)] if "prefix" in option else [[]] * 8
    phrases = {"constraints": [[[9]], [[10, 11]], [], [[12], [5]]] * 2,
               "prefix+constraints": [[[7]]] * 8}.get(option, [[]] * 8)
    lines = [10 + i for i in range(8)]
    dec = Decoding(models, cfg, SPECIALS, continuations=[6, 8],
                   beam=True if "constraints" in option else None)
    joins = {0: [0, 1, 2], 2: [3, 4], 3: [5], 5: [6, 7]}
    got, joined = {}, False
    while len(got) < len(sources):
        dec.admit([Sentence(i, sources[i], prefixes[i], phrases[i], lines[i])
                   for i in joins.get(dec.steps, [])])
        joined |= dec.joined  # some joined sentences already decoding
        got.update(by_tag(dec.step()))
        assert dec.steps < 100
    assert joined and dec.rows == 0
    want = translate_nbest(models, sources, cfg, SPECIALS, prefixes=prefixes, lines=lines,
                           constraints=phrases, continuations=[6, 8])
    for i, hyps in enumerate(want):
        assert [h.tokens for h in got[i]] == [h.tokens for h in hyps], i
        assert [h.score for h in got[i]] == pytest.approx([h.score for h in hyps], abs=1e-5)
        assert hyps[0].tokens[:len(prefixes[i])] == prefixes[i] and hyps[0].logprob > -math.inf


def test_a_sentence_joining_a_running_beam_search_decodes_its_first_step_on_one_row(
        monkeypatch):
    """Its k rows are alike until its first step, so the models decode one of them (with the
    fused operator); every output is still translate_nbest's."""
    if not attention_op.available():
        pytest.skip("the fused attention operator did not build")
    cfg = search(beam_size=4, nbest=2, max_len_b=6)
    models = decoding_models([tiny_model(V, seed=1, stops=True, N=2)], cfg)
    decoded = []  # the rows each step's decode_step was given
    real = models[0].decode_step
    monkeypatch.setattr(models[0], "decode_step",
                        lambda ids, *a, **kw: decoded.append(len(ids)) or real(ids, *a, **kw))
    sources = random_sources(6, V, seed=7)
    dec = Decoding(models, cfg, SPECIALS)
    dec.admit([Sentence(i, sources[i]) for i in range(3)])
    got = by_tag(dec.step())
    live = dec.rows  # k rows each
    dec.admit([Sentence(i, sources[i]) for i in range(3, 6)])
    assert dec.rows == live + 3 * 4 and dec.decoder_rows == live + 3
    got.update(by_tag(dec.step()))
    assert decoded[-1] == live + 3 and dec.rows == dec.decoder_rows  # then k rows each
    while dec.sentences:
        got.update(by_tag(dec.step()))
    want = translate_nbest(models, sources, cfg, SPECIALS)
    for i, hyps in enumerate(want):
        assert [h.tokens for h in got[i]] == [h.tokens for h in hyps], i
        assert [h.score for h in got[i]] == pytest.approx([h.score for h in hyps], abs=1e-5)


@pytest.mark.parametrize("beam", [1, 3])
def test_in_continuous_batching_each_sentence_decodes_over_its_own_shortlist(beam, tmp_path):
    """As nmt-translate's batches of one sentence (search.max_sentences=1): the shortlist is
    per batch there, and a running batch changes at every join."""
    table = torch.randint(4, 20, (V, 2), generator=torch.Generator().manual_seed(1))
    path = tmp_path / "short.pt"
    Shortlist(table, torch.tensor([SPECIALS.eos, 4, 5]), V, V, "x" * 64).save(path)
    cfg = search(beam_size=beam, nbest=1, max_len_b=4, shortlist=str(path))
    models = decoding_models([tiny_model(V, seed=1, stops=True, N=2)], cfg)
    sources = random_sources(8, V, seed=6)
    dec = Decoding(models, cfg, SPECIALS, shortlists=True)
    got, joins = {}, {0: [0, 1, 2], 2: [3, 4], 3: [5, 6, 7]}
    while len(got) < len(sources):
        dec.admit([Sentence(i, sources[i]) for i in joins.get(dec.steps, [])])
        got.update(by_tag(dec.step()))
    alone = translate_nbest(models, sources, replace(cfg, max_sentences=1), SPECIALS)
    shortlist = load_shortlist(path)
    for i, hyps in enumerate(alone):
        assert got[i][0].tokens == hyps[0].tokens, i
        assert got[i][0].score == pytest.approx(hyps[0].score, abs=1e-5)
        assert set(got[i][0].tokens) <= set(shortlist.candidates([sources[i]], []).ids.tolist())


def test_what_a_decoding_cannot_run_is_refused_not_decoded_otherwise(tmp_path):
    """No silent fallbacks: a shortlist without candidates (it would decode over the whole
    vocabulary), constraints while sampling, a join into the reference model's batch."""
    path = tmp_path / "short.pt"
    Shortlist(torch.randint(4, 20, (V, 2)), torch.tensor([SPECIALS.eos]), V, V,
              "x" * 64).save(path)
    model = tiny_model(V, seed=1)
    fast = decoding_models([model], search())
    with pytest.raises(ValueError, match="search.shortlist: give the batch's candidates"):
        Decoding(fast, search(shortlist=str(path)), SPECIALS).admit([Sentence(0, [5])])
    with pytest.raises(ValueError, match="constraints need beam search"):
        Decoding(fast, search(sampling=True), SPECIALS).admit([Sentence(0, [5], [], [[6]])])
    dec = Decoding([model], search(), SPECIALS)  # the reference model: no joins
    dec.admit([Sentence(0, [5, 6])])
    dec.step()
    with pytest.raises(ValueError, match="can join a running batch only with prepared"):
        dec.admit([Sentence(1, [7])])


@pytest.mark.parametrize("beam_size", [1, 4])
def test_constraints_while_sampling_are_refused_in_continuous_batching_at_any_beam_size(
        beam_size):
    """Not a beam search that ignores sampling=true (what beam_size=1 gave); the sentence
    without constraints beside it is still sampled."""
    cfg = search(beam_size=beam_size, sampling=True)
    model = decoding_models([tiny_model(V, seed=1)], cfg)[0]
    for whole in (False, True):
        messages = run_loop(stand_in(model), [Batch(cfg, [Sentence("c", [5, 6], [], [[7]]),
                                                          Sentence("free", [5, 6])], whole)], 2)
        errors = [(m.tags, str(m.error)) for m in messages if isinstance(m, Failed)]
        assert errors == [(["c"], "constraints need beam search, not sampling")]
        assert [r.tag for m in messages if isinstance(m, Done) for r in m.results] == ["free"]


@pytest.mark.parametrize("beam", [1, 3])
def test_the_loop_decodes_whole_batches_as_nmt_translate_and_newcomers_beside_them(
        beam, tmp_path):
    """Dynamic batching's whole Batch over the batch's own shortlist gives translate_nbest's
    outputs for that batch, prefixes, sampling lines and constraints included; newcomers sent
    at the same time decode in a Decoding of their own, over their own shortlists."""
    table = torch.randint(4, 20, (V, 2), generator=torch.Generator().manual_seed(2))
    path = tmp_path / "short.pt"
    Shortlist(table, torch.tensor([SPECIALS.eos, 4, 5]), V, V, "x" * 64).save(path)
    cfg = search(beam_size=beam, nbest=1, max_len_b=4, shortlist=str(path))
    model = decoding_models([tiny_model(V, seed=1, stops=True, N=2)], cfg)[0]
    sources = random_sources(6, V, seed=7)
    prefixes, lines = [[7], [], [8, 9], [], [], [7]], [3, 1, 4, 1, 5, 9]
    phrases = [[], [[10]], [], [], [[11, 12]], []]
    whole = [Sentence(i, s, p, c, n) for i, (s, p, c, n) in enumerate(zip(
        sources, prefixes, phrases, lines, strict=True))]
    newcomers = [Sentence(("new", i), s) for i, s in enumerate(sources[:3])]
    messages = run_loop(stand_in(model), [Batch(cfg, whole, True), Batch(cfg, newcomers)], 9)
    got = by_tag(r for m in messages for r in m.results)
    assert not [m for m in messages if isinstance(m, Failed)]
    want = translate_nbest([model], sources, cfg, SPECIALS, prefixes=prefixes, lines=lines,
                           constraints=phrases)
    for i, hyps in enumerate(want):
        assert got[i][0].tokens == hyps[0].tokens, i
    alone = translate_nbest([model], sources[:3], replace(cfg, max_sentences=1), SPECIALS)
    for i, hyps in enumerate(alone):
        assert got[("new", i)][0].tokens == hyps[0].tokens, i


@pytest.mark.parametrize("beam", [1, 4])
def test_whole_batches_of_plain_search_decode_in_tight_loops_as_nmt_translate(beam,
                                                                             monkeypatch):
    """Whole Batches (dynamic batching) of plain greedy search, and plain beam search of one
    sentence or two, go through nmt.decoding.tight_loops: translate_nbest's hypotheses,
    scores included."""
    cfg = search(beam_size=beam, max_len_b=4)
    model = decoding_models([tiny_model(V, seed=1, stops=True, N=2)], cfg)[0]
    if not model.fused:
        pytest.skip("the tight loops need the fused attention operator")
    sources = random_sources(3, V, seed=8)
    want = translate_nbest([model], sources, cfg, SPECIALS)
    loops = []

    def counted(loop):
        """`loop`, its name in `loops` at each call."""
        return lambda *a, **k: loops.append(loop.__name__) or loop(*a, **k)

    for name in ("greedy", "beam"):
        monkeypatch.setattr(tight_loops, name, counted(getattr(tight_loops, name)))
    batches = [Batch(cfg, [Sentence(0, sources[0])], True),
               Batch(cfg, [Sentence(1, sources[1]), Sentence(2, sources[2])], True)]
    got = by_tag(r for m in run_loop(stand_in(model), batches, 3) for r in m.results)
    assert [got[i] for i in range(3)] == want
    assert loops == (["greedy", "greedy"] if beam == 1 else ["beam", "beam"])


def test_a_refused_admission_admits_none_of_its_sentences_not_even_the_empty_ones():
    """admit raises: the caller fails every sentence it gave, so an empty source among them
    must not come back from a later step as well (answered twice)."""
    dec = Decoding(decoding_models([tiny_model(V, seed=1)], search()), search(sampling=True),
                   SPECIALS)
    with pytest.raises(ValueError, match="constraints need beam search"):
        dec.admit([Sentence("empty", []), Sentence(0, [5], [], [[6]])])
    assert dec.ready == [] and dec.step() == []


@pytest.mark.parametrize("beam", [1, 4])
def test_a_start_token_that_is_eos_still_ends_outputs(beam):
    """M2M100 and NLLB-200 start decoding from </s>: the ban on generating the start token must
    leave EOS alone (banned, every output ran to the maximum length)."""
    specials = Specials(bos=SPECIALS.eos, eos=SPECIALS.eos, pad=SPECIALS.pad)
    cfg = search(beam_size=beam, max_len_b=6)
    model = tiny_model(V, seed=1, stops=True, N=2)
    models = decoding_models([model], cfg)
    sources = random_sources(8, V, seed=3)
    dec = Decoding(models, cfg, specials)
    dec.admit([Sentence(i, src) for i, src in enumerate(sources)])
    got = {}
    while len(got) < len(sources):
        got.update(by_tag(dec.step()))
    assert any(len(got[i][0].tokens) < len(src) + 6 for i, src in enumerate(sources))
    for i, src in enumerate(sources):  # fairseq's search written plainly, from </s>
        want = plain_beam(model, src, cfg, specials)
        assert [h.tokens for h in got[i]] == [ids for _, ids in want], i
        assert [h.score for h in got[i]] == pytest.approx([s for s, _ in want], abs=1e-5)


@pytest.mark.parametrize("whole", [True, False])
def test_an_admission_that_fails_half_way_drops_its_decoding(whole, monkeypatch):
    """admit fails after it has taken the sentences in (out of memory while it adds their
    rows): they fail, the half-changed Decoding is dropped, and nothing of theirs comes back
    later; a whole batch after them decodes as usual."""
    cfg = search(beam_size=1, max_len_b=4)
    model = decoding_models([tiny_model(V, seed=1)], cfg)[0]
    add_rows = Decoding._add_rows

    def failing_for_a(self, todo, *args, **kwargs):
        if any(s.tag == "a" for s in todo):
            raise RuntimeError("out of memory")
        return add_rows(self, todo, *args, **kwargs)

    monkeypatch.setattr(Decoding, "_add_rows", failing_for_a)
    batches = [Batch(cfg, [Sentence("a", [5, 6]), Sentence("e", [])], whole),
               Batch(cfg, [Sentence("b", [7])], True)]
    messages = run_loop(stand_in(model), batches, 3)
    failed = [t for m in messages if isinstance(m, Failed) for t in m.tags]
    done = [r.tag for m in messages if isinstance(m, Done) for r in m.results]
    assert sorted(failed) == ["a", "e"] and done == ["b"]


def test_a_busy_worker_sends_its_ended_sentences_in_groups_and_an_idle_one_at_once():
    """send_now: at once while fewer than ADMIT_GROUP sentences are live, else once HOLD_ENDED
    have ended or HOLD_CALLS calls after the first of them."""
    assert all(send_now(1, 1, live) for live in range(ADMIT_GROUP))
    assert not send_now(1, 1, ADMIT_GROUP)
    assert not send_now(HOLD_ENDED - 1, HOLD_CALLS, 16)
    assert send_now(HOLD_ENDED, 1, 16) and send_now(1, HOLD_CALLS + 1, 16)


@pytest.mark.parametrize("beam", [1, 4])
def test_answers_held_in_groups_are_the_answers_sent_one_call_at_a_time(beam, monkeypatch):
    """Continuous batching of 12 sentences that end at different steps: every sentence is
    answered once, with the hypotheses the loop gives when it sends at every call, in fewer
    Done messages."""
    cfg = search(beam_size=beam, nbest=1, max_len_a=1.0, max_len_b=1, min_len=0)
    model = decoding_models([tiny_model(V, seed=4)], cfg)[0]
    sources = [list(range(4, 4 + n)) for n in (1, 2, 3, 5, 7, 9, 11, 2, 4, 6, 8, 10)]
    batches = [Batch(cfg, [Sentence(i, s) for i, s in enumerate(sources)])]
    held = run_loop(stand_in(model), batches, len(sources))
    monkeypatch.setattr(stepping, "send_now", lambda ended, calls, live: True)
    at_once = run_loop(stand_in(model), batches, len(sources))
    tags = [r.tag for m in held for r in m.results]
    assert sorted(tags) == list(range(len(sources)))
    assert by_tag(r for m in held for r in m.results) == by_tag(
        r for m in at_once for r in m.results)
    assert len(held) < len(at_once)


@pytest.mark.parametrize("beam", [1, 4])
def test_newcomers_beyond_a_batchs_most_wait_to_join_as_others_end(beam, monkeypatch):
    """Eight sentences in a Batch whose most is 3: the loop never decodes more than 3 at once,
    answers every sentence once, with the tokens and scores (to float rounding: fp32's sums
    depend on the rows beside) it gives when all join at once."""
    cfg = search(beam_size=beam, nbest=1, max_len_a=1.0, max_len_b=1, min_len=0)
    model = decoding_models([tiny_model(V, seed=5)], cfg)[0]
    sources = [list(range(4, 4 + n)) for n in (9, 2, 5, 1, 7, 3, 2, 6)]
    sentences = [Sentence(i, s) for i, s in enumerate(sources)]
    most = []
    for loop in (Decoding, tight_loops.BeamLoop):
        def step(self, step=loop.step):
            most.append(self.sentences)
            return step(self)
        monkeypatch.setattr(loop, "step", step)
    held = run_loop(stand_in(model), [Batch(cfg, sentences, most=3)], len(sources))
    assert max(most) == 3
    most.clear()
    at_once = run_loop(stand_in(model), [Batch(cfg, sentences)], len(sources))
    assert max(most) == len(sources)
    tags = [r.tag for m in held for r in m.results]
    assert sorted(tags) == list(range(len(sources)))
    got, want = (by_tag(r for m in ms for r in m.results) for ms in (held, at_once))
    for i in range(len(sources)):
        assert [h.tokens for h in got[i]] == [h.tokens for h in want[i]]
        assert [h.score for h in got[i]] == pytest.approx([h.score for h in want[i]], abs=1e-5)
