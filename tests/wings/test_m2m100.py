"""nmt-import of M2M100 and NLLB-200 (transformers' M2M100ForConditionalGeneration): model
directories built in the test become nmt checkpoints that tokenize as M2M100Tokenizer and
NllbTokenizer do (the source language token first), decode greedily to the tokens of
transformers' generate(forced_bos_token_id=...), translate into the language asked for with
nmt-translate tgt_lang=, export back to transformers, and fine-tune.

The models are random (2+1 layers, d_model 32, ReLU, pre-norm, weights drawn wide so that
outputs depend on the source and on the forced language); the SentencePiece model is a BPE
model trained here with fairseq's ids (<unk> 0, <s> 1, </s> 2). M2M100's directory has
vocab.json and M2M100Tokenizer's fixed list of 100 language tokens after it; NLLB's has none
and three language tokens that NllbTokenizer adds (tokenizer.json holds their ids).
"""

import io
import json
import warnings
from functools import cache
from pathlib import Path

import pytest
import torch
from translate_helpers import fine_tune_imported, mean_nll, widen

from nmt.commands.export import export
from nmt.commands.import_ import import_model
from nmt.commands.translate import translate
from nmt.config import ExportConfig, ImportConfig, SearchConfig, TranslateConfig
from nmt.data.languages import choose
from nmt.data.vocab import Vocab
from nmt.engines.translator import Translator
from nmt.errors import ConfigError, NmtError
from nmt.system.files import read_lines
from nmt.training.checkpoint import load_checkpoint

transformers = pytest.importorskip("transformers")
sentencepiece = pytest.importorskip("sentencepiece")

pytestmark = pytest.mark.usefixtures("one_thread")

DATA = Path(__file__).resolve().parents[2] / "scripts" / "data" / "debian-po" / "en-de"
MAX_LEN = 10  # output tokens at most, the forced language token and EOS included
NLLB_CODES = ["deu_Latn", "eng_Latn", "fra_Latn"]


@cache
def bundled(name: str) -> list[str]:
    """A file of the bundled corpus (xz-compressed), as lines."""
    return read_lines(str(DATA / f"{name}.xz"))


def source_lines(n: int = 32) -> list[str]:
    """Short English test lines."""
    return [line for line in bundled("test.en") if len(line) <= 50][:n]


@cache
def fairseq_spm() -> bytes:
    """A BPE SentencePiece model with the ids of NLLB's and M2M100's: <unk> 0, <s> 1, </s> 2."""
    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(bundled("train.en")[:1000] + bundled("train.de")[:1000]),
        model_writer=proto, model_type="bpe", vocab_size=200, unk_id=0, bos_id=1, eos_id=2,
        pad_id=-1, num_threads=1, minloglevel=2, input_sentence_size=0)
    return proto.getvalue()


