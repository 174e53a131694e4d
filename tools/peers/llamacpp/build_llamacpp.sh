#!/usr/bin/env bash
# Configure and build llama.cpp's CUDA binaries for the H200 (sm_90), here or on the GPU machine.
#   bash tools/peers/llamacpp/build_llamacpp.sh SRC BUILD [JOBS]
# SRC: a llama.cpp tree (fetch_sdist.sh's vendor/llama.cpp, or the trimmed copy stage.sh packs);
# BUILD: the build directory (here: /work/llama-build).
# Static llama/ggml libraries, so the binaries need only the system's libstdc++/libgomp and CUDA's
# libcudart/libcublas at run time (stage.sh copies the first three; cuBLAS is the GPU machine's own).
# NCCL off (one GPU; and the GPU machine's NCCL would be a second runtime dependency).
set -euo pipefail
SRC=$1
BUILD=$2
JOBS=${3:-$(nproc)}
cmake -S "$SRC" -B "$BUILD" -G Ninja \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_NATIVE=OFF -DGGML_CUDA_NCCL=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD" -j "$JOBS" --target llama-bench llama-batched-bench llama-simple
ls -la "$BUILD"/bin/llama-bench "$BUILD"/bin/llama-batched-bench "$BUILD"/bin/llama-simple
