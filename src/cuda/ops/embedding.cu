// embedding_gather (contract in embedding.h): one thread per output element.
#include "cuda/ops/device_numerics.cuh"
#include "cuda/ops/embedding.h"
#include "cuda/launch.h"

namespace spw::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void embedding_gather_kernel(const float* table, int64_t vocab, int64_t d, const int32_t* tokens,
                                        int64_t n_tokens, int n_copies, float* out) {
  pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tokens * n_copies * d) return;
  const int64_t t = i / (n_copies * d), c = i % d;
  const int32_t id = tokens[t];
  out[i] = (id >= 0 && id < vocab) ? table[int64_t(id) * d + c] : __int_as_float(0x7fc00000);
}

}  // namespace

Status embedding_gather(const float* table, int64_t vocab, int64_t d, const int32_t* tokens, int64_t n_tokens,
                        int n_copies, float* out, cudaStream_t stream) {
  if (d <= 0 || n_copies <= 0) return make_error("embedding_gather: d ", d, " and n_copies ", n_copies, " must be positive");
  if (n_tokens <= 0) return {};
  const int64_t n = n_tokens * n_copies * d;
  launch(embedding_gather_kernel, grid_for(n, kThreads), kThreads, 0, stream, table, vocab, d, tokens, n_tokens, n_copies,
                                                                           out);
  return launch_status("embedding_gather_kernel");
}

}  // namespace spw::cuda
