"""Several language pairs in one data directory and one model (issue 32, items 1-3):
nmt-preprocess's corpora with languages, held-out valid/test sentences, temperature sampling,
per-direction validation, and choosing the target language in nmt-translate, nmt-serve and
the exports."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from multi_helpers import corpus, multi_overrides, write_raw
from test_train import config as train_config
from test_train import same_tensors

from nmt.commands.preprocess import preprocess
from nmt.commands.train import load_data, train
from nmt.commands.translate import translate
from nmt.config import PreprocessConfig, TranslateConfig, compose, to_object
from nmt.data.arrays import ParallelData
from nmt.data.batches import temperature_weights
from nmt.data.manifest import FORMAT, Corpus, directions, read_manifest
from nmt.data.tokenizer import Tokenizer
from nmt.data.vocab import TAG, Languages
from nmt.errors import ConfigError, NmtError
from nmt.system import distributed
from nmt.training.checkpoint import load_checkpoint

LANGS = ("de", "en", "fr")


def preprocess_config(*overrides: str) -> PreprocessConfig:
    """nmt-preprocess's config composed as the command line would."""
    return to_object(compose("preprocess", list(overrides)), PreprocessConfig)


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> dict:
    """write_raw's toy en-de and en-fr text."""
    return write_raw(tmp_path_factory.mktemp("raw"))


@pytest.fixture(scope="module")
def multi_dir(raw, tmp_path_factory) -> Path:
    """en->de, de->en and en->fr in one data directory."""
    out = tmp_path_factory.mktemp("multi") / "data"
    preprocess(preprocess_config(*multi_overrides(raw, out)))
    return out


@pytest.fixture(scope="module")
def multi_run(multi_dir, tmp_path_factory) -> Path:
    """A tiny model trained on multi_dir for 80 updates, validated with BLEU at 40 and 80."""
    run = tmp_path_factory.mktemp("run")
    train(train_config(multi_dir, run, "train.max_updates=80", "train.valid_interval_updates=40",
                       "train.valid_bleu=true", "search.max_len_b=8", "train.temperature=2",
                       "model.dropout=0", "optim.warmup=30", "optim.lr_factor=3"))
    return run


# ----------------------------------------------------------------------------- 1. preprocess
def test_several_pairs_share_one_vocabulary_with_whole_language_tokens(multi_dir, raw, capsys):
    m = read_manifest(multi_dir)
    tok = Tokenizer.from_file(multi_dir / m.spm.src)
    assert m.format == FORMAT == 3 and m.joint
    assert m.languages == Languages(TAG, {lang: tok.piece_id(f">>{lang}<<") for lang in LANGS})
    assert m.languages.codes["fr"] in tok.encode([">>fr<< open file"])[0]  # one piece
    pairs = [(c.src_lang, c.tgt_lang, c.tag) for c in m.corpora]
    assert pairs == [("en", "de", ">>de<<"), ("de", "en", ">>en<<"), ("en", "fr", ">>fr<<")]
    for split in ("train", "valid", "test"):  # every source starts with its target's token
        data = ParallelData(multi_dir, split, m)
        for part in directions(m, split):
            (first, n), = part.ranges
            code = m.languages.codes[part.tgt_lang]
            assert all(data.src[i][0] == code for i in range(first, first + n))
            assert all(code not in data.tgt[i] for i in range(first, first + n))
    de_en = directions(m, "valid")[1]
    assert (de_en.src_lang, de_en.tgt_lang, de_en.ranges) == ("de", "en", [(10, 10)])
    clean = (multi_dir / m.clean["valid"].src).read_text("utf-8").splitlines()
    assert clean[10:20] == Path(raw["en-de"]["valid"] + ".de").read_text("utf-8").splitlines()


