// Fused EXL3 MoE decode: one cooperative launch per layer. Contract, limits and accuracy: exl3_moe.h.
//
// Work is a flat list of warp jobs per phase, walked grid-stride by every warp of a grid sized to be
// fully resident; cooperative_groups' grid barrier separates the phases:
//   A  rotate: (pair, gate|up, 128-block of d)         xr_gu[p][q] = fp16(had(x[t] ∘ suh_q))
//      and, in block 0, the groups: the pairs of each expert in runs of at most kGroupPairs (pair order)
//   B  gate/up: every (group, gate|up, 16-col strip of f, k segment), split evenly over the warps
//                                                      part_gu[p][q][s] = x[segment s]·Ŵ[segment s], p in the group
//   C  SwiGLU: (pair, 128-block of f)                  acc = Σ_s part_gu[p][q][s] (in order);
//                                                      h = swiglu(had(acc)·svh + b); xr_d[p] = fp16(had(h ∘ suh_2))
//   D  down: every (group, 16-col strip of d, k segment), split evenly              part_d[p][s] = h·Ŵ2 (segment s)
//   E  combine: (token, 128-block of d)                y[t] = Σ_j (w_tj · had(Σ_s part_d[p][s])·svh_2 + b_2)
// A k segment (kSegStages stages, 256 of k) is the unit of work: one warp decodes the segment's tiles once for
// its group and computes it whole for every pair of the group, each pair a column of the tile MMA (tokens are
// the MMA's n dimension), stored in the pair's own slot. The segments' boundaries depend only on the shapes,
// and an MMA column's sum depends on that column alone, not on the others. So every pair's sums are the same
// bits whatever T is, whichever pairs share its group and however the segments fall to warps: the kernel is
// deterministic and a token's output does not depend on the other tokens of the launch. Grouping decodes each
// selected expert once per kGroupPairs of its pairs instead of once per pair (a 64-token step of 384 experts
// picks ~240 distinct of its 384 pairs; skewed routing fewer).
// Tried and measured slower (H200, one V4.1 layer at one token): E split into a job per slot and a
// job per token with a barrier between (97.4 → 101.3 µs); phases B and D handed out in units of kStages stages
// from a grid-wide counter instead of even static shares (108 → 118 µs, same call).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/exl3_device.cuh"
#include "cuda/exl3_moe.h"
#include "cuda/launch.h"

