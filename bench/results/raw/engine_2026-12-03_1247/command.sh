#!/usr/bin/env bash
# Session 8, last call (device time nearly spent): llama.cpp's DeepSeek-V4 path on the synthetic V4-Flash model
# (the same seeded generator command as the 11:52 spillway bench), plus the mHC kernel tests.
set -u
mkdir -p /work && ln -sfn $PWD /work/wt
tar xJf .exl3pack/dev.tar.xz
T0=$SECONDS
export LLAMA_REPS=1 LLAMA_DEPTHS=0 LLAMA_NPL=1,4,16 LLAMA_TG=64 SKIP_40K=1
mkdir -p $OUT/ll
( OUT=$OUT/ll bash scripts/bench_llamacpp.sh build > /tmp/ll_build.out 2>&1 ) &
BUILD=$!
( timeout 40 env LD_LIBRARY_PATH=$PWD/.exl3dev/lib:/usr/local/cuda/lib64 .exl3dev/spw_gpu_tests --gtest_brief=1 --gtest_filter='CudaOpsHc*' > $OUT/hc_tests.log 2>&1 ) &
python3 tools/synth/make_synthetic_model.py /tmp/synth_v4_mxfp4 --arch v4 --experts mxfp4 --layers 4 --tokenizer none > /tmp/synth.log 2>&1
echo "gen rc $? at $((SECONDS-T0)) s"; tail -3 $OUT/hc_tests.log
OUT=$OUT/ll bash scripts/bench_llamacpp.sh convert > /tmp/ll_convert.out 2>&1
echo "convert rc $? at $((SECONDS-T0)) s"; tail -3 /tmp/ll_convert.out
wait $BUILD; tail -2 /tmp/ll_build.out
timeout $((${DEADLINE:-200} - (SECONDS-T0))) env OUT=$OUT/ll bash scripts/bench_llamacpp.sh run > /tmp/ll_run.out 2>&1
echo "llama run rc $? at $((SECONDS-T0)) s"; grep -aE "^\||^== " /tmp/ll_run.out | head -50
tail -3 $OUT/hc_tests.log; ls $OUT/ll
