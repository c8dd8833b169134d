"""Inference: the translation pipeline (pipeline.py) between text and an engine's tokens
(nmt.engines), that nmt-translate and nmt-serve share, and its wings: sentence and paragraph
splitting (segment.py), markup (markup.py, markup_parse.py, markup_restore.py), glossary and
kept terms (glossary.py, terms.py), word scores (words.py), alignments (align.py), MBR's and
reranking's choice (rerank.py; the metrics they score with: nmt.metrics)."""
