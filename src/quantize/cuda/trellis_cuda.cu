// Tail-biting Viterbi on the GPU; see trellis_cuda.h for the contract.
//
// DP state: instead of the 65,536 state costs, each step keeps M[e] = min over predecessors, one
// float per edge (2^(16−K) of them: 32 KB at K=3), in shared memory, double-buffered; a state's
// cost is recomputed from M when it is needed, with the same two roundings the CPU uses
// (fl(fl(d·d) + M)), so the values compared are the CPU's values, bit for bit.
// Thread mapping: thread t owns kEpt edges in groups of kB consecutive edges (kB = min(kEpt, 2^K));
// a group's states (h << (16−K)) | e share M[(h << (16−2K)) | (e >> K)], one shared load per h and
// group. A thread's 128 states never change, so their codebook values live in 64 registers (fp16
// pairs; every fp16 is exact in fp32). Back-pointers (argmin h, one byte per edge and step) go to
// global memory; thread 0 traces them back.
#include "quantize/cuda/trellis_cuda.h"

#include <cuda_fp16.h>

#include <limits>
#include <vector>

#include "quantize/cuda/cuda_check.h"

namespace spw::quant {
namespace {

template <int K>
struct VitCfg {
  static constexpr int kThreads = K == 8 ? 256 : 512;
  static constexpr int kEdges = 1 << (16 - K), kTop = 1 << K;
  static constexpr int kSpt = 65536 / kThreads;          // states per thread
  static constexpr int kEpt = kSpt / kTop;               // edges per thread
  static constexpr int kB = kEpt < kTop ? kEpt : kTop;   // consecutive edges per group
  static constexpr int kChunks = kEpt / kB;
  static constexpr bool kLutRegs = kSpt <= 128;
  static constexpr bool kSharedM = K >= 2;
  static constexpr size_t kSmem = kSharedM ? size_t(2) * kEdges * sizeof(float) : 0;
  static_assert(kEpt >= 1 && kChunks * kB == kEpt && kTop % 2 == 0);
};

__device__ __forceinline__ float cost_of(float v, float t, float m) {
  const float d = __fsub_rn(v, t);
  return __fadd_rn(__fmul_rn(d, d), m);
}

template <int K>
struct Tile {
  using C = VitCfg<K>;
  uint32_t lut[C::kLutRegs ? C::kSpt / 2 : 1];  // fp16 pairs {h, h+1} per (chunk, b)
  const float* lut32;
  int tid;

  __device__ __forceinline__ int group_edge(int j) const { return (j * C::kThreads + tid) * C::kB; }
  // Codebook values of states (h, e) and (h+1, e), h even, e = group_edge(j) + b.
  __device__ __forceinline__ float2 values(int j, int b, int h) const {
    if constexpr (C::kLutRegs) {
      uint32_t r = lut[((j * C::kB + b) * C::kTop + h) >> 1];
      // Opaque to the optimizer: otherwise it hoists all 128 fp32 conversions out of the step
      // loop (they are loop-invariant), needs twice the registers and spills.
      asm volatile("" : "+r"(r));
      return __half22float2(*reinterpret_cast<const __half2*>(&r));
    } else {
      const int e = group_edge(j) + b;
      return make_float2(__ldg(lut32 + ((h << (16 - K)) | e)), __ldg(lut32 + (((h + 1) << (16 - K)) | e)));
    }
  }

  __device__ void load_lut(const uint16_t* lut16) {
    if constexpr (C::kLutRegs) {
#pragma unroll
      for (int j = 0; j < C::kChunks; ++j)
#pragma unroll
        for (int b = 0; b < C::kB; ++b)
#pragma unroll
          for (int h = 0; h < C::kTop; h += 2) {
            const int e = group_edge(j) + b;
            const uint32_t lo = lut16[(h << (16 - K)) | e], hi = lut16[((h + 1) << (16 - K)) | e];
            lut[((j * C::kB + b) * C::kTop + h) >> 1] = lo | (hi << 16);
          }
    }
  }

