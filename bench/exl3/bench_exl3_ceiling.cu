// The decode ceiling of EXL3 x·W on this GPU: how many 16×16 trellis tiles per second the SMs can turn into
// tensor-core products when memory costs nothing. Every warp walks tiles that sit in shared memory, doing
// exactly the per-tile work of the GEMV's inner loop (exl3_bulk.cuh: three shared loads of trellis words,
// the lane's states, the codebook, the x fragment from shared memory, one mma), over and over. The best rate
// over launch shapes, times the bytes of a tile, is the trellis bandwidth no kernel built on this decode can
// exceed; against the HBM read bandwidth measured in the same run it bounds the share of the HBM roofline
// (issue 5's target: ≥ 60 % at K = 3).
//
// Two decodes are measured:
//   exact: the codebook values in fp16 as exllamav3 defines them (exl3_device.cuh decode2), m16n8k16 fp16 mma
//          — what every Spillway kernel runs;
//   int8:  for MUL1 only, the approximate form that drops the byte sum: the 32-bit hash itself is four u8
//          operands of an m16n8k32 u8×s8 integer mma against activations quantized to int8 and repeated
//          four times (Σ_b byte_b(h)·x = bytesum(h)·x), one fp32 rescale per 128 k. It does per weight only
//          the state cut and one IMAD, the least any MUL1 decode can do, so it bounds int8-activation
//          kernels too (exllamav3's default for m ≤ 2 is of that kind).
// Usage: bench_exl3_ceiling [ms per shape]   (prints markdown; bench/results/exl3_h200.md)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../common/cuda_check.h"
#include "../common/hbm_read.cuh"
#include "cuda/exl3_device.cuh"

using namespace spw::exl3dev;

