"""nmt-serve: the HTTP application (app.py) and the batcher that lets concurrent requests share
decoding batches (batcher.py)."""
