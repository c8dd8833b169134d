"""nmt-preprocess: raw parallel text in, a binarized data directory out.

The stages, each streaming (memory does not grow with the corpus beyond SentencePiece's
training sample, 8 bytes a sentence of offsets and, with clean.dedup, a hash a unique pair):

1. open     check every input before anything is written: files exist, line counts agree, not empty
2. clean    read each split once (the training corpora one after the other, as one split):
            UTF-8, Unicode normalisation, stripped whitespace, empty pairs (and duplicate
            training pairs) dropped; the cleaned text goes to a temporary directory in chunks
            of CHUNK pairs of one corpus. valid/test keep it as {split}.clean.{lang}.
3. subwords train SentencePiece BPE on a seeded sample of the cleaned training text, the
            corpora's tags one piece each (or reuse a model, which must have the tags)
4. encode   a pool of processes encodes the chunks; the main process writes them in order to
            {split}.{lang}.bin/.idx. Training pairs too long or too unequal in length are
            dropped; a corpus's tag goes first on its source sentences. With keep_text, the
            kept training text goes to train.clean.{lang}.bin/.idx.
   shortlist with shortlist.k > 0: shortlist.pt from the encoded training pairs (nmt.shortlist)
5. commit   manifest.json (counts, corpora, config, checksums: nmt/data.py documents it); the
            temporary directory becomes out_dir.
"""

from __future__ import annotations

import itertools
import json
import logging
import multiprocessing as mp
import re
import time
import unicodedata
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from nmt import __version__
from nmt.corpus import Corpus, open_corpus
from nmt.errors import NmtError
from nmt.files import check_output, new_directory, sha256_file
from nmt.tokenizer import Tokenizer, train_bpe, vocab_sha256
from nmt.vocab import Vocab

if TYPE_CHECKING:
    from nmt.config import BpeConfig, CleanConfig, PreprocessConfig, TrainCorpus

# nmt.data and nmt.shortlist (which import torch) are imported inside the main-process
# functions only, so that the encoding workers start quickly and small.

log = logging.getLogger(__name__)

CHUNK = 10_000  # pairs per encoding task
COUNTS = ("read", "invalid_utf8", "empty", "duplicate", "held_out", "too_long", "ratio",
          "kept")
_LINE_BREAKS = re.compile("[\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")  # what splitlines() splits


# ----------------------------------------------------------------------------- 2. clean
@dataclass
class CleanText:
    """One split's cleaned text: two files of `pairs` lines, cut into chunks for the workers."""

    src: Path
    tgt: Path
    pairs: int
    chunks: list[tuple[int, int, int, int]]  # byte ranges (src_start, src_end, tgt_start, tgt_end)
    owners: list[int]  # the corpus of each chunk (a chunk holds one corpus's pairs)


def normalize(text: str, form: str) -> str:
    """Strip the ends, turn line breaks inside into spaces, apply Unicode normalisation `form`."""
    text = text.strip()
    if not text.isprintable():
        text = _LINE_BREAKS.sub(" ", text)
    return unicodedata.normalize(form, text) if form else text


