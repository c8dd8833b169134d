"""Continuous batching (nmt.inference.stepping): sentences that join a running batch at
different steps get translate_nbest's outputs, and a short one leaves before a long one."""

from __future__ import annotations

import math

import pytest
from translate_helpers import random_sources, search, tiny_model

from nmt.inference.fast import packing_works
from nmt.inference.search import decoding_models, translate_nbest
from nmt.inference.stepping import StepDecoder
from nmt.tokenizer import SPECIALS, Specials

V = 24
pytestmark = pytest.mark.usefixtures("one_thread")


def run_continuous(models, sources, cfg, joins: dict[int, list[int]]) -> tuple[dict, dict]:
    """Add sources[i] for i in joins[s] before step s; step until every sentence ended.
    Returns each sentence's hypotheses and the step count at which it ended."""
    dec = StepDecoder(models, cfg, SPECIALS)
    results, ended = {}, {}
    while len(results) < len(sources):
        if dec.steps in joins:
            dec.add(joins[dec.steps], [sources[i] for i in joins[dec.steps]])
        for i, hyps in dec.step():
            results[i], ended[i] = hyps, dec.steps
        assert dec.steps < 100
    assert dec.rows == 0 and dec.length == 0  # every row retired, the cache emptied
    return results, ended


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("beam", [1, 4])
def test_sentences_joining_at_different_steps_get_translate_nbests_outputs(beam, dtype):
    if dtype == "bf16" and not packing_works(__import__("torch").bfloat16):
        pytest.skip("no bf16 on this CPU")
    cfg = search(beam_size=beam, nbest=min(beam, 2), max_len_b=4, dtype=dtype)
    models = decoding_models([tiny_model(V, seed=1, stops=True, N=2)], cfg)
    sources = random_sources(14, V, seed=3) + [[]]
    # some join the first step, others while earlier ones run, one after a pause
    joins = {0: [0, 1, 2], 1: [3, 4], 3: [5, 6, 7, 8], 4: [9], 6: [10, 11, 12, 13, 14]}
    got, _ = run_continuous(models, sources, cfg, joins)
    # nmt-translate's outputs, each sentence alone (batch mates change bf16's rounding)
    want = [translate_nbest(models, [s], cfg, SPECIALS)[0] for s in sources]
    tol = 1e-5 if dtype == "fp32" else 2e-2
    for i, hyps in enumerate(want):
        assert [h.tokens for h in got[i]] == [h.tokens for h in hyps], i
        for g, w in zip(got[i], hyps, strict=True):
            assert math.isclose(g.score, w.score, rel_tol=tol, abs_tol=tol), (i, g, w)
    if dtype == "fp32":  # and in fp32 the same as nmt-translate's batches
        batched = translate_nbest(models, sources, cfg, SPECIALS)
        assert [[h.tokens for h in got[i]] for i in range(len(sources))] == [
            [h.tokens for h in hyps] for hyps in batched]


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


@pytest.mark.parametrize("beam", [1, 4])
def test_a_start_token_that_is_eos_still_ends_outputs(beam):
    specials = Specials(bos=SPECIALS.eos, eos=SPECIALS.eos, pad=SPECIALS.pad)  # M2M100's </s>
    cfg = search(beam_size=beam, max_len_b=6)
    models = decoding_models([tiny_model(V, seed=1, stops=True, N=2)], cfg)
    sources = random_sources(8, V, seed=3)
    dec = StepDecoder(models, cfg, specials)
    dec.add(list(range(len(sources))), sources)
    got = {}
    while len(got) < len(sources):
        got.update(dec.step())
    want = translate_nbest(models, sources, cfg, specials)
    assert [[h.tokens for h in got[i]] for i in range(len(sources))] == [
        [h.tokens for h in hyps] for hyps in want]
    assert any(len(hyps[0].tokens) < 6 + len(src) for hyps, src in zip(want, sources,
                                                                        strict=True))
