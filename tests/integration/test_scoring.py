"""Scoring options: sacreBLEU's tokenizer and several references, in nmt-translate and in
validation, through the one scorer nmt.metrics.scoring.score."""

import shutil
from pathlib import Path

import pytest
from translate_helpers import save_tiny_checkpoint, translate_config

import nmt.system.distributed
import nmt.training.validation
from nmt.commands.train import build_run, load_data, train
from nmt.commands.translate import translate
from nmt.config import TrainConfig, TranslateConfig, compose, to_object
from nmt.errors import ConfigError, NmtError
from nmt.metrics.scoring import Scores, bleu_tokenize_error, score
from nmt.training.validation import valid_bleu

pytestmark = pytest.mark.usefixtures("one_thread")

HYPS = ["the cat sat on the mat", "a dog barked twice"]
REF_A = ["the cat is on the mat", "one dog barked twice"]
REF_B = ["the cat sat on the mat", "a dog barked twice"]


def test_a_second_reference_counts():
    one = score(HYPS, REF_A)
    both = score(HYPS, [REF_A, REF_B])
    assert both.bleu == pytest.approx(100.0) and one.bleu < 100.0
    assert "nrefs:1|" in one.bleu_signature and "nrefs:2|" in both.bleu_signature
    assert score(HYPS, [REF_A]).bleu == one.bleu  # one stream given either way


@pytest.mark.parametrize("tokenize", ["13a", "intl", "zh", "char", "none"])
def test_the_tokenizer_is_sacrebleus(tokenize):
    from sacrebleu.metrics import BLEU

    hyps, refs = ["他是一个好人。", "Hello, world!"], ["他是好人。", "Hello world!"]
    got = score(hyps, refs, tokenize)
    assert got.bleu == pytest.approx(BLEU(tokenize=tokenize).corpus_score(hyps, [refs]).score)
    assert f"tok:{tokenize}|" in got.bleu_signature


def test_the_tokenizer_changes_the_score():
    hyps, refs = ["他是一个好人。"], ["他是好人。"]
    assert score(hyps, refs, "zh").bleu != score(hyps, refs, "13a").bleu


def test_unknown_or_unavailable_tokenizers_are_config_errors():
    assert "unknown sacreBLEU tokenizer 'klingon'" in bleu_tokenize_error("klingon")
    with pytest.raises(ConfigError, match=r"^bleu_tokenize: unknown sacreBLEU tokenizer"):
        translate(to_object(compose("translate", ["checkpoint=c", "bleu_tokenize=klingon"]),
                            TranslateConfig))
    with pytest.raises(ConfigError, match=r"^train.bleu_tokenize: "):
        train(to_object(compose("train", ["+model=tiny", "data_dir=d", "run_dir=r",
                                          "train.bleu_tokenize=klingon"]), TrainConfig))
    why = bleu_tokenize_error("ja-mecab")  # None where sacrebleu[ja] is installed
    assert why is None or "ja-mecab" in why