def random_model(vocab_size: int, seed: int):
    """A random M2M100 model with fairseq's special ids, its weights drawn wide."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    config = M2M100Config(
        vocab_size=vocab_size, d_model=32, encoder_layers=2, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=128, scale_embedding=True, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, dropout=0.0)
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config).eval()
    widen(model, seed)
    return model


def end_some(model, batch: dict, forced: int) -> None:
    """EOS's output row a noisy copy of the most frequent output token's: some outputs end."""
    out = hf_greedy(model, batch, forced)
    top = torch.tensor([t for seq in out for t in seq[1:]]).mode().values
    with torch.no_grad():
        w = model.get_output_embeddings().weight
        w[2] = w[top] + 0.3 * w[top].std() * torch.randn(w.size(1))


def hf_greedy(model, batch: dict, forced: int) -> list[list[int]]:
    """generate(num_beams=1, forced_bos_token_id=forced) ids without the start token, the
    padding and the final EOS (the forced language token first)."""
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    with torch.no_grad():
        out = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=MAX_LEN,
                             min_new_tokens=1, forced_bos_token_id=forced,
                             bad_words_ids=[[pad]], forced_eos_token_id=None)
    ids = [[t for t in row[1:] if t != pad] for row in out.tolist()]
    return [row[:-1] if row and row[-1] == eos else row for row in ids]


def save_random(d: Path, tokenizer, vocab_size: int, seed: int, target: int) -> Path:
    """random_model beside its tokenizer in `d`, some of its outputs into `target` ending
    (end_some)."""
    model = random_model(vocab_size, seed)
    end_some(model, tokenizer(source_lines(), return_tensors="pt", padding=True), target)
    model.save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


def imported(directory: Path, out: Path) -> Path:
    """nmt-import of a transformers directory."""
    import_model(ImportConfig(input=str(directory), output=str(out)))
    return out


@pytest.fixture(scope="module")
def m2m_dir(tmp_path_factory) -> Path:
    """An M2M100 directory as facebook/m2m100_418M ships it (vocab.json, the .spm model)."""
    from transformers import M2M100Tokenizer

    d = tmp_path_factory.mktemp("m2m100")
    (d / "sentencepiece.bpe.model").write_bytes(fairseq_spm())
    sp = sentencepiece.SentencePieceProcessor(model_proto=fairseq_spm())
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i in range(3, sp.get_piece_size()):
        vocab[sp.id_to_piece(i)] = len(vocab)
    (d / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    tokenizer = M2M100Tokenizer(str(d / "vocab.json"), str(d / "sentencepiece.bpe.model"),
                                src_lang="en", tgt_lang="de")
    # 8 made-up tokens past the language codes
    return save_random(d, tokenizer, len(vocab) + len(tokenizer.lang_code_to_id) + 8, 1,
                       tokenizer.get_lang_id("de"))


@pytest.fixture(scope="module")
def nllb_dir(tmp_path_factory) -> Path:
    """An NLLB-200 directory: the .spm model and tokenizer.json with the language tokens."""
    from transformers import NllbTokenizer

    d = tmp_path_factory.mktemp("nllb")
    (d / "sentencepiece.bpe.model").write_bytes(fairseq_spm())
    tokenizer = NllbTokenizer.from_pretrained(d, additional_special_tokens=NLLB_CODES,
                                              src_lang="eng_Latn")
    return save_random(d, tokenizer, len(tokenizer), 2, tokenizer.convert_tokens_to_ids("deu_Latn"))


@pytest.fixture(scope="module")
def m2m_pt(m2m_dir, tmp_path_factory) -> Path:
    return imported(m2m_dir, tmp_path_factory.mktemp("nmt") / "m2m.pt")


@pytest.fixture(scope="module")
def nllb_pt(nllb_dir, tmp_path_factory) -> Path:
    return imported(nllb_dir, tmp_path_factory.mktemp("nmt") / "nllb.pt")


def hf(directory: Path, src_lang: str):
    """transformers' model and tokenizer of a directory."""
    from transformers import AutoTokenizer, M2M100ForConditionalGeneration

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = AutoTokenizer.from_pretrained(directory, src_lang=src_lang)
    return M2M100ForConditionalGeneration.from_pretrained(directory).eval(), tokenizer


def nmt_greedy(checkpoint: Path, text: list[str], src_lang: str, tgt_lang: str,
               fast: bool = False) -> list[list[int]]:
    """nmt's greedy ids with the forced language token first, as hf_greedy's."""
    tr = Translator.load(checkpoint, dtype=None, fast=fast)
    choice = choose(tr.vocab, src_lang, tgt_lang, str(checkpoint))
    search = SearchConfig(beam_size=1, max_len_a=0.0, max_len_b=MAX_LEN)
    hyps = tr.translate_ids(choice.sources(tr.src_tok.encode(text)), search,
                            prefixes=choice.prefixes(len(text), None), parallel=False)
    return [h[0].tokens for h in hyps]


CASES = [("m2m", "en", "de", "fr"), ("nllb", "eng_Latn", "deu_Latn", "fra_Latn")]


@pytest.fixture(params=CASES, ids=[c[0] for c in CASES])
def case(request, m2m_dir, m2m_pt, nllb_dir, nllb_pt):
    """(model directory, checkpoint, source language, two target languages) of each kind."""
    kind, src, tgt, other = request.param
    return ((m2m_dir, m2m_pt) if kind == "m2m" else (nllb_dir, nllb_pt)) + (src, tgt, other)


