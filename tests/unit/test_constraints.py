"""Lexically constrained decoding (dynamic beam allocation): exhaustive search confirms a wide
beam's best constrained output, small beams meet every constraint, batching changes nothing,
no constraints is plain beam search; the progress tracker; nmt-translate constraints=FILE."""

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from translate_helpers import (
    TableModel,
    exhaustive,
    lines_of,
    random_sources,
    run,
    save_tiny_checkpoint,
    search,
    tiny_model,
    tokens,
)
from translate_helpers import translate_config as config

from nmt.commands.translate import translate
from nmt.config import ConfigError, SearchConfig, TranslateConfig, compose, to_object
from nmt.data.tokenizer import SPECIALS, Tokenizer
from nmt.decoding.batches import translate_nbest
from nmt.decoding.constrained import PhraseConstraints, missing_phrases
from nmt.decoding.lengths import output_lengths
from nmt.decoding.messages import Sentence
from nmt.errors import NmtError

pytestmark = pytest.mark.usefixtures("one_thread")

V = 24
# per sentence: one token, a phrase, none, a token and a phrase, a phrase repeating its
# token, the same token twice (two occurrences needed), two phrases of three and two tokens
PHRASES = [[[7]], [[8, 9]], [], [[10], [11, 12]], [[5, 5]], [[13], [13]],
           [[14, 15, 16], [17, 18]], [[6]]]


@pytest.fixture(scope="module")
def model():
    return tiny_model(V, seed=1, stops=True, N=2)


@pytest.fixture(scope="module")
def sources():
    return random_sources(len(PHRASES), V, seed=1)


def constrained_truth(model, source, phrases, max_len, alpha):
    """Exhaustive search's outputs that contain every phrase, best first."""
    return [(s, y) for s, y in exhaustive(model, source, max_len, 1, alpha)
            if not missing_phrases(y, phrases)]


# ----------------------------------------------------------------------------- exhaustive
# over the ordinary tokens 1 (UNK), 4, 5 (V = 6); the tokens of a sentence's phrases are
# distinct, so that greedy matching sees every occurrence
EXHAUSTIVE_PHRASES = [[[5]], [[4, 1]], [[1], [4]], [[4, 5], [1]]]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_a_wide_beam_finds_exhaustive_searchs_best_constrained_outputs(alpha):
    """3 ordinary tokens, outputs of 5 at most: a beam of 350 holds every candidate, so only
    a wrong constraint state, a wrong EOS rule or retiring too early can make it differ."""
    for seed in range(4):
        table = TableModel(6, seed=seed)
        cfg = SearchConfig(beam_size=350, nbest=3, alpha=alpha, max_len_a=0.0, max_len_b=5)
        for phrases in EXHAUSTIVE_PHRASES:
            truth = constrained_truth(table, [4], phrases, 5, alpha)[:3]
            hyps = translate_nbest(table, [[4]], cfg, SPECIALS, constraints=[phrases])[0]
            assert [h.tokens for h in hyps] == [y for _, y in truth]
            assert [h.score for h in hyps] == pytest.approx([s for s, _ in truth], abs=1e-4)


def test_a_wide_beam_finds_the_best_constrained_output_of_a_transformer():
    small = tiny_model(7, seed=3, stops=True)
    cfg = SearchConfig(beam_size=400, nbest=2, max_len_a=0.0, max_len_b=4)
    for phrases in EXHAUSTIVE_PHRASES:
        truth = constrained_truth(small, [4, 5, 6], phrases, 4, 0.6)[:2]
        hyps = translate_nbest(small, [[4, 5, 6]], cfg, SPECIALS, constraints=[phrases])[0]
        assert [h.tokens for h in hyps] == [y for _, y in truth]
        assert [h.score for h in hyps] == pytest.approx([s for s, _ in truth], abs=1e-4)


@pytest.mark.parametrize("beam", [1, 2, 3])
def test_small_beams_meet_every_constraint_and_never_beat_the_optimum(beam):
    for seed in range(4):
        table = TableModel(6, seed=seed)
        cfg = SearchConfig(beam_size=beam, alpha=0.6, max_len_a=0.0, max_len_b=5)
        for phrases in EXHAUSTIVE_PHRASES:
            best = constrained_truth(table, [4], phrases, 5, 0.6)[0][0]
            h = translate_nbest(table, [[4]], cfg, SPECIALS, constraints=[phrases])[0][0]
            assert missing_phrases(h.tokens, phrases) == []
            assert h.score <= best + 1e-4