def test_valid_and_test_sentences_are_held_out_of_every_pairs_training_data(multi_dir, raw):
    m = read_manifest(multi_dir)
    held = {(lang, line) for pair in raw.values() for split in ("valid", "test")
            for lang in ("en", pair_lang(pair)) for line in read(pair[split], lang)}
    expected = []
    for c in m.corpora:
        pair = raw[f"en-{'fr' if 'fr' in (c.src_lang, c.tgt_lang) else 'de'}"]["train"]
        src, tgt = read(pair, c.src_lang), read(pair, c.tgt_lang)
        expected.append(sum((c.src_lang, s) in held or (c.tgt_lang, t) in held
                            for s, t in zip(src, tgt, strict=True)))
    assert [c.counts["held_out"] for c in m.corpora] == expected
    assert expected[2] >= 5  # en-de's test English, put in en-fr's training data, among them
    assert m.counts["train"]["held_out"] == sum(expected)
    assert m.counts["valid"]["held_out"] is None


def pair_lang(pair: dict) -> str:
    """The non-English language of write_raw's pair."""
    return Path(pair["train"]).name.split("-")[0]


def read(prefix: str, lang: str) -> list[str]:
    """The lines of PFX.lang."""
    return Path(f"{prefix}.{lang}").read_text("utf-8").splitlines()


