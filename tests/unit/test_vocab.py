"""nmt.data.vocab.Vocab: a checkpoint's vocabulary as one typed value. It round-trips through its
dict and through torch.save / torch.load(weights_only=True); the dicts of the previous
release's checkpoints (bilingual with "pair", multilingual with "languages", older ones with
neither), written here by hand, load and translate as before, and their CTranslate2 exports'
nmt.json is what it was; a missing key is a one-line error naming it."""

import dataclasses
import pickle

import pytest
import torch
from translate_helpers import random_sources, search, tiny_model

from nmt.data.languages import choose, recorded_pair
from nmt.data.tokenizer import SPECIALS, Tokenizer, vocab_sha256
from nmt.data.vocab import TAG, LanguagePair, Languages, Vocab
from nmt.engines.translator import Translator
from nmt.errors import NmtError
from nmt.training.checkpoint import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

# What the previous release's checkpoints record of their languages, by kind
RECORDED = {"bilingual": {"pair": {"src_lang": "en", "tgt_lang": "de"}},
            "multilingual": {"languages": {"convention": "tag", "codes": {"de": 4, "fr": 5},
                                           "sources": ["en"]}},
            "older": {}}
# Per kind: the pair it records, a tgt_lang it takes and the source tokens that choice adds
LANGUAGES = {"bilingual": (LanguagePair("en", "de"), "", ()),
             "multilingual": (LanguagePair(), "fr", (5,)),
             "older": (LanguagePair(), "", ())}
# Per kind: what its Vocab holds of its languages, typed
TYPED = {"bilingual": (None, LanguagePair("en", "de")),
         "multilingual": (Languages(TAG, {"de": 4, "fr": 5}, ("en",)), None),
         "older": (None, None)}


@pytest.fixture(scope="module")
def proto(tiny_data_dir) -> bytes:
    """The toy data's joint SentencePiece model."""
    return (tiny_data_dir / "spm.model").read_bytes()


def old_entry(proto: bytes, kind: str) -> dict:
    """A checkpoint's vocab dict as the previous release's nmt-train wrote it, by hand: a joint
    vocabulary of `proto` and what a checkpoint of `kind` records of its languages."""
    size = Tokenizer(proto).vocab_size
    return {"src_size": size, "tgt_size": size, "joint": True, "pad_id": 0, "unk_id": 1,
            "bos_id": 2, "eos_id": 3, "sha256": vocab_sha256(proto, proto), "src_spm": proto,
            "tgt_spm": proto, **RECORDED[kind]}


@pytest.mark.parametrize("kind", RECORDED)
def test_a_dict_round_trips_key_for_key(proto, kind):
    entry = old_entry(proto, kind)
    vocab = Vocab.from_dict(entry, "old.pt")
    assert vocab.to_dict() == entry and list(vocab.to_dict()) == list(entry)
    assert Vocab.from_dict(vocab.to_dict(), "old.pt") == vocab
    assert (vocab.languages, vocab.pair) == TYPED[kind]  # typed values, not the dicts


@pytest.mark.parametrize("kind", RECORDED)
def test_a_vocab_round_trips_through_torch_save_and_a_weights_only_load(proto, kind, tmp_path):
    vocab = Vocab.from_dict(old_entry(proto, kind), "old.pt")
    torch.save({"vocab": vocab.to_dict()}, tmp_path / "dict.pt")
    state = torch.load(tmp_path / "dict.pt", weights_only=True)
    assert Vocab.from_dict(state["vocab"], "dict.pt") == vocab
    torch.save({"vocab": vocab}, tmp_path / "dataclass.pt")  # why checkpoints hold the dict
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "dataclass.pt", weights_only=True)


@pytest.mark.parametrize("kind", RECORDED)
def test_an_older_checkpoint_loads_and_translates_as_before(proto, kind, tmp_path):
    entry = old_entry(proto, kind)
    model = tiny_model(entry["src_size"], seed=0, stops=True)
    path = tmp_path / "old.pt"
    save_checkpoint({"model": model.state_dict(), "model_cfg": dataclasses.asdict(model.cfg),
                     "vocab": entry, "update": 0, "epoch": 0}, path)
    pair, tgt_lang, source = LANGUAGES[kind]
    with Translator.load(path) as loaded, Translator([model], SPECIALS) as bare:
        assert loaded.vocab.to_dict() == entry and recorded_pair(loaded.vocab) == pair
        choice = choose(loaded.vocab, "", tgt_lang, str(path))
        assert choice.source == source
        sources = choice.sources(random_sources(6, entry["src_size"]))
        assert ([h[0].tokens for h in loaded.translate_ids(sources, search())]
                == [h[0].tokens for h in bare.translate_ids(sources, search())])


@pytest.mark.parametrize("kind", RECORDED)
def test_the_ctranslate2_exports_vocab_is_the_older_releases(proto, kind):
    """nmt.json holds the vocab dict without the SentencePiece models
    (nmt.wings.interop.ct2_export), which reads back with protos=False."""
    entry = old_entry(proto, kind)
    older = {k: v for k, v in entry.items() if not isinstance(v, bytes)}  # what it wrote
    vocab = dataclasses.replace(Vocab.from_dict(entry, "old.pt"), src_spm=None, tgt_spm=None)
    assert vocab.to_dict() == older
    assert Vocab.from_dict(older, "nmt.json", protos=False) == vocab


@pytest.mark.parametrize("key", ["src_size", "joint", "unk_id", "sha256", "tgt_spm"])
def test_a_missing_key_is_one_line_naming_it(proto, key):
    entry = {k: v for k, v in old_entry(proto, "bilingual").items() if k != key}
    with pytest.raises(NmtError) as e:
        Vocab.from_dict(entry, "run/old.pt")
    assert str(e.value) == f"run/old.pt: checkpoint vocab lacks {key}"


@pytest.mark.parametrize("recorded", [{"languages": {"codes": {"de": 4}}},
                                      {"languages": ["tag"]}, {"pair": "en-de"}])
def test_a_languages_or_pair_entry_nmt_never_wrote_is_one_line(proto, recorded):
    entry = {**old_entry(proto, "older"), **recorded}
    with pytest.raises(NmtError) as e:
        Vocab.from_dict(entry, "run/odd.pt")
    assert str(e.value) == "run/odd.pt: checkpoint vocab's languages or pair entry is not one " \
        "nmt writes"


def test_a_checkpoint_without_its_vocabulary_is_one_line_naming_what_it_lacks(proto, tmp_path):
    entry = {k: v for k, v in old_entry(proto, "older").items() if k not in ("eos_id", "src_spm")}
    model = tiny_model(Tokenizer(proto).vocab_size)
    path = tmp_path / "bad.pt"
    save_checkpoint({"model": model.state_dict(), "model_cfg": dataclasses.asdict(model.cfg),
                     "vocab": entry, "update": 0, "epoch": 0}, path)
    with pytest.raises(NmtError) as e:
        Translator.load(path)
    assert str(e.value) == f"{path}: checkpoint vocab lacks eos_id, src_spm"
