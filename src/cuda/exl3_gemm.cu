// EXL3 small-batch GEMM/GEMV kernel (mma.sync m16n8k16, trellis decoded in registers). Contract,
// limits and accuracy: exl3_gemm.h. Launch shape: grid (n/128 column groups, k splits), 256 threads;
// warp w of block (gx, gy) owns output columns [128·gx + 16·w, +16) over the block's k slice.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/exl3_gemm.h"

namespace spw {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxKBlocksPerSplit = 32;  // k slice ≤ 4096 ⇒ ≤ 131 KB of shared memory for 16 rows
constexpr float kHadScale = 0.08838834764831845f;

// Two codebook values (states s0, s1) as one half2 {v0, v1} (spec §2.1; fp16-exact like exllamav3).
template <int CB>
__device__ __forceinline__ uint32_t decode2(uint32_t s0, uint32_t s1) {
  if constexpr (CB == 2) {  // MUL1: bytesum via dp4a lands directly in the fp16 bits of 1024 + b
    uint32_t x0 = s0 * 0x83DCD12Du, x1 = s1 * 0x83DCD12Du;
    uint32_t h = __dp4a(x0, 0x01010101u, 0x64006400u);
    h += __dp4a(x1, 0x01010101u, 0u) << 16;
    const half2 k_inv = __half2half2(__ushort_as_half(0x1EEE)), k_bias = __half2half2(__ushort_as_half(0xC931));
    half2 r = __hfma2(*reinterpret_cast<half2*>(&h), k_inv, k_bias);
    return *reinterpret_cast<uint32_t*>(&r);
  } else {  // 3INST / MCG: (x & 0x8FFF8FFF) ^ 0x3B603B60, then lo + hi half in one fp16 add
    uint32_t x0 = CB == 1 ? s0 * 0xCBAC1FEDu : s0 * 89226354u + 64248484u;
    uint32_t x1 = CB == 1 ? s1 * 0xCBAC1FEDu : s1 * 89226354u + 64248484u;
    x0 = (x0 & 0x8FFF8FFFu) ^ 0x3B603B60u;
    x1 = (x1 & 0x8FFF8FFFu) ^ 0x3B603B60u;
    uint32_t lo = __byte_perm(x0, x1, 0x5410), hi = __byte_perm(x0, x1, 0x7632);
    half2 r = __hadd2(*reinterpret_cast<half2*>(&lo), *reinterpret_cast<half2*>(&hi));
    return *reinterpret_cast<uint32_t*>(&r);
  }
}

__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// In-register normalized Hadamard of 128 floats held as v[e] = element 32e + lane (fp32 butterflies).
__device__ __forceinline__ void had128_warp(float (&v)[4], int lane) {
#pragma unroll
  for (int s = 1; s < 32; s <<= 1)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float o = __shfl_xor_sync(0xffffffffu, v[e], s);
      v[e] = (lane & s) ? o - v[e] : v[e] + o;
    }
  float a = v[0], b = v[1], c = v[2], d = v[3];
  v[0] = a + b; v[1] = a - b; v[2] = c + d; v[3] = c - d;
  a = v[0]; b = v[1]; c = v[2]; d = v[3];
  v[0] = a + c; v[2] = a - c; v[1] = b + d; v[3] = b - d;
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] *= kHadScale;
}

