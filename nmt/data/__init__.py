"""Data: parallel corpora in (corpus.py), cleaned (cleaning.py), SentencePiece models and
language tags (tokenizer.py, subwords.py, languages.py), encoded and binarized (binarize.py),
memory-mapped (arrays.py) and read back as token-bucket batches (batches.py), encoded afresh
with subword sampling (sampling.py); texts cut into the pieces a model translates
(segment.py); a checkpoint's vocabulary (vocab.py); the lexical shortlist built from the
training pairs, which decoding and the CTranslate2 export read (shortlist.py)."""
