"""nmt-import: a MarianMT (OPUS-MT layout) directory built in the test becomes an nmt checkpoint
that tokenizes as MarianTokenizer does, decodes greedily to transformers' exact tokens,
fine-tunes on data preprocessed with its vocabulary, and exports back to transformers.

The MarianMT model is random (2+1 layers, d_model 32, swish, weights drawn wide so that outputs
depend on the source, a random non-zero final_logits_bias); its two SentencePiece models are
unigram models trained here with OPUS-MT's ids (<unk> 0, <s> 1, </s> 2), and its vocab.json
follows Marian's (</s> 0, <unk> 1, <pad> last) in a shuffled order, so that the ids of
vocab.json and of the .spm models differ as they do in real OPUS-MT models.
"""

import io
import json
import random
import re
import stat
import subprocess
import sys
import warnings
from functools import cache
from pathlib import Path

import pytest
import torch
from translate_helpers import fine_tune_imported, mean_nll, widen

from nmt.commands.export import export
from nmt.commands.import_ import import_model
from nmt.config import (
    ExportConfig,
    ImportConfig,
    SearchConfig,
)
from nmt.data.languages import choose
from nmt.data.vocab import TAG, Languages
from nmt.decoding.batches import translate_ids
from nmt.engines.translator import Translator
from nmt.errors import ConfigError, NmtError
from nmt.system.files import read_lines
from nmt.training.checkpoint import load_checkpoint

transformers = pytest.importorskip("transformers")
sentencepiece = pytest.importorskip("sentencepiece")

pytestmark = pytest.mark.usefixtures("one_thread")

DATA = Path(__file__).resolve().parents[2] / "scripts" / "data" / "debian-po" / "en-de"
BIN = Path(sys.executable).parent
MAX_LEN = 12  # output tokens at most, EOS included


def lines(name: str, start: int, n: int) -> list[str]:
    """Lines start..start+n of a file of the bundled corpus."""
    return bundled(name)[start:start + n]


@cache
def bundled(name: str) -> list[str]:
    """A file of the bundled corpus (xz-compressed), as lines."""
    return read_lines(str(DATA / f"{name}.xz"))


@cache
def opus_spm(name: str, size: int) -> bytes:
    """A unigram SentencePiece model of the first 2000 lines of a bundled file, with OPUS-MT's
    ids: <unk> 0, <s> 1, </s> 2, no <pad>."""
    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines(name, 0, 2000)), model_writer=proto, model_type="unigram",
        vocab_size=size, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1,
        minloglevel=2, input_sentence_size=0)
    return proto.getvalue()


def hf_greedy(model, tokenizer, text: list[str]) -> list[list[int]]:
    """generate(num_beams=1) ids without the start token, the padding and the final EOS."""
    batch = tokenizer(text, return_tensors="pt", padding=True)
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    with torch.no_grad():
        out = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=MAX_LEN,
                             min_new_tokens=1, bad_words_ids=[[pad]], forced_eos_token_id=None)
    ids = [[t for t in row[1:] if t != pad] for row in out.tolist()]
    return [row[:-1] if row and row[-1] == eos else row for row in ids]


def build_marian(tmp_path_factory, codes: tuple[str, ...] = ()) -> Path:
    """A MarianMT model directory as an OPUS-MT model ships it; codes: the target languages
    of a multilingual model, whose tokens >>xx<< vocab.json holds (first, as OPUS-MT's do)."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    d = tmp_path_factory.mktemp("opus-mt")
    work = tmp_path_factory.mktemp("spm")
    src_spm, tgt_spm = opus_spm("train.en", 150), opus_spm("train.de", 170)
    (work / "source.spm").write_bytes(src_spm)
    (work / "target.spm").write_bytes(tgt_spm)
    pieces = set()
    for proto in (src_spm, tgt_spm):
        sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
        pieces |= {sp.id_to_piece(i) for i in range(sp.get_piece_size())}
    pieces = sorted(pieces - {"<unk>", "<s>", "</s>"})
    random.Random(0).shuffle(pieces)  # vocab.json's ids are not the .spm models'
    pieces = [f">>{code}<<" for code in codes] + pieces
    vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}}
    vocab["<pad>"] = V = len(vocab)
    V += 1
    (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sacremoses
        tokenizer = MarianTokenizer(str(work / "source.spm"), str(work / "target.spm"),
                                    str(work / "vocab.json"))
    config = MarianConfig(
        vocab_size=V, decoder_vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, activation_function="swish", max_position_embeddings=256,
        pad_token_id=V - 1, eos_token_id=0, decoder_start_token_id=V - 1,
        forced_eos_token_id=None, scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True)
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    widen(model, seed=0)
    # EOS's output row a noisy copy of the most frequent output token's: some outputs end.
    tag = f">>{codes[0]}<< " if codes else ""
    out = hf_greedy(model, tokenizer, [tag + line for line in lines("test.en", 0, 48)])
    top = torch.tensor([t for seq in out for t in seq]).mode().values
    with torch.no_grad():
        w = model.get_output_embeddings().weight
        w[0] = w[top] + 0.3 * w[top].std() * torch.randn(w.size(1))
        model.final_logits_bias[0, 0] = model.final_logits_bias[0, top]
    model.save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory) -> Path:
    """A bilingual MarianMT directory."""
    return build_marian(tmp_path_factory)


@pytest.fixture(scope="module")
def imported(marian_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("nmt") / "opus.pt"
    import_model(ImportConfig(input=str(marian_dir), output=str(out)))
    return out


def hf_model(directory: Path):
    """transformers' model and tokenizer of a directory."""
    from transformers import AutoTokenizer, MarianMTModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = AutoTokenizer.from_pretrained(directory)
    return MarianMTModel.from_pretrained(directory).eval(), tokenizer


