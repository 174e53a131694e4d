#!/usr/bin/env bash
# Build a chat fuzz target with clang and fuzz it for SECONDS (default 60). Target:
# SPW_FUZZ_CHAT_TARGET=fuzz_stream_parser (default; seeds fuzz/chat/corpus, regenerate with
# fuzz/chat/make_seeds.py) or fuzz_chat_encoding (seeds fuzz/chat/corpus-encoding). Seeds stay
# read-only; new inputs go to fuzz/corpus-run/<target> (git-ignored), crashes to
# fuzz/corpus-run/artifacts-<target>/.
# Usage: fuzz/chat/run.sh [SECONDS] [extra libFuzzer flags...]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
seconds="${1:-60}"
shift || true
build="${SPILLWAY_FUZZ_CHAT_BUILD_DIR:-$root/build-fuzz-chat}"

cmake -S "$root/fuzz/chat" -B "$build" -DCMAKE_CXX_COMPILER="${CXX_FUZZ:-clang++}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
target="${SPW_FUZZ_CHAT_TARGET:-fuzz_stream_parser}"
seeds="$root/fuzz/chat/corpus"
[[ "$target" == fuzz_chat_encoding ]] && seeds="$root/fuzz/chat/corpus-encoding"
cmake --build "$build" --target "$target" -j"$(nproc)"

work="$root/fuzz/corpus-run/$target"
artifacts="$root/fuzz/corpus-run/artifacts-$target/"
mkdir -p "$work" "$artifacts"
exec "$build/$target" "$work" "$seeds" \
  -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -dict="$root/fuzz/chat/stream_parser.dict" -artifact_prefix="$artifacts" -print_final_stats=1 "$@"
