#include "ops/ref/attention.h"

#include <cmath>
#include <vector>

#include "formats/dtypes.h"

namespace spw::ref {

void sparse_attn_sink(const float* q, const float* const* kv_rows, size_t n_rows, const float* sink,
                      size_t n_heads, size_t d_head, float scale, bool round_p_bf16, float* out) {
  std::vector<float> logits(n_rows);
  for (size_t h = 0; h < n_heads; ++h) {
    const float* qh = q + h * d_head;
    float m = -INFINITY;
    for (size_t j = 0; j < n_rows; ++j) {
      float acc = 0.f;
      for (size_t i = 0; i < d_head; ++i) acc += qh[i] * kv_rows[j][i];
      logits[j] = acc * scale;
      m = std::fmax(m, logits[j]);
    }
    float* oh = out + h * d_head;
    for (size_t i = 0; i < d_head; ++i) oh[i] = 0.f;
    if (n_rows == 0) continue;  // only the sink: the output is zero
    float denom = 0.f;
    for (size_t j = 0; j < n_rows; ++j) {
      float p = std::exp(logits[j] - m);
      denom += p;
      float pv = round_p_bf16 ? round_bf16(p) : p;
      for (size_t i = 0; i < d_head; ++i) oh[i] += pv * kv_rows[j][i];
    }
    denom += std::exp(sink[h] - m);
    for (size_t i = 0; i < d_head; ++i) oh[i] /= denom;
  }
}

}  // namespace spw::ref
