#!/usr/bin/env bash
# The EXL3 decode ceiling on the GPU machine (issue 5): bench_exl3_ceiling's tile rates with the trellis in
# shared memory, the SASS instruction mix of one 8-tile stage of each measured decode, and Nsight Compute's pipe
# use of the K = 3 MUL1 kernels at 4 blocks of 8 warps per SM.
#   here:  build bench_exl3_ceiling (CUDA build), STAGE_BINS="bench/exl3/bench_exl3_ceiling ..." bash scripts/gpu_test.sh stage
#   there: bash scripts/gpu_ceiling.sh [DIR]     # carry: .exl3pack; writes DIR/ceiling.md, DIR/ceiling_sass.txt, DIR/ceiling_ncu.txt
set -u
OUT=${1:-${OUT:-/tmp/exl3_ceiling}}
mkdir -p "$OUT"
[ -x .exl3dev/bench_exl3_ceiling ] || tar xJf .exl3pack/dev.tar.xz
BIN=.exl3dev/bench_exl3_ceiling
OBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
"$BIN" 20 | tee "$OUT/ceiling.md"
# Instruction mix per 8-tile stage: the body of the kernel's stage loop (the longest backward-branch loop).
{
  for pat in 'ceiling_kernelILi3ELi2ELi0' 'ceiling_kernelILi3ELi2ELi1' 'ceiling_kernelILi3ELi1ELi0'; do
    fn=$("$OBJ" -symbols "$BIN" 2>/dev/null | grep -o "_Z[A-Za-z0-9_]*${pat}[A-Za-z0-9_]*" | head -1)
    "$OBJ" -sass -fun "$fn" "$BIN" > /tmp/sass.txt 2>&1
    echo "== $pat ($(grep -c '/\*[0-9a-f]*\*/' /tmp/sass.txt) instructions in the function)"
    python3 - /tmp/sass.txt <<'EOF'
import re, sys, collections
lines = [l for l in open(sys.argv[1]) if re.match(r'\s+/\*[0-9a-f]{4,}\*/', l)]
addr = [int(re.match(r'\s+/\*([0-9a-f]+)\*/', l).group(1), 16) for l in lines]
ops = [re.sub(r'^\s+/\*[0-9a-f]+\*/\s+(@!?U?P[0-9T] )?', '', l).split()[0] for l in lines]
# loops: BRA to an earlier address; the stage loop is the innermost one holding the mma instructions
best = None
for i, l in enumerate(lines):
    t = re.search(r'0x([0-9a-f]+)', l.split('BRA', 1)[1]) if 'BRA' in l else None
    if not t: continue
    target = int(t.group(1), 16)
    if target >= addr[i]: continue
    j = addr.index(target) if target in addr else None
    if j is None: continue
    body = ops[j:i + 1]
    if any(o.startswith(('HMMA', 'IMMA')) for o in body) and (best is None or len(body) < len(best)):
        best = body
if best is None:
    print('stage loop not found'); sys.exit()
c = collections.Counter(o.split('.')[0] for o in best)
n_mma = c.get('HMMA', 0) + c.get('IMMA', 0)
print(f'stage loop: {len(best)} instructions for {n_mma} mma ({len(best) / 8:.1f} per tile)')
print('  ' + ', '.join(f'{k} {v}' for k, v in c.most_common()))
EOF
  done
} 2>&1 | tee "$OUT/ceiling_sass.txt"
METRICS=sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed.avg.per_cycle_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
# Launches per row: 2 calibrations + 3 timed per shape, shapes 1×8 .. 8×8: skip 17 = the first timed launch at 4×8.
[ -n "$NCU" ] && for pat in 'ceiling_kernelILi3ELi2ELi0' 'ceiling_kernelILi3ELi2ELi1'; do
  echo "== $pat" >> "$OUT/ceiling_ncu.txt"
  timeout 150 "$NCU" --kernel-name-base mangled --kernel-name "regex:$pat" --launch-skip 17 --launch-count 1 \
    --metrics "$METRICS" "$BIN" 2 2>&1 | grep -E 'pct|per_cycle|ceiling_kernel' >> "$OUT/ceiling_ncu.txt"
done
cat "$OUT/ceiling_ncu.txt" 2>/dev/null
exit 0
