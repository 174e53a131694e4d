#!/usr/bin/env bash
# `spillway serve` on the GPU runner (engine/gpu_runner.h), in one device call:
#  1. the Python server suite (tests/python/server, official openai/anthropic SDKs) with every server on
#     `--device cuda` (SPILLWAY_DEVICE=cuda), once per model of SUITE_MODELS (default "tiny"): tiny (the V4.1
#     fixture), demo (the trained demo model), synth (a synthetic full-width V4.1 model of SUITE_SYNTH_LAYERS
#     layers, default 2, with SUITE_SYNTH_EXPERTS experts, default mxfp4 as the release ships them), each
#     through SPILLWAY_TEST_MODEL with the suite's own tokenizer (tests/python/server/spw_server_harness.py);
#     the client-library tests are left out (litellm and langchain do not travel: see below); a run past
#     SUITE_TIMEOUT is interrupted (SIGINT), so pytest still prints its summary of failures;
#  2. tools/serve/check_gpu_runner.py on the tiny fixture: GPU vs CPU greedy continuations, and concurrent vs
#     alone; with CHECK_SYNTH=1 also on step 3's synthetic model (--gpu-only: the prefix cache and concurrent vs
#     alone, the EXL3 kernels' batch invariance through the server);
#  3. load through HTTP on a synthetic full-width V4.1 model (tools/synth, LAYERS layers, EXL3 K = 3 experts):
#     bench/load.py at 1, 8, 32 and 64 streaming clients, then `spillway bench` at the same batch sizes and
#     prompt length in the same call (the server's aggregate tokens/s against the engine's own); on the same
#     model bench/shared_prefix.py (an 8K-token prefix shared by 32 requests against cold prompts) and
#     tools/serve/check_overload.py (256 requests at once against a KV budget of 8 and a queue of 32).
#   here:  BUILD_DIR=build-sm90 STAGE_BINS=bin/spillway bash scripts/gpu_test.sh stage    # .exl3pack/dev.tar.xz
#          python3 -m pip download ... -d .whl  (openai, anthropic, jsonschema and their needs missing on the
#          GPU image, for its Python 3.12: the list is WHEELS below)
#          bash scripts/upload_room.sh out (the upload is 64 MiB at most; `in` right after the call; DEMO below)
#   there: bash scripts/gpu_serve.sh          # carry: .exl3pack .whl ; results in $OUT
# Switches: SKIP_SUITE=1, SUITE_MODELS, SKIP_CHECK=1, SKIP_LOAD=1, SPEC=1 and SPEC_SYNTH=1 (below; SPEC_PROMPTS), LOAD_RUNS (which runs of step 3, default
# "load prefix overload bench"; also "bench-invariant"), BENCH_TRACE=1 (below), DEMO=1 (below), LAYERS (default 4), LOAD_PROMPT (default 64 tokens),
# LOAD_TOKENS (default 256 generated per request), LOAD_BATCH_INVARIANT (the load servers' --batch-invariant values,
# one load run each; default "true"),
# PYTEST_K (a pytest -k expression), PYTEST_ARGS (extra pytest arguments, no spaces within one), SUITE_TIMEOUT (seconds per suite run, default 240).
# WHEELS (pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl): openai==3.57.0
#   anthropic==2.17.0 pydantic==2.14.4 pydantic_core==2.50.5 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1
#   annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 jsonschema==4.26.0
#   referencing==0.37.0 httpx==0.29.0 anyio==4.16.0 docstring_parser==0.18.0 rpds-py==2026.9.1
#   jsonschema-specifications==2025.9.1 h11==0.16.0 httpcore==1.0.9 httpx2==2.17.0 httpcore2==2.17.0
#   truststore==0.10.5 opentelemetry-api==1.45.3
set -u
cd "$(dirname "$0")/.."
[ -f .exl3pack/dev.tar.xz ] && [ ! -x .exl3dev/spillway ] && tar xJf .exl3pack/dev.tar.xz
OUT=${OUT:-/tmp/serve_out}
LOGS=/tmp/serve_logs  # server logs and /metrics, packed into $OUT/logs.tar.gz at the end ($OUT takes 8 files)
mkdir -p "$OUT" $LOGS
# Only spillway sees the staged libraries (coreutils there die loading the dev box's libpcre2).
cat > /tmp/spillway <<EOF
#!/bin/sh
LD_LIBRARY_PATH=$PWD/.exl3dev/lib:/usr/local/cuda/lib64 exec $PWD/.exl3dev/spillway "\$@"
EOF
chmod +x /tmp/spillway
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
LAYERS=${LAYERS:-4}
SYNTH=/tmp/synth_v41_serve
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  nproc; free -g | head -2
  /tmp/spillway --version
} 2>&1 | tee "$OUT/serve_main.log"
# GPU_TEST_FILTER also runs those GPU tests (.exl3dev/spw_gpu_tests, staged), beside the suite: $OUT/gpu_tests.log.
if [ -n "${GPU_TEST_FILTER:-}" ] && [ -x .exl3dev/spw_gpu_tests ]; then
  . scripts/link_build_path.sh
  (timeout 240 env LD_LIBRARY_PATH=$PWD/.exl3dev/lib:/usr/local/cuda/lib64 .exl3dev/spw_gpu_tests --gtest_brief=1 \
    --gtest_filter="$GPU_TEST_FILTER" > "$OUT/gpu_tests.log" 2>&1; echo "gpu tests rc $?" >> "$OUT/gpu_tests.log") &
