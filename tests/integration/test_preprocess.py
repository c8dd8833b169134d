"""nmt-preprocess: text, TSV and Hugging Face inputs, the filters, the data directory, bad input."""

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.commands import preprocess as pp
from nmt.config import PreprocessConfig, compose, to_object
from nmt.data import cleaning
from nmt.data.arrays import ParallelData
from nmt.data.manifest import read_manifest
from nmt.data.tokenizer import Tokenizer, vocab_sha256
from nmt.errors import NmtError

LEXICON = {"open": "öffnen", "save": "speichern", "file": "Datei", "edit": "bearbeiten",
           "view": "Ansicht", "help": "Hilfe", "close": "schließen", "print": "drucken",
           "copy": "kopieren", "find": "suchen", "the": "die", "new": "neue", "window": "Fenster",
           "error": "Fehler", "user": "Benutzer", "name": "Name", "folder": "Ordner",
           "disk": "Festplatte", "network": "Netzwerk", "update": "Aktualisierung"}


def toy_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n (English, German) pairs of 1-8 lexicon words, word for word."""
    rng = random.Random(seed)
    words = sorted(LEXICON)
    pairs = []
    for _ in range(n):
        src = [rng.choice(words) for _ in range(rng.randint(1, 8))]
        pairs.append((" ".join(src), " ".join(LEXICON[w] for w in src)))
    return pairs


def write_text(prefix: Path, pairs, src: str = "en", tgt: str = "de") -> str:
    """Write PFX.src / PFX.tgt; returns the prefix as a string."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for lang, side in ((src, 0), (tgt, 1)):
        Path(f"{prefix}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), "utf-8")
    return str(prefix)


@pytest.fixture
def corpus(tmp_path):
    """A toy corpus as aligned text files: {'train': PFX, 'valid': PFX, 'test': PFX}."""
    return {split: write_text(tmp_path / "raw" / split, toy_pairs(n, seed))
            for split, n, seed in (("train", 300, 0), ("valid", 20, 1), ("test", 20, 2))}


def config(out: Path, *overrides: str, **splits: str) -> PreprocessConfig:
    """Compose configs/preprocess.yaml with overrides, as the command line would."""
    args = ["src_lang=en", "tgt_lang=de", f"out_dir={out}", "bpe.vocab_size=100", "workers=1"]
    args += [f"{k}={v}" for k, v in splits.items()] + list(overrides)
    return to_object(compose("preprocess", args), PreprocessConfig)


def run(out: Path, *overrides: str, **splits: str) -> dict:
    """Preprocess and return manifest.json's entries as written (the file format), checked to
    be what preprocess returned and what read_manifest reads."""
    returned = pp.preprocess(config(out, *overrides, **splits))
    entries = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert returned == read_manifest(out) and returned.to_dict() == entries
    return entries


def decoded(data_dir: Path, split: str, side: str) -> list[str]:
    """A split's sentences of one side, decoded with the directory's model."""
    m = read_manifest(data_dir)
    tok = Tokenizer.from_file(data_dir / getattr(m.spm, side))
    arrays = getattr(ParallelData(data_dir, split, m), side)
    return tok.decode([[int(i) for i in arrays[k]] for k in range(len(arrays))])


def leftovers(parent: Path) -> list[str]:
    """Temporary directories that a run left behind."""
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


# ----------------------------------------------------------------------------- text input
def test_text_input_writes_the_data_directory_contract(corpus, tmp_path, capsys):
    out = tmp_path / "data"
    m = run(out, **corpus)
    assert m["format"] == 3 and (m["src_lang"], m["tgt_lang"]) == ("en", "de")
    assert m["joint"] and m["spm"] == {"src": "spm.model", "tgt": "spm.model"}
    assert (m["pad_id"], m["unk_id"], m["bos_id"], m["eos_id"]) == (0, 1, 2, 3)
    assert m["src_vocab_size"] == m["tgt_vocab_size"] == 100 and m["dtype"] == "uint16"
    proto = (out / "spm.model").read_bytes()
    assert m["vocab_sha256"] == vocab_sha256(proto, proto)
    assert m["config"]["bpe"]["vocab_size"] == 100 and m["config"]["train"] == corpus["train"]
    for name, digest in m["checksums"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    assert "manifest.json" not in m["checksums"] and "spm.model" in m["checksums"]
    for split, n in (("train", 300), ("valid", 20), ("test", 20)):
        data = ParallelData(out, split)
        assert len(data) == m["splits"][split]["pairs"] == m["counts"][split]["kept"] == n
        assert m["splits"][split]["src_tokens"] == int(data.src.lengths.sum())
    pairs = toy_pairs(300, 0)
    assert decoded(out, "train", "src") == [p[0] for p in pairs]
    assert decoded(out, "train", "tgt") == [p[1] for p in pairs]
    assert (out / "valid.clean.de").read_text("utf-8") == Path(corpus["valid"] + ".de").read_text()
    assert m["clean"] == {split: {"src": f"{split}.clean.en", "tgt": f"{split}.clean.de"}
                          for split in ("valid", "test")}
    assert m["corpora"] == [{"name": "train", "input": corpus["train"], "weight": 1.0, "tag": "",
                             "tag_id": None, "first": 0, **m["splits"]["train"],
                             "counts": m["counts"]["train"]}]
    assert "train_text" not in m and not list(out.glob("train.clean.*"))  # keep_text=false
    assert leftovers(tmp_path) == []
    table = capsys.readouterr().out
    assert "train" in table and "too_long" in table and "300" in table


def test_existing_out_dir_needs_force(corpus, tmp_path):
    out = tmp_path / "data"
    first = run(out, **corpus)
    with pytest.raises(NmtError, match="already exists .*force=true"):
        run(out, **corpus)
    again = run(out, "force=true", "bpe.vocab_size=90", **corpus)
    assert again["src_vocab_size"] == 90 != first["src_vocab_size"]
    assert leftovers(tmp_path) == []
    other = tmp_path / "precious"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(NmtError, match="not a data directory"):
        run(other, "force=true", **corpus)
    assert (other / "notes.txt").read_text() == "keep me"


@pytest.mark.slow
def test_more_workers_give_identical_files(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(cleaning, "CHUNK", 32)  # 10 chunks for the 300 training pairs
    one = run(tmp_path / "one", **corpus)
    two = run(tmp_path / "two", "workers=2", **corpus)
    assert one["checksums"] == two["checksums"]


# ----------------------------------------------------------------------------- TSV and HF input
def test_tsv_input_matches_text_input(corpus, tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in toy_pairs(300, 0)), "utf-8")
    text = run(tmp_path / "text", train=corpus["train"])
    from_tsv = run(tmp_path / "tsv", train=str(tsv))
    assert from_tsv["checksums"] == text["checksums"]


def test_compressed_inputs_give_the_same_data_directory(corpus, tmp_path):
    from nmt.system.files import DECOMPRESS

    def pack(path: str, suffix: str) -> None:
        with DECOMPRESS[suffix](path + suffix, "wb") as f:
            f.write(Path(path).read_bytes())
        Path(path).unlink()

    text = run(tmp_path / "text", **corpus)
    for lang, suffix in (("en", ".gz"), ("de", ".xz")):
        pack(f"{corpus['train']}.{lang}", suffix)
    for lang in ("en", "de"):
        pack(f"{corpus['valid']}.{lang}", ".bz2")
    packed = run(tmp_path / "packed", **corpus)
    assert packed["checksums"] == text["checksums"]
    tsv = tmp_path / "train.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in toy_pairs(300, 0)), "utf-8")
    pack(str(tsv), ".gz")
    from_tsv = run(tmp_path / "tsv", train=f"{tsv}.gz")
    assert from_tsv["splits"]["train"] == text["splits"]["train"]
    Path(f"{corpus['train']}.en.gz").write_bytes(b"\x1f\x8b but not gzip")
    with pytest.raises(NmtError, match=r"train.en.gz: cannot read input \(") as e:
        run(tmp_path / "bad", **corpus)
    assert "\n" not in str(e.value) and leftovers(tmp_path) == []


def test_tsv_line_without_a_tab_is_an_error(tmp_path):
    tsv = tmp_path / "bad.tsv"
    tsv.write_text("a\tb\nno tab here\n", "utf-8")
    with pytest.raises(NmtError, match=r"bad.tsv:2: expected 2 tab-separated fields"):
        run(tmp_path / "data", train=str(tsv))
    assert not (tmp_path / "data").exists()


def test_saved_hf_dataset_matches_text_input(corpus, tmp_path):
    datasets = pytest.importorskip("datasets")

    def rows(n, seed):
        return {"translation": [{"de": t, "en": s} for s, t in toy_pairs(n, seed)]}

    saved = tmp_path / "hf"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict(rows(300, 0)),
        "validation": datasets.Dataset.from_dict(rows(20, 1)),
        "test": datasets.Dataset.from_dict(rows(20, 2)),
    }).save_to_disk(str(saved))
    text = run(tmp_path / "text", **corpus)
    hf = run(tmp_path / "from_hf", train=f"hf:{saved}", valid=f"hf:{saved}",
             test=f"hf:{saved}:test")
    assert hf["checksums"] == text["checksums"]
    with pytest.raises(NmtError, match="has no split 'dev' \\(has: train, validation, test\\)"):
        run(tmp_path / "x", train=f"hf:{saved}:dev")
    with pytest.raises(NmtError, match="translation has no 'fr'"):
        run(tmp_path / "x", "tgt_lang=fr", train=f"hf:{saved}")
    datasets.Dataset.from_dict({"text": ["a"]}).save_to_disk(str(tmp_path / "mono"))
    with pytest.raises(NmtError, match="needs a 'translation' column"):
        run(tmp_path / "x", train=f"hf:{tmp_path / 'mono'}")
    with pytest.raises(NmtError, match="no dataset saved"):
        run(tmp_path / "x", train=f"hf:{tmp_path / 'nothing'}")
    assert not (tmp_path / "x").exists()


