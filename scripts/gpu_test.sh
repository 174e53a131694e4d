#!/usr/bin/env bash
# Every GPU test and benchmark, in one device call (the H200 machine has no network, a bare image).
#   here:  scripts/build.sh                       # builds spw_gpu_tests, spw_unit_tests, bench_exl3 (nvcc)
#          bash scripts/gpu_test.sh stage         # binaries + runtime libs into .exl3dev/
#          pip download exllamav3==1.6.5 --no-deps -d .deps/
#   there: bash scripts/gpu_test.sh run           # carry: .exl3dev .deps
# Runs: our unit tests (CPU incl. AVX-512, CUDA), bench_exl3 (HBM bandwidth, our kernel vs roofline, CPU kernel),
# exllamav3's JIT build, tools/exl3/make_fixtures.py (exllamav3's quantizer), the fixture test on them, and
# bench/exl3/bench_exllamav3.py on the same tensors (int8 GEMV default and EXL3_INT8_GEMV=0).
set -u
if [ "${1:-}" = stage ]; then
  rm -rf .exl3dev && mkdir -p .exl3dev/lib
  cp build/tests/spw_gpu_tests build/tests/spw_unit_tests build/bench/exl3/bench_exl3 .exl3dev/
  for l in libspdlog.so.1.10 libfmt.so.9 libstdc++.so.6; do cp -L /usr/lib/x86_64-linux-gnu/$l .exl3dev/lib/; done
  exit 0
fi
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
(python3 -c "
import sys, types
stub = types.ModuleType('pydantic'); stub.PydanticUserError = type('E', (Exception,), {}); sys.modules['pydantic'] = stub
import time; t = time.time()
from exllamav3.ext import exllamav3_ext
print('exllamav3 extension ready in %.0f s' % (time.time() - t))" > /tmp/jit.log 2>&1; echo "jit rc $?" >> /tmp/jit.log) &
JIT=$!
python3 bench/exl3/make_bench_tensors.py /tmp/bench_tensors >> "$OUT/main.log" 2>&1
.exl3dev/spw_unit_tests --gtest_brief=1 --gtest_filter='Exl3*' 2>&1 | tee -a "$OUT/main.log"   # CPU kernels, AVX-512 here
.exl3dev/spw_gpu_tests --gtest_brief=1 --gtest_filter='-Exl3Fixtures*' 2>&1 | tee -a "$OUT/main.log"
.exl3dev/bench_exl3 /tmp/bench_tensors 200 2>&1 | tee "$OUT/bench_spillway.md"
wait $JIT
tail -5 /tmp/jit.log | tee -a "$OUT/main.log"
python3 tools/exl3/make_fixtures.py "$OUT/fixtures" 2>&1 | tee -a "$OUT/main.log"
SPW_EXL3_FIXTURE_DIR="$OUT/fixtures" .exl3dev/spw_gpu_tests --gtest_filter='Exl3Fixtures*' 2>&1 | tee -a "$OUT/main.log"
python3 bench/exl3/bench_exllamav3.py /tmp/bench_tensors 200 2>&1 | tee "$OUT/bench_exllamav3.md"
EXL3_INT8_GEMV=0 python3 bench/exl3/bench_exllamav3.py /tmp/bench_tensors 200 2>&1 | tee -a "$OUT/bench_exllamav3.md"
