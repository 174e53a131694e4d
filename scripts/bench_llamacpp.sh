#!/usr/bin/env bash
# llama.cpp as issue 7's peer: its DeepSeek-V4 path on the same synthetic V4-Flash model as `spillway bench`,
# on the H200 machine (no network there). See tools/peers/llamacpp/README.md for what llama.cpp implements.
#   here:  bash tools/peers/llamacpp/fetch_sdist.sh && bash tools/peers/llamacpp/stage.sh     # -> .llpack/
#   there: bash scripts/bench_llamacpp.sh [all|prepare|build|convert|run] [MODEL_DIR]                       # carry: .llpack
# MODEL_DIR: the synthetic V4 checkpoint (released HF layout) that scripts/bench_engine.sh generates; default
# $SYNTH_V4 or /tmp/synth_v4_mxfp4 (bench_engine.sh's V4_DIR). SYNTH_GEN=1: if MODEL_DIR has no config.json, generate it first with
# tools/synth/make_synthetic_model.py --arch v4 --experts mxfp4 --layers $SYNTH_LAYERS (default 4) --seed $SYNTH_SEED (0).
# Output ($OUT may hold only 8 files): $OUT/llamacpp.log (everything printed, incl. the result tables and the
# seconds per phase) and $OUT/llamacpp_logs.tar.xz (the full logs: build, convert, simple, bench stderr).
# On a warm machine a second call reuses $LLAMA_WORK (default /tmp/llamacpp): the build is a ninja no-op and
# the GGUF is not converted again unless FORCE_CONVERT=1.
# Phases (so the CPU-only part can overlap the GPU work of `spillway bench` in the same call):
#   prepare  unpack; use the prebuilt binaries of .llpack/llama.tar.xz if they run here, else build llama.cpp
#            from the trimmed source (ninja -j$LLAMA_JOBS, default 12, in the background); wait for MODEL_DIR
#            (up to $WAIT_MODEL s, default 900); convert it to GGUF with llama.cpp's own convert_hf_to_gguf.py
#            (DeepSeek-V4's tokenizer from .llpack in place of the model dir's, see README "Tokenizer").
#   run      on the GPU: llama-simple sanity run (GGML_SCHED_DEBUG=1: which backend runs each graph split),
#            llama-bench pp4096 + tg128 at depth 0 and 4096 (-ngl 99, flash attention on, micro-batch 512 and
#            2048, 3 reps), pp40960 (1 rep, unless SKIP_40K=1), llama-batched-bench aggregate decode at 1, 4,
#            16, 64 sequences (each a 128-token prompt, then 128 steps).
#   all      prepare then run.
#   build    unpack and build (or check the prebuilt binaries) only: can run in the background while
#            scripts/bench_engine.sh generates and benchmarks (it deletes and regenerates MODEL_DIR, so convert
#            only after it has finished).
#   convert  unpack the source and convert only (no build, no GPU: how the conversion was tested here).
# Sizes: LLAMA_PP (4096), LLAMA_PP_LONG (40960), LLAMA_TG (128), LLAMA_DEPTHS (0,4096), LLAMA_NPL (1,4,16,64),
# LLAMA_REPS (3). LLAMA_PACK: where the .llpack tarballs are (default ./.llpack).
# Experts on the host (the spill's peer, scripts/gpu_spill_peer.sh): LLAMA_NCMOE="0,2" runs llama-bench once per
# value of --n-cpu-moe (the MoE weights of the first N layers stay in host memory, computed by the CPU; llama.cpp
# splits experts per layer, not per expert) and llama-batched-bench once per value.
# Random token ids as input (llama-bench and llama-batched-bench draw them); the weights are random too.
# Disk: the V4 model and its GGUF need ~35 GB of the machine's 64; delete other synthetic models in /tmp first (a
# full disk made the conversion fail on 2026-12-03). Measured there: conversion 47 s, the whole run phase < 15 s with
# LLAMA_REPS=1 LLAMA_DEPTHS=0 SKIP_40K=1.
set -u
PHASE=${1:-all}
MODEL=${2:-${SYNTH_V4:-/tmp/synth_v4_mxfp4}}
OUT=${OUT:-/tmp/llamacpp_out}
W=${LLAMA_WORK:-/tmp/llamacpp}
JOBS=${LLAMA_JOBS:-12}
PACK=${LLAMA_PACK:-$PWD/.llpack}
NCMOE=${LLAMA_NCMOE:-}
PP=${LLAMA_PP:-4096} PP_LONG=${LLAMA_PP_LONG:-40960} TG=${LLAMA_TG:-128} DEPTHS=${LLAMA_DEPTHS:-0,4096}
NPL=${LLAMA_NPL:-1,4,16,64} REPS=${LLAMA_REPS:-3}
GGUF=$W/synth_v4.gguf
L=$W/logs
mkdir -p "$OUT" "$W" "$L"
LOG=$OUT/llamacpp.log
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1

