"""nmt-serve: the HTTP application (app.py), its request and response models (schemas.py), the
translation service its routes call (service.py) and the batcher that lets concurrent requests
share decoding batches (batcher.py)."""