# ----------------------------------------------------------------------------- filters
def test_filters_are_counted_and_valid_test_are_not_length_filtered(tmp_path):
    long = " ".join(["open file"] * 40)
    extra = [("", "leer"), ("   ", "\t"), ("open", " ".join(["Datei"] * 30)), (long, long),
             ("open file", "Datei öffnen"), ("open file", "Datei öffnen")]  # one duplicate
    train = write_text(tmp_path / "train", toy_pairs(200) + extra)
    valid = write_text(tmp_path / "valid", [("", "x")] + extra[2:])
    m = run(tmp_path / "data", "clean.max_tokens=70", "clean.max_ratio=9", "clean.dedup=true",
            train=train, valid=valid)
    c = m["counts"]["train"]
    assert (c["empty"], c["too_long"], c["ratio"]) == (2, 1, 1)
    assert c["duplicate"] >= 1  # the explicit duplicate, plus any the random pairs repeat
    assert c["read"] == 206 == sum(v for k, v in c.items() if k != "read" and v is not None)
    assert c["kept"] == m["splits"]["train"]["pairs"]
    v = m["counts"]["valid"]
    assert (v["empty"], v["kept"], v["too_long"], v["duplicate"]) == (1, 4, None, None)
    assert decoded(tmp_path / "data", "valid", "src")[1] == long


