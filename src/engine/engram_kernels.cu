#include "engine/engram_kernels.h"

#include "cuda/ops/device_numerics.cuh"
#include "cuda/launch.h"

namespace spw::engine {
namespace {

namespace dev = cuda::dev;
constexpr int kThreads = 256;

__global__ void engram_gather_kernel(const uint8_t* table, const uint8_t* scale, const int64_t* row_ids,
                                     int64_t n_rows, int hd, float* out) {
  cuda::pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * hd) return;
  const int64_t r = i / hd, ch = i % hd, row = row_ids[r];
  out[i] = __fmul_rn(dev::e4m3_to_f32(table[row * hd + ch]), dev::e8m0_to_f32(scale[row * (hd / 32) + ch / 32]));
}

// One block per (token, stream): the three f64 sums are block reductions (tree order where the
// reference sums sequentially; each term is exact or rounded once in f64, so the f32 results differ
// only on rare f64 ties), then the block updates the stream. The first version (one thread per
// (token, stream) walking d channels) took 725 µs per decode call on the H200.
__global__ void __launch_bounds__(kThreads)
    engram_gate_kernel(float* streams, const float* kv, const float* qk, int hc, int64_t d, float norm_eps,
                       bool round_bf16) {
  cuda::pdl_enter();
  __shared__ double scratch[32];
  const int64_t tj = blockIdx.x;
  const int64_t t = tj / hc, j = tj % hc;
  float* x = streams + tj * d;
  const float* key = kv + (t * (hc + 1) + j) * d;
  const float* value = kv + (t * (hc + 1) + hc) * d;
  const float* w = qk + j * d;
  double sx = 0, sk = 0, dot = 0;
  for (int64_t ch = threadIdx.x; ch < d; ch += blockDim.x) {
    const double xv = x[ch], kvv = key[ch];
    sx = __dadd_rn(sx, __dmul_rn(xv, xv));
    sk = __dadd_rn(sk, __dmul_rn(kvv, kvv));
    dot = __dadd_rn(dot, __dmul_rn(__dmul_rn(xv, double(w[ch])), kvv));
  }
  sx = dev::block_sum(sx, scratch);
  sk = dev::block_sum(sk, scratch);
  dot = dev::block_sum(dot, scratch);
  const float df = float(d);
  const float rx = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(float(sx / double(d)), norm_eps)));
  const float rk = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(float(sk / double(d)), norm_eps)));
  const float inv_sqrt_d = __fdiv_rn(1.0f, __fsqrt_rn(df));
  const float g = __fmul_rn(__fmul_rn(__fmul_rn(float(dot), rx), rk), inv_sqrt_d);
  const float sign = float((g > 0.f) - (g < 0.f));
  const float gate = dev::sigmoid(__fmul_rn(sign, __fsqrt_rn(dev::max_std(fabsf(g), 1e-6f))));
  for (int64_t ch = threadIdx.x; ch < d; ch += blockDim.x) {
    const float v = __fadd_rn(x[ch], __fmul_rn(gate, value[ch]));
    x[ch] = round_bf16 ? dev::round_bf16(v) : v;
  }
}

}  // namespace

Status engram_gather_cuda(const uint8_t* table, const uint8_t* scale, const int64_t* row_ids, int64_t n_rows,
                          int head_dim, float* out, cudaStream_t stream) {
  if (n_rows == 0) return {};
  if (head_dim % 32 != 0) return make_error("engram_gather_cuda: head_dim ", head_dim, " is not a multiple of 32");
  cuda::launch(engram_gather_kernel, cuda::grid_for(n_rows * head_dim, kThreads), kThreads, 0, stream, table, scale, row_ids,
                                                                                             n_rows, head_dim, out);
  return cuda::launch_status("engram_gather_cuda");
}

Status engram_gate_cuda(float* streams, const float* kv, const float* qk, int64_t n_tokens, int hc, int64_t d,
                        float norm_eps, bool round_bf16, cudaStream_t stream) {
  if (n_tokens == 0) return {};
  if (n_tokens * hc > INT32_MAX) return make_error("engram_gate_cuda: ", n_tokens, " tokens exceed the grid");
  cuda::launch(engram_gate_kernel, unsigned(n_tokens * hc), kThreads, 0, stream, streams, kv, qk, hc, d, norm_eps, round_bf16);
  return cuda::launch_status("engram_gate_cuda");
}

}  // namespace spw::engine
