#!/usr/bin/env bash
# The main job as far as it exists today: greedy generation on the CPU reference engine from the
# tiny V4.1 test model that ships with the repo. (The OpenAI server and the trained demo model are
# the next issues; this script will become `spillway serve` answering a request.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh > /dev/null
./build/bin/spillway run --model tests/golden/fixtures/v41/model -p "0 17 42 99 7" -n 16