namespace {

constexpr int kTilesInSmem = 32;  // per block, read by every warp (64 KB of trellis for K = 6 at most)
constexpr int kStageTiles = 8;    // the GEMV's 128-k stage: the int8 form rescales once per stage
// Words between the x rows of two tokens: padded so that the 32 lanes' x loads hit distinct banks, as the GEMV's
// padded rows do (exl3_bulk.cuh: ld = kpb + 8 halves). fp16: 8 words per tile, row ≡ 4 banks apart (4·g + t4);
// int8 ×4: 16 words per tile, 64-bit loads served per half-warp, rows ≡ 8 banks apart (8·g + 2·t4).
constexpr int kXStrideExact = kTilesInSmem * 8 + 4, kXStrideInt8 = kTilesInSmem * 16 + 8;

enum Variant { kExact = 0, kInt8 = 1 };

__device__ __forceinline__ void imma16832(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// reps passes over the block's kTilesInSmem tiles; every warp decodes every tile. The tiles and x come from
// global memory once; the results go to out so nothing is dead.
template <int K, int CB, int V>
__global__ void __launch_bounds__(256) ceiling_kernel(const uint32_t* __restrict__ words, const uint32_t* __restrict__ xg,
                                                      int reps, float* __restrict__ out) {
  constexpr int kWords = 8 * K;
  __shared__ uint32_t tiles[kTilesInSmem * kWords];
  constexpr int kXStride = V == kExact ? kXStrideExact : kXStrideInt8;
  __shared__ __align__(16) uint32_t xs[8 * kXStride];  // 8 tokens × the k of the tiles: fp16 pairs or int8 ×4 words
  for (int i = threadIdx.x; i < kTilesInSmem * kWords; i += blockDim.x) tiles[i] = words[i];
  for (int i = threadIdx.x; i < 8 * kXStride; i += blockDim.x) xs[i] = xg[i];
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int t4 = lane & 3, g = lane >> 2;
  const LaneWindow lw = lane_window<K>(lane);
  float c[4] = {};
  const uint32_t* xrow = xs + g * kXStride;
#pragma unroll 1
  for (int r = 0; r < reps; ++r) {
    asm volatile("" ::: "memory");  // the tiles are read again every pass, as a GEMV reads new ones
#pragma unroll 1
    for (int s0 = 0; s0 < kTilesInSmem; s0 += kStageTiles) {
      int ci[4] = {};
#pragma unroll
      for (int u = 0; u < kStageTiles; ++u) {
        const int t = s0 + u;
        const uint32_t* tw = tiles + t * kWords;
        if constexpr (V == kExact) {
          uint32_t w[4];
          tile_fragment<K, CB>(tw[lw.wa], tw[lw.wb], tw[lw.wc], lw.off, w);
          // fp16 x as the G = 1 GEMV reads it: pairs (k 2t4, 2t4+1) and (2t4+8, +9) of token g
          const uint16_t* xh = reinterpret_cast<const uint16_t*>(xrow) + t * 16 + 2 * t4;
          mma16816(c, w[0], w[1], w[2], w[3], *reinterpret_cast<const uint32_t*>(xh),
                   *reinterpret_cast<const uint32_t*>(xh + 8));
        } else {
          uint32_t s[8];
          lane_states<K>(tw[lw.wa], tw[lw.wb], tw[lw.wc], lw.off, s);
          uint32_t h[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) h[j] = s[j] * 0x83DCD12Du;
          // states (col, k): s0 (g, 2t4), s1 (g, 2t4+1), s2 (g, 2t4+8), s3 (g, 2t4+9), s4..s7 the same for
          // col g+8 (exl3_device.cuh tile_fragment). Slot t4 of an m16n8k32 is k 2t4, slot 4+t4 is k 2t4+1.
          const uint2 xa = *reinterpret_cast<const uint2*>(xrow + t * 16 + 2 * t4);
          const uint2 xb = *reinterpret_cast<const uint2*>(xrow + t * 16 + 8 + 2 * t4);
          imma16832(ci, h[0], h[4], h[1], h[5], xa.x, xa.y);
          imma16832(ci, h[2], h[6], h[3], h[7], xb.x, xb.y);
        }
      }
      if constexpr (V == kInt8) {
        // the stage's int32 sums into fp32: y += scale·(S − 510·Σx) per token (the two scales and sums of
        // the lane's tokens live in shared memory next to x in a real kernel; constants here)
        const float scale = __int_as_float(0x3c000000 | (s0 & 7)), corr = 510.0f * float(s0);
#pragma unroll
        for (int j = 0; j < 4; ++j) c[j] = fmaf(float(ci[j]) - corr, scale, c[j]);
      }
    }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = c[0] + c[1] + c[2] + c[3];
}

struct Shape {
  int blocks_per_sm, warps_per_block;
};

// Milliseconds of one launch (CUDA events).
template <class Launch>
float launch_ms(Launch&& launch) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  launch();
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  CK(cudaGetLastError());
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return ms;
}

template <int K, int CB, int V>
double tiles_per_second(const uint32_t* words, const uint32_t* x, float* out, int n_sms, Shape sh, double ms_target) {
  const int blocks = n_sms * sh.blocks_per_sm, threads = sh.warps_per_block * 32;
  int reps = 64;
  auto launch = [&] { ceiling_kernel<K, CB, V><<<blocks, threads>>>(words, x, reps, out); };
  // reps calibrated to ~ms_target (twice), then the best of three launches
  for (int pass = 0; pass < 2; ++pass)
    reps = std::max(1, static_cast<int>(reps * ms_target / std::max(launch_ms(launch), 0.01f)));
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const double tiles = double(blocks) * sh.warps_per_block * reps * kTilesInSmem;
    best = std::max(best, tiles / (launch_ms(launch) * 1e-3));
  }
  return best;
}

template <int K, int CB, int V>
void row(const char* name, const uint32_t* words, const uint32_t* x, float* out, int n_sms, double read_bw, double ms) {
  const Shape shapes[] = {{1, 8}, {2, 8}, {3, 8}, {4, 8}, {6, 8}, {8, 8}};
  double best = 0;
  Shape best_shape{};
  std::printf("| %s | %d |", name, K);
  for (Shape sh : shapes) {
    const double r = tiles_per_second<K, CB, V>(words, x, out, n_sms, sh, ms);
    std::printf(" %.1f |", r / 1e9);
    if (r > best) best = r, best_shape = sh;
  }
  const double bytes_per_tile = 32.0 * K;  // 256 weights × K bits
  std::printf(" **%.2f** (%d warps/SM) | %.0f | **%.1f %%** |\n", best / 1e9, best_shape.blocks_per_sm * best_shape.warps_per_block,
              best * bytes_per_tile / 1e9, 100.0 * best * bytes_per_tile / read_bw);
}

}  // namespace

