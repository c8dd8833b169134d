"""Word confidence (nmt.wings.words): each output token's log P comes from the search and
equals the model's by teacher forcing, under every search, batched or not, joining a running
batch or not; a word's probability is its pieces' product (or minimum); nmt-translate and
nmt-serve give the same numbers."""

from __future__ import annotations

import math

import pytest
import torch
from test_stepping import run_continuous
from translate_helpers import lines_of, random_sources, save_tiny_checkpoint, search, tiny_model
from translate_helpers import translate_config as config

from nmt.commands.translate import translate
from nmt.data.tokenizer import BOS_ID, EOS_ID, SPACE, SPECIALS, Tokenizer
from nmt.decoding.batches import decoding_models, translate_nbest
from nmt.engines.translator import Translator
from nmt.errors import ConfigError
from nmt.wings.words import format_words, parse_words, word_probs, word_spans
from nmt.wings.words import words as words_of

V = 24
pytestmark = pytest.mark.usefixtures("one_thread")


def forced(models: list, src: list[int], out: list[int]) -> list[float]:
    """Each output token's log P by teacher forcing the output on the reference models (full
    forward passes; an ensemble: their mean log P)."""
    src_t, tgt_in = torch.tensor([src + [EOS_ID]]), torch.tensor([[BOS_ID] + out])
    with torch.no_grad():
        lprobs = sum(m(src_t, tgt_in)[0].float().log_softmax(-1) for m in models) / len(models)
    return lprobs[torch.arange(len(out)), out].tolist()


def check_forced(models: list, sources: list[list[int]], results: list, max_len: list[int]):
    """Every hypothesis' token log P equal teacher forcing's, and log P less their sum is EOS's
    (0 for an output cut at its maximum length, which has no EOS)."""
    for src, hyps, limit in zip(sources, results, max_len, strict=True):
        for h in hyps:
            want = forced(models, src, h.tokens + [EOS_ID])
            assert h.token_logprobs == pytest.approx(want[:-1], abs=1e-4)
            eos = 0.0 if len(h.tokens) == limit else want[-1]
            assert h.logprob - sum(h.token_logprobs) == pytest.approx(eos, abs=1e-4)


SEARCHES = {"greedy": search(beam_size=1), "beam": search(beam_size=4, nbest=3),
            "sampling": search(sampling=True, nbest=2, temperature=2.0),
            "no-repeat": search(beam_size=3, no_repeat_ngram_size=2, min_len=2)}