def test_an_older_manifest_reads_as_one_language_pair(corpora_dir, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(corpora_dir, old)
    manifest = json.loads((old / "manifest.json").read_text("utf-8"))
    manifest["format"] = 2  # what nmt-preprocess wrote before: no languages, no sections
    (old / "manifest.json").write_text(json.dumps(manifest), "utf-8")
    m = read_manifest(old)
    assert directions(m, "train") == directions(m, "valid") == []
    assert len(m.training_corpora()) == 2
    data = load_data(train_config(old, tmp_path / "run", "train.temperature=5"),
                     distributed.init("cpu"))
    assert data.train.weights == [1.0, 2.0]  # the corpus weights, no temperature
    assert data.vocab.languages is None  # its checkpoints record none


def test_a_reused_vocabulary_keeps_the_language_tokens_or_is_refused(multi_dir, raw,
                                                                     corpora_dir, tmp_path):
    args = multi_overrides(raw, tmp_path / "re")
    reused = preprocess(preprocess_config(*args, f"bpe.model={multi_dir}"))
    assert reused.languages == read_manifest(multi_dir).languages
    assert reused.vocab_sha256 == read_manifest(multi_dir).vocab_sha256
    with pytest.raises(NmtError, match=r"^train\[0\].tgt_lang=de: the reused SentencePiece "
                                       r"model .* has no such piece \(>>de<<\)") as e:
        preprocess(preprocess_config(*multi_overrides(raw, tmp_path / "no"),
                                     f"bpe.model={corpora_dir}"))
    assert "\n" not in str(e.value) and not (tmp_path / "no").exists()


@pytest.mark.parametrize("train,error", [
    ("[{path:a,src_lang:en}]", r"train\[0\].tgt_lang: give both src_lang and tgt_lang"),
    ("[{path:a,src_lang:en,tgt_lang:en}]", r"train\[0\].tgt_lang: must differ from src_lang"),
    ("[{path:a,src_lang:EN,tgt_lang:de}]", r"train\[0\].src_lang: must be an ISO 639 code"),
    ("[{path:a,src_lang:en,tgt_lang:de,tag:'<BT>'}]", r"train\[0\].tag: a corpus with languages"),
    ("[{path:a,src_lang:en,tgt_lang:de},b]", r"train: give src_lang and tgt_lang to every"),
])
def test_corpora_languages_are_checked_naming_the_key(train, error):
    with pytest.raises(ConfigError, match=error) as e:
        preprocess_config("src_lang=src", "tgt_lang=tgt", "out_dir=x", f"train={train}")
    assert "\n" not in str(e.value)


def test_a_multilingual_train_split_needs_languages_on_valid_and_test():
    with pytest.raises(ConfigError, match=r"^valid: a multilingual train split needs"):
        preprocess_config("src_lang=src", "tgt_lang=tgt", "out_dir=x", "valid=v",
                          f"train=[{corpus('a', 'en', 'de')}]")
    with pytest.raises(ConfigError, match=r"valid\[0\].weight: applies to train corpora only"):
        preprocess_config("src_lang=src", "tgt_lang=tgt", "out_dir=x", "valid=[{path:v,weight:2}]",
                          "train=a")


# ----------------------------------------------------------------------------- 2. training
def test_temperature_composes_with_corpus_weights():
    corpora = [Corpus(str(i), "", 0, pairs, 0, 0, "en", tgt)
               for i, (tgt, pairs) in enumerate((("de", 800), ("de", 100), ("fr", 100)))]
    weights = [1.0, 2.0, 1.0]  # en-de: 1000 sentences an epoch, en-fr 100
    assert temperature_weights(corpora, weights, 1.0) == pytest.approx(weights)
    for t in (2.0, 5.0, 1e6):
        got = temperature_weights(corpora, weights, t)
        sizes = [got[0] * 800 + got[1] * 200 / 2, got[2] * 100]
        assert sum(sizes) == pytest.approx(1100)  # the epoch keeps its size
        assert sizes[0] / sizes[1] == pytest.approx(10 ** (1 / t))  # fairseq's (n_p / N)^(1/T)
        assert got[1] / got[0] == pytest.approx(2.0)  # a pair's corpora keep their ratio
    assert temperature_weights(corpora, [0.0, 0.0, 1.0], 5.0) == [0.0, 0.0, 1.0]


def test_validation_is_per_direction_and_the_best_is_their_mean(multi_run):
    records = [json.loads(line) for line in (multi_run / "metrics.jsonl").open()]
    valid = [r for r in records if r["kind"] == "valid"]
    assert [r["update"] for r in valid] == [40, 80]
    names = ("en-de", "de-en", "en-fr")
    for r in valid:
        for metric in ("loss", "nll", "bleu", "chrf"):
            assert r[metric] == pytest.approx(sum(r[f"{metric}/{n}"] for n in names) / 3)
        assert r["ppl"] == pytest.approx(math.exp(r["nll"]))
    best = load_checkpoint(multi_run / "checkpoint_best.pt")
    assert best["best"]["value"] == min(r["loss"] for r in valid)
    vocab = load_checkpoint(multi_run / "checkpoint_last.pt")["vocab"]
    assert vocab["languages"] == {**read_manifest(best_data(multi_run)).languages.to_dict(),
                                  "sources": ["de", "en"]}  # the corpora's source languages


def best_data(run: Path) -> Path:
    """The data directory a run was trained on (its config.yaml)."""
    import yaml

    return Path(yaml.safe_load((run / "config.yaml").read_text())["data_dir"])


def test_a_multilingual_run_with_a_temperature_resumes_bitwise(multi_dir, tmp_path):
    opts = ["train.temperature=3", "train.corpus_weights=[1,0.5,2]", "model.dropout=0.1",
            "train.max_tokens=512"]
    straight, interrupted = tmp_path / "a", tmp_path / "b"
    train(train_config(multi_dir, straight, "train.max_updates=8", *opts))
    train(train_config(multi_dir, interrupted, "train.max_updates=3", *opts))
    train(train_config(multi_dir, interrupted, "train.max_updates=8", *opts))
    a, b = (load_checkpoint(run / "checkpoint_last.pt") for run in (straight, interrupted))
    assert same_tensors(a["model"], b["model"]) and a["iterator"] == b["iterator"]


# ----------------------------------------------------------------------------- 3. translating
def translate_lines(model: Path, lines: list[str], tmp_path: Path, *overrides: str) -> list[str]:
    """nmt-translate's greedy output of `lines`."""
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("".join(line + "\n" for line in lines), "utf-8")
    translate(to_object(compose("translate", [
        f"checkpoint={model}", f"input={src}", f"output={out}", "search.beam_size=1",
        "search.max_len_b=8", "workers=1", "quiet=true", *overrides]), TranslateConfig))
    return out.read_text("utf-8").splitlines()


def test_tgt_lang_chooses_the_language_of_a_trained_model(multi_run, raw, tmp_path):
    model = multi_run / "checkpoint_last.pt"
    lines = read(raw["en-de"]["test"], "en")
    into = {lang: translate_lines(model, lines, tmp_path, f"tgt_lang={lang}")
            for lang in ("de", "fr")}
    assert into["de"] != into["fr"]  # the token matters: toy French words end with é
    assert sum(s.count("é") for s in into["fr"]) > 2 * sum(s.count("é") for s in into["de"])
    for key, error in (("tgt_lang=es", r"tgt_lang=es: .* has no such language \(it has de, en, "
                                       r"fr\)"),
                       ("src_lang=en", r"src_lang=en: .* chooses the target language only")):
        with pytest.raises(ConfigError, match=error) as e:
            translate_lines(model, lines, tmp_path, "tgt_lang=de", key)
        assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def multi_server(multi_run):
    """An in-process nmt-serve of the multilingual model, French by default."""
    from test_serve import InProcess

    srv = InProcess(multi_run / "checkpoint_last.pt", "tgt_lang=fr", "search.beam_size=1")
    yield srv
    srv.stop()


def test_nmt_serve_translates_into_the_language_a_request_asks_for(multi_server, multi_run, raw,
                                                                   tmp_path):
    model = multi_run / "checkpoint_last.pt"
    lines = read(raw["en-de"]["test"], "en")[:6]
    health = multi_server.call("GET", "/health")[2]
    assert (health["languages"], health["tgt_lang"]) == (list(LANGS), "fr")
    for lang in ("de", "fr"):
        got = [t["text"] for t in multi_server.translate(lines, tgt_lang=lang, split="none")]
        assert got == translate_lines(model, lines, tmp_path, f"tgt_lang={lang}")
    default = [t["text"] for t in multi_server.translate(lines, split="none")]
    assert default == translate_lines(model, lines, tmp_path, "tgt_lang=fr")
    for field, value, error in (("tgt_lang", "es", "has no such language (it has de, en, fr)"),
                                ("src_lang", "en", "chooses the target language only")):
        status, _, body = multi_server.call("POST", "/translate", {"text": ["x"], field: value})
        assert status == 422 and error in body["error"] and "\n" not in body["error"], body
    page = multi_server.call("GET", "/")[2]
    assert 'id="tgt"' in page and "features.targets" in page and "body.tgt_lang" in page
    features = multi_server.call("GET", "/health")[2]["features"]
    assert (features["convention"], features["targets"]) == ("tag", list(LANGS))


def test_nmt_serve_cuts_pieces_to_leave_room_for_the_language_token(multi_run, raw, tmp_path):
    """With a tag, a long text's pieces are cut to max_input - 1 tokens, as nmt-translate cuts
    them: none loses its last token (was: pieces of max_input tokens, then truncated)."""
    from test_serve import InProcess

    model = multi_run / "checkpoint_last.pt"
    srv = InProcess(model, "tgt_lang=fr", "search.beam_size=1", "search.max_len_b=8",
                    "max_input_tokens=6")
    try:
        text = " ".join(read(raw["en-de"]["test"], "en")[:3])
        (got,) = srv.translate([text], split="paragraph")
    finally:
        srv.stop()
    assert not got["truncated"] and len(got["pieces"]) > 1
    assert " ".join(p["source"] for p in got["pieces"]) == " ".join(text.split())
    assert got["text"] == translate_lines(model, [text], tmp_path, "tgt_lang=fr",
                                          "max_input_tokens=6", "split=paragraph")[0]


def test_libretranslates_api_offers_every_language_of_a_multilingual_model(multi_server, raw):
    from urllib.parse import urlencode

    status, _, body = multi_server.call("GET", "/languages")
    assert status == 200 and body == [
        {"code": "de", "name": "German", "targets": ["en", "fr"]},
        {"code": "en", "name": "English", "targets": ["de", "fr"]},
        {"code": "fr", "name": "French", "targets": []}]  # trained from de and en only
    lines = read(raw["en-de"]["test"], "en")[:3]
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for lang in ("de", "fr"):
        want = [t["text"] for t in multi_server.translate(lines, tgt_lang=lang)]
        status, _, body = multi_server.call("POST", "/translate", urlencode(
            {"q": lines[0], "source": "en", "target": lang}).encode(), form)
        assert (status, body) == (200, {"translatedText": want[0]})
        status, _, body = multi_server.call("POST", "/translate", {
            "q": lines, "source": "en", "target": lang})
        assert (status, body) == (200, {"translatedText": want})
    status, _, body = multi_server.call("POST", "/translate", urlencode(
        {"q": "x", "source": "en", "target": "es"}).encode(), form)
    assert (status, body) == (400, {"error": "es is not supported (this server translates "
                                             "from de, en into de, en, fr)"})


def test_nmt_serve_refuses_a_language_for_a_bilingual_model(tiny_data_dir, tmp_path):
    from test_serve import InProcess
    from translate_helpers import save_tiny_checkpoint

    model = save_tiny_checkpoint(tmp_path / "bi.pt", (tiny_data_dir / "spm.model").read_bytes())
    srv = InProcess(model)
    try:
        status, _, body = srv.call("POST", "/translate", {"text": ["x"], "tgt_lang": "de"})
        assert status == 422 and "is a bilingual model" in body["error"], body
        assert srv.call("GET", "/health")[2]["languages"] == []
    finally:
        srv.stop()


def test_nmt_serve_refuses_a_default_language_the_model_lacks(multi_run):
    from test_serve import InProcess

    with pytest.raises(ConfigError, match=r"^tgt_lang=es: .* has no such language \(it has de"):
        InProcess(multi_run / "checkpoint_last.pt", "tgt_lang=es")


# ----------------------------------------------------------------------------- exports
def source_pieces(tok: Tokenizer, lines: list[str], lang: str) -> list[list[str]]:
    """The pieces of `lines` with >>lang<< first, as a CTranslate2 user passes them."""
    return [[f">>{lang}<<", *tok.pieces(ids)] for ids in tok.encode(lines)]


@pytest.mark.slow
def test_the_exports_choose_the_language_as_nmt_translate_does(multi_run, raw, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")
    from test_export import run_export, transformers_greedy

    model = multi_run / "checkpoint_last.pt"
    lines = read(raw["en-de"]["test"], "en")
    tok = Tokenizer(load_checkpoint(model)["vocab"]["src_spm"])
    ct2 = ctranslate2.Translator(str(run_export(model, tmp_path / "ct2", "ctranslate2")),
                                 device="cpu", intra_threads=1)
    hf = run_export(model, tmp_path / "hf", "transformers")
    for lang in ("de", "fr"):  # test_export's greedy search: 16 tokens at most
        expected = translate_lines(model, lines, tmp_path, f"tgt_lang={lang}",
                                   "search.max_len_a=0", "search.max_len_b=16")
        results = ct2.translate_batch(source_pieces(tok, lines, lang), beam_size=1,
                                      max_decoding_length=16)
        assert [tok.sp.decode(r.hypotheses[0]) for r in results] == expected
        ids, tokenizer, _ = transformers_greedy(hf, [f">>{lang}<< {line}" for line in lines])
        # its tokens read as nmt reads them (transformers 5.24's decode drops the space of
        # an output's last piece where that is "▁" alone, which nmt's and CTranslate2's keep)
        special = set(tokenizer.all_special_tokens)
        pieces = [[p for p in tokenizer.convert_ids_to_tokens(row) if p not in special]
                  for row in ids]
        assert [tok.sp.decode(p) for p in pieces] == expected
        assert translate_lines(model, lines, tmp_path, f"tgt_lang={lang}", "search.max_len_a=0",
                               "search.max_len_b=16", "engine=ctranslate2") == expected