def clean_split(corpora: list[Corpus], clean: CleanConfig, src_out: Path, tgt_out: Path,
                counts: list[dict], held: HeldOut | None = None) -> CleanText:
    """Stream the corpora of one split, one after the other, through the text filters into
    src_out / tgt_out, counting each corpus's drops in its dict of `counts` (duplicates are
    looked for across the corpora; with `held`, a pair with a side among its sentences is
    dropped too)."""
    dedup = clean.dedup and corpora[0].role == "train"
    seen: set[int] = set()
    chunks, owners, src_buf, tgt_buf = [], [], [], []
    with open(src_out, "wb") as fs, open(tgt_out, "wb") as ft:
        def flush(owner: int) -> None:
            s0, t0 = fs.tell(), ft.tell()
            fs.write(("\n".join(src_buf) + "\n").encode())
            ft.write(("\n".join(tgt_buf) + "\n").encode())
            chunks.append((s0, fs.tell(), t0, ft.tell()))
            owners.append(owner)
            src_buf.clear()
            tgt_buf.clear()

        for k, corpus in enumerate(corpora):
            read = invalid = empty = duplicate = held_out = 0
            pairs = corpus.pairs(skip_invalid=clean.invalid_utf8 == "skip")
            for src, tgt in tqdm(pairs, total=corpus.size, desc=f"clean {corpus.role}",
                                 unit=" pairs", unit_scale=True, disable=None):
                read += 1
                if src is None:
                    invalid += 1
                    continue
                src, tgt = normalize(src, clean.normalize), normalize(tgt, clean.normalize)
                if not src or not tgt:
                    empty += 1
                    continue
                if dedup:
                    key = hash((src, tgt))
                    if key in seen:
                        duplicate += 1
                        continue
                    seen.add(key)
                if held is not None and held.has(k, src, tgt):
                    held_out += 1
                    continue
                src_buf.append(src)
                tgt_buf.append(tgt)
                if len(src_buf) == CHUNK:
                    flush(k)
            if src_buf:
                flush(k)
            kept = read - invalid - empty - duplicate - held_out
            counts[k].update(read=read, invalid_utf8=invalid, empty=empty, kept=kept,
                             duplicate=duplicate if dedup else None,
                             held_out=held_out if held is not None else None)
            if kept == 0:
                raise NmtError(f"{corpus.role}: no pairs left after cleaning {corpus.name} "
                               f"({_summary(counts[k])})")
    return CleanText(src_out, tgt_out, sum(c["kept"] for c in counts), chunks, owners)


@dataclass
class HeldOut:
    """The valid and test sentences of a multilingual run, as hashes of (language, text): a
    training pair with a side among them is dropped (held_out), so that no test sentence of
    one pair is trained on through another (en-de's English test side in en-fr's training)."""

    pairs: list[tuple[str, str]]  # each training corpus's (src_lang, tgt_lang)
    sentences: set[int]  # hash((language, cleaned text)) of every valid and test side

    def add(self, text: CleanText, pairs: list[tuple[str, str]]) -> None:
        """Every side of a cleaned split whose corpora have the language `pairs`."""
        for (s0, s1, t0, t1), owner in zip(text.chunks, text.owners, strict=True):
            src_lang, tgt_lang = pairs[owner]
            self.sentences.update(hash((src_lang, line))
                                  for line in _read_lines(str(text.src), s0, s1))
            self.sentences.update(hash((tgt_lang, line))
                                  for line in _read_lines(str(text.tgt), t0, t1))

    def has(self, corpus: int, src: str, tgt: str) -> bool:
        """Whether a pair of training corpus `corpus` has a held-out side."""
        src_lang, tgt_lang = self.pairs[corpus]
        return (hash((src_lang, src)) in self.sentences
                or hash((tgt_lang, tgt)) in self.sentences)


# ----------------------------------------------------------------------------- 3. subwords
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


def load_subwords(path: str) -> tuple[Tokenizer, Tokenizer, dict]:
    """Reuse a .model file (joint), the model(s) of a data directory written by nmt-preprocess,
    or a checkpoint's (nmt-train's, nmt-import's: fine-tuning data gets the model's ids).
    The info's "languages": those the checkpoint (or data directory) records, if any
    (nmt.languages), which the data directory and the models trained on it keep."""
    from nmt.checkpoint import load_checkpoint
    from nmt.data import read_manifest

    p = Path(path)
    languages = None
    if p.is_dir():
        manifest = read_manifest(p)
        src = Tokenizer.from_file(p / manifest["spm"]["src"])
        tgt = Tokenizer.from_file(p / manifest["spm"]["tgt"])
        languages = manifest.get("languages")
    elif not p.exists():
        raise NmtError(f"bpe.model={path}: no such file, data directory or checkpoint")
    elif p.read_bytes()[:2] == b"PK":  # a zip: a torch checkpoint
        vocab = Vocab.from_dict(load_checkpoint(p)["vocab"], str(p))
        src, tgt = Tokenizer(vocab.src_spm, str(p)), Tokenizer(vocab.tgt_spm, str(p))
        languages = vocab.languages
    else:
        src = tgt = Tokenizer.from_file(p)
    if src.proto == tgt.proto:
        tgt = src
    info = {"sentences": 0, "sampled": False, "reused": str(p.resolve())}
    return src, tgt, info if languages is None else {**info, "languages": languages}