fi
SUITE_MODELS=${SUITE_MODELS:-tiny}
[ -n "${SKIP_SUITE:-}" ] && SUITE_MODELS=""
SYNTH_PID="" SUITE_SYNTH_PID=""
if { [ -z "${SKIP_LOAD:-}" ] || [ -n "${CHECK_SYNTH:-}" ] || [ -n "${SPEC_SYNTH:-}" ]; } && [ ! -f $SYNTH/config.json ]; then
  python3 tools/synth/make_synthetic_model.py $SYNTH --arch v41 --experts exl3 --bits 3 \
    --layers "$LAYERS" --tokenizer none > /tmp/synth.log 2>&1 &
  SYNTH_PID=$!
fi
SUITE_SYNTH=/tmp/synth_v41_suite
if [[ " $SUITE_MODELS " == *" synth "* ]]; then
  python3 tools/synth/make_synthetic_model.py $SUITE_SYNTH --arch v41 --experts ${SUITE_SYNTH_EXPERTS:-mxfp4} --bits 3 \
    --layers ${SUITE_SYNTH_LAYERS:-2} --tokenizer none > /tmp/synth_suite.log 2>&1 &
  SUITE_SYNTH_PID=$!
fi
# The demo weights travel xz-compressed (here: mkdir -p .demopack && xz -T2 -c models/demo/model.safetensors >
# .demopack/model.safetensors.xz, then move the original out of the tree; carry .demopack). They unpack into
# .demodir (ignored by git, so it stays on a warm machine): the weights, the binary and the suite's wheels do not
# fit one 64 MiB upload, so a call with .demopack (DEMO=1, no wheels) can be followed within the machine's idle
# time by one with .whl and SUITE_MODELS=demo, which finds .demodir there.
DEMO_DIR=$PWD/models/demo
if [ -f .demopack/model.safetensors.xz ] && [ ! -f .demodir/model.safetensors ]; then
  mkdir -p .demodir
  for f in models/demo/*; do [ "$(basename "$f")" != model.safetensors ] && cp -f "$f" .demodir/; done
  xz -dc .demopack/model.safetensors.xz > .demodir/model.safetensors
fi
[ -f .demodir/model.safetensors ] && DEMO_DIR=$PWD/.demodir

for M in $SUITE_MODELS; do
  case $M in
    tiny) DIR="" ;;
    demo) DIR=$DEMO_DIR ;;
    synth) DIR=$SUITE_SYNTH; wait $SUITE_SYNTH_PID; cat /tmp/synth_suite.log >> "$OUT/serve_main.log" ;;
    *) echo "SUITE_MODELS: unknown model $M (tiny, demo or synth)"; continue ;;
  esac
  SPILLWAY_BIN=/tmp/spillway SPILLWAY_DEVICE=cuda SPILLWAY_TEST_MODEL=$DIR timeout -s INT -k 30 ${SUITE_TIMEOUT:-240} \
    python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/python/server \
    --ignore=tests/python/server/test_client_libraries.py ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-} \
    > "$OUT/pytest_cuda_$M.log" 2>&1
  echo "pytest on the GPU runner ($M): rc $? — $(tail -1 "$OUT/pytest_cuda_$M.log")" | tee -a "$OUT/serve_main.log"
done
if [ -z "${SKIP_CHECK:-}" ]; then
  # Random weights: GPU vs CPU agreement is reported, not judged (see --agreement); the rest is judged.
  timeout 120 python3 tools/serve/check_gpu_runner.py --bin /tmp/spillway --model tests/golden/fixtures/v41/model \
    --agreement report > "$OUT/check_tiny_v41.md" 2>&1
  grep -h "prefix cache\|no device copy" "$OUT/check_tiny_v41.md" | head -5 >> "$OUT/serve_main.log"
  echo "check_gpu_runner (tiny V4.1): rc $? — $(tail -1 "$OUT/check_tiny_v41.md")" | tee -a "$OUT/serve_main.log"
fi
if [ -n "${CHECK_SYNTH:-}" ]; then
  wait $SYNTH_PID
  timeout 240 python3 tools/serve/check_gpu_runner.py --bin /tmp/spillway --model $SYNTH --gpu-only --prompts 8 \
    > "$OUT/check_synth.md" 2>&1
  echo "check_gpu_runner (synthetic, EXL3 experts, $LAYERS layers): rc $? — $(tail -1 "$OUT/check_synth.md")" |
    tee -a "$OUT/serve_main.log"
fi
# DEMO=1: the trained demo model, GPU against CPU with the agreement judged (--agreement verdict).
if [ -n "${DEMO:-}" ]; then
  timeout 300 python3 tools/serve/check_gpu_runner.py --bin /tmp/spillway --model "$DEMO_DIR" --prompts 20 --tokens 32 \
    --prompts-file tools/demo_model/heldout_prompts.json > "$OUT/check_demo.md" 2>&1
  echo "check_gpu_runner (demo model): rc $? — $(tail -1 "$OUT/check_demo.md")" | tee -a "$OUT/serve_main.log"
fi
# SPEC=1: speculative decoding (prompt lookup) through the GPU runner on the demo model against the same
# server without it (tools/serve/speculative_bench.py; the demo weights as for DEMO above, the wheels for the
# client): identical greedy outputs with --no-stale-index-k, tokens/s and acceptance per workload.
if [ -n "${SPEC:-}" ]; then
  timeout 420 python3 tools/serve/speculative_bench.py --bin /tmp/spillway --model "$DEMO_DIR" --device cuda \
    --prompts ${SPEC_PROMPTS:-20} > "$OUT/speculative_cuda.md" 2>&1
  echo "speculative_bench (demo model, GPU runner): rc $? — $(tail -1 "$OUT/speculative_cuda.md")" |
    tee -a "$OUT/serve_main.log"
fi
wait  # the GPU tests and the synthetic model
# SPEC_SYNTH=1: speculation's cost where drafts mostly fail (the synthetic model's random weights), prompt lookup
# on vs off at 1 and 16 requests at a time (SPEC_SYNTH_C: which); outputs must stay identical (--no-stale-index-k).
if [ -n "${SPEC_SYNTH:-}" ]; then
  for C in ${SPEC_SYNTH_C:-1 16}; do
    timeout 300 python3 tools/serve/speculative_bench.py --bin /tmp/spillway --model $SYNTH --device cuda \
      --workloads random --quirk off --prompts 16 --tokens 64 --concurrency $C \
      --server-args "--max-num-seqs 16 --max-model-len 512" > "$OUT/speculative_synth_c$C.md" 2>&1
    echo "speculative_bench (synthetic, $C at a time): rc $? — $(grep '^| off | random' "$OUT/speculative_synth_c$C.md")" |
      tee -a "$OUT/serve_main.log"
  done
fi
if [ -z "${SKIP_LOAD:-}" ]; then
  cat /tmp/synth.log >> "$OUT/serve_main.log"
  P=${LOAD_PROMPT:-64} N=${LOAD_TOKENS:-256}
  LOAD_RUNS=" ${LOAD_RUNS:-load prefix overload bench} "
  [[ $LOAD_RUNS == *" load "* ]] && for MODE in ${LOAD_BATCH_INVARIANT:-true}; do
    /tmp/spillway serve --model $SYNTH --device cuda --port 18300 --max-num-seqs 64 --max-batch 64 \
      --batch-invariant $MODE --max-model-len $((P + N + 64)) --max-tokens-limit $N \
      > $LOGS/serve_synth_$MODE.log 2>&1 &
    SERVER=$!
    for _ in $(seq 300); do curl -sf http://127.0.0.1:18300/health > /dev/null && break; sleep 1; done
    echo "load: --batch-invariant $MODE" | tee -a "$OUT/load_synth.md" >> "$OUT/serve_main.log"
    timeout 120 python3 bench/load.py --base-url http://127.0.0.1:18300/v1 --concurrency 1,8,32,64 --requests-per-stream 1 \
      --prompt-tokens "$P" --max-tokens "$N" --vocab 129280 2>&1 | tee -a "$OUT/load_synth.md" | grep -E "^\| (1|8|32|64) \|" >> "$OUT/serve_main.log"
    curl -s http://127.0.0.1:18300/metrics > $LOGS/metrics_synth_$MODE.txt
    kill -TERM $SERVER; wait $SERVER; echo "server rc $?" >> "$OUT/serve_main.log"
  done
  # The engine's own rate on the same model, right after the load runs it is compared with ("bench"), and under
  # batch invariance as the server's default runs ("bench-invariant"). BENCH_TRACE=1: under the CUPTI kernel
  # tracer (tools/profile/kernel_trace.cpp), one trace per run in $LOGS.
  for B in bench bench-invariant; do
    [[ $LOAD_RUNS == *" $B "* ]] || continue
    flag=""; [ $B = bench-invariant ] && flag=--batch-invariant
    trace=()
    [ -n "${BENCH_TRACE:-}" ] && trace=(env CUDA_INJECTION64_PATH=$PWD/.exl3dev/lib/libspw_kernel_trace.so SPW_TRACE_OUT=$LOGS/trace_$B.md)
    echo "$B:" | tee -a "$OUT/load_synth.md" >> "$OUT/serve_main.log"
    timeout 100 "${trace[@]}" /tmp/spillway bench --model $SYNTH $flag --batches 1 8 32 64 --batch-prompt "$P" --batch-steps 16 --decode-steps 16 --prefill 4096 --prefill-runs 1 \
      2>&1 | tee -a "$OUT/load_synth.md" | grep -E "^\| (1|8|32|64) \||HBM|tensor-core|Device" | tee -a "$OUT/serve_main.log"
  done
  if [[ $LOAD_RUNS == *" prefix "* ]]; then
  # A shared 8K-token prefix across 32 requests against cold prompts (bench/shared_prefix.py).
  /tmp/spillway serve --model $SYNTH --device cuda --port 18301 --max-num-seqs 64 --max-model-len 8448 \
    --max-tokens-limit 16 > $LOGS/serve_prefix.log 2>&1 &
  SERVER=$!
  for _ in $(seq 300); do curl -sf http://127.0.0.1:18301/health > /dev/null && break; sleep 1; done
  timeout 150 python3 bench/shared_prefix.py --base-url http://127.0.0.1:18301/v1 --prefix-tokens 8192 --requests 32 \
    --vocab 129280 > "$OUT/shared_prefix_synth.md" 2>&1
  echo "shared prefix: rc $? — $(grep 'cold / warm' "$OUT/shared_prefix_synth.md")" | tee -a "$OUT/serve_main.log"
  curl -s http://127.0.0.1:18301/metrics > $LOGS/metrics_prefix.txt
  kill -TERM $SERVER; wait $SERVER
  fi
  if [[ $LOAD_RUNS == *" overload "* ]]; then
  # KV exhaustion: a KV budget of 8 requests and a queue of 32 under three bursts of 256 at once (tools/serve/check_overload.py).
  /tmp/spillway serve --model $SYNTH --device cuda --port 18302 --max-num-seqs 64 --max-model-len 1024 \
    --kv-tokens $((8 * (512 + 64))) --max-queue 32 --prefix-cache-mb 0 > $LOGS/serve_overload.log 2>&1 &
  SERVER=$!
  for _ in $(seq 300); do curl -sf http://127.0.0.1:18302/health > /dev/null && break; sleep 1; done
  timeout 200 python3 tools/serve/check_overload.py --base-url http://127.0.0.1:18302/v1 --requests 256 \
    --prompt-tokens 512 --max-tokens 64 --vocab 129280 > "$OUT/overload_synth.md" 2>&1
  echo "overload: rc $? — $(tail -1 "$OUT/overload_synth.md")" | tee -a "$OUT/serve_main.log"
  kill -TERM $SERVER; wait $SERVER
  fi
fi
tar czf "$OUT/logs.tar.gz" -C $LOGS . /tmp/synth.log 2>/dev/null
exit 0
