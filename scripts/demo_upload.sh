#!/usr/bin/env bash
# The demo-model GPU tests (EngineDemo.*: the trained demo model, and an EXL3 pack of it made on the GPU, against
# the CPU reference) need models/demo/model.safetensors (48 MB) on the GPU machine. The device tool uploads at most
# 64 MiB (tracked files + carried paths), and the tree is ~41 MB with the golden fixtures and raw results, plus
# ~20 MB of staged test binary. So: the model goes into .exl3pack as xz (39 MB), and what these tests do not read
# (tests/golden, bench/results/raw, the model itself) moves out of the tree for the upload — moved, not symlinked:
# the upload follows directory links.
#   here:   STAGE_BINS=tests/spw_gpu_tests bash scripts/gpu_test.sh stage && bash scripts/demo_upload.sh stage
#   device: bash scripts/demo_upload.sh run          # carry: .exl3pack; GPU_TEST_FILTER (default EngineDemo.*)
#   here:   bash scripts/demo_upload.sh restore      # before any commit
# Measured (2026-12-04): the three EngineDemo tests take ~35 s on the H200, the call ~40 s of device time.
set -eu
cd "$(dirname "$0")/.."
AWAY=.bigstore/demo_upload
MOVED="tests/golden bench/results/raw models/demo/model.safetensors"
case "${1:-}" in
  stage)
    for d in /.bigstore/ /.exl3pack/; do grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
    [ -f .exl3pack/dev.tar.xz ] || { echo "stage the test binary first: STAGE_BINS=tests/spw_gpu_tests bash scripts/gpu_test.sh stage (then copy .exl3pack here)"; exit 1; }
    xz -T2 -6 -c models/demo/model.safetensors > .exl3pack/demo.xz
    for p in $MOVED; do
      mkdir -p "$AWAY/$(dirname "$p")"
      mv "$p" "$AWAY/$p"
    done
    echo "upload: $(du -sb --exclude=.git --exclude=.bigstore . | cut -f1) bytes (limit 67108864); restore with: bash scripts/demo_upload.sh restore"
    ;;
  run)
    [ -f .exl3pack/dev.tar.xz ] && tar xJf .exl3pack/dev.tar.xz
    . scripts/link_build_path.sh
    xz -T8 -dc .exl3pack/demo.xz > models/demo/model.safetensors
    OUT=${OUT:-/tmp/demo_out}
    mkdir -p "$OUT"
    LD_LIBRARY_PATH=$PWD/.exl3dev/lib:/usr/local/cuda/lib64 timeout "${DEMO_TIMEOUT:-400}" .exl3dev/spw_gpu_tests \
      --gtest_filter="${GPU_TEST_FILTER:-EngineDemo.*}" > "$OUT/demo_tests.log" 2>&1
    echo "rc $?"
    grep -E 'top-1|noise floor|OK \]|FAILED|PASSED|Failure' "$OUT/demo_tests.log"
    ;;
  restore)
    for p in $MOVED; do
      if [ -e "$AWAY/$p" ]; then
        rm -rf "$p"
        mv "$AWAY/$p" "$p"
      fi
    done
    rm -f .exl3pack/demo.xz
    git status --short
    ;;
  *)
    echo "usage: bash scripts/demo_upload.sh stage|run|restore" >&2
    exit 2
    ;;
esac
