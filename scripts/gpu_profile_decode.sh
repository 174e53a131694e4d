#!/usr/bin/env bash
# Nsight Compute on the batch-1 decode kernels of `spillway bench` (V4.1 width, EXL3 K=3, 4 layers): why each
# hot decode kernel runs where it does (stall reasons, occupancy, memory throughput), for the kernels the
# CUPTI traces of bench/results/engine_h200.md (2026-12-03) put on top: split attention, dense GEMV, fused
# EXL3 MoE, mHC mixes and Sinkhorn.
#   here:  STAGE_BINS=bin/spillway bash scripts/gpu_test.sh stage
#   there: bash scripts/gpu_profile_decode.sh [DIR]     # carry: .exl3pack; DIR defaults to $OUT
# Generates the model if /tmp/synth_v41_exl3 has none (bench_engine.sh's, ~90 s), then one ncu run over
# PROFILE_COUNT (default 40) consecutive launches of those kernels after PROFILE_SKIP (default 300) of them
# (past the 1 K-token prompt's prefill, inside the timed decode steps). Writes DIR/ncu_decode.txt and prints a
# summary. PROFILE_KERNELS (an ncu --kernel-name value) and PROFILE_SECTIONS (ncu --section flags) override
# the kernels and sections. ncu replays each profiled launch (18 passes: ~2–3 s each on the H200, 2026-12-03) and prints nothing until
# the application exits, so a timeout loses everything: 40 launches plus the bench under ncu took > 150 s. Budget
# PROFILE_TIMEOUT ≥ 300 s (the default 420), or lower PROFILE_COUNT.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/decode_prof}}
mkdir -p "$OUT"
[ -x .exl3dev/spillway ] || tar xJf .exl3pack/dev.tar.xz
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
MODEL=/tmp/synth_v41_exl3
[ -f $MODEL/config.json ] || python3 tools/synth/make_synthetic_model.py $MODEL --arch v41 --experts exl3 --bits 3 \
  --layers 4 --tokenizer none > "$OUT/synth.log" 2>&1
KERNELS=${PROFILE_KERNELS:-'regex:split_logits|split_sums|gemv_kernel|gemv_stream_kernel|gemv_persist_kernel|exl3_moe_kernel|hc_split_sinkhorn|hc_mixes'}
SECTIONS=${PROFILE_SECTIONS:-"--section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats"}
LD_LIBRARY_PATH=$PWD/.exl3dev/lib:/usr/local/cuda/lib64 timeout "${PROFILE_TIMEOUT:-420}" "$NCU" --kernel-name "$KERNELS" \
  --launch-skip "${PROFILE_SKIP:-300}" --launch-count "${PROFILE_COUNT:-40}" $SECTIONS \
  .exl3dev/spillway bench --model $MODEL --batches 1 --prefill 4096 --decode-steps 8 --batch-steps 2 \
  > "$OUT/ncu_decode.txt" 2>&1
echo "ncu rc $? ($OUT/ncu_decode.txt)"
grep -E '^  [a-z_:]+.*\(|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|No Eligible|Issued Warp|Warp Cycles Per Issued' \
  "$OUT/ncu_decode.txt" | head -200