# ----------------------------------------------------------------------------- batches
@pytest.mark.parametrize("beam", [1, 2, 4])
def test_every_output_holds_its_constraints(model, sources, beam):
    out = run(model, sources, search(beam_size=beam, nbest=min(beam, 2)), constraints=PHRASES)
    for hyps, phrases, s in zip(out, PHRASES, sources, strict=True):
        lacking = [bool(missing_phrases(h.tokens, phrases)) for h in hyps]
        assert not lacking[0] and lacking == sorted(lacking)  # those lacking one rank last
        assert all(len(h.tokens) == len(s) + 6 for h, a in zip(hyps, lacking, strict=True)
                   if a)  # cut at the maximum length
    free = run(model, sources, search(beam_size=beam))
    assert tokens(out)[2][0] == tokens(free)[2][0]  # no constraints: as without


@pytest.mark.parametrize("beam", [1, 4])
def test_a_batch_gives_the_same_outputs_as_one_sentence_at_a_time(model, sources, beam):
    cfg = search(beam_size=beam, nbest=min(beam, 3))
    batched = run(model, sources, cfg, constraints=PHRASES)
    single = run(model, sources, search(beam_size=beam, nbest=min(beam, 3), max_tokens=1),
                 constraints=PHRASES)
    assert tokens(batched) == tokens(single)
    for b, s in zip(batched, single, strict=True):
        assert [h.score for h in b] == pytest.approx([h.score for h in s], abs=1e-4)
    forked = run(model, sources, search(beam_size=beam, nbest=min(beam, 3), max_tokens=20),
                 workers=2, constraints=PHRASES)
    assert tokens(forked) == tokens(batched)


def test_no_constraints_is_plain_beam_search(model, sources):
    cfg = search(beam_size=4, nbest=3)
    plain = run(model, sources, cfg)
    none = run(model, sources, cfg, constraints=[[] for _ in sources])
    assert tokens(none) == tokens(plain)
    assert [h.score for hs in none for h in hs] == [h.score for hs in plain for h in hs]
    # in a batch with constrained sentences, an unconstrained one is decoded as without
    one = [[]] * (len(sources) - 1) + [[[6]]]
    mixed = run(model, sources, cfg, constraints=one)
    assert tokens(mixed)[:-1] == tokens(plain)[:-1] and tokens(mixed) != tokens(plain)


def test_the_cache_and_the_reference_model_agree_with_constraints(model, sources):
    cfg = search(beam_size=3, nbest=2)
    fast = run(model, sources, cfg, constraints=PHRASES)
    assert tokens(run(model, sources, cfg, constraints=PHRASES, use_cache=False)) == tokens(fast)
    assert tokens(run(model, sources, cfg, constraints=PHRASES, fast=False)) == tokens(fast)


def test_constraints_with_a_prefix(model, sources):
    prefixes = [[9, 10]] * len(sources)
    out = run(model, sources, search(beam_size=4), prefixes=prefixes, constraints=PHRASES)
    for hyps, phrases in zip(out, PHRASES, strict=True):
        assert hyps[0].tokens[:2] == [9, 10]
        assert missing_phrases(hyps[0].tokens, phrases) == []
    # a constraint the prefix holds is met by it
    both = run(model, sources[:1], search(beam_size=4), prefixes=[[9, 10]],
               constraints=[[[9, 10]]])
    assert both == run(model, sources[:1], search(beam_size=4), prefixes=[[9, 10]])


def test_a_forced_piece_is_never_banned(model, sources):
    """The prefix goes on with the word right after a phrase it holds (`Datei` and the
    prefix `Dateiformat`): the continuation ban must not touch a forced piece."""
    cfg = search(beam_size=4)
    out = run(model, sources[:2], cfg, prefixes=[[9, 10, 11]] * 2, constraints=[[[9]]] * 2,
              continuations=[10])
    for hyps in out:
        assert hyps[0].tokens[:3] == [9, 10, 11] and hyps[0].logprob > -math.inf


