#!/usr/bin/env bash
# Build the libFuzzer targets with clang and fuzz parse_safetensors_header for SECONDS (default 60).
# The committed seeds in fuzz/corpus/safetensors_header stay read-only; new inputs go to
# fuzz/corpus-run/safetensors_header (git-ignored), crashes to fuzz/corpus-run/artifacts/.
# Usage: scripts/fuzz.sh [SECONDS] [extra libFuzzer flags...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
shift || true
build="${SPILLWAY_FUZZ_BUILD_DIR:-$root/build-fuzz}"

cmake -S "$root/fuzz" -B "$build" -DCMAKE_CXX_COMPILER="${CXX_FUZZ:-clang++}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target fuzz_safetensors_header -j"$(nproc)"

work="$root/fuzz/corpus-run/safetensors_header"
artifacts="$root/fuzz/corpus-run/artifacts/"
mkdir -p "$work" "$artifacts"
exec "$build/fuzz_safetensors_header" "$work" "$root/fuzz/corpus/safetensors_header" \
  -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -dict="$root/fuzz/safetensors_header.dict" -artifact_prefix="$artifacts" -print_final_stats=1 "$@"
