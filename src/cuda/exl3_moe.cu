// Fused EXL3 MoE decode: one cooperative launch per layer. Contract, limits and accuracy: exl3_moe.h.
//
// Work is a flat list of warp jobs per phase, walked grid-stride by every warp of a grid sized to be
// fully resident; cooperative_groups' grid barrier separates the phases:
//   A  rotate: (pair, gate|up, 128-block of d)         xr_gu[p][q] = fp16(had(x[t] ∘ suh_q))
//   B  gate/up: (pair, gate|up, 16-col strip of f, k-chunk)   acc_gu[p][q] += partial x·Ŵ
//   C  SwiGLU: (pair, 128-block of f)                  h = swiglu(had(acc)·svh + b); xr_d[p] = fp16(had(h ∘ suh_2))
//   D  down: (pair, 16-col strip of d, k-chunk)        acc_d[p] += partial h·Ŵ2
//   E  combine: (token, 128-block of d)                y[t] = Σ_j (w_tj · had(acc_d[p])·svh_2 + b_2)
// Accumulators are zeroed by the phase that consumes them, so the workspace stays clean for the
// next call without a memset.
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/exl3_device.cuh"
#include "cuda/exl3_moe.h"

namespace spw {
namespace {

namespace cg = cooperative_groups;
using namespace exl3dev;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct MoeArgs {
  const Exl3CudaExpert* experts;
  const float* x;
  const int32_t* idx;
  const float* weights;
  float* y;
  __half* xr_gu;   // [P][2][d]
  __half* xr_d;    // [P][f]
  float* acc_gu;   // [P][2][f]
  float* acc_d;    // [P][d]
  int T, topk, d, f;
  int chunk_b, chunk_d;  // k-tiles per job in phases B and D
  float limit;
};

__device__ __forceinline__ float h2f(const uint16_t* p, int i) { return __half2float(__ushort_as_half(p[i])); }

__device__ __forceinline__ float silu(float v) { return v / (1.0f + __expf(-v)); }

// Adds this warp's token-0 strip result (tile accumulators, exl3_device.cuh: tile_mma; token 0 sits in
// lanes with t4 = 0: column g in c[0], column g + 8 in c[2]) to acc.
__device__ __forceinline__ void add_row0(float* acc, int col0, const float (&c)[4], int lane) {
  if ((lane & 3) != 0) return;
  const int col = col0 + (lane >> 2);
  atomicAdd(acc + col, c[0]);
  atomicAdd(acc + col + 8, c[2]);
}

template <int K, int CB>
__global__ void __launch_bounds__(kThreads, 3) exl3_moe_kernel(MoeArgs a) {
  constexpr int kWords = 8 * K;
  extern __shared__ __align__(16) uint32_t ring_smem[];
  const int lane = threadIdx.x & 31;
  __shared__ __align__(8) uint64_t bars[kWarps][kStages];
  WarpRing ring{ring_smem + (threadIdx.x >> 5) * (ring_bytes<K>() / 4), bars[threadIdx.x >> 5], 0};
  warp_ring_init(ring, lane);
  const int warp0 = blockIdx.x * kWarps + (threadIdx.x >> 5), n_warps = gridDim.x * kWarps;
  const int P = a.T * a.topk, d = a.d, f = a.f;
  const int dblk = d / 128, fblk = f / 128, d_tn = d / 16, f_tn = f / 16, d_kt = d / 16, f_kt = f / 16;
  cg::grid_group grid = cg::this_grid();

  // A: rotate x[t] by the gate and up suh of each selected expert.
  for (int job = warp0; job < P * 2 * dblk; job += n_warps) {
    const int p = job / (2 * dblk), q = (job / dblk) % 2, b = job % dblk;
    const int e = a.idx[p];
    if (e < 0) continue;
    const Exl3CudaExpert& ex = a.experts[e];
    rotate_block(a.x + static_cast<size_t>(p / a.topk) * d + b * 128, ex.suh[q] + b * 128,
                 a.xr_gu + (static_cast<size_t>(p) * 2 + q) * d + b * 128, lane);
  }
  grid.sync();

  // B: gate/up partial products.
  const int kc_b = (d_kt + a.chunk_b - 1) / a.chunk_b;
  for (int job = warp0; job < P * 2 * f_tn * kc_b; job += n_warps) {
    const int kc = job % kc_b, tn = (job / kc_b) % f_tn, q = (job / (kc_b * f_tn)) % 2, p = job / (kc_b * f_tn * 2);
    const int e = a.idx[p];
    if (e < 0) continue;
    const int kt0 = kc * a.chunk_b, nt = min(a.chunk_b, d_kt - kt0);
    const uint32_t* tiles = reinterpret_cast<const uint32_t*>(a.experts[e].trellis[q]) +
                            (static_cast<size_t>(kt0) * f_tn + tn) * kWords;
    float c_lo[4] = {0.f, 0.f, 0.f, 0.f}, c_hi[4] = {0.f, 0.f, 0.f, 0.f};
    strip_mma<K, CB, false, true>(tiles, static_cast<size_t>(f_tn) * kWords, nt,
                                  a.xr_gu + (static_cast<size_t>(p) * 2 + q) * d + kt0 * 16, d, 1, c_lo, c_hi, lane, ring);
    add_row0(a.acc_gu + (static_cast<size_t>(p) * 2 + q) * f, tn * 16, c_lo, lane);
  }
  grid.sync();

  // C: finish gate and up, SwiGLU with clamp, rotate by the down projection's suh.
  for (int job = warp0; job < P * fblk; job += n_warps) {
    const int p = job / fblk, b = job % fblk;
    const int e = a.idx[p];
    if (e < 0) continue;
    const Exl3CudaExpert& ex = a.experts[e];
    float g[4], u[4];
    float* ag = a.acc_gu + (static_cast<size_t>(p) * 2) * f + b * 128;
    float* au = ag + f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      g[i] = __ldcg(ag + lane + 32 * i), u[i] = __ldcg(au + lane + 32 * i);
      __stcg(ag + lane + 32 * i, 0.f), __stcg(au + lane + 32 * i, 0.f);
    }
    had128_warp(g, lane);
    had128_warp(u, lane);
    float h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = b * 128 + lane + 32 * i;
      float gi = g[i] * h2f(ex.svh[0], c), ui = u[i] * h2f(ex.svh[1], c);
      if (ex.bias[0]) gi += h2f(ex.bias[0], c);
      if (ex.bias[1]) ui += h2f(ex.bias[1], c);
      if (a.limit > 0.f) {
        gi = fminf(gi, a.limit);
        ui = fminf(fmaxf(ui, -a.limit), a.limit);
      }
      h[i] = silu(gi) * ui * h2f(ex.suh[2], c);
    }
    had128_warp(h, lane);
    __half* dst = a.xr_d + static_cast<size_t>(p) * f + b * 128;
#pragma unroll
    for (int i = 0; i < 4; ++i) dst[lane + 32 * i] = __float2half_rn(h[i]);
  }
  grid.sync();

