"""Engines: the engine interface and its factory (engine.py); nmt's own engine, the Translator
(translator.py), that loads a checkpoint (nmt.loading), prepares its models for decoding
(nmt.decoding.fast_model) and runs nmt.decoding on its workers (workers.py), and draws
attention maps (attention_maps.py). The CTranslate2 engine is a wing (nmt.wings.ctranslate2),
which the front ends' engine pick (nmt.inference.engines) opens."""
