#!/usr/bin/env bash
# Issue 7's full-width single-layer tests (tests/gpu/test_engine_fullwidth.cpp) on the H200 machine:
# generates a one-layer synthetic V4.1 checkpoint at real dimensions (real layer $FW_LAYER, default 14:
# window + gated ratio-2 compressor, its own indexer, Engram, 384 MXFP4 experts), then runs
#   EngineFullWidth.SingleLayerMatchesCpuExact   exact numerics (f32 throughout): the layer end to end;
#   EngineFullWidth.IntermediatesMatchCpu        reference numerics (bf16 roundings, fake quants), step by step
#     (why not the layer output in reference numerics: the top of the test file).
# Each test takes ~60 s on the H200 (CPU load 30–40 s with the dequantization on every core).
#   here:  scripts/gpu_test.sh stage            there: bash scripts/gpu_fullwidth.sh   # carry: .exl3pack
# Each test loads the layer twice (CPU with f32 experts, ~54 GB of host RAM, then the GPU), one at a time.
# Output: $OUT/fullwidth_*.log (or FW_OUT). The tests find fixtures through the source path compiled in.
# Run it alone: generating its model at the same time as scripts/bench_engine.sh's took 545 s for both (2026-12-03;
# ~90 s each alone), and its model, the bench models and llama.cpp's GGUF together overflow the 64 GB disk.
set -u
cd "$(dirname "$0")/.."
[ -f .exl3pack/dev.tar.xz ] && [ ! -x .exl3dev/spw_gpu_tests ] && tar xJf .exl3pack/dev.tar.xz
. scripts/link_build_path.sh
OUT=${FW_OUT:-${OUT:-/tmp/fw_out}}
FW_LAYER=${FW_LAYER:-14}
DIR=/tmp/fw$FW_LAYER
mkdir -p "$OUT"
LIBS=$PWD/.exl3dev/lib:/usr/local/cuda/lib64
if [ ! -f "$DIR/config.json" ]; then
  python3 tools/synth/make_synthetic_model.py "$DIR" --arch v41 --real-layers "$FW_LAYER" --tokenizer none \
    > "$OUT/fullwidth_synth.log" 2>&1 || { echo "generation failed: $OUT/fullwidth_synth.log"; exit 1; }
fi
run() {  # name, model dir, gtest filter
  local t0=$SECONDS
  SPW_FULLWIDTH_MODEL=$2 LD_LIBRARY_PATH=$LIBS timeout "${FW_TIMEOUT:-300}" .exl3dev/spw_gpu_tests \
    --gtest_filter="$3" > "$OUT/fullwidth_$1.log" 2>&1
  echo "fullwidth $1: rc $? in $((SECONDS - t0)) s" | tee -a "$OUT/fullwidth_$1.log"
}
run exact "$DIR" 'EngineFullWidth.SingleLayerMatchesCpuExact'
run steps "$DIR" 'EngineFullWidth.IntermediatesMatchCpu'