  // One DP step: M_next[e] = min_h cost((h << (16−K)) | e), back[e] = argmin (first minimum).
  __device__ __forceinline__ void step(const float* cur, float* nxt, float t, uint8_t* back) const {
#pragma unroll
    for (int j = 0; j < C::kChunks; ++j) {
      const int g = group_edge(j), mbase = g >> K;
      float mn[C::kB];
      uint32_t arg[C::kB];
#pragma unroll
      for (int h = 0; h < C::kTop; h += 2) {
        const float m0 = cur[mbase + (h << (16 - 2 * K))], m1 = cur[mbase + ((h + 1) << (16 - 2 * K))];
#pragma unroll
        for (int b = 0; b < C::kB; ++b) {
          const float2 v = values(j, b, h);
          const float c0 = cost_of(v.x, t, m0), c1 = cost_of(v.y, t, m1);
          if (h == 0) {
            mn[b] = c0;
            arg[b] = 0;
          } else if (c0 < mn[b]) {
            mn[b] = c0;
            arg[b] = uint32_t(h);
          }
          if (c1 < mn[b]) {
            mn[b] = c1;
            arg[b] = uint32_t(h + 1);
          }
        }
      }
      if constexpr (C::kB % 4 == 0) {
#pragma unroll
        for (int b = 0; b < C::kB; b += 4) {
          *reinterpret_cast<float4*>(nxt + g + b) = make_float4(mn[b], mn[b + 1], mn[b + 2], mn[b + 3]);
          *reinterpret_cast<uint32_t*>(back + g + b) = arg[b] | (arg[b + 1] << 8) | (arg[b + 2] << 16) | (arg[b + 3] << 24);
        }
      } else if constexpr (C::kB == 2) {
        *reinterpret_cast<float2*>(nxt + g) = make_float2(mn[0], mn[1]);
        *reinterpret_cast<uint16_t*>(back + g) = uint16_t(arg[0] | (arg[1] << 8));
      } else {
        nxt[g] = mn[0];
        back[g] = uint8_t(arg[0]);
      }
    }
  }
};

struct Best {
  float cost;
  uint32_t state;
};

__device__ __forceinline__ bool better(Best a, Best b) {
  return a.cost < b.cost || (a.cost == b.cost && a.state < b.state);
}

// Lowest-index minimum over the block (every thread passes its own best; returns the block's).
template <int kThreads>
__device__ Best block_best(Best mine, Best* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, mine.cost, o), __shfl_xor_sync(0xffffffffu, mine.state, o)};
    if (better(other, mine)) mine = other;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = mine;
  __syncthreads();
  Best out = red[0];
  for (int w = 1; w < kThreads / 32; ++w)
    if (better(red[w], out)) out = red[w];
  __syncthreads();  // red is reused by the next call
  return out;
}

// One Viterbi pass over n positions of the tile's targets, read from s_t at (p + rot) & 255.
// start_edge / end_edge −1 = free. Returns the best final state (same on every thread); back
// holds the back-pointers of positions 1..n−1.
template <int K>
__device__ __forceinline__ uint32_t viterbi_pass(const Tile<K>& tile, const float* s_t, int n, int rot, int start_edge, int end_edge,
                                 float* m0, float* m1, uint8_t* back, Best* red) {
  using C = VitCfg<K>;
  const float inf = __int_as_float(0x7f800000);
  for (int e = threadIdx.x; e < C::kEdges; e += C::kThreads) m0[e] = (start_edge < 0 || e == start_edge) ? 0.f : inf;
  __syncthreads();
  float* cur = m0;
  float* nxt = m1;
  for (int p = 1; p < n; ++p) {
    tile.step(cur, nxt, s_t[(p - 1 + rot) & 255], back + size_t(p) * C::kEdges);
    __syncthreads();
    float* tmp = cur;
    cur = nxt;
    nxt = tmp;
  }
  const float t = s_t[(n - 1 + rot) & 255];
  Best mine{inf, 0xffffffffu};
#pragma unroll
  for (int j = 0; j < C::kChunks; ++j) {
    const int g = tile.group_edge(j), mbase = g >> K;
#pragma unroll
    for (int h = 0; h < C::kTop; h += 2) {
      const float m0v = cur[mbase + (h << (16 - 2 * K))], m1v = cur[mbase + ((h + 1) << (16 - 2 * K))];
#pragma unroll
      for (int b = 0; b < C::kB; ++b) {
        const int e = g + b;
        const bool allowed = end_edge < 0 || e == end_edge;
        const float2 v = tile.values(j, b, h);
        const Best c0{cost_of(v.x, t, m0v), uint32_t((h << (16 - K)) | e)};
        const Best c1{cost_of(v.y, t, m1v), uint32_t(((h + 1) << (16 - K)) | e)};
        if (allowed && better(c0, mine)) mine = c0;
        if (allowed && better(c1, mine)) mine = c1;
      }
    }
  }
  return block_best<C::kThreads>(mine, red).state;
}

