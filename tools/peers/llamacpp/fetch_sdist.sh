#!/usr/bin/env bash
# Fetch llama.cpp the way issue 7 asks: the `llama-cpp-python` source package from PyPI (it vendors
# llama.cpp under vendor/llama.cpp), downloaded with pip in a throw-away venv, then unpacked.
#   bash tools/peers/llamacpp/fetch_sdist.sh [DEST]      # DEST defaults to /tmp/llcpp
# Result: DEST/llama_cpp_python-0.3.36/vendor/llama.cpp (the tree build_llamacpp.sh builds).
# The sdist we used: 76,589,250 bytes, sha256 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e.
set -euo pipefail
VER=0.3.36
DEST=${1:-/tmp/llcpp}
mkdir -p "$DEST"
cd "$DEST"
if [ ! -f llama_cpp_python-$VER.tar.gz ]; then
  [ -x venv/bin/pip ] || python3 -m venv venv
  # --no-build-isolation needs the build backend in the venv (pip would otherwise build metadata in an isolated env).
  venv/bin/pip install -q scikit-build-core
  venv/bin/pip download --no-deps --no-binary :all: --no-build-isolation -d . llama-cpp-python==$VER
fi
sha256sum llama_cpp_python-$VER.tar.gz
[ -d llama_cpp_python-$VER/vendor/llama.cpp/src ] || tar xzf llama_cpp_python-$VER.tar.gz
echo "llama.cpp tree: $DEST/llama_cpp_python-$VER/vendor/llama.cpp"
