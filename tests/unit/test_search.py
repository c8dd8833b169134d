"""Search: greedy == beam 1, batch == one at a time, cache == no cache, exhaustive == beam."""

import math
import os

import pytest
import torch
from translate_helpers import (
    TableModel,
    exhaustive,
    random_sources,
    run,
    search,
    tiny_model,
    tokens,
)

import nmt.engines.translator
from nmt.config import SearchConfig
from nmt.data.tokenizer import Specials
from nmt.decoding.batches import (
    BatchJob,
    Hypothesis,
    decoding_models,
    length_penalty,
    pad_batch,
    plan_batches,
    score_pairs,
    search_batch,
    translate_ids,
    translate_nbest,
)
from nmt.decoding.messages import Sentence
from nmt.errors import ConfigError, NmtError

pytestmark = pytest.mark.usefixtures("one_thread")

PAD, BOS, EOS = 0, 2, 3
SPECIALS = Specials(BOS, EOS, PAD)
V = 24


@pytest.fixture(scope="module")
def model():
    return tiny_model(V, seed=1, stops=True, N=2)


@pytest.fixture(scope="module")
def sources():
    return random_sources(24, V, seed=1)


def test_outputs_mix_early_eos_and_maximum_length(model, sources):
    """The tests below are meaningful: some outputs end with EOS, some at the maximum length."""
    for beam in (1, 4):
        out = run(model, sources, search(beam_size=beam))
        at_max = [len(h[0].tokens) == len(s) + 6 for h, s in zip(out, sources, strict=True)]
        assert any(at_max) and not all(at_max)


def test_greedy_without_scores_skips_the_log_softmax_and_keeps_every_token(model, sources,
                                                                          monkeypatch):
    """scores=False (nmt-translate writing one translation a line): greedy search of one model
    picks the largest logit, as CTranslate2 does without return_scores; beams, samples and
    ensembles still need the log-probabilities."""
    calls, log_softmax = [], torch.log_softmax
    monkeypatch.setattr(torch, "log_softmax", lambda *a, **k: calls.append(1) or log_softmax(
        *a, **k))
    for cfg in (search(beam_size=1, min_len=3, no_repeat_ngram_size=2), search(beam_size=1)):
        want = run(model, sources, cfg)
        calls.clear()
        got = run(model, sources, cfg, scores=False)
        assert not calls  # no log-softmax at all
        assert [h[0].tokens for h in got] == [h[0].tokens for h in want]
        assert all(math.isnan(h[0].score) for h in got)
        assert not any(math.isnan(h[0].score) for h in want)
    for cfg, models in ((search(beam_size=2), model), (search(beam_size=1), [model, model])):
        assert run(models, sources[:4], cfg, scores=False) == run(models, sources[:4], cfg)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("min_len", [1, 4])
def test_beam_size_one_equals_greedy(model, sources, alpha, min_len):
    src = pad_batch([s + [EOS] for s in sources], PAD, "cpu")
    cfg = search(beam_size=1, alpha=alpha, min_len=min_len)
    greedy = search_batch(model, src, cfg, SPECIALS)
    beam = search_batch(model, src, cfg, SPECIALS, beam=True)
    assert tokens(greedy) == tokens(beam)
    for g, b in zip(greedy, beam, strict=True):
        assert g[0].score == pytest.approx(b[0].score, abs=1e-4)
        assert g[0].logprob == pytest.approx(b[0].logprob, abs=1e-4)


@pytest.mark.parametrize("beam", [1, 4])
def test_a_batch_gives_the_same_outputs_as_one_sentence_at_a_time(model, sources, beam):
    cfg = search(beam_size=beam, nbest=min(beam, 3))
    batched = run(model, sources, cfg)
    single = run(model, sources, search(beam_size=beam, nbest=min(beam, 3), max_tokens=1))
    assert tokens(batched) == tokens(single)
    for b, s in zip(batched, single, strict=True):
        assert [h.score for h in b] == pytest.approx([h.score for h in s], abs=1e-4)