int main(int argc, char** argv) {
  const double ms = argc > 1 ? std::atof(argv[1]) : 20.0;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int n_sms = prop.multiProcessorCount;
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  std::printf("device: %s, %d SMs, max SM clock %.2f GHz\n", prop.name, n_sms, clock_khz / 1e6);
  const size_t bw_bytes = size_t(2) << 30;
  void* bw_buf;
  CK(cudaMalloc(&bw_buf, bw_bytes));
  CK(cudaMemset(bw_buf, 1, bw_bytes));
  const double read_bw = spw::bench::hbm_read_bandwidth(bw_buf, bw_bytes, n_sms);
  CK(cudaFree(bw_buf));
  std::printf("hbm read bandwidth: %.0f GB/s\n\n", read_bw / 1e9);

  std::vector<uint32_t> h_words(kTilesInSmem * 8 * 6), h_x(8 * kXStrideInt8);
  uint32_t st = 12345;
  for (auto& w : h_words) w = st = st * 1664525u + 1013904223u;
  for (auto& v : h_x) v = 0x3c003c00u ^ ((st = st * 1664525u + 1013904223u) & 0x03ff03ffu);  // fp16 pairs ≈ 1..2
  uint32_t *words, *x;
  float* out;
  CK(cudaMalloc(&words, h_words.size() * 4));
  CK(cudaMalloc(&x, h_x.size() * 4));
  CK(cudaMalloc(&out, size_t(n_sms) * 8 * 256 * 4));
  CK(cudaMemcpy(words, h_words.data(), h_words.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(x, h_x.data(), h_x.size() * 4, cudaMemcpyHostToDevice));

  std::printf("Decode ceiling: tiles in shared memory, G tiles/s per launch shape (blocks of 8 warps per SM), best, and\n"
              "that rate as trellis bandwidth and as a share of the HBM read bandwidth above\n\n");
  std::printf("| decode | K | 1×8 | 2×8 | 3×8 | 4×8 | 6×8 | 8×8 | best G tiles/s | trellis GB/s | of HBM read bw |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  row<3, 2, kExact>("exact fp16, mul1", words, x, out, n_sms, read_bw, ms);
  row<3, 1, kExact>("exact fp16, mcg", words, x, out, n_sms, read_bw, ms);
  row<3, 0, kExact>("exact fp16, 3inst", words, x, out, n_sms, read_bw, ms);
  row<2, 2, kExact>("exact fp16, mul1", words, x, out, n_sms, read_bw, ms);
  row<4, 2, kExact>("exact fp16, mul1", words, x, out, n_sms, read_bw, ms);
  row<3, 2, kInt8>("int8 activations, mul1 (approximate)", words, x, out, n_sms, read_bw, ms);
  row<2, 2, kInt8>("int8 activations, mul1 (approximate)", words, x, out, n_sms, read_bw, ms);
  row<4, 2, kInt8>("int8 activations, mul1 (approximate)", words, x, out, n_sms, read_bw, ms);
  CK(cudaFree(words));
  CK(cudaFree(x));
  CK(cudaFree(out));
  return 0;
}
