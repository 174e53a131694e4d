// rope_apply and rope_apply_rounded (contract in rope.h): one thread per (vector, channel pair); the
// rounded form's pairs span the whole vector, the plain form's only the rotated channels.
#include "cuda/ops/device_numerics.cuh"
#include "cuda/ops/rope.h"
#include "cuda/launch.h"

namespace spw::cuda {
namespace {

constexpr int kThreads = 256;

// Pairs [first, d/2) of every vector: those below the rotated channels are only rounded (when asked); pair
// i of the rotated ones is bf16-rounded first when round_in, rotated, and rounded when round_out.
__global__ void rope_apply_kernel(float* x, int64_t n_vectors, int64_t d, int half, int first, const float* freqs,
                                  const int64_t* positions, int64_t vectors_per_pos, bool inverse, bool round_in,
                                  bool round_out) {
  pdl_enter();
  // Pair p < first_rope covers channels 2p, 2p + 1 (d even); rotated pair i = p − first_rope covers channels
  // d − 2·half + 2i and the next (d may be odd when nothing is rounded).
  const int first_rope = int((d - 2 * half) / 2), pairs = first_rope + half - first;
  const int64_t job = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (job >= n_vectors * pairs) return;
  const int64_t v = job / pairs;
  const int p = first + int(job % pairs);
  if (p < first_rope) {  // only reached when rounding: the reference's to_activation of the whole vector
    float* r = x + v * d + 2 * p;
    r[0] = dev::round_bf16(r[0]), r[1] = dev::round_bf16(r[1]);
    return;
  }
  const int i = p - first_rope;
  float* r = x + v * d + (d - 2 * half) + 2 * i;
  const float angle = float(positions[v / vectors_per_pos]) * freqs[i];
  const float c = dev::cos_f32(angle);
  float s = dev::sin_f32(angle);
  if (inverse) s = -s;
  float a = r[0], b = r[1];
  if (round_in) a = dev::round_bf16(a), b = dev::round_bf16(b);
  float u = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)), w = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  if (round_out) u = dev::round_bf16(u), w = dev::round_bf16(w);
  r[0] = u, r[1] = w;
}

}  // namespace

Status rope_apply_rounded(float* x, int64_t n_vectors, int64_t d, int d_rope, const float* freqs,
                          const int64_t* positions, int64_t vectors_per_pos, bool inverse, bool round_in,
                          bool round_out, cudaStream_t stream) {
  if (d_rope <= 0 || d_rope % 2 != 0 || d_rope > d)
    return make_error("rope_apply: d_rope ", d_rope, " must be even and within the vector width ", d);
  if (vectors_per_pos <= 0 || n_vectors % vectors_per_pos != 0)
    return make_error("rope_apply: ", n_vectors, " vectors are not a multiple of ", vectors_per_pos, " per position");
  const bool rounds = round_in || round_out;
  if (rounds && d % 2 != 0) return make_error("rope_apply: rounding needs an even vector width, got ", d);
  if (n_vectors <= 0) return {};
  const int half = d_rope / 2;
  // Without rounding only the rotated pairs; with it every pair of the (even) vector, the unrotated ones rounded alone.
  const int first_rope = int((d - 2 * half) / 2), first = rounds ? 0 : first_rope;
  const int64_t pairs = first_rope + half - first;
  launch(rope_apply_kernel, grid_for(n_vectors * pairs, kThreads), kThreads, 0, stream, x, n_vectors, d, half, first,
         freqs, positions, vectors_per_pos, inverse, round_in, round_out);
  return launch_status("rope_apply_kernel");
}

Status rope_apply(float* x, int64_t n_vectors, int64_t d, int d_rope, const float* freqs, const int64_t* positions,
                  int64_t vectors_per_pos, bool inverse, cudaStream_t stream) {
  return rope_apply_rounded(x, n_vectors, d, d_rope, freqs, positions, vectors_per_pos, inverse, false, false, stream);
}

}  // namespace spw::cuda
