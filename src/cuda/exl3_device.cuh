// Device building blocks shared by the EXL3 kernels (exl3_gemm.cu, exl3_moe.cu, exl3_prefill.cu):
// codebook decode, state extraction, the tensor-core step, the in-warp block-128 Hadamard, bulk copies
// with mbarriers and the warp-private tile ring.
//
// Tile layout (spec §1.4): a 16×16 tile is 16·K int16 words = 8·K uint32; lane ℓ's 8 positions are
// exactly its mma.m16n8k16 fragment of the tile taken as the A operand (tile_mma), so decoding in
// registers feeds the MMA with no shuffles.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace spw::exl3dev {

constexpr float kHadScale = 0.08838834764831845f;  // 1/√128

// Two codebook values (states s0, s1) as one half2 {v0, v1} (spec §2.1; fp16-exact like exllamav3).
// CB: 0 = 3INST, 1 = MCG, 2 = MUL1.
template <int CB>
__device__ __forceinline__ uint32_t decode2(uint32_t s0, uint32_t s1) {
  if constexpr (CB == 2) {  // MUL1: bytesum via dp4a lands directly in the fp16 bits of 1024 + b
    const uint32_t x0 = s0 * 0x83DCD12Du, x1 = s1 * 0x83DCD12Du;
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

// Normalized Hadamard of 128 floats held by one warp as v[e] = element 32e + lane (fp32 butterflies).
__device__ __forceinline__ void had128_warp(float (&v)[4], int lane) {
#pragma unroll
  for (int s = 1; s < 32; s <<= 1)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float o = __shfl_xor_sync(0xffffffffu, v[e], s);
      v[e] = (lane & s) ? o - v[e] : v[e] + o;
    }
  float a = v[0], b = v[1], c = v[2], d = v[3];
  v[0] = a + b; v[1] = a - b; v[2] = c + d; v[3] = c - d;
  a = v[0]; b = v[1]; c = v[2]; d = v[3];
  v[0] = a + c; v[2] = a - c; v[1] = b + d; v[3] = b - d;
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] *= kHadScale;
}

// Hopper bulk copies (cp.async.bulk, TMA engine) completing on an mbarrier: one instruction moves a
// contiguous run of trellis tiles into shared memory, so loading costs almost no issue slots.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes barrier initialisation visible to the async proxy (the bulk-copy engine) before first use.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Blocks until the barrier's phase with this parity (0 for its 1st, 3rd, ... completion) is complete.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// bytes (multiple of 16, both addresses 16-byte aligned) from global to this block's shared memory.
__device__ __forceinline__ void bulk_copy(void* smem, const void* gmem, unsigned bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_addr(smem)),
      "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// 16 bytes from global to shared memory (a shared-window address, smem_addr), asynchronously (cp.async,
// L2 only; both addresses 16-byte aligned).
__device__ __forceinline__ void cp_async16(unsigned smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem) : "memory");
}
// An arrival on the barrier once every cp.async this thread issued so far has landed; it counts as one
// of the barrier's expected arrivals (.noinc).
__device__ __forceinline__ void mbar_arrive_after_cp_async(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// Decodes tile words into states s[0..7] of one lane (see lane_window) with 32-bit shifts only:
// the lane's 8·K + 16 − K ≤ 64 bits are hi:lo, state j sits at bit 48 − j·K of hi:lo.
template <int K>
__device__ __forceinline__ void lane_states(uint32_t A, uint32_t B, uint32_t C, int off, uint32_t (&s)[8]) {
  const uint32_t hi = __funnelshift_l(B, A, off), lo = __funnelshift_l(C, B, off);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    constexpr int kTop = 48;
    const int sh = kTop - j * K;  // compile-time after unrolling
    uint32_t v;
    if (sh >= 32) v = hi >> (sh - 32);
    else if (sh == 0) v = lo;
    else v = __funnelshift_r(lo, hi, sh);
    s[j] = (sh == 48) ? v : (v & 0xffffu);
  }
}

// Where lane ℓ's bits live in a tile: its 8 states span ring bits [8ℓK + K − 16, 8(ℓ+1)K), at most
// 64 bits for K ≤ 6, i.e. inside words wa, wb, wc (ring order) from bit `off` of wa.
struct LaneWindow {
  int wa, wb, wc, off;
};
template <int K>
__device__ __forceinline__ LaneWindow lane_window(int lane) {
  constexpr int kWords = 8 * K;
  int start = 8 * lane * K + K - 16;
  if (start < 0) start += 256 * K;
  LaneWindow w;
  w.wa = start >> 5;
  w.off = start & 31;
  w.wb = w.wa + 1 == kWords ? 0 : w.wa + 1;
  w.wc = w.wb + 1 == kWords ? 0 : w.wb + 1;
  return w;
}

