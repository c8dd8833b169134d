"""Batch translation's tight loops (nmt.decoding.tight_loops: greedy of one sentence or several,
beam of one) give the decoding core's hypotheses, and are taken only where they can be."""

import dataclasses
import math

import pytest
import torch
from translate_helpers import random_sources, search, tiny_model

from nmt.data.shortlist import Candidates
from nmt.data.tokenizer import Specials
from nmt.decoding import attention_op, fast_state, loop_steps, tight_loops
from nmt.decoding.affine import rows_alone
from nmt.decoding.core import Decoding, decode_all
from nmt.decoding.fast_model import FastModel
from nmt.decoding.lengths import max_output_lengths
from nmt.decoding.messages import Hypothesis, Sentence

pytestmark = pytest.mark.usefixtures("one_thread")

PAD, BOS, EOS = 0, 2, 3
SPECIALS = Specials(BOS, EOS, PAD)
V = 24


def core(models: list, sentence: Sentence, cfg, scores: bool = False) -> list[Hypothesis]:
    """The decoding core's own loop over one sentence."""
    return core_batch(models, [sentence], cfg, scores)[0]


def core_batch(models: list, sentences: list[Sentence], cfg,
               scores: bool = False) -> list[list[Hypothesis]]:
    """The decoding core's own loop over a batch."""
    dec = Decoding(models, cfg, SPECIALS, beam=cfg.beam_size > 1, scores=scores)
    dec.admit(sentences)
    out = {}
    while dec.sentences or dec.ready:
        out.update((e.tag, e.hypotheses) for e in dec.step())
    return [out[s.tag] for s in sentences]


def spoilt(dtype: str, spoil) -> FastModel:
    """The tiny model's FastModel whose every step's logits (R, 1, V) `spoil(logits, step)`
    changes in place (the decoder's step of one position, which the core and the loops share;
    skipped where the fused operator is not built)."""
    if not attention_op.available():
        pytest.skip(f"the fused attention operator is not built ({attention_op.status()})")
    fast = FastModel(tiny_model(V, seed=1, stops=True, N=2), dtype)
    real = fast.step_layers

    def step(x, rows, *args):
        """The model's step, spoilt."""
        logits = real(x, rows, *args)
        spoil(logits, int(rows.where))
        return logits

    fast.step_layers = step
    return fast


def both_ways(fast: FastModel, cfg, seed: int, scores: bool = True):
    """24 random sentences, each decoded alone by decode_all (through the loop, which takes
    it) and by the core: (the loop's, the core's hypotheses, the maximum output length)."""
    sources = random_sources(24, V, seed=seed)
    limits = max_output_lengths([len(s) for s in sources], cfg, 1024).tolist()
    for i, (src, limit) in enumerate(zip(sources, limits, strict=True)):
        sentence = Sentence(i, src)
        assert tight_loops.takes([fast], [sentence], cfg, True, None, cfg.beam_size > 1)
        [got] = decode_all([fast], [sentence], cfg, SPECIALS, scores=scores)
        yield got, core([fast], sentence, cfg, scores), limit


@pytest.mark.parametrize(("dtype", "scores"), [("fp32", False), ("int8", False),
                                                ("fp32", True), ("int8", True)])
def test_the_greedy_loop_gives_the_cores_hypotheses(dtype, scores):
    """Greedy outputs equal, some ending with EOS and some at the maximum length, EOS held
    back until min_len; scores asked for: the same scores, log P and tokens' log P, else NaN
    in both."""
    if not attention_op.available():
        pytest.skip(f"the fused attention operator is not built ({attention_op.status()})")
    fast = FastModel(tiny_model(V, seed=1, stops=True, N=2), dtype)
    cfg = search(beam_size=1, alpha=0.6, min_len=2, max_len_b=4)
    at_max = 0
    for got, want, limit in both_ways(fast, cfg, 5, scores):
        assert [h.tokens for h in got] == [h.tokens for h in want]
        if scores:
            assert got == want and got[0].token_logprobs == want[0].token_logprobs
        else:
            assert math.isnan(got[0].score) and math.isnan(want[0].score)
        assert len(got[0].tokens) >= 2
        at_max += len(got[0].tokens) == limit
    assert 0 < at_max < 24


@pytest.mark.parametrize(("dtype", "scores"), [("fp32", False), ("int8", False),
                                                ("fp32", True), ("int8", True)])
