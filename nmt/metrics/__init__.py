"""Metrics: what nmt scores translations with, below the engines that make them: sacreBLEU's
BLEU and chrF (scoring.py: validation's and nmt-translate's one scorer). nmt's own COMET forward
and minimum Bayes risk's utilities are wings (nmt.wings.comet, nmt.wings.mbr)."""
