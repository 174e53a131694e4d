#!/usr/bin/env bash
# Installs everything Spillway needs to build and test on a fresh Debian 12 machine.
# Idempotent. Debian packages only (see README "Dependencies" for why each one).
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libgtest-dev libgmock-dev   # tests
  nlohmann-json3-dev          # JSON (configs, safetensors headers)
  libcli11-dev                # command-line parsing
  libspdlog-dev libfmt-dev    # logging
  libpcre2-dev                # the tokenizer's pre-tokenizer regexes (Unicode properties, lookahead)
  libicu-dev                  # tokenizer: Unicode normalization and properties (Engram map, NFC/NFKC)
  libcpp-httplib-dev          # HTTP server (SSE streaming, keep-alive)
  python3 python3-venv        # tools/ scripts; pytest suites run in .venv-test (scripts/test.sh)
  curl                        # scripts/demo.sh talks to the server
)
if [[ "${SPILLWAY_SETUP_FUZZ:-0}" == 1 ]]; then
  packages+=(clang libclang-rt-14-dev)  # libFuzzer runtime for scripts/fuzz.sh
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi
