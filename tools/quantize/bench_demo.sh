#!/usr/bin/env bash
# The measurements in bench/results/quantize_demo.md, on the bundled demo model.
#   tools/quantize/bench_demo.sh [SPILLWAY_BIN] [WORK_DIR]
# Runs (each step's stdout/stderr in WORK_DIR/*.log):
#   1. K=3 packs of every expert of layer $LAYER: calibrated, --identity-hessian, --routing-weighted
#   2. the same Hessians at K=2 and K=4 on experts 0-7 (proxy error against K)
#   3. eval-kl of each K=3 pack against the source on held-out text
set -eu
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
        --threads "$THREADS" --no-progress "$@" > "$W/$name.log" 2>&1; tail -8 "$W/$name.log"; }
common=(--calibration "$W/calibration.jsonl" --calibration-tokens "$CAL_TOKENS" --layers "$LAYER")
q k3_cal --bits 3 "${common[@]}" --keep-hessians
q k3_identity --bits 3 --identity-hessian --layers "$LAYER"
q k3_routing --bits 3 "${common[@]}" --routing-weighted
for k in 2 4; do
  mkdir -p "$W/k${k}_cal/.quantize-work" && cp -r "$W/k3_cal/.quantize-work/hessians" "$W/k${k}_cal/.quantize-work/"
  q k${k}_cal --bits $k "${common[@]}" --experts 0,1,2,3,4,5,6,7
done
for p in k3_cal k3_identity k3_routing; do
  echo "$p: $("$BIN" eval-kl --model models/demo --quantized "$W/$p" --text "$HELDOUT" --tokens "$EVAL_TOKENS" --row 256 --threads "$THREADS" 2>/dev/null)"
done | tee "$W/eval_kl.log"
