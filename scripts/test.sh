#!/usr/bin/env bash
# Builds Spillway and runs every CPU test: unit tests and the golden suite (no Python needed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc 2>/dev/null || echo 2)"