def test_no_piece_that_goes_on_with_a_word_follows_a_phrase(model, sources):
    phrases = [[[7]], [[9, 11]], [[13], [15]], [[5, 5]]] * 2
    odd = list(range(5, V, 2))  # say, the pieces that go on with a word: the odd ones
    free = run(model, sources, search(beam_size=4), constraints=phrases)
    out = run(model, sources, search(beam_size=4), constraints=phrases, continuations=odd)
    followers = []
    for hyps, ps in zip(out, phrases, strict=True):
        y = hyps[0].tokens
        assert missing_phrases(y, ps) == []
        for p in ps:
            at = next(i for i in range(len(y)) if y[i:i + len(p)] == p) + len(p)  # its end
            followers += y[at:at + 1]
    assert followers and not set(followers) & set(odd)
    assert tokens(out) != tokens(free)


def test_an_output_lacks_a_constraint_only_when_cut_at_the_maximum_length(model, sources):
    cfg = search(beam_size=4, max_len_a=0.0, max_len_b=3)
    best = run(model, sources[:1], cfg, constraints=[[[4, 5, 6, 7]]])[0][0]
    assert missing_phrases(best.tokens, [[4, 5, 6, 7]]) == []  # the length raised to hold it
    # no token twice: no output can hold 5 5, and EOS never comes
    cut = run(model, sources[:1], search(beam_size=4, no_repeat_ngram_size=1),
              constraints=[[[5, 5]]])[0][0]
    assert missing_phrases(cut.tokens, [[5, 5]]) == [0] and len(cut.tokens) == len(sources[0]) + 6
    with pytest.raises(ValueError, match="constraints need beam search"):
        run(model, sources[:1], search(sampling=True), constraints=[[[5]]])


# ----------------------------------------------------------------------------- the tracker
def test_the_tracker_unmeets_a_broken_phrase_and_restarts_on_its_breaker():
    pc = PhraseConstraints([[[5, 6, 7], [8]], [[5, 6]]], torch.device("cpu"))
    sent = torch.tensor([0, 1])

    def feed(ids):
        pc.met, pc.last = torch.zeros_like(pc.met), torch.full((2,), -1)
        for tok in ids:
            pc.advance(torch.arange(2), torch.tensor([tok, tok]), sent)
        return pc.met.sum(1).tolist()

    assert feed([5, 6]) == [2, 2]
    assert feed([5, 6, 5]) == [1, 2]  # broken off by a 5, which begins it again; done stays
    assert feed([5, 6, 5, 6, 7]) == [3, 2]
    assert feed([8, 5, 4, 5, 6, 7]) == [4, 2]
    assert feed([5, 6, 7, 5, 6, 7]) == [3, 2]  # a phrase met is not met again


def test_missing_phrases_counts_repeated_phrases():
    assert missing_phrases([1, 2, 1, 2], [[1, 2], [1, 2]]) == []
    assert missing_phrases([1, 2, 3], [[1, 2], [1, 2], [3]]) == [1]
    assert missing_phrases([5, 5, 5], [[5, 5], [5, 5]]) == [1]  # no overlapping
    assert missing_phrases([], [[4]]) == [0]


# ----------------------------------------------------------------------------- nmt-translate
@pytest.fixture(scope="module")
def ckpt(tiny_data_dir, tmp_path_factory) -> Path:
    spm = (tiny_data_dir / "spm.model").read_bytes()
    return save_tiny_checkpoint(tmp_path_factory.mktemp("run") / "a.pt", spm, seed=0)


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_translate_with_a_constraints_file(ckpt, test_en, tmp_path):
    """Phrases given as text are encoded with the target tokenizer; every translation holds
    them (the random model would not write them otherwise)."""
    sources = lines_of(test_en)[:6]
    phrases = ["Nepo", "Evas Elif", "", "Pleh\tTide", "Nepo\tNepo", "Esolc"]
    src = write(tmp_path / "in.en", sources)
    cons = write(tmp_path / "cons.tsv", phrases)
    for beam in (1, 4):
        kw = {"search.beam_size": beam}
        out = translate(config(checkpoint=ckpt, input=src, output=tmp_path / "h",
                               constraints=cons, **kw))
        assert lines_of(tmp_path / "h") == out.hypotheses
        for hyp, line in zip(out.hypotheses, phrases, strict=True):
            for p in line.split("\t"):  # whole words (no piece goes on with the last)
                assert len(re.findall(rf"\b{p}\b", hyp)) >= line.split("\t").count(p)
        free = translate(config(checkpoint=ckpt, input=src, output=tmp_path / "f", **kw))
        assert not any("Nepo" in h for h in free.hypotheses)
        assert out.hypotheses[2] == free.hypotheses[2]  # none: as without