@pytest.mark.parametrize("name", sorted(SEARCHES))
@pytest.mark.parametrize("ensemble", [False, True])
def test_the_searchs_token_log_probs_are_teacher_forcings(name, ensemble):
    cfg = SEARCHES[name]
    models = [tiny_model(V, seed=s, stops=True) for s in ([0, 1] if ensemble else [0])]
    sources = random_sources(8, V, seed=3)
    results = translate_nbest(models, sources, cfg, SPECIALS)
    check_forced(models, sources, results, [len(s) + cfg.max_len_b for s in sources])
    alone = [translate_nbest(models, [s], cfg, SPECIALS, lines=[i])[0]
             for i, s in enumerate(sources)]  # batched equals unbatched
    for a, b in zip(alone, results, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        for x, y in zip(a, b, strict=True):
            assert x.token_logprobs == pytest.approx(y.token_logprobs, abs=1e-5)


def test_a_forced_prefix_and_sentences_joining_a_running_batch_keep_them():
    model = tiny_model(V, stops=True)
    sources = random_sources(5, V, seed=4)
    cfg = search(beam_size=3)
    prefixed = translate_nbest(model, sources, cfg, SPECIALS, prefixes=[[5, 6]] * 5)
    assert all(h.tokens[:2] == [5, 6] for hs in prefixed for h in hs)
    check_forced([model], sources, prefixed, [len(s) + cfg.max_len_b for s in sources])
    results, _ = run_continuous(decoding_models(model, cfg), sources, cfg,
                                {0: [0, 1], 2: [2, 3], 5: [4]})
    check_forced([model], sources, [results[i] for i in range(5)],
                 [len(s) + cfg.max_len_b for s in sources])


def test_a_word_is_what_the_space_mark_starts_and_combines_its_pieces():
    pieces = ["Ab", "▁Öff", "nen", "▁Sie", "▁die", "▁Datei", ".", "▁"]
    spans = word_spans(pieces)
    assert spans == [range(0, 1), range(1, 3), range(3, 4), range(4, 5), range(5, 7),
                     range(7, 8)]
    lp = [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6, -0.7, -0.8]
    product, low = word_probs(lp, spans, "product"), word_probs(lp, spans, "min")
    assert product[1] == pytest.approx(math.exp(-0.5)) and low[1] == pytest.approx(
        math.exp(-0.3))
    assert product[4] == pytest.approx(math.exp(-1.3)) and low[4] == pytest.approx(
        math.exp(-0.7))
    assert word_spans([]) == [] and parse_words("a|b|0.5000 c|1.0000")[0].text == "a|b"


@pytest.mark.parametrize("where", ["start", "inside", "end", "after a space mark"])
def test_words_are_the_translations_tokens_and_read_back_with_an_unknown_piece(tiny_data_dir,
                                                                                where):
    """An unknown piece decodes to " \u2047 ": it made words with spaces ("file \u2047"), and
    a space mark alone an empty word, which parse_words could not read back."""
    tok = Tokenizer((tiny_data_dir / "spm.model").read_bytes())
    ids, unk, space = tok.encode(["open the file"])[0], tok.sp.unk_id(), tok.sp.piece_to_id(SPACE)
    ids = {"start": [unk] + ids, "inside": ids[:2] + [unk] + ids[2:], "end": ids + [unk, space],
           "after a space mark": [space, unk] + ids}[where]
    found = words_of(ids, [-0.1 * (i + 1) for i in range(len(ids))], tok, "product")
    assert [w.text for w in found] == tok.decode([ids])[0].split()
    assert "\u2047" in [w.text for w in found]
    back = parse_words(format_words(found))
    assert [w.text for w in back] == [w.text for w in found]
    assert [w.prob for w in back] == pytest.approx([w.prob for w in found], abs=6e-5)
    assert math.prod(w.prob for w in found) == pytest.approx(math.exp(-0.1 * sum(
        range(1, len(ids) + 1))))  # every piece counted once


@pytest.fixture(scope="module")
def ckpt(tiny_data_dir, tmp_path_factory):
    """A random tiny checkpoint whose outputs on the toy test split have many words, of
    several pieces too, and probabilities neither 0 nor 1 (seed 1; see meaningful)."""
    path = tmp_path_factory.mktemp("run") / "checkpoint_last.pt"
    return save_tiny_checkpoint(path, (tiny_data_dir / "spm.model").read_bytes(), seed=1)


def meaningful(probs: list[float]) -> bool:
    """Whether a comparison of these word probabilities (4 decimals) can fail: many of them
    strictly between 0.01 and 0.99."""
    return sum(0.01 < p < 0.99 for p in probs) >= 20


def forced_words(tr: Translator, src: list[int], out: list[int], combine: str) -> list[float]:
    """A translation's word probabilities from teacher forcing, its words found anew."""
    return word_probs(forced([tr.model], src, out), word_spans(tr.tgt_tok.pieces(out)),
                      combine)


@pytest.mark.parametrize("combine,nbest", [("product", 1), ("min", 2)])
def test_nmt_translate_writes_each_word_with_teacher_forcings_probability(
        ckpt, test_en, tmp_path, combine, nbest):
    out = tmp_path / "hyp"
    result = translate(config(checkpoint=ckpt, input=test_en, output=out, word_scores="true",
                              word_combine=combine, **{"search.beam_size": 3,
                                                       "search.nbest": nbest}))
    tr = Translator.load(ckpt, dtype=None)
    src = tr.src_tok.encode(lines_of(test_en))
    written, probs = iter(lines_of(out)), []
    for ids, hyps, in zip(src, result.nbest, strict=True):
        for h in hyps:
            fields = next(written).split("\t" if nbest == 1 else " ||| ")
            text, column = fields[0 if nbest == 1 else 1], fields[-1]
            found = parse_words(column)
            assert " ".join(w.text for w in found) == text
            probs += [w.prob for w in found]
            assert probs[-len(found):] == pytest.approx(
                forced_words(tr, ids, h.tokens, combine), abs=6e-5)
    assert meaningful(probs)


def test_score_reference_writes_the_given_targets_words(ckpt, test_en, tmp_path):
    """The targets: the model's own translations (re-encoded: their pieces may differ from the
    search's), so that their words' probabilities are not all about 0."""
    hyp, scored = tmp_path / "hyp", tmp_path / "scored"
    translate(config(checkpoint=ckpt, input=test_en, output=hyp, **{"search.beam_size": 3}))
    translate(config(checkpoint=ckpt, input=test_en, output=scored, ref=hyp,
                     score_reference="true", word_scores="true", word_combine="min"))
    tr = Translator.load(ckpt, dtype=None)
    probs = []
    for src, tgt, line in zip(tr.src_tok.encode(lines_of(test_en)),
                              tr.tgt_tok.encode(lines_of(hyp)), lines_of(scored), strict=True):
        found = [w.prob for w in parse_words(line.split("\t")[3])]
        assert found == pytest.approx(forced_words(tr, src, tgt, "min"), abs=6e-5)
        probs += found
    assert meaningful(probs)


def test_nmt_serve_answers_the_numbers_nmt_translate_writes(ckpt, test_en, tmp_path):
    pytest.importorskip("fastapi")
    from test_serve import InProcess

    lines = lines_of(test_en)[:6]
    (tmp_path / "in").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    translate(config(checkpoint=ckpt, input=tmp_path / "in", output=tmp_path / "hyp",
                     word_scores="true", word_combine="min", **{"search.beam_size": 2}))
    written = [parse_words(line.split("\t")[1]) for line in lines_of(tmp_path / "hyp")]
    server = InProcess(ckpt, "split=none")
    try:
        answers = server.translate(lines, beam_size=2, word_scores=True, word_combine="min")
        assert server.service.features().word_scores
    finally:
        server.stop()
    for words, answer in zip(written, answers, strict=True):
        assert [w.text for w in words] == [w["text"] for w in answer["words"]]
        assert [w.prob for w in words] == pytest.approx([w["prob"] for w in answer["words"]],
                                                        abs=6e-5)
    assert meaningful([w.prob for words in written for w in words])


def test_ctranslate2_refuses_word_scores_in_one_line(ckpt):
    with pytest.raises(ConfigError, match="^word_scores: engine=ctranslate2 has no per-token "):
        config(checkpoint=ckpt, engine="ctranslate2", word_scores="true")
    with pytest.raises(ConfigError, match="^word_combine: must be product or min"):
        config(checkpoint=ckpt, word_combine="mean")
