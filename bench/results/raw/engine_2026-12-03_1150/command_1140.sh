#!/usr/bin/env bash
# Session 8, call 1: GPU tests, bench (no tracer), full-width tests || ncu decode profile.
set -u
mkdir -p /work && ln -sfn $PWD /work/wt
tar xJf .exl3pack/dev.tar.xz
R=$OUT/r; mkdir -p $R/bench $R/fw $R/prof
( sleep 545; cd $OUT && tar czf safety.tar.gz r ) &
SAFE=$!
T0=$SECONDS
LIBS=$PWD/.exl3dev/lib:/usr/local/cuda/lib64
( python3 tools/synth/make_synthetic_model.py /tmp/fw14 --arch v41 --real-layers 14 --tokenizer none > $R/fw/synth.log 2>&1 ) &
( python3 tools/synth/make_synthetic_model.py /tmp/synth_v41_exl3 --arch v41 --experts exl3 --bits 3 --layers 4 --tokenizer none > $R/bench/synth.log 2>&1 ) &
timeout 300 env LD_LIBRARY_PATH=$LIBS .exl3dev/spw_gpu_tests --gtest_brief=1 \
  --gtest_filter='CudaAttn*:CudaDense*:EngineGolden*:EngineBatch*:EnginePlan*:EngineGraphs*' > $R/gpu_tests.log 2>&1
echo "gpu tests rc $? at $((SECONDS-T0)) s"; tail -5 $R/gpu_tests.log
wait
echo "gens done at $((SECONDS-T0)) s"
KEEP_MODELS=1 SKIP_V4=1 OUT=$R/bench BENCH_ARGS="--batches 1,4,16,64 --prefill 4096,40960" bash scripts/bench_engine.sh > $R/bench/run.log 2>&1
echo "bench done at $((SECONDS-T0)) s"; grep -iE "tok/s|roofline|ms/token" $R/bench/*.md | head -20
( FW_OUT=$R/fw nice -n 19 bash scripts/gpu_fullwidth.sh > $R/fw/run.log 2>&1 ) &
FW=$!
PROFILE_TIMEOUT=240 bash scripts/gpu_profile_decode.sh $R/prof > $R/prof/run.log 2>&1
echo "prof done at $((SECONDS-T0)) s"
while kill -0 $FW 2>/dev/null && [ $((SECONDS-T0)) -lt 535 ]; do sleep 5; done
echo "fw done at $((SECONDS-T0)) s"; cat $R/fw/run.log | tail -5
kill $SAFE 2>/dev/null
cd $OUT && tar czf r.tar.gz r && rm -rf r
