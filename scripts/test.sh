#!/usr/bin/env bash
# Builds Spillway and runs every CPU test: the C++ suites (unit + golden, no Python needed), then
# the Python suites in tests/python (tokenizer vs `tokenizers`, server vs the openai SDK), whose
# tools are pip-installed into .venv-test from tests/python/requirements.txt.
set -euo pipefail
shopt -s globstar
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc 2>/dev/null || echo 2)"

if compgen -G "tests/python/**/test_*.py" > /dev/null || compgen -G "tests/python/test_*.py" > /dev/null; then
  if [[ ! -x .venv-test/bin/pytest ]]; then
    python3 -m venv .venv-test
    .venv-test/bin/pip install -q -r tests/python/requirements.txt
  fi
  SPILLWAY_BIN="$PWD/build/bin/spillway" .venv-test/bin/pytest -q tests/python
fi