def test_unicode_normalisation_and_line_breaks(tmp_path):
    saved = tmp_path / "hf"
    import datasets

    pairs = [("the ﬁle", "die Datei"), ("new\nwindow", "neue\u2028Fenster")] + toy_pairs(50)
    ds = datasets.Dataset.from_dict({"en": [p[0] for p in pairs], "de": [p[1] for p in pairs]})
    ds.save_to_disk(str(saved))
    valid = write_text(tmp_path / "valid", [("the ﬁle", "die Datei"), ("copy", "kopieren")])
    run(tmp_path / "data", "clean.normalize=NFKC", train=f"hf:{saved}", valid=valid)
    assert (tmp_path / "data" / "valid.clean.en").read_text("utf-8") == "the file\ncopy\n"
    assert decoded(tmp_path / "data", "train", "src")[:2] == ["the file", "new window"]
    assert decoded(tmp_path / "data", "train", "tgt")[1] == "neue Fenster"


def test_sampled_subword_training_is_seeded(corpus, tmp_path):
    a = run(tmp_path / "a", "bpe.input_sentence_size=200", **corpus)
    b = run(tmp_path / "b", "bpe.input_sentence_size=200", **corpus)
    assert a["spm_training"] == {"sentences": 200, "sampled": True, "reused": ""}
    assert a["vocab_sha256"] == b["vocab_sha256"]
    assert a["splits"]["train"]["pairs"] == 300  # the sample only trains SentencePiece


