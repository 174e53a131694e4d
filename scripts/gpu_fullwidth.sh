#!/usr/bin/env bash
# Issue 7's full-width single-layer tests (tests/gpu/test_engine_fullwidth.cpp) on the H200 machine:
# generates a one-layer synthetic V4.1 checkpoint at real dimensions (real layer $FW_LAYER, default 14:
# window + gated ratio-2 compressor, its own indexer, Engram, 384 MXFP4 experts), then runs
#   EngineFullWidth.SingleLayerMatchesCpuExact   exact numerics (f32 throughout) — a structural check;
#   EngineFullWidth.SingleLayerMatchesCpu        reference numerics (bf16 roundings, fake quants);
#   EngineFullWidth.SingleLayerMatchesCpuHostDispatch / ...NoFakeQuant / ...FakeQuantOnly   bisection variants (FW_BISECT=0 skips);
#   the reference test again on a copy whose config lists no Engram layers (FW_NO_ENGRAM=0 skips it):
#     if only this one passes, the departure is in Engram.
# Each test takes ~60 s on the H200 (CPU load 30–40 s with the dequantization on every core).
#   here:  scripts/gpu_test.sh stage            there: bash scripts/gpu_fullwidth.sh   # carry: .exl3pack
# Each test loads the layer twice (CPU with f32 experts, ~54 GB of host RAM, then the GPU), one at a time.
# Output: $OUT/fullwidth_*.log (or FW_OUT). The tests find fixtures through the source path compiled in.
set -u
cd "$(dirname "$0")/.."
[ -f .exl3pack/dev.tar.xz ] && [ ! -x .exl3dev/spw_gpu_tests ] && tar xJf .exl3pack/dev.tar.xz
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
run reference "$DIR" 'EngineFullWidth.SingleLayerMatchesCpu'
if [ "${FW_BISECT:-1}" != 0 ]; then  # one change each: the routed experts through linear(); no fake quant anywhere
  run host_dispatch "$DIR" 'EngineFullWidth.SingleLayerMatchesCpuHostDispatch'
  run no_fake_quant "$DIR" 'EngineFullWidth.SingleLayerMatchesCpuNoFakeQuant'
  run fake_quant_only "$DIR" 'EngineFullWidth.SingleLayerMatchesCpuFakeQuantOnly'
  run steps "$DIR" 'EngineFullWidth.IntermediatesMatchCpu'
  run steps_fake_quant_only "$DIR" 'EngineFullWidth.IntermediatesMatchCpuFakeQuantOnly'
fi
if [ "${FW_NO_ENGRAM:-1}" != 0 ]; then
  NE=${DIR}_no_engram
  rm -rf "$NE" && mkdir -p "$NE"
  for f in "$DIR"/*; do [ "$(basename "$f")" = config.json ] || ln -s "$f" "$NE/"; done
  python3 - "$DIR/config.json" "$NE/config.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
t = j.get("text_config", j)
t["engram_layer_ids"], t["engram_num_embeddings"] = [], []
json.dump(j, open(sys.argv[2], "w"), indent=2)
PY
  run no_engram "$NE" 'EngineFullWidth.SingleLayerMatchesCpu'
fi
