#!/usr/bin/env bash
# After run_all.sh on the GPU: assemble models/demo from the files it left in its $OUT, then evaluate locally.
#   tools/demo_model/finish.sh <device_out_dir> [EVERY]
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=$1
EVERY=${2:-25}
PY=${PYTHON:-.venv-golden/bin/python}
steps=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['result']['steps'])" "$SRC/train_log.json")
seed=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['result']['seed'])" "$SRC/train_log.json")
$PY tools/demo_model/export.py merge "$SRC" models/demo "$seed" "$steps"
$PY - <<'PYEOF'
import json, os, sys
sys.path.insert(0, "tools/demo_model")
from config import make_config
from train import load_token_map
tj = json.load(open("models/demo/tokenizer.json", encoding="utf-8"))
vocab = 1 + max(list(tj["model"]["vocab"].values()) + [t["id"] for t in tj["added_tokens"]])
img = next(t["id"] for t in tj["added_tokens"] if t["content"] == "<｜deepseek_image｜>")
cfg = make_config(vocab, int(load_token_map("models/demo").max()) + 1, img)
with open("models/demo/config.json", "w") as f:
    json.dump(cfg, f, indent=2)
    f.write("\n")
PYEOF
cp "$SRC/train_log.json" models/demo/train_log.json
$PY tools/demo_model/make_fixture.py models/demo tests/golden/fixtures/demo
$PY tools/demo_model/eval_oracle.py models/demo --every "$EVERY" --out models/demo/routing_stats.json
