#!/usr/bin/env bash
# Sourced from the repository root by the device scripts that run the staged binaries (scripts/gpu_test.sh stage):
# unpacks .exl3pack/dev.tar.xz, links the tests' fixture path (scripts/link_build_path.sh), puts the staged and
# CUDA libraries on LD_LIBRARY_PATH, and sets B to the directory of the staged binaries.
[ -f .exl3pack/dev.tar.xz ] && tar xJf .exl3pack/dev.tar.xz
. scripts/link_build_path.sh
export LD_LIBRARY_PATH=$PWD/.exl3dev/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=$PWD/.exl3dev
