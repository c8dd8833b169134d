"""Search: greedy == beam 1, batch == one at a time, cache == no cache, exhaustive == beam."""

import itertools

import pytest
import torch
from translate_helpers import TableModel, random_sources, tiny_model

from nmt.config import SearchConfig
from nmt.search import (
    beam_search,
    greedy_search,
    length_penalty,
    make_batches,
    pad_batch,
    translate_ids,
    translate_nbest,
)

pytestmark = pytest.mark.usefixtures("one_thread")

PAD, BOS, EOS = 0, 2, 3
V = 24


def search(**kw) -> SearchConfig:
    """A SearchConfig with short outputs so that tests stay fast."""
    base = dict(beam_size=4, alpha=0.6, max_len_a=1.0, max_len_b=6, min_len=1)
    base.update(kw)
    return SearchConfig(**base)


def run(model, sources, cfg, **kw):
    """translate_nbest with this test file's special ids."""
    return translate_nbest(model, sources, cfg, BOS, EOS, PAD, **kw)


def tokens(results):
    """The token lists of every hypothesis."""
    return [[h.tokens for h in hyps] for hyps in results]


@pytest.fixture(scope="module")
def model():
    return tiny_model(V, seed=0, eos_like=20, N=2)


@pytest.fixture(scope="module")
def sources():
    return random_sources(24, V, seed=1)


def test_outputs_mix_early_eos_and_maximum_length(model, sources):
    """The tests below are meaningful: some outputs end with EOS, some at the maximum length."""
    for beam in (1, 4):
        out = run(model, sources, search(beam_size=beam))
        at_max = [len(h[0].tokens) == len(s) + 6 for h, s in zip(out, sources, strict=True)]
        assert any(at_max) and not all(at_max)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("min_len", [1, 4])
def test_beam_size_one_equals_greedy(model, sources, alpha, min_len):
    src = pad_batch([s + [EOS] for s in sources], PAD, "cpu")
    cfg = search(beam_size=1, alpha=alpha, min_len=min_len)
    greedy = greedy_search(model, src, cfg, BOS, EOS, PAD)
    beam = beam_search(model, src, cfg, BOS, EOS, PAD)
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


def exhaustive(model, source, max_len, min_len, alpha):
    """Every output of at most max_len tokens, scored with full (uncached) forward passes."""
    allowed = [t for t in range(model.generator.out_features) if t not in (PAD, BOS, EOS)]
    scored = []
    for n in range(min_len, max_len + 1):
        bodies = torch.tensor(list(itertools.product(allowed, repeat=n)),
                              dtype=torch.long).view(-1, n)  # (M, n)
        M = bodies.size(0)
        y = bodies if n == max_len else torch.cat(  # at max_len the output stops without EOS
            [bodies, torch.full((M, 1), EOS)], dim=1)  # (M, |Y|)
        tgt_in = torch.cat([torch.full((M, 1), BOS), y[:, :-1]], dim=1)
        with torch.no_grad():
            lprobs = model(torch.tensor([source + [EOS]]).expand(M, -1), tgt_in)
        lprobs = lprobs.float().log_softmax(-1)  # (M, |Y|, V)
        lprobs[:, :, [PAD, BOS]] = -torch.inf
        lprobs[:, :min_len, EOS] = -torch.inf
        logp = lprobs.gather(2, y.unsqueeze(2)).squeeze(2).sum(1)  # (M,)
        lp = length_penalty(y.size(1), alpha)
        scored += [(s / lp, b) for s, b in zip(logp.tolist(), bodies.tolist(), strict=True)]
    return sorted(scored, key=lambda x: -x[0])


@pytest.mark.parametrize("alpha", [0.0, 0.6, 6.0])
def test_exhaustive_search_confirms_the_wide_beams_best(alpha):
    """Over 4 ordinary tokens + EOS and 4 output tokens, a beam of 400 explores everything.

    The sentence still retires early when nothing active can beat its finished best; alpha = 6
    favours long outputs so much that a bound ignoring the length would stop too soon.
    """
    small = tiny_model(7, seed=3, eos_like=5)
    max_len, min_len = 4, 1
    for source in ([4, 5, 6], [6, 6], [5]):
        truth = exhaustive(small, source, max_len, min_len, alpha)
        cfg = SearchConfig(beam_size=400, nbest=5, alpha=alpha, max_len_a=0.0,
                           max_len_b=max_len, min_len=min_len)
        hyps = translate_nbest(small, [source], cfg, BOS, EOS, PAD)[0]
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
        hyps = translate_nbest(table, [[4]], cfg, BOS, EOS, PAD)[0]
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
    out = translate_ids(model, mixed, search(), BOS, EOS, PAD)
    assert out[0] == out[2] == out[5] == []
    alone = [translate_ids(model, [s], search(), BOS, EOS, PAD)[0] for s in mixed]
    assert out == alone


def test_translate_ids_puts_back_training_mode(model, sources):
    model.train()
    try:
        ids = translate_ids(model, sources[:5], search(), BOS, EOS, PAD)
        assert model.training
    finally:
        model.eval()
    assert ids == translate_ids(model, sources[:5], search(), BOS, EOS, PAD)


def test_make_batches_respects_the_budget_and_sorts_by_length():
    lengths = [3, 9, 1, 7, 7, 2, 12, 5, 5, 5]
    batches = make_batches(lengths, max_tokens=20)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 20
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(lengths, reverse=True)
    assert all(len(b) <= 2 for b in make_batches(lengths, max_tokens=10 ** 6, max_sentences=2))


@pytest.mark.parametrize("beam", [1, 4])
def test_worker_processes_give_the_same_outputs(model, sources, beam):
    cfg = search(beam_size=beam, nbest=2 if beam > 1 else 1, max_tokens=20)
    here = run(model, sources, cfg)
    forked = run(model, sources, cfg, workers=3)
    assert tokens(forked) == tokens(here)
    assert [h[0].score for h in forked] == [h[0].score for h in here]


def test_translating_draws_no_random_numbers(model, sources):
    """The trainer translates for validation BLEU: its random number stream must not move."""
    state = torch.get_rng_state()
    run(model, sources[:4], search())
    assert torch.equal(torch.get_rng_state(), state)


def test_translating_under_bf16_autocast_works(model, sources):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(model, sources[:4], search())
    assert len(out) == 4 and all(h[0].logprob <= 0 for h in out)
