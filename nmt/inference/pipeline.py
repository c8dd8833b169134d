"""Between texts and tokens: the one translation pipeline of nmt-translate and nmt-serve.

prepare cuts texts into pieces (split=sentence|paragraph, nmt.data.segment; or markup's
sentences, nmt.wings.markup.document), finds each piece's glossary terms (nmt.wings.glossary),
and encodes it with its language tokens, cut to the model's length: a Piece each, ready for
decoding. The front ends decode them as they do (nmt-translate in its batches, nmt-serve in
its Batcher); `chosen` takes the language tokens off the outputs and keeps one of each
piece's candidates by MBR or reranking (nmt.wings.rerank), and finish turns them into a
TextResult per text: the translations detokenized, markup's tags put back by the alignment,
the terms' exact texts restored, the pieces joined into their text, the words scored
(nmt.wings.words). Text that cannot be translated as asked raises PieceError, naming
the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nmt.data.languages import LanguageChoice
from nmt.data.segment import Segmented, fit_for, sample_stream, split_for
from nmt.decoding.messages import Hypothesis, Sentence
from nmt.engines.engine import Engine
from nmt.errors import ConfigError
from nmt.system.files import check_unicode
from nmt.wings.glossary import Glossary, with_terms
from nmt.wings.rerank import Chooser
from nmt.wings.terms import Term
from nmt.wings.words import Word, words

if TYPE_CHECKING:  # markup's modules are imported where markup= asks for them (startup)
    from nmt.wings.markup.document import Document
    from nmt.wings.markup.restore import Unplaced


class PieceError(ConfigError):
    """A text the pipeline cannot translate as asked: `key` names the field (text[3], prefix,
    constraints), `why` says what is wrong."""


@dataclass(frozen=True)
class Options:
    """How texts become pieces and translations texts (nmt-translate's TranslateConfig, or an
    nmt-serve request on its ServeConfig)."""

    split: str = "none"  # none|sentence|paragraph (split=auto resolved: segment.auto_mode)
    splitter: Callable[[str], list[str]] | None = None  # split=sentence: a text's sentences
    markup: str = "none"  # none|html|xml: texts are documents, their tags put back
    placeholders: bool = False  # markup=xml: untranslated elements as numbers
    languages: LanguageChoice = LanguageChoice()  # the tokens the languages add
    limit: int = 0  # source tokens kept of a piece, its language tokens aside
    glossary: Glossary | None = None  # glossary and keep terms: constraints, then restored
    chooser: Chooser | None = None  # MBR or reranking: keeps one of each piece's candidates
    word_combine: str | None = None  # word scores: how pieces' probabilities combine; None: none
    alignment_layer: int = -1  # markup: the decoder layer whose attention places the tags
    max_tokens: int = 4096  # markup: tokens per alignment batch


@dataclass
class Piece:
    """What is decoded of one text: all of it, or one of its sentences or parts."""

    text: str  # the source text translated
    ids: list[int]  # its source ids as decoded: language tokens first, cut to Options.limit
    prefix: list[int]  # the forced output start: language tokens, then a given prefix
    phrases: list[list[int]]  # constraints every output holds: given ones, then its terms'
    stream: int  # its sampling stream (segment.sample_stream of its text's number)
    terms: list[Term]  # the glossary and keep terms it holds
    tokens: int  # its source tokens before the cut
    truncated: bool  # cut to Options.limit


@dataclass
class Prepared:
    """Texts as pieces to decode, and what finish needs to make them texts again."""

    options: Options
    docs: list[Segmented | Document]  # per text: its pieces and what lies between them
    pieces: list[Piece]  # every text's, in order
    prefixed: bool  # a prefix is forced (given, or a language token's)
    constrained: bool  # constraints given, or a glossary

    def sentences(self) -> list[Sentence]:
        """The pieces as the decoder's sentences, tagged by their index."""
        return [Sentence(i, p.ids, p.prefix, p.phrases, p.stream)
                for i, p in enumerate(self.pieces)]

    def prefixes(self) -> list[list[int]] | None:
        """Each piece's forced output start; None when none is forced."""
        return [p.prefix for p in self.pieces] if self.prefixed else None

    def constraints(self) -> list[list[list[int]]] | None:
        """Each piece's phrases; None when neither constraints nor a glossary are given."""
        return [p.phrases for p in self.pieces] if self.constrained else None


