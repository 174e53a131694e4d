#!/bin/bash
S=/work/wt/build/bin/spillway
M=/work/main/models/demo
C="--bits 3 --layers 5 --experts 0 1 2 3 4 5 6 7 --single-candidate --threads 2 --no-progress --dump-wh-count 100 --calibration /tmp/calib.jsonl --calibration-tokens 8192"
cd /tmp/q6
run() { name=$1; shift; rm -rf $name; /usr/bin/time -f "$name %e s" $S quantize --model $M --out pack_$name --dump-wh $name $C "$@" > $name.log 2>&1; tail -1 $name.log; }
rm -rf pack_s01 pack_s03 pack_s1 pack_s3
run s01 --sigma-reg 0.1 --keep-hessians
for s in s03 s1 s3; do mkdir -p pack_$s/.quantize-work; cp -r pack_s01/.quantize-work/hessians pack_$s/.quantize-work/; done
run s03 --sigma-reg 0.3
run s1 --sigma-reg 1
run s3 --sigma-reg 3
echo ALLDONE
