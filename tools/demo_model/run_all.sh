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
$PY tools/demo_model/train.py --seed "$SEED" $SCHED --batch 32 --seq 512 --shards 4 --eval-windows ${EVAL_WINDOWS:-100} --out "$EXP" \
  2>&1 | tee "$OUT_DIR/train.log"
cp "$EXP"/train_log.json "$EXP"/model-*-of-*.safetensors "$OUT_DIR/"
# optional: the oracle on the GPU over as much of the held-out text as fits in ORACLE_S seconds
# (routing_stats.json also carries the perplexity); finish.sh does the same on the CPU otherwise.
ORACLE_S=${ORACLE_S:-0}
if [[ "$ORACLE_S" != 0 ]]; then
  timeout $((ORACLE_S + 30)) $PY tools/demo_model/eval_oracle.py "$EXP" --device cuda --budget-s "$ORACLE_S" \
    --out "$OUT_DIR/routing_stats.json" 2>&1 | tee -a "$OUT_DIR/train.log" || true
fi