def test_the_greedy_loop_of_a_batch_gives_the_cores_hypotheses(dtype, scores):
    """Batches of 2 to 24 sentences: the core's hypotheses (in int8 too, where a row leaving
    a batch at another step would change the others' activation scales), rows ending with EOS
    at different steps and at their own maximum lengths."""
    if not attention_op.available():
        pytest.skip(f"the fused attention operator is not built ({attention_op.status()})")
    fast = FastModel(tiny_model(V, seed=1, stops=True, N=2), dtype)
    cfg = search(beam_size=1, alpha=0.6, min_len=2, max_len_b=4)
    sentences = [Sentence(i, s) for i, s in enumerate(random_sources(48, V, seed=7))]
    ends = set()
    for batch in (sentences[:2], sentences[2:24], sentences[24:]):
        assert tight_loops.takes([fast], batch, cfg, True, None, False)
        got = decode_all([fast], batch, cfg, SPECIALS, scores=scores)
        want = core_batch([fast], batch, cfg, scores)
        assert [[h.tokens for h in hyps] for hyps in got] == \
            [[h.tokens for h in hyps] for hyps in want]
        if scores:
            assert got == want
            assert [h[0].token_logprobs for h in got] == [h[0].token_logprobs for h in want]
        else:
            assert all(math.isnan(h[0].score) for h in got + want)
        ends |= {len(h[0].tokens) for h in got}
    assert len(ends) > 3


@pytest.mark.parametrize(("dtype", "scores"), [("fp32", True), ("int8", False)])
def test_a_row_dying_in_a_batch_leaves_it_as_in_the_core(dtype, scores):
    """The first row's logits -inf but PAD's at the third step (every token banned: dead, no
    hypothesis), the second's NaN at the fourth (a NaN score, or none without scores): the
    core's hypotheses, the others' too (in int8, whose scales see the rows that are left)."""
    def spoil(logits, step):
        """A row's logits: -inf but PAD's, then NaN."""
        if step == 3:
            logits[0] = -torch.inf
            logits[0, :, PAD] = 0.0
        if step == 4:
            logits[1] = torch.nan

    fast = spoilt(dtype, spoil)
    cfg = search(beam_size=1, max_len_b=8)
    batch = [Sentence(i, s) for i, s in enumerate(random_sources(6, V, seed=9))]
    got = tight_loops.greedy(fast, batch, cfg, SPECIALS, scores)
    want = core_batch([fast], batch, cfg, scores)
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps]
                                                          for hyps in want]
    assert str(got) == str(want)  # NaN scores alike
    assert got[0] == [Hypothesis([], -math.inf, -math.inf, [])]
    assert any(h[0].tokens for h in got[2:])


@pytest.mark.parametrize(("dtype", "alpha", "nbest"), [("fp32", 0.6, 1), ("fp32", 0.0, 3),
                                                       ("int8", 1.0, 2)])
def test_the_beam_loop_gives_the_cores_hypotheses(dtype, alpha, nbest):
    """Beam 4: the same hypotheses (tokens, scores, log P), best first, some outputs ending
    with EOS and some cut at the maximum length, the search ending early or not."""
    if not attention_op.available():
        pytest.skip(f"the fused attention operator is not built ({attention_op.status()})")
    fast = FastModel(tiny_model(V, seed=1, stops=True, N=2), dtype)
    cfg = search(beam_size=4, alpha=alpha, nbest=nbest, min_len=2, max_len_b=4)
    at_max = 0
    for got, want, limit in both_ways(fast, cfg, 6):
        assert got == want and len(got) == nbest
        assert [h.token_logprobs for h in got] == [h.token_logprobs for h in want]
        at_max += len(got[0].tokens) == limit
    assert 0 < at_max < 24


def test_the_beam_loops_first_step_is_one_row_where_int8_maps_take_many_rows_otherwise():
    """Where no package takes a unit's k rows, int8's output map of more rows than few_rows
    (oneDNN's path: within float rounding of a row alone) would round a first step of k rows
    otherwise than the core's first step of one row: the loop steps one row a unit first, and
    gives the core's hypotheses (as a large vocabulary's map does at a few rows)."""
    if not attention_op.available():
        pytest.skip(f"the fused attention operator is not built ({attention_op.status()})")
    fast = FastModel(tiny_model(V, seed=1, stops=True, N=2), "int8")
    fast.generator.few_rows = 2  # a real vocabulary's output map: int8_rows takes 1-2 rows
    cfg = search(beam_size=4, alpha=1.0, nbest=2, min_len=2, max_len_b=4)
    for i, source in enumerate(random_sources(24, V, seed=6)):
        sentence = [Sentence(i, source)]
        assert tight_loops.beam(fast, sentence, cfg, SPECIALS) == core_batch([fast], sentence,
                                                                            cfg, True)