# ----------------------------------------------------------------------------- nmt-translate
@pytest.fixture(scope="module")
def ckpt(tiny_data_dir, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("run") / "checkpoint_last.pt"
    return save_tiny_checkpoint(path, (tiny_data_dir / "spm.model").read_bytes(), seed=0)


def translate_cfg(**kw) -> TranslateConfig:
    """Greedy, in this process."""
    return translate_config(**{"search.beam_size": 1, "workers": 1, **kw})


@pytest.mark.slow
def test_translate_with_two_references_and_a_tokenizer(ckpt, tiny_data_dir, tmp_path):
    src, ref = tiny_data_dir / "test.clean.en", tiny_data_dir / "test.clean.de"
    hyp = tmp_path / "hyp.de"
    first = translate(translate_cfg(checkpoint=ckpt, input=src, output=hyp))
    mirror = tmp_path / "mirror.de"  # a second reference equal to the output: BLEU 100
    shutil.copy(hyp, mirror)
    out = translate(translate_cfg(checkpoint=ckpt, input=src, output=hyp, ref=ref,
                                  refs=f"[{mirror}]", bleu_tokenize="intl"))
    assert out.hypotheses == first.hypotheses
    assert out.scores.bleu == pytest.approx(100.0)
    assert "nrefs:2|" in out.scores.bleu_signature
    assert "tok:intl|" in out.scores.bleu_signature
    only = translate(translate_cfg(checkpoint=ckpt, input=src, output=hyp, refs=f"[{ref}]"))
    assert only.scores.bleu == score(first.hypotheses, ref.read_text().splitlines()
                                          ).bleu  # refs=[FILE] alone is ref=FILE


def test_a_short_extra_reference_is_a_one_line_error(ckpt, tiny_data_dir, tmp_path):
    short = tmp_path / "short.de"
    short.write_text("eins\n", encoding="utf-8")
    with pytest.raises(NmtError, match=f"^{short}: 1 reference lines but 40 input lines$"):
        translate(translate_cfg(checkpoint=ckpt, input=tiny_data_dir / "test.clean.en",
                                output=tmp_path / "h.de", ref=tiny_data_dir / "test.clean.de",
                                refs=f"[{short}]"))
    assert not (tmp_path / "h.de").exists()


# ----------------------------------------------------------------------------- validation
def train_cfg(data_dir, run_dir, *overrides) -> TrainConfig:
    tiny = ["model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=4", "train.threads=1",
            "train.max_tokens=256"]
    return to_object(compose("train", ["+model=tiny", f"data_dir={data_dir}",
                                       f"run_dir={run_dir}", *tiny, *overrides]), TrainConfig)


def test_validation_scores_every_reference_with_the_tokenizer(tiny_data_dir, tmp_path,
                                                              monkeypatch):
    extra = tmp_path / "valid.extra.de"
    extra.write_text("".join(f"reference {i}\n" for i in range(40)), encoding="utf-8")
    cfg = train_cfg(tiny_data_dir, tmp_path / "run", "train.valid_bleu=true",
                    "train.valid_bleu_max_sentences=5", f"train.valid_refs=[{extra}]",
                    "train.bleu_tokenize=char")
    calls = []

    def spy(hypotheses, references, tokenize="13a"):
        calls.append((hypotheses, references, tokenize))
        return Scores(1.0, 2.0, "", "", "", "")

    monkeypatch.setattr(nmt.training.validation, "score", spy)
    closed = []
    real_close = nmt.training.validation.Translator.close
    monkeypatch.setattr(nmt.training.validation.Translator, "close",
                        lambda self: closed.append(self) or real_close(self))
    env = nmt.system.distributed.init("cpu")
    run = build_run(cfg, env, load_data(cfg, env))
    result = valid_bleu(run, run.model)
    assert len(closed) == 1  # its workers stopped: not one pool more at every validation
    hyps, refs, tokenize = calls[0]
    raw = (tiny_data_dir / "valid.clean.de").read_text(encoding="utf-8").splitlines()
    assert tokenize == "char" and len(hyps) == 5
    assert refs == [raw[:5], [f"reference {i}" for i in range(5)]]
    assert result["bleu"] == 1.0 and result["bleu_sentences"] == 5


def test_a_short_valid_reference_fails_before_training(tiny_data_dir, tmp_path):
    short = tmp_path / "short.de"
    short.write_text("eins\n", encoding="utf-8")
    cfg = train_cfg(tiny_data_dir, tmp_path / "run", "train.valid_bleu=true",
                    f"train.valid_refs=[{short}]")
    with pytest.raises(NmtError, match=f"^{short}: 1 reference lines but 40 valid pairs$"):
        load_data(cfg, nmt.system.distributed.init("cpu"))
    with pytest.raises(ConfigError, match="train.valid_refs: needs train.valid_bleu=true"):
        train_cfg(tiny_data_dir, tmp_path / "run", f"train.valid_refs=[{short}]")
