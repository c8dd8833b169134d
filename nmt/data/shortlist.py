"""A lexical shortlist: per batch, the output layer restricted to the target pieces likely to
appear (Marian's shortlists, CTranslate2's vocabulary map).

Built from a data directory's training pairs (nmt-preprocess shortlist.k=K, or
`write_shortlist`): c(s, t) counts the training pairs whose source holds piece s and whose
target holds piece t (sentence-level co-occurrence, no alignment), c(s) and c(t) the pairs
holding each. Every source piece keeps its k best target pieces by Dice, 2 c(s, t) / (c(s) +
c(t)) (or by p(t|s) = c(s, t) / c(s), shortlist.score=prob); the `frequent` target pieces in
the most pairs and EOS are candidates always. The file (DATA/shortlist.pt, a dict of int
tensors read with weights_only=True) records the vocabulary's sizes and checksum, so that a
checkpoint of another vocabulary is refused in one line.

Decoding with search.shortlist=FILE (nmt.decoding.batches.BatchJob): a batch's candidates are
the union over its sentences of their source pieces' lists, the fixed ones, and the pieces of
forced prefixes and constraints, as in Marian and CTranslate2. So a sentence's translation may
depend on its batch mates (batching changes outputs only through the shortlist). FastModel
multiplies by those rows of the output projection only; log-softmax is over the candidates,
and the search works in their columns (nmt.decoding.rules.Columns; with lexical constraints,
in full-vocabulary rows with every other piece at log P = -inf). `vmap_text` gives the same lists as
CTranslate2's vocabulary map (vmap.txt, translate_batch(use_vmap=True)), which
nmt.wings.interop.ct2_export.write_vmap writes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
from torch import Tensor

from nmt.errors import NmtError
from nmt.system.files import write_atomically

if TYPE_CHECKING:
    from nmt.config import ShortlistConfig
    from nmt.data.arrays import TokenArray
    from nmt.data.manifest import Manifest

FORMAT = 1  # the shortlist file format written here
FILE = "shortlist.pt"  # its name in a data directory
MAX_TABLE = 2 ** 28  # co-occurrence counts held in memory at most (int32: 1 GiB)
CHUNK = 20_000  # training pairs whose lengths are read at a time
PRODUCTS = 1 << 20  # (source piece, target piece) products counted at a time, at most


class Candidates(NamedTuple):
    """A batch's shortlist: the target ids it may emit, and the full vocabulary's size."""

    ids: Tensor  # (V',) sorted, unique
    vocab_size: int  # V


@dataclass
class Shortlist:
    """Per source piece its candidate target pieces, and the pieces always candidates."""

    table: Tensor  # (source V, k) int64: each source piece's candidates, -1 where fewer
    always: Tensor  # (n,) int64: the most frequent target pieces and EOS
    src_vocab_size: int
    tgt_vocab_size: int
    vocab_sha256: str  # the data directory's (and its checkpoints') vocabulary checksum
    name: str = "<shortlist>"  # the file, for messages

    def candidates(self, sources: list[list[int]], extra: list[int]) -> Candidates:
        """The union of the sources' pieces' candidates, the fixed ones and `extra` (forced
        prefixes' and constraints' pieces)."""
        src = torch.tensor(sorted({t for s in sources for t in s}), dtype=torch.long)
        ids = torch.cat([self.table[src].view(-1), self.always,
                         torch.tensor(extra, dtype=torch.long)])
        return Candidates(ids[ids >= 0].unique(), self.tgt_vocab_size)

    def check(self, vocab_sha256: str | None, tgt_vocab_size: int, what: str) -> None:
        """A one-line error unless the shortlist was built for this vocabulary (sha256 None:
        the size alone is checked)."""
        if tgt_vocab_size != self.tgt_vocab_size or (vocab_sha256 not in (None, self.vocab_sha256)):
            theirs = f"{tgt_vocab_size} target pieces" + (
                f", sha256 {vocab_sha256[:12]}" if vocab_sha256 else "")
            raise NmtError(f"search.shortlist={self.name}: built for another vocabulary "
                           f"({self.tgt_vocab_size} target pieces, sha256 "
                           f"{self.vocab_sha256[:12]}) than {what}'s ({theirs}); build it "
                           f"from the model's data directory")

    def save(self, path: str | Path) -> None:
        """Write the file atomically."""
        state = {"format": FORMAT, "table": self.table.to(torch.int32),
                 "always": self.always.to(torch.int32), "src_vocab_size": self.src_vocab_size,
                 "tgt_vocab_size": self.tgt_vocab_size, "vocab_sha256": self.vocab_sha256}
        write_atomically(path, lambda f: torch.save(state, f))


_LOADED: dict[tuple, Shortlist] = {}  # per process: by path, size and modification time


def load_shortlist(path: str | Path) -> Shortlist:
    """A shortlist file, read once per process (again if the file changed); a one-line error
    for anything that is not one."""
    try:
        stat = os.stat(path)
    except OSError as e:
        raise NmtError(f"search.shortlist={path}: cannot read ({e.strerror})") from None
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _LOADED:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            shortlist = Shortlist(state["table"].long(), state["always"].long(),
                                  int(state["src_vocab_size"]), int(state["tgt_vocab_size"]),
                                  str(state["vocab_sha256"]), str(path))
        except Exception as e:  # noqa: BLE001 - any unreadable file gets the same one line
            raise NmtError(f"search.shortlist={path}: not a shortlist file written by "
                           f"nmt-preprocess shortlist.k=K ({type(e).__name__})") from None
        if state.get("format", 0) > FORMAT or shortlist.table.size(0) != shortlist.src_vocab_size:
            raise NmtError(f"search.shortlist={path}: format {state.get('format')} or its "
                           f"table does not fit (upgrade nmt or build it again)")
        _LOADED[key] = shortlist
    return _LOADED[key]


# ----------------------------------------------------------------------------- building
def _chunks(src: TokenArray, tgt: TokenArray, budget: int) -> Iterator[tuple[int, int]]:
    """Consecutive ranges [start, end) of pairs whose (source length + 1) x (target length
    + 1) sum to at most `budget` (a longer pair alone): a bound on the (source piece, target
    piece) products of a range, and on its tokens. Lengths are read CHUNK pairs at a time."""
    for first in range(0, len(src), CHUNK):
        last = min(first + CHUNK, len(src))
        size = ((np.diff(src.offsets[first:last + 1]) + 1)
                * (np.diff(tgt.offsets[first:last + 1]) + 1))  # (pairs,) bounds of products
        cum, start, before = np.cumsum(size), 0, 0
        while start < len(size):
            end = max(start + 1, int(np.searchsorted(cum, before + budget, side="right")))
            yield first + start, first + end
            start, before = end, int(cum[end - 1])


def _unique_per_sentence(array: TokenArray, start: int, end: int, V: int
                         ) -> tuple[np.ndarray, np.ndarray]:
    """The distinct pieces of sentences [start, end): (sentence - start, piece) pairs sorted
    by sentence, then piece, as int32."""
    offsets = array.offsets[start:end + 1]
    tokens = np.asarray(array.tokens[offsets[0]:offsets[-1]], dtype=np.int64)
    sentence = np.repeat(np.arange(end - start, dtype=np.int64), np.diff(offsets))
    keys = np.unique(sentence * V + tokens)
    return (keys // V).astype(np.int32), (keys % V).astype(np.int32)


def _pairs(s_sent: np.ndarray, s_tok: np.ndarray, t_sent: np.ndarray, t_tok: np.ndarray,
           n: int, Vt: int) -> np.ndarray:
    """Every (source piece, target piece) pair within each of n sentences, as s Vt + t (int32:
    a table of at most MAX_TABLE counts); three arrays of their number alive at most."""
    nt = np.bincount(t_sent, minlength=n)  # (n,) distinct target pieces per sentence
    t_start = np.cumsum(nt) - nt
    rep = nt[s_sent]  # each source piece meets its sentence's target pieces
    block = np.cumsum(rep) - rep  # where each source piece's block of pairs starts
    t_index = np.repeat((t_start[s_sent] - block).astype(np.int32), rep)  # (P,)
    t_index += np.arange(len(t_index), dtype=np.int32)  # the target piece of each pair
    keys = np.repeat(s_tok * np.int32(Vt), rep)  # (P,)
    keys += t_tok[t_index]
    return keys


def _count(counts: np.ndarray, keys: np.ndarray) -> None:
    """counts[k] += how often k is in keys (sorted in place; np.unique would copy them)."""
    keys.sort()
    new = np.empty(len(keys), dtype=bool)  # (P,) where a run of equal keys starts
    new[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    del new
    counts[keys[starts]] += np.diff(starts, append=len(keys)).astype(np.int32)


def cooccurrence(src: TokenArray, tgt: TokenArray, Vs: int, Vt: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sentence-level counts: c(s, t) (Vs, Vt) int32, c(s) (Vs,) and c(t) (Vt,) int64; counted
    PRODUCTS source x target pieces at a time: beside the table, a peak of at most some 36
    bytes each (40 MiB), whatever the sentences' lengths."""
    if Vs * Vt > MAX_TABLE:
        raise NmtError(f"shortlist.k: a {Vs:,} x {Vt:,} co-occurrence table is more than this "
                       f"builder holds ({MAX_TABLE:,} counts); use a smaller vocabulary")
    counts = np.zeros(Vs * Vt, dtype=np.int32)
    c_src, c_tgt = np.zeros(Vs, dtype=np.int64), np.zeros(Vt, dtype=np.int64)
    for start, end in _chunks(src, tgt, PRODUCTS):
        s_sent, s_tok = _unique_per_sentence(src, start, end, Vs)
        t_sent, t_tok = _unique_per_sentence(tgt, start, end, Vt)
        c_src += np.bincount(s_tok, minlength=Vs)
        c_tgt += np.bincount(t_tok, minlength=Vt)
        _count(counts, _pairs(s_sent, s_tok, t_sent, t_tok, end - start, Vt))
    return counts.reshape(Vs, Vt), c_src, c_tgt


