"""Robustness noise on training pairs (train.augment), after OpusTrainer's modifiers.

Models trained on clean text break on text that is not: all capitals, Title Case, a missing
final full stop, typos. OpusTrainer (Mozilla's translations pipeline) and eole's transforms
rewrite a share of the training pairs on the fly; these are our functions for it, pure (text
in, text out, given a random.Random), applied by nmt.data.sampling.SubwordSampler to the
cleaned text nmt-preprocess keep_text=true kept, before it is encoded:

- upper case: both sides upper-cased (OpusTrainer's UpperCase);
- title case: the first letter of every whitespace-separated word upper-cased on both sides,
  the rest left as it is (OpusTrainer's TitleCase code; its README says "the rest lowercase",
  its code does not: acronyms stay whole);
- final punctuation dropped on both sides, where both end in punctuation (Unicode category
  P*: the final run of it, e.g. "?!" or '."');
- typos on the source only (OpusTrainer's Typos): `edits` character edits, each a swap of two
  neighbouring letters, the deletion of one or the repeat of one, equally likely, at letters
  or digits chosen uniformly (a deletion never empties a word of its last one).

Tags are never touched: `<2de>`, `<BT>`, `<ph1>`-style pieces, OPUS-MT's `>>de<<` and
`__KEEP1__`-style placeholders (PROTECTED) keep their case and characters, and punctuation
that a tag ends with is not dropped. (The corpus tag nmt-preprocess puts first on source
sentences is not in the kept text at all: SubwordSampler adds it by id.)
"""

from __future__ import annotations

import random
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nmt.config import AugmentConfig

# Pieces left whole: <2de>, <BT>, </b>; >>de<<; __KEEP1__
PROTECTED = re.compile(r"<[^<>\s]+>|>>[^<>\s]+<<|__[A-Za-z0-9]+__")


def _free_parts(text: str, fn: Callable[[str, bool], str]) -> str:
    """text with fn(part, starts_text) applied to each part outside PROTECTED spans."""
    out, at = [], 0
    for m in PROTECTED.finditer(text):
        out += [fn(text[at:m.start()], at == 0), m.group()]
        at = m.end()
    out.append(fn(text[at:], at == 0))
    return "".join(out)


def upper_case(text: str) -> str:
    """Every letter outside tags upper-cased."""
    return _free_parts(text, lambda part, _: part.upper())


def title_case(text: str) -> str:
    """The first character of every whitespace-separated word outside tags upper-cased (a
    word right after a tag counts as one), the rest as it is."""
    return _free_parts(text, lambda part, _: re.sub(r"(?:^|(?<=\s))\S",
                                                    lambda m: m.group().upper(), part))


def _final_punctuation(text: str) -> int:
    """How many characters at the end of text (trailing spaces included) are its final run
    of punctuation outside tags; 0 where it does not end in punctuation or is nothing else."""
    stripped = text.rstrip()
    end = len(stripped)
    if any(m.end() == end for m in PROTECTED.finditer(stripped)):
        return 0
    while end and unicodedata.category(stripped[end - 1]).startswith("P"):
        end -= 1
    return len(text) - end if 0 < end < len(stripped) else 0


def drop_final_punctuation(text: str) -> str:
    """text without its final run of punctuation (and the spaces before it); as it is where
    it does not end in punctuation, ends with a tag or is punctuation alone."""
    n = _final_punctuation(text)
    return text[:len(text) - n].rstrip() if n else text


def _letters(text: str) -> list[int]:
    """Positions of the letters and digits outside tags."""
    taken = {i for m in PROTECTED.finditer(text) for i in range(*m.span())}
    return [i for i, c in enumerate(text) if c.isalnum() and i not in taken]


def swap_chars(text: str, rng: random.Random) -> str:
    """Two neighbouring letters (or digits) of a word, not equal, swapped; text as it is
    where there are none."""
    letters = set(_letters(text))
    at = [i for i in sorted(letters) if i + 1 in letters and text[i] != text[i + 1]]
    if not at:
        return text
    i = rng.choice(at)
    return text[:i] + text[i + 1] + text[i] + text[i + 2:]


def delete_char(text: str, rng: random.Random) -> str:
    """One letter (or digit) deleted, from a word that keeps another one."""
    letters = set(_letters(text))
    at = [i for i in sorted(letters) if i - 1 in letters or i + 1 in letters]
    if not at:
        return text
    i = rng.choice(at)
    return text[:i] + text[i + 1:]


