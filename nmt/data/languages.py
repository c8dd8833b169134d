"""A checkpoint's languages, and how its model is told which to write (nmt-translate's src_lang=
and tgt_lang=).

A checkpoint of a multilingual model records them in nmt.data.vocab.Vocab.languages (a
nmt.data.vocab.Languages: its convention and codes, {language: token id}); a checkpoint without
them (every older one, and every bilingual model) is one language pair, to which src_lang= and
tgt_lang= do not apply. The conventions of the models nmt imports:
- "forced" (M2M100, NLLB-200; nmt.wings.interop.m2m100): a source is
  `code(src_lang) pieces </s>`, and the output starts with code(tgt_lang), forced (decoding
  starts from </s>): both are needed.
- "tag" (multilingual OPUS-MT; nmt.wings.interop.marian): a source is
  `>>tgt_lang<< pieces </s>`; without tgt_lang= the text itself may start with the token (it
  is one piece), as with MarianTokenizer.
The names are the checkpoint's: de for M2M100's __de__ and OPUS-MT's >>de<<, deu_Latn for
NLLB-200. nmt-preprocess's src_lang and tgt_lang are the suffixes of its files (a
multilingual data directory's side names); its corpora's src_lang and tgt_lang are languages.
A model trained here on several pairs records convention "tag" with tokens >>xx<<
(nmt.data.subwords, docs/design.md) and its corpora's source languages (sources); one trained on
one pair records Vocab.pair, a LanguagePair (its data's suffixes): what nmt-serve's
LibreTranslate API and split=sentence use when not told (recorded_pair; checkpoints from
before it record nothing, and a server then needs src_lang= and tgt_lang=).
"""

from __future__ import annotations

from dataclasses import dataclass

from nmt.data.vocab import LanguagePair, Languages, Vocab
from nmt.errors import ConfigError


@dataclass(frozen=True)
class LanguageChoice:
    """What a choice of languages adds to the ids of every sentence."""

    source: tuple[int, ...] = ()  # put first on every source
    prefix: tuple[int, ...] = ()  # forced first on every output, then taken off it

    def sources(self, ids: list[list[int]]) -> list[list[int]]:
        """Sources with the choice's tokens first."""
        return [[*self.source, *seq] for seq in ids] if self.source else ids

    def prefixes(self, n: int, given: list[list[int]] | None) -> list[list[int]] | None:
        """The forced output starts of n sentences: the choice's tokens, then given ones."""
        if not self.prefix:
            return given
        return [[*self.prefix, *p] for p in (given or [[] for _ in range(n)])]

    def strip(self, tokens: list[int]) -> list[int]:
        """An output without the forced tokens it starts with."""
        return tokens[len(self.prefix):]


def choose(vocab: Vocab, src_lang: str, tgt_lang: str, where: str) -> LanguageChoice:
    """The ids that make the checkpoint `where` (its vocabulary) translate from src_lang into
    tgt_lang ("": not given); a one-line ConfigError naming the key for a language it lacks, a
    language it needs, or a language given to a bilingual model."""
    languages = vocab.languages
    if languages is None:
        for key, value in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
            if value:
                raise ConfigError(key, f"{where} is a bilingual model (it records no "
                                  f"languages to choose from); leave {key} out", value=value)
        return LanguageChoice()
    if languages.forced:
        return LanguageChoice((language_id(languages, "src_lang", src_lang, where),),
                              (language_id(languages, "tgt_lang", tgt_lang, where),))
    if src_lang:
        raise ConfigError("src_lang", f"{where} chooses the target language only "
                          f"(tgt_lang=); leave src_lang out", value=src_lang)
    return LanguageChoice((language_id(languages, "tgt_lang", tgt_lang, where),)
                          if tgt_lang else ())


def language_id(languages: Languages, key: str, lang: str, where: str) -> int:
    """The token id of language `lang` (the value of `key`) among a checkpoint's languages;
    a one-line ConfigError naming the key for a language `where` lacks or for none given."""
    codes = languages.codes
    if lang not in codes:
        known = sorted(codes)
        shown = ", ".join(known[:12]) + (f", ... ({len(known)} in all)"
                                        if len(known) > 12 else "")
        why = f"{where} has no such language" if lang else (
            f"{where} is multilingual: give the language")
        raise ConfigError(key, f"{why} (it has {shown})", value=lang or None)
    return codes[lang]


def recorded_pair(vocab: Vocab) -> LanguagePair:
    """The language pair a checkpoint (its vocabulary) records; empty for a multilingual one,
    an older one or an import."""
    return vocab.pair or LanguagePair()