def best_targets(counts: np.ndarray, c_src: np.ndarray, c_tgt: np.ndarray, k: int,
                 score: str, rows: int = 512) -> Tensor:
    """Each source piece's k best co-occurring target pieces by `score` (dice or prob),
    best first: (Vs, k) int64, -1 where fewer than k co-occur."""
    Vs, Vt = counts.shape
    k = min(k, Vt)
    out = torch.full((Vs, k), -1, dtype=torch.long)
    ct = torch.from_numpy(c_tgt).double()
    for a in range(0, Vs, rows):  # (rows, Vt) scores at a time
        c = torch.from_numpy(counts[a:a + rows]).double()
        cs = torch.from_numpy(c_src[a:a + rows]).double().unsqueeze(1)
        s = 2 * c / (cs + ct) if score == "dice" else c / cs.clamp(min=1)
        s[c == 0] = -1.0  # never together: not a candidate
        value, index = s.topk(k, dim=1)
        out[a:a + rows] = index.masked_fill(value < 0, -1)
    return out


def build_shortlist(src: TokenArray, tgt: TokenArray, manifest: Manifest, cfg: ShortlistConfig
                    ) -> Shortlist:
    """The shortlist of a training split's token arrays (see the module's doc)."""
    Vs, Vt = manifest.src_vocab_size, manifest.tgt_vocab_size
    counts, c_src, c_tgt = cooccurrence(src, tgt, Vs, Vt)
    table = best_targets(counts, c_src, c_tgt, cfg.k, cfg.score)
    frequent = torch.from_numpy(np.argsort(-c_tgt, kind="stable")[:cfg.frequent])
    frequent = frequent[torch.from_numpy(c_tgt)[frequent] > 0]
    always = torch.cat([frequent, torch.tensor([manifest.eos_id])]).unique()
    return Shortlist(table, always, Vs, Vt, manifest.vocab_sha256)


def write_shortlist(data_dir: str | Path, cfg: ShortlistConfig, out: str | Path | None = None
                    ) -> Path:
    """Build the shortlist of a data directory's training split into `out` (default
    DATA/shortlist.pt, which is then not among the manifest's checksums)."""
    from nmt.data.arrays import ParallelData
    from nmt.data.manifest import read_manifest

    manifest = read_manifest(data_dir)
    data = ParallelData(data_dir, "train", manifest)
    out = Path(out or Path(data_dir) / FILE)
    build_shortlist(data.src, data.tgt, manifest, cfg).save(out)
    return out


# ----------------------------------------------------------------------------- CTranslate2
def vmap_text(shortlist: Shortlist, src_pieces: list[str], tgt_pieces: list[str]) -> str:
    """CTranslate2's vocabulary map: `source piece<TAB>target pieces` a line (space-separated),
    the always-candidates on a line with an empty source."""
    lines = ["\t" + " ".join(tgt_pieces[t] for t in shortlist.always.tolist())]
    for s, row in enumerate(shortlist.table.tolist()):
        targets = [tgt_pieces[t] for t in row if t >= 0]
        if targets:
            lines.append(f"{src_pieces[s]}\t{' '.join(targets)}")
    return "\n".join(lines) + "\n"
