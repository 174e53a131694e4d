// Tail-biting Viterbi over the EXL3 bitshift trellis and tile packing; see trellis_encode.h.
// The DP runs once per trellis step over all 65,536 states, so it is written as flat loops the
// compiler vectorizes, specialised per K, and cloned for AVX-512/AVX2 (target_clones picks one at
// load time). Results do not depend on the clone: every clone does the same fp32 operations in
// the same order per element.
#include "quantize/trellis_encode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/status.h"

namespace spw::quant {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// One trellis step: min over the K top bits of the predecessor for every edge, then the new
// state's cost. cost/next: [65536]; min_buf, arg: [2^(16−K)] scratch; back: [2^(16−K)] output.
// All loops run over contiguous 32-bit lanes so they vectorize; the argmin is narrowed to bytes
// in a separate pass.
template <int K>
[[gnu::always_inline]] inline void dp_step(const float* __restrict lut, const float* __restrict cost,
                                           float* __restrict next, float* __restrict min_buf,
                                           int32_t* __restrict arg, uint8_t* __restrict back, float target) {
  constexpr int n_edges = 1 << (16 - K), n_top = 1 << K;
  // Blocks of edges keep min/argmin in L1; each block's successors are one contiguous range.
  constexpr int kBlock = n_edges < 256 ? n_edges : 256;
  for (int e0 = 0; e0 < n_edges; e0 += kBlock) {
    float* __restrict mb = min_buf + e0;
    int32_t* __restrict ab = arg + e0;
    for (int e = 0; e < kBlock; ++e) {
      mb[e] = cost[e0 + e];
      ab[e] = 0;
    }
    for (int h = 1; h < n_top; ++h) {
      const float* __restrict c = cost + h * n_edges + e0;
      for (int e = 0; e < kBlock; ++e) {
        // Strict: the first minimum (lowest h) wins. Written without a conditional store (GCC
        // would emit vmaskmovps, which is microcoded and very slow on AMD).
        const float v = c[e], m = mb[e];
        const int32_t a = ab[e], lt = -int32_t(v < m);
        mb[e] = std::min(m, v);
        ab[e] = a ^ ((a ^ h) & lt);
      }
    }
    for (int e = 0; e < kBlock; ++e) back[e0 + e] = uint8_t(ab[e]);
    const float* __restrict lb = lut + size_t(e0) * n_top;
    float* __restrict nb = next + size_t(e0) * n_top;
    for (int e = 0; e < kBlock; ++e) {
      const float m = mb[e];
      for (int b = 0; b < n_top; ++b) {
        const float d = lb[e * n_top + b] - target;
        nb[e * n_top + b] = d * d + m;
      }
    }
  }
}

template <int K>
[[gnu::always_inline]] inline float* run_steps(const float* lut, const float* targets, int n, float* cost, float* next,
                                               float* min_buf, int32_t* arg, uint8_t* back) {
  constexpr int n_edges = 1 << (16 - K);
  for (int p = 1; p < n; ++p) {
    dp_step<K>(lut, cost, next, min_buf, arg, back + size_t(p) * n_edges, targets[p]);
    std::swap(cost, next);
  }
  return cost;
}

// Positions 1..n−1 of one pass; `cost` holds position 0's costs on entry. Returns the buffer
// (cost or next) that holds position n−1's costs.
[[gnu::target_clones("avx512f", "avx2", "default")]] float* run_pass(int k, const float* lut, const float* targets,
                                                                       int n, float* cost, float* next, float* min_buf,
                                                                       int32_t* arg, uint8_t* back) {
  switch (k) {
    case 1: return run_steps<1>(lut, targets, n, cost, next, min_buf, arg, back);
    case 2: return run_steps<2>(lut, targets, n, cost, next, min_buf, arg, back);
    case 3: return run_steps<3>(lut, targets, n, cost, next, min_buf, arg, back);
    case 4: return run_steps<4>(lut, targets, n, cost, next, min_buf, arg, back);
    case 5: return run_steps<5>(lut, targets, n, cost, next, min_buf, arg, back);
    case 6: return run_steps<6>(lut, targets, n, cost, next, min_buf, arg, back);
    case 7: return run_steps<7>(lut, targets, n, cost, next, min_buf, arg, back);
    case 8: return run_steps<8>(lut, targets, n, cost, next, min_buf, arg, back);
    default: return cost;
  }
}

}  // namespace