@dataclass
class PieceResult:
    """One piece's translations."""

    piece: Piece
    hyps: list[Hypothesis]  # its n-best list (a chosen one: one), no language tokens
    texts: list[str]  # each hypothesis detokenized, terms restored; markup: tags in the best
    words: list[list[Word]] | None  # each hypothesis' words (Options.word_combine; else None)


@dataclass
class TextResult:
    """One text's translation: its pieces' best in their places."""

    text: str  # the translation of the whole text
    pieces: list[PieceResult]
    unplaced: list[Unplaced]  # markup: the tags the alignment could not place
    words: list[list[Word]] | None  # each of hyps' words (of several pieces: theirs in order)

    @property
    def hyps(self) -> list[Hypothesis]:
        """One piece: its hypotheses; several: one, their best ones' tokens (and tokens' log
        P) in order, their log P and scores summed (the pieces are translated apart)."""
        if len(self.pieces) == 1:
            return self.pieces[0].hyps
        best = [p.hyps[0] for p in self.pieces]
        token_lp = (None if any(h.token_logprobs is None for h in best)
                    else [lp for h in best for lp in h.token_logprobs])
        return [Hypothesis([t for h in best for t in h.tokens], sum(h.score for h in best),
                           sum(h.logprob for h in best), token_lp)]

    @property
    def texts(self) -> list[str]:
        """Each of hyps' texts: one piece's with the text's spaces around; several: the text."""
        if len(self.pieces) == 1:
            return [self.text, *self.pieces[0].texts[1:]]
        return [self.text]


# ----------------------------------------------------------------------------- prepare
def prepare(texts: list[str], options: Options, engine: Engine,
            prefixes: list[list[int]] | None = None,
            phrases: list[list[list[int]]] | None = None) -> Prepared:
    """Texts -> their pieces, encoded (module docstring); prefixes: each text's forced output
    start (target ids; score a given target with it), phrases: each text's constraints
    (target ids). A PieceError for a text of several pieces with either, or a piece that
    is not valid Unicode."""
    docs = documents(texts, options, engine.src_tok)
    texts_of = [(i, piece) for i, doc in enumerate(docs) for piece in doc.pieces]
    for i, piece in texts_of:  # markup's pieces: SentencePiece encodes valid Unicode only
        try:
            check_unicode(piece)
        except ValueError as e:
            raise PieceError(f"text[{i}]", str(e)) from None
    given = [(p, ps) for p, ps in zip(prefixes or [[]] * len(texts),
                                      phrases or [[]] * len(texts), strict=True)]
    fields = piece_fields(docs, given)  # per piece: (prefix, phrases, stream)
    terms = ([options.glossary.matches(piece) for _, piece in texts_of] if options.glossary
             else [[] for _ in texts_of])
    full = engine.src_tok.encode([piece for _, piece in texts_of])
    languages, limit = options.languages, options.limit
    pieces = [Piece(piece, [*languages.source, *ids[:limit]], [*languages.prefix, *prefix],
                    ps, stream, ts, len(ids), len(ids) > limit)
              for (_, piece), ids, (prefix, _, stream), ps, ts in zip(
                  texts_of, full, fields, with_terms([f[1] for f in fields], terms), terms,
                  strict=True)]
    return Prepared(options, docs, pieces, prefixes is not None or bool(languages.prefix),
                    phrases is not None or options.glossary is not None)


def documents(texts: list[str], options: Options, tok) -> list[Segmented | Document]:
    """Each text cut into its pieces (tok: the source Tokenizer): split=sentence|paragraph's,
    none over Options.limit tokens (nmt.data.segment); with markup, the sentences of its
    text, joined around tag pairs, then cut to fit (nmt.wings.markup.document)."""
    o = options
    if o.markup == "none":
        return [split_for(tok, text, o.split, o.splitter, o.limit) for text in texts]
    from nmt.wings.markup.parse import parse

    fit = fit_for(tok, o.limit) if o.split != "none" else None
    return [parse(text, o.markup, o.placeholders).cut(
        lambda unit: split_for(tok, unit, o.split, o.splitter, 0), fit) for text in texts]