template <int K, int CB, bool M16>
__global__ void __launch_bounds__(kThreads) exl3_gemm_kernel(
    const uint16_t* __restrict__ trellis, const uint16_t* __restrict__ suh, const uint16_t* __restrict__ svh,
    const uint16_t* __restrict__ bias, const float* __restrict__ x, float* __restrict__ y, float* acc,
    uint32_t* counters, int k, int n, int m, int kpb) {
  constexpr int kRows = M16 ? 16 : 8;
  constexpr int kWords = 8 * K;  // uint32 per tile
  extern __shared__ __align__(16) unsigned char smem_raw[];
  half* xs = reinterpret_cast<half*>(smem_raw);
  __shared__ bool is_last;
  const int ld = kpb + 8;  // +8 halves: rows land on distinct banks for the A-fragment loads
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int k0 = blockIdx.y * kpb;
  const int klen = min(kpb, k - k0);

  // 1. xs[row][i] = fp16(had128(x[row][k0 + i] · suh[k0 + i])), rows ≥ m zero.
  const int nblk = klen / 128;
  for (int job = warp; job < kRows * nblk; job += kThreads / 32) {
    const int row = job / nblk, b = job % nblk;
    half* dst = xs + row * ld + b * 128;
    float v[4];
    if (row < m) {
      const float* src = x + static_cast<size_t>(row) * k + k0 + b * 128;
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = src[lane + 32 * e] * __half2float(__ushort_as_half(suh[k0 + b * 128 + lane + 32 * e]));
      had128_warp(v, lane);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) dst[lane + 32 * e] = __float2half_rn(v[e]);
  }
  __syncthreads();

  // 2. This warp's 16-column strip over the k slice.
  const int n_tn = n / 16;
  const int tn = blockIdx.x * 8 + warp;
  const uint32_t* tiles = reinterpret_cast<const uint32_t*>(trellis) + (static_cast<size_t>(k0 / 16) * n_tn + tn) * kWords;
  const size_t tile_stride = static_cast<size_t>(n_tn) * kWords;
  // The lane's 8 states span ring bits [8·lane·K + K − 16, 8·(lane+1)·K): at most 64 bits for K ≤ 6.
  int start = 8 * lane * K + K - 16;
  if (start < 0) start += 256 * K;
  const int wa = start >> 5, off = start & 31;
  const int wb = wa + 1 == kWords ? 0 : wa + 1;
  const int wc = wb + 1 == kWords ? 0 : wb + 1;
  const int t4 = lane & 3, g = lane >> 2;
  float c0[4] = {0.f, 0.f, 0.f, 0.f}, c1[4] = {0.f, 0.f, 0.f, 0.f};
  const int n_tiles = klen / 16;  // multiple of 8
#pragma unroll 1
  for (int it = 0; it < n_tiles; it += 8) {
    uint32_t A[8], B[8], C[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const uint32_t* p = tiles + static_cast<size_t>(it + u) * tile_stride;
      A[u] = __ldg(p + wa);
      B[u] = __ldg(p + wb);
      C[u] = __ldg(p + wc);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const uint32_t hi = __funnelshift_l(B[u], A[u], off), lo = __funnelshift_l(C[u], B[u], off);
      const uint64_t w = (static_cast<uint64_t>(hi) << 32) | lo;
      uint32_t s[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) s[j] = static_cast<uint32_t>(w >> (48 - j * K)) & 0xffffu;
      const uint32_t b00 = decode2<CB>(s[0], s[1]), b01 = decode2<CB>(s[2], s[3]);
      const uint32_t b10 = decode2<CB>(s[4], s[5]), b11 = decode2<CB>(s[6], s[7]);
      const half* xr = xs + g * ld + (it + u) * 16 + 2 * t4;
      const uint32_t a0 = *reinterpret_cast<const uint32_t*>(xr);
      const uint32_t a2 = *reinterpret_cast<const uint32_t*>(xr + 8);
      uint32_t a1 = 0, a3 = 0;
      if constexpr (M16) {
        a1 = *reinterpret_cast<const uint32_t*>(xr + 8 * ld);
        a3 = *reinterpret_cast<const uint32_t*>(xr + 8 * ld + 8);
      }
      mma16816(c0, a0, a1, a2, a3, b00, b01);
      mma16816(c1, a0, a1, a2, a3, b10, b11);
    }
  }

  // 3. Partial sums into the workspace; the last block of this column group finishes it.
  const int col = tn * 16 + 2 * t4;
  if (g < m) {
    atomicAdd(acc + g * n + col, c0[0]);
    atomicAdd(acc + g * n + col + 1, c0[1]);
    atomicAdd(acc + g * n + col + 8, c1[0]);
    atomicAdd(acc + g * n + col + 9, c1[1]);
  }
  if (M16 && g + 8 < m) {
    atomicAdd(acc + (g + 8) * n + col, c0[2]);
    atomicAdd(acc + (g + 8) * n + col + 1, c0[3]);
    atomicAdd(acc + (g + 8) * n + col + 8, c1[2]);
    atomicAdd(acc + (g + 8) * n + col + 9, c1[3]);
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(counters + blockIdx.x, 1u) == gridDim.y - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int row = warp; row < m && row < kRows; row += kThreads / 32) {
    float* a = acc + static_cast<size_t>(row) * n + blockIdx.x * 128;
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = __ldcg(a + lane + 32 * e);
    had128_warp(v, lane);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = blockIdx.x * 128 + lane + 32 * e;
      float r = v[e] * __half2float(__ushort_as_half(svh[c]));
      if (bias) r += __half2float(__ushort_as_half(bias[c]));
      y[static_cast<size_t>(row) * n + c] = r;
      __stcg(a + lane + 32 * e, 0.0f);
    }
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0;
}

using KernelFn = void (*)(const uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*, const float*, float*,
                          float*, uint32_t*, int, int, int, int);