def repeat_char(text: str, rng: random.Random) -> str:
    """One letter (or digit) written twice."""
    at = _letters(text)
    if not at:
        return text
    i = rng.choice(at)
    return text[:i + 1] + text[i:]


TYPOS = (swap_chars, delete_char, repeat_char)  # the kinds of typo, equally likely


def add_typos(text: str, edits: int, rng: random.Random) -> str:
    """text with `edits` typos, each of a kind of TYPOS drawn uniformly."""
    for _ in range(edits):
        text = rng.choice(TYPOS)(text, rng)
    return text


# ----------------------------------------------------------------------------- drawing
# Case and typos lengthen a sentence's segmentation (debian-po, 4k joint pieces, mean / 90th
# percentile: upper case x2.26 / x3.00 en, x2.44 / x3.29 de; title case x1.16 / x1.36 en,
# x1.11 / x1.25 de; one typo x1.12 / x1.29), so they are drawn for the whole epoch at once,
# per sentence, and batches are cut by the lengths GROWTH estimates (factors multiply).
GROWTH = {"upper": 2.5, "title": 1.2, "typos": 1.15}


@dataclass
class Cases:
    """Which sentences an epoch upper-cases, title-cases and gives typos: (n,) bool arrays."""

    upper: np.ndarray
    title: np.ndarray
    typos: np.ndarray

    def growth(self, edits: int, source: bool) -> np.ndarray:
        """(n,) the factor each sentence's source (or target) length is estimated to grow by
        (GROWTH; typos, on the source alone: `edits` of them, each as much)."""
        return (np.where(self.upper, GROWTH["upper"], 1.0)
                * np.where(self.title & ~self.upper, GROWTH["title"], 1.0)
                * np.where(self.typos & source, GROWTH["typos"] ** edits, 1.0))


def uniform(key: list[int], ids: np.ndarray) -> np.ndarray:
    """(n,) floats in [0, 1), one per id, a function of (key, id) alone (splitmix64 of the
    id mixed with the key): the same for an id whichever batch, rank or resume asks."""
    k = np.random.SeedSequence(key).generate_state(1, np.uint64)[0]
    z = np.asarray(ids, dtype=np.uint64) ^ k
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def draw_cases(cfg: AugmentConfig, seed: int, epoch: int, ids: np.ndarray) -> Cases:
    """Which of sentences `ids` `epoch` upper-cases, title-cases and gives typos, each drawn
    at its rate from (seed, epoch, id): a sentence an epoch takes twice (corpus weight 2)
    is drawn alike both times (its typos and punctuation drop are drawn apart)."""
    return Cases(uniform([seed, epoch, 0], ids) < cfg.uppercase,
                 uniform([seed, epoch, 1], ids) < cfg.titlecase,
                 uniform([seed, epoch, 2], ids) < cfg.typos)


def augment_pair(src: str, tgt: str, upper: bool, title: bool, typos: bool,
                 cfg: AugmentConfig, rng: random.Random) -> tuple[str, str]:
    """One training pair upper-cased, title-cased and given cfg.typo_edits typos as drawn
    (draw_cases), then stripped of its final punctuation at cfg's rate (OpusTrainer's order:
    case, typos; then punctuation); rng draws the typos and whether punctuation goes."""
    if upper:
        src, tgt = upper_case(src), upper_case(tgt)
    if title:
        src, tgt = title_case(src), title_case(tgt)
    if typos:
        src = add_typos(src, cfg.typo_edits, rng)
    if rng.random() < cfg.drop_punctuation and _final_punctuation(src) and _final_punctuation(tgt):
        src, tgt = drop_final_punctuation(src), drop_final_punctuation(tgt)
    return src, tgt


@dataclass(frozen=True)
class Augmenter:
    """train.augment's modifiers as the training batches draw and apply them
    (nmt.data.sampling.Augment): nmt-train passes one to nmt.data.sampling.SubwordSampler."""

    cfg: AugmentConfig

    @property
    def active(self) -> bool:
        """Whether any modifier has a rate above 0."""
        return self.cfg.active

    @property
    def typo_edits(self) -> int:
        """Typos per typo'd source."""
        return self.cfg.typo_edits

    def cases(self, seed: int, epoch: int, ids: np.ndarray) -> Cases:
        """draw_cases of sentences `ids` in `epoch`."""
        return draw_cases(self.cfg, seed, epoch, ids)

    def pair(self, src: str, tgt: str, upper: bool, title: bool, typos: bool,
             rng: random.Random) -> tuple[str, str]:
        """augment_pair of one training pair."""
        return augment_pair(src, tgt, upper, title, typos, self.cfg, rng)