template <int K>
__global__ void __launch_bounds__(VitCfg<K>::kThreads, 1)
    viterbi_tiles_kernel(const float* __restrict__ targets, const uint16_t* __restrict__ lut16,
                         const float* __restrict__ lut32, uint16_t* __restrict__ states, uint8_t* __restrict__ back_all,
                         float* __restrict__ m_global) {
  using C = VitCfg<K>;
  extern __shared__ float4 smem_f4[];
  __shared__ float s_t[256];
  __shared__ Best red[C::kThreads / 32];
  __shared__ int s_edge0;
  const int i_tile = blockIdx.x;
  float* m0 = C::kSharedM ? reinterpret_cast<float*>(smem_f4) : m_global + size_t(i_tile) * 2 * C::kEdges;
  float* m1 = m0 + C::kEdges;
  uint8_t* back = back_all + size_t(i_tile) * 256 * C::kEdges;
  for (int p = threadIdx.x; p < 256; p += C::kThreads) s_t[p] = targets[size_t(i_tile) * 256 + p];
  Tile<K> tile;
  tile.lut32 = lut32;
  tile.tid = threadIdx.x;
  tile.load_lut(lut16);
  __syncthreads();

  // Pass 1: positions 128..255, 0..31 (q = 0..159), free ends; the best path's edge at q = 128.
  constexpr int kPass1 = 160;
  uint32_t s = viterbi_pass<K>(tile, s_t, kPass1, 128, -1, -1, m0, m1, back, red);
  if (threadIdx.x == 0) {
    for (int p = kPass1 - 1; p >= 129; --p) {
      const uint32_t e = s >> K;
      s = (uint32_t(back[size_t(p) * C::kEdges + e]) << (16 - K)) | e;
    }
    s_edge0 = int(s >> K);
  }
  __syncthreads();
  const int edge0 = s_edge0;

  // Pass 2: positions 0..255, the ring closed on edge0.
  s = viterbi_pass<K>(tile, s_t, 256, 0, edge0, edge0, m0, m1, back, red);
  if (threadIdx.x == 0) {
    uint16_t* out = states + size_t(i_tile) * 256;
    out[255] = uint16_t(s);
    for (int p = 255; p >= 1; --p) {
      const uint32_t e = s >> K;
      s = (uint32_t(back[size_t(p) * C::kEdges + e]) << (16 - K)) | e;
      out[p - 1] = uint16_t(s);
    }
  }
}

template <int K>
Status launch_viterbi(const float* targets, int n_tiles, uint16_t* states, TrellisCudaWorkspace& ws, cudaStream_t stream) {
  using C = VitCfg<K>;
  auto fn = viterbi_tiles_kernel<K>;
  if constexpr (C::kSmem > 0)
    QCUDA_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmem)));
  fn<<<n_tiles, C::kThreads, C::kSmem, stream>>>(targets, ws.lut16, ws.lut32, states, ws.back, ws.m_global);
  QCUDA_TRY(cudaGetLastError());
  return {};
}

