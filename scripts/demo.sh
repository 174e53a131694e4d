#!/usr/bin/env bash
# The main job: `spillway serve` on the bundled demo model (models/demo, a small trained model of
# the V4.1 architecture), answering one OpenAI chat request, then shutting down cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
# The build's full output goes to a log; the terminal shows its progress (cmake's percentage), and the
# log's tail if it fails.
build_log=/tmp/spillway-build.log
echo "building spillway (full output in $build_log)" >&2
if ! scripts/build.sh 2>&1 | tee "$build_log" | awk '
    match($0, /^\[ *[0-9]+%\]/) {
      pct = substr($0, 2, RLENGTH - 3) + 0
      if (pct >= shown + 10 || pct == 100) { printf "  build %3d%%\n", pct > "/dev/stderr"; shown = pct }
    }' ; then
  tail -30 "$build_log"
  exit 1
fi
port=${SPILLWAY_PORT:-8421}
log=$(mktemp)
build/bin/spillway serve --port "$port" > "$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
  kill -0 $server 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.5
done
echo "spillway serve is up on port $port; asking it something:" >&2
request='{"model": "demo", "max_tokens": 48, "temperature": 0,
          "messages": [{"role": "user", "content": "Write a Python function that parses command-line arguments."}]}'
response=$(curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$request")
echo "$response"
python3 -c 'import json,sys; m=json.loads(sys.argv[1])["choices"][0]["message"]; print("\n--- answer ---"); print(m.get("reasoning_content") or "", m.get("content") or "", sep="")' "$response"
kill -TERM $server
wait $server