// Decodes one tile from the lane's three words and accumulates tile-columns × tokens on tensor cores,
// with the weight tile as the A operand (its 16 columns are the mma's rows, so one m16n8k16 covers
// the whole tile) and the activations as B (8 tokens per mma). A lane's 8 decoded positions are
// exactly its A fragment: (col g, k 2t4..+1), (col g+8, ...), (col g, k 2t4+8..+9), (col g+8, ...).
//   x0/x1: token g's fp16 pairs at k 2t4 and 2t4+8 of this tile; x2/x3 the same for token g+8 (M16).
//   Accumulator layout ("tile accumulators"): c_lo[0] = y[token 2t4][col g], c_lo[1] = y[2t4+1][g],
//   c_lo[2] = y[2t4][g+8], c_lo[3] = y[2t4+1][g+8]; c_hi the same for tokens 8 + 2t4 (+1).
// The lane's A fragment of one tile, decoded: w[0..3] are the mma's a0..a3 (see tile_mma).
template <int K, int CB>
__device__ __forceinline__ void tile_fragment(uint32_t A, uint32_t B, uint32_t C, int off, uint32_t (&w)[4]) {
  uint32_t s[8];
  lane_states<K>(A, B, C, off, s);
  w[0] = decode2<CB>(s[0], s[1]);
  w[2] = decode2<CB>(s[2], s[3]);
  w[1] = decode2<CB>(s[4], s[5]);
  w[3] = decode2<CB>(s[6], s[7]);
}

template <int K, int CB, bool M16>
__device__ __forceinline__ void tile_mma(uint32_t A, uint32_t B, uint32_t C, int off, uint32_t x0, uint32_t x1,
                                         uint32_t x2, uint32_t x3, float (&c_lo)[4], float (&c_hi)[4]) {
  uint32_t w[4];
  tile_fragment<K, CB>(A, B, C, off, w);
  mma16816(c_lo, w[0], w[1], w[2], w[3], x0, x1);
  if constexpr (M16) mma16816(c_hi, w[0], w[1], w[2], w[3], x2, x3);
}

// Four 8×8 fp16 matrices from shared memory (ldmatrix.x4): lanes 8i..8i+7 give the row addresses of
// matrix i (16-byte aligned); r[i] is the lane's pair (row lane/4, columns 2·(lane%4)..+1) of matrix i.
__device__ __forceinline__ void ldmatrix_x4(unsigned addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Shape of a warp ring (exl3_moe.cu): kStages stages of kStageTiles tiles, all in flight at once.
constexpr int kStages = 4, kStageTiles = 8;
// Shared memory one warp's ring needs (bytes).
template <int K>
__host__ __device__ constexpr int ring_bytes() {
  return kStages * kStageTiles * 8 * K * 4;
}

// A warp-private ring of trellis tiles in shared memory, filled by the warp's own cp.async copies (each
// lane 16 bytes at a time) that complete on one mbarrier per slot: every lane arrives once its copies
// of the stage have landed. `uses` counts the stages ever loaded; it gives each wait its slot and
// parity, so one ring serves any number of strips in a row.
struct WarpRing {
  uint32_t* words;  // ring_bytes<K>() of shared memory, 16-byte aligned
  uint64_t* bars;   // kStages mbarriers in shared memory
  uint32_t uses;
};
// The whole warp calls this once before its first strip.
__device__ __forceinline__ void warp_ring_init(WarpRing& r, int lane) {
  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(&r.bars[s], 32);
    mbar_fence_init();
  }
  r.uses = 0;
  __syncwarp();
}

// The (row, 128-block) job of this warp in a launch of kThreads-thread blocks over rows × k/128 jobs (one warp
// per job, the input rotations); false past the last job.
template <int kThreads>
__device__ __forceinline__ bool rotation_job(int64_t rows, int k, int64_t& row, int& blk) {
  const int64_t job = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  const int nblk = k / 128;
  if (job >= rows * nblk) return false;
  row = job / nblk;
  blk = static_cast<int>(job % nblk);
  return true;
}

// xr[i] = fp16(had128(x[i]·suh[i])) for one 128-block, by one warp; returns nothing else.
__device__ __forceinline__ void rotate_block(const float* __restrict__ x, const uint16_t* __restrict__ suh,
                                             __half* __restrict__ xr, int lane) {
  float v[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] = x[lane + 32 * e] * __half2float(__ushort_as_half(suh[lane + 32 * e]));
  had128_warp(v, lane);
#pragma unroll
  for (int e = 0; e < 4; ++e) xr[lane + 32 * e] = __float2half_rn(v[e]);
}

}  // namespace spw::exl3dev