def language_token(lang: str) -> str:
    """The piece that asks a multilingual model trained here for language `lang`: >>lang<<
    first on the source (OPUS-MT's convention, "tag" in nmt.languages)."""
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
    """The manifest's "languages" (nmt.languages): a multilingual directory's, {"convention":
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
                   ) -> dict[str, str]:
    """Write the model(s) and their .vocab listing into tmp; returns the manifest's "spm"."""
    names = ({"src": "spm.model", "tgt": "spm.model"} if src is tgt else
             {"src": f"spm.{src_lang}.model", "tgt": f"spm.{tgt_lang}.model"})
    for side, tok in (("src", src), ("tgt", tgt)):
        (tmp / names[side]).write_bytes(tok.proto)
        (tmp / names[side]).with_suffix(".vocab").write_text(tok.vocab_text(), encoding="utf-8")
    return names


# ----------------------------------------------------------------------------- 4. encode
_WORKER: tuple[Tokenizer, Tokenizer] | None = None  # each process's (source, target) tokenizers


def _init_worker(src_proto: bytes, tgt_proto: bytes) -> None:
    """Load the SentencePiece model(s) once per worker process."""
    global _WORKER
    src = Tokenizer(src_proto)
    _WORKER = (src, src if tgt_proto == src_proto else Tokenizer(tgt_proto))


def _read_lines(path: str, start: int, end: int) -> list[str]:
    """The lines in bytes [start, end) of a cleaned text file (each ends with a newline)."""
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start).decode("utf-8").split("\n")[:-1]


def _concat(ids: list[list[int]], lengths: np.ndarray, keep: np.ndarray, dtype: str) -> np.ndarray:
    """The kept sentences' ids, concatenated into one array (sum of kept lengths,)."""
    kept = itertools.chain.from_iterable(itertools.compress(ids, keep))
    return np.fromiter(kept, dtype=dtype, count=int(lengths[keep].sum()))


