#!/usr/bin/env bash
# Build fuzz_stream_parser with clang and fuzz it for SECONDS (default 60). Seeds in
# fuzz/chat/corpus stay read-only (regenerate with fuzz/chat/make_seeds.py); new inputs go to
# fuzz/corpus-run/stream_parser (git-ignored), crashes to fuzz/corpus-run/artifacts-stream-parser/.
# Usage: fuzz/chat/run.sh [SECONDS] [extra libFuzzer flags...]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
seconds="${1:-60}"
shift || true
build="${SPILLWAY_FUZZ_CHAT_BUILD_DIR:-$root/build-fuzz-chat}"

cmake -S "$root/fuzz/chat" -B "$build" -DCMAKE_CXX_COMPILER="${CXX_FUZZ:-clang++}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target fuzz_stream_parser -j"$(nproc)"

work="$root/fuzz/corpus-run/stream_parser"
artifacts="$root/fuzz/corpus-run/artifacts-stream-parser/"
mkdir -p "$work" "$artifacts"
exec "$build/fuzz_stream_parser" "$work" "$root/fuzz/chat/corpus" \
  -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -dict="$root/fuzz/chat/stream_parser.dict" -artifact_prefix="$artifacts" -print_final_stats=1 "$@"
