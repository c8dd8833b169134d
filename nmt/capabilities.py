"""What each decoding engine can do, stated once.

nmt-translate's and nmt-serve's configs refuse at once what their engine cannot do
(nmt.config), and the engines refuse it again when they are called (nmt.engines.engine: a
Python caller, a request to nmt-serve): every refusal comes from the Capabilities here, a
one-line ConfigError naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass

from nmt.errors import ConfigError

# the keys that use a feature (nmt-translate's, nmt-serve's and its requests') -> the feature
FEATURES = {"checkpoint": "ensembles", "constraints": "constraints", "glossary": "constraints",
            "keep": "constraints", "alignment": "attention", "markup": "attention",
            "attention_plot": "attention", "attention": "attention", "continuous": "continuous",
            "sampling": "sentence_seeds", "search.sampling": "sentence_seeds",
            "word_scores": "token_scores"}
LACKS = {"ensembles": "translates with one model, not an ensemble",
         "constraints": "has no lexical constraints",
         "attention": "does not return attention",
         "continuous": "has no continuous batching (set continuous=false)",
         "sentence_seeds": "seeds per call, so a text's samples in nmt-serve would depend on "
                           "its batch mates",
         "token_scores": "has no per-token scores from its search (translate_batch returns "
                         "none; return_logits_vocab's logits are missing in beam search)"}


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do; check and check_search refuse the rest."""

    engine: str  # the engine's name, as engine= gives it
    ensembles: bool  # several checkpoints decoded as one model (checkpoint=[A.pt,B.pt])
    constraints: bool  # lexical constraints (constraints=FILE, glossary=FILE, keep=FILE)
    attention: bool  # attention weights: alignment, attention_plot, nmt-serve's "attention"
    continuous: bool  # continuous batching (nmt-serve continuous=true)
    sentence_seeds: bool  # a sentence's samples depend on the seed and its line only (nmt-serve)
    beam_alpha: bool  # GNMT's length penalty in beam search (search.alpha, beam_size > 1)
    epsilon: bool  # epsilon sampling (search.epsilon with search.sampling)
    token_scores: bool  # each output token's log P from the search (word_scores)
    compile: bool  # search.compile: its decoding steps through torch.compile
    shortlist: str | None = None  # the one search.shortlist it decodes with ("": none; None: any)

    def check(self, key: str, used: object = True) -> None:
        """A ConfigError naming `key` (one of FEATURES) if it is used and the engine lacks
        its feature."""
        feature = FEATURES[key]
        if used and not getattr(self, feature):
            raise ConfigError(key, f"engine={self.engine} {LACKS[feature]}; use engine=nmt")

    def check_search(self, search) -> None:
        """A ConfigError naming the first key of `search` (a nmt.config.SearchConfig) that
        the engine cannot run."""
        if search.alpha and search.beam_size > 1 and not search.sampling and not self.beam_alpha:
            raise ConfigError("search.alpha", f"engine={self.engine} has no GNMT length penalty "
                              "in beam search; use search.alpha=0 (or search.beam_size=1)")
        if search.sampling and search.epsilon and not self.epsilon:
            raise ConfigError("search.epsilon", f"engine={self.engine} has no epsilon sampling; "
                                                f"use engine=nmt")
        if search.compile == "true" and not self.compile:
            raise ConfigError("search.compile", f"engine={self.engine} decodes with its own "
                                                f"compiled code; use engine=nmt")
        if self.shortlist is not None and search.shortlist != self.shortlist and (
                search.shortlist):
            raise ConfigError("search.shortlist", f"engine={self.engine} loaded "
                              f"{self.shortlist or 'no shortlist'}, not {search.shortlist}")


ENGINES = {"nmt": Capabilities("nmt", ensembles=True, constraints=True, attention=True,
                               continuous=True, sentence_seeds=True, beam_alpha=True,
                               epsilon=True, token_scores=True, compile=True),
           "ctranslate2": Capabilities("ctranslate2", ensembles=False, constraints=False,
                                       attention=False, continuous=False, sentence_seeds=False,
                                       beam_alpha=False, epsilon=False, token_scores=False,
                                       compile=False)}
