"""COMET (nmt.wings.comet) against Unbabel's unbabel-comet 2.2.7, and where nmt uses it:
nmt-translate's scores and reference-free column, validation, MBR's utility, the preprocess
filter.

The models are the tiny random ones nmt.testing.comet_models builds (both forms); the scores
unbabel-comet's `predict` gave for them are recorded in tests/data/comet_scores.json (make
test-comet records them afresh in its own venv and points NMT_COMET_SCORES at them)."""

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from translate_helpers import save_tiny_checkpoint, translate_config

import nmt.commands.train
import nmt.data.cleaning
import nmt.system.distributed
import nmt.training.validation
import nmt.wings.comet as comet_module
import nmt.wings.mbr
from nmt.commands.preprocess import quality_filter
from nmt.commands.train import build_run, load_data
from nmt.commands.translate import translate
from nmt.config import CleanConfig, ServeConfig, TrainConfig, compose, to_object
from nmt.errors import ConfigError, NmtError
from nmt.testing.comet_models import FORMS, LINES, build, checksum
from nmt.wings.comet import load_comet, read_model_dir, sparsemax
from nmt.wings.mbr import comet_utilities

pytestmark = pytest.mark.usefixtures("one_thread")

RECORDED = Path(os.environ.get("NMT_COMET_SCORES",
                               Path(__file__).parents[1] / "data" / "comet_scores.json"))


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Both tiny COMET forms, built as make test-comet builds them."""
    root = tmp_path_factory.mktemp("comet")
    return {form: build(root, form) for form in FORMS}


def nmt_scores(model_dir: Path) -> list[float]:
    """nmt's scores of the recorded lines with one model."""
    comet = load_comet(str(model_dir))
    if comet.spec.needs_reference:
        return comet.score(LINES["src"], LINES["mt"], LINES["ref"])
    return comet.qe(LINES["src"], LINES["mt"])


@pytest.mark.parametrize("form", list(FORMS))
def test_parity_with_unbabel_comet(models, form):
    record = json.loads(RECORDED.read_text(encoding="utf-8"))
    assert record["lines"] == LINES
    assert checksum(models[form]) == record["checksums"][form], (
        "the tiny COMET model built differently from the one whose scores are recorded: "
        "run make test-comet and copy build/comet/scores.json to tests/data/")
    mine, theirs = nmt_scores(models[form]), record["scores"][form]
    assert mine == pytest.approx(theirs, abs=1e-4)
    assert max(theirs) - min(theirs) > 1e-3  # the lines' scores differ: the test can fail


@pytest.mark.parametrize("change", ["mix", "pool"])
def test_a_changed_layer_mix_or_pooling_breaks_parity(models, monkeypatch, change):
    form = "regression_metric"
    spec, state = read_model_dir(models[form])
    altered = (dataclasses.replace(spec, sparsemax=not spec.sparsemax) if change == "mix"
               else dataclasses.replace(spec, pool="cls"))
    monkeypatch.setattr(comet_module, "read_model_dir", lambda _: (altered, state))
    load_comet.cache_clear()
    try:
        mine = nmt_scores(models[form])
    finally:
        load_comet.cache_clear()
    theirs = json.loads(RECORDED.read_text(encoding="utf-8"))["scores"][form]
    assert mine != pytest.approx(theirs, abs=1e-4)


def test_sparsemax_is_the_projection_onto_the_simplex():
    z = torch.tensor([0.9, 0.1, -2.0, 0.5])
    p = sparsemax(z)
    # closed form: three in the support would need tau = (0.9 + 0.5 + 0.1 - 1) / 3 = 1/6 < 0.1,
    # which fails; two give tau = (0.9 + 0.5 - 1) / 2 = 0.2, above 0.1 and below 0.5
    assert p.tolist() == pytest.approx([0.7, 0.0, 0.0, 0.3])
    assert float(p.sum()) == pytest.approx(1.0)
    assert sparsemax(torch.tensor([3.0, 0.0])).tolist() == [1.0, 0.0]


