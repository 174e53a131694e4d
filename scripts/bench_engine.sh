#!/usr/bin/env bash
# Issue 7's performance benchmark on the H200 machine: synthetic full-width models (tools/synth) and
# `spillway bench` on each, in one device call.
#   here:  build spillway with CUDA (build/bin/spillway), then  bash scripts/gpu_test.sh stage
#   there: bash scripts/bench_engine.sh                 # carry: .exl3pack ; results in $OUT
# Models (generated in parallel into /tmp; ~37 GB of disk for the defaults):
#   V4.1-Flash width, EXL3 K=3 routed experts, V41_LAYERS layers (default 4: real layers 0..3 = window,
#     window + Engram, KV/index source ratio 2, reuse ratio 2; V41_REAL_LAYERS=2,3,20,24 picks others);
#   V4-Flash width, MXFP4 routed experts as released, V4_LAYERS layers (default 4: window, window, CSA,
#     HCA; layers 0..2 hash-routed) — the same model helper C's llama.cpp comparison converts.
# Expected time on the H200: generation ~1-2 min (both models at once), each bench ~1-2.5 min (load,
# device rates, decode, batches 1/4/16/64, prefill 4K and 40K); each bench is capped by BENCH_TIMEOUT.
# Needs the GPU engine to load routed experts without their f32 host copy (model/weights.h
# LoadOptions::routed_expert_values = false in load_gpu_model, and upload_weights' linear() taking
# n_out == 0, not w.empty(), as "absent"). Without it the V4.1 EXL3 load decodes every expert on the
# CPU (~170 ns/weight: ~37 min per layer; the bench hits BENCH_TIMEOUT) and 4 V4 layers need ~105 GB
# of host RAM as f32.
# PROFILE=1 runs each bench under the CUPTI kernel tracer (tools/profile/kernel_trace.cpp, staged by
# scripts/gpu_test.sh stage): $OUT/trace_<name>.md has one summary per timed phase (its window labels are
# in bench_<name>.md). The tracer adds a little time per kernel; profile runs are not the benchmark.
# GPU_TEST_FILTER='...' also runs those GPU tests (.exl3dev/spw_gpu_tests, staged) while the models are generated
# (the generator is CPU work): $OUT/gpu_tests.log. The golden fixtures must be in the tree (tests/golden/fixtures).
# More than 8 files in $OUT (the device tool returns 8) are packed into $OUT/bench_out.tar.gz, bench_main.log kept beside it.
# Switches: SKIP_V41=1, SKIP_V4=1, KEEP_MODELS=1 (reuse /tmp/synth_* if present), BENCH_ARGS (extra bench
# flags), SYNTH_ARGS (extra generator flags, e.g. "--width-divisor 16 --engram-vocab 1000" for a smoke run),
# AB_ENV / AB_ARGS (environment A/B runs after the default ones; see below).
set -u
cd "$(dirname "$0")/.."
[ -f .exl3pack/dev.tar.xz ] && [ ! -x .exl3dev/spillway ] && tar xJf .exl3pack/dev.tar.xz
. scripts/link_build_path.sh
SPW=${SPILLWAY_BIN:-.exl3dev/spillway}
OUT=${OUT:-/tmp/bench_out}
mkdir -p "$OUT"
# The staged libs only for spillway: coreutils on the GPU machine die with SIGBUS when they load the dev
# box's libpcre2 through libselinux.
SPW_LIBS=$PWD/.exl3dev/lib:/usr/local/cuda/lib64
spw() { LD_LIBRARY_PATH=$SPW_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$SPW" "$@"; }
V41_DIR=/tmp/synth_v41_exl3 V4_DIR=/tmp/synth_v4_mxfp4
V41_SEL=${V41_REAL_LAYERS:+--real-layers $V41_REAL_LAYERS}
V41_SEL=${V41_SEL:---layers ${V41_LAYERS:-4}}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-150}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  nproc; free -g | head -2; df -h /tmp | tail -1
  spw bench --help > /dev/null || echo "spillway binary not runnable: $SPW"
} 2>&1 | tee "$OUT/bench_main.log"

