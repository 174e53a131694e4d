#!/usr/bin/env bash
# Profiles the EXL3 CUDA kernels on the GPU machine: Nsight Compute sections for one GEMV launch
# (8192×8192 K=3 mul1, m=1) and one fused-MoE launch, plus the SASS instruction mix of both kernels.
#   here:  scripts/build.sh && bash scripts/gpu_test.sh stage && tar cJf .exl3pack/dev.tar.xz .exl3dev
#   there: bash scripts/gpu_profile.sh [DIR]    # carry: .exl3pack; writes DIR/ncu_*.txt, DIR/sass_*.txt
# (DIR defaults to $OUT) and prints a summary.
set -u
OUT=${1:-${OUT:-/tmp/exl3_prof}}
mkdir -p "$OUT"
[ -d .exl3dev ] || tar xJf .exl3pack/dev.tar.xz
export LD_LIBRARY_PATH=$PWD/.exl3dev/lib:${LD_LIBRARY_PATH:-}
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
OBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
echo "ncu: ${NCU:-none}  cuobjdump: $OBJ"
python3 bench/exl3/make_bench_tensors.py /tmp/bt > /dev/null 2>&1
mkdir -p /tmp/bt1 && ln -sf /tmp/bt/dense_8192x8192_k3_mul1.safetensors /tmp/bt1/
# Instruction mix of the K=3 mul1 kernels (opcode counts over the whole function).
for pat in 'exl3_gemm_bulk_kernelILi3ELi2ELb0' 'exl3_moe_kernelILi3ELi2E'; do
  fn=$("$OBJ" -symbols .exl3dev/bench_exl3 2>/dev/null | grep -o "_Z[A-Za-z0-9_]*${pat}[A-Za-z0-9_]*" | head -1)
  "$OBJ" -sass -fun "$fn" .exl3dev/bench_exl3 > "$OUT/sass_${pat:0:9}.txt" 2>&1
  echo "== $pat: $(grep -c '/\*[0-9a-f]*\*/' "$OUT/sass_${pat:0:9}.txt") instructions"
  grep -oE '^\s+/\*[0-9a-f]+\*/\s+(@!?U?P[0-9T] )?[A-Z0-9]+' "$OUT/sass_${pat:0:9}.txt" | awk '{print $NF}' | sort | uniq -c | sort -rn | head -25
done
SECTIONS="--section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --metrics sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_issue_stalled_long_scoreboard,smsp__average_warp_latency_issue_stalled_short_scoreboard,smsp__average_warp_latency_issue_stalled_wait,smsp__average_warp_latency_issue_stalled_math_pipe_throttle,smsp__average_warp_latency_issue_stalled_barrier,smsp__average_warp_latency_issue_stalled_not_selected,smsp__average_warp_latency_issue_stalled_selected,smsp__average_warp_latency_issue_stalled_mio_throttle,smsp__average_warp_latency_issue_stalled_dispatch_stall,smsp__average_warp_latency_issue_stalled_no_instruction"
[ -n "$NCU" ] && timeout 200 "$NCU" --kernel-name regex:exl3_gemm_bulk_kernel --launch-skip 25 --launch-count 1 $SECTIONS \
  .exl3dev/bench_exl3 /tmp/bt1 30 gpu 2>&1 | grep -v '^==PROF==' > "$OUT/ncu_gemm.txt"
[ -n "$NCU" ] && timeout 200 "$NCU" --kernel-name regex:exl3_moe_kernel --launch-skip 12 --launch-count 1 $SECTIONS \
  .exl3dev/bench_exl3 /tmp/bt1 20 gpu 2>&1 | grep -v '^==PROF==' > "$OUT/ncu_moe.txt"
grep -E "Duration|Throughput|Issue Slots|Issued Warp|No Eligible|Active Warps|Eligible Warps|Stall|stalled|pipe|Achieved Occupancy|Registers|Theoretical Occ|Executed Ipc|Pipe|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" "$OUT"/ncu_*.txt | head -120