@pytest.mark.slow
def test_a_constraints_file_of_the_wrong_length_is_a_one_line_error(ckpt, test_en, tmp_path):
    src = write(tmp_path / "in.en", lines_of(test_en)[:3])
    short, long = write(tmp_path / "short", ["Nepo", ""]), write(tmp_path / "long", ["a"] * 4)
    with pytest.raises(NmtError) as e:
        translate(config(checkpoint=ckpt, input=src, constraints=short))
    assert str(e.value) == (f"{short}: no line 3 for input line 3 (one line of TAB-separated "
                            f"phrases per line of {src})")
    bin_dir = Path(sys.executable).parent
    done = subprocess.run([str(bin_dir / "nmt-translate"), f"checkpoint={ckpt}", f"input={src}",
                           f"constraints={long}", "quiet=true"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"nmt-translate: error: {long}: line 4 has no input line ({src} has 3 lines)"]


def test_a_translation_lacking_a_constraint_is_reported(ckpt, test_en, tmp_path, capsys):
    src = write(tmp_path / "in.en", lines_of(test_en)[:2])
    cons = write(tmp_path / "cons.tsv", ["Nepo", "Nepo Nepo"])
    args = [f"checkpoint={ckpt}", f"input={src}", f"constraints={cons}", "output=-",
            "search.no_repeat_ngram_size=1"]  # no piece twice: "Nepo Nepo" cannot be written
    out = translate(to_object(compose("translate", args), TranslateConfig))
    assert "Nepo" in out.hypotheses[0] and "Nepo Nepo" not in out.hypotheses[1]
    assert (f"nmt-translate: warning: {src}: line 2: the translation lacks constraint "
            f"'Nepo Nepo' (cut at the maximum length)") in capsys.readouterr().err.splitlines()


def test_a_prefix_that_goes_on_with_a_constraints_word_is_translated(ckpt, test_en, tmp_path):
    """Constraint `Nepo` (▁N e po), prefix `Nepoelif` (▁N e po e ...): not an empty line."""
    sources = lines_of(test_en)[:2]
    src = write(tmp_path / "in.tsv", [f"{line}\tNepoelif" for line in sources])
    cons = write(tmp_path / "cons.tsv", ["Nepo", "Nepo"])
    out = translate(config(checkpoint=ckpt, input=src, output=tmp_path / "h", prefix="true",
                           constraints=cons))
    assert all(h.startswith("Nepoelif") for h in out.hypotheses)


def test_a_line_left_with_no_translation_says_so_even_when_quiet(ckpt, test_en, tmp_path,
                                                                  capsys, monkeypatch):
    """Every piece said to go on with a word: after the prefix `Nepo`, a phrase, only EOS
    could follow, and EOS waits for the phrase `Tide`: no hypothesis can end. One warning
    line names the input line and does not blame the maximum length."""
    monkeypatch.setattr(Tokenizer, "word_continuations",
                        lambda self: [1, *range(4, self.vocab_size)])  # UNK too
    src = write(tmp_path / "in.tsv", [f"{lines_of(test_en)[0]}\tNepo"])
    cons = write(tmp_path / "cons.tsv", ["Nepo\tTide"])
    out = translate(config(checkpoint=ckpt, input=src, output=tmp_path / "h", prefix="true",
                           constraints=cons))  # quiet=true
    assert out.hypotheses == [""]
    assert capsys.readouterr().err.splitlines() == [
        f"nmt-translate: warning: {src}: line 1: no translation: every continuation was banned "
        f"(by its prefix, constraints or search.no_repeat_ngram_size)"]


def test_constraints_refuse_sampling_and_scoring(ckpt, test_en):
    with pytest.raises(ConfigError, match="constraints: need beam search"):
        config(checkpoint=ckpt, input=test_en, constraints="c", **{"search.sampling": "true"})
    with pytest.raises(ConfigError, match="constraints=... and score_reference=true"):
        config(checkpoint=ckpt, input=test_en, constraints="c", score_reference="true")


def test_the_maximum_length_holds_the_prefix_and_every_phrase_after_it():
    search = SearchConfig(max_len_a=0.0, max_len_b=2)
    sentences = [Sentence(0, [5], prefix=[4, 4, 4], phrases=[[6, 7], [8]]),
                 Sentence(1, [5], phrases=[[6, 7, 8]]), Sentence(2, [5])]
    assert output_lengths(sentences, search, 100).tolist() == [3 + 3 + 1, 3 + 1, 2]
    assert output_lengths(sentences, search, 5).tolist() == [5, 4, 2]  # within the positions
