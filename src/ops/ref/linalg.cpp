#include "ops/ref/linalg.h"

#include <cmath>

#include "base/thread_pool.h"
#include "formats/dtypes.h"

namespace spw::ref {

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
