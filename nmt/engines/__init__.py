"""Engines: the engine interface and its factory (engine.py); nmt's own engine, the Translator
(translator.py), that loads a checkpoint (nmt.loading), prepares its models for decoding
(nmt.decoding.fast_model) and runs nmt.decoding on its workers (workers.py), and draws
attention maps (attention_maps.py); the CTranslate2 engine (ct2_engine.py) over its export
(nmt.interop.ct2_export)."""
