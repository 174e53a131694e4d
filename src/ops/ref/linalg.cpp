#include "ops/ref/linalg.h"

#include <cmath>

#include "base/thread_pool.h"
#include "formats/dtypes.h"

namespace spw::ref {

void matmul_nt(const float* x, const float* w, float* y, size_t n_tokens, size_t n_in, size_t n_out) {
  // Parallel over output features: each thread streams its slice of W once for all tokens.
  global_pool().parallel_for(
      n_out,
      [&](size_t o_begin, size_t o_end) {
        for (size_t o = o_begin; o < o_end; ++o) {
          const float* wr = w + o * n_in;
          for (size_t t = 0; t < n_tokens; ++t) {
            const float* xr = x + t * n_in;
            float acc = 0.f;
            for (size_t k = 0; k < n_in; ++k) acc += xr[k] * wr[k];
            y[t * n_out + o] = acc;
          }
        }
      },
      16);
}

void rms_norm(const float* x, const float* w, float* y, size_t n_rows, size_t d, float eps) {
  for (size_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    double ss = 0.0;
    for (size_t i = 0; i < d; ++i) ss += double(xr[i]) * xr[i];
    float inv = 1.0f / std::sqrt(float(ss / double(d)) + eps);
    for (size_t i = 0; i < d; ++i) yr[i] = (w ? w[i] : 1.0f) * (xr[i] * inv);
  }
}

void round_bf16_inplace(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

}  // namespace spw::ref
