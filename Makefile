# nmt: make install | test | test-long | test-quick | test-slow | test-isa | test-gpu | gpu-wheels |
#      gpu-check | test-browser | test-floor | test-comet | lint | demo
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The CPU wheel that lies on this kind of machine; GPU users install their own torch into .venv first.
TORCH_PIN ?= torch==2.13.0
# The extras .venv (and .venv-floor) get: every optional feature the tests exercise.
EXTRAS := dev,plot,slurm,tensorboard,export,serve,split,langid,fastchrf,comet,onnx
# The oldest torch the suite has passed on, pyproject's floor (tests/system/test_packaging.py checks they agree).
TORCH_FLOOR ?= 2.6.0
# Where test-floor gets torch from: PyPI by default (its Linux wheels pull the CUDA libraries,
# ~3 GB); e.g. FLOOR_INDEX="--index-url https://download.pytorch.org/whl/cpu" where reachable.
FLOOR_INDEX ?=
FLOOR  := .venv-floor
# test-comet: Unbabel's unbabel-comet (it pins transformers<5, numpy<2: a venv of its own)
COMET_VENV := .venv-comet
COMET_PIN ?= unbabel-comet==2.2.7
COMET_INDEX ?= https://download.pytorch.org/whl/cpu
# torchmetrics still imports pkg_resources (gone from setuptools 81); sentencepiece 0.2.1's
# protobuf module needs protobuf 5, which unbabel-comet excludes
COMET_EXTRA_PINS := "setuptools<81" "sentencepiece<0.2.1"
STAMP  := $(VENV)/.installed

.PHONY: install test test-long test-quick test-slow test-isa test-gpu gpu-wheels gpu-check test-browser test-matrix \
        test-floor test-comet lint demo clean

install: $(STAMP)

# The wheels are installed without compiling their bytecode, which is then compiled on every core
# at once (pip compiles on one: ~40 s of the install on 2 cores).
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q --no-compile "$(TORCH_PIN)"
	$(BIN)/python -m pip install -q --no-compile -e ".[$(EXTRAS)]"
	$(BIN)/python -c "import compileall, sys; compileall.compile_dir(sys.prefix + '/lib', quiet=2, workers=0)"
	touch $(STAMP)

# Every test but the long ones (GPU tests skip themselves without one; the browser's runs only
# under test-browser), on two pytest-xdist workers: one at a time took 11.7 minutes on a slow
# 2-core day, two 6.9 (2026-11-26); many tests wait on subprocesses, servers or torchrun.
# worksteal: a worker that runs out takes the other's queued tests.
# test-long runs the tests marked long: each over ~6 s of a worker on 2 cores (Inductor and
# AOTInductor compiles, torchrun pairs, whole commands, the gpu-check dry run, whose wheels
# it fetches first); together they were ~48% of the suite's time. .ci/run runs make test, then
# make test-long: CI runs every test.
# test-quick, the edit-test loop, runs the unit, integration and wings tiers (tests/<tier>/)
# but the tests marked slow (subprocesses, servers, torchrun, the wheel build, training to
# convergence, over ~2 s; every long one); the system tier (recipes, the serving matrix,
# browser, GPU, the tree's own checks) runs in make test. test-slow runs only the slow ones.
test: install
	$(BIN)/python -m pytest -m "not long" -n 2 --dist worksteal

test-long: install gpu-wheels
	$(BIN)/python -m pytest -m long -n 2 --dist worksteal

test-quick: install
	$(BIN)/python -m pytest -m "not slow" -n 2 tests/unit tests/integration tests/wings

test-slow: install
	$(BIN)/python -m pytest -m "slow"

# The tests whose kernels depend on the CPU's instruction set (marker isa: int8, bf16, oneDNN
# packing, the shape caches) again under an AVX2-only CPU's dispatch, every library capped
# (tests/system/test_isa.py, which make test runs too): what fails on AVX2 shows on an AVX-512 machine
# (on a CPU without AVX-512 it skips: the suite's own run is that dispatch).
test-isa: install
	$(BIN)/python -m pytest tests/system/test_isa.py -v

# Every cell of nmt-serve's combinations (tests/system/test_matrix.py: engines x model kinds x
# interfaces x searches, both batching policies); make test runs all pairs of them.
test-matrix: install
	NMT_MATRIX_FULL=1 $(BIN)/python -m pytest tests/system/test_matrix.py -v

# The GPU suite (tests/system/test_gpu.py): NCCL, bf16/fp16, resume, averaging, translation, torchrun
# over every GPU present. Install a CUDA build of torch into .venv first.
test-gpu: install
	$(BIN)/python -m pytest -m gpu -v

