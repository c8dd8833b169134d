# nmt: make install | test | test-gpu | lint | demo
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The CPU wheel that lies on this kind of machine; GPU users install their own torch into .venv first.
TORCH_PIN ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: install test test-slow test-gpu lint demo clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_PIN)"
	$(BIN)/python -m pip install -q -e ".[dev,plot,slurm,tensorboard,export,serve]"
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest

test-slow: install
	$(BIN)/python -m pytest -m slow

# The GPU suite (tests/test_gpu.py): NCCL, bf16/fp16, resume, averaging, translation, torchrun
# over every GPU present. Install a CUDA build of torch into .venv first.
test-gpu: install
	$(BIN)/python -m pytest -m gpu -v

lint: install
	$(BIN)/ruff check nmt tests scripts

demo: install
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/demo.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
