// y = x·Wᵀ for the reference (linalg.h). Every output is the plain sequential f32 dot product
//   acc = 0; for k in 0..n_in: acc = acc + x[k]·w[k]   (a multiply, then an add, each rounded)
// but computed with SIMD lanes across outputs instead of along k: a tile of kOut outputs has its weights transposed
// to [k][kOut] once, and kTok tokens share every loaded weight row. The order of every sum is unchanged and this
// file is built with -ffp-contract=off (no fused multiply-add), so the values are bit-identical to the scalar loop
// (tests/unit/test_ops_ref.cpp checks it), without one dependent add chain per output (end-to-end effect measured in
// bench/results/quantize_demo.md and server_load_cpu.md).
#include <algorithm>
#include <vector>

#include "base/thread_pool.h"
#include "ops/ref/linalg.h"

namespace spw::ref {
namespace {

constexpr size_t kOut = 32;  // outputs per tile: two AVX-512 or four AVX2 vectors
constexpr size_t kTok = 4;   // tokens per pass over a tile's weights

// acc[t][o] for NT tokens over the whole k range of one transposed tile wt[n_in][kOut]. Inlined into the
// target_clones entry points below, which compile it for each ISA.
template <size_t NT>
inline __attribute__((always_inline)) void tile_tokens(const float* x, size_t n_in, const float* wt, float* acc) {
  float a[NT][kOut] = {};
  for (size_t k = 0; k < n_in; ++k) {
    const float* wk = wt + k * kOut;
    for (size_t t = 0; t < NT; ++t) {
      const float xv = x[t * n_in + k];
      for (size_t o = 0; o < kOut; ++o) a[t][o] += xv * wk[o];
    }
  }
  std::copy(&a[0][0], &a[0][0] + NT * kOut, acc);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void tile_4_tokens(const float* x, size_t n_in,
                                                                                const float* wt, float* acc) {
  tile_tokens<kTok>(x, n_in, wt, acc);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void tile_1_token(const float* x, size_t n_in,
                                                                               const float* wt, float* acc) {
  tile_tokens<1>(x, n_in, wt, acc);
}

// Outputs [o0, o1) (o1 − o0 ≤ kOut) of every token; wt is the caller's scratch of n_in·kOut floats.
void output_tile(const float* x, const float* w, float* y, size_t n_tokens, size_t n_in, size_t n_out, size_t o0,
                 size_t o1, std::vector<float>& wt) {
  wt.assign(n_in * kOut, 0.f);
  for (size_t o = o0; o < o1; ++o) {
    const float* wr = w + o * n_in;
    for (size_t k = 0; k < n_in; ++k) wt[k * kOut + (o - o0)] = wr[k];
  }
  float acc[kTok * kOut];
  for (size_t t0 = 0; t0 < n_tokens;) {
    const size_t nt = n_tokens - t0 >= kTok ? kTok : 1;
    if (nt == kTok) tile_4_tokens(x + t0 * n_in, n_in, wt.data(), acc);
    else tile_1_token(x + t0 * n_in, n_in, wt.data(), acc);
    for (size_t t = 0; t < nt; ++t) std::copy(acc + t * kOut, acc + t * kOut + (o1 - o0), y + (t0 + t) * n_out + o0);
    t0 += nt;
  }
}

// Few tokens: transposing a tile would cost as much as the product itself, so each token runs kRows outputs' dot
// products side by side straight from W's rows (independent add chains instead of one).
constexpr size_t kRows = 8;

// Scalar on purpose: vectorizing across the rows would gather strided weights.
__attribute__((optimize("no-tree-vectorize"))) void few_tokens(const float* x, const float* w, float* y, size_t n_tokens,
                                                               size_t n_in, size_t n_out, size_t o0, size_t o1) {
  for (size_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * n_in;
    size_t o = o0;
    for (; o + kRows <= o1; o += kRows) {
      float a[kRows] = {};
      for (size_t k = 0; k < n_in; ++k)
        for (size_t j = 0; j < kRows; ++j) a[j] += xt[k] * w[(o + j) * n_in + k];
      std::copy(a, a + kRows, y + t * n_out + o);
    }
    for (; o < o1; ++o) {
      float a = 0.f;
      for (size_t k = 0; k < n_in; ++k) a += xt[k] * w[o * n_in + k];
      y[t * n_out + o] = a;
    }
  }
}

void tiles(const float* x, const float* w, float* y, size_t n_tokens, size_t n_in, size_t n_out, size_t tile_begin,
           size_t tile_end) {
  if (n_tokens < kTok) {
    few_tokens(x, w, y, n_tokens, n_in, n_out, tile_begin * kOut, std::min(n_out, tile_end * kOut));
    return;
  }
  std::vector<float> wt;
  for (size_t i = tile_begin; i < tile_end; ++i)
    output_tile(x, w, y, n_tokens, n_in, n_out, i * kOut, std::min(n_out, (i + 1) * kOut), wt);
}

}  // namespace

void matmul_nt(const float* x, const float* w, float* y, size_t n_tokens, size_t n_in, size_t n_out) {
  // Parallel over output tiles: each thread streams its slice of W once for all tokens.
  const size_t n_tiles = (n_out + kOut - 1) / kOut;
  global_pool().parallel_for(n_tiles, [&](size_t b, size_t e) { tiles(x, w, y, n_tokens, n_in, n_out, b, e); });
}

void matmul_nt_serial(const float* x, const float* w, float* y, size_t n_tokens, size_t n_in, size_t n_out) {
  tiles(x, w, y, n_tokens, n_in, n_out, 0, (n_out + kOut - 1) / kOut);
}

}  // namespace spw::ref
