"""Inference: the engine interface and its factory (engine.py), nmt's engine, the Translator
(translator.py), that loads (nmt.loading), prepares (fast_model.py) and runs a model on its
workers (workers.py); the decoding core (core.py: one step loop, with the models' side in
decoder.py, the rules in rules.py, constraints in constrained.py) that batch translation
(batches.py) and continuous batching (stepping.py) drive; the CTranslate2 engine
(ct2_engine.py) over its export (nmt.interop.ct2_export); what goes with a translation:
alignments, attention maps, MBR's and reranking's choice (the metrics they score
with: nmt.metrics), document pieces."""