def piece_fields(docs: list[Segmented | Document], given: list[tuple[list[int], list]]
                 ) -> list[tuple[list[int], list[list[int]], int]]:
    """Per piece, its text's (prefix, phrases) and its sampling stream (the pieces of text i
    sample as nmt-translate's pieces of line i); a prefix or constraints are a whole text's:
    its text must be one piece."""
    out = []
    for i, (doc, (prefix, phrases)) in enumerate(zip(docs, given, strict=True)):
        if len(doc.pieces) > 1 and (prefix or phrases):
            key = "prefix" if prefix else "constraints"
            raise PieceError(key, f"text[{i}] is split into {len(doc.pieces)} pieces; a {key} "
                                  f"is a whole text's (send it with split=none)")
        out += [(prefix, phrases, sample_stream(i, k)) for k in range(len(doc.pieces))]
    return out


# ----------------------------------------------------------------------------- finish
def chosen(prepared: Prepared, nbest: list[list[Hypothesis]], which: list[int] | None = None
           ) -> list[list[Hypothesis]]:
    """The decoder's n-best lists of the pieces `which` (None: all) -> without their forced
    language tokens, and (Options.chooser) only the one kept by MBR or reranking."""
    o = prepared.options
    nbest = [[without_language(o.languages, h) for h in hyps] for hyps in nbest]
    if o.chooser is None:
        return nbest
    pieces = prepared.pieces if which is None else [prepared.pieces[i] for i in which]
    return o.chooser.choose([p.text for p in pieces], nbest)


def without_language(languages: LanguageChoice, h: Hypothesis) -> Hypothesis:
    """A hypothesis without the forced language token it starts with (and its log P)."""
    cut = len(h.tokens) - len(languages.strip(h.tokens))
    token_lp = None if h.token_logprobs is None else h.token_logprobs[cut:]
    return dataclasses.replace(h, tokens=h.tokens[cut:], token_logprobs=token_lp)


def finish(prepared: Prepared, nbest: list[list[Hypothesis]], engine: Engine
           ) -> list[TextResult]:
    """Each piece's hypotheses (`chosen`'s) -> each text's translation: detokenized, tags put
    back (markup), terms restored, its pieces joined, words scored."""
    o, tok = prepared.options, engine.tgt_tok
    texts = [[Glossary.restore(t, p.terms) for t in tok.decode([h.tokens for h in hyps])]
             for p, hyps in zip(prepared.pieces, nbest, strict=True)]
    unplaced: list[Unplaced] = []
    if o.markup != "none":
        marked, unplaced = tagged(prepared, nbest, engine)
        texts = [[t, *rest] for t, (_, *rest) in zip(marked, texts, strict=True)]
    found = iter([PieceResult(p, hyps, ts, hyp_words(hyps, o.word_combine, tok))
                  for p, hyps, ts in zip(prepared.pieces, nbest, texts, strict=True)])
    out = []
    for i, doc in enumerate(prepared.docs):
        mine = [next(found) for _ in doc.pieces]
        out.append(TextResult(doc.join([r.texts[0] for r in mine]), mine,
                              [u for u in unplaced if u.doc == i],
                              joined_words(mine) if o.word_combine else None))
    return out


def joined_words(pieces: list[PieceResult]) -> list[list[Word]] | None:
    """A text's words per hypothesis: one piece's; of several, their best ones' in order
    (None: no words scored)."""
    if len(pieces) == 1:
        return pieces[0].words
    if any(p.words is None for p in pieces):
        return None
    return [[w for p in pieces for w in p.words[0]]]


def tagged(prepared: Prepared, nbest: list[list[Hypothesis]], engine: Engine
           ) -> tuple[list[str], list[Unplaced]]:
    """markup: each piece's best translation with its tags put back where the alignment puts
    their words (nmt.wings.markup.document), its terms' exact texts between them; the tags it
    could not place."""
    from nmt.wings.align import sentence_alignments
    from nmt.wings.markup.restore import put_back

    o, pieces = prepared.options, prepared.pieces
    found = sentence_alignments(engine, [p.text for p in pieces], [p.ids for p in pieces],
                                [hyps[0].tokens for hyps in nbest], len(o.languages.source),
                                o.languages.prefix, o.alignment_layer, o.max_tokens)
    marked, unplaced = put_back(prepared.docs, found, [p.terms for p in pieces])
    return [t for doc in marked for t in doc], unplaced


def hyp_words(hyps: list[Hypothesis], combine: str | None, tok) -> list[list[Word]] | None:
    """Each hypothesis' words and their probabilities (combine: how its pieces' combine;
    None: no words); tok: the target Tokenizer."""
    if combine is None:
        return None
    return [words(h.tokens, h.token_logprobs, tok, combine) for h in hyps]
