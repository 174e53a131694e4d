#!/usr/bin/env bash
# Installs everything Spillway needs to build and test on a fresh Debian 12 machine.
# Idempotent and quiet unless something fails. Debian packages only (see README "Dependencies" for why each one).
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
  libpng-dev                  # image inputs: PNG decoding (src/vision)
  libturbojpeg0-dev           # image inputs: JPEG decoding through TurboJPEG (libjpeg-turbo)
  libwebp-dev                 # image inputs: WebP decoding, stills and animations (libwebp, libwebpdemux)
  libgif-dev                  # image inputs: GIF decoding, first frame (giflib)
  python3 python3-venv        # tools/ scripts; pytest suites run in .venv-test (scripts/test.sh)
  curl                        # scripts/demo.sh talks to the server
  haproxy                     # load balancer in front of serve replicas (deploy/haproxy, scripts/replicas.sh, its test)
)
if [[ "${SPILLWAY_SETUP_FUZZ:-0}" == 1 ]]; then
  packages+=(clang libclang-rt-14-dev)  # libFuzzer runtime for scripts/fuzz.sh
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  # apt's output goes to a log, shown only when a step fails.
  log=$(mktemp /tmp/spillway-setup.XXXXXX.log)
  echo "setup: installing ${#missing[@]} Debian packages (${missing[*]})"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  if ! { "${sudo_cmd[@]}" apt-get update -q &&
         DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}"; } > "$log" 2>&1; then
    cat "$log" >&2
    echo "setup: apt-get failed (output above, also in $log)" >&2
    exit 1
  fi
  rm -f "$log"
fi