def test_separate_vocabularies_and_reuse(corpus, tmp_path):
    sep = run(tmp_path / "sep", "bpe.joint=false", "bpe.vocab_size=60", **corpus)
    assert not sep["joint"] and sep["spm"] == {"src": "spm.en.model", "tgt": "spm.de.model"}
    src, tgt = ((tmp_path / "sep" / sep["spm"][s]).read_bytes() for s in ("src", "tgt"))
    assert src != tgt and sep["vocab_sha256"] == vocab_sha256(src, tgt)
    assert decoded(tmp_path / "sep", "test", "tgt") == [p[1] for p in toy_pairs(20, 2)]
    reused = run(tmp_path / "re", f"bpe.model={tmp_path / 'sep'}", train=corpus["valid"])
    assert reused["vocab_sha256"] == sep["vocab_sha256"] and not reused["joint"]
    assert reused["spm_training"]["reused"] == str((tmp_path / "sep").resolve())
    joint = run(tmp_path / "joint", train=corpus["train"])
    from_file = run(tmp_path / "re2", f"bpe.model={tmp_path / 'joint' / 'spm.model'}",
                    "bpe.vocab_size=5000", train=corpus["valid"])  # vocab_size is ignored
    assert from_file["vocab_sha256"] == joint["vocab_sha256"] and from_file["joint"]


# ----------------------------------------------------------------------------- corpora
def test_several_corpora_with_weights_and_a_tag(corpus, tmp_path, capsys):
    bt_pairs = toy_pairs(40, 5) + toy_pairs(300, 0)[:10]
    bt = write_text(tmp_path / "raw" / "bt", bt_pairs)
    both = f"train=[{corpus['train']},{{path:'{bt}',weight:0.5,tag:'<BT>'}}]"
    m = run(tmp_path / "data", f"valid={corpus['valid']}", both)
    real, tagged = m["corpora"]
    assert (real["name"], real["first"], real["pairs"], real["weight"], real["tag_id"]) == (
        "train", 0, 300, 1.0, None)
    assert (tagged["name"], tagged["first"], tagged["pairs"], tagged["weight"],
            tagged["tag"]) == ("bt", 300, 50, 0.5, "<BT>")
    assert m["counts"]["train"]["kept"] == m["splits"]["train"]["pairs"] == 350
    assert m["splits"]["train"]["src_tokens"] == real["src_tokens"] + tagged["src_tokens"]
    tok = Tokenizer.from_file(tmp_path / "data" / "spm.model")
    assert tok.piece_id("<BT>") == tagged["tag_id"]
    data = ParallelData(tmp_path / "data", "train")
    assert all(data.src[i][0] == tagged["tag_id"] for i in range(300, 350))  # one piece, first
    assert not any(tagged["tag_id"] in data.src[i] for i in range(300))
    assert all(tagged["tag_id"] not in data.tgt[i] for i in range(350))
    assert decoded(tmp_path / "data", "train", "src")[300] == "<BT> " + toy_pairs(40, 5)[0][0]
    table = capsys.readouterr().out
    assert "  bt (weight 0.5, tag <BT>)" in table and "  train (weight 1)" in table
    seen, repeated = set(toy_pairs(300, 0)), 0  # clean.dedup looks across the corpora
    for pair in bt_pairs:
        repeated += pair in seen
        seen.add(pair)
    deduped = run(tmp_path / "dedup", "clean.dedup=true", both)["corpora"][1]["counts"]
    assert deduped["duplicate"] == repeated >= 10


def test_a_reused_vocabulary_must_have_the_tags(corpus, corpora_dir, tmp_path):
    tagged = f"train=[{corpus['train']},{{path:'{corpus['valid']}',tag:'<BT>'}}]"
    run(tmp_path / "plain", **corpus)
    with pytest.raises(NmtError, match=r"train\[1\].tag=<BT>: the reused SentencePiece model "
                                       r".* has no such piece; give no bpe.model") as e:
        run(tmp_path / "b", f"bpe.model={tmp_path / 'plain'}", tagged)
    assert "\n" not in str(e.value) and leftovers(tmp_path) == []
    m = run(tmp_path / "c", f"bpe.model={corpora_dir}", tagged)  # a model that has it
    assert m["corpora"][1]["tag_id"] == read_manifest(corpora_dir).corpora[1].tag_id


def test_keep_text_keeps_the_kept_training_text(corpus, tmp_path):
    from nmt.data.arrays import TokenArray

    long_pair = ("open " * 300, "öffnen " * 300)  # dropped: too long
    train = write_text(tmp_path / "raw" / "long", toy_pairs(300, 0)[:5] + [long_pair])
    m = run(tmp_path / "data", "keep_text=true", train=train)
    assert m["train_text"] == {"src": "train.clean.en", "tgt": "train.clean.de",
                               "src_bytes": m["train_text"]["src_bytes"],
                               "tgt_bytes": m["train_text"]["tgt_bytes"]}
    text = TokenArray(tmp_path / "data" / "train.clean.de", "uint8")
    assert [text[i].tobytes().decode() for i in range(len(text))] == [
        p[1] for p in toy_pairs(300, 0)[:5]]  # aligned with train.de.bin
    assert m["checksums"]["train.clean.de.bin"]


