// V4.1 Engram (specs §5.4): n-gram hash rows gathered from the fp8 tables, projected to keys and
// a value, and gated per residual copy.
#include <cmath>
#include <cstring>

#include "formats/quant.h"
#include "model/forward_context.h"
#include "ops/ref/linalg.h"

namespace spw::detail {

void engram(ForwardContext& s, int layer, float* streams) {
  const ModelConfig& c = s.c;
  const EngramWeights& ew = s.w.layers[layer].engram;
  int slot = 0;
  while (c.engram_layers[slot] != layer) ++slot;
  const ref::EngramHashParams& hp = s.engram_params[slot];
  const int n = s.n, d = c.d_model, hc = c.hc_mult, hd = c.engram_head_dim, M = c.engram_max_ngram;
  const int n_rows = (M - 1) * c.engram_n_heads, n_in = n_rows * hd;

  // Gather: rows [n, n_rows·hd], dequantized from fp8 with 1×32 ue8m0 scales.
  std::vector<float> gathered(size_t(n) * n_in);
  std::vector<int64_t> row_ids(n_rows), history(M);
  const std::vector<int64_t>& recent = s.seq.engram_recent;  // before this step's tokens
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < M; ++k) {  // history[k] = compressed id at position (p+i−k)
      const int64_t j = int64_t(i) - k;  // index into this step's tokens
      if (j >= 0) history[k] = is_image_position(s, int(j)) ? ref::kEngramDead : s.w.engram_token_map[s.tokens[j]];
      else if (int64_t(recent.size()) + j >= 0) history[k] = recent[recent.size() + j];
      else history[k] = ref::kEngramBeforeStart;
    }
    ref::engram_rows(hp, history.data(), row_ids.data());
    for (int r = 0; r < n_rows; ++r)
      dequant_fp8_rows(ew.table->data + size_t(row_ids[r]) * hd, ew.table_scale->data + size_t(row_ids[r]) * (hd / 32),
                       1, hd, 32, gathered.data() + size_t(i) * n_in + size_t(r) * hd);
  }

  // kv [n, (hc+1)·d] = wkv · rows: hc keys and one value.
  std::vector<float> kv(size_t(n) * (hc + 1) * d);
  linear(s, ew.wkv, gathered.data(), n, kv.data());
  const float inv_sqrt_d = 1.0f / std::sqrt(float(d));
  for (int i = 0; i < n; ++i) {
    if (is_image_position(s, i)) continue;  // gate 0: the streams pass unchanged (they are activations already)
    const float* key = kv.data() + size_t(i) * (hc + 1) * d;
    const float* value = key + size_t(hc) * d;
    for (int j = 0; j < hc; ++j) {
      float* xj = streams + (size_t(i) * hc + j) * d;
      const float* kj = key + size_t(j) * d;
      double sx = 0, sk = 0, dot = 0;
      for (int ch = 0; ch < d; ++ch) {
        const float wgt = ew.q_weight[size_t(j) * d + ch] * ew.k_weight[size_t(j) * d + ch];
        sx += double(xj[ch]) * xj[ch];
        sk += double(kj[ch]) * kj[ch];
        dot += double(xj[ch]) * wgt * kj[ch];
      }
      const float rx = 1.0f / std::sqrt(float(sx / d) + c.norm_eps);
      const float rk = 1.0f / std::sqrt(float(sk / d) + c.norm_eps);
      const float g_dot = float(dot) * rx * rk * inv_sqrt_d;
      const float sign = float((g_dot > 0.f) - (g_dot < 0.f));
      const float gate = ref::sigmoid(sign * std::sqrt(std::max(std::fabs(g_dot), 1e-6f)));
      for (int ch = 0; ch < d; ++ch) xj[ch] += gate * value[ch];
      to_activation(s, xj, d);
    }
  }
}

}  // namespace spw::detail