@pytest.mark.parametrize(("dtype", "alpha", "nbest"), [("fp32", 0.6, 1), ("int8", 1.0, 2)])
def test_the_beam_loop_of_a_few_sentences_gives_the_cores_hypotheses(dtype, alpha, nbest):
    """Beam 4 of 2 to BEAM_SENTENCES sentences at once: the core's hypotheses (in int8 too,
    where a unit leaving the batch at another step would change the others' activation
    scales), units ending at different steps, early or at their maximum lengths."""
    if not attention_op.available():
        pytest.skip(f"the fused attention operator is not built ({attention_op.status()})")
    fast = FastModel(tiny_model(V, seed=1, stops=True, N=2), dtype)
    cfg = search(beam_size=4, alpha=alpha, nbest=nbest, min_len=2, max_len_b=4)
    sentences = [Sentence(i, s) for i, s in enumerate(random_sources(24, V, seed=11))]
    n, ends = tight_loops.BEAM_SENTENCES, set()
    for batch in (sentences[:2], sentences[2:2 + n], sentences[2 + n:2 + 2 * n]):
        assert tight_loops.takes([fast], batch, cfg, True, None, True)
        got, want = decode_all([fast], batch, cfg, SPECIALS), core_batch([fast], batch, cfg, True)
        assert got == want
        assert [[h.token_logprobs for h in hyps] for hyps in got] == \
            [[h.token_logprobs for h in hyps] for hyps in want]
        assert all(len(hyps) == nbest for hyps in got)
        ends |= {len(hyps[0].tokens) for hyps in got}
    assert len(ends) > 3


@pytest.mark.parametrize(("dtype", "min_len"), [("fp32", 1), ("fp32", 3), ("int8", 2)])
def test_sentences_joining_a_running_beam_loop_get_their_hypotheses_alone(dtype, min_len,
                                                                         monkeypatch):
    """Continuous batching's BeamLoop: sentences admitted between its calls, a
    few at a time, at ever later positions (EOS's ban before min_len tokens the host's for a
    unit that joined late; the caches' positions before every live unit's start dropped:
    FIRST_POSITIONS 3 here), and an empty source, each get the core's hypotheses of the
    sentence decoded alone."""
    if not attention_op.available():
        pytest.skip(f"the fused attention operator is not built ({attention_op.status()})")
    if dtype == "int8" and not rows_alone():
        pytest.skip("int8 rows are not rounded alone here (no operator, or no oneDNN)")
    monkeypatch.setattr(loop_steps.LoopSteps, "FIRST_POSITIONS", 3)
    fast = FastModel(tiny_model(V, seed=1, stops=True, N=2), dtype)
    cfg = search(beam_size=4, nbest=2, min_len=min_len, max_len_b=5)
    sentences = [Sentence(i, s) for i, s in enumerate(random_sources(40, V, seed=17) + [[]])]
    loop = tight_loops.BeamLoop(fast, cfg, SPECIALS)
    got, todo, calls, positions = {}, list(sentences), 0, []
    while todo or loop.sentences or loop.ready:
        n = (3, 0, 1, 0, 1, 0, 1)[calls % 7]  # newcomers before this call
        loop.admit(todo[:n])
        todo, calls = todo[n:], calls + 1
        got.update((e.tag, e.hypotheses) for e in loop.step())
        positions.append(loop.t)
    assert calls > 40 and max(positions) < 30  # trimmed: else past 40
    for s in sentences:
        want = core([fast], s, cfg, True)
        assert [h.tokens for h in got[s.tag]] == [h.tokens for h in want], s.tag
        assert [h.score for h in got[s.tag]] == pytest.approx([h.score for h in want],
                                                              abs=1e-5)
    assert min(len(h.tokens) for hyps in got.values() for h in hyps if hyps[0].tokens) >= \
        min_len