  // D: down partial products.
  const int kc_d = (f_kt + a.chunk_d - 1) / a.chunk_d;
  for (int job = warp0; job < P * d_tn * kc_d; job += n_warps) {
    const int kc = job % kc_d, tn = (job / kc_d) % d_tn, p = job / (kc_d * d_tn);
    const int e = a.idx[p];
    if (e < 0) continue;
    const int kt0 = kc * a.chunk_d, nt = min(a.chunk_d, f_kt - kt0);
    const uint32_t* tiles = reinterpret_cast<const uint32_t*>(a.experts[e].trellis[2]) +
                            (static_cast<size_t>(kt0) * d_tn + tn) * kWords;
    float c_lo[4] = {0.f, 0.f, 0.f, 0.f}, c_hi[4] = {0.f, 0.f, 0.f, 0.f};
    strip_mma<K, CB, false, true>(tiles, static_cast<size_t>(d_tn) * kWords, nt,
                                  a.xr_d + static_cast<size_t>(p) * f + kt0 * 16, f, 1, c_lo, c_hi, lane, ring);
    add_row0(a.acc_d + static_cast<size_t>(p) * d, tn * 16, c_lo, lane);
  }
  grid.sync();

  // E: output rotation of each slot's down result, weighted sum over the token's slots.
  for (int job = warp0; job < a.T * dblk; job += n_warps) {
    const int t = job / dblk, b = job % dblk;
    float out[4] = {0.f, 0.f, 0.f, 0.f};
    for (int j = 0; j < a.topk; ++j) {
      const int p = t * a.topk + j, e = a.idx[p];
      if (e < 0) continue;
      const Exl3CudaExpert& ex = a.experts[e];
      float* ad = a.acc_d + static_cast<size_t>(p) * d + b * 128;
      float v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = __ldcg(ad + lane + 32 * i), __stcg(ad + lane + 32 * i, 0.f);
      had128_warp(v, lane);
      const float w = a.weights[p];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = b * 128 + lane + 32 * i;
        out[i] += w * v[i] * h2f(ex.svh[2], c);  // the routing weight scales h, not the bias
        if (ex.bias[2]) out[i] += h2f(ex.bias[2], c);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) a.y[static_cast<size_t>(t) * d + b * 128 + lane + 32 * i] = out[i];
  }
}

using MoeKernel = void (*)(MoeArgs);

template <int K>
MoeKernel pick_cb(int cb) {
  return cb == 0 ? exl3_moe_kernel<K, 0> : cb == 1 ? exl3_moe_kernel<K, 1> : exl3_moe_kernel<K, 2>;
}

MoeKernel pick_kernel(int K, int cb) {
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

size_t workspace_bytes(int pairs, int64_t d, int64_t f) {
  return static_cast<size_t>(pairs) * (2 * d + f) * sizeof(__half) + static_cast<size_t>(pairs) * (2 * f + d) * sizeof(float);
}

}  // namespace