def _text_bytes(lines: list[str], keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kept lines' UTF-8 bytes, concatenated (uint8), and their byte lengths (n kept,)."""
    data = [line.encode("utf-8") for line in itertools.compress(lines, keep)]
    return (np.frombuffer(b"".join(data), dtype=np.uint8),
            np.fromiter(map(len, data), dtype=np.int64, count=len(data)))


def encode_chunk(task: tuple) -> tuple:
    """Encode one chunk of pairs, drop those over the limits, put the corpus's tag (an id, or
    None) first on the source side; returns arrays, counts and, with keep_text, the kept
    lines' bytes (source and target)."""
    src_path, tgt_path, (s0, s1, t0, t1), limits, dtype, tag, keep_text = task
    src_tok, tgt_tok = _WORKER
    src_lines, tgt_lines = _read_lines(src_path, s0, s1), _read_lines(tgt_path, t0, t1)
    src_ids = src_tok.encode(src_lines, num_threads=1)
    tgt_ids = tgt_tok.encode(tgt_lines, num_threads=1)
    ls = np.fromiter(map(len, src_ids), dtype=np.int64, count=len(src_ids))  # (n,)
    lt = np.fromiter(map(len, tgt_ids), dtype=np.int64, count=len(tgt_ids))  # (n,)
    counts = {"empty": 0, "too_long": 0, "ratio": 0}
    keep = np.ones(len(ls), dtype=bool)
    if limits is not None:  # training split: Moses clean-corpus-n on subword lengths
        max_tokens, max_ratio = limits
        empty = (ls == 0) | (lt == 0)  # text that SentencePiece normalises away
        too_long = ~empty & ((ls > max_tokens) | (lt > max_tokens))
        ratio = ~empty & ~too_long & (np.maximum(ls, lt) > max_ratio * np.minimum(ls, lt))
        keep = ~(empty | too_long | ratio)
        counts = {"empty": int(empty.sum()), "too_long": int(too_long.sum()),
                  "ratio": int(ratio.sum())}
    if tag is not None:  # after the filters: a tag changes no pair's fate
        src_ids, ls = [[tag, *ids] for ids in src_ids], ls + 1
    text = ((*_text_bytes(src_lines, keep), *_text_bytes(tgt_lines, keep)) if keep_text
            else None)
    return (_concat(src_ids, ls, keep, dtype), ls[keep], _concat(tgt_ids, lt, keep, dtype),
            lt[keep], counts, text)


class OrderedPool:
    """Map a function over tasks on worker processes; results come back in task order.

    At most 2 tasks per worker are in flight, so a long task list never piles up in memory.
    With one worker everything runs in this process.
    """

    def __init__(self, workers: int, initializer, initargs: tuple):
        self.workers = workers
        self.pool = None
        if workers > 1:  # spawn: no fork of a process that may hold threads (tqdm, Arrow)
            self.pool = mp.get_context("spawn").Pool(workers, initializer, initargs)
        else:
            initializer(*initargs)

    def imap(self, fn, tasks):
        """Yield fn(task) for each task, in order."""
        if self.pool is None:
            yield from map(fn, tasks)
            return
        pending = deque()
        for task in tasks:
            pending.append(self.pool.apply_async(fn, (task,)))
            if len(pending) >= 2 * self.workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    def __enter__(self) -> OrderedPool:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def encode_split(pool: OrderedPool, text: CleanText, role: str, prefix: dict[str, Path],
                 limits: tuple[int, float] | None, dtype: np.dtype, counts: list[dict],
                 tags: list[int | None], text_prefix: dict[str, Path] | None) -> list[dict]:
    """Encode a cleaned split into prefix[side].bin/.idx (and its kept text into
    text_prefix[side].bin/.idx); completes each corpus's `counts` and returns each corpus's
    {"pairs", "src_tokens", "tgt_tokens"}."""
    from contextlib import ExitStack

    from nmt.data import TokenArrayWriter

    tasks = [(str(text.src), str(text.tgt), chunk, limits, dtype.str, tags[owner],
              text_prefix is not None) for chunk, owner in zip(text.chunks, text.owners,
                                                               strict=True)]
    sizes = [{"pairs": 0, "src_tokens": 0, "tgt_tokens": 0} for _ in counts]
    dropped = [{"empty": 0, "too_long": 0, "ratio": 0} for _ in counts]
    with ExitStack() as stack:
        out = {side: stack.enter_context(TokenArrayWriter(prefix[side], dtype))
               for side in ("src", "tgt")}
        kept_text = {side: stack.enter_context(TokenArrayWriter(text_prefix[side], np.uint8))
                     for side in ("src", "tgt")} if text_prefix else {}
        bar = stack.enter_context(tqdm(total=text.pairs, desc=f"encode {role}", unit=" pairs",
                                       unit_scale=True, disable=None))
        results = pool.imap(encode_chunk, tasks)
        for owner, (src, src_len, tgt, tgt_len, chunk_counts, lines) in zip(
                text.owners, results, strict=True):
            out["src"].add_chunk(src, src_len)
            out["tgt"].add_chunk(tgt, tgt_len)
            if kept_text:
                kept_text["src"].add_chunk(*lines[:2])
                kept_text["tgt"].add_chunk(*lines[2:])
            sizes[owner]["pairs"] += len(src_len)
            sizes[owner]["src_tokens"] += int(src_len.sum())
            sizes[owner]["tgt_tokens"] += int(tgt_len.sum())
            for key, n in chunk_counts.items():
                dropped[owner][key] += n
            bar.update(sum(chunk_counts.values()) + len(src_len))
    for corpus_counts, size, drops in zip(counts, sizes, dropped, strict=True):
        corpus_counts["empty"] += drops["empty"]
        corpus_counts["kept"] = size["pairs"]
        if limits is not None:
            corpus_counts.update(too_long=drops["too_long"], ratio=drops["ratio"])
    return sizes


def total(parts: list[dict]) -> dict:
    """Per-corpus counts (or sizes) summed key by key; a count that does not apply (None)
    stays None."""
    return {key: None if parts[0][key] is None else sum(p[key] for p in parts)
            for key in parts[0]}


# ----------------------------------------------------------------------------- 5. commit
def report(manifest: dict, out: Path, seconds: float) -> str:
    """The counts as a small table (a row per training corpus too, when there are several),
    and one line on the vocabulary."""
    header = ("split", *COUNTS, "src_tokens", "tgt_tokens")
    rows = [header]

    def row(name: str, counts: dict, info: dict) -> tuple:
        cells = [counts.get(key) for key in COUNTS] + [info["src_tokens"], info["tgt_tokens"]]
        return (name, *("-" if c is None else f"{c:,}" for c in cells))

    for split, counts in manifest["counts"].items():
        rows.append(row(split, counts, manifest["splits"][split]))
        if split == "train" and len(manifest["corpora"]) > 1:
            rows += [row(f"  {c['name']} ("
                         f"{c['src_lang'] + '-' + c['tgt_lang'] + ', ' if 'src_lang' in c else ''}"
                         f"weight {c['weight']:g}{', tag ' + c['tag'] if c['tag'] else ''})",
                         c["counts"], c) for c in manifest["corpora"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(row, widths, strict=True))) for row in rows]
    vocab = (f"joint {manifest['src_vocab_size']:,}" if manifest["joint"] else
             f"{manifest['src_vocab_size']:,} + {manifest['tgt_vocab_size']:,}")
    lines.append(f"vocabulary: {vocab} ({', '.join(sorted(set(manifest['spm'].values())))}), "
                 f"ids {manifest['dtype']}; wrote {out} in {seconds:.1f} s")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the command
