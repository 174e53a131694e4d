#!/usr/bin/env bash
# One command for the GPU: train the demo model deterministically from its seed, export it (as shards small
# enough to come back through the device's $OUT; `export.py merge` joins them), and evaluate it.
#   tools/demo_model/run_all.sh [OUT_DIR] [SEED] [BUDGET_S|STEPS=n]
# Needs tools/demo_model/data/tokens.npz and models/demo/{tokenizer.json,engram_token_map.safetensors}.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:-${OUT:-/tmp/demo_out}}
SEED=${2:-1}
LIMIT=${3:-300}
EXP=/tmp/demo_export
mkdir -p "$OUT_DIR" "$EXP"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
if [[ "$LIMIT" == STEPS=* ]]; then SCHED="--steps ${LIMIT#STEPS=}"; else SCHED="--budget-s $LIMIT"; fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
$PY tools/demo_model/train.py --seed "$SEED" $SCHED --batch 32 --seq 512 --shards 4 --out "$EXP" \
  2>&1 | tee "$OUT_DIR/train.log"
cp "$EXP"/train_log.json "$EXP"/model-*-of-*.safetensors "$OUT_DIR/"
# oracle on the GPU over as much of the held-out text as fits in the budget (CPU fallback: eval_oracle.py)
timeout 100 $PY tools/demo_model/eval_oracle.py "$EXP" --device cuda --budget-s 60 \
  --out "$OUT_DIR/routing_stats.json" --ppl-out "$OUT_DIR/oracle_ppl.json" 2>&1 | tee -a "$OUT_DIR/train.log" || true
