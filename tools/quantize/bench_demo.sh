#!/usr/bin/env bash
# The first layer-5 measurements on the bundled demo model (bench/results/quantize_demo.md, 2026-12-02 entries; the
# full tables of runs 1-4 are in that file's git history).
#   tools/quantize/bench_demo.sh [SPILLWAY_BIN] [WORK_DIR]
# Runs (each quantize run's output in WORK_DIR/NAME.log, kl lines in WORK_DIR/eval_kl.log):
#   1. K=3 packs of every expert of layer $LAYER: calibrated (Hessians kept) and --identity-hessian
#   2. kl of both packs against the source on held-out text
#   3. the calibrated Hessians at K=2 and K=4 on experts 0-3 (proxy error against K)
#   4. with ROUTING=1: a --routing-weighted K=3 pack of the same layer and its kl
#   5. with FLOOR=1: a K=8 identity pack of the same layer (weights practically lossless) and its kl:
#      the KL that remains without weight error (bench/results/quantize_demo.md)
set -u
BIN=${1:-build-quant/bin/spillway}
W=${2:-/tmp/spw_quantize_bench}
LAYER=${LAYER:-5}
THREADS=${THREADS:-2}
CAL_TOKENS=${CAL_TOKENS:-4096}
EVAL_TOKENS=${EVAL_TOKENS:-2048}
HELDOUT=tools/demo_model/data/heldout.txt
mkdir -p "$W"
[ -f "$W/calibration.jsonl" ] || python3 tools/quantize/make_calibration.py "$W/calibration.jsonl"
q() { local name=$1; shift; /usr/bin/time -f "%e s wall" "$BIN" quantize --model models/demo --out "$W/$name" \
        --threads "$THREADS" --no-progress "$@" > "$W/$name.log" 2>&1; }
ev() { echo "$1: $("$BIN" kl --model models/demo --quantized "$W/$1" --text "$HELDOUT" --tokens "$EVAL_TOKENS" \
        --row 256 --threads "$THREADS" 2>/dev/null)" >> "$W/eval_kl.log"; }
cal=(--calibration "$W/calibration.jsonl" --calibration-tokens "$CAL_TOKENS")
q k3_cal --bits 3 "${cal[@]}" --layers "$LAYER" --keep-hessians
q k3_identity --bits 3 --identity-hessian --layers "$LAYER"
ev k3_cal
ev k3_identity
for k in 2 4; do  # reuse the K=3 run's Hessians (they do not depend on K)
  mkdir -p "$W/k${k}_cal/.quantize-work" && cp -r "$W/k3_cal/.quantize-work/hessians" "$W/k${k}_cal/.quantize-work/"
  q k${k}_cal --bits $k "${cal[@]}" --layers "$LAYER" --experts 0,1,2,3
done
if [ "${ROUTING:-0}" = 1 ]; then
  q k3_routing --bits 3 "${cal[@]}" --layers "$LAYER" --routing-weighted
  ev k3_routing
fi
if [ "${FLOOR:-0}" = 1 ]; then
  q k8_identity --bits 8 --identity-hessian --layers "$LAYER"
  ev k8_identity
fi
cat "$W/eval_kl.log"
