// rope_apply (contract in rope.h): one thread per (vector, channel pair).
#include "cuda/ops/device_numerics.cuh"
#include "cuda/ops/rope.h"
#include "cuda/launch.h"

namespace spw::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rope_apply_kernel(float* x, int64_t n_vectors, int64_t d, int half, const float* freqs,
                                  const int64_t* positions, int64_t vectors_per_pos, bool inverse) {
  pdl_enter();
  const int64_t job = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (job >= n_vectors * half) return;
  const int64_t v = job / half;
  const int i = int(job % half);
  const float angle = float(positions[v / vectors_per_pos]) * freqs[i];
  const float c = dev::cos_f32(angle);
  float s = dev::sin_f32(angle);
  if (inverse) s = -s;
  float* r = x + v * d + (d - 2 * half) + 2 * i;
  const float a = r[0], b = r[1];
  r[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  r[1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}

}  // namespace

Status rope_apply(float* x, int64_t n_vectors, int64_t d, int d_rope, const float* freqs, const int64_t* positions,
                  int64_t vectors_per_pos, bool inverse, cudaStream_t stream) {
  if (d_rope <= 0 || d_rope % 2 != 0 || d_rope > d)
    return make_error("rope_apply: d_rope ", d_rope, " must be even and within the vector width ", d);
  if (vectors_per_pos <= 0 || n_vectors % vectors_per_pos != 0)
    return make_error("rope_apply: ", n_vectors, " vectors are not a multiple of ", vectors_per_pos, " per position");
  if (n_vectors <= 0) return {};
  const int half = d_rope / 2;
  launch(rope_apply_kernel, grid_for(n_vectors * half, kThreads), kThreads, 0, stream, x, n_vectors, d, half, freqs,
                                                                                    positions, vectors_per_pos, inverse);
  return launch_status("rope_apply_kernel");
}

}  // namespace spw::cuda
