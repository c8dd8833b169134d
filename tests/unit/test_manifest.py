"""The data directory's manifest.json read as a Manifest: every format nmt-preprocess wrote
(1 to 3) reads and gives back the same entries, and a missing or wrong entry is one line naming
the file and the key when the directory is opened, not a traceback later."""

import json
import shutil
from pathlib import Path

import pytest

from nmt.data.arrays import ParallelData
from nmt.data.manifest import Manifest, directions, read_manifest
from nmt.errors import NmtError


def entries(data_dir) -> dict:
    """manifest.json's entries as written."""
    return json.loads((data_dir / "manifest.json").read_text(encoding="utf-8"))


def test_every_format_reads_and_gives_back_its_entries(tiny_data_dir, corpora_dir):
    """Format 1 (the tests' toy directory: no corpora), 3 (nmt-preprocess's, two corpora,
    kept text) and 2 (format 3 less what format 3 added)."""
    one, three = entries(tiny_data_dir), entries(corpora_dir)
    two = {**three, "format": 2}
    for entry, corpora in ((one, 1), (two, 2), (three, 2)):
        m = Manifest.from_dict(entry, "m.json")
        assert m.to_dict() == entry and len(m.training_corpora()) == corpora
    m = Manifest.from_dict(one, "m.json")
    assert (m.format, m.corpora, m.splits["train"].pairs, m.spm.src) == (1, None, 600,
                                                                         "spm.model")
    m = Manifest.from_dict(three, "m.json")
    assert [c.tag for c in m.corpora] == ["", "<BT>"] and m.train_text.src == "train.clean.en"
    assert m.made["config"]["keep_text"] is True  # how it was made, as it was written


@pytest.mark.parametrize("kind", ["bilingual", "multilingual"])
def test_manifests_that_8f24062s_preprocess_wrote_read_as_they_were(kind):
    """tests/data/manifest_8f24062_*.json: nmt-preprocess's at 8f24062 (two tagged corpora with
    keep_text; en-de, de-en and en-fr with their sections and languages; temporary paths
    written as DATA/)."""
    path = Path(__file__).parents[1] / "data" / f"manifest_8f24062_{kind}.json"
    entry = json.loads(path.read_text(encoding="utf-8"))
    m = Manifest.from_dict(entry, path)
    assert m.to_dict() == entry
    if kind == "bilingual":
        assert directions(m, "train") == [] and m.train_text.src_bytes > 0
        assert [(c.weight, c.tag) for c in m.corpora] == [(1.0, ""), (2.0, "<BT>")]
    else:
        assert [d.name for d in directions(m, "valid")] == ["en-de", "de-en", "en-fr"]
        assert m.corpus_languages() == ["de", "en"] and set(m.languages.codes) >= {"fr"}


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m.pop("eos_id"), r"missing key 'eos_id'"),
    (lambda m: m.update(src_vocab_size="120"), r"src_vocab_size is '120', not an integer"),
    (lambda m: m.update(pad_id=True), r"pad_id is True, not an integer"),
    (lambda m: m.update(joint=1), r"joint is 1, not true or false"),
    (lambda m: m.update(dtype="int8"), r"dtype is 'int8', not one of uint16, int32"),
    (lambda m: m["spm"].pop("tgt"), r"missing key 'spm.tgt'"),
    (lambda m: m["splits"]["train"].update(pairs=None),
     r"splits.train.pairs is None, not an integer"),
    (lambda m: m["corpora"][1].pop("first"), r"missing key 'corpora.1.first'"),
    (lambda m: m["corpora"][0].update(weight="2"), r"corpora.0.weight is '2', not a number"),
    (lambda m: m["train_text"].update(src_bytes=-0.5),
     r"train_text.src_bytes is -0.5, not an integer"),
    (lambda m: m.update(format=4), r"format 4 is newer than this nmt reads \(1 to 3\)"),
    (lambda m: m.update(languages={"convention": "tag", "codes": {"de": "4"}}),
     r"languages is not a convention \(forced or tag\) and its codes"),
    (lambda m: m.update(languages={"codes": {"de": 4}}),
     r"languages is not a convention \(forced or tag\) and its codes"),
])
def test_a_bad_entry_is_one_line_naming_the_file_and_key(corpora_dir, tmp_path, change,
                                                          message):
    """Before, the manifest was a dict read key by key wherever needed: a missing or mistyped
    entry ended in a KeyError or TypeError traceback (e.g. ParallelData's sizes)."""
    data = tmp_path / "data"
    shutil.copytree(corpora_dir, data)
    entry = entries(data)
    change(entry)
    (data / "manifest.json").write_text(json.dumps(entry), encoding="utf-8")
    for read in (read_manifest, lambda d: ParallelData(d, "train")):
        with pytest.raises(NmtError, match=rf"^{data / 'manifest.json'}: {message}") as e:
            read(data)
        assert "\n" not in str(e.value)


def test_a_manifest_that_is_not_an_object_is_one_line(tmp_path):
    (tmp_path / "manifest.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(NmtError, match=r"manifest\.json: not a JSON object"):
        read_manifest(tmp_path)