@pytest.mark.parametrize("beam", [1, 4])
def test_decoding_with_the_cache_equals_decoding_without_it(model, sources, beam):
    cfg = search(beam_size=beam, nbest=beam)
    cached = run(model, sources, cfg)
    uncached = run(model, sources, cfg, use_cache=False)
    assert tokens(cached) == tokens(uncached)
    for c, u in zip(cached, uncached, strict=True):
        assert [h.score for h in c] == pytest.approx([h.score for h in u], abs=1e-4)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 6.0])
def test_exhaustive_search_confirms_the_wide_beams_best(alpha):
    """Over 4 ordinary tokens + EOS and 4 output tokens, a beam of 400 explores everything.

    The sentence still retires early when nothing active can beat its finished best; alpha = 6
    favours long outputs so much that a bound ignoring the length would stop too soon.
    """
    small = tiny_model(7, seed=3, stops=True)
    max_len, min_len = 4, 1
    for source in ([4, 5, 6], [6, 6], [5]):
        truth = exhaustive(small, source, max_len, min_len, alpha)
        cfg = SearchConfig(beam_size=400, nbest=5, alpha=alpha, max_len_a=0.0,
                           max_len_b=max_len, min_len=min_len)
        hyps = translate_nbest(small, [source], cfg, SPECIALS)[0]
        assert [h.tokens for h in hyps] == [y for _, y in truth[:5]]
        assert [h.score for h in hyps] == pytest.approx([s for s, _ in truth[:5]], abs=1e-4)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("nbest", [1, 3])
def test_exhaustive_search_confirms_the_beam_on_peaked_distributions(alpha, nbest):
    """Random (position, previous token) tables: EOS wins at some steps, long outputs at others.

    A beam of 700 holds every prefix here (4 tokens + EOS per step, 5 steps), so only retiring
    a sentence too early (a finished hypothesis that could still be beaten) can make it differ.
    """
    max_len = 5
    for seed in range(12):
        table = TableModel(7, seed=seed)
        truth = exhaustive(table, [4], max_len, 1, alpha)
        cfg = SearchConfig(beam_size=700, nbest=nbest, alpha=alpha, max_len_a=0.0,
                           max_len_b=max_len, min_len=1)
        hyps = translate_nbest(table, [[4]], cfg, SPECIALS)[0]
        assert [h.tokens for h in hyps] == [y for _, y in truth[:nbest]]
        assert [h.score for h in hyps] == pytest.approx([s for s, _ in truth[:nbest]], abs=1e-4)


def test_nbest_is_sorted_distinct_and_scores_are_normalised_log_probabilities(model, sources):
    cfg = search(beam_size=5, nbest=5)
    for hyps in run(model, sources, cfg):
        assert len(hyps) == 5
        assert len({tuple(h.tokens) for h in hyps}) == 5
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:
            assert h.logprob <= 0
            lengths = {len(h.tokens), len(h.tokens) + 1}  # cut at max length, or EOS counted
            assert any(h.score == pytest.approx(h.logprob / length_penalty(n, 0.6), abs=1e-4)
                       for n in lengths)


@pytest.mark.parametrize("beam", [1, 3])
def test_minimum_and_maximum_lengths(model, sources, beam):
    out = run(model, sources, search(beam_size=beam, min_len=3, max_len_a=0.5, max_len_b=2))
    for hyps, s in zip(out, sources, strict=True):
        longest = int(0.5 * len(s) + 2)
        n = len(hyps[0].tokens)
        assert n == longest if longest < 3 else 3 <= n <= longest


@pytest.mark.parametrize("beam", [1, 4])
def test_forced_length_suppresses_eos(model, sources, beam):
    out = run(model, sources, search(beam_size=beam, min_len=7, max_len_a=0.0, max_len_b=7))
    assert all(len(h[0].tokens) == 7 for h in out)
    assert all(EOS not in h[0].tokens and PAD not in h[0].tokens for h in out)


