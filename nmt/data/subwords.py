"""Stage 3 of nmt-preprocess: the SentencePiece BPE model(s), trained on a seeded sample of the
cleaned training text or reused (bpe.model), with the corpora's tags and a multilingual run's
language tokens (>>xx<<) as pieces of their own, and the manifest's "languages"."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nmt.data.cleaning import CleanText
from nmt.data.tokenizer import Tokenizer, directory_tokenizers, tokenizers, train_bpe
from nmt.errors import NmtError

if TYPE_CHECKING:
    from nmt.config import BpeConfig, PreprocessConfig
    from nmt.config_corpora import TrainCorpus
    from nmt.data.vocab import Vocab

log = logging.getLogger("nmt.commands.preprocess")


def training_sentences(text: CleanText, pairs: int, seed: int, joint: bool, side: str = "src"
                       ) -> Iterator[bytes]:
    """The cleaned training lines for SentencePiece: every pair, or `pairs` drawn uniformly
    without replacement (seeded); with joint, the source lines, then the target lines."""
    keep = None
    if pairs < text.pairs:
        keep = np.zeros(text.pairs, dtype=bool)
        keep[np.random.default_rng(seed).choice(text.pairs, size=pairs, replace=False)] = True
    for path in (text.src, text.tgt) if joint else (getattr(text, side),):
        with open(path, "rb") as f:
            lines = (line[:-1] for line in f)
            yield from lines if keep is None else itertools.compress(lines, keep)


def train_subwords(train: CleanText, bpe: BpeConfig, tags: list[str]
                   ) -> tuple[Tokenizer, Tokenizer, dict]:
    """Train the joint (or one per language) BPE model on the cleaned training text or a
    sample; the source model has each of `tags` as a piece of its own."""
    per_pair = 2 if bpe.joint else 1  # sentences a pair gives each model
    pairs = train.pairs
    if bpe.input_sentence_size:
        pairs = min(pairs, max(1, bpe.input_sentence_size // per_pair))
    options = dict(vocab_size=bpe.vocab_size, character_coverage=bpe.character_coverage,
                   split_digits=bpe.split_digits, byte_fallback=bpe.byte_fallback,
                   normalization=bpe.normalization, seed=bpe.seed)
    kind = "joint" if bpe.joint else "separate"
    log.info(f"training {kind} SentencePiece BPE ({bpe.vocab_size} pieces) on "
             f"{pairs * per_pair:,} sentences")
    if bpe.joint:
        src = tgt = train_bpe(training_sentences(train, pairs, bpe.seed, joint=True), **options,
                              user_defined_symbols=tags)
    else:
        src, tgt = (train_bpe(training_sentences(train, pairs, bpe.seed, False, side), **options,
                              user_defined_symbols=tags if side == "src" else ())
                    for side in ("src", "tgt"))
    info = {"sentences": pairs * per_pair, "sampled": pairs < train.pairs, "reused": ""}
    return src, tgt, info


def is_checkpoint(path: str | Path) -> bool:
    """Whether the file at `path` is a zip, as a torch checkpoint is."""
    with open(path, "rb") as f:
        return f.read(2) == b"PK"


def load_subwords(path: str, vocab: Vocab | None = None) -> tuple[Tokenizer, Tokenizer, dict]:
    """Reuse a .model file (joint), the model(s) of a data directory written by nmt-preprocess,
    or a checkpoint's (nmt-train's, nmt-import's: fine-tuning data gets the model's ids):
    `vocab`, the checkpoint's at `path`, which nmt-preprocess reads (is_checkpoint).
    The info's "languages": those the checkpoint (or data directory) records, if any
    (nmt.data.languages), which the data directory and the models trained on it keep; its
    "source_eos": false where their sources end without EOS (Vocab.source_eos), kept so too."""
    from nmt.data.manifest import read_manifest

    p = Path(path)
    languages, source_eos = None, True
    if vocab is not None:
        src, tgt = tokenizers(vocab, str(p))
        languages = vocab.languages.to_dict() if vocab.languages else None
        source_eos = vocab.source_eos
    elif p.is_dir():
        manifest = read_manifest(p)
        src, tgt = directory_tokenizers(p, manifest.spm, manifest.spm_split)
        languages = manifest.languages.to_dict() if manifest.languages else None
        source_eos = manifest.source_eos is not False
    elif not p.exists():
        raise NmtError(f"bpe.model={path}: no such file, data directory or checkpoint")
    else:
        src = tgt = Tokenizer.from_file(p)
    if src.proto == tgt.proto:
        tgt = src
    info = {"sentences": 0, "sampled": False, "reused": str(p.resolve()),
            **({"source_eos": False} if not source_eos else {})}
    return src, tgt, info if languages is None else {**info, "languages": languages}


def language_token(lang: str) -> str:
    """The piece that asks a multilingual model trained here for language `lang`: >>lang<<
    first on the source (OPUS-MT's convention, "tag" in nmt.data.languages)."""
    return f">>{lang}<<"


def corpus_tags(corpora: list[TrainCorpus]) -> list[str]:
    """Each corpus's tag piece ("": none): its target language's token when it names its
    languages, else its own tag."""
    return [language_token(c.tgt_lang) if c.tgt_lang else c.tag for c in corpora]


def tag_ids(corpora: list[TrainCorpus], src: Tokenizer, reused: str, role: str = "train"
            ) -> list[int | None]:
    """Each corpus's tag (corpus_tags) as an id of the source vocabulary (None: no tag). A
    reused model (bpe.model) must have the tag as a piece: a one-line error otherwise."""
    ids = []
    for i, (corpus, tag) in enumerate(zip(corpora, corpus_tags(corpora), strict=True)):
        piece = src.piece_id(tag) if tag else None
        if tag and piece is None:
            key = f"{role}[{i}].{'tgt_lang' if corpus.tgt_lang else 'tag'}"
            what = "" if tag == corpus.tag else f" ({tag})"
            raise NmtError(f"{key}={corpus.tgt_lang or tag}: the reused SentencePiece model "
                           f"({reused}) has no such piece{what}; give no bpe.model (a new "
                           f"model gets the tag as a piece) or a tag the model has")
        ids.append(piece)
    return ids


def language_entry(cfg: PreprocessConfig, src: Tokenizer, reused: dict) -> dict | None:
    """The manifest's "languages" (nmt.data.languages): a multilingual directory's, {"convention":
    "tag", "codes": {language: id of >>language<<}} over every pair's languages; else a
    reused checkpoint's, if any. A reused multilingual vocabulary of another convention is a
    one-line error."""
    if not cfg.multilingual:
        return reused.get("languages")
    if reused.get("languages", {}).get("convention", "tag") != "tag":
        raise NmtError(f"bpe.model={cfg.bpe.model}: its model chooses languages by a forced "
                       f"target token; corpora with src_lang/tgt_lang train >>xx<< tags")
    codes = {lang: src.piece_id(language_token(lang)) for lang in languages_of(cfg)}
    return {"convention": "tag", "codes": {k: v for k, v in codes.items() if v is not None}}


def write_subwords(src: Tokenizer, tgt: Tokenizer, tmp: Path, src_lang: str, tgt_lang: str
                   ) -> tuple[dict[str, str], dict[str, str] | None]:
    """Write the model(s) and their .vocab listing into tmp, and where either has a model
    that splits text for it (a reused import's: Tokenizer.split_proto), each side's (its own
    model where it has none); returns the manifest's "spm" and "spm_split" (None: none)."""
    names = ({"src": "spm.model", "tgt": "spm.model"} if src is tgt else
             {"src": f"spm.{src_lang}.model", "tgt": f"spm.{tgt_lang}.model"})
    split = src.split_proto or tgt.split_proto
    splits = {side: names[side].replace(".model", ".split.model") for side in names}
    for side, tok in (("src", src), ("tgt", tgt)):
        (tmp / names[side]).write_bytes(tok.proto)
        (tmp / names[side]).with_suffix(".vocab").write_text(tok.vocab_text(), encoding="utf-8")
        if split:
            (tmp / splits[side]).write_bytes(tok.split_proto or tok.proto)
    return names, splits if split else None


def languages_of(cfg: PreprocessConfig) -> list[str]:
    """Every language the corpora name (none: a bilingual run)."""
    return sorted({lang for specs in cfg.corpora.values() for c in specs
                   for lang in (c.src_lang, c.tgt_lang) if lang})