def test_each_distinct_text_is_embedded_once(models, monkeypatch):
    comet = load_comet(str(models["regression_metric"]))
    embedded = []
    real = comet._embed_all
    monkeypatch.setattr(comet, "_embed_all", lambda rows, progress: embedded.append(
        len(rows)) or real(rows, progress))
    scores = comet.score(["a", "a", "b"], ["x", "y", "x"], ["y", "x", "a"])
    assert embedded == [4]  # a b x y: the sources, hypotheses and references, once each
    alone = [comet.score([s], [h], [r])[0] for s, h, r in (("a", "x", "y"), ("a", "y", "x"),
                                                         ("b", "x", "a"))]
    assert scores == pytest.approx(alone, abs=1e-5)


def test_mbr_comet_utilities_are_the_mean_against_the_others(models):
    comet = load_comet(str(models["regression_metric"]))
    cands = ["ein Haus", "ein kleines Haus", "ein Haus", "der See"]
    (eu,) = comet_utilities(comet, ["a small house"], [cands])
    for i, c in enumerate(cands):
        others = [r for j, r in enumerate(cands) if j != i]
        pairs = comet.score(["a small house"] * 3, [c] * 3, others)
        assert eu[i] == pytest.approx(sum(pairs) / 3, abs=1e-5)


def config(**kw):
    """nmt-translate's config for these tests: greedy, one worker."""
    return translate_config(**{"search.beam_size": 1, "workers": 1, **kw})


class FakeComet:
    """A reference-based stand-in of known scores: estimate() is mt . ref (embeddings one-hot
    per text, mt's weighted), counting the texts embedded."""

    spec = type("Spec", (), {"needs_reference": True, "form": "regression_metric"})()

    def __init__(self, value: dict[tuple[str, str], float]):
        self.value, self.embedded = value, []
        self.texts: list[str] = []

    def embed(self, texts, progress=False):
        self.embedded += texts
        self.texts = list(texts)
        return torch.eye(len(texts))

    def estimate(self, src, mt, ref):
        i, j = mt.argmax(1).tolist(), ref.argmax(1).tolist()
        return torch.tensor([self.value.get((self.texts[a], self.texts[b]), 0.0)
                             for a, b in zip(i, j, strict=True)])


def test_mbr_comet_picks_the_candidate_of_highest_expected_comet():
    # b scores 0.9 against a and c; a scores 0.5 against b, 0.1 against c; c 0.2 against a
    fake = FakeComet({("b", "a"): 0.9, ("b", "c"): 0.9, ("a", "b"): 0.5, ("a", "c"): 0.1,
                      ("c", "a"): 0.2})
    (eu,) = comet_utilities(fake, ["src"], [["a", "b", "c", "b"]])
    # b's others: a, c, b (itself once more, the other copy: 0); a's: b, c, b
    assert eu == pytest.approx([(0.5 + 0.1 + 0.5) / 3, (0.9 + 0.9) / 3, 0.2 / 3, (0.9 + 0.9) / 3])
    assert sorted(fake.embedded) == ["a", "b", "c", "src"]  # once each


def test_translate_prints_comet_beside_bleu_and_chrf(tiny_data_dir, tmp_path, models, test_en,
                                                     capsys):
    ckpt = save_tiny_checkpoint(tmp_path / "m.pt", (tiny_data_dir / "spm.model").read_bytes())
    ref = tiny_data_dir / "test.clean.de"
    out = tmp_path / "hyp"
    result = translate(config(checkpoint=ckpt, input=test_en, output=out, ref=ref,
                                        comet=models["regression_metric"], ))
    hyps = out.read_text(encoding="utf-8").splitlines()
    comet = load_comet(str(models["regression_metric"]))
    expected = comet.score(test_en.read_text().splitlines(), hyps, ref.read_text().splitlines())
    assert result.scores.comet == pytest.approx(sum(expected) / len(expected), abs=1e-6)
    assert "COMET = " in capsys.readouterr().err
    # CometKiwi: a column of each line's score, and their mean
    result = translate(config(checkpoint=ckpt, input=test_en, output=out,
                                        comet=models["unified_metric"]))
    lines = out.read_text(encoding="utf-8").splitlines()
    kiwi = load_comet(str(models["unified_metric"]))
    qe = kiwi.qe(test_en.read_text().splitlines(), hyps)
    assert [line.split("\t")[0] for line in lines] == hyps
    assert [float(line.split("\t")[1]) for line in lines] == pytest.approx(qe, abs=1e-4)
    assert result.comet_qe_mean == pytest.approx(sum(qe) / len(qe))


