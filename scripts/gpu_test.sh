#!/usr/bin/env bash
# Every GPU test and benchmark, in one device call (the H200 machine has no network, a bare image).
#   here:  scripts/build.sh                       # builds spw_gpu_tests, spw_unit_tests, bench_exl3 (nvcc)
#          pip download exllamav3==1.6.5 --no-deps -d .deps/
#          [optional: spillway quantize ... --out /tmp/qpack3 --dump-wh .exl3dev/wh3 (and 2, 4) for the quantizer comparison,
#           then python3 tools/exl3/extract_pack_tensors.py /tmp/qpack3 .exl3dev/pack3.safetensors (and 2, 4)]
#          bash scripts/gpu_test.sh stage         # stripped binaries + runtime libs → .exl3pack/dev.tar.xz
#   there: bash scripts/gpu_test.sh run           # carry: .exl3pack .deps
# SKIP_CPU=1 leaves out the CPU tests and CPU benchmark (they compete with exllamav3's JIT build for the cores).
# ONLY_OURS=1 runs only our tests and benchmarks (no exllamav3); SKIP_TESTS=1 skips spw_gpu_tests and the profile;
# SKIP_FIXTURES=1 skips regenerating exllamav3's fixtures (they are committed in tests/fixtures/exl3);
# GPU_TEST_FILTER picks GPU tests (a --gtest_filter pattern); SKIP_PROFILE=1 skips Nsight Compute; FULLWIDTH=0 skips
# the full-width tests (scripts/gpu_fullwidth.sh: a generated one-layer model at real V4.1 dimensions, ~3 min).
# The tests find their fixtures under the source path compiled into them: `stage` records it and
# scripts/link_build_path.sh links it to the checkout on the GPU machine (bench_engine.sh and gpu_fullwidth.sh too).
# Runs: our unit tests (CPU incl. AVX-512), every GPU test (spw_gpu_tests: EXL3 kernels, the forward's ops, dense
# linears, attention, the CUDA quantizer, the GPU engine), bench_exl3 (HBM bandwidth, our kernels vs roofline, fused MoE, prefill),
# bench_dense (dense linears vs roofline and cuBLAS), bench_quantize (CUDA quantizer seconds per V4.1 expert tensor),
# bench_exl3_cpu (STREAM-like read vs CPU kernels) and bench_exl3_cpu_threads (thread sweep), exllamav3's JIT build, tools/exl3/make_fixtures.py
# (exllamav3's quantizer), the fixture test on them, bench/exl3/bench_exllamav3.py on the same tensors (int8
# GEMV default and EXL3_INT8_GEMV=0) and tools/quantize/compare_exllamav3.py on the dumped W/H.
# The working tree travels with the call (64 MiB at most), hence stripped, xz-compressed binaries; with wheels or
# other carried paths too, scripts/upload_room.sh moves the large tracked files out of the tree for the call.
set -u
if [ "${1:-}" = stage ]; then
  mkdir -p .exl3dev/lib .exl3pack
  # The CUPTI kernel tracer (tools/profile) and the CUPTI it was built against.
  B=${BUILD_DIR:-build}  # the build folder to stage from (e.g. BUILD_DIR=build-sm90 for a one-arch build that packs smaller)
  [ -f $B/tools/profile/libspw_kernel_trace.so ] && cp $B/tools/profile/libspw_kernel_trace.so .exl3dev/lib/ &&
    cp -L /usr/local/cuda/lib64/libcupti.so.13 .exl3dev/lib/
  for l in libspdlog.so.1.10 libfmt.so.9 libstdc++.so.6 libicuuc.so.72 libicudata.so.72 libpcre2-8.so.0 \
           libcpp-httplib.so.0.11 libssl.so.3 libcrypto.so.3 libz.so.1 libbrotlidec.so.1 libbrotlienc.so.1 libbrotlicommon.so.1 \
           libpng16.so.16 libturbojpeg.so.0 libwebp.so.7 libwebpdemux.so.2 libgif.so.7; do cp -L /usr/lib/x86_64-linux-gnu/$l .exl3dev/lib/; done
  # STAGE_BINS picks the binaries (e.g. STAGE_BINS=bin/spillway for a bench-only call that must leave upload room);
  # binaries of an earlier stage are removed first, so the pack holds exactly these.
  rm -f .exl3dev/spillway .exl3dev/spw_gpu_tests .exl3dev/spw_unit_tests .exl3dev/bench_*
  pwd > .exl3dev/source_dir  # the tests' fixture path (scripts/link_build_path.sh links it on the GPU machine)
  for b in ${STAGE_BINS:-tests/spw_gpu_tests tests/spw_unit_tests bench/exl3/bench_exl3 bench/exl3/bench_exl3_cpu bench/exl3/bench_exl3_cpu_threads \
           bench/dense/bench_dense bench/quantize/bench_quantize bin/spillway}; do
    [ -f $B/$b ] && cp $B/$b .exl3dev/ && strip .exl3dev/$(basename $b)
  done
  # A 192 MiB xz window sees the CUDA code the binaries share: 22.8 → 17.2 MB for the full set (measured).
  tar cf - .exl3dev | xz -T2 --lzma2=preset=6,dict=192MiB > .exl3pack/dev.tar.xz && ls -la .exl3pack
  exit 0