def test_empty_sources_give_empty_outputs_and_order_is_kept(model, sources):
    mixed = [[], sources[0], [], sources[1], sources[2], []]
    out = translate_ids(model, mixed, search(), SPECIALS)
    assert out[0] == out[2] == out[5] == []
    alone = [translate_ids(model, [s], search(), SPECIALS)[0] for s in mixed]
    assert out == alone


def test_translate_ids_puts_back_training_mode(model, sources):
    model.train()
    try:
        ids = translate_ids(model, sources[:5], search(), SPECIALS)
        assert model.training
    finally:
        model.eval()
    assert ids == translate_ids(model, sources[:5], search(), SPECIALS)


@pytest.mark.parametrize("beam", [1, 4])
def test_worker_processes_give_the_same_outputs(model, sources, beam):
    cfg = search(beam_size=beam, nbest=2 if beam > 1 else 1, max_tokens=20)
    here = run(model, sources, cfg)
    forked = run(model, sources, cfg, workers=3)
    assert tokens(forked) == tokens(here)
    assert [h[0].score for h in forked] == [h[0].score for h in here]


def test_small_batches_travel_to_the_workers_together():
    """Consecutive batches share a task up to TASK_SENTENCES sentences, and a task takes at
    most a 1 / (TASKS_PER_WORKER x workers) share of the sentences left, so the tasks shrink
    to one batch at the end; every batch stays whole and in order; a large one alone."""
    tasks, share = nmt.engines.translator.tasks, nmt.engines.translator.TASKS_PER_WORKER
    ones = [[i] for i in range(400)]
    grouped = tasks(ones, 2)
    assert [b for task in grouped for b in task] == ones
    sizes = [len(task) for task in grouped]
    assert sizes[:5] == [nmt.engines.translator.TASK_SENTENCES] * 5 and sizes[-4:] == [1] * 4
    assert sizes == sorted(sizes, reverse=True)
    left = [400 - sum(sizes[:i]) for i in range(len(sizes))]  # sentences left at each task
    assert all(n <= max(1, rest // (share * 2)) for n, rest in zip(sizes, left, strict=True))
    few = tasks(ones[:24], 2)  # 24 sentences, 2 workers: 3 a task at first, then fewer
    assert len(few[0]) == 3 and len(few) > 2 * share
    mixed = [list(range(100)), [100], [101], list(range(102, 140)), [140]]
    assert tasks(mixed, 1) == [[mixed[0]], [mixed[1], mixed[2]], [mixed[3]], [mixed[4]]]
    assert tasks([[0]], 8) == [[[0]]]


def _die(*args):
    """A batch whose worker process is killed."""
    os._exit(9)


def test_a_killed_worker_process_is_a_one_line_error(model, sources, monkeypatch):
    monkeypatch.setattr(nmt.engines.translator, "_run_batches", _die)
    with pytest.raises(NmtError, match="a decoding worker process died"):
        run(model, sources, search(max_tokens=20), workers=2)


def test_translating_draws_no_random_numbers(model, sources):
    """The trainer translates for validation BLEU: its random number stream must not move."""
    state = torch.get_rng_state()
    run(model, sources[:4], search())
    assert torch.equal(torch.get_rng_state(), state)


def test_translating_under_bf16_autocast_works(model, sources):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(model, sources[:4], search())
    assert len(out) == 4 and all(h[0].logprob <= 0 for h in out)


# ----------------------------------------------------------------------------- sampling
def test_sample_draws_from_the_tempered_truncated_distribution():
    """Inverse-CDF draws over 20,000 uniforms match softmax(lprobs / T), top-k and top-p."""
    from nmt.decoding.rules import sample_tokens

    lprobs = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.5, -1.0, -torch.inf]]), dim=-1)
    u = (torch.arange(20000) + 0.5) / 20000  # evenly spread: frequencies are exact up to 1e-4

    def freq(**kw):
        cfg = SearchConfig(sampling=True, **kw)
        drawn = torch.cat([sample_tokens(lprobs, u[i:i + 1], cfg) for i in range(0, 20000, 7)])
        return torch.bincount(drawn, minlength=5).float() / len(drawn)

    for T in (0.5, 1.0, 2.0):
        expected = torch.softmax(lprobs[0] / T, dim=-1)
        torch.testing.assert_close(freq(temperature=T), expected, atol=2e-3, rtol=0)
    top2 = torch.softmax(lprobs[0, :2], dim=-1)
    torch.testing.assert_close(freq(top_k=2)[:2], top2, atol=2e-3, rtol=0)
    p = torch.softmax(lprobs[0], dim=-1)  # 0.63, 0.23, 0.14, 0.03: top_p 0.8 keeps 2 tokens
    torch.testing.assert_close(freq(top_p=0.8)[:2], top2, atol=2e-3, rtol=0)
    assert freq(top_p=0.8)[2:].sum() == 0 and p[:2].sum() >= 0.8 > p[0]
    assert freq()[4] == 0  # a forbidden token is never drawn