# ----------------------------------------------------------------------------- bad input
def bad_input_cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (overrides, the one-line error it must give)."""
    good = write_text(tmp_path / "good", toy_pairs(50))
    short = write_text(tmp_path / "short", toy_pairs(50))
    Path(short + ".de").write_text("".join(p[1] + "\n" for p in toy_pairs(49)), "utf-8")
    bad = write_text(tmp_path / "bad", toy_pairs(50))
    with open(bad + ".de", "ab") as f:
        f.write(b"caf\xe9\n")
    with open(bad + ".en", "ab") as f:
        f.write(b"cafe\n")
    empty = write_text(tmp_path / "empty", [])
    blank = write_text(tmp_path / "blank", [(" ", "x"), ("y", "")])
    return {
        "line counts": ([f"train={short}"],
                        rf"short.en has 50 lines but {tmp_path}/short.de has 49"),
        "invalid utf-8": ([f"train={bad}"], r"bad.de:51: invalid UTF-8 .*invalid_utf8=skip"),
        "missing file": ([f"train={tmp_path}/nope"], r"nope.en: no such file"),
        "missing valid": ([f"train={good}", f"valid={tmp_path}/nope"], r"nope.en: no such file"),
        "vocab too large": ([f"train={good}", "bpe.vocab_size=5000"],
                            r"bpe.vocab_size=5000 is larger than the training data allows"),
        "empty corpus": ([f"train={empty}"], r"train: .*empty\.\{en,de\} is empty"),
        "nothing left": ([f"train={blank}"], r"train: no pairs left after cleaning .*empty 2"),
    }


@pytest.mark.parametrize("case", ["line counts", "invalid utf-8", "missing file",
                                  "missing valid", "vocab too large", "empty corpus",
                                  "nothing left"])
def test_bad_input_is_one_line_and_leaves_nothing(case, tmp_path):
    overrides, message = bad_input_cases(tmp_path)[case]
    out = tmp_path / "out" / "data"
    with pytest.raises(NmtError, match=message) as e:
        pp.preprocess(config(out, *overrides))
    assert "\n" not in str(e.value)
    assert not out.exists()
    assert not out.parent.exists() or leftovers(out.parent) == []


def test_invalid_utf8_skip_policy_counts_what_it_skipped(tmp_path):
    overrides, _ = bad_input_cases(tmp_path)["invalid utf-8"]
    m = run(tmp_path / "data", "clean.invalid_utf8=skip", *overrides)
    assert m["counts"]["train"]["invalid_utf8"] == 1
    assert m["counts"]["train"]["read"] == 51 and m["splits"]["train"]["pairs"] == 50


# ----------------------------------------------------------------------------- the command line
NMT_PREPROCESS = str(Path(sys.executable).with_name("nmt-preprocess"))


@pytest.mark.slow
def test_cli_contract_then_refuses_to_overwrite(corpus, tmp_path):
    args = [NMT_PREPROCESS, "src_lang=en", "tgt_lang=de", f"train={corpus['train']}",
            f"valid={corpus['valid']}", f"test={corpus['test']}", "out_dir=DATA",
            "bpe.vocab_size=100"]
    done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "DATA" / "manifest.json").read_text())["splits"]["test"]
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line}
    assert rows["train"][-3] == "300" and rows["valid"][-3] == "20"  # kept column
    again = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 1
    assert again.stderr == "nmt-preprocess: error: DATA: already exists " \
                           "(add force=true to replace it)\n"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["line counts", "vocab too large"])
def test_cli_bad_input_gives_one_stderr_line(case, tmp_path):
    overrides, message = bad_input_cases(tmp_path)[case]
    args = [NMT_PREPROCESS, "src_lang=en", "tgt_lang=de", "out_dir=DATA", "bpe.vocab_size=100",
            *overrides]
    done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("nmt-preprocess: error: ")
    assert not (tmp_path / "DATA").exists() and leftovers(tmp_path) == []


def test_normalize_helper():
    assert cleaning.normalize("  a\tb\r\n", "") == "a\tb"
    assert cleaning.normalize("x\u2028y\x0bz", "") == "x y z"
    assert cleaning.normalize("ﬁ", "NFKC") == "fi"