// One thread per tile: exl3_pack_tile (K low bits of each state, MSB-first 32-bit chunks stored as
// two int16 words, low half first).
__global__ void pack_tiles_kernel(const uint16_t* __restrict__ states, int n_tiles, int bits, uint16_t* __restrict__ words) {
  const int i_tile = blockIdx.x * blockDim.x + threadIdx.x;
  if (i_tile >= n_tiles) return;
  const uint16_t* st = states + size_t(i_tile) * 256;
  uint16_t* out = words + size_t(i_tile) * 16 * bits;
  uint32_t acc = 0;
  int n_acc = 0, i_word = 0;
  for (int p = 0; p < 256; ++p) {
    const uint32_t v = st[p] & ((1u << bits) - 1);
    for (int i = bits - 1; i >= 0; --i) {
      acc = (acc << 1) | ((v >> i) & 1u);
      if (++n_acc == 32) {
        out[2 * i_word] = uint16_t(acc & 0xffff);
        out[2 * i_word + 1] = uint16_t(acc >> 16);
        ++i_word;
        acc = 0;
        n_acc = 0;
      }
    }
  }
}

}  // namespace

Status trellis_cuda_workspace_alloc(TrellisCudaWorkspace& ws, int bits, Exl3Codebook codebook, int max_tiles) {
  trellis_cuda_workspace_free(ws);
  if (bits < 1 || bits > 8) return make_error("trellis search: K=", bits, " outside 1..8");
  ws.bits = bits;
  ws.codebook = codebook;
  ws.max_tiles = max_tiles;
  const size_t n_edges = size_t(1) << (16 - bits);
  QCUDA_TRY(cudaMalloc(&ws.back, size_t(max_tiles) * 256 * n_edges));
  if (bits == 1) QCUDA_TRY(cudaMalloc(&ws.m_global, size_t(max_tiles) * 2 * n_edges * sizeof(float)));
  QCUDA_TRY(cudaMalloc(&ws.lut16, 65536 * sizeof(uint16_t)));
  QCUDA_TRY(cudaMalloc(&ws.lut32, 65536 * sizeof(float)));
  QCUDA_TRY(cudaMemcpy(ws.lut16, exl3_codebook_lut(codebook), 65536 * sizeof(uint16_t), cudaMemcpyHostToDevice));
  QCUDA_TRY(cudaMemcpy(ws.lut32, exl3_codebook_lut_f32(codebook), 65536 * sizeof(float), cudaMemcpyHostToDevice));
  // Pageable copies may return before their DMA lands, and the search may run on a non-blocking
  // stream that does not wait for the legacy stream.
  QCUDA_TRY(cudaDeviceSynchronize());
  return {};
}

void trellis_cuda_workspace_free(TrellisCudaWorkspace& ws) {
  cudaFree(ws.back);
  cudaFree(ws.m_global);
  cudaFree(ws.lut16);
  cudaFree(ws.lut32);
  ws = TrellisCudaWorkspace{};
}

Status trellis_encode_tiles_cuda(const float* targets, int n_tiles, uint16_t* states, TrellisCudaWorkspace& ws,
                                 cudaStream_t stream) {
  if (n_tiles <= 0) return {};
  if (n_tiles > ws.max_tiles) return make_error("trellis search: ", n_tiles, " tiles, workspace holds ", ws.max_tiles);
  switch (ws.bits) {
    case 1: return launch_viterbi<1>(targets, n_tiles, states, ws, stream);
    case 2: return launch_viterbi<2>(targets, n_tiles, states, ws, stream);
    case 3: return launch_viterbi<3>(targets, n_tiles, states, ws, stream);
    case 4: return launch_viterbi<4>(targets, n_tiles, states, ws, stream);
    case 5: return launch_viterbi<5>(targets, n_tiles, states, ws, stream);
    case 6: return launch_viterbi<6>(targets, n_tiles, states, ws, stream);
    case 7: return launch_viterbi<7>(targets, n_tiles, states, ws, stream);
    case 8: return launch_viterbi<8>(targets, n_tiles, states, ws, stream);
    default: return make_error("trellis search: workspace not allocated");
  }
}

void trellis_pack_tiles_cuda(const uint16_t* states, int n_tiles, int bits, uint16_t* words, cudaStream_t stream) {
  if (n_tiles <= 0) return;
  pack_tiles_kernel<<<(n_tiles + 127) / 128, 128, 0, stream>>>(states, n_tiles, bits, words);
}

}  // namespace spw::quant