def test_sentences_joining_a_beam_loop_before_its_first_step_take_its_rows_a_unit():
    """A second admission before any step: its units take the loop's rows a unit (one, at the
    first step of an eager model), room made for k each: each sentence's core hypotheses."""
    if not attention_op.available():
        pytest.skip(f"the fused attention operator is not built ({attention_op.status()})")
    fast = FastModel(tiny_model(V, seed=1, stops=True, N=2), "fp32")
    cfg = search(beam_size=4, nbest=2, max_len_b=4)
    sentences = [Sentence(i, s) for i, s in enumerate(random_sources(3, V, seed=8))]
    loop = tight_loops.BeamLoop(fast, cfg, SPECIALS)
    loop.admit(sentences[:1])
    loop.admit(sentences[1:])
    got = {}
    while loop.sentences:
        got.update((e.tag, e.hypotheses) for e in loop.step())
    for s in sentences:
        want = core([fast], s, cfg, True)
        assert [h.tokens for h in got[s.tag]] == [h.tokens for h in want], s.tag


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_the_loops_caches_grow_as_outputs_do(dtype, monkeypatch):
    """Caches made for 3 positions at first: greedy and beam search past them (grown, their
    tables rewritten, mid-search and after rows left) give the core's hypotheses."""
    if not attention_op.available():
        pytest.skip(f"the fused attention operator is not built ({attention_op.status()})")
    monkeypatch.setattr(loop_steps.LoopSteps, "FIRST_POSITIONS", 3)
    fast = FastModel(tiny_model(V, seed=1, stops=True, N=2), dtype)
    batch = [Sentence(i, s) for i, s in enumerate(random_sources(6, V, seed=13))]
    for cfg in (search(beam_size=1, max_len_b=12), search(beam_size=4, nbest=2, max_len_b=12)):
        got = decode_all([fast], batch, cfg, SPECIALS)
        assert got == core_batch([fast], batch, cfg, True)
        assert max(len(h[0].tokens) for h in got) > 3


