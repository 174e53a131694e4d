#!/usr/bin/env bash
# The spill against llama.cpp with experts on the host, in one device call (bench/results/spill_h200.md):
#   here:  ninja -C build-sm90 bin/spillway && BUILD_DIR=build-sm90 STAGE_BINS="bin/spillway" bash scripts/gpu_test.sh stage
#          bash tools/peers/llamacpp/fetch_sdist.sh && bash tools/peers/llamacpp/stage.sh          # -> .llpack/
#   there: bash scripts/gpu_spill_peer.sh          # carry: .exl3pack .llpack ; results in $OUT
# llama.cpp's CUDA build takes minutes, so it starts first and overlaps the model's generation and Spillway's runs.
# PHASES (default "spillway llama") splits the work over two calls on one warm machine: "spillway" generates,
# runs Spillway and leaves llama.cpp preparing (build, convert) until it is done or the script has run PREP_WAIT s;
# "llama" then finds the build and the GGUF done (a ninja no-op, no second conversion) and runs llama.cpp.
# GPU_FREE=FILE: wait for FILE before Spillway's runs, so the caller can use the GPU while the model generates.
# The model: the synthetic V4-Flash with its released MXFP4 experts (tools/synth/make_synthetic_model.py --arch v4),
# LAYERS layers (default 6), which both engines read: llama.cpp after its own converter. The same share of experts
# on the host for both: llama.cpp keeps the MoE weights of the first NCMOE layers (default LAYERS / 3) in host memory
# and computes them on the CPU (`--n-cpu-moe`, it places experts per layer); Spillway puts the same share of every
# layer's experts in pinned host memory, read by the GPU (its CPU runtime computes EXL3 experts only, not MXFP4).
# Both run all-GPU too, so each engine's spill cost is measured against its own baseline. Batches 1, 8, 32 and a
# 4096-token prefill, as scripts/gpu_spill_full.sh. Not run yet on a device.
set -u
. scripts/staged_env.sh
OUT=${OUT:-/tmp/spill_peer_out}
mkdir -p "$OUT"
LAYERS=${LAYERS:-6}
NCMOE=${NCMOE:-$((LAYERS / 3))}
MODEL=${MODEL:-/tmp/synth_v4_spill}
LOG="$OUT/spill_peer.log"
share=$(python3 -c "print(f'{$NCMOE / $LAYERS:.3f}')")
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  nproc; free -g | head -2
  $B/spillway --version
  echo "V4-Flash synthetic, $LAYERS layers; host share $share (llama.cpp --n-cpu-moe $NCMOE)"
} 2>&1 | tee "$LOG"
PHASES=${PHASES:-spillway llama}
# llama.cpp: build (or the prebuilt binaries) and convert in the background; its convert step waits for the model.
OUT=$OUT/llamacpp_prepare bash scripts/bench_llamacpp.sh prepare "$MODEL" > "$OUT/llamacpp_prepare.log" 2>&1 &
PREP=$!
[ -f "$MODEL/config.json" ] || python3 tools/synth/make_synthetic_model.py "$MODEL" --arch v4 --experts mxfp4 \
  --layers "$LAYERS" --tokenizer none > "$OUT/synth.log" 2>&1
tail -1 "$OUT/synth.log" 2>/dev/null | tee -a "$LOG"
COMMON="--batches 1,8,32 --prefill 4096 --prefill-runs 1 --decode-steps 16 --batch-steps 8 --batch-prompt 256"
if [[ " $PHASES " == *" spillway "* ]]; then
  [ -n "${GPU_FREE:-}" ] && while [ ! -e "$GPU_FREE" ]; do sleep 2; done
  for p in gpu:0 host_gpu:$share; do
    IFS=: read -r name hg <<< "$p"
    python3 tools/placement/fixed_share.py "$MODEL" --host-gpu "$hg" -o "/tmp/placement_v4_$name.json" >> "$LOG"
    timeout ${BENCH_TIMEOUT:-200} $B/spillway bench --model "$MODEL" --placement "/tmp/placement_v4_$name.json" $COMMON \
      --json "$OUT/bench_v4_$name.json" > "$OUT/bench_v4_$name.md" 2>&1
    echo "spillway $name rc $? — $(grep -m1 '^ms/token' "$OUT/bench_v4_$name.md")" | tee -a "$LOG"
  done
fi
if [[ " $PHASES " != *" llama "* ]]; then
  # leave the preparation running for the next call; report how far it got
  while [ $SECONDS -lt ${PREP_WAIT:-0} ] && kill -0 $PREP 2>/dev/null; do sleep 5; done
  tail -5 "$OUT/llamacpp_prepare.log" | tee -a "$LOG"
  exit 0
fi
wait $PREP
tail -5 "$OUT/llamacpp_prepare.log" | tee -a "$LOG"
LLAMA_NCMOE="0,$NCMOE" LLAMA_DEPTHS=0 LLAMA_REPS=1 LLAMA_NPL=1,8,32 SKIP_40K=1 OUT=$OUT \
  bash scripts/bench_llamacpp.sh run "$MODEL" > "$OUT/llamacpp_run.log" 2>&1
echo "llama.cpp run rc $?" | tee -a "$LOG"