def nmt_greedy(checkpoint: Path, text: list[str]) -> list[list[int]]:
    """nmt's greedy ids, at most MAX_LEN tokens with the EOS, as generate() is run."""
    tr = Translator.load(checkpoint, dtype=None)
    search = SearchConfig(beam_size=1, max_len_a=0.0, max_len_b=MAX_LEN)
    return translate_ids(tr.model, tr.src_tok.encode(text), search, tr.specials)


def test_tokenizer_ids_are_marian_tokenizers(marian_dir, imported):
    _, tokenizer = hf_model(marian_dir)
    tr = Translator.load(imported, dtype=None)
    text = lines("test.en", 0, 200) + ["snow ☃ ₪ and 1234 digits"]  # unknown to both sides
    ours = [ids + [tr.specials.eos] for ids in tr.src_tok.encode(text)]
    assert ours == tokenizer(text)["input_ids"]
    assert tr.specials.bos == tr.specials.pad == tokenizer.pad_token_id  # MarianMT starts at pad
    de = lines("test.de", 0, 200)
    target = tokenizer(text_target=de)  # target.spm's pieces, vocab.json's ids
    theirs = target["labels"] if "labels" in target else target["input_ids"]
    assert [ids + [tr.specials.eos] for ids in tr.tgt_tok.encode(de)] == theirs
    assert tr.tgt_tok.decode(tr.tgt_tok.encode(de)) == tokenizer.batch_decode(
        [ids[:-1] for ids in theirs], skip_special_tokens=True)


def test_greedy_output_is_transformers_generate(marian_dir, imported):
    model, tokenizer = hf_model(marian_dir)
    assert model.final_logits_bias.abs().sum() > 0
    text = lines("test.en", 0, 48)
    expected = hf_greedy(model, tokenizer, text)
    ended = sum(len(seq) < MAX_LEN for seq in expected)
    assert 0 < ended < len(expected), "want outputs that end with EOS and outputs that are cut"
    assert len(set(map(tuple, expected))) > len(expected) // 4, "outputs ignore the source"
    assert nmt_greedy(imported, text) == expected
    fast = Translator.load(imported)  # the prepared fast path too (swish, output bias)
    search = SearchConfig(beam_size=1, max_len_a=0.0, max_len_b=MAX_LEN)
    assert [h[0].tokens for h in fast.translate_ids(fast.src_tok.encode(text), search)] == expected
    state = load_checkpoint(imported)
    assert state["model_cfg"]["activation"] == "swish" and state["model_cfg"]["output_bias"]
    assert state["model_cfg"]["N"] == 2 and state["model_cfg"]["N_dec"] == 1


def test_export_of_an_imported_model_is_the_same_model_in_transformers(marian_dir, imported,
                                                                       tmp_path):
    out = export(ExportConfig(checkpoint=str(imported), output=str(tmp_path / "hf"),
                              format="transformers"))
    again, tokenizer = hf_model(out)
    original, _ = hf_model(marian_dir)
    torch.testing.assert_close(again.final_logits_bias, original.final_logits_bias)
    text = lines("test.en", 0, 48)
    assert hf_greedy(again, tokenizer, text) == hf_greedy(original, tokenizer, text)


def test_fine_tuning_on_data_preprocessed_with_its_vocabulary_lowers_the_loss(imported,
                                                                             tmp_path):
    pairs = [(e, d) for e, d in zip(lines("train.en", 3000, 1000), lines("train.de", 3000, 1000),
                                    strict=True) if len(e.split()) <= 12][:320]  # short strings
    data, tuned = fine_tune_imported(imported, pairs, tmp_path, 20)
    manifest = json.loads((data / "manifest.json").read_text())
    vocab = load_checkpoint(imported)["vocab"]
    assert manifest["vocab_sha256"] == vocab["sha256"] and manifest["joint"]
    assert (manifest["pad_id"], manifest["bos_id"], manifest["eos_id"]) == (
        vocab["pad_id"], vocab["pad_id"], 0)
    src, tgt = [e for e, _ in pairs[:300]], [d for _, d in pairs[:300]]
    before, after = mean_nll(imported, src, tgt), mean_nll(tuned, src, tgt)
    assert after < before - 0.5, (before, after)