namespace spw {
namespace {

namespace cg = cooperative_groups;
using namespace exl3dev;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPhaseStamps = 2 * kMoePhases;

// Pairs of one expert computed together in phases B and D: the MMA's 8 token columns.
constexpr int kGroupPairs = 8;
struct PairGroup {
  int32_t expert, n;              // n ≥ 1 pairs
  int32_t pair[kGroupPairs];      // ascending pair index
};

struct MoeArgs {
  const Exl3CudaExpert* experts;
  const float* x;
  const int32_t* idx;
  const float* weights;
  float* y;
  __half* xr_gu;   // [P][2][d]
  __half* xr_d;    // [P][f]
  float* part_gu;  // [P][2][segments(d)][f]
  float* part_d;   // [P][segments(f)][d]
  PairGroup* groups;  // [P]: the launch's groups, written in phase A
  int* n_groups;      // their count
  int* pair_group;    // [P]: scratch of the grouping
  int T, topk, d, f;
  float limit;
  bool ref_round;  // Exl3CudaMoeLayer::reference_rounding
  unsigned long long* phase_ns;  // Exl3CudaMoeWorkspace::phase_ns (diagnostics), usually null
};

// %globaltimer into the warp's stamp slot (diagnostics only: a null pointer costs one branch per phase). The
// "memory" clobber keeps the read in place between the phase's loads and the grid barrier's.
__device__ __forceinline__ void stamp(const MoeArgs& a, int warp, int slot, int lane) {
  if (!a.phase_ns || lane != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  a.phase_ns[static_cast<int64_t>(warp) * kPhaseStamps + slot] = t;
}

__device__ __forceinline__ float h2f(const uint16_t* p, int i) { return __half2float(__ushort_as_half(p[i])); }

__device__ __forceinline__ float silu(float v) { return v / (1.0f + __expf(-v)); }

// The reference-rounding mode's pieces: bf16 rounding, and silu with exp in f64 rounded once
// (cuda/ops/device_numerics.cuh's silu, so that h equals cuda::swiglu's).
__device__ __forceinline__ float bf16r(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float silu_exact(float v) {
  return v / (1.0f + static_cast<float>(exp(static_cast<double>(-v))));
}

// The slot of token t after (prev_e, prev_j) in (expert id, slot) order, skipping −1; −1 at the end.
__device__ __forceinline__ int next_slot(const int32_t* idx, int topk, int prev_e, int prev_j) {
  int best = -1;
  for (int j = 0; j < topk; ++j) {
    const int e = idx[j];
    if (e < 0) continue;
    const bool after = e > prev_e || (e == prev_e && j > prev_j);
    if (after && (best < 0 || e < idx[best])) best = j;
  }
  return best;
}

// Stages per k segment: 2 (256 of k) where k allows, else 1 (k = 128·odd). A function of k alone.
constexpr int kSegStages = 2;
__host__ __device__ constexpr int seg_stages(int64_t k) { return (k / (16 * kStageTiles)) % kSegStages == 0 ? kSegStages : 1; }
__host__ __device__ constexpr int segments(int64_t k) { return static_cast<int>(k / (16 * kStageTiles) / seg_stages(k)); }

// One phase's matrix products as a single sequence of tiles, ordered (group p, matrix q, 16-column strip
// tn, k-tile kt) with kt fastest, split over all warps of the grid in whole k segments (as evenly as
// segments allow: every warp gets the same number of tiles up to one segment, whatever the shapes), its
// ring loading on across segment and strip boundaries. A stage of kStageTiles consecutive k-tiles never
// crosses a segment, a segment never crosses a strip (k is a multiple of 128).
struct PhaseSeq {
  const Exl3CudaExpert* experts;
  const PairGroup* groups;
  int G;             // groups
  int q_base, n_q;   // matrices of the phase: trellis[q_base + q], q < n_q
  int n_kt, n_tn;    // k-tiles per strip (a multiple of kStageTiles), strips per matrix
  const __half* xr;  // rotated input of (pair p, q): xr + (p·n_q + q)·ldx
  int ldx;
  float* part;       // segment s of (pair p, q): part + ((p·n_q + q)·n_seg + s)·ld_part
  int ld_part;
  int seg_stages, n_seg;
  __device__ __forceinline__ int64_t total_segments() const { return static_cast<int64_t>(G) * n_q * n_tn * n_seg; }
};

struct StageCursor {
  int p, q, tn, kt;  // p: the group; kt: the stage's first k-tile
  __device__ __forceinline__ void set(const PhaseSeq& s, int64_t stage) {
    const int per_strip = s.n_kt / kStageTiles;
    kt = static_cast<int>(stage % per_strip) * kStageTiles;
    stage /= per_strip;
    tn = static_cast<int>(stage % s.n_tn);
    stage /= s.n_tn;
    q = static_cast<int>(stage % s.n_q);
    p = static_cast<int>(stage / s.n_q);
  }
  // Steps to the next stage; true when that starts a new strip.
  __device__ __forceinline__ bool advance(const PhaseSeq& s) {
    if ((kt += kStageTiles) < s.n_kt) return false;
    kt = 0;
    if (++tn == s.n_tn) {
      tn = 0;
      if (++q == s.n_q) q = 0, ++p;
    }
    return true;
  }
  // The groups were written in this launch by another block: read past L1.
  __device__ __forceinline__ int expert(const PhaseSeq& s) const { return p < s.G ? __ldcg(&s.groups[p].expert) : -1; }
};

// The lane's pairs in group p: `x` feeds its MMA column g = lane / 4 (member g, or member 0 past the group's
// end: a column nobody stores), st[i] receives column 2·(lane % 4) + i (−1 past the end).
struct LanePairs {
  int x, st[2];
  __device__ __forceinline__ void load(const PhaseSeq& s, int p, int lane) {
    if (p >= s.G) return;
    const PairGroup* grp = s.groups + p;
    const int n = __ldcg(&grp->n), g = lane >> 2, m0 = 2 * (lane & 3);
    x = __ldcg(&grp->pair[g < n ? g : 0]);
    st[0] = m0 < n ? __ldcg(&grp->pair[m0]) : -1;
    st[1] = m0 + 1 < n ? __ldcg(&grp->pair[m0 + 1]) : -1;
  }
};

// Stores this warp's segment result (tile accumulators, exl3_device.cuh: tile_mma: lane (g, t4) holds output
// columns g and g + 8 of MMA columns 2·t4 (c[0], c[2]) and 2·t4 + 1 (c[1], c[3])) in the slots of its pairs.
__device__ __forceinline__ void store_pairs(const PhaseSeq& s, const LanePairs& lp, int q, int seg, int col0,
                                            const float (&c)[4], int lane) {
  const int col = col0 + (lane >> 2);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (lp.st[i] < 0) continue;
    float* slot = s.part + (static_cast<int64_t>(lp.st[i] * s.n_q + q) * s.n_seg + seg) * s.ld_part;
    __stcg(slot + col, c[i]);
    __stcg(slot + col + 8, c[2 + i]);
  }
}

// This warp's stages [st0, st1) of the phase (whole segments): the warp copies their tiles (none for groups
// whose expert is −1) into its ring kStages stages ahead, 16 bytes per lane and cp.async, then decodes,
// multiplies, and stores each segment's result in its pairs' slots. A stage's 8 tiles lie a row of tiles apart, so a bulk
// copy per tile (the earlier design) cost lane 0 ~135 SASS instructions per stage — about 17 of the
// warp's ~69 issue slots per tile — while the other lanes waited; here each lane issues ≤ 3 copies.
template <int K, int CB>
__device__ __forceinline__ void phase_stream(const PhaseSeq& s, int64_t st0, int64_t st1, WarpRing& ring, int lane) {
  constexpr int kWords = 8 * K, kSlotWords = kStageTiles * kWords;
  constexpr int kTileChunks = kWords / 4, kSlotChunks = kSlotWords / 4;  // 16-byte pieces
  const int n_stages = static_cast<int>(st1 - st0);
  if (n_stages <= 0) return;
  const LaneWindow lw = lane_window<K>(lane);
  const int t4 = lane & 3;
  const int kt_stride = s.n_tn * kWords;  // words between k-tiles of a strip (< 2^31: d, f ≤ 2^16)

  StageCursor pc;  // the producer's position (every lane keeps the same)
  pc.set(s, st0);
  int base_m = -1;                 // matrix p·n_q + q whose trellis `base` is
  const uint32_t* base = nullptr;  // null when its expert is −1
  // The lane's 16-byte pieces of a stage, c = lane + 32i: tile c / kTileChunks, piece c % kTileChunks.
  constexpr int kPieces = (kSlotChunks + 31) / 32;
  int src_off[kPieces];
#pragma unroll
  for (int i = 0; i < kPieces; ++i) {
    const int c = lane + 32 * i;
    src_off[i] = (c / kTileChunks) * kt_stride + 4 * (c % kTileChunks);
  }
  const unsigned dst_lane = smem_addr(ring.words) + 16u * lane;
  auto issue = [&](int st) {
    if (st >= n_stages) return;
    if (pc.p * s.n_q + pc.q != base_m) {  // a new matrix: its expert's trellis, read once
      base_m = pc.p * s.n_q + pc.q;
      const int e = pc.expert(s);
      base = e >= 0 ? reinterpret_cast<const uint32_t*>(s.experts[e].trellis[s.q_base + pc.q]) : nullptr;
    }
    const uint32_t slot = (ring.uses + st) % kStages;
    if (base) {
      const uint32_t* src = base + (pc.kt * kt_stride + pc.tn * kWords);
#pragma unroll
      for (int i = 0; i < kPieces; ++i)
        if (lane + 32 * i < kSlotChunks) cp_async16(dst_lane + slot * (kSlotWords * 4) + 512u * i, src + src_off[i]);
    }
    mbar_arrive_after_cp_async(&ring.bars[slot]);
    pc.advance(s);
  };

  StageCursor cc;  // the consumer's position (every lane)
  cc.set(s, st0);
  int ce = cc.expert(s);
  LanePairs lp{0, {-1, -1}};
  lp.load(s, cc.p, lane);
  float c[4] = {0.f, 0.f, 0.f, 0.f}, unused[4];
  const int seg_tiles = s.seg_stages * kStageTiles;

  for (int st = 0; st < kStages; ++st) issue(st);
#pragma unroll 1
  for (int st = 0; st < n_stages; ++st) {
    const uint32_t use = ring.uses + st, slot = use % kStages;
    mbar_wait(&ring.bars[slot], (use / kStages) & 1);
    if (ce >= 0) {
      const uint32_t* sw = ring.words + slot * kSlotWords;
      const uint32_t* xp =
          reinterpret_cast<const uint32_t*>(s.xr + static_cast<size_t>(lp.x * s.n_q + cc.q) * s.ldx) + cc.kt * 8 + t4;
#pragma unroll
      for (int u = 0; u < kStageTiles; ++u) {
        const uint32_t* tw = sw + u * kWords;
        tile_mma<K, CB, false>(tw[lw.wa], tw[lw.wb], tw[lw.wc], lw.off, __ldcg(xp + u * 8), __ldcg(xp + u * 8 + 4), 0u,
                               0u, c, unused);
      }
    }
    const StageCursor at = cc;
    const bool new_strip = cc.advance(s);
    if (cc.kt % seg_tiles == 0) {  // the segment is complete
      if (ce >= 0) store_pairs(s, lp, at.q, at.kt / seg_tiles, at.tn * 16, c, lane);
      c[0] = c[1] = c[2] = c[3] = 0.f;
    }
    if (new_strip && cc.p != at.p) {
      ce = cc.expert(s);
      lp.load(s, cc.p, lane);
    }
    __syncwarp();  // every lane has read the slot before the warp refills it
    issue(st + kStages);
  }
  ring.uses += n_stages;
}

// Block 0 of phase A: the launch's pairs (expert ≥ 0) in groups of at most kGroupPairs pairs of one expert, in
// pair order (an expert's r-th pair goes to its group r / kGroupPairs); the groups ordered by their first
// pair. pair_group [P] is scratch. Which pairs share a group changes no pair's result (see the top).
__device__ void group_pairs(const MoeArgs& a, int P, int* pair_group) {
  __shared__ int scan[kThreads];
  int running = 0;  // groups started by the pairs before this round
  for (int p0 = 0; p0 < P; p0 += kThreads) {
    const int p = p0 + threadIdx.x;
    const int e = p < P ? a.idx[p] : -1;
    int rank = 0;
    if (e >= 0)
      for (int q = 0; q < p; ++q) rank += a.idx[q] == e;
    const int starts = e >= 0 && rank % kGroupPairs == 0;
    scan[threadIdx.x] = starts;
    __syncthreads();
    for (int off = 1; off < kThreads; off <<= 1) {  // inclusive scan of the starts
      const int v = threadIdx.x >= off ? scan[threadIdx.x - off] : 0;
      __syncthreads();
      scan[threadIdx.x] += v;
      __syncthreads();
    }
    if (starts) pair_group[p] = running + scan[threadIdx.x] - 1;
    running += scan[kThreads - 1];
    __syncthreads();
  }
  if (threadIdx.x == 0) *a.n_groups = running;
  __syncthreads();  // every group's first pair has its index
  for (int p = threadIdx.x; p < P; p += kThreads) {
    const int e = a.idx[p];
    if (e < 0) continue;
    int rank = 0, total = 0, first = p;  // first: the pair that starts p's group
    for (int q = 0; q < P; ++q) {
      if (a.idx[q] != e) continue;
      if (q < p) ++rank;
      ++total;
    }
    const int start_rank = rank / kGroupPairs * kGroupPairs;
    for (int q = 0, r = 0; q < p; ++q)
      if (a.idx[q] == e && r++ == start_rank) {
        first = q;
        break;
      }
    PairGroup& grp = a.groups[pair_group[first]];
    grp.pair[rank - start_rank] = p;
    if (p == first) grp.expert = e, grp.n = min(kGroupPairs, total - start_rank);
  }
}

// v = Σ_s part[s·ld + lane + 32i] over the n_seg slots in order: a lane's 4 columns of one 128-block.
__device__ __forceinline__ void sum_segments(const float* part, int n_seg, int64_t ld, int lane, float (&v)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = __ldcg(part + lane + 32 * i);
#pragma unroll 4
  for (int s = 1; s < n_seg; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] += __ldcg(part + s * ld + lane + 32 * i);
}

template <int K, int CB>
__global__ void __launch_bounds__(kThreads, 4) exl3_moe_kernel(MoeArgs a) {
  extern __shared__ __align__(16) uint32_t ring_smem[];
  const int lane = threadIdx.x & 31;
  __shared__ __align__(8) uint64_t bars[kWarps][kStages];
  WarpRing ring{ring_smem + (threadIdx.x >> 5) * (ring_bytes<K>() / 4), bars[threadIdx.x >> 5], 0};
  warp_ring_init(ring, lane);
  cuda::pdl_wait();  // launch.h; no early trigger: the next kernel's blocks could not be resident anyway
  const int warp0 = blockIdx.x * kWarps + (threadIdx.x >> 5), n_warps = gridDim.x * kWarps;
  const int P = a.T * a.topk, d = a.d, f = a.f;
  const int dblk = d / 128, fblk = f / 128, d_tn = d / 16, f_tn = f / 16, d_kt = d / 16, f_kt = f / 16;
  cg::grid_group grid = cg::this_grid();

  stamp(a, warp0, 0, lane);
  // A: the groups (block 0), and rotate x[t] by the gate and up suh of each selected expert.
  if (blockIdx.x == 0) group_pairs(a, P, a.pair_group);
  for (int job = warp0; job < P * 2 * dblk; job += n_warps) {
    const int p = job / (2 * dblk), q = (job / dblk) % 2, b = job % dblk;
    const int e = a.idx[p];
    if (e < 0) continue;
    const Exl3CudaExpert& ex = a.experts[e];
    rotate_block(a.x + static_cast<size_t>(p / a.topk) * d + b * 128, ex.suh[q] + b * 128,
                 a.xr_gu + (static_cast<size_t>(p) * 2 + q) * d + b * 128, lane);
  }
  stamp(a, warp0, 1, lane);
  grid.sync();
  stamp(a, warp0, 2, lane);

  // B: gate/up segments, all groups' gate and up segments split evenly over the warps.
  const int G = __ldcg(a.n_groups);
  {
    const PhaseSeq seq{a.experts, a.groups, G, 0, 2, d_kt, f_tn, a.xr_gu, d, a.part_gu, f, seg_stages(d), segments(d)};
    const int64_t total = seq.total_segments();
    phase_stream<K, CB>(seq, total * warp0 / n_warps * seq.seg_stages, total * (warp0 + 1) / n_warps * seq.seg_stages,
                        ring, lane);
  }
  stamp(a, warp0, 3, lane);
  grid.sync();
  stamp(a, warp0, 4, lane);

  // C: finish gate and up, SwiGLU with clamp, rotate by the down projection's suh.
  for (int job = warp0; job < P * fblk; job += n_warps) {
    const int p = job / fblk, b = job % fblk;
    const int e = a.idx[p];
    if (e < 0) continue;
    const Exl3CudaExpert& ex = a.experts[e];
    float g[4], u[4];
    const int n_seg = segments(d);
    sum_segments(a.part_gu + static_cast<size_t>(p) * 2 * n_seg * f + b * 128, n_seg, f, lane, g);
    sum_segments(a.part_gu + (static_cast<size_t>(p) * 2 + 1) * n_seg * f + b * 128, n_seg, f, lane, u);
    had128_warp(g, lane);
    had128_warp(u, lane);
    float h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = b * 128 + lane + 32 * i;
      float gi = g[i] * h2f(ex.svh[0], c), ui = u[i] * h2f(ex.svh[1], c);
      if (ex.bias[0]) gi += h2f(ex.bias[0], c);
      if (ex.bias[1]) ui += h2f(ex.bias[1], c);
      if (a.ref_round) gi = bf16r(gi), ui = bf16r(ui);
      if (a.limit > 0.f) {
        gi = fminf(gi, a.limit);
        ui = fminf(fmaxf(ui, -a.limit), a.limit);
      }
      const float hv = a.ref_round ? bf16r(silu_exact(gi) * ui * a.weights[p]) : silu(gi) * ui;
      h[i] = hv * h2f(ex.suh[2], c);
    }
    had128_warp(h, lane);
    __half* dst = a.xr_d + static_cast<size_t>(p) * f + b * 128;
#pragma unroll
    for (int i = 0; i < 4; ++i) dst[lane + 32 * i] = __float2half_rn(h[i]);
  }
  stamp(a, warp0, 5, lane);
  grid.sync();
  stamp(a, warp0, 6, lane);

  // D: down segments, split the same way.
  {
    const PhaseSeq seq{a.experts, a.groups, G, 2, 1, f_kt, d_tn, a.xr_d, f, a.part_d, d, seg_stages(f), segments(f)};
    const int64_t total = seq.total_segments();
    phase_stream<K, CB>(seq, total * warp0 / n_warps * seq.seg_stages, total * (warp0 + 1) / n_warps * seq.seg_stages,
                        ring, lane);
  }
  stamp(a, warp0, 7, lane);
  grid.sync();
  stamp(a, warp0, 8, lane);

  // E: output rotation of each slot's down result, weighted sum over the token's slots.
  for (int job = warp0; job < a.T * dblk; job += n_warps) {
    const int t = job / dblk, b = job % dblk;
    float out[4] = {0.f, 0.f, 0.f, 0.f};
    const int32_t* tidx = a.idx + static_cast<size_t>(t) * a.topk;
    for (int n = 0, j = -1, pe = -1; n < a.topk; ++n) {
      if (a.ref_round) {  // ascending expert id
        j = next_slot(tidx, a.topk, pe, j);
        if (j < 0) break;
        pe = tidx[j];
      } else {
        j = n;
      }
      const int p = t * a.topk + j, e = a.idx[p];
      if (e < 0) continue;
      const Exl3CudaExpert& ex = a.experts[e];
      float v[4];
      sum_segments(a.part_d + static_cast<size_t>(p) * segments(f) * d + b * 128, segments(f), d, lane, v);
      had128_warp(v, lane);
      const float w = a.weights[p];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = b * 128 + lane + 32 * i;
        if (a.ref_round) {  // the weight is already in h; each slot's output rounded to bf16
          float yv = v[i] * h2f(ex.svh[2], c);
          if (ex.bias[2]) yv += h2f(ex.bias[2], c);
          out[i] = __fadd_rn(out[i], bf16r(yv));
          continue;
        }
        out[i] += w * v[i] * h2f(ex.svh[2], c);  // the routing weight scales h, not the bias
        if (ex.bias[2]) out[i] += h2f(ex.bias[2], c);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) a.y[static_cast<size_t>(t) * d + b * 128 + lane + 32 * i] = out[i];
  }
  stamp(a, warp0, 9, lane);
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
  return static_cast<size_t>(pairs) * (2 * d + f) * sizeof(__half) +
         static_cast<size_t>(pairs) * (2 * segments(d) * f + segments(f) * d) * sizeof(float) +
         static_cast<size_t>(pairs) * (sizeof(PairGroup) + sizeof(int)) + sizeof(int);
}

// The kernel, its shared memory and a grid that is fully resident (the grid barriers need every block at once).
struct MoeLaunch {
  MoeKernel fn;
  size_t smem;
  int blocks;
};

Status moe_launch_config(const Exl3CudaMoeLayer& layer, MoeLaunch& ml) {
  ml.fn = pick_kernel(layer.bits.ka(), static_cast<int>(layer.codebook));
  static int n_sms = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 1;
  }();
  ml.smem = static_cast<size_t>(kWarps) * kStages * kStageTiles * 8 * layer.bits.ka() * 4;
  if (ml.smem > 40 * 1024) {  // dynamic + static above 48 KB needs the opt-in
    if (cudaError_t e = cudaFuncSetAttribute(ml.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(ml.smem));
        e != cudaSuccess)
      return cuda_error("set shared memory", e);
  }
  int per_sm = 0;
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ml.fn, kThreads, ml.smem); e != cudaSuccess)
    return cuda_error("occupancy query", e);
  ml.blocks = n_sms * std::max(1, per_sm);
  return {};
}

}  // namespace