def test_translate_mbr_with_comet(tiny_data_dir, tmp_path, models, test_en, monkeypatch):
    ckpt = save_tiny_checkpoint(tmp_path / "m.pt", (tiny_data_dir / "spm.model").read_bytes())
    seen = []
    real = comet_utilities
    monkeypatch.setattr(nmt.wings.mbr, "comet_utilities",  # rerank imports it when used
                        lambda c, s, t: seen.append((s, t)) or real(c, s, t))
    out = tmp_path / "hyp"
    translate(config(checkpoint=ckpt, input=test_en, output=out,
                               comet=models["regression_metric"], **{"mbr.candidates": 4,
                                                                     "mbr.utility": "comet"}))
    sources, texts = seen[0]
    assert sources == test_en.read_text().splitlines() and all(len(t) == 4 for t in texts)
    assert len(out.read_text().splitlines()) == len(sources)


def test_nmt_serve_mbr_with_comet_answers_as_nmt_translate(tiny_data_dir, tmp_path, models,
                                                           test_en):
    """A server with comet=DIR answers a request's "mbr_utility": "comet" with nmt-translate's
    choice for the same candidates; one without it refuses the field (422)."""
    from test_serve import InProcess

    ckpt = save_tiny_checkpoint(tmp_path / "m.pt", (tiny_data_dir / "spm.model").read_bytes())
    lines = test_en.read_text().splitlines()[:4]
    (tmp_path / "src").write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "hyp"
    translate(config(checkpoint=ckpt, input=tmp_path / "src", output=out, split="none",
                     comet=models["regression_metric"],
                     **{"mbr.candidates": 4, "mbr.utility": "comet", "search.max_len_b": 8}))
    server = InProcess(ckpt, f"comet={models['regression_metric']}", "split=paragraph",
                       "search.beam_size=1")
    try:
        status, _, body = server.call("POST", "/translate", {
            "text": lines, "mbr_candidates": 4, "mbr_utility": "comet"})
        assert status == 200, body
        assert [t["text"] for t in body["translations"]] == out.read_text().splitlines()
    finally:
        server.stop()
    plain = InProcess(ckpt)
    try:
        status, _, body = plain.call("POST", "/translate", {
            "text": lines[:1], "mbr_candidates": 4, "mbr_utility": "comet"})
        assert (status, body["field"]) == (422, "mbr_utility") and "comet=DIR" in body["error"]
    finally:
        plain.stop()


def test_comet_errors_are_one_line(tmp_path, models, tiny_data_dir, test_en):
    with pytest.raises(NmtError, match=r"no hparams.yaml: give a COMET model directory"):
        load_comet(str(tmp_path / "nothing"))
    other = tmp_path / "xcomet"
    shutil.copytree(models["regression_metric"], other)
    hp = (other / "hparams.yaml").read_text().replace("regression_metric", "xcomet_metric")
    (other / "hparams.yaml").write_text(hp)
    with pytest.raises(NmtError, match="class_identifier 'xcomet_metric' is not a COMET form"):
        load_comet(str(other))
    ckpt = save_tiny_checkpoint(tmp_path / "m.pt", (tiny_data_dir / "spm.model").read_bytes())
    with pytest.raises(ConfigError, match="reference-based COMET-22 .* give ref=FILE"):
        translate(config(checkpoint=ckpt, input=test_en,
                                   comet=models["regression_metric"]))
    with pytest.raises(ConfigError, match="mbr.utility: comet needs comet=DIR"):
        config(checkpoint=ckpt, **{"mbr.candidates": 2, "mbr.utility": "comet"})
    with pytest.raises(ConfigError, match="mbr.utility: comet needs comet=DIR"):
        to_object(compose("serve", [f"checkpoint={ckpt}", "mbr.utility=comet"]), ServeConfig)
    with pytest.raises(NmtError, match="MBR needs a reference-based COMET-22"):
        translate(config(checkpoint=ckpt, input=test_en,
                                   comet=models["unified_metric"],
                                   **{"mbr.candidates": 2, "mbr.utility": "comet"}))