# A GPU session in one command (scripts/gpu_check.py; docs/training.md, "A GPU session"). First,
# where PyPI is reachable, `make gpu-wheels` puts the wheels that a GPU machine without internet
# needs beside its python's CUDA torch into GPU_WHEELS (for CPython GPU_PYTHON_VERSION, ~30 MiB:
# carry it to the machine); there `make gpu-check PYTHON=/its/python OUT=DIR` installs them and
# nmt (built from this checkout) into that python and runs, within 6.5 minutes, bench_train at
# steady state (base and big, eager and compiled), the GPU suite, a 2-minute base run on the
# bundled debian-po en-de and its test BLEU, writing DIR/gpu_check.json after each step.
# `make gpu-check DRY=1` runs every step on the CPU at tiny sizes, into a fresh venv that holds
# only .venv's torch (tests/system/test_gpu_check.py runs it in make test-long).
GPU_WHEELS ?= build/gpu-wheels
GPU_PYTHON_VERSION ?= 3.12
OUT ?= build/gpu-check/out
MINUTES ?= 6.5
gpu-wheels: $(GPU_WHEELS)/built-from.json

$(GPU_WHEELS)/built-from.json: scripts/gpu_wheels.txt | $(STAMP)
	$(BIN)/python scripts/gpu_check.py --fetch-wheels $(GPU_PYTHON_VERSION) --wheels $(GPU_WHEELS)

gpu-check: $(if $(DRY),gpu-wheels)
	$(if $(DRY),$(BIN)/python,$(PYTHON)) scripts/gpu_check.py --wheels $(GPU_WHEELS) \
	  --out $(OUT) --minutes $(MINUTES) $(if $(DRY),--dry-run)

# nmt-serve's page (GET /) in headless chromium over the DevTools protocol
# (tests/system/test_browser.py): Debian's chromium is installed first if missing (apt-get, as root);
# the screenshot is build/serve-page.png. nmt-export format=onnx's page (tests/wings/test_onnx_browser.py)
# needs transformers.js from npm, installed into $(TRANSFORMERS_JS) without its post-install
# download of native binaries (--ignore-scripts): the browser runs ONNX Runtime's WebAssembly.
TRANSFORMERS_JS := build/transformers-js
test-browser: install
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)
	test -f $(TRANSFORMERS_JS)/node_modules/@huggingface/transformers/dist/transformers.min.js || \
	  (mkdir -p $(TRANSFORMERS_JS) && cd $(TRANSFORMERS_JS) && ONNXRUNTIME_NODE_INSTALL=skip \
	   npm install --ignore-scripts --no-audit --no-fund @huggingface/transformers@4)
	NMT_BROWSER=1 $(BIN)/python -m pytest -m browser -v

# The whole suite on the floor torch, in its own venv (outside `make test`: a large download).
test-floor:
	test -x $(FLOOR)/bin/python || $(PYTHON) -m venv $(FLOOR)
	$(FLOOR)/bin/python -m pip install -q --upgrade pip
	$(FLOOR)/bin/python -m pip install -q $(FLOOR_INDEX) "torch==$(TORCH_FLOOR)"
	$(FLOOR)/bin/python -m pip install -q "torch==$(TORCH_FLOOR)" -e ".[$(EXTRAS)]"
	$(FLOOR)/bin/python -c "import torch; assert torch.__version__.split('+')[0] == '$(TORCH_FLOOR)', torch.__version__"
	$(FLOOR)/bin/python -m pytest -p no:cacheprovider

# nmt's COMET against Unbabel's: tiny random COMET-22 and CometKiwi models are built
# (nmt/testing/comet_models.py), unbabel-comet's predict scores them in .venv-comet
# (scripts/comet_reference.py, CPU torch from COMET_INDEX where reachable, else PyPI), and
# tests/wings/test_comet.py compares nmt's scores with them (within 1e-4) in .venv.
# `make test` compares with the scores recorded in tests/data/comet_scores.json instead.
test-comet: install
	test -x $(COMET_VENV)/bin/python || $(PYTHON) -m venv $(COMET_VENV)
	$(COMET_VENV)/bin/python -m pip install -q --upgrade pip
	$(COMET_VENV)/bin/python -c "import torch" 2>/dev/null || \
	  $(COMET_VENV)/bin/python -m pip install -q --timeout 15 --retries 1 --index-url $(COMET_INDEX) torch || \
	  $(COMET_VENV)/bin/python -m pip install -q "$(TORCH_PIN)"
	$(COMET_VENV)/bin/python -m pip install -q "$(COMET_PIN)" $(COMET_EXTRA_PINS)
	rm -rf build/comet && mkdir -p build/comet
	$(BIN)/python -m nmt.testing.comet_models build/comet/models
	$(COMET_VENV)/bin/python scripts/comet_reference.py build/comet/models build/comet/scores.json
	NMT_COMET_SCORES=build/comet/scores.json $(BIN)/python -m pytest -p no:cacheprovider -q \
	  tests/wings/test_comet.py -k parity

lint: install
	$(BIN)/ruff check nmt tests scripts

demo: install
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/demo.sh

clean:
	rm -rf $(VENV) $(FLOOR) $(COMET_VENV) build *.egg-info .pytest_cache .ruff_cache
