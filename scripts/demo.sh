#!/usr/bin/env bash
# The main job: `spillway serve` on the bundled demo model (models/demo, a small trained model of
# the V4.1 architecture), answering one OpenAI chat request, then shutting down cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh > /tmp/spillway-build.log 2>&1 || { tail -30 /tmp/spillway-build.log; exit 1; }
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
