// Attention sublayer on the GPU (model/attention.cpp, compressor.cpp, indexer.cpp): q LoRA, the
// window ring, compressed entries (own or shared), the indexers' selection, sparse attention with
// sinks, de-rotation and the grouped low-rank output projection. Compressed entries and index keys
// go straight into the compact pools; kv_write quantizes them exactly as the reference's fake quant.
// A step may hold chunks of several sequences (batched decode): every array is per row (slot,
// position) or per chunk (compressor items, new entries), and a sequence's own values are computed
// exactly as when it runs alone.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <utility>
#include <vector>

#include "cuda/attn/indexer.h"
#include "cuda/attn/sparse_attn.h"
#include "cuda/ops/act_quant.h"
#include "cuda/ops/norm.h"
#include "cuda/ops/rope.h"
#include "engine/engine_kernels.h"
#include "engine/gpu_step.h"

namespace spw::engine {
namespace {

using Buf = DeviceSpan<float>;

const float* layer_rope(const GpuStep& s, int layer) {
  return s.c.layers[layer].compress_ratio == 0 ? s.st.rope_main.get() : s.st.rope_compress.get();
}

// x[rows, d] ← RMSNorm(x)·w in place, rounded to bf16 (the reference's norm + to_activation).
Status norm(GpuStep& s, float* x, const float* w, int64_t rows, int64_t d) {
  return cuda::rms_norm(x, w, x, rows, d, s.c.norm_eps, s.num.bf16_activations, s.stream);
}

// x[rows, d] ← RMSNorm(x)·w, RoPE on the last d_rope channels at pos[r / rows_per_pos], bf16 after each: the
// reference's norm, to_activation, rope, to_activation in one launch.
Status norm_rope(GpuStep& s, float* x, const float* w, int64_t rows, int64_t d, const float* freqs, const int64_t* pos,
                 int64_t rows_per_pos) {
  return cuda::rms_norm_rope(x, w, x, rows, d, s.c.norm_eps, s.num.bf16_activations, s.c.d_rope, freqs, pos,
                             rows_per_pos, s.stream);
}

// RoPE of x [rows, d] (rows_per_pos vectors per position), then bf16 (to_activation); round_in: bf16 before too.
Status rope_round(GpuStep& s, float* x, int64_t rows, int64_t d, const float* freqs, const int64_t* pos,
                  int64_t rows_per_pos, bool inverse = false, bool round_in = false) {
  const bool rb = s.num.bf16_activations;
  return cuda::rope_apply_rounded(x, rows, d, s.c.d_rope, freqs, pos, rows_per_pos, inverse, round_in && rb, rb,
                                  s.stream);
}

// The latest layer at or before `layer` that owns compressed KV (V4.1's shared compress_kv).
int latest_kv_source(const ModelConfig& c, int layer) {
  for (int l = layer; l >= 0; --l)
    if (c.layers[l].kv_source) return l;
  return -1;
}

// Projections that a stacked launch (DeviceStack, decode only) computed before their consumers run; null: the
// consumer projects its input itself. Step buffers, which the consumers may modify in place.
struct Projected {
  float* comp_kv = nullptr;     // the compressor's wkv·x
  float* comp_score = nullptr;  // the compressor's wgate·x
  float* idx_kv = nullptr;      // the indexer compressor's wkv·x (V4)
  float* idx_score = nullptr;   // the indexer compressor's wgate·x (V4)
  float* qi = nullptr;          // the indexer's wq_b·cq (before RoPE)
};

// out = pre when a stacked launch computed it, else l·x [n, l.n_out] into a new step buffer.
Status project(GpuStep& s, const DeviceLinear& l, const float* x, float* pre, float*& out) {
  if (pre) {
    out = pre;
    return {};
  }
  Buf b;
  SPW_TRY(s.alloc(b, size_t(s.n) * l.n_out));
  SPW_TRY(linear(s, l, x, s.n, b.get()));
  out = b.get();
  return {};
}

// The stack's parts (those the layer has, in stack order) in one launch, each into *dst [n, n_out]: the
// caller's buffer, or a new step buffer when *dst is null.
Status run_stack(GpuStep& s, const DeviceStack& st, const float* x,
                 std::initializer_list<std::pair<const DeviceLinear*, float**>> parts) {
  std::vector<float*> ys;
  for (const auto& [l, dst] : parts) {
    if (l->n_out == 0) continue;
    if (!*dst) {
      Buf b;
      SPW_TRY(s.alloc(b, size_t(s.n) * l->n_out));
      *dst = b.get();
    }
    ys.push_back(*dst);
  }
  return stacked_linear_cuda(st.w, st.rows, x, s.n, ys, s.num.bf16_activations, s.st.ws, s.stream);
}

// Streams this step's projected rows through `cb` and returns the pooled entries [rp.count, d_out].
Status compress_push(GpuStep& s, int layer, const CompressorBuffers& cb, const float* kv, const float* score,
                     const float* ape, const RatioPlan& rp, Buf& entries) {
  SPW_TRY(s.alloc(entries, size_t(std::max(rp.count, 1)) * cb.shape.d_out()));
  SPW_TRY(rollback_save_compressor(s, layer, cb, kv, score));
  cuda::CompressorChunks chunks{s.chunk_slot.get(), s.chunk_pos0.get(), s.chunk_n.get(), s.chunk_row0.get(),
                                rp.out_row0.get()};
  return cuda::compressor_push_cuda(cb.shape, cb.view(), kv, score, ape, chunks, s.n_chunks(),
                                    std::max(rp.max_per_chunk, 1), entries.get(), s.stream);
}

// V4: runs the main compressor over the new tokens and appends finished entries to the pool.
Status v4_compress(GpuStep& s, int layer, const float* x, const Projected& pre) {
  const ModelConfig& c = s.c;
  const DeviceLayer& lw = s.w.layers[layer];
  const CompressorBuffers& cb = s.st.comp_state[layer];
  const int D = c.d_head;
  const RatioPlan& e = s.ratio(cb.shape.ratio);
  float *kv, *score;
  Buf entry;
  SPW_TRY(project(s, lw.comp_wkv, x, pre.comp_kv, kv));                             // [n, width] f32
  SPW_TRY(project(s, lw.comp_wgate, x, pre.comp_score, score));                     // [n, width] f32
  SPW_TRY(compress_push(s, layer, cb, kv, score, lw.comp_ape, e, entry));                  // [count, D]
  if (e.count == 0) return {};
  SPW_TRY(to_activation(s, entry.get(), int64_t(e.count) * D));
  SPW_TRY(norm_rope(s, entry.get(), lw.comp_norm, e.count, D, s.st.rope_compress.get(), e.rope_pos.get(), 1));
                                                                                     // RoPE at the group's first token
  // fp8 on the non-RoPE channels (block 64): the pool's row format.
  return cuda::kv_write_rows_cuda(s.st.comp.view(layer), entry.get(), e.slots.get(), e.ids.get(), e.count, s.stream);
}

// V4.1 KV source: latents (ratio 2 gated, ratio 1 plain), index keys from the pre-RoPE latent, then
// the stored entry. Returns each chunk's number of new entries through `produced`.
Status v41_compress(GpuStep& s, int layer, const float* x, const Projected& pre, std::vector<int32_t>& produced) {
  const ModelConfig& c = s.c;
  const DeviceLayer& lw = s.w.layers[layer];
  const int r = c.layers[layer].compress_ratio, D = c.d_head, Di = c.index_head_dim;
  const RatioPlan& e = s.ratio(r);
  Buf pooled, key;
  float* kv;
  SPW_TRY(project(s, lw.comp_wkv, x, pre.comp_kv, kv));                                // [n, D]
  float* latent = kv;  // ratio 1: every row is an entry, in row order
  if (r > 1) {
    float* score;
    SPW_TRY(project(s, lw.comp_wgate, x, pre.comp_score, score));                      // [n, D] f32
    SPW_TRY(compress_push(s, layer, s.st.comp_state[layer], kv, score, nullptr, e, pooled));  // [count, D]
    SPW_TRY(to_activation(s, pooled.get(), int64_t(e.count) * D));
    latent = pooled.get();
  }
  produced = e.per_chunk;
  if (e.count == 0) return {};
  // [count, D] pre-RoPE latent
  SPW_TRY(norm(s, latent, lw.comp_norm, e.count, D));
  // Index keys [count, Di]: k_norm(wk · latent), RoPE at g·r, fp4 (ue8m0, block 32) in the pool.
  SPW_TRY(s.alloc(key, size_t(e.count) * Di));
  SPW_TRY(linear(s, lw.idx_wk, latent, e.count, key.get()));
  SPW_TRY(norm_rope(s, key.get(), lw.idx_k_norm, e.count, Di, s.st.rope_compress.get(), e.rope_pos.get(), 1));
  SPW_TRY(cuda::kv_write_rows_cuda(s.st.keys.view(layer), key.get(), e.slots.get(), e.ids.get(), e.count, s.stream));
  // Stored entry [count, D]: RoPE at g·r, fp4 with e4m3 scales per 16 (the pool's row format).
  SPW_TRY(rope_round(s, latent, e.count, D, s.st.rope_compress.get(), e.rope_pos.get(), 1));
  return cuda::kv_write_rows_cuda(s.st.comp.view(layer), latent, e.slots.get(), e.ids.get(), e.count, s.stream);
}

// Index queries qi [n, Hi, Di] (fp4-quantized) and head weights wts [n, Hi].
Status index_queries(GpuStep& s, const DeviceLayer& lw, const float* x, const float* cq, const Projected& pre,
                     bool hadamard, Buf& qi, Buf& wts) {
  const ModelConfig& c = s.c;
  const int n = s.n, Hi = c.index_n_heads, Di = c.index_head_dim;
  const size_t nq = size_t(n) * Hi * Di;
  float* q;
  SPW_TRY(project(s, lw.idx_wq_b, cq, pre.qi, q));                                    // [n, Hi·Di]
  qi = Buf{q, nq};
  SPW_TRY(s.alloc(wts, size_t(n) * Hi));
  SPW_TRY(rope_round(s, q, int64_t(n) * Hi, Di, s.st.rope_compress.get(), s.pos.get(), Hi));
  if (hadamard) {
    SPW_TRY(hadamard_rows_cuda(q, int64_t(n) * Hi, Di, s.stream));
    SPW_TRY(to_activation(s, q, nq));
  }
  if (s.num.fake_quant) SPW_TRY(cuda::fake_quant_fp4_ue8m0(q, int64_t(n) * Hi, Di, Di, 32, s.stream));
  SPW_TRY(linear(s, lw.idx_weights_proj, x, n, wts.get()));                          // [n, Hi]
  const float w_scale = 1.0f / std::sqrt(float(Di)) / std::sqrt(float(Hi));
  SPW_TRY(scale_cuda(wts.get(), int64_t(n) * Hi, w_scale, s.stream));
  return to_activation(s, wts.get(), wts.size());
}

// Per-row scoring arguments: n_entries(i) = the entries its chunk scores (0: none), visible(i) =
// (pos_i + 1)/r; max_entries their maximum (the score stride).
struct ScoreInputs {
  const int64_t* n_entries = nullptr;
  const int64_t* visible = nullptr;
  int64_t max_entries = 0;
};

// Scores of rows r0 .. r1 − 1 against the keys of key_layer into scores [n, max_entries].
Status index_scores(GpuStep& s, const Buf& qi, const Buf& wts, int key_layer, const ScoreInputs& in, int r0, int r1,
                    Buf& scores) {
  const ModelConfig& c = s.c;
  const int64_t Hi = c.index_n_heads, Di = c.index_head_dim;
  cuda::IndexScoreArgs a;
  a.q = qi.get() + r0 * Hi * Di, a.w = wts.get() + r0 * Hi, a.n_q = r1 - r0, a.n_heads = int(Hi);
  a.d_index = int(Di), a.q_seq = s.slots.get() + r0, a.n_entries = in.n_entries + r0;
  a.visible = in.visible + r0, a.max_entries = in.max_entries, a.keys = s.st.keys.view(key_layer);
  a.round_bf16 = s.num.bf16_activations, a.scores = scores.get() + r0 * in.max_entries;
  a.score_stride = in.max_entries;
  return cuda::index_scores_cuda(a, s.stream);
}

// V4 CSA layer: the indexer's own overlapping compressor (keys: norm, RoPE, Hadamard, fp4), then
// the top-index_topk visible entries per token → sel [n, index_topk].
Status v4_indexer_select(GpuStep& s, int layer, const float* x, const float* cq, const Projected& pre,
                         DeviceSpan<int32_t>& sel) {
  const ModelConfig& c = s.c;
  const DeviceLayer& lw = s.w.layers[layer];
  const CompressorBuffers& cb = s.st.idx_comp_state[layer];
  const int n = s.n, Di = c.index_head_dim, K = c.index_topk;
  const RatioPlan& e = s.ratio(cb.shape.ratio);
  float *kv, *score;
  Buf entry;
  SPW_TRY(project(s, lw.idx_comp_wkv, x, pre.idx_kv, kv));                           // [n, 2·Di] f32
  SPW_TRY(project(s, lw.idx_comp_wgate, x, pre.idx_score, score));                  // [n, 2·Di] f32
  SPW_TRY(compress_push(s, layer, cb, kv, score, lw.idx_comp_ape, e, entry));              // [count, Di]
  if (e.count > 0) {
    const int64_t m = int64_t(e.count) * Di;
    SPW_TRY(to_activation(s, entry.get(), m));
    SPW_TRY(norm_rope(s, entry.get(), lw.idx_comp_norm, e.count, Di, s.st.rope_compress.get(), e.rope_pos.get(), 1));
    SPW_TRY(hadamard_rows_cuda(entry.get(), e.count, Di, s.stream));
    SPW_TRY(to_activation(s, entry.get(), m));
    SPW_TRY(cuda::kv_write_rows_cuda(s.st.keys.view(layer), entry.get(), e.slots.get(), e.ids.get(), e.count,
                                     s.stream));  // fp4, ue8m0 per 32
  }
  SPW_TRY(s.alloc(sel, size_t(n) * K));
  const ScoreInputs in{e.n_entries.get(), e.visible.get(), e.max_entries};
  if (in.max_entries == 0) {
    SPW_CUDA_TRY(cudaMemsetAsync(sel.get(), 0xff, sel.nbytes(), s.stream));  // −1: nothing selected
    return {};
  }
  Buf qi, wts, scores;
  SPW_TRY(index_queries(s, lw, x, cq, pre, /*hadamard=*/true, qi, wts));
  SPW_TRY(s.alloc(scores, size_t(n) * in.max_entries));
  SPW_TRY(index_scores(s, qi, wts, layer, in, 0, n, scores));
  return cuda::topk_select_cuda(scores.get(), in.max_entries, in.n_entries, n, K, sel.get(), K, s.stream);
}

// V4.1 index source: scores over the latest published keys (Numerics::stale_index_k), the
// candidate blocks (candidate source: publish; re-index layer: mask), top-k → s.topk. The key
// layer is per sequence; rows of consecutive chunks that share one are scored in one launch.
Status v41_indexer_select(GpuStep& s, int layer, const float* x, const float* cq, const Projected& pre,
                          const std::vector<int32_t>& produced) {
  const ModelConfig& c = s.c;
  const LayerPlan& plan = c.layers[layer];
  const DeviceLayer& lw = s.w.layers[layer];
  const int n = s.n, r = plan.compress_ratio, K = c.index_topk, n_ch = s.n_chunks();

  std::vector<int> key_layer(n_ch);
  std::vector<int64_t> chunk_entries(n_ch);
  for (int b = 0; b < n_ch; ++b) {
    GpuSequence& seq = *s.chunks[b].seq;
    int kl;
    if (plan.kv_source && (produced[b] > 0 || !s.num.stale_index_k)) {
      kl = layer;
      seq.published_index_k_layer = layer;
    } else if (s.num.stale_index_k) {
      kl = seq.published_index_k_layer;
    } else {
      kl = layer;
      while (kl >= 0 && !c.layers[kl].kv_source) --kl;
    }
    key_layer[b] = kl;
    const int64_t end = s.chunks[b].p + s.chunks[b].n, compress_len = end / r;
    chunk_entries[b] = kl < 0 ? 0 : compress_len;
    if (kl >= 0) SPW_CHECK(end / c.layers[kl].compress_ratio >= compress_len);
  }
  SPW_CUDA_TRY(cudaMemsetAsync(s.topk.get(), 0xff, s.topk.nbytes(), s.stream));  // −1: nothing selected
  const RatioPlan& rp = s.ratio(r);
  ScoreInputs in{rp.n_entries.get(), rp.visible.get(), rp.max_entries};
  if (chunk_entries != rp.chunk_entries) {  // a sequence without published keys scores nothing
    std::vector<int64_t> ne(n);
    in.max_entries = 0;
    for (int i = 0; i < n; ++i) in.max_entries = std::max(in.max_entries, ne[i] = chunk_entries[s.row_chunk[i]]);
    DeviceSpan<int64_t> ne_d;
    SPW_TRY(s.upload(ne, ne_d));
    in.n_entries = ne_d.get();
  }
  if (in.max_entries == 0) return {};
  const int64_t len = in.max_entries;

  Buf qi, wts, scores;
  SPW_TRY(index_queries(s, lw, x, cq, pre, /*hadamard=*/false, qi, wts));
  SPW_TRY(s.alloc(scores, size_t(n) * len));
  for (int b0 = 0, b1; b0 < n_ch; b0 = b1) {  // [n, len]
    for (b1 = b0 + 1; b1 < n_ch && key_layer[b1] == key_layer[b0];) ++b1;
    if (key_layer[b0] < 0) continue;
    const StepChunk& last = s.chunks[b1 - 1];
    SPW_TRY(index_scores(s, qi, wts, key_layer[b0], in, s.chunks[b0].row0, last.row0 + last.n, scores));
  }
  if (plan.candidate_source) {
    const int bs = c.candidate_block_size, kb = c.candidate_topk_blocks;
    const int64_t nb = (len + bs - 1) / bs;
    Buf block_scores;
    DeviceSpan<int64_t> n_blocks;
    DeviceSpan<int32_t> kept;
    SPW_TRY(s.alloc(block_scores, size_t(n) * nb));
    SPW_TRY(s.alloc(n_blocks, n));
    SPW_TRY(s.alloc(kept, size_t(n) * kb));
    SPW_TRY(cuda::candidate_block_scores_cuda(scores.get(), len, in.n_entries, in.visible, n, len, bs,
                                              block_scores.get(), nb, n_blocks.get(), s.stream));
    SPW_TRY(cuda::topk_select_cuda(block_scores.get(), nb, n_blocks.get(), n, kb, kept.get(), kb, s.stream));
    // The mask is as wide as any layer's entries can be this step (ratio ≥ 1), zero beyond ours.
    SPW_CUDA_TRY(cudaMemsetAsync(s.candidates.get(), 0, s.candidates.nbytes(), s.stream));
    SPW_TRY(cuda::candidate_mask_cuda(kept.get(), kb, in.n_entries, n, len, bs, s.candidates.get(),
                                      s.cand_stride, s.stream));
    s.has_candidates = true;
  }
  if (plan.attn == AttnKind::Reindex) {
    SPW_CHECK(s.has_candidates);
    SPW_TRY(cuda::index_scores_apply_mask_cuda(scores.get(), len, in.n_entries, n, len, s.candidates.get(),
                                               s.cand_stride, s.stream));
  }
  return cuda::topk_select_cuda(scores.get(), len, in.n_entries, n, K, s.topk.get(), K, s.stream);
}

// HCA: every visible entry, sel [n, stride] with stride = max(1, max over chunks of (p + n)/r).
Status hca_select(GpuStep& s, int r, DeviceSpan<int32_t>& sel, int& stride) {
  const RatioPlan& rp = s.ratio(r);
  stride = int(std::max<int64_t>(1, rp.max_entries));
  SPW_TRY(s.alloc(sel, size_t(s.n) * stride));
  return iota_select_cuda(rp.visible.get(), s.n, stride, sel.get(), s.stream);
}

// The ring keeps the last W positions of each sequence (written after attention read the old rows).
Status ring_write(GpuStep& s, int layer, const float* kv) {
  const int W = s.c.window, D = s.c.d_head;
  SPW_TRY(rollback_save_ring(s, layer));
  if (s.ring_rows.get())  // every chunk fits the window: one launch, each row's own ring row
    return cuda::kv_write_rows_cuda(s.st.ring.view(layer), kv, s.slots.get(), s.ring_rows.get(), s.n, s.stream);
  for (const StepChunk& ch : s.chunks) {  // a chunk longer than the window: its last W rows
    const int i0 = std::max(0, ch.n - W);
    std::vector<int64_t> rows(ch.n - i0);
    for (int i = i0; i < ch.n; ++i) rows[i - i0] = (ch.p + i) % W;
    DeviceSpan<int64_t> rows_d;
    SPW_TRY(s.upload(rows, rows_d));
    SPW_TRY(cuda::kv_write_rows_cuda(s.st.ring.view(layer), kv + size_t(ch.row0 + i0) * D,
                                     s.slots.get() + ch.row0 + i0, rows_d.get(), ch.n - i0, s.stream));
  }
  return {};
}

}  // namespace

Status plan_attention(GpuStep& s) {
  const ModelConfig& c = s.c;
  for (const LayerPlan& lp : c.layers) {
    const int r = lp.compress_ratio;
    if (r <= 0 || std::any_of(s.ratios.begin(), s.ratios.end(), [&](const RatioPlan& p) { return p.r == r; }))
      continue;
    RatioPlan& rp = s.ratios.emplace_back();
    rp.r = r;
    std::vector<int32_t> out_row0, slots;
    std::vector<int64_t> ids, rope_pos, n_entries(s.n), visible(s.n);
    for (const StepChunk& ch : s.chunks) {
      const int64_t first = ch.p / r, end = (ch.p + ch.n) / r;
      out_row0.push_back(rp.count);
      rp.per_chunk.push_back(int32_t(end - first));
      rp.chunk_entries.push_back(end);
      rp.max_entries = std::max(rp.max_entries, end);
      for (int64_t g = first; g < end; ++g) slots.push_back(ch.seq->slot), ids.push_back(g), rope_pos.push_back(g * r);
      rp.count += int(end - first);
      rp.max_per_chunk = std::max(rp.max_per_chunk, int(end - first));
    }
    for (int i = 0; i < s.n; ++i) {
      n_entries[i] = rp.chunk_entries[s.row_chunk[i]];
      visible[i] = (s.row_pos[i] + 1) / r;
    }
    SPW_TRY(s.upload(out_row0, rp.out_row0));
    SPW_TRY(s.upload(slots, rp.slots));
    SPW_TRY(s.upload(ids, rp.ids));
    SPW_TRY(s.upload(rope_pos, rp.rope_pos));
    SPW_TRY(s.upload(n_entries, rp.n_entries));
    SPW_TRY(s.upload(visible, rp.visible));
  }
  const int W = c.window;
  if (std::all_of(s.chunks.begin(), s.chunks.end(), [&](const StepChunk& ch) { return ch.n <= W; })) {
    std::vector<int64_t> rows(s.n);
    for (int i = 0; i < s.n; ++i) rows[i] = s.row_pos[i] % W;
    SPW_TRY(s.upload(rows, s.ring_rows));
  }
  return {};
}

Status attention(GpuStep& s, int layer, const float* x, float* out) {
  const ModelConfig& c = s.c;
  const DeviceLayer& lw = s.w.layers[layer];
  const LayerPlan& plan = c.layers[layer];
  const int n = s.n, H = c.n_heads, D = c.d_head, W = c.window;
  const float* rope = layer_rope(s, layer);

  // [n, q_lora] → q [n, H, D]
  Buf cq, q, kv;
  SPW_TRY(s.alloc(cq, size_t(n) * c.q_lora_rank));
  SPW_TRY(s.alloc(q, size_t(n) * H * D));
  SPW_TRY(s.alloc(kv, size_t(n) * D));
  // Linears that read the same input run as one GEMV launch where they are stacked (decode; bit-identical
  // rows): wq_a and wkv; the compressors' projections of x; wq_b and the indexer's wq_b.
  const bool gemv = linear_uses_gemv(s.path, n);
  const bool stacked = gemv && lw.wq_a_wkv.stacked();
  Projected pre;
  float *cq_p = cq.get(), *kv_p = kv.get(), *q_p = q.get();
  if (stacked) SPW_TRY(run_stack(s, lw.wq_a_wkv, x, {{&lw.wq_a, &cq_p}, {&lw.wkv, &kv_p}}));   // [n, q_lora], [n, D]
  else SPW_TRY(linear(s, lw.wq_a, x, n, cq.get()));                                            // [n, q_lora]
  if (gemv && lw.compressors.stacked())
    SPW_TRY(run_stack(s, lw.compressors, x,
                      {{&lw.comp_wkv, &pre.comp_kv}, {&lw.comp_wgate, &pre.comp_score}, {&lw.idx_comp_wkv, &pre.idx_kv},
                       {&lw.idx_comp_wgate, &pre.idx_score}}));
  SPW_TRY(norm(s, cq.get(), lw.q_norm, n, c.q_lora_rank));
  if (gemv && lw.wq_b_idx.stacked())
    SPW_TRY(run_stack(s, lw.wq_b_idx, cq.get(), {{&lw.wq_b, &q_p}, {&lw.idx_wq_b, &pre.qi}}));  // [n, H·D], [n, Hi·Di]
  else
    SPW_TRY(linear(s, lw.wq_b, cq.get(), n, q.get()));                                          // [n, H·D]
  if (!c.is_v41())  // V4: per-head weightless RMS on q
    SPW_TRY(norm_rope(s, q.get(), nullptr, int64_t(n) * H, D, rope, s.pos.get(), H));           // [n, H, D]
  else
    SPW_TRY(rope_round(s, q.get(), int64_t(n) * H, D, rope, s.pos.get(), H));                   // [n, H, D]
  SPW_TRY(s.dump("attn.q", layer, q.get(), q.size()));

  // Window KV of the new tokens [n, D], fake-quantized as the ring stores it.
  if (!stacked) SPW_TRY(linear(s, lw.wkv, x, n, kv.get()));
  SPW_TRY(norm_rope(s, kv.get(), lw.kv_norm, n, D, rope, s.pos.get(), 1));
  if (s.num.fake_quant) {
    if (c.is_v41()) SPW_TRY(cuda::fake_quant_fp8(kv.get(), n, D, D, 32, s.stream));
    else SPW_TRY(cuda::fake_quant_fp8(kv.get(), n, D - c.d_rope, D, 64, s.stream));
  }

  SPW_TRY(s.dump("attn.kv", layer, kv.get(), kv.size()));

  // Compressed entries and the selection [n, sel_stride] (−1 padded) of each new token.
  DeviceSpan<int32_t> own_sel;
  const int32_t* sel = nullptr;
  int sel_stride = 0;
  cuda::KvPages comp = s.st.comp.view(layer);
  if (plan.attn == AttnKind::Hca || plan.attn == AttnKind::Csa) {
    SPW_TRY(v4_compress(s, layer, x, pre));
    if (plan.attn == AttnKind::Csa) {
      SPW_TRY(v4_indexer_select(s, layer, x, cq.get(), pre, own_sel));
      sel_stride = c.index_topk;
    } else {
      SPW_TRY(hca_select(s, plan.compress_ratio, own_sel, sel_stride));
    }
    sel = own_sel.get();
  } else if (plan.attn != AttnKind::Window) {
    std::vector<int32_t> produced(s.n_chunks(), 0);
    if (plan.kv_source) SPW_TRY(v41_compress(s, layer, x, pre, produced));
    if (plan.index_source) SPW_TRY(v41_indexer_select(s, layer, x, cq.get(), pre, produced));
    comp = s.st.comp.view(latest_kv_source(c, layer));
    sel = s.topk.get();
    sel_stride = c.index_topk;
  }
  if (sel) SPW_TRY(s.dump("attn.sel", layer, sel, size_t(n) * sel_stride));
  if (W + sel_stride > cuda::kSparseAttnMaxRows)
    return make_error("attention: ", W + sel_stride, " rows per query exceed the kernel's ", cuda::kSparseAttnMaxRows);

  // Sparse attention per token over [window rows ; selected compressed rows] → o [n, H, D].
  Buf o;
  SPW_TRY(s.alloc(o, size_t(n) * H * D));
  cuda::SparseAttnArgs a;
  a.q = q.get(), a.sink = lw.attn_sink, a.n_q = n, a.n_heads = H, a.d_head = D, a.window = W;
  a.scale = 1.0f / std::sqrt(float(D)), a.round_p_bf16 = s.num.bf16_activations;
  a.q_bf16 = s.num.bf16_activations;  // q was rounded after its RoPE
  a.q_seq = s.slots.get(), a.q_pos = s.pos.get(), a.chunk_pos0 = s.pos0s.get(), a.chunk_row0 = s.row0s.get();
  a.chunk_kv = kv.get(), a.ring = s.st.ring.view(layer), a.sel = sel, a.sel_stride = sel_stride, a.comp = comp;
  a.out = o.get();
  Buf attn_scratch;  // decode-sized calls split each query's rows over blocks (sparse_attn.h)
  if (s.attn_no_split) {
    // Row-invariant prefill: no scratch, so kAuto takes the tensor cores where the layer allows and one block per
    // query otherwise, at every row count. V4's HCA selection is as wide as the step's longest sequence needs, so
    // there the row's path could follow the other chunks: one block per query, whose sums ignore the padding.
    if (plan.attn == AttnKind::Hca) a.path = cuda::SparseAttnPath::kOneBlock;
  } else if (cuda::sparse_attn_uses_split(n, H)) {
    SPW_TRY(s.alloc(attn_scratch, cuda::sparse_attn_split_scratch_floats(n, H, D, int64_t(W) + sel_stride)));
    a.scratch = attn_scratch.get(), a.scratch_floats = attn_scratch.size();
  } else if (s.path == LinearPath::kGemv) {
    // Steps whose rows must not depend on the row count (the GEMV forced: batch-invariant decode, chunking
    // tests): one block per query, bit-identical to the split path that smaller calls take, where kAuto would
    // take the tensor cores, whose sums run in another order.
    a.path = cuda::SparseAttnPath::kOneBlock;
  }
  SPW_TRY(cuda::sparse_attn_cuda(a, s.stream));
  SPW_TRY(rope_round(s, o.get(), int64_t(n) * H, D, rope, s.pos.get(), H, /*inverse=*/true, /*round_in=*/true));
  SPW_TRY(s.dump("attn.o", layer, o.get(), o.size()));
  SPW_TRY(ring_write(s, layer, kv.get()));

  // Grouped low-rank output: z [n, G·R] = W_a[g]·o_g (BF16, no activation quant), out = wo_b·z.
  const int G = c.o_groups, R = c.o_lora_rank;
  Buf z;
  SPW_TRY(s.alloc(z, size_t(n) * G * R));
  if (s.num.bf16_activations) {
    SPW_TRY(grouped_proj_cuda(lw.wo_a, o.get(), n, G, R, H * D / G, z.get(), true, s.st.ws, s.stream, s.path));
  } else {  // f32 o: the GEMV reads it unrounded (the GEMM path feeds cuBLAS bf16), 16 rows at a time
    for (int r0 = 0; r0 < n; r0 += 16)
      SPW_TRY(grouped_proj_cuda(lw.wo_a, o.get() + size_t(r0) * H * D, std::min(16, n - r0), G, R, H * D / G,
                                z.get() + size_t(r0) * G * R, false, s.st.ws, s.stream, LinearPath::kGemv));
  }
  return linear(s, lw.wo_b, z.get(), n, out);  // [n, d]
}

}  // namespace spw::engine
