#include "ops/ref/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace spw::ref {

std::vector<float> rope_frequencies(const RopeParams& p) {
  const int half = p.d_rope / 2;
  std::vector<float> f(half);
  for (int i = 0; i < half; ++i) f[i] = 1.0f / std::pow(p.base, float(2 * i) / float(p.d_rope));
  if (!p.yarn) return f;
  // The YaRN correction range: dims whose wavelength fits the original context keep θ.
  auto corr = [&](float rotations) {
    return p.d_rope * std::log(float(p.yarn_original_len) / (rotations * 2.0f * std::numbers::pi_v<float>)) /
           (2.0f * std::log(p.base));
  };
  float low = std::max(std::floor(corr(p.beta_fast)), 0.0f);
  float high = std::min(std::ceil(corr(p.beta_slow)), float(p.d_rope - 1));
  if (low == high) high += 0.001f;
  for (int i = 0; i < half; ++i) {
    float ramp = std::clamp((float(i) - low) / (high - low), 0.0f, 1.0f);
    f[i] = f[i] / p.yarn_factor * ramp + f[i] * (1.0f - ramp);
  }
  return f;
}

void rope_apply(float* x, size_t n_vectors, size_t d, const std::vector<float>& freqs, int64_t pos,
                bool inverse) {
  const size_t d_rope = freqs.size() * 2;
  for (size_t i = 0; i < freqs.size(); ++i) {
    float angle = float(pos) * freqs[i];
    float c = std::cos(angle), s = std::sin(angle);
    if (inverse) s = -s;
    for (size_t v = 0; v < n_vectors; ++v) {
      float* r = x + v * d + (d - d_rope) + 2 * i;
      float a = r[0], b = r[1];
      r[0] = a * c - b * s;
      r[1] = a * s + b * c;
    }
  }
}

}  // namespace spw::ref
