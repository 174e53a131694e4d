#!/usr/bin/env bash
# Static kernel report (registers, spills, SASS size and opcode mix) of a CUDA build, no GPU needed.
#   bash tools/profile/sass_report.sh BUILD_DIR [--filter SUBSTRING]
# Uses the toolkit's cuobjdump when there is one, else installs it from PyPI into .venv-sass
# (nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm, which -sass needs; pinned below). See tools/profile/sass_report.py for what it prints and why.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [--filter SUBSTRING]" >&2; exit 2; }
BUILD=$1; shift
CUOBJDUMP=${CUOBJDUMP:-}
if [ -z "$CUOBJDUMP" ]; then
  for c in "$(command -v cuobjdump || true)" /usr/local/cuda/bin/cuobjdump .venv-sass/bin/cuobjdump; do
    [ -n "$c" ] && [ -x "$c" ] && { CUOBJDUMP=$c; break; }
  done
fi
if [ -z "$CUOBJDUMP" ]; then
  echo "sass_report: no cuobjdump in the toolkit; installing it from PyPI into .venv-sass" >&2
  python3 -m venv .venv-sass
  .venv-sass/bin/pip install -q "nvidia-cuda-cuobjdump==13.5.37" "nvidia-cuda-nvdisasm==13.5.37"
  for tool in cuobjdump nvdisasm; do
    bin=$(find .venv-sass -path "*nvidia*/bin/$tool" | head -1)
    [ -n "$bin" ] || { echo "sass_report: the wheels hold no $tool" >&2; exit 1; }
    chmod +x "$bin"
    ln -sf "$PWD/$bin" ".venv-sass/bin/$tool"
  done
  CUOBJDUMP=.venv-sass/bin/cuobjdump
fi
# cuobjdump -sass runs nvdisasm from PATH.
PATH="$(dirname "$CUOBJDUMP"):$PATH" exec python3 tools/profile/sass_report.py --cuobjdump "$CUOBJDUMP" "$BUILD" "$@"
