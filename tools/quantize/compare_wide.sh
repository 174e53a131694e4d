#!/usr/bin/env bash
# Issue 6 quality bar on a wide sample: Spillway vs exllamav3's quantize_exl3 on the same W/H at K = 2, 3, 4, one command.
#   here:  bash tools/quantize/compare_wide.sh stage [BUILD_DIR]
#            packs the W/H dumps in .exl3wide_src/wh (demo model layers 3 and 7, experts 0-7, w1/w2/w3: 48 tensors,
#            W and H only; how they were made: bench/results/quantize_demo.md), BUILD_DIR's quantize_candidates (a
#            CUDA build, stripped) and its C++ runtime libs into .exl3wide/wide.tar.xz (~6 MB)
#   there: bash tools/quantize/compare_wide.sh run        # carry: .exl3wide .deps
# Spillway's side is computed there with the CUDA quantizer (quantize_candidates --device cuda, the default candidate
# list = what `spillway quantize --device cuda` keeps) while exllamav3's extension JIT-builds; with
# bench/results/raw/quantize_wide_spillway_k$K.json present (the CPU quantizer here) the two are compared too.
# Writes two files ($OUT returns at most 8): $OUT/compare_wide.md (per tensor and per K) and $OUT/compare_wide.tar.gz
# (compare_wide.json, compare_wide.log, Spillway's spillway_k{2,3,4}.{json,txt}).
# Time: exllamav3's JIT build (~315 s unless cached by an earlier script of the same call) + ~0.5-1 s per tensor and K.
set -u
if [ "${1:-}" = stage ]; then
  B=${2:-build-quant-d}
  [ -d .exl3wide_src/wh ] || { echo "compare_wide stage: no .exl3wide_src/wh (bench/results/quantize_demo.md)"; exit 1; }
  mkdir -p .exl3wide_src/lib .exl3wide
  cp "$B/bench/quantize/quantize_candidates" .exl3wide_src/ && strip .exl3wide_src/quantize_candidates
  for l in libspdlog.so.1.10 libfmt.so.9 libstdc++.so.6; do cp -L /usr/lib/x86_64-linux-gnu/$l .exl3wide_src/lib/; done
  tar cJf .exl3wide/wide.tar.xz -C .exl3wide_src wh lib quantize_candidates && ls -la .exl3wide
  exit 0
fi
FINAL=${OUT:-/tmp/compare_wide_out}
OUT=/tmp/compare_wide_work
mkdir -p "$FINAL" "$OUT"
W=/tmp/exl3wide
mkdir -p $W && tar xJf .exl3wide/wide.tar.xz -C $W || { echo "compare_wide: no .exl3wide/wide.tar.xz (carry .exl3wide)" | tee "$FINAL/compare_wide.md"; exit 1; }
export LD_LIBRARY_PATH=$W/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=14   # the arch list as in scripts/gpu_test.sh (JIT cache key)
python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/site .deps/exllamav3-*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
{
  echo "$(ls $W/wh | wc -l) W/H dumps; $(nvidia-smi --query-gpu=name --format=csv,noheader)"
  (for K in 2 3 4; do
     t=$SECONDS
     $W/quantize_candidates --device cuda --threads 2 --bits $K --json "$OUT/spillway_k$K.json" \
       $W/wh/*.safetensors > "$OUT/spillway_k$K.txt" 2>&1 || echo "quantize_candidates K=$K failed"
     tail -3 "$OUT/spillway_k$K.txt"
     echo "quantize_candidates K=$K (CUDA, 2 threads): $((SECONDS - t)) s"
   done) &
  python3 -c "
import sys, types, time
stub = types.ModuleType('pydantic'); stub.PydanticUserError = type('E', (Exception,), {}); sys.modules['pydantic'] = stub
t = time.time()
from exllamav3.ext import exllamav3_ext
print('exllamav3 extension ready in %.0f s' % (time.time() - t))"
  wait
  for K in 2 3 4; do
    [ -f bench/results/raw/quantize_wide_spillway_k$K.json ] && python3 -c "
import json
a = json.load(open('$OUT/spillway_k$K.json'))['tensors']; b = json.load(open('bench/results/raw/quantize_wide_spillway_k$K.json'))['tensors']
common = [s for s in a if s in b]
same = sum(a[s]['best'] == b[s]['best'] for s in common)
worst = max(abs(a[s]['best'] / b[s]['best'] - 1) for s in common)
print(f'K=$K: CUDA vs CPU quantizer (committed JSON): identical proxy error on {same}/{len(common)} tensors, max relative difference {worst:.2e}')"
  done
} 2>&1 | tee "$OUT/compare_wide.log"
SP=""  # the CUDA run's numbers; the committed CPU ones if it failed
for K in 2 3 4; do
  if [ -s "$OUT/spillway_k$K.json" ]; then SP="$SP $K=$OUT/spillway_k$K.json"
  else echo "K=$K: no CUDA result, using the committed CPU one" | tee -a "$OUT/compare_wide.log"
       SP="$SP $K=bench/results/raw/quantize_wide_spillway_k$K.json"; fi
done
python3 tools/quantize/compare_wide.py --wh $W/wh --spillway $SP --json "$OUT/compare_wide.json" 2>&1 \
  | tee "$OUT/compare_wide.md"
cp "$OUT/compare_wide.md" "$FINAL/compare_wide.md"
tar czf "$FINAL/compare_wide.tar.gz" -C "$OUT" .
