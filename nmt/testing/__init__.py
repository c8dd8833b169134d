"""What nmt's tests and benchmark scripts share that no command needs: the GPU simulation
harness (nmt.testing.gpu_sim). Importable from a checkout (an editable install), left out of
the built wheel (pyproject.toml lists the packages it ships; tests/system/test_packaging.py
checks)."""
