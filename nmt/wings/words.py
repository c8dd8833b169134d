"""Word confidence: a translation's words, each with a probability combined from the
log-probabilities its SentencePiece pieces had in the search (nmt-translate's word_scores,
nmt-serve's "word_scores"; no torch).

A word is what SentencePiece's space mark (U+2581) starts: a piece that begins with it starts
a word, and every other piece (the rest of a word, punctuation written without a space before
it, a byte piece) belongs to the word before it; an unknown piece, which decodes to " ⁇ ",
is a word of its own (and the piece after it starts one). So the words are the translation's
space-separated tokens: in `Öffnen Sie die Datei.`, `Datei.` is one word, `▁Datei` and `.`
together. A word is never blank: a space mark alone (which decodes to nothing) belongs to the
word after it (at the end, the word before it), and a word holds no whitespace (a byte piece's
is left out), so nmt-translate's column of `word|probability` tokens reads back (parse_words).
Its probability combines its pieces' log P: `product` (default) is exp of their sum, the
probability the model gave the whole word; `min` is the lowest piece's probability, the word's
weakest point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nmt.config import WORD_COMBINES

SPACE = "\u2581"  # SentencePiece's space mark: a piece that starts with it starts a word
# word_combine: how a word's pieces' log P combine (product: their sum)
COMBINES = dict(zip(WORD_COMBINES, (sum, min), strict=True))


@dataclass
class Word:
    """A word of a translation and its probability."""

    text: str  # the word, detokenized: never empty, no whitespace
    prob: float  # its probability: its pieces' combined (COMBINES)


def word_spans(pieces: list[str], unknown: list[bool] | None = None) -> list[range]:
    """The positions of each word's pieces: a word starts at the first piece, at every piece
    that starts with the space mark, and at each unknown piece (unknown[i]) and the one after
    it."""
    unknown = unknown or [False] * len(pieces)
    starts = [i for i, piece in enumerate(pieces) if i == 0 or piece.startswith(SPACE)
              or unknown[i] or unknown[i - 1]]
    if not starts:  # no output
        return []
    return [range(a, b) for a, b in zip(starts, starts[1:] + [len(pieces)], strict=True)]


def _without_blanks(spans: list[range], texts: list[str]) -> tuple[list[range], list[str]]:
    """The words' spans and texts (decoded) with no blank word and no whitespace inside one:
    a blank word's pieces join the next word (the last blank ones, the word before them)."""
    out_spans, out_texts, start = [], [], None
    for span, text in zip(spans, texts, strict=True):
        token = "".join(text.split())
        if not token:
            start = span.start if start is None else start
            continue
        out_spans.append(range(span.start if start is None else start, span.stop))
        out_texts.append(token)
        start = None
    if start is not None and out_spans:
        out_spans[-1] = range(out_spans[-1].start, spans[-1].stop)
    return out_spans, out_texts


def word_probs(token_logprobs: list[float], spans: list[range], combine: str) -> list[float]:
    """Each word's probability from its pieces' log P: exp of their sum or of their minimum."""
    join = COMBINES[combine]
    return [math.exp(join(token_logprobs[i] for i in span)) for span in spans]


def words(tokens: list[int], token_logprobs: list[float], tokenizer,
          combine: str = "product") -> list[Word]:
    """The words of an output (ids without BOS/EOS) and their probabilities; tokenizer: the
    target's nmt.data.tokenizer.Tokenizer (its pieces and decode)."""
    spans = word_spans(tokenizer.pieces(tokens), [tokenizer.sp.is_unknown(t) for t in tokens])
    spans, texts = _without_blanks(spans, tokenizer.decode([tokens[s.start:s.stop]
                                                           for s in spans]))
    return [Word(text, prob) for text, prob in zip(
        texts, word_probs(token_logprobs, spans, combine), strict=True)]


def format_words(found: list[Word]) -> str:
    """nmt-translate's column: `word|probability` for each word, 4 decimals, space-separated
    (the last | of a token separates: a word may hold one)."""
    return " ".join(f"{w.text}|{w.prob:.4f}" for w in found)


def parse_words(column: str) -> list[Word]:
    """format_words' column read back."""
    return [Word(text, float(prob)) for text, prob in
            (token.rsplit("|", 1) for token in column.split())]
