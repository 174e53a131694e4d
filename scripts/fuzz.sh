#!/usr/bin/env bash
# Build the libFuzzer targets with clang and fuzz one of them for SECONDS (default 60): FUZZ_TARGET=
# safetensors_header (default: parse_safetensors_header), model_config (parse_model_config) or
# image_decode (src/vision: decoders and image processor; also seeded from tests/unit/data/vision/decode).
# The committed seeds in fuzz/corpus/TARGET stay read-only; new inputs go to
# fuzz/corpus-run/TARGET (git-ignored), crashes to fuzz/corpus-run/artifacts/.
# Usage: [FUZZ_TARGET=model_config] scripts/fuzz.sh [SECONDS] [extra libFuzzer flags...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
shift || true
build="${SPILLWAY_FUZZ_BUILD_DIR:-$root/build-fuzz}"

cmake -S "$root/fuzz" -B "$build" -DCMAKE_CXX_COMPILER="${CXX_FUZZ:-clang++}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
target="${FUZZ_TARGET:-safetensors_header}"
cmake --build "$build" --target "fuzz_$target" -j"$(nproc)"

work="$root/fuzz/corpus-run/$target"
artifacts="$root/fuzz/corpus-run/artifacts/"
mkdir -p "$work" "$artifacts"
dict=()
[ -f "$root/fuzz/$target.dict" ] && dict=(-dict="$root/fuzz/$target.dict")
seeds=()
[ -d "$root/fuzz/corpus/$target" ] && seeds+=("$root/fuzz/corpus/$target")
[ "$target" = image_decode ] && seeds+=("$root/tests/unit/data/vision/decode")
exec "$build/fuzz_$target" "$work" "${seeds[@]}" \
  -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  "${dict[@]}" -artifact_prefix="$artifacts" -print_final_stats=1 "$@"
