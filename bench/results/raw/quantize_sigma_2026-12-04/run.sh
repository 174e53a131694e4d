#!/bin/bash
S=/work/wt/build/bin/spillway
M=/work/main/models/demo
C="--bits 3 --layers 5 --experts 0 1 2 3 4 5 6 7 --single-candidate --threads 2 --no-progress --dump-wh-count 100 --calibration-tokens 8192"
cd /tmp/q6
run() { name=$1; shift; rm -rf $name pack_$name; /usr/bin/time -f "$name %e s" $S quantize --model $M --out pack_$name --dump-wh $name $C "$@" > $name.log 2>&1; tail -1 $name.log; }
run cal --calibration /tmp/calib.jsonl
run id --identity-hessian
run ho --calibration /tmp/demo_data/heldout.txt
run tr --calibration /tmp/train600k.txt
echo ALLDONE
