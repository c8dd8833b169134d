"""nmt-translate's choice among candidates: mbr.candidates (minimum Bayes risk) and
rerank.model (a reverse model's score, the forward score and the length)."""

from pathlib import Path

import pytest
from translate_helpers import lines_of
from translate_helpers import translate_config as config

from nmt.commands.translate import translate
from nmt.errors import ConfigError
from nmt.wings.mbr import mbr_select

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def source(test_en, tmp_path_factory) -> Path:
    """The first 6 test lines: enough to differ, few enough to stay fast."""
    path = tmp_path_factory.mktemp("in") / "src.en"
    path.write_text("".join(line + "\n" for line in lines_of(test_en)[:6]), encoding="utf-8")
    return path


def run_nbest(ckpt: Path, source: Path, out: Path, **kw) -> tuple[list[list[str]], dict]:
    """Texts of each line's n-best (or samples), and the result."""
    result = translate(config(checkpoint=ckpt, input=source, output=out, workers=1, **kw))
    rows = [line.split(" ||| ") for line in lines_of(out)]
    texts = [[] for _ in result.nbest]
    for row in rows:
        texts[int(row[0])].append(row[1])
    return texts, result


def mbr_run(ckpt: Path, source: Path, out: Path, **kw) -> list[str]:
    """The translations written with mbr.* settings kw (and the others of kw)."""
    kw = {k.replace("_", ".", 1): v for k, v in kw.items()}  # mbr_candidates: mbr.candidates
    result = translate(config(checkpoint=ckpt, input=source, output=out, workers=1, **kw))
    assert lines_of(out) == result.hypotheses
    return result.hypotheses


def test_mbr_writes_the_candidate_of_highest_expected_utility(ckpts, source, tmp_path):
    texts, found = run_nbest(ckpts[0], source, tmp_path / "nbest", **{"search.nbest": 4})
    scores = [[h.score for h in hyps] for hyps in found.nbest]
    for aggregate in (False, True):  # beam_size 2 is raised to N: the n-best of a beam of 4
        chosen = mbr_run(ckpts[0], source, tmp_path / "mbr", mbr_candidates=4,
                         mbr_aggregate=str(aggregate).lower(), search_beam_size=2)
        assert chosen == [t[mbr_select(t, s, aggregate=aggregate)]
                          for t, s in zip(texts, scores, strict=True)]
    assert chosen != [t[0] for t in texts]  # not simply the model's best


def test_mbr_over_samples_with_bleu(ckpts, source, tmp_path):
    kw = {"search.sampling": "true", "search.seed": 3}
    texts, found = run_nbest(ckpts[0], source, tmp_path / "samples", **{"search.nbest": 4}, **kw)
    scores = [[h.score for h in hyps] for hyps in found.nbest]
    chosen = mbr_run(ckpts[0], source, tmp_path / "mbr", mbr_candidates=4, mbr_utility="bleu",
                     **kw)
    assert chosen == [t[mbr_select(t, s, "bleu")] for t, s in zip(texts, scores, strict=True)]


def test_rerank_weighs_the_reverse_score_forward_score_and_length(ckpts, source, tmp_path):
    a, b = ckpts
    # samples, whose lengths differ more than a random model's n-best; alpha 0: score = log P
    base = {"search.nbest": 4, "search.alpha": 0, "search.sampling": "true"}
    texts, found = run_nbest(a, source, tmp_path / "nbest", **base)
    pairs = tmp_path / "pairs.tsv"  # hypothesis<TAB>source: b scores log P(source | hyp)
    sources = lines_of(source)
    pairs.write_text("".join(f"{t}\t{s}\n" for ts, s in zip(texts, sources, strict=True)
                             for t in ts), encoding="utf-8")
    reverse = iter(h.logprob for h in translate(config(
        checkpoint=b, input=pairs, output=tmp_path / "scores", score_reference="true",
        workers=1)).pairs)
    totals = [[(h.logprob, next(reverse), len(h.tokens)) for h in hyps]
              for hyps in found.nbest]

    def chosen(**weights) -> list[str]:
        kw = {f"rerank.{k}": v for k, v in weights.items()}
        return translate(config(checkpoint=a, input=source, output=tmp_path / "out", workers=1,
                                **{"rerank.model": b}, **base, **kw)).hypotheses

    def best(fw: float, rev: float, length: float) -> list[str]:
        return [ts[max(range(len(ts)), key=lambda i: fw * t[i][0] + rev * t[i][1]
                       + length * (t[i][2] + 1))] for ts, t in zip(texts, totals, strict=True)]

    first = [ts[0] for ts in texts]  # the most probable sample
    assert chosen(forward=0.1, reverse=1) == best(0.1, 1, 0) != first
    assert chosen(forward=0, reverse=0, length=1) == best(0, 0, 1) != first  # the longest
    assert lines_of(tmp_path / "out") == best(0, 0, 1)


@pytest.mark.parametrize("args,message", [
    (["mbr.candidates=33"], "mbr.candidates: must be 0 (off) or 2 to 32, got 33"),
    (["mbr.candidates=1"], "mbr.candidates: must be 0 (off) or 2 to 32, got 1"),
    (["mbr.utility=ter"], "mbr.utility: must be chrf, bleu or comet, got 'ter'"),
    (["mbr.candidates=4", "mbr.utility=comet"],
     "mbr.utility: comet needs comet=DIR (a COMET-22 model directory)"),
    (["mbr.utility=bleu", "mbr.aggregate=true"],
     "mbr.aggregate: is chrF's reference aggregation: needs mbr.utility=chrf, not bleu"),
    (["mbr.candidates=4", "search.nbest=2"],
     "mbr.candidates: writes one translation per line: leave search.nbest at 1, got 2"),
    (["mbr.candidates=4", "score_reference=true"],
     "mbr.candidates: not with score_reference=true"),
    (["rerank.model=r.pt"], "rerank.model: needs an n-best to rerank: search.nbest >= 2 "
                            "(and search.beam_size >= nbest)"),
    (["engine=ctranslate2", "search.beam_size=1", "mbr.candidates=4"],
     "mbr.candidates: its search (beam_size=4, nbest=4) fails: search.alpha: "
     "engine=ctranslate2 has no GNMT length penalty in beam search; use search.alpha=0 (or "
     "search.beam_size=1)"),
    (["rerank.model=r.pt", "mbr.candidates=4"],
     "rerank.model: not with mbr.candidates (one choice at a time)"),
])
def test_bad_choices_are_one_line_config_errors(args, message):
    from nmt.config import TranslateConfig, compose, to_object

    with pytest.raises(ConfigError) as e:
        to_object(compose("translate", ["checkpoint=a.pt", *args]), TranslateConfig)
    assert str(e.value) == message


def test_a_missing_reverse_model_is_a_one_line_error(ckpts, source, tmp_path):
    from nmt.errors import NmtError

    with pytest.raises(NmtError) as e:
        translate(config(checkpoint=ckpts[0], input=source, output=tmp_path / "out", workers=1,
                         **{"rerank.model": tmp_path / "none.pt", "search.nbest": 2}))
    assert "none.pt" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()
