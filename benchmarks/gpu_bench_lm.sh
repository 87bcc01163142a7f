#!/usr/bin/env bash
# The draft issue's benchmark on one CUDA GPU, prepared for a task that is lent one (not run here:
# no GPU was lent to the tasks that wrote it). Budget: under 13 minutes on an H200 (time limits 300 + 240 + 240 s).
#
# What it needs on the GPU machine (nothing can be fetched there): Python with torch (CUDA),
# transformers, numpy, scipy, tqdm, safetensors (the H200 image has them), plus the wheels of
# array-api-compat, gguf and cvxpy's absence is fine (the LM path does not import cvxpy); and the
# embedded verifier's GGUF file (98 MB, over one call's 64 MiB: carry it split, e.g.
# `split -b 60M SmolLM2-135M-Instruct.Q4_1.gguf .gguf/part.` over two warm calls, then `cat`).
#
#   bash benchmarks/gpu_bench_lm.sh /path/to/SmolLM2-135M-Instruct.Q4_1.gguf "$OUT"
#
# Steps: build the draft on the GPU (bfloat16; the same DraftConfig as on CPU), then bench_lm on
# CUDA at k = 2, 4, 6, 8 and batch sizes 1, 4, 8 with every rule, timings synchronised by the loop's
# host reads; then the tree run (issue 19): SpS and Cactus delta = 1 on EAGLE-2 budget trees of 16, 32
# and 60 nodes (depth 5-6, top-4 / top-8; on a GPU a tree forward costs about one token's, so larger
# trees than the CPU's pay off) beside the chain at k = 4, batch 1.
# Both bench_lm runs also print the roofline (lm/roofline.py, measured in the same process on the GPU):
# the copy bandwidth of a 1 GiB device buffer, the bfloat16 GEMM rate, the nominal HBM bandwidth from the
# device's properties, and per phase (draft, verifier forward, verify, bookkeeping) its time, bytes, FLOPs,
# roofline time, measured / roofline, its share of the measured copy bandwidth and of the nominal HBM
# bandwidth ("nominal share"); the last step prints both runs' tables again, every row.
# Results: $OUT/bench_lm_cuda.json, $OUT/bench_lm_cuda_trees.json and the printed tables.
set -euo pipefail
GGUF=${1:?path to the SmolLM2 GGUF file}
OUT=${2:-.}
export PYTHONUNBUFFERED=1 CACTUS_THEORY_CACHE="$OUT/cache" CACTUS_SMOLLM2_GGUF="$GGUF"
mkdir -p "$CACTUS_THEORY_CACHE"
timeout 300 python3 - <<'EOF'
import os, time, torch
from cactus_theory.lm.train.draft_build import build_draft
from cactus_theory.lm.pair import load_model
t = time.time()
v, tok = load_model("smollm2")
v = v.to("cuda")
build_draft(verifier=v, tokenizer=tok)
print(f"draft built on {torch.cuda.get_device_name()} in {time.time() - t:.0f} s")
EOF
timeout 240 python3 benchmarks/bench_lm.py --device cuda --dtype bfloat16 --ks 2 4 6 8 --batch-sizes 1 4 8 \
    --roofline-mib 1024 --out "$OUT/bench_lm_cuda.json"
timeout 240 python3 benchmarks/bench_lm.py --device cuda --dtype bfloat16 --ks 4 --batch-sizes 1 --rules sps cactus \
    --tree-budget 16,5,4 32,6,4 60,6,8 --roofline-mib 1024 --out "$OUT/bench_lm_cuda_trees.json"
for f in "$OUT/bench_lm_cuda.json" "$OUT/bench_lm_cuda_trees.json"; do
    python3 benchmarks/roofline_table.py "$f" --rules all
done
