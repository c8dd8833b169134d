"""Corpus BLEU and chrF with sacreBLEU: one scorer for validation, nmt-translate, benchmarks.

sacreBLEU is imported when a score is asked for (its import costs ~0.15 s of a command's
startup): checking a config's bleu_tokenize imports it only for the tokenizers that need
extras or a download.
"""

from __future__ import annotations

from dataclasses import dataclass

from nmt.errors import ConfigError, NmtError

# sacreBLEU's tokenizers (>= 2.4, a dependency) that need neither extras nor a download
SELF_CONTAINED = ("none", "13a", "intl", "char", "zh")


def bleu_tokenize_error(tokenize: str) -> str | None:
    """Why sacreBLEU's BLEU cannot tokenize with `tokenize` here, or None when it can."""
    if tokenize in SELF_CONTAINED:
        return None
    from sacrebleu.metrics import BLEU

    try:
        BLEU(tokenize=tokenize)
    except KeyError:
        from sacrebleu.metrics import bleu

        names = ", ".join(getattr(bleu, "_TOKENIZERS", {})) or "see sacrebleu --help"
        return f"unknown sacreBLEU tokenizer {tokenize!r} (one of: {names})"
    except Exception as e:  # missing extras (ja-mecab: sacrebleu[ja]) or a model download
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        return f"sacreBLEU cannot use tokenizer {tokenize!r} here: {' '.join(lines)}"
    return None


def check_bleu_tokenize(tokenize: str, key: str) -> None:
    """A one-line ConfigError naming `key` unless sacreBLEU can tokenize with `tokenize` here:
    nmt-translate's and nmt-train's first check (it may import sacreBLEU's tokenizers)."""
    why = bleu_tokenize_error(tokenize)
    if why is not None:
        raise ConfigError(key, why)


@dataclass
class Scores:
    """Corpus scores of a set of hypotheses: sacreBLEU's BLEU and chrF, their signatures and
    their one-line reports; COMET-22's system score where nmt-translate's comet= gives it."""

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    bleu_line: str  # sacreBLEU's "BLEU = 27.3 58.1/..." line
    chrf_line: str
    comet: float | None = None


def score(hypotheses: list[str], references: list[str] | list[list[str]],
          tokenize: str = "13a") -> Scores:
    """sacreBLEU BLEU (with the `tokenize` tokenizer) and chrF of detokenized hypotheses against
    one reference each (a list of strings) or several (a list of such lists, one per file)."""
    streams = [references] if references and isinstance(references[0], str) else references
    for stream in streams:
        if len(hypotheses) != len(stream):
            raise ValueError(f"{len(hypotheses)} hypotheses but {len(stream)} references")
    why = bleu_tokenize_error(tokenize)
    if why:
        raise NmtError(why)
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(tokenize=tokenize), CHRF()
    b = bleu.corpus_score(hypotheses, streams)
    c = chrf.corpus_score(hypotheses, streams)
    return Scores(b.score, c.score, str(bleu.get_signature()), str(chrf.get_signature()),
                  str(b), str(c))


def read_references(paths: list[str], lines: int, what: str) -> list[list[str]]:
    """The lines of each reference file; a one-line NmtError unless each has `lines` lines."""
    from nmt.system.files import read_lines

    streams = []
    for path in paths:
        stream = read_lines(path, "references")
        if len(stream) != lines:
            raise NmtError(f"{path}: {len(stream)} reference lines but {lines} {what}")
        streams.append(stream)
    return streams
