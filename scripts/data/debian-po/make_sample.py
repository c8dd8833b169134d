"""Rebuild the bundled sample from the full debian-po corpus (see README.md in this folder).

    python scripts/data/debian-po/make_sample.py ../shared/data/debian-po/en-de

train: the first 120,000 pairs of the full train split with at most 10 English and 15 German
words (the full split is in a fixed pseudo-random order, so these are a uniform sample of its
short strings); valid and test: the first 1,000 pairs of the full splits, all lengths.
"""

import sys
from pathlib import Path

TRAIN_PAIRS, MAX_EN_WORDS, MAX_DE_WORDS, EVAL_PAIRS = 120_000, 10, 15, 1_000


def read(path: Path) -> list[str]:
    """The lines of a UTF-8 file without their newlines."""
    return path.read_text(encoding="utf-8").splitlines()


def write(path: Path, lines: list[str]) -> None:
    """Write lines as a UTF-8 file, one per line."""
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def main(full: Path, out: Path) -> None:
    """Write out/{train,valid,test}.{en,de} from the full corpus in `full`."""
    en, de = read(full / "train.en"), read(full / "train.de")
    short = [(e, d) for e, d in zip(en, de, strict=True)
             if len(e.split()) <= MAX_EN_WORDS and len(d.split()) <= MAX_DE_WORDS]
    write(out / "train.en", [e for e, _ in short[:TRAIN_PAIRS]])
    write(out / "train.de", [d for _, d in short[:TRAIN_PAIRS]])
    for split in ("valid", "test"):
        for lang in ("en", "de"):
            write(out / f"{split}.{lang}", read(full / f"{split}.{lang}")[:EVAL_PAIRS])


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).resolve().parent / "en-de")