def build(cfg: PreprocessConfig, corpora: dict[str, list[Corpus]], reused: tuple | None,
          tmp: Path) -> dict:
    """Stages 2-4 into the temporary directory tmp; returns the manifest (without checksums)."""
    from nmt.data import FORMAT, token_dtype
    from nmt.runtime import usable_cores

    langs = {"src": cfg.src_lang, "tgt": cfg.tgt_lang}
    workers = cfg.workers or usable_cores()
    specs = cfg.corpora
    seconds = {}
    t = time.time()
    counts, texts = clean_splits(cfg, corpora, tmp)
    seconds["clean"], t = time.time() - t, time.time()
    src_tok, tgt_tok, spm_info = reused or train_subwords(
        texts["train"], cfg.bpe, sorted(
            {tag for c in specs.values() for tag in corpus_tags(c) if tag}
            | {language_token(lang) for lang in languages_of(cfg)}))
    tags = {role: tag_ids(specs[role], src_tok, cfg.bpe.model, role) for role in texts}
    languages = language_entry(cfg, src_tok, spm_info)
    spm_names = write_subwords(src_tok, tgt_tok, tmp, cfg.src_lang, cfg.tgt_lang)
    seconds["subwords"], t = time.time() - t, time.time()
    dtype = token_dtype(max(src_tok.vocab_size, tgt_tok.vocab_size))
    limits = (cfg.clean.max_tokens, cfg.clean.max_ratio)
    text_prefix = ({side: tmp / f"train.clean.{lang}" for side, lang in langs.items()}
                   if cfg.keep_text else None)
    sizes = {}
    workers = min(workers, max(len(text.chunks) for text in texts.values()))
    with OrderedPool(workers, _init_worker, (src_tok.proto, tgt_tok.proto)) as pool:
        for role, text in texts.items():
            prefix = {side: tmp / f"{role}.{lang}" for side, lang in langs.items()}
            train = role == "train"
            sizes[role] = encode_split(pool, text, role, prefix, limits if train else None,
                                       dtype, counts[role], tags[role],
                                       text_prefix if train else None)
    seconds["encode"] = time.time() - t
    _check_pairs_left(corpora["train"], sizes["train"], counts["train"])
    texts["train"].src.unlink()  # the cleaned training text is not kept as text
    texts["train"].tgt.unlink()
    manifest = {
        "format": FORMAT, "src_lang": cfg.src_lang, "tgt_lang": cfg.tgt_lang,
        "joint": src_tok.same_ids(tgt_tok), "spm": spm_names,
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
        "spm_training": {k: v for k, v in spm_info.items() if k != "languages"},
        "config": asdict(cfg), "nmt_version": __version__,
        **({"languages": languages} if languages else {}),
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
    }
    _add_train_extras(manifest, cfg, tmp, dtype, text_prefix)
    return manifest