gen() {  # dir, args...
  local dir=$1; shift
  if [ -n "${KEEP_MODELS:-}" ] && [ -f "$dir/config.json" ]; then echo "reusing $dir"; return 0; fi
  rm -rf "$dir"
  /usr/bin/time -f "generation %e s, %M KB" python3 tools/synth/make_synthetic_model.py "$dir" "$@" --tokenizer none ${SYNTH_ARGS:-}
}
[ -z "${SKIP_V41:-}" ] && (gen $V41_DIR --arch v41 --experts exl3 --bits 3 $V41_SEL > "$OUT/synth_v41.log" 2>&1) &
[ -z "${SKIP_V4:-}" ] && (gen $V4_DIR --arch v4 --experts mxfp4 --layers ${V4_LAYERS:-4} > "$OUT/synth_v4.log" 2>&1) &
if [ -n "${GPU_TEST_FILTER:-}" ]; then
  [ -x .exl3dev/spw_gpu_tests ] || echo "GPU_TEST_FILTER: no .exl3dev/spw_gpu_tests (stage it)" | tee -a "$OUT/bench_main.log"
  [ -x .exl3dev/spw_gpu_tests ] && timeout 400 env LD_LIBRARY_PATH=$SPW_LIBS .exl3dev/spw_gpu_tests --gtest_brief=1 \
    --gtest_filter="$GPU_TEST_FILTER" > "$OUT/gpu_tests.log" 2>&1
  tail -25 "$OUT/gpu_tests.log" | tee -a "$OUT/bench_main.log"
fi
wait
cat "$OUT"/synth_*.log | tee -a "$OUT/bench_main.log"

run_bench() {  # name, dir
  echo "== spillway bench $1 ($2)" | tee -a "$OUT/bench_main.log"
  spw inspect "$2" > "$OUT/inspect_$1.txt" 2>&1
  local trace=()
  [ -n "${PROFILE:-}" ] && trace=(CUDA_INJECTION64_PATH=$PWD/.exl3dev/lib/libspw_kernel_trace.so SPW_TRACE_OUT=$OUT/trace_$1.md)
  /usr/bin/time -f "bench %e s, host peak %M KB" timeout "$BENCH_TIMEOUT" env LD_LIBRARY_PATH=$SPW_LIBS "${trace[@]}" "$SPW" bench --model "$2" \
    --json "$OUT/bench_$1.json" --batch-prompt 512 ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_$1.md"
  echo "rc ${PIPESTATUS[0]}" | tee -a "$OUT/bench_main.log"
}
[ -z "${SKIP_V41:-}" ] && [ -z "${SKIP_MAIN:-}" ] && run_bench v41_exl3 $V41_DIR
[ -z "${SKIP_V4:-}" ] && [ -z "${SKIP_MAIN:-}" ] && run_bench v4_mxfp4 $V4_DIR
# A/B switches (docs/settings.md), each measured on both models after the default runs, one at a time:
#   AB_ENV="SPILLWAY_DENSE_DEVICE_ROWS=16 SPILLWAY_F32_SPLIT_GEMM=0" AB_ARGS="--batches 16 64"
# writes bench_<model>_<VAR>.md; AB_ARGS replaces BENCH_ARGS for those runs (fewer phases fit the call).
# On a warm machine a second call can run only these: KEEP_MODELS=1 SKIP_MAIN=1 AB_ENV=... bash scripts/bench_engine.sh
for ab in ${AB_ENV:-}; do
  var=${ab%%=*}
  for m in ${SKIP_V41:+skip}v41_exl3:$V41_DIR ${SKIP_V4:+skip}v4_mxfp4:$V4_DIR; do
    case $m in skip*) continue ;; esac
    echo "== A/B $ab on ${m%%:*}" | tee -a "$OUT/bench_main.log"
    timeout "$BENCH_TIMEOUT" env LD_LIBRARY_PATH=$SPW_LIBS "$ab" "$SPW" bench --model "${m#*:}" --batch-prompt 512 \
      ${AB_ARGS:-${BENCH_ARGS:-}} > "$OUT/bench_${m%%:*}_$var.md" 2>&1
    echo "rc $?" | tee -a "$OUT/bench_main.log"
  done
done
# The device tool returns at most 8 files from $OUT and drops the rest: past that, everything goes into one tarball.
if [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
  tar czf /tmp/bench_out.tar.gz -C "$(dirname "$OUT")" "$(basename "$OUT")" &&
    find "$OUT" -maxdepth 1 -type f ! -name bench_main.log -delete && mv /tmp/bench_out.tar.gz "$OUT/"
fi
exit 0
