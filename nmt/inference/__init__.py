"""Inference: the translation pipeline (pipeline.py) between text and an engine's tokens
(nmt.engines), that nmt-translate and nmt-serve share, and the engine pick they open a model
with (engines.py: nmt's own, or CTranslate2's). It sits above the wings it calls (nmt.wings:
markup, glossary and terms, words, alignments, MBR and reranking) and splits texts with
nmt.data.segment."""
