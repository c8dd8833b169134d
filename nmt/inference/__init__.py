"""Inference: the engine interface and its factory (engine.py), nmt's engine, the Translator
(translator.py), that loads (loading.py), prepares and runs a model on its workers
(workers.py), the decoding core (core.py: one step loop; rules.py, constrained.py) that batch
translation (search.py) and continuous batching (stepping.py) drive, and the decoding engine
(fast.py); the CTranslate2 engine (ct2_engine.py) over its export (ct2_export.py)."""