def _check_pairs_left(corpora: list[Corpus], sizes: list[dict], counts: list[dict]) -> None:
    """A one-line NmtError naming a training corpus that cleaning emptied."""
    for corpus, size, corpus_counts in zip(corpora, sizes, counts, strict=True):
        if size["pairs"] == 0:
            raise NmtError(f"train: no pairs left after cleaning {corpus.name} "
                           f"({_summary(corpus_counts)})")


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
    from nmt.data import TokenArray
    from nmt.shortlist import FILE as SHORTLIST
    from nmt.shortlist import build_shortlist

    if cfg.shortlist.k:
        t = time.time()
        src, tgt = (TokenArray(tmp / f"train.{lang}", dtype)
                    for lang in (cfg.src_lang, cfg.tgt_lang))
        build_shortlist(src, tgt, manifest, cfg.shortlist).save(tmp / SHORTLIST)
        manifest["shortlist"] = SHORTLIST
        manifest["seconds"]["shortlist"] = round(time.time() - t, 2)
    if text_prefix:
        manifest["train_text"] = {
            **{side: path.name for side, path in text_prefix.items()},
            **{f"{side}_bytes": (tmp / f"{path.name}.bin").stat().st_size
               for side, path in text_prefix.items()}}


def clean_splits(cfg: PreprocessConfig, corpora: dict[str, list[Corpus]], tmp: Path
                 ) -> tuple[dict[str, list[dict]], dict[str, CleanText]]:
    """Stage 2 for every split into tmp: each corpus's counts and each split's cleaned text.
    A multilingual run cleans valid and test first, and holds their sentences out of the
    training split (HeldOut)."""
    langs = {"src": cfg.src_lang, "tgt": cfg.tgt_lang}
    pairs = {role: [(c.src_lang, c.tgt_lang) for c in specs]
             for role, specs in cfg.corpora.items()}
    held = HeldOut(pairs["train"], set()) if cfg.multilingual else None
    counts, texts = {}, {}
    for role in sorted(corpora, key=lambda role: role == "train"):  # train last
        paths = [tmp / f"{role}.clean.{langs[side]}" for side in ("src", "tgt")]
        counts[role] = [dict.fromkeys(COUNTS) for _ in corpora[role]]
        texts[role] = clean_split(corpora[role], cfg.clean, *paths, counts[role],
                                  held if role == "train" else None)
        if held is not None and role != "train":
            held.add(texts[role], pairs[role])
    order = [role for role in ("train", "valid", "test") if role in texts]
    return {role: counts[role] for role in order}, {role: texts[role] for role in order}


def languages_of(cfg: PreprocessConfig) -> list[str]:
    """Every language the corpora name (none: a bilingual run)."""
    return sorted({lang for specs in cfg.corpora.values() for c in specs
                   for lang in (c.src_lang, c.tgt_lang) if lang})


def pair_of(spec: TrainCorpus) -> dict:
    """A corpus's manifest entries for its language pair ({} for a bilingual corpus)."""
    return {"src_lang": spec.src_lang, "tgt_lang": spec.tgt_lang} if spec.src_lang else {}


def _summary(counts: dict) -> str:
    """Non-zero counts as `key n` pairs, for an error message."""
    return ", ".join(f"{k} {v:,}" for k, v in counts.items() if v and k != "kept")


def preprocess(cfg: PreprocessConfig) -> dict:
    """Check the inputs, clean, train subwords, encode, commit; returns the manifest."""
    start = time.time()
    out = Path(cfg.out_dir)
    check_output(out, "out_dir", directory=True)
    corpora = {role: [open_corpus(c.path, role, c.src_lang or cfg.src_lang,
                                  c.tgt_lang or cfg.tgt_lang, cfg.hf_name, cfg.hf_config)
                      for c in specs] for role, specs in cfg.corpora.items()}
    reused = load_subwords(cfg.bpe.model) if cfg.bpe.model else None
    if reused:  # checked before any work
        for role, specs in cfg.corpora.items():
            tag_ids(specs, reused[0], cfg.bpe.model, role)
        language_entry(cfg, reused[0], reused[2])
    with new_directory(out, cfg.force, "manifest.json", "data directory") as tmp:
        manifest = build(cfg, corpora, reused, tmp)
        manifest["checksums"] = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    print(report(manifest, out, time.time() - start), flush=True)
    return manifest