@pytest.mark.long  # over 2 s
def test_the_command_imports_and_bad_input_is_one_line(marian_dir, tmp_path):
    def cli(*args):
        return subprocess.run([str(BIN / "nmt-import"), *args], capture_output=True, text=True,
                              timeout=120)

    ok = cli(f"input={marian_dir}", f"output={tmp_path / 'm.pt'}")
    assert ok.returncode == 0, ok.stderr
    assert "fine-tune it with: nmt-train" in ok.stdout and "model.activation=swish" in ok.stdout
    again = cli(f"input={marian_dir}", f"output={tmp_path / 'm.pt'}")
    assert again.returncode != 0 and "exists; give force=true" in again.stderr

    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("source.spm", "target.spm", "vocab.json", "model.safetensors"):
        (broken / name).write_bytes((marian_dir / name).read_bytes())
    config = json.loads((marian_dir / "config.json").read_text())
    cases = [({**config, "activation_function": "tanh"}, "activation_function='tanh'"),
             ({**config, "model_type": "bart"}, "model_type='bart': nmt-import reads marian"),
             ({k: v for k, v in config.items() if k != "d_model"}, "missing key 'd_model'"),
             ({**config, "d_model": 64}, "weights do not fit config.json")]
    for bad, message in cases:
        (broken / "config.json").write_text(json.dumps(bad))
        with pytest.raises(NmtError, match=re.escape(message)) as e:
            import_model(ImportConfig(input=str(broken), output=str(tmp_path / "x.pt")))
        assert "\n" not in str(e.value) and not (tmp_path / "x.pt").exists()
    r = cli(f"input={tmp_path / 'nowhere'}", f"output={tmp_path / 'x.pt'}")
    assert r.returncode != 0 and "config.json: not found" in r.stderr


def test_a_device_as_output_is_written_into_not_replaced(marian_dir, null_device):
    import_model(ImportConfig(input=str(marian_dir), output=str(null_device)))  # no force
    assert stat.S_ISCHR(null_device.lstat().st_mode)
    assert [p.name for p in null_device.parent.iterdir()] == ["null"]



@pytest.fixture(scope="module")
def multilingual(tmp_path_factory) -> tuple[Path, Path]:
    """A multilingual MarianMT directory (>>de<< and >>fr<< choose the target) and its import."""
    d = build_marian(tmp_path_factory, codes=("de", "fr"))
    out = tmp_path_factory.mktemp("nmt") / "opus-mul.pt"
    import_model(ImportConfig(input=str(d), output=str(out)))
    return d, out


def test_target_language_tokens_are_whole_and_chosen_with_tgt_lang(multilingual):
    directory, checkpoint = multilingual
    _, tokenizer = hf_model(directory)
    tr = Translator.load(checkpoint, dtype=None)
    assert tr.vocab.languages == Languages(TAG, {"de": 2, "fr": 3})
    text = lines("test.en", 0, 100)
    theirs = tokenizer([f">>fr<< {line}" for line in text])["input_ids"]
    chosen = choose(tr.vocab, "", "fr", str(checkpoint)).sources(tr.src_tok.encode(text))
    assert [ids + [tr.specials.eos] for ids in chosen] == theirs
    typed = tr.src_tok.encode([f">>fr<< {line}" for line in text])  # in the text: one piece,
    assert [ids[1:] + [tr.specials.eos] for ids in typed] == theirs  # after a lone space mark
    assert {tr.src_tok.pieces(ids[:1])[0] for ids in typed} == {"\u2581"}
    with pytest.raises(ConfigError, match=r"tgt_lang=es: .* has no such language \(it has de, fr"):
        choose(tr.vocab, "", "es", str(checkpoint))
    with pytest.raises(ConfigError, match=r"src_lang=en: .* chooses the target language only"):
        choose(tr.vocab, "en", "fr", str(checkpoint))


@pytest.mark.slow
def test_multilingual_greedy_output_is_generate_per_target_language(multilingual, tmp_path):
    directory, checkpoint = multilingual
    model, tokenizer = hf_model(directory)
    text = lines("test.en", 0, 48)
    tr = Translator.load(checkpoint, dtype=None)
    search = SearchConfig(beam_size=1, max_len_a=0.0, max_len_b=MAX_LEN)
    outputs = {}
    for lang in ("de", "fr"):
        expected = hf_greedy(model, tokenizer, [f">>{lang}<< {line}" for line in text])
        src = choose(tr.vocab, "", lang, str(checkpoint)).sources(tr.src_tok.encode(text))
        assert translate_ids(tr.model, src, search, tr.specials) == expected
        outputs[lang] = expected
    assert outputs["de"] != outputs["fr"], "the language token changes nothing"
    out = export(ExportConfig(checkpoint=str(checkpoint), output=str(tmp_path / "hf"),
                              format="transformers"))
    again, exported = hf_model(out)
    assert hf_greedy(again, exported, [f">>fr<< {line}" for line in text]) == outputs["fr"]
