"""Other toolkits' models: Hugging Face directories read for nmt-import (hf_files.py, with the
MarianMT and M2M100 / NLLB-200 converters), and nmt's checkpoints written as CTranslate2
(ct2_export.py) and transformers (transformers_export.py) model directories."""
