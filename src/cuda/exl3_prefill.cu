// EXL3 prefill: decode once into fp16, cuBLAS GEMM, output rotation. Contract: exl3_prefill.h.
#include "cuda/exl3_prefill.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/exl3_device.cuh"

namespace spw {
namespace {

using namespace exl3dev;

constexpr int kThreads = 256;

// One warp per 16×16 tile: a lane's 8 decoded positions (tile_mma's A fragment) are written to
// Ŵᵀ [n][k] as four fp16 pairs, each pair two consecutive k of one column.
template <int K, int CB>
__global__ void __launch_bounds__(kThreads) exl3_decode_t_kernel(const uint16_t* __restrict__ trellis, __half* w_t,
                                                                 int k, int n) {
  constexpr int kWords = 8 * K;
  const int n_tn = n / 16, n_tiles = (k / 16) * n_tn;
  const int tile = blockIdx.x * (kThreads / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (tile >= n_tiles) return;
  const int kt = tile / n_tn, tn = tile % n_tn;
  const uint32_t* tw = reinterpret_cast<const uint32_t*>(trellis) + static_cast<size_t>(tile) * kWords;
  const LaneWindow lw = lane_window<K>(lane);
  uint32_t s[8];
  lane_states<K>(__ldg(tw + lw.wa), __ldg(tw + lw.wb), __ldg(tw + lw.wc), lw.off, s);
  const int t4 = lane & 3, g = lane >> 2;
  const size_t col = static_cast<size_t>(tn) * 16 + g, k0 = static_cast<size_t>(kt) * 16 + 2 * t4;
  uint32_t* row_g = reinterpret_cast<uint32_t*>(w_t + col * k + k0);
  uint32_t* row_g8 = reinterpret_cast<uint32_t*>(w_t + (col + 8) * k + k0);
  row_g[0] = decode2<CB>(s[0], s[1]);
  row_g[4] = decode2<CB>(s[2], s[3]);  // k0 + 8
  row_g8[0] = decode2<CB>(s[4], s[5]);
  row_g8[4] = decode2<CB>(s[6], s[7]);
}

// y[row][·] = had128(y[row][·]) ∘ svh + bias, in place; one warp per (row, 128-block).
__global__ void __launch_bounds__(kThreads) exl3_rotate_out_kernel(float* y, const uint16_t* __restrict__ svh,
                                                                   const uint16_t* __restrict__ bias, int n,
                                                                   int64_t m) {
  const int64_t job = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  const int nblk = n / 128, lane = threadIdx.x & 31;
  if (job >= m * nblk) return;
  const int64_t row = job / nblk;
  const int b = static_cast<int>(job % nblk);
  float* p = y + row * n + b * 128;
  float v[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] = p[lane + 32 * e];
  had128_warp(v, lane);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int c = b * 128 + lane + 32 * e;
    float r = v[e] * __half2float(__ushort_as_half(svh[c]));
    if (bias) r += __half2float(__ushort_as_half(bias[c]));
    p[lane + 32 * e] = r;
  }
}

using DecodeKernel = void (*)(const uint16_t*, __half*, int, int);
template <int K>
DecodeKernel pick_cb(int cb) {
  return cb == 0 ? exl3_decode_t_kernel<K, 0> : cb == 1 ? exl3_decode_t_kernel<K, 1> : exl3_decode_t_kernel<K, 2>;
}
DecodeKernel pick_decode(int K, int cb) {
  switch (K) {
    case 2: return pick_cb<2>(cb);
    case 3: return pick_cb<3>(cb);
    case 4: return pick_cb<4>(cb);
    case 5: return pick_cb<5>(cb);
    case 6: return pick_cb<6>(cb);
  }
  return nullptr;
}

Error cuda_error(const char* what, cudaError_t e) { return make_error("CUDA ", what, ": ", cudaGetErrorString(e)); }
Error cublas_error(const char* what, cublasStatus_t s) { return make_error("cuBLAS ", what, ": status ", int(s)); }

unsigned blocks_for(int64_t warps) { return static_cast<unsigned>((warps + kThreads / 32 - 1) / (kThreads / 32)); }

}  // namespace

Status exl3_prefill_workspace_alloc(Exl3PrefillWorkspace& ws, int64_t max_k, int64_t max_n, int64_t max_m) {
  if (cudaError_t e = cudaMalloc(&ws.w_t, sizeof(uint16_t) * max_k * max_n); e != cudaSuccess)
    return cuda_error("malloc prefill workspace", e);
  if (cudaError_t e = cudaMalloc(&ws.xr, sizeof(uint16_t) * max_k * max_m); e != cudaSuccess)
    return cuda_error("malloc prefill workspace", e);
  cublasHandle_t h = nullptr;
  if (cublasStatus_t s = cublasCreate(&h); s != CUBLAS_STATUS_SUCCESS) return cublas_error("create", s);
  ws.cublas = h;
  ws.capacity_k = max_k, ws.capacity_n = max_n, ws.capacity_m = max_m;
  return {};
}

void exl3_prefill_workspace_free(Exl3PrefillWorkspace& ws) {
  cudaFree(ws.w_t);
  cudaFree(ws.xr);
  if (ws.cublas) cublasDestroy(static_cast<cublasHandle_t>(ws.cublas));
  ws = {};
}

Status exl3_decode_transposed_cuda(const Exl3CudaTensor& t, uint16_t* w_t, void* stream) {
  if (!exl3_cuda_supports(t))
    return make_error("exl3_decode_transposed_cuda: unsupported tensor (K=", t.bits.k_x2 / 2.0, " k=", t.k, " n=", t.n,
                      ")");
  DecodeKernel fn = pick_decode(t.bits.ka(), static_cast<int>(t.codebook));
  fn<<<blocks_for((t.k / 16) * (t.n / 16)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      t.trellis, reinterpret_cast<__half*>(w_t), static_cast<int>(t.k), static_cast<int>(t.n));
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch exl3_decode_t_kernel", e);
  return {};
}

Status exl3_prefill_cuda(const Exl3CudaTensor& t, const float* x, int64_t m, float* y, Exl3PrefillWorkspace& ws,
                         void* stream) {
  if (!exl3_cuda_supports(t))
    return make_error("exl3_prefill_cuda: unsupported tensor (K=", t.bits.k_x2 / 2.0, " ",
                      exl3_codebook_name(t.codebook), " k=", t.k, " n=", t.n,
                      "); supported: integer K 2..6, k and n multiples of 128");
  if (m < 1 || m > ws.capacity_m || t.k > ws.capacity_k || t.n > ws.capacity_n)
    return make_error("exl3_prefill_cuda: workspace holds k=", ws.capacity_k, " n=", ws.capacity_n, " m=", ws.capacity_m,
                      ", call needs k=", t.k, " n=", t.n, " m=", m);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (Status st = exl3_decode_transposed_cuda(t, ws.w_t, stream); !st.ok()) return st;
  const int k = static_cast<int>(t.k), n = static_cast<int>(t.n);
  if (Status st = exl3_rotate_rows_cuda(x, t.suh, ws.xr, k, m, stream); !st.ok()) return st;
  // Column-major view: zᵀ [n, m] = (Ŵᵀ stored [n][k], i.e. Ŵ col-major k×n)ᵀ · (xr stored [m][k] = col-major k×m).
  cublasHandle_t h = static_cast<cublasHandle_t>(ws.cublas);
  if (cublasStatus_t st = cublasSetStream(h, s); st != CUBLAS_STATUS_SUCCESS) return cublas_error("set stream", st);
  const float one = 1.0f, zero = 0.0f;
  if (cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, static_cast<int>(m), k, &one, ws.w_t, CUDA_R_16F,
                                       k, ws.xr, CUDA_R_16F, k, &zero, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT);
      st != CUBLAS_STATUS_SUCCESS)
    return cublas_error("GemmEx", st);
  exl3_rotate_out_kernel<<<blocks_for(m * (n / 128)), kThreads, 0, s>>>(y, t.svh, t.bias, n, m);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch exl3_rotate_out_kernel", e);
  return {};
}

}  // namespace spw