def test_eos_last_is_a_stable_sort_with_eos_last():
    """eos_last (the beam's rows that go on inside the package of several steps) gives
    going_on's order, the first k places of a stable sort of token == EOS, for every mix of
    EOS."""
    from nmt.decoding.strategies import eos_last

    for k in (1, 2, 4, 5):
        # every pattern of EOS over 2k candidates, the others' tokens 3 or 4
        pattern = torch.arange(2 ** (2 * k))[:, None] >> torch.arange(2 * k) & 1  # (P, 2k)
        tokens = torch.where(pattern == 1, 2, 3 + torch.arange(2 * k) % 2)
        expected = torch.sort((tokens == 2).int(), dim=1, stable=True).indices[:, :k]
        assert torch.equal(eos_last(tokens, torch.tensor(2), k), expected)
        assert torch.equal(eos_last(tokens, 2, k), expected)


def test_epsilon_sampling_never_draws_a_token_below_epsilon():
    """Hewitt et al. 2022: tokens of probability < epsilon are cut, the rest renormalised."""
    from nmt.decoding.rules import epsilon_cut, sample_tokens

    lprobs = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.5, -1.0, -torch.inf]]), dim=-1)
    p = torch.softmax(lprobs[0], dim=-1)  # 0.63, 0.23, 0.14, 0.03, 0
    u = (torch.arange(20000) + 0.5) / 20000
    cfg = SearchConfig(sampling=True, epsilon=0.1)
    drawn = torch.cat([sample_tokens(lprobs, u[i:i + 1], cfg)
                       for i in range(0, 20000, 7)])
    freq = torch.bincount(drawn, minlength=5).float() / len(drawn)
    assert freq[3] == 0 and freq[4] == 0 and p[3] < 0.1 <= p[2]
    torch.testing.assert_close(freq[:3], p[:3] / p[:3].sum(), atol=2e-3, rtol=0)
    # above every probability but the max: only the max is left (two maxima: both)
    assert epsilon_cut(p[None], 0.9).nonzero()[:, 1].tolist() == [0]
    tied = torch.tensor([[0.4, 0.4, 0.2]])
    assert epsilon_cut(tied, 0.9).nonzero()[:, 1].tolist() == [0, 1]
    with pytest.raises(ConfigError, match=r"^search\.epsilon: must be in \[0, 1\), got 1\.0$"):
        SearchConfig(sampling=True, epsilon=1.0)


def test_epsilon_above_all_but_the_top_token_is_greedy(model, sources):
    greedy = run(model, sources, search(beam_size=1))
    sampled = run(model, sources, search(sampling=True, epsilon=0.999))
    assert tokens(sampled) == tokens(greedy)
    assert tokens(run(model, sources, search(sampling=True, epsilon=0.01))) != tokens(greedy)


