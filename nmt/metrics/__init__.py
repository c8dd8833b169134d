"""Metrics: what nmt scores translations with, below the engines that make them. sacreBLEU's
BLEU and chrF (scoring.py: validation's and nmt-translate's one scorer), nmt's own COMET
forward (comet.py: comet=, train.comet, clean.comet_qe) and the utilities of minimum Bayes risk
(mbr.py: sentence chrF, BLEU and COMET against pseudo-references, the pick of highest expected
utility). Which candidates MBR or reranking chooses among is decoding's (nmt.inference.rerank)."""
