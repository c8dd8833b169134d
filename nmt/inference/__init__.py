"""Inference: the engine interface and its factory (engine.py), nmt's engine, the Translator
(translator.py), that loads (loading.py), prepares and runs a model on its workers
(workers.py), the searches (search.py, stepping.py) and the decoding engine (fast.py); the
CTranslate2 engine (ct2_engine.py) over its export (ct2_export.py)."""
