"""nmt-preprocess: raw parallel text in, a binarized data directory out.

The stages, each streaming (memory does not grow with the corpus beyond SentencePiece's
training sample, 8 bytes a sentence of offsets and, with clean.dedup, a hash a unique pair):

1. open     check every input before anything is written: files exist, line counts agree, not empty
2. clean    read each split once (the training corpora one after the other, as one split):
            UTF-8, Unicode normalisation, stripped whitespace, empty pairs (and duplicate
            training pairs) dropped; the cleaned text goes to a temporary directory in chunks
            of CHUNK pairs of one corpus. valid/test keep it as {split}.clean.{lang}.
            (nmt.data.cleaning)
3. subwords train SentencePiece BPE on a seeded sample of the cleaned training text, the
            corpora's tags one piece each (or reuse a model, which must have the tags)
            (nmt.data.subwords)
4. encode   a pool of processes encodes the chunks; the main process writes them in order to
            {split}.{lang}.bin/.idx. Training pairs too long or too unequal in length are
            dropped; a corpus's tag goes first on its source sentences. With keep_text, the
            kept training text goes to train.clean.{lang}.bin/.idx. (nmt.data.binarize)
   shortlist with shortlist.k > 0: shortlist.pt from the encoded training pairs
            (nmt.data.shortlist)
5. commit   manifest.json (counts, corpora, config, checksums: nmt/data/manifest.py documents
            it); the temporary directory becomes out_dir.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nmt import __version__
from nmt.data.binarize import OrderedPool, encode_split, init_worker
from nmt.data.cleaning import COUNTS, QualityFilter, check_pairs_left, clean_splits
from nmt.data.corpus import Corpus, open_corpus
from nmt.data.manifest import FORMAT, MANIFEST, Manifest, Section, SplitSize
from nmt.data.subwords import (
    corpus_tags,
    is_checkpoint,
    language_entry,
    language_token,
    languages_of,
    load_subwords,
    tag_ids,
    train_subwords,
    write_subwords,
)
from nmt.data.tokenizer import vocab_sha256
from nmt.errors import NmtError
from nmt.system.files import check_output, new_directory, sha256_file

if TYPE_CHECKING:
    from nmt.config import CleanConfig, PreprocessConfig
    from nmt.config_corpora import TrainCorpus

# nmt.data.arrays and nmt.data.shortlist (which imports torch) are imported inside the
# functions that use them, as in nmt.data.binarize, whose encoding workers start quickly and
# small.


# ----------------------------------------------------------------------------- 5. commit
def total(parts: list[dict]) -> dict:
    """Per-corpus counts (or sizes) summed key by key; a count that does not apply (None)
    stays None."""
    return {key: None if parts[0][key] is None else sum(p[key] for p in parts)
            for key in parts[0]}


def report(manifest: Manifest, out: Path, seconds: float) -> str:
    """The counts as a small table (a row per training corpus too, when there are several),
    and one line on the vocabulary."""
    header = ("split", *COUNTS, "src_tokens", "tgt_tokens")
    rows = [header]

    def row(name: str, counts: dict, size: SplitSize | Section) -> tuple:
        cells = [counts.get(key) for key in COUNTS] + [size.src_tokens, size.tgt_tokens]
        return (name, *("-" if c is None else f"{c:,}" for c in cells))

    corpora = manifest.training_corpora()
    for split, counts in (manifest.counts or {}).items():
        rows.append(row(split, counts, manifest.splits[split]))
        if split == "train" and len(corpora) > 1:
            rows += [row(f"  {c.name} ("
                         f"{c.src_lang + '-' + c.tgt_lang + ', ' if c.src_lang else ''}"
                         f"weight {c.weight:g}{', tag ' + c.tag if c.tag else ''})",
                         c.counts or {}, c) for c in corpora]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(row, widths, strict=True))) for row in rows]
    m = manifest
    vocab = (f"joint {m.src_vocab_size:,}" if m.joint else
             f"{m.src_vocab_size:,} + {m.tgt_vocab_size:,}")
    lines.append(f"vocabulary: {vocab} ({', '.join(sorted({m.spm.src, m.spm.tgt}))}), "
                 f"ids {m.dtype}; wrote {out} in {seconds:.1f} s")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the command
def quality_filter(clean: CleanConfig) -> QualityFilter | None:
    """clean.comet_qe's filter of the training pairs (None without it): its CometKiwi model
    (nmt.wings.comet) loaded once, on a GPU where there is one; a one-line error for a
    reference-based COMET-22."""
    if not clean.comet_qe:
        return None
    import torch

    from nmt.wings.comet import load_comet

    comet = load_comet(clean.comet_qe, "cuda" if torch.cuda.is_available() else "cpu")
    if comet.spec.needs_reference:
        raise NmtError(f"clean.comet_qe: {clean.comet_qe} is a reference-based COMET-22; "
                       "filtering pairs needs a reference-free CometKiwi model")
    return QualityFilter(comet, clean.comet_qe_min)


def build(cfg: PreprocessConfig, corpora: dict[str, list[Corpus]], reused: tuple | None,
          tmp: Path) -> dict:
    """Stages 2-4 into the temporary directory tmp; returns the manifest (without checksums)."""
    from nmt.data.arrays import token_dtype
    from nmt.system.runtime import usable_cores

    langs = {"src": cfg.src_lang, "tgt": cfg.tgt_lang}
    workers = cfg.workers or usable_cores()
    specs = cfg.corpora
    seconds = {}
    t = time.time()
    counts, texts = clean_splits(cfg, corpora, tmp, quality_filter(cfg.clean))
    seconds["clean"], t = time.time() - t, time.time()
    src_tok, tgt_tok, spm_info = reused or train_subwords(
        texts["train"], cfg.bpe, sorted(
            {tag for c in specs.values() for tag in corpus_tags(c) if tag}
            | {language_token(lang) for lang in languages_of(cfg)}))
    tags = {role: tag_ids(specs[role], src_tok, cfg.bpe.model, role) for role in texts}
    languages = language_entry(cfg, src_tok, spm_info)
    spm_names, split_names = write_subwords(src_tok, tgt_tok, tmp, cfg.src_lang, cfg.tgt_lang)
    seconds["subwords"], t = time.time() - t, time.time()
    dtype = token_dtype(max(src_tok.vocab_size, tgt_tok.vocab_size))
    limits = (cfg.clean.max_tokens, cfg.clean.max_ratio)
    text_prefix = ({side: tmp / f"train.clean.{lang}" for side, lang in langs.items()}
                   if cfg.keep_text else None)
    sizes = {}
    workers = min(workers, max(len(text.chunks) for text in texts.values()))
    with OrderedPool(workers, init_worker, (src_tok.proto, tgt_tok.proto, src_tok.split_proto,
                                            tgt_tok.split_proto)) as pool:
        for role, text in texts.items():
            prefix = {side: tmp / f"{role}.{lang}" for side, lang in langs.items()}
            train = role == "train"
            sizes[role] = encode_split(pool, text, role, prefix, limits if train else None,
                                       dtype, counts[role], tags[role],
                                       text_prefix if train else None)
    seconds["encode"] = time.time() - t
    check_pairs_left(corpora["train"], sizes["train"], counts["train"])
    texts["train"].src.unlink()  # the cleaned training text is not kept as text
    texts["train"].tgt.unlink()
    manifest = {
        "format": FORMAT, "src_lang": cfg.src_lang, "tgt_lang": cfg.tgt_lang,
        "joint": src_tok.same_ids(tgt_tok), "spm": spm_names,
        **({"spm_split": split_names} if split_names else {}),
        "src_vocab_size": src_tok.vocab_size, "tgt_vocab_size": tgt_tok.vocab_size,
        "pad_id": tgt_tok.specials.pad, "unk_id": tgt_tok.sp.unk_id(),
        "bos_id": tgt_tok.specials.bos, "eos_id": tgt_tok.specials.eos,
        "dtype": dtype.name,
        "vocab_sha256": vocab_sha256(src_tok.proto, tgt_tok.proto),
        "splits": {role: total(parts) for role, parts in sizes.items()},
        "counts": {role: total(parts) for role, parts in counts.items()},
        **_corpus_entries(specs, tags, sizes, counts["train"], cfg.multilingual),
        "clean": {role: {side: f"{role}.clean.{lang}" for side, lang in langs.items()}
                  for role in texts if role != "train"},
        "spm_training": {k: v for k, v in spm_info.items()
                         if k not in ("languages", "source_eos")},
        "config": asdict(cfg), "nmt_version": __version__,
        **({"languages": languages} if languages else {}),
        **({"source_eos": False} if spm_info.get("source_eos") is False else {}),
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
    }
    _add_train_extras(manifest, cfg, tmp, dtype, text_prefix)
    return manifest


def _corpus_entries(specs: dict, tags: dict, sizes: dict, counts: list[dict],
                    multilingual: bool) -> dict:
    """The manifest's "corpora" (each training corpus: its spec, tag, first pair in the
    training arrays, sizes and cleaning counts) and, multilingual, "sections" (the same of the
    other splits' corpora)."""
    first = {role: np.cumsum([0] + [size["pairs"] for size in part])[:-1]
             for role, part in sizes.items()}
    out = {"corpora": [{"name": spec.name, "input": spec.path, "weight": spec.weight,
                        "tag": tag_piece, "tag_id": tag, "first": int(start), **size,
                        **pair_of(spec), "counts": corpus_counts}
                       for spec, tag_piece, tag, start, size, corpus_counts in zip(
                           specs["train"], corpus_tags(specs["train"]), tags["train"],
                           first["train"], sizes["train"], counts, strict=True)]}
    if multilingual:
        out["sections"] = {role: [{"name": spec.name, "input": spec.path, **pair_of(spec),
                                   "first": int(start), **size}
                                  for spec, start, size in zip(specs[role], first[role],
                                                               sizes[role], strict=True)]
                           for role in sizes if role != "train"}
    return out


def _add_train_extras(manifest: dict, cfg: PreprocessConfig, tmp: Path, dtype,
                      text_prefix: dict | None) -> None:
    """The shortlist (shortlist.k > 0, from the training arrays just written) and the kept
    training text (keep_text) into tmp and the manifest."""
    from nmt.data.arrays import TokenArray
    from nmt.data.shortlist import FILE as SHORTLIST
    from nmt.data.shortlist import build_shortlist

    if cfg.shortlist.k:
        t = time.time()
        src, tgt = (TokenArray(tmp / f"train.{lang}", dtype)
                    for lang in (cfg.src_lang, cfg.tgt_lang))
        built = build_shortlist(src, tgt, Manifest.from_dict(manifest, tmp / MANIFEST),
                                cfg.shortlist)
        built.save(tmp / SHORTLIST)
        manifest["shortlist"] = SHORTLIST
        manifest["seconds"]["shortlist"] = round(time.time() - t, 2)
    if text_prefix:
        manifest["train_text"] = {
            **{side: path.name for side, path in text_prefix.items()},
            **{f"{side}_bytes": (tmp / f"{path.name}.bin").stat().st_size
               for side, path in text_prefix.items()}}


def pair_of(spec: TrainCorpus) -> dict:
    """A corpus's manifest entries for its language pair ({} for a bilingual corpus)."""
    return {"src_lang": spec.src_lang, "tgt_lang": spec.tgt_lang} if spec.src_lang else {}


def reused_subwords(path: str) -> tuple:
    """bpe.model's tokenizers and info (nmt.data.subwords.load_subwords); a checkpoint's
    vocabulary is read here, nmt.checkpoint being above nmt.data."""
    from nmt.checkpoint import Checkpoint  # torch: only for a checkpoint's

    p = Path(path)
    vocab = Checkpoint.load(p).vocab if p.is_file() and is_checkpoint(p) else None
    return load_subwords(path, vocab)


def preprocess(cfg: PreprocessConfig) -> Manifest:
    """Check the inputs, clean, train subwords, encode, commit; returns the manifest."""
    start = time.time()
    out = Path(cfg.out_dir)
    check_output(out, "out_dir", directory=True)
    corpora = {role: [open_corpus(c.path, role, c.src_lang or cfg.src_lang,
                                  c.tgt_lang or cfg.tgt_lang, cfg.hf_name, cfg.hf_config)
                      for c in specs] for role, specs in cfg.corpora.items()}
    reused = reused_subwords(cfg.bpe.model) if cfg.bpe.model else None
    if reused:  # checked before any work
        for role, specs in cfg.corpora.items():
            tag_ids(specs, reused[0], cfg.bpe.model, role)
        language_entry(cfg, reused[0], reused[2])
    with new_directory(out, cfg.force, MANIFEST, "data directory") as tmp:
        entries = build(cfg, corpora, reused, tmp)
        entries["checksums"] = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        manifest = Manifest.from_dict(entries, tmp / MANIFEST)  # what every reader will check
        (tmp / MANIFEST).write_text(json.dumps(entries, indent=1) + "\n", encoding="utf-8")
    print(report(manifest, out, time.time() - start), flush=True)
    return manifest