def test_source_ids_are_the_tokenizers(case):
    directory, checkpoint, src, tgt, _ = case
    _, tokenizer = hf(directory, src)
    tr = Translator.load(checkpoint, dtype=None)
    choice = choose(tr.vocab, src, tgt, str(checkpoint))
    text = source_lines(100) + ["snow ☃ and 1234 digits"]
    ours = [ids + [tr.specials.eos] for ids in choice.sources(tr.src_tok.encode(text))]
    assert ours == tokenizer(text)["input_ids"]
    token = tgt if "_" in tgt else f"__{tgt}__"  # NLLB's deu_Latn, M2M100's __de__
    assert choice.prefix == (tokenizer.convert_tokens_to_ids(token),)
    assert tr.specials.bos == tr.specials.eos == 2 and tr.specials.pad == 1  # starts at </s>
    assert tr.specials.banned == (1,)


def test_greedy_output_is_generate_with_the_forced_language(case):
    directory, checkpoint, src, tgt, other = case
    model, tokenizer = hf(directory, src)
    text = source_lines()
    batch = tokenizer(text, return_tensors="pt", padding=True)
    codes = load_checkpoint(checkpoint)["vocab"]["languages"]["codes"]
    expected = hf_greedy(model, batch, codes[tgt])
    ended = sum(len(seq) < MAX_LEN for seq in expected)
    assert 0 < ended < len(expected), "want outputs that end with EOS and outputs that are cut"
    assert len(set(map(tuple, expected))) > len(expected) // 4, "outputs ignore the source"
    assert nmt_greedy(checkpoint, text, src, tgt) == expected
    assert nmt_greedy(checkpoint, text, src, tgt, fast=True) == expected  # FastModel too
    into_other = hf_greedy(model, batch, codes[other])
    assert [seq[1:] for seq in into_other] != [seq[1:] for seq in expected]
    assert nmt_greedy(checkpoint, text, src, other) == into_other


def test_nmt_translate_writes_the_language_asked_for(case, tmp_path):
    directory, checkpoint, src, tgt, other = case
    model, tokenizer = hf(directory, src)
    text = source_lines(8)
    (tmp_path / "in.txt").write_text("\n".join(text) + "\n")
    batch = tokenizer(text, return_tensors="pt", padding=True)
    codes = load_checkpoint(checkpoint)["vocab"]["languages"]["codes"]
    for lang in (tgt, other):
        cfg = TranslateConfig(checkpoint=str(checkpoint), input=str(tmp_path / "in.txt"),
                              output=str(tmp_path / f"{lang}.txt"), src_lang=src, tgt_lang=lang,
                              workers=1, quiet=True,
                              search=SearchConfig(beam_size=1, max_len_a=0.0, max_len_b=MAX_LEN))
        result = translate(cfg)
        expected = [seq[1:] for seq in hf_greedy(model, batch, codes[lang])]
        assert [h[0].tokens for h in result.nbest] == expected
        assert read_lines(str(tmp_path / f"{lang}.txt")) == result.hypotheses


def test_a_language_the_model_lacks_or_needs_is_one_line(m2m_pt, tmp_path):
    entry = load_checkpoint(m2m_pt)["vocab"]
    vocab = Vocab.from_dict(entry, str(m2m_pt))
    with pytest.raises(ConfigError, match=r"tgt_lang=xx: .* has no such language \(it has af,"):
        choose(vocab, "en", "xx", str(m2m_pt))
    with pytest.raises(ConfigError, match=r"src_lang: .* is multilingual: give the language"):
        choose(vocab, "", "de", str(m2m_pt))
    old = {k: v for k, v in entry.items() if k != "languages"}  # an older checkpoint
    bilingual = Vocab.from_dict(old, "old.pt")
    assert choose(bilingual, "", "", "old.pt").prefix == ()
    with pytest.raises(ConfigError, match=r"tgt_lang=de: old.pt is a bilingual model"):
        choose(bilingual, "", "de", "old.pt")
    (tmp_path / "in.txt").write_text("hello\n")
    with pytest.raises(ConfigError, match=r"tgt_lang=zz: .*has no such language") as e:
        translate(TranslateConfig(checkpoint=str(m2m_pt), input=str(tmp_path / "in.txt"),
                                  output=str(tmp_path / "out.txt"), src_lang="en",
                                  tgt_lang="zz", workers=1))
    assert "\n" not in str(e.value) and not (tmp_path / "out.txt").exists()
    with pytest.raises(ConfigError, match=r"^alignment: not with a forced target language"):
        translate(TranslateConfig(checkpoint=str(m2m_pt), input=str(tmp_path / "in.txt"),
                                  src_lang="en", tgt_lang="de", alignment=True, workers=1))


