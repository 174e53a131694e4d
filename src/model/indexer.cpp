#include "model/indexer.h"

#include <algorithm>
#include <cmath>

#include "formats/dtypes.h"
#include "formats/quant.h"
#include "model/compressor.h"
#include "ops/ref/hadamard.h"
#include "ops/ref/linalg.h"
#include "ops/ref/rope.h"
#include "ops/ref/topk.h"

namespace spw::detail {
namespace {

// Index queries [n, Hi, Di] and head weights [n, Hi] for the new tokens.
void index_queries(ForwardContext& s, const LayerWeights& lw, const float* x, const float* cq, bool hadamard,
                   std::vector<float>& qi, std::vector<float>& wts) {
  const ModelConfig& c = s.c;
  const int n = s.n, Hi = c.index_n_heads, Di = c.index_head_dim;
  qi.resize(size_t(n) * Hi * Di);
  wts.resize(size_t(n) * Hi);
  linear(s, lw.idx_wq_b, cq, n, qi.data());
  for (int i = 0; i < n; ++i) ref::rope_apply(qi.data() + size_t(i) * Hi * Di, Hi, Di, s.rope_compress, s.p + i, false);
  to_activation(s, qi.data(), qi.size());
  if (hadamard) {
    ref::hadamard_rows(qi.data(), size_t(n) * Hi, Di);
    to_activation(s, qi.data(), qi.size());
  }
  if (s.num.fake_quant)
    for (size_t r = 0; r < size_t(n) * Hi; ++r) fake_quant_fp4_ue8m0(qi.data() + r * Di, Di, 32);
  linear(s, lw.idx_weights_proj, x, n, wts.data());
  const float w_scale = 1.0f / std::sqrt(float(Di)) / std::sqrt(float(Hi));
  for (float& v : wts) v *= w_scale;
  to_activation(s, wts.data(), wts.size());
}

// score(t, g) = Σ_h relu(q_h·k_g)·w_h for g < n_entries; −∞ where g >= visible. The reference
// computes it in bf16: each dot, each weighted term and the sum are rounded (when `round`).
std::vector<float> index_scores(const float* q, const float* w, const float* keys, int64_t n_entries,
                                int64_t visible, int Hi, int Di, bool round) {
  auto r = [round](float v) { return round ? round_bf16(v) : v; };
  std::vector<float> scores(n_entries, -INFINITY);
  for (int64_t g = 0; g < std::min(n_entries, visible); ++g) {
    const float* k = keys + size_t(g) * Di;
    float acc = 0.f;
    for (int h = 0; h < Hi; ++h) {
      float dot = 0.f;
      for (int i = 0; i < Di; ++i) dot += q[size_t(h) * Di + i] * k[i];
      acc += r(std::max(r(dot), 0.f) * w[h]);
    }
    scores[g] = r(acc);
  }
  return scores;
}

// Top-k finite scores, ascending by entry id.
std::vector<int32_t> select_top(const std::vector<float>& scores, int k) {
  std::vector<int32_t> top = ref::topk_indices(scores.data(), scores.size(), size_t(k));
  std::erase_if(top, [&](int32_t g) { return !std::isfinite(scores[g]); });
  std::sort(top.begin(), top.end());
  return top;
}

}  // namespace

std::vector<char> select_candidate_blocks(const std::vector<float>& scores, int block_size, int64_t newest,
                                          int n_blocks_keep) {
  const int64_t n = int64_t(scores.size());
  const int64_t n_blocks = (n + block_size - 1) / block_size;
  std::vector<float> block_score(n_blocks, -INFINITY);
  for (int64_t g = 0; g < n; ++g) block_score[g / block_size] = std::max(block_score[g / block_size], scores[g]);
  if (newest >= 0) block_score[newest / block_size] = INFINITY;
  std::vector<int32_t> keep = ref::topk_indices(block_score.data(), n_blocks, size_t(n_blocks_keep));
  std::vector<char> mask(n, 0);
  for (int32_t b : keep) {
    if (block_score[b] == -INFINITY) continue;
    for (int64_t g = int64_t(b) * block_size; g < std::min(n, int64_t(b + 1) * block_size); ++g) mask[g] = 1;
  }
  return mask;
}

std::vector<std::vector<int32_t>> v4_indexer_select(ForwardContext& s, int layer, const float* x, const float* cq) {
  const ModelConfig& c = s.c;
  const LayerWeights& lw = s.w.layers[layer];
  LayerState& ls = s.seq.layers[layer];
  const int n = s.n, r = c.layers[layer].compress_ratio, Hi = c.index_n_heads, Di = c.index_head_dim;

  // The indexer's own overlapping compressor (width 2·Di) → keys [Di]: norm, RoPE, Hadamard, fp4.
  std::vector<float> kv(size_t(n) * 2 * Di), score(size_t(n) * 2 * Di), entry;
  linear(s, lw.idx_comp_wkv, x, n, kv.data());
  linear(s, lw.idx_comp_wgate, x, n, score.data());
  for (int i = 0; i < n; ++i) {
    const int64_t pos = s.p + i;
    float* sc = score.data() + size_t(i) * 2 * Di;
    for (int ch = 0; ch < 2 * Di; ++ch) sc[ch] += lw.idx_comp_ape[size_t(pos % r) * 2 * Di + ch];
    if (!compressor_push_logged(s, layer, ls.idx_comp, r, 2 * Di, true, pos, kv.data() + size_t(i) * 2 * Di, sc, entry)) continue;
    to_activation(s, entry.data(), Di);
    ref::rms_norm(entry.data(), lw.idx_comp_norm.data(), entry.data(), 1, Di, c.norm_eps);
    to_activation(s, entry.data(), Di);
    ref::rope_apply(entry.data(), 1, Di, s.rope_compress, (pos / r) * r, false);
    to_activation(s, entry.data(), Di);
    ref::hadamard_rows(entry.data(), 1, Di);
    to_activation(s, entry.data(), Di);
    if (s.num.fake_quant) fake_quant_fp4_ue8m0(entry.data(), Di, 32);
    ls.index_keys.insert(ls.index_keys.end(), entry.begin(), entry.end());
  }

  std::vector<float> qi, wts;
  index_queries(s, lw, x, cq, /*hadamard=*/true, qi, wts);
  const int64_t n_entries = int64_t(ls.index_keys.size() / Di);
  std::vector<std::vector<int32_t>> out(n);
  for (int i = 0; i < n; ++i) {
    const int64_t visible = (s.p + i + 1) / r;
    auto scores = index_scores(qi.data() + size_t(i) * Hi * Di, wts.data() + size_t(i) * Hi, ls.index_keys.data(),
                               n_entries, visible, Hi, Di, s.num.bf16_activations);
    out[i] = select_top(scores, c.index_topk);
  }
  return out;
}

std::vector<std::vector<int32_t>> v41_indexer_select(ForwardContext& s, int layer, const float* x, const float* cq,
                                                     int produced) {
  const ModelConfig& c = s.c;
  const LayerPlan& plan = c.layers[layer];
  const LayerWeights& lw = s.w.layers[layer];
  const int n = s.n, r = plan.compress_ratio, Hi = c.index_n_heads, Di = c.index_head_dim;
  const int64_t compress_len = (s.p + n) / r;

  // Whose index keys: a KV source uses its own, unless (the reference's decode quirk) it
  // produced no latent this step, in which case it reads the keys published last.
  int key_layer;
  if (plan.kv_source && (produced > 0 || !s.num.stale_index_k)) {
    key_layer = layer;
    s.seq.published_index_k_layer = layer;
  } else if (s.num.stale_index_k) {
    key_layer = s.seq.published_index_k_layer;
  } else {
    key_layer = layer;
    while (key_layer >= 0 && !c.layers[key_layer].kv_source) --key_layer;
  }
  std::vector<std::vector<int32_t>> out(n);
  if (compress_len == 0 || key_layer < 0) return out;
  const std::vector<float>& keys = s.seq.layers[key_layer].index_keys;
  SPW_CHECK(int64_t(keys.size() / Di) >= compress_len);

  std::vector<float> qi, wts;
  index_queries(s, lw, x, cq, /*hadamard=*/false, qi, wts);
  if (plan.candidate_source) s.candidates.assign(n, {});
  for (int i = 0; i < n; ++i) {
    const int64_t visible = (s.p + i + 1) / r;
    auto scores = index_scores(qi.data() + size_t(i) * Hi * Di, wts.data() + size_t(i) * Hi, keys.data(),
                               compress_len, visible, Hi, Di, s.num.bf16_activations);
    if (plan.candidate_source)
      s.candidates[i] = select_candidate_blocks(scores, c.candidate_block_size, visible - 1, c.candidate_topk_blocks);
    if (plan.attn == AttnKind::Reindex) {
      SPW_CHECK(s.candidates.size() == size_t(n));
      const std::vector<char>& mask = s.candidates[i];
      for (int64_t g = 0; g < compress_len; ++g)
        if (g >= int64_t(mask.size()) || !mask[g]) scores[g] = -INFINITY;
    }
    out[i] = select_top(scores, c.index_topk);
  }
  return out;
}

}  // namespace spw::detail
