"""The corpora of nmt-preprocess's train, valid and test: each entry of its config (an input
spec or a mapping) parsed into a TrainCorpus and checked, one ConfigError naming the entry's key
(train[1].weight), with each corpus's default name. Below nmt.config, which imports it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nmt.config_checks import LANG_CODE, check


@dataclass
class TrainCorpus:
    """One training corpus of nmt-preprocess: an entry of PreprocessConfig.train."""

    path: str  # the input, in any form train takes (PFX, FILE.tsv, hf:...)
    weight: float = 1.0  # nmt-train's default sampling weight: >1 upsamples, <1 downsamples
    tag: str = ""  # a piece put first on every source sentence, e.g. <BT>; "": none
    name: str = ""  # what the report and the manifest call it ("": its file name's stem)
    # A multilingual data directory's corpora each name their pair (nmt.data.languages): the
    # inputs' file suffixes are these, and every source sentence starts with >>tgt_lang<<.
    src_lang: str = ""  # the corpus's source language, e.g. en ("": bilingual, the config's)
    tgt_lang: str = ""  # the corpus's target language, e.g. de ("": bilingual, the config's)


SPECIAL_PIECES = ("<pad>", "<unk>", "<s>", "</s>")
CORPUS_KEYS = "path, weight, tag, name, src_lang, tgt_lang"


def train_corpora(value: object, role: str = "train") -> list[TrainCorpus]:
    """PreprocessConfig.train (or valid, test: role) as a list of TrainCorpus, checked: an
    input spec, or a list of specs and {path, weight, tag, name, src_lang, tgt_lang} mappings
    (valid and test: path, name and the languages only). Names default to the file name's
    stem (made unique with #position). Either no corpus names its languages or each does."""
    entries = value if isinstance(value, list | tuple) else [value]
    check(len(entries) > 0, role, f"the list of {role} corpora is empty")
    corpora = []
    for i, entry in enumerate(entries):
        key = f"{role}[{i}]" if isinstance(value, list | tuple) else role
        if isinstance(entry, str):
            entry = {"path": entry}
        check(isinstance(entry, dict), key, f"must be an input or {{path: ..., weight: ..., "
              f"tag: ...}}, got {entry!r}")
        extra = sorted(set(entry) - {f.name for f in dataclasses.fields(TrainCorpus)})
        check(not extra, f"{key}.{extra[0] if extra else ''}",
              f"unknown key (keys: {CORPUS_KEYS})")
        held = sorted(set(entry) & {"weight", "tag"}) if role != "train" else []
        check(not held, f"{key}.{held[0] if held else ''}", "applies to train corpora only")
        check(isinstance(entry.get("path"), str) and entry["path"] != "", f"{key}.path",
              "a value is required (the corpus's input)")
        corpus = TrainCorpus(**entry)
        check(isinstance(corpus.weight, int | float) and corpus.weight >= 0, f"{key}.weight",
              f"must be a number >= 0, got {corpus.weight!r}")
        check(corpus.tag == "" or (corpus.tag.isprintable() and not any(
            c.isspace() for c in corpus.tag) and corpus.tag not in SPECIAL_PIECES), f"{key}.tag",
              f"must be one piece without spaces and not {'/'.join(SPECIAL_PIECES)}, "
              f"got {corpus.tag!r}")
        _check_corpus_languages(corpus, key)
        corpora.append(corpus)
    named = {bool(c.src_lang) for c in corpora}
    check(len(named) == 1, role, "give src_lang and tgt_lang to every corpus (a multilingual "
           "data directory) or to none")
    stems = [c.name or _stem(c.path) for c in corpora]
    for i, corpus in enumerate(corpora):
        corpus.name = stems[i] if stems.count(stems[i]) == 1 else f"{stems[i]}#{i + 1}"
    return corpora


def _check_corpus_languages(corpus: TrainCorpus, key: str) -> None:
    """A corpus's src_lang and tgt_lang: both or neither, ISO 639 codes that differ, and no
    tag of its own beside them (its tag is its target language's >>xx<<)."""
    check(bool(corpus.src_lang) == bool(corpus.tgt_lang), f"{key}.tgt_lang"
           if corpus.src_lang else f"{key}.src_lang", "give both src_lang and tgt_lang, or neither")
    if not corpus.src_lang:
        return
    for side in ("src_lang", "tgt_lang"):
        code = getattr(corpus, side)
        check(LANG_CODE.fullmatch(code) is not None, f"{key}.{side}",
              f"must be an ISO 639 code, e.g. en (got {code!r})")
    check(corpus.src_lang != corpus.tgt_lang, f"{key}.tgt_lang", "must differ from src_lang")
    check(not corpus.tag, f"{key}.tag", "a corpus with languages is tagged with its target "
           "language (>>tgt_lang<<); leave tag out")


def _stem(spec: str) -> str:
    """A corpus's default name: its file name without .tsv and compression suffixes."""
    name = spec.rstrip("/").rpartition("/")[2] or spec
    for suffix in (".gz", ".bz2", ".xz", ".tsv"):
        name = name.removesuffix(suffix)
    return name
