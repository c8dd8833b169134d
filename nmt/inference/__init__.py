"""Inference: the Translator (translator.py) that loads, prepares and runs a model on its
worker processes (workers.py), the searches (search.py) and the decoding engine (fast.py)."""
