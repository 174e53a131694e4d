// The strip walk shared by the SIMD tile kernels (AVX2, AVX-512, AVX-512 VBMI / FP16): a part's tile grid in
// strips of `strip` adjacent column tiles, one k-tile row of the strip at a time. Tiles are stored row-major,
// so a strip's row is contiguous (the old walk down one column touched a new 4 KB page per tile, 48 KB apart
// at n = 8192, and left the faster decodes latency-bound from DRAM); each tile's lines kPrefetchRows rows ahead
// are prefetched as it is visited (a burst per row measured ≈ 4 % slower for the FP16 kernel). Each column's accumulators see the k-tiles in order, so sums are unchanged.
// Header-only, in an unnamed namespace: each kernel file instantiates it with its own ISA flags.
#pragma once

#include <xmmintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/exl3_gemm.h"

namespace spw::detail {
namespace {

constexpr int kPrefetchRows = 2;

// This thread's accumulator scratch of at least n floats, 64-byte aligned (grows, is kept).
inline float* acc_scratch(size_t n) {
  thread_local std::vector<float> v;
  if (v.size() < n + 16) v.resize(n + 16);
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t(63));
}

// For every strip: zero acc[0, acc_floats), then tile(w, j, xt) for each k-tile row in order and each tile j
// of the strip (w: its bytes, xt: the k-tile's activations of all tokens) followed by row_done(tk), then
// done(s0, ns) with the strip's first column tile and width.
template <class Tile, class RowDone, class Done>
inline void walk_strips(const Exl3Part& P, int64_t tile_bytes, int strip, float* acc, size_t acc_floats, Tile&& tile,
                        RowDone&& row_done, Done&& done) {
  const int64_t row_bytes = (P.t->n / 16) * tile_bytes;
  for (int64_t s0 = P.tn0; s0 < P.tn1; s0 += strip) {
    const int ns = static_cast<int>(std::min<int64_t>(strip, P.tn1 - s0));
    std::memset(acc, 0, sizeof(float) * acc_floats);
    const auto* row = reinterpret_cast<const uint8_t*>(P.t->tile(P.tk0, s0));
    for (int64_t tk = P.tk0; tk < P.tk1; ++tk, row += row_bytes) {
      const int64_t ahead = tk + kPrefetchRows < P.tk1 ? kPrefetchRows * row_bytes : 0;
      const float* xt = P.xe + tk * P.m * 32;
      const uint8_t* w = row;
      for (int j = 0; j < ns; ++j, w += tile_bytes) {
        if (ahead) {  // this tile's lines kPrefetchRows rows ahead, spread over the row's work
          const char* pf = reinterpret_cast<const char*>(w + ahead);
          for (int64_t o = 0; o < tile_bytes; o += 64) _mm_prefetch(pf + o, _MM_HINT_T0);
          _mm_prefetch(pf + tile_bytes - 1, _MM_HINT_T0);
        }
        tile(w, j, xt);
      }
      row_done(tk);
    }
    done(s0, ns);
  }
}

template <class Tile, class Done>
inline void walk_strips(const Exl3Part& P, int64_t tile_bytes, int strip, float* acc, size_t acc_floats, Tile&& tile,
                        Done&& done) {
  walk_strips(P, tile_bytes, strip, acc, acc_floats, tile, [](int64_t) {}, done);
}

}  // namespace
}  // namespace spw::detail
