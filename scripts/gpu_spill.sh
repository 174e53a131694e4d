#!/usr/bin/env bash
# The spill's GPU measurements in one device call (bench/results/spill_h200.md):
#   here:  ninja -C build-sm90 tests/spw_gpu_tests bin/spillway bench/exl3/bench_exl3 bench/exl3/bench_exl3_cpu
#          BUILD_DIR=build-sm90 STAGE_BINS="tests/spw_gpu_tests bin/spillway bench/exl3/bench_exl3 bench/exl3/bench_exl3_cpu" \
#            bash scripts/gpu_test.sh stage
#   there: bash scripts/gpu_spill.sh          # carry: .exl3pack ; results in $OUT
# Runs: the placement tests (GPU_TEST_FILTER, default EngineSpill.*); bench_exl3's fused MoE tables with the experts in
# HBM and in mapped pinned host memory against each medium's measured read rate; bench_exl3_cpu (the CPU runtime at one
# token per expert against the host's DRAM read rate); then `spillway bench` on a synthetic full-width V4.1 model
# (LAYERS, default 4; EXL3 3-bit experts, uniform random routing) under fixed-share placements
# (tools/placement/fixed_share.py): all on the GPU, a third in pinned host memory, a third on the CPU, a third of
# each, and all in pinned host memory. SKIP_TESTS=1, SKIP_KERNELS=1 and PLACEMENTS="name:host_gpu:host_cpu ..." trim it;
# BENCH_ARGS adds `spillway bench` flags (e.g. --cpu-expert-activations int16); SYNTH_ARGS generator flags (e.g.
# --routing-skew 0.15, hot and cold experts; then a placement from `serve --record-routing` + `plan --routing-stats`
# is the one to compare with fixed shares).
set -u
. scripts/staged_env.sh
OUT=${OUT:-/tmp/spill_out}
mkdir -p "$OUT"
LAYERS=${LAYERS:-4}
MODEL=/tmp/synth_spill_v41
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  nproc; free -g | head -2
  $B/spillway --version
} 2>&1 | tee "$OUT/spill_main.log"
[ -f $MODEL/config.json ] || python3 tools/synth/make_synthetic_model.py $MODEL --arch v41 --experts exl3 --bits 3 \
  --layers "$LAYERS" --tokenizer none ${SYNTH_ARGS:-} > /tmp/synth_spill.log 2>&1 &
SYNTH_PID=$!
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout 200 $B/spw_gpu_tests --gtest_brief=1 --gtest_filter="${GPU_TEST_FILTER:-EngineSpill.*}" > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc $? — $(grep -c '^\[  FAILED' "$OUT/gpu_tests.log") failed" | tee -a "$OUT/spill_main.log"
fi
if [ -z "${SKIP_KERNELS:-}" ]; then
  timeout 150 $B/bench_exl3 /nonexistent 200 gpu moe > "$OUT/bench_exl3_moe.md" 2>&1
  echo "bench_exl3 moe rc $?" | tee -a "$OUT/spill_main.log"
  timeout 150 $B/bench_exl3_cpu > "$OUT/bench_exl3_cpu.md" 2>&1
  echo "bench_exl3_cpu rc $?" | tee -a "$OUT/spill_main.log"
fi
wait $SYNTH_PID 2>/dev/null
tail -1 /tmp/synth_spill.log >> "$OUT/spill_main.log"
for p in ${PLACEMENTS:-gpu:0:0 host_gpu_third:0.333:0 host_cpu_third:0:0.333 each_third:0.333:0.333 host_gpu_all:1:0}; do
  IFS=: read -r name hg hc <<< "$p"
  python3 tools/placement/fixed_share.py $MODEL --host-gpu "$hg" --host-cpu "$hc" -o /tmp/placement_$name.json >> "$OUT/spill_main.log"
  timeout ${BENCH_TIMEOUT:-120} $B/spillway bench --model $MODEL --placement /tmp/placement_$name.json --batches 1,8,32 \
    --prefill 4096 --prefill-runs 1 --decode-steps 16 --batch-steps 8 --batch-prompt 256 ${BENCH_ARGS:-} --json "$OUT/bench_$name.json" \
    > "$OUT/bench_$name.md" 2>&1
  echo "bench $name rc $? — $(grep -m1 '^ms/token' "$OUT/bench_$name.md")" | tee -a "$OUT/spill_main.log"
done