def test_sampling_is_seeded_per_line_and_independent_of_batching(model, sources):
    cfg = search(sampling=True, nbest=3, seed=7)
    batched = run(model, sources, cfg)
    assert tokens(batched) == tokens(run(model, sources, search(sampling=True, nbest=3, seed=7,
                                                                max_tokens=1)))
    assert tokens(batched) == tokens(run(model, sources, cfg, workers=2))
    assert tokens(batched) != tokens(run(model, sources, search(sampling=True, nbest=3, seed=8)))
    assert all(len(h) == 3 for h in batched)
    assert len({tuple(h.tokens) for hyps in batched for h in hyps}) > len(sources)  # diverse
    for hyps in batched:
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    # the line number seeds a line's samples: line 5 alone, numbered 5, gives the same samples
    alone = run(model, [sources[5]], cfg, lines=[5])
    assert tokens(alone) == tokens(batched[5:6])


def test_sampling_from_the_top_token_is_greedy(model, sources):
    greedy = run(model, sources, search(beam_size=1))
    for kw in (dict(top_k=1), dict(top_p=1e-6), dict(temperature=1e-4)):
        sampled = run(model, sources, search(sampling=True, **kw))
        assert tokens(sampled) == tokens(greedy)
        assert [h[0].score for h in sampled] == pytest.approx([h[0].score for h in greedy],
                                                              abs=1e-4)


# ----------------------------------------------------------------------------- constraints
@pytest.mark.parametrize("kw", [dict(beam_size=1), dict(beam_size=4, nbest=3),
                                dict(sampling=True, nbest=2)])
def test_every_output_starts_with_its_prefix(model, sources, kw):
    prefixes = [[], [7], [7, 7, 7], [20, 21], [5] * 12] + [[9, 10]] * (len(sources) - 5)
    out = run(model, sources, search(**kw), prefixes=prefixes)
    for hyps, p, s in zip(out, prefixes, sources, strict=True):
        for h in hyps:
            assert h.tokens[:len(p)] == p
            assert len(h.tokens) <= max(len(s) + 6, len(p) + 1)
    free = run(model, sources, search(**kw))
    assert tokens(out)[0] == tokens(free)[0]  # no prefix: as without
    # a forced output's log P is that of its tokens: scoring it again gives the same
    cfg = search(**kw)
    ended = [(i, h) for i, hyps in enumerate(out) for h in hyps
             if len(h.tokens) < len(sources[i]) + 6]  # ended with EOS
    assert ended
    scored = score_pairs(model, [sources[i] for i, _ in ended], [h.tokens for _, h in ended],
                         cfg, SPECIALS)
    for (_, h), s in zip(ended, scored, strict=True):
        assert s.logprob == pytest.approx(h.logprob, abs=1e-4)


@pytest.mark.parametrize("kw", [dict(beam_size=1), dict(beam_size=1, sampling=True, nbest=2),
                                dict(beam_size=2)])
def test_a_row_whose_every_continuation_is_banned_ends_with_no_translation(kw):
    """Three ids may be generated (PAD, BOS banned, EOS before min_len), none twice: from the
    fourth step on nothing is allowed; the output is empty at log P -inf, not PAD ids nor NaN."""
    cfg = search(min_len=10, no_repeat_ngram_size=1, max_len_a=0.0, max_len_b=8, **kw)
    out = translate_nbest(tiny_model(5, seed=1), [[1, 4]], cfg, Specials(BOS, EOS, PAD))[0]
    assert out[0] == Hypothesis([], -torch.inf, -torch.inf)


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_size(model, sources, beam, n):
    def ngrams(ids):
        return [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]

    free = run(model, sources, search(beam_size=beam, max_len_b=12))
    assert any(len(set(ngrams(h[0].tokens))) < len(ngrams(h[0].tokens)) for h in free)
    out = run(model, sources, search(beam_size=beam, max_len_b=12, no_repeat_ngram_size=n))
    for hyps in out:
        assert len(set(ngrams(hyps[0].tokens))) == len(ngrams(hyps[0].tokens))
    assert tokens(out) == tokens(run(model, sources, search(
        beam_size=beam, max_len_b=12, no_repeat_ngram_size=n), fast=False))