fi
[ -f .exl3pack/dev.tar.xz ] && tar xJf .exl3pack/dev.tar.xz
. scripts/link_build_path.sh
OUT=${OUT:-/tmp/exl3_out}
mkdir -p "$OUT/fixtures"
export LD_LIBRARY_PATH=$PWD/.exl3dev/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
# One arch list for every exllamav3 import: the JIT cache key includes it (a different value rebuilds, ~400 s).
export TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=14
{
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv
  nproc
  python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/site .deps/exllamav3-*.whl && echo "exllamav3 wheel installed"
} 2>&1 | tee "$OUT/main.log"
export PYTHONPATH=/tmp/site
# exllamav3's CUDA extension JIT-builds in the background while our binaries run.
[ -z "${ONLY_OURS:-}" ] && (python3 -c "
import sys, types
stub = types.ModuleType('pydantic'); stub.PydanticUserError = type('E', (Exception,), {}); sys.modules['pydantic'] = stub
import time; t = time.time()
from exllamav3.ext import exllamav3_ext
print('exllamav3 extension ready in %.0f s' % (time.time() - t))" > /tmp/jit.log 2>&1; echo "jit rc $?" >> /tmp/jit.log) &
JIT=$!  # ($! is this shell's last background job; unused when ONLY_OURS)
python3 bench/exl3/make_bench_tensors.py /tmp/bench_tensors >> "$OUT/main.log" 2>&1
[ -z "${SKIP_CPU:-}" ] && .exl3dev/spw_unit_tests --gtest_brief=1 --gtest_filter='Exl3.*:Exl3Cpu*:Exl3MoeCpu*' 2>&1 | tee -a "$OUT/main.log"   # CPU kernels, AVX-512 here
# The full-width tests need a generated model: scripts/gpu_fullwidth.sh runs them (FULLWIDTH=0 skips, ~3 min).
[ -z "${SKIP_TESTS:-}" ] && timeout 400 .exl3dev/spw_gpu_tests --gtest_brief=1 --gtest_filter="${GPU_TEST_FILTER:-*-EngineFullWidth.*}" 2>&1 | tee "$OUT/gpu_tests.log" | tail -40 | tee -a "$OUT/main.log"
if [ -z "${SKIP_TESTS:-}" ] && [ "${FULLWIDTH:-1}" != 0 ]; then
  FW_OUT=/tmp/fw_out bash scripts/gpu_fullwidth.sh 2>&1 | tee -a "$OUT/main.log"
  grep -h 'fullwidth exact\]\|\[steps\]\|FAILED\|PASSED' /tmp/fw_out/fullwidth_*.log >> "$OUT/main.log"
fi
.exl3dev/bench_exl3 /tmp/bench_tensors 200 gpu 2>&1 | tee "$OUT/bench_spillway.md"
[ -x .exl3dev/bench_dense ] && timeout 200 .exl3dev/bench_dense 2>&1 | tee "$OUT/bench_dense.md"
[ -x .exl3dev/bench_quantize ] && timeout 200 .exl3dev/bench_quantize 2>&1 | tee "$OUT/bench_quantize.md"
[ -x .exl3dev/bench_quantize ] && timeout 100 .exl3dev/bench_quantize --single-candidate 2>&1 | tee -a "$OUT/bench_quantize.md"
# The CPU benchmarks run with the cores free: after exllamav3's JIT build (its compiler jobs would share them).
cpu_benches() {
  [ -n "${SKIP_CPU:-}" ] && return
  [ -x .exl3dev/bench_exl3_cpu ] && timeout 150 .exl3dev/bench_exl3_cpu "$(nproc)" 2>&1 | tee -a "$OUT/bench_spillway.md"
  [ -x .exl3dev/bench_exl3_cpu_threads ] && timeout 120 .exl3dev/bench_exl3_cpu_threads 2>&1 | tee "$OUT/bench_cpu_threads.md"
}
# Nsight Compute + SASS mix of our kernels while the extension still builds (one file back: profile.txt).
[ -z "${SKIP_TESTS:-}${SKIP_PROFILE:-}" ] && timeout 150 bash scripts/gpu_profile.sh /tmp/exl3_prof > /tmp/exl3_prof.summary 2>&1
[ -z "${SKIP_TESTS:-}${SKIP_PROFILE:-}" ] && cat /tmp/exl3_prof.summary /tmp/exl3_prof/*.txt > "$OUT/profile.txt" 2>/dev/null
[ -n "${ONLY_OURS:-}" ] && { cpu_benches; exit 0; }
wait $JIT
tail -5 /tmp/jit.log | tee -a "$OUT/main.log"
cpu_benches
if [ -z "${SKIP_FIXTURES:-}" ]; then
  python3 tools/exl3/make_fixtures.py "$OUT/fixtures" 2>&1 | tee -a "$OUT/main.log"
  SPW_EXL3_FIXTURE_DIR="$OUT/fixtures" .exl3dev/spw_unit_tests --gtest_filter='Exl3Fixtures*' 2>&1 | tee -a "$OUT/main.log"
fi
python3 bench/exl3/bench_exllamav3.py /tmp/bench_tensors 200 2>&1 | tee "$OUT/bench_exllamav3.md"
EXL3_INT8_GEMV=0 python3 bench/exl3/bench_exllamav3.py /tmp/bench_tensors 200 2>&1 | tee -a "$OUT/bench_exllamav3.md"
WH=""
for K in 2 3 4; do [ -d .exl3dev/wh$K ] && WH="$WH $K=.exl3dev/wh$K"; done
[ -n "$WH" ] && python3 tools/quantize/compare_exllamav3.py --json "$OUT/quantize_compare.json" $WH 2>&1 | tee "$OUT/quantize_compare.md"
# exllamav3 reconstructs the tensors of our packs (made here with tools/exl3/extract_pack_tensors.py into
# .exl3dev/pack$K.safetensors from the same `spillway quantize` runs as the W/H dumps).
for K in 2 3 4; do
  [ -f .exl3dev/pack$K.safetensors ] && python3 tools/exl3/check_pack_exllamav3.py .exl3dev/pack$K.safetensors .exl3dev/wh$K 2>&1 | tee -a "$OUT/pack_check.md"
done