@pytest.mark.parametrize(("hparams", "error"), [
    (b"- pretrained_model\n- xlm-roberta\n", "is a YAML list, not a mapping"),
    (b"plain words\n", "is a YAML str, not a mapping"),
    (b"layer: [mix\n", "cannot be read as YAML: "),
    (b"layer: \x80\n", "cannot be read as YAML: "),
])
def test_an_hparams_yaml_that_is_no_mapping_is_one_line_naming_it(tmp_path, models, hparams,
                                                                    error):
    other = tmp_path / "model"
    shutil.copytree(models["regression_metric"], other)
    (other / "hparams.yaml").write_bytes(hparams)
    with pytest.raises(NmtError) as e:
        load_comet(str(other))
    assert str(e.value).startswith(f"{other / 'hparams.yaml'}: {error}")
    assert "\n" not in str(e.value)


def test_a_checkpoint_whose_hyper_parameters_are_no_mapping_is_one_line(tmp_path, models):
    other = tmp_path / "model"
    shutil.copytree(models["regression_metric"], other)
    path = other / "checkpoints" / "model.ckpt"
    torch.save({**torch.load(path, weights_only=True), "hyper_parameters": ["layer"]}, path)
    with pytest.raises(NmtError, match=f"^{path}: its hyper_parameters are not a mapping$"):
        load_comet(str(other))


def train_cfg(data: Path, run_dir: Path, *overrides: str) -> TrainConfig:
    """A tiny nmt-train config."""
    tiny = ["model.N=1", "model.d_model=16", "model.d_ff=32", "model.h=2", "train.device=cpu",
            "search.max_len_b=8"]
    return to_object(compose("train", ["+model=small", f"data_dir={data}",
                                       f"run_dir={run_dir}", *tiny, *overrides]), TrainConfig)


def test_validation_scores_comet_and_picks_the_best_by_it(tiny_data_dir, tmp_path, models,
                                                           monkeypatch):
    with pytest.raises(ConfigError, match="train.best_metric: comet needs train.comet=DIR"):
        train_cfg(tiny_data_dir, tmp_path / "run", "train.valid_bleu=true",
                  "train.best_metric=comet")
    with pytest.raises(ConfigError, match="train.comet: needs train.valid_bleu=true"):
        train_cfg(tiny_data_dir, tmp_path / "run", f"train.comet={models['unified_metric']}")
    cfg = train_cfg(tiny_data_dir, tmp_path / "run", "train.valid_bleu=true",
                    "train.valid_bleu_max_sentences=5", "train.best_metric=comet",
                    f"train.comet={models['regression_metric']}")
    env = nmt.system.distributed.init("cpu")
    run = build_run(cfg, env, load_data(cfg, env))
    calls = []
    real = nmt.training.validation.score

    def spy(hypotheses, references, tokenize="13a"):
        calls.append((hypotheses, references))
        return real(hypotheses, references, tokenize)

    monkeypatch.setattr(nmt.training.validation, "score", spy)
    result = nmt.training.validation.valid_bleu(run, run.model)
    hyps, refs = calls[0]
    src = (tiny_data_dir / "valid.clean.en").read_text(encoding="utf-8").splitlines()[:5]
    expected = load_comet(str(models["regression_metric"])).score(src, hyps, refs[0])
    assert result["comet"] == pytest.approx(sum(expected) / 5, abs=1e-6)
    # higher is better: a validation of lower COMET than the best is no new best
    monkeypatch.setattr(nmt.training.validation, "validate", lambda r: {
        "loss": 1.0, "nll": 1.0, "ppl": 2.7, "comet": result["comet"], "weights": "model"})
    run.best = result["comet"] + 1.0
    assert not nmt.training.validation.validate_and_track(run, None)
    run.best = result["comet"] - 1.0
    assert nmt.training.validation.validate_and_track(run, None)
    assert run.best == result["comet"]


