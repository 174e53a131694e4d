#!/bin/bash
S=/work/wt/build/bin/spillway
M=/work/main/models/demo
cd /tmp/q6
for K in 2 4; do
  for v in "cal:0.025" "s1:1"; do
    name=k${K}_${v%%:*}; sg=${v##*:}
    rm -rf $name pack_$name; mkdir -p pack_$name/.quantize-work; cp -r pack_s01/.quantize-work/hessians pack_$name/.quantize-work/
    $S quantize --model $M --out pack_$name --dump-wh $name --bits $K --layers 5 --experts 0 1 2 3 4 5 6 7 --single-candidate --threads 2 --no-progress --dump-wh-count 100 --calibration /tmp/calib.jsonl --calibration-tokens 8192 --sigma-reg $sg > $name.log 2>&1; echo "$name rc $?"
  done
  name=k${K}_id; rm -rf $name pack_$name
  $S quantize --model $M --out pack_$name --dump-wh $name --bits $K --layers 5 --experts 0 1 2 3 4 5 6 7 --single-candidate --threads 2 --no-progress --dump-wh-count 100 --identity-hessian > $name.log 2>&1; echo "$name rc $?"
done
echo ALLDONE