template <int K, int CB>
KernelFn pick(bool m16) {
  return m16 ? exl3_gemm_kernel<K, CB, true> : exl3_gemm_kernel<K, CB, false>;
}

template <int K>
KernelFn pick_cb(int cb, bool m16) {
  return cb == 0 ? pick<K, 0>(m16) : cb == 1 ? pick<K, 1>(m16) : pick<K, 2>(m16);
}

KernelFn pick_kernel(int K, int cb, bool m16) {
  switch (K) {
    case 2: return pick_cb<2>(cb, m16);
    case 3: return pick_cb<3>(cb, m16);
    case 4: return pick_cb<4>(cb, m16);
    case 5: return pick_cb<5>(cb, m16);
    case 6: return pick_cb<6>(cb, m16);
  }
  return nullptr;
}

Error cuda_error(const char* what, cudaError_t e) { return make_error("CUDA ", what, ": ", cudaGetErrorString(e)); }

}  // namespace

bool exl3_cuda_supports(const Exl3CudaTensor& t) {
  return !t.bits.half() && t.bits.ka() >= 2 && t.bits.ka() <= 6 && t.k > 0 && t.n > 0 && t.k % 128 == 0 &&
         t.n % 128 == 0 && t.trellis && t.suh && t.svh;
}

Status exl3_cuda_workspace_alloc(Exl3CudaWorkspace& ws, int64_t max_n) {
  const size_t acc_bytes = sizeof(float) * 16 * max_n, cnt_bytes = sizeof(uint32_t) * (max_n / 128 + 1);
  if (cudaError_t e = cudaMalloc(&ws.acc, acc_bytes); e != cudaSuccess) return cuda_error("malloc workspace", e);
  if (cudaError_t e = cudaMalloc(&ws.counters, cnt_bytes); e != cudaSuccess) return cuda_error("malloc workspace", e);
  if (cudaError_t e = cudaMemset(ws.acc, 0, acc_bytes); e != cudaSuccess) return cuda_error("memset workspace", e);
  if (cudaError_t e = cudaMemset(ws.counters, 0, cnt_bytes); e != cudaSuccess) return cuda_error("memset workspace", e);
  ws.capacity_n = max_n;
  return {};
}

void exl3_cuda_workspace_free(Exl3CudaWorkspace& ws) {
  cudaFree(ws.acc);
  cudaFree(ws.counters);
  ws = {};
}

Status exl3_gemm_cuda(const Exl3CudaTensor& t, const float* x, int64_t m, float* y, Exl3CudaWorkspace& ws, void* stream) {
  if (!exl3_cuda_supports(t))
    return make_error("exl3_gemm_cuda: unsupported tensor (K=", t.bits.k_x2 / 2.0, " ", exl3_codebook_name(t.codebook),
                      " k=", t.k, " n=", t.n, "); supported: integer K 2..6, k and n multiples of 128");
  if (ws.capacity_n < t.n) return make_error("exl3_gemm_cuda: workspace holds ", ws.capacity_n, " columns, tensor has ", t.n);
  if (m < 1) return make_error("exl3_gemm_cuda: m=", m);
  static int n_sms = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 1;
  }();
  const int64_t n_groups = t.n / 128, k_blocks = t.k / 128;
  int64_t splits = std::min<int64_t>(k_blocks, std::max<int64_t>(1, (4 * n_sms + n_groups - 1) / n_groups));
  int64_t per = std::min<int64_t>(kMaxKBlocksPerSplit, (k_blocks + splits - 1) / splits);
  splits = (k_blocks + per - 1) / per;
  const int kpb = static_cast<int>(per * 128);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  for (int64_t c = 0; c < m; c += 16) {
    const int mc = static_cast<int>(std::min<int64_t>(16, m - c));
    const bool m16 = mc > 8;
    KernelFn fn = pick_kernel(t.bits.ka(), static_cast<int>(t.codebook), m16);
    const size_t smem = sizeof(half) * (m16 ? 16 : 8) * (kpb + 8);
    if (smem > 48 * 1024) {
      if (cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
          e != cudaSuccess)
        return cuda_error("set shared memory", e);
    }
    fn<<<dim3(static_cast<unsigned>(n_groups), static_cast<unsigned>(splits)), kThreads, smem, s>>>(
        t.trellis, t.suh, t.svh, t.bias, x + c * t.k, y + c * t.n, ws.acc, ws.counters, static_cast<int>(t.k),
        static_cast<int>(t.n), mc, kpb);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch exl3_gemm_kernel", e);
  }
  return {};
}

}  // namespace spw
