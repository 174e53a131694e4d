#!/bin/bash
S=/work/wt/build/bin/spillway
M=/work/main/models/demo
C="--bits 3 --layers 5 --experts 0 1 2 3 4 5 6 7 --single-candidate --threads 2 --no-progress --dump-wh-count 100"
cd /tmp/q6
run() { name=$1; shift; rm -rf $name pack_$name; /usr/bin/time -f "$name %e s" $S quantize --model $M --out pack_$name --dump-wh $name $C "$@" > $name.log 2>&1; tail -1 $name.log; }
run cal32_p2k --calibration /tmp/calib.jsonl --calibration-tokens 32768 --prior-tokens 2048
run cal_p8k --calibration /tmp/calib.jsonl --calibration-tokens 8192 --prior-tokens 8192
echo ALLDONE