def test_the_row_indices_that_every_loop_shares_stay_as_made(monkeypatch):
    """fast_state.row_index's tensors and each row's sentence (row_sentences), made once a
    process and shared by every loop: still zeros, 0 .. R-1 and each row's unit after greedy
    and beam searches of one sentence and of batches whose rows leave, reorder and grow their
    caches, and sentences that join a running beam search (nothing writes into them)."""
    if not attention_op.available():
        pytest.skip(f"the fused attention operator is not built ({attention_op.status()})")
    made, units = [], []
    row_sentences = fast_state.row_sentences

    def row_index(R: int, device: torch.device) -> fast_state.RowIndex:
        """The shared indices, each noted."""
        made.append(fast_state.row_index(R, device))
        return made[-1]

    def noted_row_sentences(R: int, g: int, device: torch.device) -> torch.Tensor:
        """The shared rows' sentences, each noted with its g."""
        units.append((g, row_sentences(R, g, device)))
        return units[-1][1]

    monkeypatch.setattr(loop_steps, "row_index", row_index)
    monkeypatch.setattr(tight_loops, "row_sentences", noted_row_sentences)
    monkeypatch.setattr(fast_state, "row_sentences", noted_row_sentences)
    monkeypatch.setattr(loop_steps.LoopSteps, "FIRST_POSITIONS", 3)
    fast = FastModel(tiny_model(V, seed=1, stops=True, N=2), "fp32")
    batch = [Sentence(i, s) for i, s in enumerate(random_sources(6, V, seed=13))]
    for cfg in (search(beam_size=1, max_len_b=12), search(beam_size=4, nbest=2, max_len_b=12)):
        for sentences in (batch[:1], batch):
            assert decode_all([fast], sentences, cfg, SPECIALS) == core_batch(
                [fast], sentences, cfg, True)
    loop = tight_loops.BeamLoop(fast, cfg, SPECIALS)  # beam 4: newcomers join with 4 rows
    loop.admit(batch[:2])
    loop.step()
    loop.admit(batch[2:5])
    while loop.sentences:
        loop.step()
    assert {len(index.rows) for index in made} >= {1, 4, 6, 24}
    assert units and {g for g, _ in units} == {4}
    for g, rows in units:
        assert torch.equal(rows, torch.arange(len(rows)) // g)
    for index in made:
        R = len(index.rows)
        assert torch.equal(index.zeros, torch.zeros(R, dtype=torch.long))
        assert torch.equal(index.rows, torch.arange(R))
        assert torch.equal(index.column, torch.arange(R)[:, None])


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_beams_with_dead_candidates_search_as_in_the_core(dtype):
    """Three tokens open to each row (fewer than the 2k candidates a step keeps): candidates
    of log P -inf among the first k go on as PAD from each unit's first row (bury_dead) in
    both, the same hypotheses."""
    fast = spoilt(dtype, lambda logits, step: logits[..., 6:].fill_(-torch.inf))
    cfg = search(beam_size=4, nbest=2, max_len_b=5)
    for got, want, _ in both_ways(fast, cfg, 10):
        assert got == want
    batch = [Sentence(i, s) for i, s in enumerate(random_sources(5, V, seed=12))]
    assert tight_loops.beam(fast, batch, cfg, SPECIALS) == core_batch([fast], batch, cfg, True)


def test_a_row_with_every_logit_at_minus_infinity_ends_as_in_the_core():
    if not attention_op.available():
        pytest.skip(f"the fused attention operator is not built ({attention_op.status()})")
    fast = FastModel(tiny_model(V, seed=1, stops=True), "fp32")
    fast.step_layers = lambda x, *args: torch.full((len(x), 1, V), -torch.inf)
    cfg, sentence = search(beam_size=1), Sentence(0, [5, 6, 7])
    dead = [Hypothesis([], -math.inf, -math.inf, [])]
    assert tight_loops.greedy(fast, [sentence], cfg, SPECIALS) == [dead]
    assert core([fast], sentence, cfg) == dead
    # with scores: the log-softmax of -inf logits is NaN, a NaN hypothesis in both
    [got] = tight_loops.greedy(fast, [sentence], cfg, SPECIALS, scores=True)
    assert str(got) == str(core([fast], sentence, cfg, scores=True))
    assert math.isnan(got[0].score)
    two = [sentence, Sentence(1, [8, 9])]
    assert tight_loops.greedy(fast, two, cfg, SPECIALS) == core_batch([fast], two, cfg)
    assert tight_loops.greedy(fast, two, cfg, SPECIALS) == [dead, dead]
    # beam search: the log-softmax of -inf logits is NaN, in both
    cfg = search(beam_size=4)
    [got], want = tight_loops.beam(fast, [sentence], cfg, SPECIALS), core([fast], sentence, cfg)
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert all(math.isnan(h.score) for h in got + want)


def test_the_loops_are_taken_only_for_plain_searches():
    """Greedy search of one sentence or several, beam search of up to BEAM_SENTENCES; every
    other setting goes through the decoding core."""
    if not attention_op.available():
        pytest.skip(f"the fused attention operator is not built ({attention_op.status()})")
    model = tiny_model(V, seed=1)
    fast, cfg, one = FastModel(model, "fp32"), search(beam_size=1), [Sentence(0, [5, 6])]
    assert tight_loops.takes([fast], one, cfg, True, None, False)
    assert tight_loops.takes([fast], one, search(beam_size=4, nbest=2), True, None, True)
    assert tight_loops.takes([fast], one + [Sentence(1, [7])], cfg, True, None, False)
    assert tight_loops.takes([fast], one * 2, search(beam_size=4), True, None, True)
    many = one * (tight_loops.BEAM_SENTENCES + 1)
    assert tight_loops.takes([fast], many, cfg, True, None, False)
    refused = {
        "sampling": ([fast], one, search(beam_size=1, sampling=True), True, None, False),
        "samples": ([fast], one, search(beam_size=1, sampling=True, nbest=2), True, None,
                    False),
        "no repeated n-grams": ([fast], one, search(beam_size=1, no_repeat_ngram_size=2), True,
                                None, False),
        "a shortlist": ([fast], one, cfg, True, Candidates(torch.arange(V), V), False),
        "more sentences' beams": ([fast], many, search(beam_size=4), True, None, True),
        "an empty source": ([fast], [Sentence(0, [])], cfg, True, None, False),
        "an empty source of two": ([fast], one + [Sentence(1, [])], cfg, True, None, False),
        "no sentence": ([fast], [], cfg, True, None, False),
        "a prefix": ([fast], [dataclasses.replace(one[0], prefix=[5])], cfg, True, None, False),
        "constraints": ([fast], [dataclasses.replace(one[0], phrases=[[5]])], cfg, True, None,
                        True),
        "no cache": ([fast], one, cfg, False, None, False),
        "the reference model": ([model], one, cfg, True, None, False),
        "an ensemble": ([fast, fast], one, cfg, True, None, False),
        "batched products": ([FastModel(model, "fp32", fused=False)], one, cfg, True, None,
                             False),
    }
    assert [why for why, args in refused.items() if tight_loops.takes(*args)] == []