TrellisEncoder::TrellisEncoder(int bits, Exl3Codebook codebook)
    : k_(bits), cb_(codebook), lut_(exl3_codebook_lut_f32(codebook)) {
  if (bits < 1 || bits > 8) {
    std::fprintf(stderr, "TrellisEncoder: K=%d outside 1..8\n", bits);
    std::abort();  // invariant: callers validate --bits first
  }
  cost_.resize(65536);
  next_.resize(65536);
  min_.resize(size_t(1) << (16 - bits));
  arg_.resize(size_t(1) << (16 - bits));
}

double TrellisEncoder::viterbi(const float* targets, int n, int start_edge, int end_edge, uint16_t* states) {
  const int n_edges = 1 << (16 - k_);
  const uint32_t edge_mask = uint32_t(n_edges - 1);
  if (back_.size() < size_t(n) * n_edges) back_.resize(size_t(n) * n_edges);
  for (uint32_t s = 0; s < 65536; ++s) {
    const float d = lut_[s] - targets[0];
    cost_[s] = (start_edge < 0 || int(s >> k_) == start_edge) ? d * d : kInf;
  }
  const float* final_cost = run_pass(k_, lut_, targets, n, cost_.data(), next_.data(), min_.data(), arg_.data(), back_.data());
  uint32_t best = 0;
  float best_cost = kInf;
  for (uint32_t s = 0; s < 65536; ++s) {
    if (end_edge >= 0 && int(s & edge_mask) != end_edge) continue;
    if (final_cost[s] < best_cost) {
      best_cost = final_cost[s];
      best = s;
    }
  }
  if (!(best_cost < kInf)) return std::numeric_limits<double>::infinity();
  uint32_t s = best;
  states[n - 1] = uint16_t(s);
  for (int p = n - 1; p >= 1; --p) {
    const uint32_t e = s >> k_;
    const uint32_t h = back_[size_t(p) * n_edges + e];
    s = (h << (16 - k_)) | e;
    states[p - 1] = uint16_t(s);
  }
  // Report the error of the returned path recomputed in double (the DP sums in fp32).
  double err = 0;
  for (int p = 0; p < n; ++p) {
    const double d = double(lut_[states[p]]) - targets[p];
    err += d * d;
  }
  return err;
}

double TrellisEncoder::encode_tile(const float targets[256], uint16_t states[256]) {
  // Pass 1: unconstrained, positions 128..255 then 0..kLookahead−1; the best path's edge at
  // position 0 (q = 128) is the ring's start edge. Positions further than a few 16/K-step state
  // windows past 0 barely move that choice, so pass 1 stops kLookahead positions after it.
  constexpr int kLookahead = 32;
  float rotated[128 + kLookahead];
  uint16_t rot_states[128 + kLookahead];
  for (int q = 0; q < 128 + kLookahead; ++q) rotated[q] = targets[(q + 128) & 255];
  viterbi(rotated, 128 + kLookahead, -1, -1, rot_states);
  const int edge0 = rot_states[128] >> k_;  // position 0 sits at q = 128
  // Pass 2: positions 0..255 with edge(0) fixed and the ring closed on the same edge.
  return viterbi(targets, 256, edge0, edge0, states);
}

double TrellisEncoder::encode_tile_rowmajor(const float tile[256], uint16_t* words, float* decoded) {
  float targets[256];
  for (int p = 0; p < 256; ++p) targets[p] = tile[exl3_perm_row(p) * 16 + exl3_perm_col(p)];
  uint16_t states[256];
  const double err = encode_tile(targets, states);
  exl3_pack_tile(states, k_, words);
  for (int p = 0; p < 256; ++p) decoded[exl3_perm_row(p) * 16 + exl3_perm_col(p)] = lut_[states[p]];
  return err;
}

void exl3_pack_tile(const uint16_t states[256], int bits, uint16_t* words) {
  // The stream is the K low bits of each state, position 0 first, MSB-first; 32-bit chunks are
  // stored as two int16 words, low half first.
  const int n_words32 = 8 * bits;
  std::vector<uint32_t> w32(size_t(n_words32), 0);
  int64_t bit = 0;
  for (int p = 0; p < 256; ++p) {
    const uint32_t v = states[p] & ((1u << bits) - 1);
    for (int i = bits - 1; i >= 0; --i, ++bit)
      if ((v >> i) & 1) w32[size_t(bit >> 5)] |= 1u << (31 - (bit & 31));
  }
  for (int i = 0; i < n_words32; ++i) {
    words[2 * i] = uint16_t(w32[size_t(i)] & 0xffff);
    words[2 * i + 1] = uint16_t(w32[size_t(i)] >> 16);
  }
}

}  // namespace spw::quant
