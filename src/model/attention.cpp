// Attention sublayer of both models (specs §4.3 V4, §5.2 V4.1): q LoRA, shared K=V window ring,
// compressed entries (own or shared), indexer selection, sparse attention with sinks,
// de-rotation and the grouped low-rank output projection.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/quant.h"
#include "model/compressor.h"
#include "model/forward_context.h"
#include "model/indexer.h"
#include "ops/ref/attention.h"
#include "ops/ref/hadamard.h"
#include "ops/ref/linalg.h"
#include "ops/ref/rope.h"

namespace spw::detail {
namespace {

const std::vector<float>& layer_rope(const ForwardContext& s, int layer) {
  return s.c.layers[layer].compress_ratio == 0 ? s.rope_main : s.rope_compress;
}

// Fake-quant of a stored window KV row (V4: fp8 block 64 on the non-RoPE channels; V4.1: fp8
// block 32 on all channels).
void quantize_window_kv(const ForwardContext& s, float* row) {
  if (!s.num.fake_quant) return;
  if (s.c.is_v41()) fake_quant_fp8(row, s.c.d_head, 32);
  else fake_quant_fp8(row, s.c.d_head - s.c.d_rope, 64);
}

// The latest layer at or before `layer` that owns compressed KV (V4.1's shared compress_kv).
int latest_kv_source(const ModelConfig& c, int layer) {
  for (int l = layer; l >= 0; --l)
    if (c.layers[l].kv_source) return l;
  return -1;
}

// V4: runs the main compressor over the new tokens and appends finished entries.
void v4_compress(ForwardContext& s, int layer, const float* x) {
  const ModelConfig& c = s.c;
  const LayerWeights& lw = s.w.layers[layer];
  LayerState& ls = s.seq.layers[layer];
  const int r = c.layers[layer].compress_ratio, D = c.d_head;
  const bool overlap = c.layers[layer].attn == AttnKind::Csa;
  const int width = overlap ? 2 * D : D;
  std::vector<float> kv(size_t(s.n) * width), score(size_t(s.n) * width), entry;
  linear(s, lw.comp_wkv, x, s.n, kv.data());     // [n, width] f32
  linear(s, lw.comp_wgate, x, s.n, score.data());  // [n, width] f32
  for (int i = 0; i < s.n; ++i) {
    const int64_t pos = s.p + i;
    float* sc = score.data() + size_t(i) * width;
    for (int ch = 0; ch < width; ++ch) sc[ch] += lw.comp_ape[size_t(pos % r) * width + ch];
    if (!compressor_push_logged(s, layer, ls.comp, r, width, overlap, pos, kv.data() + size_t(i) * width, sc, entry)) continue;
    const int64_t g = pos / r;
    to_activation(s, entry.data(), D);                                       // bf16(entry)
    ref::rms_norm(entry.data(), lw.comp_norm.data(), entry.data(), 1, D, c.norm_eps);
    to_activation(s, entry.data(), D);
    ref::rope_apply(entry.data(), 1, D, s.rope_compress, g * r, false);      // at the group's first token
    to_activation(s, entry.data(), D);
    if (s.num.fake_quant) fake_quant_fp8(entry.data(), D - c.d_rope, 64);
    ls.compressed.insert(ls.compressed.end(), entry.begin(), entry.end());
  }
}

// V4.1 KV source: latents from the compressor (ratio 2 gated, ratio 1 plain), index keys from the
// pre-RoPE latent, then the stored entry (RoPE at the group start, fp4 with e4m3 scales).
// Returns the number of new entries.
int v41_compress(ForwardContext& s, int layer, const float* x) {
  const ModelConfig& c = s.c;
  const LayerWeights& lw = s.w.layers[layer];
  LayerState& ls = s.seq.layers[layer];
  const int r = c.layers[layer].compress_ratio, D = c.d_head, Di = c.index_head_dim;
  std::vector<float> kv(size_t(s.n) * D), score, latent, key(Di);
  linear(s, lw.comp_wkv, x, s.n, kv.data());  // [n, D]
  if (r > 1) {
    score.resize(size_t(s.n) * D);
    linear(s, lw.comp_wgate, x, s.n, score.data());  // [n, D] f32
  }
  int produced = 0;
  for (int i = 0; i < s.n; ++i) {
    const int64_t pos = s.p + i;
    if (r > 1) {
      if (!compressor_push_logged(s, layer, ls.comp, r, D, false, pos, kv.data() + size_t(i) * D,
                                  score.data() + size_t(i) * D, latent))
        continue;
      to_activation(s, latent.data(), D);  // bf16(entry)
    } else {
      latent.assign(kv.begin() + size_t(i) * D, kv.begin() + size_t(i + 1) * D);
    }
    const int64_t g = pos / r;
    ref::rms_norm(latent.data(), lw.comp_norm.data(), latent.data(), 1, D, c.norm_eps);  // [D] pre-RoPE
    to_activation(s, latent.data(), D);
    // Index key: k_norm(wk · latent), RoPE at g·r, fp4 (ue8m0, block 32).
    linear(s, lw.idx_wk, latent.data(), 1, key.data());
    ref::rms_norm(key.data(), lw.idx_k_norm.data(), key.data(), 1, Di, c.norm_eps);
    to_activation(s, key.data(), Di);
    ref::rope_apply(key.data(), 1, Di, s.rope_compress, g * r, false);
    to_activation(s, key.data(), Di);
    if (s.num.fake_quant) fake_quant_fp4_ue8m0(key.data(), Di, 32);
    ls.index_keys.insert(ls.index_keys.end(), key.begin(), key.end());
    // Stored entry.
    ref::rope_apply(latent.data(), 1, D, s.rope_compress, g * r, false);
    to_activation(s, latent.data(), D);
    if (s.num.fake_quant) fake_quant_fp4_e4m3(latent.data(), D, 16);
    ls.compressed.insert(ls.compressed.end(), latent.begin(), latent.end());
    ++produced;
  }
  return produced;
}

}  // namespace

Status attention(ForwardContext& s, int layer, const float* x, float* out) {
  const ModelConfig& c = s.c;
  const LayerWeights& lw = s.w.layers[layer];
  const LayerPlan& plan = c.layers[layer];
  LayerState& ls = s.seq.layers[layer];
  const int n = s.n, d = c.d_model, H = c.n_heads, D = c.d_head, W = c.window;
  const std::vector<float>& rope = layer_rope(s, layer);

  // [n, q_lora] → q [n, H, D]
  std::vector<float> cq(size_t(n) * c.q_lora_rank), q(size_t(n) * H * D);
  linear(s, lw.wq_a, x, n, cq.data());
  ref::rms_norm(cq.data(), lw.q_norm.data(), cq.data(), n, c.q_lora_rank, c.norm_eps);
  to_activation(s, cq.data(), cq.size());
  linear(s, lw.wq_b, cq.data(), n, q.data());
  if (!c.is_v41()) {  // V4: per-head weightless RMS on q
    ref::rms_norm(q.data(), nullptr, q.data(), size_t(n) * H, D, c.norm_eps);
    to_activation(s, q.data(), q.size());
  }
  for (int i = 0; i < n; ++i) ref::rope_apply(q.data() + size_t(i) * H * D, H, D, rope, s.p + i, false);
  to_activation(s, q.data(), q.size());
  dump(s, "attn.q", layer, q.data(), q.size());

  // Window KV of the new tokens: [n, D]
  std::vector<float> kv(size_t(n) * D);
  linear(s, lw.wkv, x, n, kv.data());
  ref::rms_norm(kv.data(), lw.kv_norm.data(), kv.data(), n, D, c.norm_eps);
  to_activation(s, kv.data(), kv.size());
  for (int i = 0; i < n; ++i) {
    ref::rope_apply(kv.data() + size_t(i) * D, 1, D, rope, s.p + i, false);
    to_activation(s, kv.data() + size_t(i) * D, D);
    quantize_window_kv(s, kv.data() + size_t(i) * D);
  }
  dump(s, "attn.kv", layer, kv.data(), kv.size());

  // Compressed entries and the selection of which ones each new token attends to.
  const std::vector<float>* compressed = nullptr;
  std::vector<std::vector<int32_t>> selected(n);
  if (plan.attn == AttnKind::Hca || plan.attn == AttnKind::Csa) {
    v4_compress(s, layer, x);
    compressed = &ls.compressed;
    if (plan.attn == AttnKind::Csa) {
      selected = v4_indexer_select(s, layer, x, cq.data());
    } else {
      for (int i = 0; i < n; ++i)
        for (int64_t g = 0; g < (s.p + i + 1) / plan.compress_ratio; ++g) selected[i].push_back(int32_t(g));
    }
  } else if (plan.attn != AttnKind::Window) {
    int produced = plan.kv_source ? v41_compress(s, layer, x) : 0;
    if (plan.index_source) {
      s.topk = v41_indexer_select(s, layer, x, cq.data(), produced);
    }
    compressed = &s.seq.layers[latest_kv_source(c, layer)].compressed;
    selected = s.topk;
  }

  if (s.options && s.options->on_intermediate) {  // [n, width] ids, −1 padded
    size_t width = 0;
    for (const auto& si : selected) width = std::max(width, si.size());
    std::vector<float> ids(size_t(n) * width, -1.f);
    for (int i = 0; i < n; ++i)
      for (size_t k = 0; k < selected[i].size(); ++k) ids[size_t(i) * width + k] = float(selected[i][k]);
    dump(s, "attn.sel", layer, ids.data(), ids.size());
  }

  // Sparse attention per token over [window rows ; selected compressed rows].
  std::vector<float> o(size_t(n) * H * D);
  const float scale = 1.0f / std::sqrt(float(D));
  if (ls.window.empty()) ls.window.assign(size_t(W) * D, 0.f);
  std::vector<const float*> rows;
  for (int i = 0; i < n; ++i) {
    const int64_t t = s.p + i;
    rows.clear();
    for (int64_t pos = std::max<int64_t>(0, t - W + 1); pos <= t; ++pos)
      rows.push_back(pos >= s.p ? kv.data() + size_t(pos - s.p) * D : ls.window.data() + size_t(pos % W) * D);
    for (int32_t g : selected[i]) rows.push_back(compressed->data() + size_t(g) * D);
    float* oi = o.data() + size_t(i) * H * D;
    ref::sparse_attn_sink(q.data() + size_t(i) * H * D, rows.data(), rows.size(), lw.attn_sink.data(), H, D, scale,
                          s.num.bf16_activations, oi);
    to_activation(s, oi, size_t(H) * D);
    ref::rope_apply(oi, H, D, rope, t, /*inverse=*/true);  // undo the rotation V picked up
    to_activation(s, oi, size_t(H) * D);
  }
  dump(s, "attn.o", layer, o.data(), o.size());
  // The ring keeps the last W positions.
  rollback_window(s, layer);
  for (int i = std::max(0, n - W); i < n; ++i)
    std::memcpy(ls.window.data() + size_t((s.p + i) % W) * D, kv.data() + size_t(i) * D, sizeof(float) * D);

  // Grouped low-rank output: z_g = W_a[g]·o_g (BF16, no activation quant), out = wo_b·z. On a rank of a
  // tensor-parallel group (RankRole::heads_split) the config's heads and groups are the rank's: whole groups, or
  // one group's slice of heads with wo_a's matching input columns; either way out is this rank's part of the sum.
  const int G = c.o_groups, R = c.o_lora_rank, per_group = H * D / G;
  std::vector<float> z(size_t(n) * G * R), og(size_t(n) * per_group), zg(size_t(n) * R);
  for (int g = 0; g < G; ++g) {
    for (int i = 0; i < n; ++i)
      std::memcpy(og.data() + size_t(i) * per_group, o.data() + size_t(i) * H * D + size_t(g) * per_group,
                  sizeof(float) * per_group);
    ref::matmul_nt(og.data(), lw.wo_a.w.data() + size_t(g) * R * per_group, zg.data(), n, per_group, R);
    for (int i = 0; i < n; ++i)
      std::memcpy(z.data() + size_t(i) * G * R + size_t(g) * R, zg.data() + size_t(i) * R, sizeof(float) * R);
  }
  to_activation(s, z.data(), z.size());
  if (!s.role->heads_split) {
    linear(s, lw.wo_b, z.data(), n, out);  // [n, d]
    return {};
  }
  // The rounding of wo_b's output applies to the sum of the ranks' parts, as on one device.
  linear(s, lw.wo_b, z.data(), n, out, /*round_out=*/false);  // [n, d] this rank's part
  SPW_TRY(all_reduce_ranks(*s.role, out, size_t(n) * d));
  if (lw.wo_b.kind != LinearKind::F32) to_activation(s, out, size_t(n) * d);
  return {};
}

}  // namespace spw::detail
