"""One translation per line, chosen among its candidates (nmt-translate's mbr and rerank;
nmt-serve's mbr_* request fields).

Minimum Bayes risk: the search gives N candidates per line (search.sampling's N samples, or
beam search's N-best), and the one of highest expected utility against the others is kept
(nmt.wings.mbr). Reranking: of search.nbest hypotheses, the one of highest
forward * log P(Y|X) + reverse * log P(X|Y) + length * |Y| is kept, log P(X|Y) being a reverse
(target-to-source) model's score of the source given the hypothesis (fairseq's noisy channel
reranking, without its language model), computed by teacher forcing (Translator.score_ids) on
the hypothesis' text and the source's, each encoded with the reverse model's own vocabulary.
"""

from __future__ import annotations

import torch

from nmt.config import MbrConfig, RerankConfig, SearchConfig, TranslateConfig
from nmt.config_checks import candidate_search
from nmt.data.tokenizer import Tokenizer
from nmt.decoding.messages import Hypothesis
from nmt.engines.translator import Translator
from nmt.errors import NmtError
from nmt.wings.comet import Comet, load_comet


def rerank_scores(hyps: list[Hypothesis], reverse: list[float], weights: RerankConfig
                  ) -> list[float]:
    """forward * log P(Y|X) + reverse * log P(X|Y) + length * |Y| (EOS counted) of each
    hypothesis, given the reverse model's log P(X|Y) of each."""
    return [weights.forward * h.logprob + weights.reverse * r + weights.length * (len(h.tokens) + 1)
            for h, r in zip(hyps, reverse, strict=True)]


def mbr_comet(model_dir: str, device: torch.device) -> Comet | None:
    """The COMET-22 model of directory `model_dir` ("": None) on `device`, for
    mbr.utility=comet; a one-line error for a reference-free CometKiwi."""
    if not model_dir:
        return None
    comet = load_comet(model_dir, str(device))
    if not comet.spec.needs_reference:
        raise NmtError(f"mbr.utility=comet: {model_dir} is a reference-free CometKiwi; MBR "
                       "needs a reference-based COMET-22 (wmt22-comet-da)")
    return comet


class Chooser:
    """Keeps one hypothesis of each line's candidates, by MBR or by reranking.

    mbr, rerank: the choice (mbr.candidates > 0: MBR; else rerank, with `reverse`); search: the
    search asked for, which `self.search` widens to give the candidates; tgt_tok: the translating
    model's target tokenizer (candidates are compared, and rescored, as detokenized text);
    reverse: the reverse model's Translator (rerank.model), which the Chooser closes;
    comet: mbr.utility=comet's COMET-22 model (nmt-translate comet=DIR).
    nmt-translate opens one per run (Chooser.open), nmt-serve makes one per MBR request.
    """

    def __init__(self, mbr: MbrConfig, rerank: RerankConfig, search: SearchConfig,
                 tgt_tok: Tokenizer, reverse: Translator | None = None,
                 comet: Comet | None = None):
        self.mbr, self.rerank, self.tgt_tok, self.reverse = mbr, rerank, tgt_tok, reverse
        self.comet = comet
        self.search = candidate_search(search, mbr)  # what the translator runs

    @classmethod
    def open(cls, cfg: TranslateConfig, tgt_tok: Tokenizer, device: torch.device,
             workers: int = 1) -> Chooser | None:
        """The Chooser cfg asks for (None: neither mbr nor rerank), its reverse model loaded on
        `device` with `workers` processes."""
        if not cfg.mbr.candidates and not cfg.rerank.model:
            return None
        reverse = None
        if cfg.rerank.model:
            reverse = Translator.load(cfg.rerank.model, device, cfg.weights,
                                      dtype=cfg.search.dtype, workers=workers,
                                      threads=cfg.threads)
        comet = cfg.mbr.candidates and cfg.mbr.utility == "comet"
        return cls(cfg.mbr, cfg.rerank, cfg.search, tgt_tok, reverse,
                   mbr_comet(cfg.comet, device) if comet else None)

    def choose(self, sources: list[str], nbest: list[list[Hypothesis]]
               ) -> list[list[Hypothesis]]:
        """Per line, its source text and candidates -> a list of the one kept."""
        from nmt.wings.mbr import comet_utilities, mbr_select, pick  # sacreBLEU: lazily

        texts = [self.tgt_tok.decode([h.tokens for h in hyps]) for hyps in nbest]
        if self.mbr.candidates and self.comet is not None:
            utilities = comet_utilities(self.comet, sources, texts)
            picks = [pick(u, [h.score for h in hyps])
                     for u, hyps in zip(utilities, nbest, strict=True)]
        elif self.mbr.candidates:
            mbr = self.mbr
            picks = [mbr_select(t, [h.score for h in hyps], mbr.utility, mbr.aggregate)
                     for t, hyps in zip(texts, nbest, strict=True)]
        else:
            picks = self._reranked(sources, nbest, texts)
        return [[hyps[i]] for hyps, i in zip(nbest, picks, strict=True)]

    def _reranked(self, sources: list[str], nbest: list[list[Hypothesis]],
                  texts: list[list[str]]) -> list[int]:
        """Per line, the index of its hypothesis of highest rerank_scores."""
        rev = self.reverse
        limit = rev.max_input_tokens
        src = rev.src_tok.encode([t for ts in texts for t in ts])  # the hypotheses
        tgt = rev.tgt_tok.encode([s for s, ts in zip(sources, texts, strict=True) for _ in ts])
        scored = iter(h.logprob for h in rev.score_ids([s[:limit] for s in src],
                                                        [t[:limit] for t in tgt],
                                                        self.search))
        picks = []
        for hyps in nbest:
            scores = rerank_scores(hyps, [next(scored) for _ in hyps], self.rerank)
            picks.append(max(range(len(hyps)), key=scores.__getitem__))
        return picks

    def close(self) -> None:
        """Stop the reverse model's workers."""
        if self.reverse is not None:
            self.reverse.close()
