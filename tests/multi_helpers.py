"""Toy data of two language pairs (en-de, en-fr) for the multilingual tests."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ("open save file edit view help close print copy find new window error user name "
         "folder disk network update").split()
LEXICONS = {"de": lambda w: w[::-1].capitalize() + "en",  # toy German and French: each word
            "fr": lambda w: w.upper() + "é"}  # its own way


def sentences(n: int, seed: int) -> list[str]:
    """n English sentences of 1-6 words."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(n)]


def write_pair(prefix: Path, english: list[str], lang: str) -> str:
    """PFX.en and PFX.{lang}, word for word; returns the prefix."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}.en").write_text("".join(s + "\n" for s in english), "utf-8")
    other = [" ".join(map(LEXICONS[lang], s.split())) for s in english]
    Path(f"{prefix}.{lang}").write_text("".join(s + "\n" for s in other), "utf-8")
    return str(prefix)


def write_raw(raw: Path, n: int = 200, leak: int = 5) -> dict[str, dict[str, str]]:
    """en-de and en-fr train/valid/test prefixes under raw: {pair: {split: PFX}}. The first
    `leak` English sentences of en-de's test split are also in en-fr's training data."""
    out = {}
    for k, lang in enumerate(("de", "fr")):
        splits = {"train": sentences(n, 10 * k), "valid": sentences(10, 10 * k + 1),
                  "test": sentences(10, 10 * k + 2)}
        out[lang] = splits
    out["fr"]["train"] = out["fr"]["train"] + out["de"]["test"][:leak]
    return {f"en-{lang}": {split: write_pair(raw / f"{lang}-{split}", text, lang)
                           for split, text in splits.items()} for lang, splits in out.items()}


def corpus(prefix: str, src: str, tgt: str) -> str:
    """A corpus entry of nmt-preprocess's train/valid/test lists."""
    return f"{{path:'{prefix}',src_lang:{src},tgt_lang:{tgt}}}"


def multi_overrides(raw: dict[str, dict[str, str]], out: Path) -> list[str]:
    """nmt-preprocess overrides for en->de, de->en and en->fr from write_raw's files."""
    directions = (("en-de", "en", "de"), ("en-de", "de", "en"), ("en-fr", "en", "fr"))
    lists = {split: "[" + ",".join(corpus(raw[pair][split], s, t) for pair, s, t in directions)
             + "]" for split in ("train", "valid", "test")}
    return ["src_lang=src", "tgt_lang=tgt", f"out_dir={out}", "bpe.vocab_size=120", "workers=1",
            *(f"{split}={value}" for split, value in lists.items())]
