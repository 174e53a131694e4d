#!/usr/bin/env bash
# The whole V4.1-Flash with experts spilled to the host, on one GPU, in one device call (bench/results/spill_h200.md):
#   here:  ninja -C build-sm90 bin/spillway && BUILD_DIR=build-sm90 STAGE_BINS="bin/spillway" bash scripts/gpu_test.sh stage
#   there: bash scripts/gpu_spill_full.sh          # carry: .exl3pack ; results in $OUT
# `spillway bench --synthetic v41-flash` builds the model in memory (random weights in the released formats; no
# disk), so the 127 GiB (2-bit) or 190 GiB (3-bit) of routed experts never touch the 64 GiB disk.
# RUNS is a list of "bits:layers:host_gpu:host_cpu[:skew]" (default: 2-bit, 40 layers, a third in pinned host memory
# read by the GPU; then a third on the CPU). A host share of "fit" takes the smallest share (at least a third) that
# leaves the GPU's memory enough room: from the plan that `bench --plan-only` prints for all experts on the GPU.
# With a routing skew the run is made twice: experts spread over the tiers by index (blind to popularity), recording
# the routes; then the same shares with each layer's coldest experts on the host (fixed_share.py --routing-stats).
# BENCH_ARGS adds `spillway bench` flags; BENCH_TIMEOUT bounds each run (default 280 s).
set -u
. scripts/staged_env.sh
OUT=${OUT:-/tmp/spill_full_out}
mkdir -p "$OUT"
LOG="$OUT/spill_full.log"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  nproc; free -g | head -2
  lscpu | grep -E "Model name|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node\(s\)"
  $B/spillway --version
} 2>&1 | tee "$LOG"
gpu_gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print $1 / 1024}')
TIMEV=""
[ -x /usr/bin/time ] && TIMEV="/usr/bin/time -v"  # peak host memory, where the machine has GNU time
COMMON="--batches 1,8,32 --prefill 4096 --prefill-runs 1 --decode-steps 16 --batch-steps 8 --batch-prompt 256"
for run in ${RUNS:-2:40:0.333:0 2:40:0:0.333}; do
  IFS=: read -r bits layers hg hc skew <<< "$run"
  skew=${skew:-0}
  name="k${bits}_l${layers}_hg${hg}_hc${hc}_s${skew}"
  synth="--synthetic v41-flash --layers $layers --expert-bits $bits --routing-skew $skew"
  if [ "$hg" = fit ] || [ "$hc" = fit ]; then
    # Device total with every expert on the GPU, and the experts' share of it (GiB), from the plan.
    timeout 120 $B/spillway bench $synth $COMMON --plan-only > "$OUT/plan_$name.md" 2>&1
    share=$(python3 - "$OUT/plan_$name.md" "$gpu_gib" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
total = float(re.search(r"\| device total \| ([\d.]+) \|", text).group(1))
experts = float(re.search(r"\| weights: routed experts[^|]*\| ([\d.]+) \|", text).group(1))
room = float(sys.argv[2]) - 4.0  # the CUDA context, cuBLAS and the allocator's slack
print(f"{min(1.0, max(1 / 3, (total - room) / experts)):.3f}")
EOF
)
    [ "$hg" = fit ] && hg=$share
    [ "$hc" = fit ] && hc=$share
    echo "run $name: host share $share for ${gpu_gib} GiB of GPU memory" | tee -a "$LOG"
  fi
  placements="spread"
  [ "$skew" != 0 ] && placements="spread popular"
  for how in $placements; do
    stats=""
    [ "$how" = popular ] && stats="--routing-stats $OUT/routes_$name.json"
    python3 tools/placement/fixed_share.py --v41-flash-layers "$layers" --host-gpu "$hg" --host-cpu "$hc" $stats \
      -o "/tmp/placement_${name}_$how.json" >> "$LOG"
    record=""
    [ "$how" = spread ] && [ "$skew" != 0 ] && record="--record-routing $OUT/routes_$name.json"
    $TIMEV timeout ${BENCH_TIMEOUT:-280} $B/spillway bench $synth --placement "/tmp/placement_${name}_$how.json" \
      $COMMON $record ${BENCH_ARGS:-} --json "$OUT/bench_${name}_$how.json" > "$OUT/bench_${name}_$how.md" \
      2> "$OUT/bench_${name}_$how.err"
    rc=$?
    echo "bench ${name}_$how rc $rc — $(grep -m1 '^ms/token' "$OUT/bench_${name}_$how.md") — peak host RSS \
$(grep 'Maximum resident' "$OUT/bench_${name}_$how.err" | awk '{print $NF / 1048576}') GiB" | tee -a "$LOG"
  done
done
