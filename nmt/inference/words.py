"""Word confidence: a translation's words, each with a probability combined from the
log-probabilities its SentencePiece pieces had in the search (nmt-translate's word_scores,
nmt-serve's "word_scores"; no torch).

A word is what SentencePiece's space mark (U+2581) starts: a piece that begins with it starts
a word, and every other piece (the rest of a word, punctuation written without a space before
it, a byte piece) belongs to the word before it. So the words are the translation's
space-separated tokens: in `Öffnen Sie die Datei.`, `Datei.` is one word, `▁Datei` and `.`
together. Its probability combines its pieces' log P: `product` (default) is exp of their
sum, the probability the model gave the whole word; `min` is the lowest piece's probability,
the word's weakest point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SPACE = "\u2581"  # SentencePiece's space mark: a piece that starts with it starts a word
COMBINES = {"product": sum, "min": min}  # word_combine: how a word's pieces' log P combine


@dataclass
class Word:
    """A word of a translation and its probability."""

    text: str  # the word, detokenized (no spaces)
    prob: float  # its probability: its pieces' combined (COMBINES)


def word_spans(pieces: list[str]) -> list[range]:
    """The positions of each word's pieces: a word starts at the first piece and at every
    piece that starts with the space mark."""
    starts = [i for i, piece in enumerate(pieces) if i == 0 or piece.startswith(SPACE)]
    if not starts:  # no output
        return []
    return [range(a, b) for a, b in zip(starts, starts[1:] + [len(pieces)], strict=True)]


def word_probs(token_logprobs: list[float], spans: list[range], combine: str) -> list[float]:
    """Each word's probability from its pieces' log P: exp of their sum or of their minimum."""
    join = COMBINES[combine]
    return [math.exp(join(token_logprobs[i] for i in span)) for span in spans]


def words(tokens: list[int], token_logprobs: list[float], tokenizer,
          combine: str = "product") -> list[Word]:
    """The words of an output (ids without BOS/EOS) and their probabilities; tokenizer: the
    target's nmt.data.tokenizer.Tokenizer (its pieces and decode)."""
    spans = word_spans(tokenizer.pieces(tokens))
    texts = tokenizer.decode([tokens[span.start:span.stop] for span in spans])
    return [Word(text.strip(), prob) for text, prob in zip(
        texts, word_probs(token_logprobs, spans, combine), strict=True)]


def format_words(found: list[Word]) -> str:
    """nmt-translate's column: `word|probability` for each word, 4 decimals, space-separated
    (the last | of a token separates: a word may hold one)."""
    return " ".join(f"{w.text}|{w.prob:.4f}" for w in found)


def parse_words(column: str) -> list[Word]:
    """format_words' column read back."""
    return [Word(text, float(prob)) for text, prob in
            (token.rsplit("|", 1) for token in column.split())]
