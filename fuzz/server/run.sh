#!/usr/bin/env bash
# Build a request-JSON fuzz target with clang and fuzz it for SECONDS (default 60). Target:
# SPW_FUZZ_SERVER_TARGET=fuzz_chat_request (default), fuzz_completion_request, fuzz_tool_grammar or
# fuzz_py_json; seeds fuzz/server/corpus/<target> (regenerate with fuzz/server/make_seeds.py) stay
# read-only; new inputs go to fuzz/corpus-run/<target> (git-ignored), crashes to
# fuzz/corpus-run/artifacts-<target>/.
# Usage: [SPW_FUZZ_SERVER_TARGET=...] fuzz/server/run.sh [SECONDS] [extra libFuzzer flags...]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
seconds="${1:-60}"
shift || true
build="${SPILLWAY_FUZZ_SERVER_BUILD_DIR:-$root/build-fuzz-server}"

cmake -S "$root/fuzz/server" -B "$build" -DCMAKE_CXX_COMPILER="${CXX_FUZZ:-clang++}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
target="${SPW_FUZZ_SERVER_TARGET:-fuzz_chat_request}"
cmake --build "$build" --target "$target" -j"$(nproc)"

work="$root/fuzz/corpus-run/$target"
artifacts="$root/fuzz/corpus-run/artifacts-$target/"
mkdir -p "$work" "$artifacts"
exec "$build/$target" "$work" "$root/fuzz/server/corpus/$target" \
  -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -dict="$root/fuzz/server/request_json.dict" -artifact_prefix="$artifacts" -print_final_stats=1 "$@"
