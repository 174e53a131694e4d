// The top level of the GPU forward: embedding, the blocks with their hyper-connections, the head
// (model/model.cpp on the GPU). Sequences and their KV pages: gpu_sequences.cpp; loading: gpu_load.cpp.
#include "engine/gpu_model.h"

#include <algorithm>
#include <cmath>

#include "cuda/attn/sparse_attn.h"
#include "cuda/ops/embedding.h"
#include "cuda/ops/hyper_connection.h"
#include "cuda/ops/norm.h"
#include "cuda/ops/sampling.h"
#include "engine/gpu_step.h"
#include "model/kv_history.h"

namespace spw::engine {

GpuModel::~GpuModel() {
  if (state_) {
    if (state_->stream) cudaStreamSynchronize(state_->stream);
    linear_workspace_free(state_->ws);
    exl3_cuda_workspace_free(state_->exl3_ws);
    if (state_->exl3_moe_ws.buf) exl3_cuda_moe_workspace_free(state_->exl3_moe_ws);
    if (state_->stream) cudaStreamDestroy(state_->stream);
  }
}

size_t GpuModel::weight_nbytes() const { return state_->w->nbytes; }

Status GpuModel::set_routing_record(bool on) {
  GpuState& st = *state_;
  if (!on) {
    st.routing_counts.reset();
    return {};
  }
  if (st.routing_counts.get()) return {};
  st.routing_tokens = 0;
  SPW_TRY(st.routing_counts.alloc(size_t(config_.n_layers) * config_.n_experts));
  SPW_CUDA_TRY(cudaMemset(st.routing_counts.get(), 0, st.routing_counts.nbytes()));
  return {};  // decode steps are captured afresh each step (step_graphs.h), so their graphs gain the counting launch
}

Result<RoutingCounts> GpuModel::routing_counts() const {
  const GpuState& st = *state_;
  if (!st.routing_counts.get()) return make_error("routing is not being recorded (set_routing_record)");
  SPW_CUDA_TRY(cudaStreamSynchronize(st.stream));
  std::vector<unsigned long long> flat;
  SPW_TRY(download(st.routing_counts.get(), st.routing_counts.size(), flat));
  RoutingCounts rc;
  rc.reset(config_.n_layers, config_.n_experts);
  rc.n_tokens = st.routing_tokens;
  for (int l = 0; l < config_.n_layers; ++l)
    for (int e = 0; e < config_.n_experts; ++e) rc.counts[l][e] = int64_t(flat[size_t(l) * config_.n_experts + e]);
  return rc;
}

bool GpuModel::engram_tables_on_disk() const { return engram_on_disk_; }

GpuModel::ExpertPlacement GpuModel::expert_placement() const {
  const DeviceWeights& w = *state_->w;
  ExpertPlacement p;
  for (int t = 0; t < kNumExpertTiers; ++t) p.n_experts[t] = w.n_experts_in[t];
  p.nbytes[int(ExpertTier::Gpu)] = w.routed_gpu_nbytes;
  p.nbytes[int(ExpertTier::HostGpu)] = w.host_mapped.nbytes();
  p.nbytes[int(ExpertTier::HostCpu)] = w.host_cpu_mapped.nbytes();
  p.host_mapped_pinned_nbytes = w.host_mapped.pinned_nbytes() + w.host_cpu_mapped.pinned_nbytes();
  if (const HostExperts* h = state_->host_experts.get()) {
    p.mailbox_nbytes = h->mailbox_nbytes();
    p.cpu_requests = h->worker().requests_served();
    p.cpu_busy_seconds = h->worker().busy_seconds();
  }
  return p;
}
size_t GpuModel::step_arena_high_water() const { return state_->arena.high_water(); }
size_t GpuModel::step_arena_capacity() const { return state_->arena.capacity(); }
void GpuModel::set_cuda_graphs(bool on) { state_->cuda_graphs = on; }
StepGraphStats GpuModel::graph_stats() const { return state_->graphs.stats(); }

// The EXL3 item classes of row-invariant steps (MoePaths::exl3_fixed_classes): decode rows ≤ 8 per item, the device
// pairs' class (so a decode has the same bits on either side of MoePaths::exl3_device_rows); prompt pieces ≤ 64,
// each expert decoded once per 64 of its rows.
constexpr int kDecodeItemClass = 0, kPrefillItemClass = 2;

int GpuModel::invariant_decode_rows() const {
  const LinearPath path = options_.linear_path == LinearPath::kAuto ? options_.decode_linear_path : options_.linear_path;
  int rows = path == LinearPath::kGemv ? options_.budget.max_seqs : kDeviceDispatchRows;
  for (const ExpertTable& t : state_->expert_tables)
    if (t.ready() && options_.moe_dispatch == MoeDispatch::kAuto) rows = std::min(rows, options_.moe_paths.dense_device_rows);
  // EXL3 experts past the device rows go to the host dispatch, whose grouped items keep the pairs' bits only in
  // one fixed class.
  for (const Exl3MoeTable& t : state_->exl3_moe)
    if (t.ready() && options_.moe_dispatch == MoeDispatch::kAuto && !options_.moe_paths.exl3_fixed_classes)
      rows = std::min(rows, options_.moe_paths.exl3_device_rows);
  return std::min(rows, options_.budget.max_seqs);
}


// ---- the step's shared helpers ----

Status to_activation(GpuStep& s, float* x, int64_t n) {
  if (!s.num.bf16_activations) return {};
  return cuda::round_bf16(x, n, s.stream);
}

Status linear(GpuStep& s, const DeviceLinear& l, const float* x, int n_tokens, float* y, bool round_out) {
  return linear_cuda(l, x, n_tokens, y, round_out && s.num.bf16_activations, s.st.ws, s.stream, s.path);
}

namespace {

using Buf = DeviceSpan<float>;

// One hyper-connection site: pre [n, hc], post [n, hc], comb [n, hc, hc] from the streams.
Status hc_coefficients(GpuStep& s, const DeviceHc& hw, const float* streams, float* mixes, float* pre, float* post,
                       float* comb) {
  const ModelConfig& c = s.c;
  const int n = s.n, hc = c.hc_mult, n_mix = (2 + hc) * hc;
  // [n, (2+hc)·hc]
  SPW_TRY(cuda::hc_mixes(streams, hw.fn, n, n_mix, int64_t(hc) * c.d_model, c.norm_eps, mixes, s.stream));
  // [n, hc], [n, hc], [n, hc, hc]
  return cuda::hc_split_sinkhorn(mixes, hw.scale, hw.base, n, hc, c.hc_sinkhorn_iters, c.hc_eps, pre, post, comb,
                                 s.stream);
}

// x[n, d] = norm(Σ_j pre_j X_j), bf16 after the collapse and after the norm.
Status collapse_and_norm(GpuStep& s, const float* streams, const float* pre, const float* norm_w, float* x) {
  const bool rb = s.num.bf16_activations;
  SPW_TRY(cuda::hc_collapse(streams, pre, s.n, s.c.hc_mult, s.c.d_model, rb, x, s.stream));  // [n, d]
  return cuda::rms_norm(x, norm_w, x, s.n, s.c.d_model, s.c.norm_eps, rb, s.stream);          // [n, d]
}

// Steps of at most this many rows run the fused mHC kernels (hc_fused.cu): their expansion recomputes the
// Sinkhorn in every block of channels, which hides behind the previous kernel in decode but would cost a
// prefill chunk one Sinkhorn per 256 channels of every token.
constexpr int kFusedHcMaxRows = 16;

// One hyper-connection site of a layer (attention or FFN): its weights and coefficient buffers [n, hc],
// [n, hc], [n, hc, hc].
struct HcSite {
  const DeviceHc& w;
  float* pre;
  float* post;
  float* comb;
};

bool fused_hc(const GpuStep& s) { return cuda::hc_fused_supported(s.c.hc_mult) && s.n <= kFusedHcMaxRows; }

cuda::HcPreFromMixes from_mixes(const GpuStep& s, const HcSite& site, const float* mixes) {
  const int hc = s.c.hc_mult;
  return {mixes, int64_t(2 + hc) * hc, site.w.scale, site.w.base, s.c.hc_eps};
}

// Before a sublayer: the site's mixes from the streams, and x[n, d] = norm(collapse(streams)) with the
// collapse weights `carried` (V4.1: the previous sublayer's pre) or, when null, the site's own pre. Fused: two
// launches (the site's pre, post and comb come in hc_after); else four.
Status hc_before(GpuStep& s, const HcSite& site, const float* streams, float* mixes, const float* carried,
                 const float* norm_w, float* x) {
  const ModelConfig& c = s.c;
  const int n = s.n, hc = c.hc_mult, n_mix = (2 + hc) * hc;
  if (!fused_hc(s)) {
    SPW_TRY(hc_coefficients(s, site.w, streams, mixes, site.pre, site.post, site.comb));
    return collapse_and_norm(s, streams, carried ? carried : site.pre, norm_w, x);
  }
  SPW_TRY(cuda::hc_mixes(streams, site.w.fn, n, n_mix, int64_t(hc) * c.d_model, c.norm_eps, mixes, s.stream));
  const cuda::HcPreFromMixes from = from_mixes(s, site, mixes);
  return cuda::hc_collapse_norm(streams, carried, carried ? nullptr : &from, norm_w, n, hc, c.d_model, c.norm_eps,
                                s.num.bf16_activations, x, s.stream);
}

// After a sublayer: streams ← expand(streams, y) with the site's post and comb (fused: computed here from the
// mixes hc_before left, with the site's pre stored for a later collapse).
Status hc_after(GpuStep& s, const HcSite& site, float* streams, const float* y, const float* mixes) {
  const ModelConfig& c = s.c;
  if (!fused_hc(s))
    return cuda::hc_expand(streams, y, site.post, site.comb, s.n, c.hc_mult, c.d_model, s.num.bf16_activations,
                           s.stream);
  return cuda::hc_expand_sinkhorn(streams, y, from_mixes(s, site, mixes), c.hc_sinkhorn_iters, s.n, c.hc_mult,
                                  c.d_model, s.num.bf16_activations, site.pre, s.stream);
}

}  // namespace

// Checks the chunks, reserves their pages and uploads the step's per-row and per-chunk arrays.
Status GpuModel::begin_step(GpuStep& s) {
  const ModelConfig& c = config_;
  for (const StepChunk& ch : s.chunks) {
    GpuSequence& seq = *ch.seq;
    if (seq.owner != this) return make_error("the sequence does not belong to this model");
    if (ch.tokens.empty()) return make_error("no tokens");
    for (int32_t t : ch.tokens)
      if (t < 0 || t >= c.vocab_size)
        return make_error("token id ", t, " is outside the vocabulary (0..", c.vocab_size - 1, ")");
    if (seq.n_past + int64_t(ch.tokens.size()) > options_.budget.max_context)
      return make_error("context of ", seq.n_past + int64_t(ch.tokens.size()), " positions exceeds the budget's ",
                        options_.budget.max_context);
    for (const StepChunk& other : s.chunks)
      if (&other != &ch && other.seq == ch.seq) return make_error("a sequence appears twice in one step");
    if (seq.keep_rollback && int64_t(ch.tokens.size()) > options_.budget.max_rollback_tokens)
      return make_error("a forward that may be taken back takes at most ", options_.budget.max_rollback_tokens,
                        " tokens (KvBudget::max_rollback_tokens); got ", ch.tokens.size());
    if (!ch.images.empty()) {
      if (!c.is_v41()) return make_error("image positions: only a V4.1 model takes images");
      if (ch.images.is_image.size() != ch.tokens.size())
        return make_error("image positions: a mask of ", ch.images.is_image.size(), " for ", ch.tokens.size(), " tokens");
      if (ch.images.rows.size() != ch.images.count() * size_t(c.d_model))
        return make_error("image positions: ", ch.images.rows.size(), " row values for ", ch.images.count(),
                          " image positions of width ", c.d_model);
      if (seq.keep_rollback) return make_error("a forward that may be taken back holds text only, not image positions");
    }
  }
  for (StepChunk& ch : s.chunks) {
    ch.p = ch.seq->n_past;
    ch.n = int(ch.tokens.size());
    ch.row0 = s.n;
    s.n += ch.n;
    s.max_end = std::max(s.max_end, ch.p + ch.n);
  }
  const int max_rows = step_max_rows(options_.budget);
  if (s.n > max_rows) return make_error(s.n, " tokens in one step, the budget allows ", max_rows);
  for (StepChunk& ch : s.chunks) SPW_TRY(reserve_pages(*ch.seq, ch.p + ch.n));
  for (StepChunk& ch : s.chunks) rollback_begin(*ch.seq, ch.tokens);

  const int n = s.n, n_ch = s.n_chunks();
  std::vector<int32_t> slots(n), row0s(n), ch_slot(n_ch), ch_n(n_ch), ch_row0(n_ch);
  std::vector<int64_t> pos0s(n), ch_pos0(n_ch);
  s.tokens.resize(n);
  s.row_chunk.resize(n);
  s.row_pos.resize(n);
  for (int b = 0; b < n_ch; ++b) {
    const StepChunk& ch = s.chunks[b];
    ch_slot[b] = ch.seq->slot, ch_n[b] = ch.n, ch_row0[b] = ch.row0, ch_pos0[b] = ch.p;
    for (int i = 0; i < ch.n; ++i) {
      const int r = ch.row0 + i;
      s.tokens[r] = ch.tokens[i], s.row_chunk[r] = b, s.row_pos[r] = ch.p + i;
      slots[r] = ch.seq->slot, row0s[r] = ch.row0, pos0s[r] = ch.p;
    }
  }
  plan_image_rows(s);
  StagingBatch batch(state_->staging);  // the step's uploads as a few copies (step_arena.h)
  SPW_TRY(s.upload(s.tokens, s.tokens_d));
  SPW_TRY(s.upload(s.row_pos, s.pos));
  SPW_TRY(s.upload(slots, s.slots));
  SPW_TRY(s.upload(row0s, s.row0s));
  SPW_TRY(s.upload(pos0s, s.pos0s));
  SPW_TRY(s.upload(ch_slot, s.chunk_slot));
  SPW_TRY(s.upload(ch_n, s.chunk_n));
  SPW_TRY(s.upload(ch_row0, s.chunk_row0));
  SPW_TRY(s.upload(ch_pos0, s.chunk_pos0));
  if (c.is_v41()) {
    SPW_TRY(s.alloc(s.topk, size_t(n) * c.index_topk));
    SPW_CUDA_TRY(cudaMemsetAsync(s.topk.get(), 0xff, s.topk.nbytes(), s.stream));
    s.cand_stride = s.max_end;
    SPW_TRY(s.alloc(s.candidates, size_t(n) * s.cand_stride));
  }
  SPW_TRY(plan_attention(s));
  return batch.end(s.stream);
}

// Embedding, the blocks and the head of the step; logits [n_out, vocab] of the rows of out_rows, in
// order, in `logits` (step-scope arena memory).
Status GpuModel::run_step(GpuStep& s, const ForwardOptions& options, std::span<const RowRange> out_rows,
                          Buf& logits) {
  const ModelConfig& c = config_;
  GpuState& st = *state_;
  const int n = s.n, d = c.d_model, hc = c.hc_mult, n_mix = (2 + hc) * hc;
  const size_t hc_d = size_t(hc) * d;
  s.options = &options;

  // [n, hc, d]: hc copies of the embedding.
  Buf streams, x, y, mixes, carried, pre_a, post_a, comb_a, pre_f, post_f, comb_f;
  SPW_TRY(s.alloc(streams, size_t(n) * hc_d));
  SPW_TRY(s.alloc(x, size_t(n) * d));
  SPW_TRY(s.alloc(y, size_t(n) * d));
  SPW_TRY(s.alloc(mixes, size_t(n) * n_mix));
  for (Buf* b : {&pre_a, &post_a, &pre_f, &post_f}) SPW_TRY(s.alloc(*b, size_t(n) * hc));
  for (Buf* b : {&comb_a, &comb_f}) SPW_TRY(s.alloc(*b, size_t(n) * hc * hc));
  SPW_TRY(s.segment(0));
  SPW_TRY(cuda::embedding_gather(st.w->embed, c.vocab_size, d, s.tokens_d.get(), n, hc, streams.get(), s.stream));
  SPW_TRY(embed_image_rows(s, streams.get()));

  // V4.1 single-pass mHC: the collapse weights come from the previous sublayer; one-hot at the start.
  std::vector<float> one_hot(size_t(n) * hc, 0.f);
  for (int i = 0; i < n; ++i) one_hot[size_t(i) * hc] = 1.f;
  SPW_TRY(s.upload(one_hot, carried));

  for (int l = 0; l < c.n_layers; ++l) {
    const DeviceLayer& lw = st.w->layers[l];
    if (l > 0) SPW_TRY(s.segment(l));  // layer 0 shares segment 0 with the embedding
    if (options.before_layer) {  // host copy of the streams, possibly replaced
      std::vector<float> host;
      SPW_TRY(s.download(streams.get(), streams.size(), host));
      options.before_layer(l, host);
      if (host.size() != streams.size()) return make_error("before_layer changed the size of the streams");
      SPW_TRY(st.staging.upload_bytes(streams.get(), host.data(), host.size() * sizeof(float), s.stream));
    }
    if (c.layers[l].engram) {
      ArenaScope scope(st.arena);
      SPW_TRY(engram(s, l, streams.get()));  // [n, hc, d] in place
      SPW_TRY(s.dump("engram.out", l, streams.get(), streams.size()));
    }

    // Attention sublayer.
    const HcSite attn_hc{lw.hc_attn, pre_a.get(), post_a.get(), comb_a.get()};
    SPW_TRY(hc_before(s, attn_hc, streams.get(), mixes.get(), c.is_v41() ? carried.get() : nullptr, lw.attn_norm,
                      x.get()));
    SPW_TRY(s.dump("attn.in", l, x.get(), x.size()));
    {
      ArenaScope scope(st.arena);
      SPW_TRY(attention(s, l, x.get(), y.get()));                                                  // [n, d]
    }
    SPW_TRY(s.dump("attn.out", l, y.get(), y.size()));
    SPW_TRY(hc_after(s, attn_hc, streams.get(), y.get(), mixes.get()));                         // [n, hc, d]

    // FFN sublayer.
    const HcSite ffn_hc{lw.hc_ffn, pre_f.get(), post_f.get(), comb_f.get()};
    SPW_TRY(hc_before(s, ffn_hc, streams.get(), mixes.get(), c.is_v41() ? pre_a.get() : nullptr, lw.ffn_norm,
                      x.get()));
    SPW_TRY(s.dump("ffn.in", l, x.get(), x.size()));
    {
      ArenaScope scope(st.arena);
      SPW_TRY(moe(s, l, x.get(), y.get()));                                                        // [n, d]
    }
    SPW_TRY(s.dump("ffn.out", l, y.get(), y.size()));
    SPW_TRY(hc_after(s, ffn_hc, streams.get(), y.get(), mixes.get()));                          // [n, hc, d]
    if (c.is_v41()) std::swap(carried, pre_f);
    if (options.on_layer) {
      std::vector<float> host;
      SPW_TRY(s.download(streams.get(), streams.size(), host));
      options.on_layer(l, host);
    }
  }

  // Head: collapse the streams (V4: hc_head weights; V4.1: the last FFN's pre), norm, project. Output rows
  // in several ranges are first gathered into one block.
  SPW_TRY(s.segment(c.n_layers));
  int n_out = 0;
  for (const RowRange& r : out_rows) n_out += r.n;
  const float* rows = streams.get() + size_t(out_rows[0].first) * hc_d;
  const float* head_pre = carried.get() + size_t(out_rows[0].first) * hc;
  if (out_rows.size() > 1) {
    Buf rows_out, pre_out;
    SPW_TRY(s.alloc(rows_out, size_t(n_out) * hc_d));
    SPW_TRY(s.alloc(pre_out, size_t(n_out) * hc));
    int at = 0;
    for (const RowRange& r : out_rows) {
      SPW_CUDA_TRY(cudaMemcpyAsync(rows_out.get() + size_t(at) * hc_d, streams.get() + size_t(r.first) * hc_d,
                                   size_t(r.n) * hc_d * sizeof(float), cudaMemcpyDeviceToDevice, s.stream));
      SPW_CUDA_TRY(cudaMemcpyAsync(pre_out.get() + size_t(at) * hc, carried.get() + size_t(r.first) * hc,
                                   size_t(r.n) * hc * sizeof(float), cudaMemcpyDeviceToDevice, s.stream));
      at += r.n;
    }
    rows = rows_out.get(), head_pre = pre_out.get();
  }
  const bool fused = cuda::hc_fused_supported(hc) && n_out <= kFusedHcMaxRows;
  const cuda::HcPreFromMixes head_from{mixes.get(), hc, st.w->hc_head.scale, st.w->hc_head.base, c.hc_eps};
  if (!c.is_v41()) {
    // [n_out, hc] mixes, then σ(mix·scale + base) + hc_eps (fused: in the collapse).
    SPW_TRY(cuda::hc_mixes(rows, st.w->hc_head.fn, n_out, hc, int64_t(hc_d), c.norm_eps, mixes.get(), s.stream));
    if (!fused)
      SPW_TRY(cuda::hc_head_pre(mixes.get(), st.w->hc_head.scale, st.w->hc_head.base, n_out, hc, c.hc_eps,
                                pre_a.get(), s.stream));
    head_pre = fused ? nullptr : pre_a.get();
  }
  SPW_TRY(s.alloc(logits, size_t(n_out) * c.vocab_size));
  if (fused) {  // [n_out, d]
    SPW_TRY(cuda::hc_collapse_norm(rows, head_pre, head_pre ? nullptr : &head_from, st.w->norm, n_out, hc, d,
                                   c.norm_eps, numerics_.bf16_activations, x.get(), s.stream));
  } else {
    SPW_TRY(cuda::hc_collapse(rows, head_pre, n_out, hc, d, numerics_.bf16_activations, x.get(), s.stream));
    SPW_TRY(cuda::rms_norm(x.get(), st.w->norm, x.get(), n_out, d, c.norm_eps, numerics_.bf16_activations, s.stream));
  }
  return linear(s, st.w->head, x.get(), n_out, logits.get());                                     // [n_out, vocab]
}

// Commits the chunks' positions and Engram n-gram histories.
void GpuModel::end_step(GpuStep& s) {
  const ModelConfig& c = config_;
  for (StepChunk& ch : s.chunks) {
    GpuSequence& seq = *ch.seq;
    seq.n_past += ch.n;
    engram_recent_append(c, host_weights_->engram_token_map, ch.tokens, ch.images.is_image, seq.engram_recent);
  }
}

Result<std::vector<float>> GpuModel::forward(GpuSequence& seq, std::span<const int32_t> tokens,
                                             const ForwardOptions& options, const ImagePositions& images) {
  GpuState& st = *state_;
  if (int64_t(tokens.size()) > options_.budget.max_step_tokens)
    return make_error("forward: ", tokens.size(), " tokens in one call, the budget allows ",
                      options_.budget.max_step_tokens);
  ArenaScope scope(st.arena);
  GpuStep s{config_, *st.w, *host_weights_, numerics_, st, {StepChunk{&seq, tokens, 0, 0, 0, images}}, options_.linear_path, st.stream,
            options_.moe_dispatch, options_.moe_paths};
  if (Status e = begin_step(s); !e.ok()) return make_error("forward: ", e.error().message);
  const int first = options.all_logits ? 0 : s.n - 1;
  const RowRange out_rows[] = {{first, s.n - first}};
  DeviceSpan<float> logits;
  SPW_TRY(run_step(s, options, out_rows, logits));
  std::vector<float> out;
  SPW_TRY(s.download(logits.get(), logits.size(), out));
  end_step(s);
  if (st.host_experts) SPW_TRY(st.host_experts->check());
  return out;
}

bool GpuModel::chunk_computes_as_decode(int n_tokens) const {
  return n_tokens >= 1 && linear_uses_gemv(options_.linear_path, n_tokens) &&
         cuda::sparse_attn_uses_split(n_tokens, config_.n_heads) && n_tokens <= invariant_decode_rows();
}

Result<std::vector<std::vector<float>>> GpuModel::forward_chunks(std::span<const ChunkInput> chunks, ChunkPath path) {
  GpuState& st = *state_;
  if (chunks.empty()) return make_error("forward_chunks: no chunks");
  ArenaScope scope(st.arena);
  GpuStep s{config_, *st.w, *host_weights_, numerics_, st, {}, options_.linear_path,
            st.stream, options_.moe_dispatch, options_.moe_paths};
  switch (path) {
    case ChunkPath::kAuto: break;
    case ChunkPath::kAsDecode:
      s.path = options_.linear_path == LinearPath::kAuto ? options_.decode_linear_path : options_.linear_path;
      if (options_.moe_paths.exl3_fixed_classes) s.exl3_item_class = kDecodeItemClass;
      break;
    case ChunkPath::kRowInvariant:
      s.path = LinearPath::kGemv, s.moe_dispatch = MoeDispatch::kHost, s.attn_no_split = true;
      s.exl3_item_class = kPrefillItemClass;
      break;
  }
  for (size_t b = 0; b < chunks.size(); ++b) {
    if (!chunks[b].seq) return make_error("forward_chunks: chunk ", b, " has no sequence");
    if (int64_t(chunks[b].tokens.size()) > options_.budget.max_step_tokens)
      return make_error("forward_chunks: chunk ", b, " has ", chunks[b].tokens.size(),
                        " tokens, the budget allows ", options_.budget.max_step_tokens);
    s.chunks.push_back(StepChunk{chunks[b].seq, chunks[b].tokens, 0, 0, 0, chunks[b].images});
  }
  if (Status e = begin_step(s); !e.ok()) return make_error("forward_chunks: ", e.error().message);
  std::vector<RowRange> out_rows;
  for (size_t b = 0; b < chunks.size(); ++b) {
    const StepChunk& ch = s.chunks[b];
    const RowRange r = chunks[b].all_logits ? RowRange{ch.row0, ch.n} : RowRange{ch.row0 + ch.n - 1, 1};
    if (!out_rows.empty() && out_rows.back().first + out_rows.back().n == r.first) out_rows.back().n += r.n;
    else out_rows.push_back(r);
  }
  DeviceSpan<float> logits;
  SPW_TRY(run_step(s, {}, out_rows, logits));
  std::vector<float> all;
  SPW_TRY(s.download(logits.get(), logits.size(), all));
  end_step(s);
  if (st.host_experts) SPW_TRY(st.host_experts->check());
  std::vector<std::vector<float>> out(chunks.size());
  const size_t vocab = size_t(config_.vocab_size);
  size_t at = 0;
  for (size_t b = 0; b < chunks.size(); ++b) {
    const size_t n = chunks[b].all_logits ? chunks[b].tokens.size() : 1;
    out[b].assign(all.begin() + std::ptrdiff_t(at * vocab), all.begin() + std::ptrdiff_t((at + n) * vocab));
    at += n;
  }
  return out;
}

Status GpuModel::decode(std::span<GpuSequence* const> seqs, std::span<const int32_t> tokens, std::span<int32_t> next,
                        std::vector<float>* logits, std::span<const TokenDraw> draws,
                        std::vector<cuda::RowLogprobs>* row_logprobs) {
  GpuState& st = *state_;
  const int B = int(seqs.size());
  if (B == 0) return make_error("decode: no sequences");
  if (tokens.size() != seqs.size() || next.size() != seqs.size())
    return make_error("decode: ", seqs.size(), " sequences, ", tokens.size(), " tokens, ", next.size(),
                      " outputs (one each)");
  if (!draws.empty() && draws.size() != seqs.size())
    return make_error("decode: ", seqs.size(), " sequences, ", draws.size(), " draws (none, or one each)");
  const bool sampled = std::any_of(draws.begin(), draws.end(), [](const TokenDraw& d) { return d.params.temperature > 0.f; });
  if (sampled && !st.sample_ws.get()) return make_error("decode: no sampling workspace (the plan has none)");
  const bool edited = std::any_of(draws.begin(), draws.end(), [](const TokenDraw& d) { return d.edits(); });
  const bool want_logprobs = std::any_of(draws.begin(), draws.end(), [](const TokenDraw& d) { return d.top_logprobs >= 0; });
  if (want_logprobs && !row_logprobs) return make_error("decode: draws ask for logprobs and there is nowhere to put them");
  if (edited && !fits_pick_workspace(draws))
    return make_error("decode: the draws' penalties and biases exceed ", kPickShiftsPerStep, " shifts in one call");
  if (B > options_.budget.max_seqs)
    return make_error("decode: ", B, " sequences, the budget allows ", options_.budget.max_seqs);
  ArenaScope scope(st.arena);
  const LinearPath path = options_.linear_path == LinearPath::kAuto ? options_.decode_linear_path : options_.linear_path;
  GpuStep s{config_, *st.w, *host_weights_, numerics_, st, {}, path, st.stream, options_.moe_dispatch, options_.moe_paths};
  if (options_.moe_paths.exl3_fixed_classes) s.exl3_item_class = kDecodeItemClass;
  for (int b = 0; b < B; ++b) {
    if (!seqs[b]) return make_error("decode: sequence ", b, " is null");
    s.chunks.push_back(StepChunk{seqs[b], tokens.subspan(b, 1)});
  }
  if (Status e = begin_step(s); !e.ok()) return make_error("decode: ", e.error().message);
  // CUDA graphs (step_graphs.h) when the step has no host round trip; the guard ends an interrupted recording.
  // Past kDeviceDispatchRows (dense experts may dispatch on the device further: SPILLWAY_DENSE_DEVICE_ROWS) only
  // when the device dispatch is forced: capture of those larger steps has not run on a GPU yet.
  if (st.cuda_graphs && moe_on_device(s) && (B <= kDeviceDispatchRows || options_.moe_dispatch == MoeDispatch::kDevice))
    s.graphs = &st.graphs;
  struct AbortRecording {
    StepGraphs* g;
    ~AbortRecording() {
      if (g) g->abort();
    }
  } abort_recording{s.graphs};
  DeviceSpan<float> out;
  const RowRange out_rows[] = {{0, B}};
  SPW_TRY(run_step(s, {}, out_rows, out));
  DeviceSpan<int32_t> next_d;
  SPW_TRY(s.alloc(next_d, B));
  if (!sampled && !edited) SPW_TRY(cuda::argmax(out.get(), B, config_.vocab_size, next_d.get(), s.stream));
  if (s.graphs) SPW_TRY(s.graphs->end_segment());
  // Outside the graphs: the draws' inputs change every step.
  PickEdits edits(st.pick_ws.get(), st.pick_ws.size());
  if (edited) SPW_TRY(edits.before_draw(out.get(), config_.vocab_size, draws, s.stream));
  if (!sampled && edited) SPW_TRY(cuda::argmax(out.get(), B, config_.vocab_size, next_d.get(), s.stream));
  if (sampled) {
    // Rows are independent, so pieces of kSampleRows give what one call would.
    std::vector<cuda::SampleParams> params(static_cast<size_t>(B));
    std::vector<double> u(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b) {
      params[size_t(b)] = draws[size_t(b)].params;
      u[size_t(b)] = draws[size_t(b)].u;
    }
    DeviceSpan<cuda::SampleParams> params_d;
    DeviceSpan<double> u_d;
    SPW_TRY(s.upload(params, params_d));
    SPW_TRY(s.upload(u, u_d));
    const int64_t V = config_.vocab_size;
    for (int first = 0; first < B; first += kSampleRows) {
      const int n = std::min(kSampleRows, B - first);
      SPW_TRY(cuda::sample(out.get() + int64_t(first) * V, n, V, params_d.get() + first, u_d.get() + first,
                           st.sample_ws.get(), st.sample_ws.size(), next_d.get() + first, s.stream));
    }
  }
  if (want_logprobs) SPW_TRY(edits.after_draw(out.get(), next_d.get(), *row_logprobs, s.stream));
  std::vector<int32_t> host_next;
  SPW_TRY(s.download(next_d.get(), size_t(B), host_next));
  if (logits) SPW_TRY(s.download(out.get(), out.size(), *logits));
  std::copy(host_next.begin(), host_next.end(), next.begin());
  end_step(s);
  if (st.host_experts) SPW_TRY(st.host_experts->check());
  return {};
}

}  // namespace spw::engine