def test_preprocess_drops_pairs_below_the_qe_minimum(tmp_path, models, monkeypatch):
    from nmt.data.corpus import TextCorpus

    src = [f"satz {i}" for i in range(12)]
    tgt = [f"sentence {i}" for i in range(12)]
    (tmp_path / "c.en").write_text("\n".join(src) + "\n")
    (tmp_path / "c.de").write_text("\n".join(tgt) + "\n")
    kiwi = load_comet(str(models["unified_metric"]))
    scores = kiwi.qe(src, tgt)
    minimum = sorted(scores)[4]  # 4 pairs below it
    clean = CleanConfig(comet_qe=str(models["unified_metric"]), comet_qe_min=minimum)
    counts = [dict.fromkeys(nmt.data.cleaning.COUNTS)]
    corpus = TextCorpus("train", "c", 12, tmp_path / "c.en", tmp_path / "c.de")
    text = nmt.data.cleaning.clean_split([corpus], clean, tmp_path / "o.en", tmp_path / "o.de",
                                         counts, qe=quality_filter(clean))
    kept = [s for s, q in zip(src, scores, strict=True) if q >= minimum]
    assert counts[0]["comet_qe"] == 4 and counts[0]["kept"] == 8 and text.pairs == 8
    assert (tmp_path / "o.en").read_text().splitlines() == kept
    with pytest.raises(ConfigError, match="clean.comet_qe_min: needs clean.comet_qe=DIR"):
        CleanConfig(comet_qe_min=0.5)
    with pytest.raises(NmtError, match="reference-based COMET-22; filtering pairs needs"):
        quality_filter(CleanConfig(comet_qe=str(models["regression_metric"])))


class KnownScores:
    """A stand-in COMET of known scores: qe() gives score[mt], score() the mean-free value
    len(mt) / 10; the form as asked."""

    def __init__(self, needs_reference: bool, qe: dict[str, float] | None = None):
        self.spec = type("Spec", (), {"needs_reference": needs_reference})()
        self.table, self.calls = qe or {}, []

    def qe(self, sources, hypotheses, progress=False):
        self.calls.append(list(sources))
        return [self.table[h] for h in hypotheses]

    def score(self, sources, hypotheses, references, progress=False):
        self.calls.append(list(sources))
        return [len(h) / 10 for h in hypotheses]


def test_the_filter_drops_by_a_fake_scorers_known_values(tmp_path, monkeypatch):
    from nmt.data.corpus import TextCorpus

    tgt = [f"t{i}" for i in range(10)]
    (tmp_path / "c.en").write_text("".join(f"s{i}\n" for i in range(10)))
    (tmp_path / "c.de").write_text("\n".join(tgt) + "\n")
    fake = KnownScores(False, {t: i / 10 for i, t in enumerate(tgt)})
    monkeypatch.setattr(comet_module, "load_comet", lambda path, device: fake)
    counts = [dict.fromkeys(nmt.data.cleaning.COUNTS)]
    corpus = TextCorpus("train", "c", 10, tmp_path / "c.en", tmp_path / "c.de")
    clean = CleanConfig(comet_qe="fake", comet_qe_min=0.45)
    nmt.data.cleaning.clean_split([corpus], clean, tmp_path / "o.en", tmp_path / "o.de", counts,
                                  qe=quality_filter(clean))
    assert counts[0]["comet_qe"] == 5 and counts[0]["kept"] == 5  # 0.0 .. 0.4 dropped
    assert (tmp_path / "o.de").read_text().splitlines() == tgt[5:]
    assert fake.calls == [[f"s{i}" for i in range(10)]]  # one batch of the chunk's pairs


def test_validation_takes_a_fake_scorers_known_values(tiny_data_dir, tmp_path, monkeypatch):
    fake = KnownScores(True)
    monkeypatch.setattr(nmt.commands.train, "load_comet", lambda path, device: fake)
    cfg = train_cfg(tiny_data_dir, tmp_path / "run", "train.valid_bleu=true",
                    "train.valid_bleu_max_sentences=4", "train.comet=fake")
    env = nmt.system.distributed.init("cpu")
    run = build_run(cfg, env, load_data(cfg, env))
    seen = []
    real = nmt.training.validation.score
    monkeypatch.setattr(nmt.training.validation, "score", lambda h, r, t="13a": seen.append(
        h) or real(h, r, t))
    result = nmt.training.validation.valid_bleu(run, run.model)
    assert result["comet"] == pytest.approx(sum(len(h) / 10 for h in seen[0]) / 4)
    src = (tiny_data_dir / "valid.clean.en").read_text(encoding="utf-8").splitlines()[:4]
    assert fake.calls == [src]