int64_t exl3_moe_phase_stamps(const Exl3CudaMoeLayer& layer) {
  MoeLaunch ml;
  if (!exl3_cuda_moe_supports(layer) || !moe_launch_config(layer, ml).ok()) return 0;
  return static_cast<int64_t>(ml.blocks) * kWarps * kPhaseStamps;
}

bool exl3_cuda_moe_supports(const Exl3CudaMoeLayer& l) {
  return l.experts && l.n_experts > 0 && !l.bits.half() && l.bits.ka() >= 2 && l.bits.ka() <= 6 && l.d > 0 &&
         l.f > 0 && l.d % 128 == 0 && l.f % 128 == 0;
}

size_t exl3_cuda_moe_workspace_nbytes(int max_pairs, int64_t d, int64_t f) { return workspace_bytes(max_pairs, d, f); }

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
  const int piece = ws.max_pairs / topk;  // tokens per launch
  if (piece < 1 || ws.d != layer.d || ws.f != layer.f)
    return make_error("exl3_moe_decode_cuda: workspace is for ", ws.max_pairs, " pairs of d=", ws.d, " f=", ws.f,
                      ", a token needs ", topk, " pairs of d=", layer.d, " f=", layer.f);
  MoeLaunch ml;
  SPW_TRY(moe_launch_config(layer, ml));
  // Launches of `piece` tokens each: a token's output does not depend on the others in its launch, so the
  // pieces give the bits one launch of all T would.
  for (int t0 = 0; t0 < T; t0 += piece) {
    MoeArgs a;
    a.experts = layer.experts;
    a.x = x + static_cast<size_t>(t0) * layer.d;
    a.idx = idx + static_cast<size_t>(t0) * topk;
    a.weights = weights + static_cast<size_t>(t0) * topk;
    a.y = y + static_cast<size_t>(t0) * layer.d;
    char* b = static_cast<char*>(ws.buf);
    a.xr_gu = reinterpret_cast<__half*>(b);
    a.xr_d = a.xr_gu + static_cast<size_t>(ws.max_pairs) * 2 * layer.d;
    a.part_gu = reinterpret_cast<float*>(a.xr_d + static_cast<size_t>(ws.max_pairs) * layer.f);
    a.part_d = a.part_gu + static_cast<size_t>(ws.max_pairs) * 2 * segments(layer.d) * layer.f;
    a.groups = reinterpret_cast<PairGroup*>(a.part_d + static_cast<size_t>(ws.max_pairs) * segments(layer.f) * layer.d);
    a.pair_group = reinterpret_cast<int*>(a.groups + ws.max_pairs);
    a.n_groups = a.pair_group + ws.max_pairs;
    a.T = std::min(piece, T - t0), a.topk = topk, a.d = static_cast<int>(layer.d), a.f = static_cast<int>(layer.f);
    a.limit = layer.swiglu_limit;
    a.ref_round = layer.reference_rounding;
    a.phase_ns = ws.phase_ns;
    if (cudaError_t e = cuda::launch_cooperative(ml.fn, dim3(ml.blocks), dim3(kThreads), ml.smem,
                                                 static_cast<cudaStream_t>(stream), a);
        e != cudaSuccess)
      return cuda_error("launch exl3_moe_kernel", e);
  }
  return {};
}

}  // namespace spw