def test_export_to_transformers_is_the_same_model(case, tmp_path):
    directory, checkpoint, src, tgt, _ = case
    out = export(ExportConfig(checkpoint=str(checkpoint), output=str(tmp_path / "hf"),
                              format="transformers"))
    from transformers import M2M100ForConditionalGeneration

    again = M2M100ForConditionalGeneration.from_pretrained(out).eval()
    original, tokenizer = hf(directory, src)
    batch = tokenizer(source_lines(), return_tensors="pt", padding=True)
    if (out / "tokenizer_config.json").is_file():  # M2M100's languages: its tokenizer too
        exported = hf(out, src)[1](source_lines(), padding=True)["input_ids"]
        assert exported == batch["input_ids"].tolist()
    else:  # NLLB-200's: the ids are the original tokenizer's
        assert (out / "vocab.json").is_file() and directory.name.startswith("nllb")
    forced = load_checkpoint(checkpoint)["vocab"]["languages"]["codes"][tgt]
    assert hf_greedy(again, batch, forced) == hf_greedy(original, batch, forced)
    config = again.generation_config  # starts from </s>, which still ends outputs
    assert config.decoder_start_token_id == config.eos_token_id == 2
    assert config.suppress_tokens == [1]  # PAD only
    ours, theirs = again.state_dict(), original.state_dict()
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, msg=name)