# ----------------------------------------------------------------------------- ensembles
def test_an_ensemble_of_one_model_twice_is_that_model(model, sources):
    for beam in (1, 4):
        one = run(model, sources, search(beam_size=beam))
        two = run([model, model], sources, search(beam_size=beam))
        assert tokens(one) == tokens(two)
        assert [h[0].score for h in one] == pytest.approx([h[0].score for h in two], abs=1e-4)


def test_an_ensemble_averages_the_log_probabilities(sources):
    a, b = tiny_model(V, seed=1, stops=True, N=2), tiny_model(V, seed=5, stops=True, N=2)
    targets = [t[0] for t in tokens(run(a, sources, search(beam_size=1)))]
    pa, pb, pab = (score_pairs(m, sources, targets, search(), SPECIALS)
                   for m in (a, b, [a, b]))
    for x, y, xy in zip(pa, pb, pab, strict=True):
        assert xy.logprob == pytest.approx((x.logprob + y.logprob) / 2, abs=1e-4)
    for beam in (1, 4):  # the fast path against the reference, on a real ensemble
        cfg = search(beam_size=beam)
        assert tokens(run([a, b], sources, cfg)) == tokens(run([a, b], sources, cfg, fast=False))
    assert tokens(run([a, b], sources, search(beam_size=1))) != targets  # b has a say


# ----------------------------------------------------------------------------- scoring
def test_scoring_a_greedy_output_gives_its_log_probability(model, sources):
    cfg = search(beam_size=1)
    out = run(model, sources, cfg)
    targets = [h[0].tokens for h in out]
    scored = score_pairs(model, sources, targets, cfg, SPECIALS)
    one_by_one = [score_pairs(model, [s], [t], search(beam_size=1, max_tokens=1), SPECIALS)[0]
                  for s, t in zip(sources, targets, strict=True)]
    reference = score_pairs(model, sources, targets, cfg, SPECIALS, fast=False)
    ended = 0
    for s, h, src, alone, ref in zip(scored, out, sources, one_by_one, reference, strict=True):
        assert s.tokens == h[0].tokens
        assert s.logprob == pytest.approx(alone.logprob, abs=1e-4)
        assert s.logprob == pytest.approx(ref.logprob, abs=1e-4)
        assert s.score == pytest.approx(s.logprob / length_penalty(len(s.tokens) + 1, 0.6))
        if len(h[0].tokens) < len(src) + 6:  # ended with EOS, which scoring also counts
            ended += 1
            assert s.logprob == pytest.approx(h[0].logprob, abs=1e-4)
    assert ended >= 3


def test_pair_scoring_reads_each_sentences_target_not_its_prefix(model, sources):
    """A scored Sentence carries its target in its own field: a forced prefix beside it is
    not what is scored, and batches are planned by the longer of source and target."""
    cfg = search(beam_size=1)
    targets = [h[0].tokens for h in run(model, sources[:4], cfg)]
    job = BatchJob(decoding_models(model, cfg), cfg, SPECIALS, torch.device("cpu"), score=True)
    got = job([Sentence(i, s, prefix=[5], target=t)
               for i, (s, t) in enumerate(zip(sources[:4], targets, strict=True))])
    want = score_pairs(model, sources[:4], targets, cfg, SPECIALS)
    assert [h.tokens for h, in got] == targets
    assert [h.logprob for h, in got] == pytest.approx([h.logprob for h in want], abs=1e-4)
    long = [Sentence(i, [4], target=[4] * 99) for i in range(2)]
    assert plan_batches(long, SearchConfig(max_tokens=150), score=True) == [[0], [1]]
    assert plan_batches(long, SearchConfig(max_tokens=150)) == [[0, 1]]  # searched: sources