bool exl3_cuda_moe_supports(const Exl3CudaMoeLayer& l) {
  return l.experts && l.n_experts > 0 && !l.bits.half() && l.bits.ka() >= 2 && l.bits.ka() <= 6 && l.d > 0 &&
         l.f > 0 && l.d % 128 == 0 && l.f % 128 == 0;
}

Status exl3_cuda_moe_workspace_alloc(Exl3CudaMoeWorkspace& ws, int max_pairs, int64_t d, int64_t f) {
  const size_t bytes = workspace_bytes(max_pairs, d, f);
  if (cudaError_t e = cudaMalloc(&ws.buf, bytes); e != cudaSuccess) return cuda_error("malloc MoE workspace", e);
  if (cudaError_t e = cudaMemset(ws.buf, 0, bytes); e != cudaSuccess) return cuda_error("memset MoE workspace", e);
  ws.max_pairs = max_pairs, ws.d = d, ws.f = f;
  return {};
}

void exl3_cuda_moe_workspace_free(Exl3CudaMoeWorkspace& ws) {
  cudaFree(ws.buf);
  ws = {};
}

Status exl3_moe_decode_cuda(const Exl3CudaMoeLayer& layer, const float* x, const int32_t* idx, const float* weights,
                            int T, int topk, float* y, Exl3CudaMoeWorkspace& ws, void* stream) {
  if (!exl3_cuda_moe_supports(layer))
    return make_error("exl3_moe_decode_cuda: unsupported layer (K=", layer.bits.k_x2 / 2.0, " d=", layer.d,
                      " f=", layer.f, "); supported: integer K 2..6, d and f multiples of 128");
  if (T < 1 || topk < 1) return make_error("exl3_moe_decode_cuda: T=", T, " topk=", topk);
  if (T * topk > ws.max_pairs || ws.d != layer.d || ws.f != layer.f)
    return make_error("exl3_moe_decode_cuda: workspace is for ", ws.max_pairs, " pairs of d=", ws.d, " f=", ws.f,
                      ", call needs ", T * topk, " pairs of d=", layer.d, " f=", layer.f);
  MoeKernel fn = pick_kernel(layer.bits.ka(), static_cast<int>(layer.codebook));
  static int n_sms = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 1;
  }();
  const size_t smem = static_cast<size_t>(kWarps) * kStages * kStageTiles * 8 * layer.bits.ka() * 4;
  if (smem > 40 * 1024) {  // dynamic + static above 48 KB needs the opt-in
    if (cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
        e != cudaSuccess)
      return cuda_error("set shared memory", e);
  }
  int per_sm = 0;
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kThreads, smem); e != cudaSuccess)
    return cuda_error("occupancy query", e);
  per_sm = std::max(1, per_sm);
  const int blocks = n_sms * per_sm, warps = blocks * kWarps;
  const int P = T * topk;
  MoeArgs a;
  a.experts = layer.experts, a.x = x, a.idx = idx, a.weights = weights, a.y = y;
  char* b = static_cast<char*>(ws.buf);
  a.xr_gu = reinterpret_cast<__half*>(b);
  a.xr_d = a.xr_gu + static_cast<size_t>(ws.max_pairs) * 2 * layer.d;
  a.acc_gu = reinterpret_cast<float*>(a.xr_d + static_cast<size_t>(ws.max_pairs) * layer.f);
  a.acc_d = a.acc_gu + static_cast<size_t>(ws.max_pairs) * 2 * layer.f;
  a.T = T, a.topk = topk, a.d = static_cast<int>(layer.d), a.f = static_cast<int>(layer.f);
  a.limit = layer.swiglu_limit;
  // k-chunks so each phase has about two jobs per warp (at least two pipeline stages per job).
  const int64_t d_kt = layer.d / 16, f_kt = layer.f / 16;
  const int64_t strips_b = int64_t(P) * 2 * (layer.f / 16), strips_d = int64_t(P) * (layer.d / 16);
  const int64_t splits_b = std::max<int64_t>(1, (2 * warps + strips_b - 1) / strips_b);
  const int64_t splits_d = std::max<int64_t>(1, (2 * warps + strips_d - 1) / strips_d);
  a.chunk_b = static_cast<int>(std::min(d_kt, std::max<int64_t>(2 * kStageTiles, (d_kt + splits_b - 1) / splits_b)));
  a.chunk_d = static_cast<int>(std::min(f_kt, std::max<int64_t>(2 * kStageTiles, (f_kt + splits_d - 1) / splits_d)));
  void* args[] = {&a};
  if (cudaError_t e = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(fn), dim3(blocks), dim3(kThreads), args,
                                                  smem, static_cast<cudaStream_t>(stream));
      e != cudaSuccess)
    return cuda_error("launch exl3_moe_kernel", e);
  return {};
}

}  // namespace spw