def test_bad_directories_are_one_line(m2m_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("sentencepiece.bpe.model", "vocab.json", "model.safetensors",
                 "tokenizer_config.json"):
        (broken / name).write_bytes((m2m_dir / name).read_bytes())
    config = json.loads((m2m_dir / "config.json").read_text())
    cases = [({**config, "decoder_start_token_id": 0}, "decoder_start_token_id=0"),
             ({**config, "scale_embedding": False}, "scale_embedding=False"),
             ({**config, "d_model": 64}, "weights do not fit config.json")]
    for bad, message in cases:
        (broken / "config.json").write_text(json.dumps(bad))
        with pytest.raises(NmtError, match=message) as e:
            import_model(ImportConfig(input=str(broken), output=str(tmp_path / "x.pt")))
        assert "\n" not in str(e.value) and not (tmp_path / "x.pt").exists()
    (broken / "config.json").write_text(json.dumps(config))
    tokenizer = json.loads((m2m_dir / "tokenizer_config.json").read_text())
    for bad, message in (({**tokenizer, "legacy_behaviour": True}, "legacy_behaviour=True"),
                         ({**tokenizer, "added_tokens_decoder": {"7": {}}}, "without content")):
        (broken / "tokenizer_config.json").write_text(json.dumps(bad))
        with pytest.raises(NmtError, match=message) as e:
            import_model(ImportConfig(input=str(broken), output=str(tmp_path / "x.pt")))
        assert "tokenizer_config.json" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow  # over 2 s
def test_fine_tuning_from_the_imported_checkpoint_lowers_the_loss(m2m_pt, tmp_path):
    from nmt.commands.import_ import model_overrides
    from nmt.commands.train import train
    from nmt.config import ModelConfig, TrainConfig, compose, to_object

    pairs = [(e, d) for e, d in zip(bundled("train.en")[3000:4000],
                                    bundled("train.de")[3000:4000], strict=True)
             if len(e) <= 50 and len(d) <= 60][:220]
    state = load_checkpoint(m2m_pt)
    overrides = model_overrides(ModelConfig(**state["model_cfg"]))
    assert "model.positions=fairseq" in overrides
    # the source language token as a corpus tag
    data, tuned = fine_tune_imported(m2m_pt, pairs, tmp_path, 15, tag="__en__")
    en, de = [e for e, _ in pairs[:200]], [d for _, d in pairs[:200]]
    code = (state["vocab"]["languages"]["codes"]["en"],)
    before, after = mean_nll(m2m_pt, en, de, code), mean_nll(tuned, en, de, code)
    assert after < before - 0.5, (before, after)
    # the data directory and the fine-tuned model keep the import's languages
    assert json.loads((data / "manifest.json").read_text())["languages"] == \
        state["vocab"]["languages"] == load_checkpoint(tuned)["vocab"]["languages"]
    with pytest.raises(NmtError, match="positions='fairseq' != 'paper'"):  # the variant kept
        train(to_object(compose("train", [
            "+model=small", f"data_dir={data}", f"run_dir={tmp_path / 'run2'}",
            *[o for o in overrides if "positions" not in o], f"train.init_from={m2m_pt}",
            "train.max_updates=1"]), TrainConfig))


def test_ctranslate2_engine_translates_into_the_language_asked_for(m2m_dir, m2m_pt, tmp_path):
    pytest.importorskip("ctranslate2")
    model, tokenizer = hf(m2m_dir, "en")
    text = source_lines(8)
    (tmp_path / "in.txt").write_text("\n".join(text) + "\n")
    batch = tokenizer(text, return_tensors="pt", padding=True)
    codes = load_checkpoint(m2m_pt)["vocab"]["languages"]["codes"]
    search = SearchConfig(beam_size=1, max_len_a=0.0, max_len_b=MAX_LEN)
    for lang in ("de", "fr"):
        result = translate(TranslateConfig(
            checkpoint=str(m2m_pt), input=str(tmp_path / "in.txt"), engine="ctranslate2",
            ct2_model=str(tmp_path / "ct2"), output=str(tmp_path / "out.txt"), src_lang="en",
            tgt_lang=lang, workers=1, quiet=True, search=search))
        expected = [seq[1:] for seq in hf_greedy(model, batch, codes[lang])]
        assert [h[0].tokens for h in result.nbest] == expected


@pytest.mark.slow
def test_nmt_serve_forces_the_language_a_request_asks_for(m2m_pt):
    from test_serve import InProcess

    text = source_lines(6)
    tok = Translator.load(m2m_pt, dtype=None).tgt_tok
    srv = InProcess(m2m_pt, "continuous=true", "src_lang=en", f"search.max_len_b={MAX_LEN}",
                    "search.max_len_a=0", "search.beam_size=1")
    try:
        assert srv.call("GET", "/health")[2]["languages"][:3] == ["af", "am", "ar"]
        for lang in ("de", "fr"):
            expected = tok.decode([seq[1:] for seq in nmt_greedy(m2m_pt, text, "en", lang)])
            got = srv.translate(text, tgt_lang=lang, split="none")
            assert [t["text"] for t in got] == expected
        status, _, body = srv.call("POST", "/translate", {"text": ["x"]})  # no tgt_lang
        assert status == 422 and "tgt_lang: the model is multilingual" in body["error"], body
        status, _, body = srv.call("POST", "/translate", {"text": ["x"], "tgt_lang": "de",
                                                          "attention": True})
        assert status == 422 and "attention: not with a forced target" in body["error"], body
    finally:
        srv.stop()
    srv = InProcess(m2m_pt, "continuous=false", "src_lang=en", f"search.max_len_b={MAX_LEN}",
                    "search.max_len_a=0", "search.beam_size=1")
    try:  # the default server, batch by batch: the same translations
        for lang in ("de", "fr"):
            expected = tok.decode([seq[1:] for seq in nmt_greedy(m2m_pt, text, "en", lang)])
            got = srv.translate(text, tgt_lang=lang, split="none")
            assert [t["text"] for t in got] == expected
    finally:
        srv.stop()