now() { date +%s.%N; }
# timed NAME CMD...: run CMD, print and record its wall time and exit status.
timed() {
  local name=$1; shift
  local t0; t0=$(now)
  "$@"
  local rc=$?
  local dt; dt=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
  printf '== %-28s %8.1f s  rc=%d\n' "$name" "$dt" "$rc" | tee -a "$L/timings.txt"
  return $rc
}

bin_env() {
  BIN=$(cat "$W/bin_dir" 2>/dev/null || true)
  export LD_LIBRARY_PATH=$W/llbin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  # cuBLAS also ships in the image's Python package nvidia-cublas (used if /usr/local/cuda lacks it).
  local cub
  cub=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
  [ -n "$cub" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$cub
}

build_from_source() {
  export PATH=/usr/local/cuda/bin:$PATH
  bash "$PWD/tools/peers/llamacpp/build_llamacpp.sh" "$W/llama.cpp" "$W/build" "$JOBS" > "$L/build.log" 2>&1
}

wait_model() {
  if [ -n "${SYNTH_GEN:-}" ] && [ ! -f "$MODEL/config.json" ]; then
    timed synth_v4_generate python3 tools/synth/make_synthetic_model.py "$MODEL" --arch v4 --experts mxfp4 \
      --layers "${SYNTH_LAYERS:-4}" --seed "${SYNTH_SEED:-0}" --tokenizer none
  fi
  local waited=0
  while [ ! -f "$MODEL/config.json" ] || [ ! -f "$MODEL/model.safetensors.index.json" ]; do
    [ "$waited" -ge "${WAIT_MODEL:-900}" ] && { echo "no model at $MODEL after ${waited}s"; return 1; }
    sleep 5; waited=$((waited + 5))
  done
  # every shard the index names must be there (the generator writes the index last, but be sure)
  python3 - "$MODEL" <<'EOF'
import json, os, sys, time
d = sys.argv[1]
files = set(json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"].values())
for _ in range(120):
    missing = [f for f in files if not os.path.exists(os.path.join(d, f))]
    if not missing:
        break
    time.sleep(5)
print("model:", d, len(files), "shards,", "missing: %s" % missing if missing else "all present")
EOF
}

convert() {
  if [ -z "${FORCE_CONVERT:-}" ] && [ -f "$GGUF" ] && [ "$(cat "$W/gguf_from" 2>/dev/null)" = "$MODEL" ] \
     && [ "$GGUF" -nt "$MODEL/config.json" ]; then
    echo "reusing $GGUF (converted from $MODEL earlier on this machine)"; ls -la "$GGUF"; return 0
  fi
  rm -f "$GGUF" "$W/gguf_from"
  # The converter reads the model dir's tokenizer to identify the BPE pre-tokenizer by hash; give it
  # DeepSeek-V4's own (README "Tokenizer"). Weights and config.json are the model dir's, linked.
  rm -rf "$W/conv_in" && mkdir -p "$W/conv_in"
  for f in "$MODEL"/*.safetensors "$MODEL"/model.safetensors.index.json "$MODEL"/config.json; do
    ln -s "$f" "$W/conv_in/"
  done
  cp "$W/llama.cpp/dstok/tokenizer.json" "$W/llama.cpp/dstok/tokenizer_config.json" "$W/conv_in/"
  df -h "$W" | tail -1
  PYTHONPATH=$W/llama.cpp/gguf-py python3 "$W/llama.cpp/convert_hf_to_gguf.py" "$W/conv_in" --outfile "$GGUF" \
    > "$L/convert.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] && echo "$MODEL" > "$W/gguf_from"
  tail -3 "$L/convert.log"
  grep -E "tokenizer|pre-tokenizer|WARNING|Error" "$L/convert.log" | head -10
  ls -la "$GGUF" 2>/dev/null
  df -h "$W" | tail -1
  return $rc
}

# Unpack; use the prebuilt binaries if they run here, else start the build in the background (BUILD_PID).
start_build() {
  BUILD_PID=""
  timed unpack_source tar -C "$W" -xJf "$PACK/llama-src.tar.xz" || { echo "no $PACK/llama-src.tar.xz"; return 1; }
  if [ -f "$PACK/llama.tar.xz" ]; then
    tar -C "$W" -xJf "$PACK/llama.tar.xz"
    echo "$W/llbin" > "$W/bin_dir"
    bin_env
    if "$BIN/llama-bench" --list-devices > "$L/prebuilt_check.log" 2>&1 && grep -q CUDA0 "$L/prebuilt_check.log"; then
      echo "prebuilt binaries run here:"; cat "$L/prebuilt_check.log"
    else
      echo "prebuilt binaries do not run here (building from source):"; tail -5 "$L/prebuilt_check.log"
      rm -f "$W/bin_dir"
    fi
  fi
  if [ ! -f "$W/bin_dir" ]; then
    echo "building llama.cpp from source, -j$JOBS, in the background (log: build.log)"
    (timed build_llamacpp build_from_source && echo "$W/build/bin" > "$W/bin_dir") &
    BUILD_PID=$!
  fi
  return 0
}

finish_build() {
  if [ -n "$BUILD_PID" ]; then
    wait "$BUILD_PID"
    tail -3 "$L/build.log"
  fi
  [ -f "$W/bin_dir" ] || { echo "llama.cpp did not build: see build.log"; tail -30 "$L/build.log"; return 1; }
  return 0
}

prepare() {
  echo "## prepare $(date -u)  model=$MODEL work=$W jobs=$JOBS"
  nproc; free -g | head -2
  start_build || return 1
  timed wait_model wait_model || return 1
  timed convert_hf_to_gguf convert || { echo "conversion failed: see convert.log"; tail -30 "$L/convert.log"; }
  finish_build
}

run() {
  echo "## run $(date -u)"
  bin_env
  [ -n "$BIN" ] && [ -x "$BIN/llama-bench" ] || { echo "no llama.cpp binaries (prepare failed?)"; return 1; }
  [ -f "$GGUF" ] || { echo "no GGUF at $GGUF (conversion failed?)"; return 1; }
  nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.sm --format=csv
  # 1. sanity: a short generation; graph splits and the backend of each split (CPU fallbacks show here).
  GGML_SCHED_DEBUG=1 timed llama_simple timeout 180 "$BIN/llama-simple" -m "$GGUF" -ngl 99 -n 16 "The capital of France is" \
    > "$L/simple.log" 2>&1
  grep -aE "splits =|model buffer size|KV buffer size|compute buffer size|error|failed|abort" "$L/simple.log" \
    | sort | uniq -c | sort -rn | head -30
  echo "graph splits by backend (all graphs llama-simple built; a CPU split = work not on the GPU):"
  grep -ao "## SPLIT #[0-9]*: [A-Za-z0-9_]*" "$L/simple.log" | awk '{print $4}' | sort | uniq -c
  grep -a "## SPLIT #[0-9]*: CPU" "$L/simple.log" | sort | uniq -c | sort -rn | cut -c1-300 | head -8
  grep -av "^\[\|## SPLIT\|^$" "$L/simple.log" | tail -4
  # 2. prefill 4096 and decode 128 at batch 1, at context depth 0 and 4096, micro-batch 512 (default) and 2048.
  local ncmoe_flag=""
  [ -n "$NCMOE" ] && ncmoe_flag="-ncmoe $NCMOE"
  timed llama_bench_pp${PP}_tg${TG} timeout 300 "$BIN/llama-bench" -m "$GGUF" -ngl 99 -fa 1 -p "$PP" -n "$TG" -d "$DEPTHS" \
    -b 2048 -ub 512,2048 -r "$REPS" $ncmoe_flag \
    -o md -oe json > "$L/llama_bench.md" 2> "$L/llama_bench.err"
  cat "$L/llama_bench.md"; grep -iE "error|abort|fail|out of memory" "$L/llama_bench.err" | head -5
  # 3. prefill 40960 (one rep).
  if [ -z "${SKIP_40K:-}" ]; then
    timed llama_bench_pp${PP_LONG} timeout 300 "$BIN/llama-bench" -m "$GGUF" -ngl 99 -fa 1 -p "$PP_LONG" -n 0 -b 2048 -ub 512,2048 -r 1 \
      -o md -oe json > "$L/llama_bench_40k.md" 2> "$L/llama_bench_40k.err"
    cat "$L/llama_bench_40k.md"; grep -iE "error|abort|fail|out of memory" "$L/llama_bench_40k.err" | head -5
  fi
  # 4. aggregate decode: 1, 4, 16, 64 sequences, each a 128-token prompt then 128 decode steps.
  local maxpl; maxpl=$(echo "$NPL" | tr ',' '\n' | sort -n | tail -1)
  for n in $(echo "${NCMOE:-0}" | tr ',' ' '); do
    echo "llama-batched-bench --n-cpu-moe $n"
    timed llama_batched_bench_ncmoe$n timeout 300 "$BIN/llama-batched-bench" -m "$GGUF" -ngl 99 -fa on \
      -c $((maxpl * (128 + TG) + 1024)) -b 2048 -ub 512 --n-cpu-moe "$n" \
      -npp 128 -ntg "$TG" -npl "$NPL" > "$L/batched_bench_ncmoe$n.md" 2> "$L/batched_bench_ncmoe$n.err"
    # the table (S_TG t/s = aggregate decode tokens/s) is printed with the log; keep its lines
    grep -ahE "^\||^main: n_kv_max|splits =|error|abort|fail|out of memory" "$L/batched_bench_ncmoe$n.md" \
      "$L/batched_bench_ncmoe$n.err" | head -40
  done
  return 0
}

case "$PHASE" in
  prepare) prepare ;;
  run) run ;;
  all) prepare && run ;;
  build) echo "## build $(date -u) jobs=$JOBS"; start_build && finish_build ;;
  convert) timed unpack_source tar -C "$W" -xJf "$PACK/llama-src.tar.xz" && timed wait_model wait_model && timed convert_hf_to_gguf convert ;;
  *) echo "usage: $0 [all|prepare|build|convert|run] [MODEL_DIR]"; exit 2 ;;
esac
rc=$?
echo "## done $(date -u) rc=$rc"; cat "$L/timings.txt" 2>/dev/null
# the SCHED_DEBUG log repeats per graph: keep its head; cap the others
for f in "$L"/*.log "$L"/*.err; do [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 4000000 ] && { head -c 2000000 "$f" > "$f.cut"; mv "$f.cut" "$f"; }; done
tar -C "$W" -cJf "$OUT/llamacpp_logs.tar.xz" logs
exit $rc
