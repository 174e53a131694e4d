// Attention sublayer on the GPU (model/attention.cpp, compressor.cpp, indexer.cpp): q LoRA, the
// window ring, compressed entries (own or shared), the indexers' selection, sparse attention with
// sinks, de-rotation and the grouped low-rank output projection. Compressed entries and index keys
// go straight into the compact pools; kv_write quantizes them exactly as the reference's fake quant.
#include <cmath>

#include "cuda/attn/indexer.h"
#include "cuda/attn/sparse_attn.h"
#include "cuda/ops/act_quant.h"
#include "cuda/ops/norm.h"
#include "cuda/ops/rope.h"
#include "engine/engine_kernels.h"
#include "engine/gpu_step.h"
#include "ops/ref/hadamard.h"

namespace spw::engine {
namespace {

using Buf = DeviceBuffer<float>;

const float* layer_rope(const GpuStep& s, int layer) {
  return s.c.layers[layer].compress_ratio == 0 ? s.st.rope_main.get() : s.st.rope_compress.get();
}

// x[rows, d] ← RMSNorm(x)·w in place, rounded to bf16 (the reference's norm + to_activation).
Status norm(GpuStep& s, float* x, const float* w, int64_t rows, int64_t d) {
  return cuda::rms_norm(x, w, x, rows, d, s.c.norm_eps, s.num.bf16_activations, s.stream);
}

// The latest layer at or before `layer` that owns compressed KV (V4.1's shared compress_kv).
int latest_kv_source(const ModelConfig& c, int layer) {
  for (int l = layer; l >= 0; --l)
    if (c.layers[l].kv_source) return l;
  return -1;
}

// Entries of a ratio-r compressor that complete in this step: ids first .. first + count − 1.
struct NewEntries {
  int64_t first = 0;
  int count = 0;
};
NewEntries new_entries(const GpuStep& s, int r) { return {s.p / r, int((s.p + s.n) / r - s.p / r)}; }

// Device arrays for writing `e`'s entries: their ids (pool rows) and RoPE positions g·r.
Status entry_rows(const NewEntries& e, int r, DeviceBuffer<int64_t>& ids, DeviceBuffer<int64_t>& rope_pos) {
  std::vector<int64_t> g(e.count), gp(e.count);
  for (int i = 0; i < e.count; ++i) g[i] = e.first + i, gp[i] = (e.first + i) * r;
  SPW_TRY(upload(g, ids));
  return upload(gp, rope_pos);
}

// Streams this step's projected rows through `cb` and returns the pooled entries [e.count, d_out].
Status compress_push(GpuStep& s, const CompressorBuffers& cb, const float* kv, const float* score, const float* ape,
                     const NewEntries& e, Buf& entries) {
  SPW_TRY(entries.alloc(size_t(std::max(e.count, 1)) * cb.shape.d_out()));
  cuda::CompressorChunks chunks{s.slots.get(), s.pos0s.get(), s.n_tokens.get(), s.zeros.get(), s.zeros.get()};
  return cuda::compressor_push_cuda(cb.shape, cb.view(), kv, score, ape, chunks, 1, std::max(e.count, 1),
                                    entries.get(), s.stream);
}

// The reference's Hadamard transform of rows [n_rows, n] (V4 indexer), on the host: a round trip.
Status hadamard_rows_host(float* x, int64_t n_rows, int n) {
  std::vector<float> h;
  SPW_TRY(download(x, size_t(n_rows) * n, h));
  ref::hadamard_rows(h.data(), size_t(n_rows), size_t(n));
  SPW_CUDA_TRY(cudaMemcpy(x, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  return {};
}

// V4: runs the main compressor over the new tokens and appends finished entries to the pool.
Status v4_compress(GpuStep& s, int layer, const float* x) {
  const ModelConfig& c = s.c;
  const DeviceLayer& lw = s.w.layers[layer];
  const CompressorBuffers& cb = s.st.comp_state[layer];
  const int r = cb.shape.ratio, D = c.d_head, width = cb.shape.width, n = s.n;
  const NewEntries e = new_entries(s, r);
  Buf kv, score, entry;
  SPW_TRY(kv.alloc(size_t(n) * width));
  SPW_TRY(score.alloc(size_t(n) * width));
  SPW_TRY(linear(s, lw.comp_wkv, x, n, kv.get()));                                   // [n, width] f32
  SPW_TRY(linear(s, lw.comp_wgate, x, n, score.get()));                              // [n, width] f32
  SPW_TRY(compress_push(s, cb, kv.get(), score.get(), lw.comp_ape, e, entry));      // [count, D]
  if (e.count == 0) return {};
  DeviceBuffer<int64_t> ids, rope_pos;
  SPW_TRY(entry_rows(e, r, ids, rope_pos));
  SPW_TRY(to_activation(s, entry.get(), int64_t(e.count) * D));
  SPW_TRY(norm(s, entry.get(), lw.comp_norm, e.count, D));
  SPW_TRY(cuda::rope_apply(entry.get(), e.count, D, c.d_rope, s.st.rope_compress.get(), rope_pos.get(), 1, false,
                           s.stream));                                               // at the group's first token
  SPW_TRY(to_activation(s, entry.get(), int64_t(e.count) * D));
  // fp8 on the non-RoPE channels (block 64): the pool's row format.
  return cuda::kv_write_rows_cuda(s.st.comp.view(layer), entry.get(), s.slots.get(), ids.get(), e.count, s.stream);
}

// V4.1 KV source: latents (ratio 2 gated, ratio 1 plain), index keys from the pre-RoPE latent, then
// the stored entry. Returns the number of new entries through `produced`.
Status v41_compress(GpuStep& s, int layer, const float* x, int& produced) {
  const ModelConfig& c = s.c;
  const DeviceLayer& lw = s.w.layers[layer];
  const int r = c.layers[layer].compress_ratio, D = c.d_head, Di = c.index_head_dim, n = s.n;
  const NewEntries e = new_entries(s, r);
  Buf kv, score, pooled, key;
  SPW_TRY(kv.alloc(size_t(n) * D));
  SPW_TRY(linear(s, lw.comp_wkv, x, n, kv.get()));                                     // [n, D]
  Buf* latent = &kv;
  if (r > 1) {
    SPW_TRY(score.alloc(size_t(n) * D));
    SPW_TRY(linear(s, lw.comp_wgate, x, n, score.get()));                              // [n, D] f32
    SPW_TRY(compress_push(s, s.st.comp_state[layer], kv.get(), score.get(), nullptr, e, pooled));  // [count, D]
    SPW_TRY(to_activation(s, pooled.get(), int64_t(e.count) * D));
    latent = &pooled;
  }
  produced = e.count;
  if (e.count == 0) return {};
  DeviceBuffer<int64_t> ids, rope_pos;
  SPW_TRY(entry_rows(e, r, ids, rope_pos));
  // [count, D] pre-RoPE latent
  SPW_TRY(norm(s, latent->get(), lw.comp_norm, e.count, D));
  // Index keys [count, Di]: k_norm(wk · latent), RoPE at g·r, fp4 (ue8m0, block 32) in the pool.
  SPW_TRY(key.alloc(size_t(e.count) * Di));
  SPW_TRY(linear(s, lw.idx_wk, latent->get(), e.count, key.get()));
  SPW_TRY(norm(s, key.get(), lw.idx_k_norm, e.count, Di));
  SPW_TRY(cuda::rope_apply(key.get(), e.count, Di, c.d_rope, s.st.rope_compress.get(), rope_pos.get(), 1, false,
                           s.stream));
  SPW_TRY(to_activation(s, key.get(), int64_t(e.count) * Di));
  SPW_TRY(cuda::kv_write_rows_cuda(s.st.keys.view(layer), key.get(), s.slots.get(), ids.get(), e.count, s.stream));
  // Stored entry [count, D]: RoPE at g·r, fp4 with e4m3 scales per 16 (the pool's row format).
  SPW_TRY(cuda::rope_apply(latent->get(), e.count, D, c.d_rope, s.st.rope_compress.get(), rope_pos.get(), 1, false,
                           s.stream));
  SPW_TRY(to_activation(s, latent->get(), int64_t(e.count) * D));
  return cuda::kv_write_rows_cuda(s.st.comp.view(layer), latent->get(), s.slots.get(), ids.get(), e.count, s.stream);
}

// Index queries qi [n, Hi, Di] (fp4-quantized) and head weights wts [n, Hi].
Status index_queries(GpuStep& s, const DeviceLayer& lw, const float* x, const float* cq, bool hadamard, Buf& qi,
                     Buf& wts) {
  const ModelConfig& c = s.c;
  const int n = s.n, Hi = c.index_n_heads, Di = c.index_head_dim;
  SPW_TRY(qi.alloc(size_t(n) * Hi * Di));
  SPW_TRY(wts.alloc(size_t(n) * Hi));
  SPW_TRY(linear(s, lw.idx_wq_b, cq, n, qi.get()));                                  // [n, Hi·Di]
  SPW_TRY(cuda::rope_apply(qi.get(), int64_t(n) * Hi, Di, c.d_rope, s.st.rope_compress.get(), s.pos.get(), Hi, false,
                           s.stream));
  SPW_TRY(to_activation(s, qi.get(), qi.size()));
  if (hadamard) {
    SPW_TRY(hadamard_rows_host(qi.get(), int64_t(n) * Hi, Di));
    SPW_TRY(to_activation(s, qi.get(), qi.size()));
  }
  SPW_TRY(cuda::fake_quant_fp4_ue8m0(qi.get(), int64_t(n) * Hi, Di, Di, 32, s.stream));
  SPW_TRY(linear(s, lw.idx_weights_proj, x, n, wts.get()));                          // [n, Hi]
  const float w_scale = 1.0f / std::sqrt(float(Di)) / std::sqrt(float(Hi));
  SPW_TRY(scale_cuda(wts.get(), int64_t(n) * Hi, w_scale, s.stream));
  return to_activation(s, wts.get(), wts.size());
}

// Per-query scoring arguments over `n_entries` keys of `key_layer`; visible(i) = (p+i+1)/r.
struct ScoreInputs {
  DeviceBuffer<int64_t> n_entries, visible;
};
Status score_inputs(const GpuStep& s, int64_t n_entries, int r, ScoreInputs& in) {
  std::vector<int64_t> ne(s.n, n_entries), vis(s.n);
  for (int i = 0; i < s.n; ++i) vis[i] = (s.p + i + 1) / r;
  SPW_TRY(upload(ne, in.n_entries));
  return upload(vis, in.visible);
}

Status index_scores(GpuStep& s, const Buf& qi, const Buf& wts, int key_layer, int64_t n_entries,
                    const ScoreInputs& in, Buf& scores) {
  const ModelConfig& c = s.c;
  SPW_TRY(scores.alloc(size_t(s.n) * n_entries));
  cuda::IndexScoreArgs a;
  a.q = qi.get(), a.w = wts.get(), a.n_q = s.n, a.n_heads = c.index_n_heads, a.d_index = c.index_head_dim;
  a.q_seq = s.slots.get(), a.n_entries = in.n_entries.get(), a.visible = in.visible.get();
  a.max_entries = n_entries, a.keys = s.st.keys.view(key_layer), a.round_bf16 = s.num.bf16_activations;
  a.scores = scores.get(), a.score_stride = n_entries;
  return cuda::index_scores_cuda(a, s.stream);  // [n, n_entries]
}

// V4 CSA layer: the indexer's own overlapping compressor (keys: norm, RoPE, Hadamard, fp4), then
// the top-index_topk visible entries per token → sel [n, index_topk].
Status v4_indexer_select(GpuStep& s, int layer, const float* x, const float* cq, DeviceBuffer<int32_t>& sel) {
  const ModelConfig& c = s.c;
  const DeviceLayer& lw = s.w.layers[layer];
  const CompressorBuffers& cb = s.st.idx_comp_state[layer];
  const int n = s.n, r = cb.shape.ratio, Di = c.index_head_dim, K = c.index_topk;
  const NewEntries e = new_entries(s, r);
  Buf kv, score, entry;
  SPW_TRY(kv.alloc(size_t(n) * 2 * Di));
  SPW_TRY(score.alloc(size_t(n) * 2 * Di));
  SPW_TRY(linear(s, lw.idx_comp_wkv, x, n, kv.get()));                               // [n, 2·Di] f32
  SPW_TRY(linear(s, lw.idx_comp_wgate, x, n, score.get()));                          // [n, 2·Di] f32
  SPW_TRY(compress_push(s, cb, kv.get(), score.get(), lw.idx_comp_ape, e, entry));  // [count, Di]
  if (e.count > 0) {
    DeviceBuffer<int64_t> ids, rope_pos;
    SPW_TRY(entry_rows(e, r, ids, rope_pos));
    const int64_t m = int64_t(e.count) * Di;
    SPW_TRY(to_activation(s, entry.get(), m));
    SPW_TRY(norm(s, entry.get(), lw.idx_comp_norm, e.count, Di));
    SPW_TRY(cuda::rope_apply(entry.get(), e.count, Di, c.d_rope, s.st.rope_compress.get(), rope_pos.get(), 1, false,
                             s.stream));
    SPW_TRY(to_activation(s, entry.get(), m));
    SPW_TRY(hadamard_rows_host(entry.get(), e.count, Di));
    SPW_TRY(to_activation(s, entry.get(), m));
    SPW_TRY(cuda::kv_write_rows_cuda(s.st.keys.view(layer), entry.get(), s.slots.get(), ids.get(), e.count,
                                     s.stream));  // fp4, ue8m0 per 32
  }
  SPW_TRY(sel.alloc(size_t(n) * K));
  const int64_t n_entries = (s.p + n) / r;
  if (n_entries == 0) {
    SPW_CUDA_TRY(cudaMemset(sel.get(), 0xff, sel.nbytes()));  // −1: nothing selected
    return {};
  }
  Buf qi, wts, scores;
  SPW_TRY(index_queries(s, lw, x, cq, /*hadamard=*/true, qi, wts));
  ScoreInputs in;
  SPW_TRY(score_inputs(s, n_entries, r, in));
  SPW_TRY(index_scores(s, qi, wts, layer, n_entries, in, scores));
  return cuda::topk_select_cuda(scores.get(), n_entries, in.n_entries.get(), n, K, sel.get(), K, s.stream);
}

// V4.1 index source: scores over the latest published keys (Numerics::stale_index_k), the
// candidate blocks (candidate source: publish; re-index layer: mask), top-k → s.topk.
Status v41_indexer_select(GpuStep& s, int layer, const float* x, const float* cq, int produced) {
  const ModelConfig& c = s.c;
  const LayerPlan& plan = c.layers[layer];
  const DeviceLayer& lw = s.w.layers[layer];
  const int n = s.n, r = plan.compress_ratio, K = c.index_topk;
  const int64_t compress_len = (s.p + n) / r;

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
  SPW_CUDA_TRY(cudaMemset(s.topk.get(), 0xff, s.topk.nbytes()));  // −1: nothing selected
  if (compress_len == 0 || key_layer < 0) return {};
  SPW_CHECK((s.p + n) / c.layers[key_layer].compress_ratio >= compress_len);

  Buf qi, wts, scores;
  SPW_TRY(index_queries(s, lw, x, cq, /*hadamard=*/false, qi, wts));
  ScoreInputs in;
  SPW_TRY(score_inputs(s, compress_len, r, in));
  SPW_TRY(index_scores(s, qi, wts, key_layer, compress_len, in, scores));  // [n, compress_len]
  if (plan.candidate_source) {
    const int bs = c.candidate_block_size, kb = c.candidate_topk_blocks;
    const int64_t nb = (compress_len + bs - 1) / bs;
    Buf block_scores;
    DeviceBuffer<int64_t> n_blocks;
    DeviceBuffer<int32_t> kept;
    SPW_TRY(block_scores.alloc(size_t(n) * nb));
    SPW_TRY(n_blocks.alloc(n));
    SPW_TRY(kept.alloc(size_t(n) * kb));
    SPW_TRY(cuda::candidate_block_scores_cuda(scores.get(), compress_len, in.n_entries.get(), in.visible.get(), n,
                                              compress_len, bs, block_scores.get(), nb, n_blocks.get(), s.stream));
    SPW_TRY(cuda::topk_select_cuda(block_scores.get(), nb, n_blocks.get(), n, kb, kept.get(), kb, s.stream));
    // The mask is as wide as any layer's entries can be this step (ratio ≥ 1), zero beyond ours.
    s.cand_stride = s.p + n;
    SPW_TRY(s.candidates.alloc(size_t(n) * s.cand_stride));
    SPW_CUDA_TRY(cudaMemset(s.candidates.get(), 0, s.candidates.nbytes()));
    SPW_TRY(cuda::candidate_mask_cuda(kept.get(), kb, in.n_entries.get(), n, compress_len, bs, s.candidates.get(),
                                      s.cand_stride, s.stream));
    s.has_candidates = true;
  }
  if (plan.attn == AttnKind::Reindex) {
    SPW_CHECK(s.has_candidates);
    SPW_TRY(cuda::index_scores_apply_mask_cuda(scores.get(), compress_len, in.n_entries.get(), n, compress_len,
                                               s.candidates.get(), s.cand_stride, s.stream));
  }
  return cuda::topk_select_cuda(scores.get(), compress_len, in.n_entries.get(), n, K, s.topk.get(), K, s.stream);
}

}  // namespace

Status attention(GpuStep& s, int layer, const float* x, float* out) {
  const ModelConfig& c = s.c;
  const DeviceLayer& lw = s.w.layers[layer];
  const LayerPlan& plan = c.layers[layer];
  const int n = s.n, H = c.n_heads, D = c.d_head, W = c.window;
  const float* rope = layer_rope(s, layer);

  // [n, q_lora] → q [n, H, D]
  Buf cq, q, kv;
  SPW_TRY(cq.alloc(size_t(n) * c.q_lora_rank));
  SPW_TRY(q.alloc(size_t(n) * H * D));
  SPW_TRY(linear(s, lw.wq_a, x, n, cq.get()));                                                   // [n, q_lora]
  SPW_TRY(norm(s, cq.get(), lw.q_norm, n, c.q_lora_rank));
  SPW_TRY(linear(s, lw.wq_b, cq.get(), n, q.get()));                                              // [n, H·D]
  if (!c.is_v41())  // V4: per-head weightless RMS on q
    SPW_TRY(norm(s, q.get(), nullptr, int64_t(n) * H, D));
  SPW_TRY(cuda::rope_apply(q.get(), int64_t(n) * H, D, c.d_rope, rope, s.pos.get(), H, false, s.stream));
  SPW_TRY(to_activation(s, q.get(), q.size()));                                                  // [n, H, D]

  // Window KV of the new tokens [n, D], fake-quantized as the ring stores it.
  SPW_TRY(kv.alloc(size_t(n) * D));
  SPW_TRY(linear(s, lw.wkv, x, n, kv.get()));
  SPW_TRY(norm(s, kv.get(), lw.kv_norm, n, D));
  SPW_TRY(cuda::rope_apply(kv.get(), n, D, c.d_rope, rope, s.pos.get(), 1, false, s.stream));
  SPW_TRY(to_activation(s, kv.get(), kv.size()));
  if (c.is_v41()) SPW_TRY(cuda::fake_quant_fp8(kv.get(), n, D, D, 32, s.stream));
  else SPW_TRY(cuda::fake_quant_fp8(kv.get(), n, D - c.d_rope, D, 64, s.stream));

  // Compressed entries and the selection [n, sel_stride] (−1 padded) of each new token.
  DeviceBuffer<int32_t> own_sel;
  const int32_t* sel = nullptr;
  int sel_stride = 0;
  cuda::KvPages comp = s.st.comp.view(layer);
  if (plan.attn == AttnKind::Hca || plan.attn == AttnKind::Csa) {
    SPW_TRY(v4_compress(s, layer, x));
    if (plan.attn == AttnKind::Csa) {
      SPW_TRY(v4_indexer_select(s, layer, x, cq.get(), own_sel));
      sel_stride = c.index_topk;
    } else {  // HCA: every visible entry, built on the host
      const int r = plan.compress_ratio;
      sel_stride = int(std::max<int64_t>(1, (s.p + n) / r));
      std::vector<int32_t> h(size_t(n) * sel_stride, -1);
      for (int i = 0; i < n; ++i)
        for (int64_t g = 0; g < (s.p + i + 1) / r; ++g) h[size_t(i) * sel_stride + g] = int32_t(g);
      SPW_TRY(upload(h, own_sel));
    }
    sel = own_sel.get();
  } else if (plan.attn != AttnKind::Window) {
    int produced = 0;
    if (plan.kv_source) SPW_TRY(v41_compress(s, layer, x, produced));
    if (plan.index_source) SPW_TRY(v41_indexer_select(s, layer, x, cq.get(), produced));
    comp = s.st.comp.view(latest_kv_source(c, layer));
    sel = s.topk.get();
    sel_stride = c.index_topk;
  }
  if (W + sel_stride > cuda::kSparseAttnMaxRows)
    return make_error("attention: ", W + sel_stride, " rows per query exceed the kernel's ", cuda::kSparseAttnMaxRows);

  // Sparse attention per token over [window rows ; selected compressed rows] → o [n, H, D].
  Buf o;
  SPW_TRY(o.alloc(size_t(n) * H * D));
  cuda::SparseAttnArgs a;
  a.q = q.get(), a.sink = lw.attn_sink, a.n_q = n, a.n_heads = H, a.d_head = D, a.window = W;
  a.scale = 1.0f / std::sqrt(float(D)), a.round_p_bf16 = s.num.bf16_activations;
  a.q_seq = s.slots.get(), a.q_pos = s.pos.get(), a.chunk_pos0 = s.pos0s.get(), a.chunk_row0 = s.zeros.get();
  a.chunk_kv = kv.get(), a.ring = s.st.ring.view(layer), a.sel = sel, a.sel_stride = sel_stride, a.comp = comp;
  a.out = o.get();
  SPW_TRY(cuda::sparse_attn_cuda(a, s.stream));
  SPW_TRY(to_activation(s, o.get(), o.size()));
  SPW_TRY(cuda::rope_apply(o.get(), int64_t(n) * H, D, c.d_rope, rope, s.pos.get(), H, /*inverse=*/true, s.stream));
  SPW_TRY(to_activation(s, o.get(), o.size()));

  // The ring keeps the last W positions (written after attention read the old rows).
  const int i0 = std::max(0, n - W);
  std::vector<int64_t> ring_rows(n - i0);
  for (int i = i0; i < n; ++i) ring_rows[i - i0] = (s.p + i) % W;
  DeviceBuffer<int64_t> ring_rows_d;
  SPW_TRY(upload(ring_rows, ring_rows_d));
  SPW_TRY(cuda::kv_write_rows_cuda(s.st.ring.view(layer), kv.get() + size_t(i0) * D, s.slots.get(), ring_rows_d.get(),
                                   n - i0, s.stream));

  // Grouped low-rank output: z [n, G·R] = W_a[g]·o_g (BF16, no activation quant), out = wo_b·z.
  const int G = c.o_groups, R = c.o_lora_rank;
  Buf z;
  SPW_TRY(z.alloc(size_t(n) * G * R));
  SPW_TRY(grouped_proj_cuda(lw.wo_a, o.get(), n, G, R, H * D / G, z.get(), s.num.bf16_activations, s.st.ws, s.stream,
                            s.path));
  return linear(s, lw.wo_b, z.get(), n, out);  // [n, d]
}

}  // namespace spw::engine
