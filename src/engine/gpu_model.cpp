// The top level of the GPU forward: embedding, the blocks with their hyper-connections, the head
// (model/model.cpp on the GPU); the sequence slots and page reservation of the KV pools.
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
#include "ops/ref/rope.h"

namespace spw::engine {

// ---- sequences ----

GpuSequence::GpuSequence(GpuSequence&& o) noexcept { *this = std::move(o); }

GpuSequence& GpuSequence::operator=(GpuSequence&& o) noexcept {
  if (this != &o) {
    if (owner) owner->free_sequence(*this);
    owner = std::exchange(o.owner, nullptr);
    slot = std::exchange(o.slot, -1);
    n_past = o.n_past;
    engram_recent = std::move(o.engram_recent);
    published_index_k_layer = o.published_index_k_layer;
    ring_pages = std::move(o.ring_pages);
    comp_pages = std::move(o.comp_pages);
    key_pages = std::move(o.key_pages);
    keep_rollback = o.keep_rollback;
    rollback = std::move(o.rollback);
  }
  return *this;
}

GpuSequence::~GpuSequence() {
  if (owner) owner->free_sequence(*this);
}

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
size_t GpuModel::step_arena_high_water() const { return state_->arena.high_water(); }
size_t GpuModel::step_arena_capacity() const { return state_->arena.capacity(); }
void GpuModel::set_cuda_graphs(bool on) { state_->cuda_graphs = on; }
StepGraphStats GpuModel::graph_stats() const { return state_->graphs.stats(); }

int GpuModel::invariant_decode_rows() const {
  const LinearPath path = options_.linear_path == LinearPath::kAuto ? options_.decode_linear_path : options_.linear_path;
  int rows = path == LinearPath::kGemv ? options_.budget.max_seqs : kDeviceDispatchRows;
  for (const ExpertTable& t : state_->expert_tables)
    if (t.ready() && options_.moe_dispatch == MoeDispatch::kAuto) rows = std::min(rows, options_.moe_paths.dense_device_rows);
  for (const Exl3MoeTable& t : state_->exl3_moe)
    if (t.ready() && options_.moe_dispatch == MoeDispatch::kAuto) rows = std::min(rows, options_.moe_paths.exl3_device_rows);
  return std::min(rows, options_.budget.max_seqs);
}

namespace {

// Writes page-table row (layer, slot) of a pool from the sequence's page list (queued on the stream).
Status upload_page_row(GpuState& st, const KvPool& pool, int layer, int slot, const std::vector<int32_t>& pages) {
  int32_t* row = pool.page_table.get() + (size_t(layer) * pool.max_seqs + slot) * pool.max_pages_per_seq;
  return st.staging.upload_bytes(row, pages.data(), pages.size() * sizeof(int32_t), st.stream);
}

// Grows `pages` to n_pages pages of `pool` and publishes the row.
Status grow(GpuState& st, KvPool& pool, int layer, int slot, std::vector<int32_t>& pages, int64_t n_pages) {
  if (int64_t(pages.size()) >= n_pages) return {};
  auto more = pool.alloc.alloc(int32_t(n_pages - int64_t(pages.size())));
  if (!more.ok()) return make_error("KV pool exhausted: ", more.error().message);
  pages.insert(pages.end(), more->begin(), more->end());
  return upload_page_row(st, pool, layer, slot, pages);
}

int64_t pages_for(int64_t rows) { return (rows + cuda::kKvPageRows - 1) / cuda::kKvPageRows; }

}  // namespace

Result<GpuSequence> GpuModel::new_sequence() {
  const ModelConfig& c = config_;
  GpuState& st = *state_;
  auto it = std::find(st.slot_used.begin(), st.slot_used.end(), false);
  if (it == st.slot_used.end())
    return make_error("new_sequence: all ", st.slot_used.size(), " sequence slots of the KV budget are in use");
  GpuSequence seq;
  seq.owner = this;
  seq.slot = int(it - st.slot_used.begin());
  *it = true;
  seq.ring_pages.resize(c.n_layers);
  seq.comp_pages.resize(c.n_layers);
  seq.key_pages.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    SPW_TRY(grow(st, st.ring, l, seq.slot, seq.ring_pages[l], pages_for(c.window)));
    for (CompressorBuffers* cb : {&st.comp_state[l], &st.idx_comp_state[l]})
      if (cb->shape.ratio > 0) SPW_TRY(cuda::compressor_state_reset_cuda(cb->shape, cb->view(), seq.slot, st.stream));
  }
  return seq;
}

namespace {

// Queues copies of the rows of pages src[i] into pages dst[i] of one pool.
Status copy_pages(GpuState& st, const KvPool& pool, const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
  const size_t nb = cuda::kv_page_nbytes(pool.fmt);
  for (size_t i = 0; i < src.size(); ++i)
    SPW_CUDA_TRY(cudaMemcpyAsync(pool.pages.get() + size_t(dst[i]) * nb, pool.pages.get() + size_t(src[i]) * nb, nb,
                                 cudaMemcpyDeviceToDevice, st.stream));
  return {};
}

// dst := src's first n_shared pages (one more reference each) and copies of the rest, in dst's page-table row.
Status share_pages(GpuState& st, KvPool& pool, int layer, int slot, const std::vector<int32_t>& src, size_t n_shared,
                   std::vector<int32_t>& dst) {
  if (src.empty()) return {};
  n_shared = std::min(n_shared, src.size());
  const std::vector<int32_t> shared(src.begin(), src.begin() + std::ptrdiff_t(n_shared));
  const std::vector<int32_t> rest_src(src.begin() + std::ptrdiff_t(n_shared), src.end());
  auto rest = pool.alloc.alloc(int32_t(rest_src.size()));
  if (!rest.ok()) return make_error("KV pool exhausted: ", rest.error().message);
  pool.alloc.retain(shared);
  dst = shared;
  dst.insert(dst.end(), rest->begin(), rest->end());
  SPW_TRY(copy_pages(st, pool, rest_src, *rest));
  return upload_page_row(st, pool, layer, slot, dst);
}

// Queues a copy of slot `from`'s compressor state into slot `to`.
Status copy_compressor_slot(GpuState& st, const CompressorBuffers& cb, int from, int to) {
  if (cb.shape.ratio == 0) return {};
  const size_t n = size_t(cb.shape.ratio) * cb.shape.width;
  for (const DeviceBuffer<float>* b : {&cb.kv, &cb.score, &cb.prev_kv, &cb.prev_score})
    if (b->get())
      SPW_CUDA_TRY(cudaMemcpyAsync(b->get() + to * n, b->get() + from * n, n * sizeof(float), cudaMemcpyDeviceToDevice,
                                   st.stream));
  return {};
}

}  // namespace

Result<GpuSequence> GpuModel::copy_sequence(const GpuSequence& src) {
  if (src.owner != this || src.slot < 0) return make_error("copy_sequence: a foreign or freed sequence");
  GpuState& st = *state_;
  auto made = new_sequence();
  if (!made.ok()) return made.error();
  GpuSequence& dst = *made;  // returned to the pools by its destructor on any error below
  for (int l = 0; l < config_.n_layers; ++l) {
    SPW_TRY(grow(st, st.ring, l, dst.slot, dst.ring_pages[l], int64_t(src.ring_pages[l].size())));
    SPW_TRY(copy_pages(st, st.ring, src.ring_pages[l], dst.ring_pages[l]));
    const size_t full = size_t(shared_pages(src.n_past, l));
    SPW_TRY(share_pages(st, st.comp, l, dst.slot, src.comp_pages[l], full, dst.comp_pages[l]));
    SPW_TRY(share_pages(st, st.keys, l, dst.slot, src.key_pages[l], full, dst.key_pages[l]));
    SPW_TRY(copy_compressor_slot(st, st.comp_state[l], src.slot, dst.slot));
    SPW_TRY(copy_compressor_slot(st, st.idx_comp_state[l], src.slot, dst.slot));
  }
  dst.n_past = src.n_past;
  dst.engram_recent = src.engram_recent;
  dst.published_index_k_layer = src.published_index_k_layer;
  return made;
}

size_t GpuModel::sequence_nbytes(const GpuSequence& seq) const {
  const GpuState& st = *state_;
  size_t n = 0;
  for (int l = 0; l < config_.n_layers && seq.slot >= 0; ++l) {
    n += seq.ring_pages[l].size() * cuda::kv_page_nbytes(st.ring.fmt) +
         seq.comp_pages[l].size() * cuda::kv_page_nbytes(st.comp.fmt) +
         seq.key_pages[l].size() * cuda::kv_page_nbytes(st.keys.fmt);
    for (const CompressorBuffers* cb : {&st.comp_state[l], &st.idx_comp_state[l]})
      n += size_t(cb->shape.ratio) * cb->shape.width * sizeof(float) * (cb->shape.overlap ? 4 : 2);
  }
  return n;
}

GpuModel::KvPageCounts GpuModel::kv_pages() const {
  KvPageCounts c;
  c.total = plan_.kv.ring_pages + plan_.kv.compressed_pages + plan_.kv.index_key_pages;
  c.used = c.total - (state_->ring.alloc.n_free() + state_->comp.alloc.n_free() + state_->keys.alloc.n_free());
  return c;
}

int64_t GpuModel::shared_pages(int64_t n_past, int layer) const {
  // Pages every row of which holds an entry already written (entries are written once, in order).
  const int r = config_.layers[layer].compress_ratio;
  return options_.share_kv_pages && r > 0 ? n_past / r / cuda::kKvPageRows : 0;
}

GpuModel::KvNeed GpuModel::kv_need(std::span<const Growth> growth) const {
  const ModelConfig& c = config_;
  int64_t slots = 0, ring = 0, comp = 0, keys = 0;
  for (const Growth& g : growth) {
    if (!g.seq) {
      ++slots;
      ring += c.n_layers * pages_for(c.window);
    }
    for (int l = 0; l < c.n_layers; ++l) {
      const int r = c.layers[l].compress_ratio;
      if (r == 0) continue;
      const int64_t want = pages_for(g.n_total / r);
      const int64_t shared = !g.seq && g.copy_of ? shared_pages(g.copy_of->n_past, l) : 0;
      if (layer_has_compressed(c, l))
        comp += std::max<int64_t>(0, want - (g.seq ? int64_t(g.seq->comp_pages[l].size()) : shared));
      if (layer_has_index_keys(c, l))
        keys += std::max<int64_t>(0, want - (g.seq ? int64_t(g.seq->key_pages[l].size()) : shared));
    }
  }
  return {slots, ring, comp, keys};
}

bool GpuModel::can_hold(std::span<const Growth> growth) const {
  const GpuState& st = *state_;
  const KvNeed need = kv_need(growth);
  const int64_t free_slots = std::count(st.slot_used.begin(), st.slot_used.end(), false);
  return need.slots <= free_slots && need.ring <= st.ring.alloc.n_free() && need.comp <= st.comp.alloc.n_free() &&
         need.keys <= st.keys.alloc.n_free();
}

void GpuModel::free_sequence(GpuSequence& seq) {
  if (seq.owner != this || seq.slot < 0) return;
  for (auto& p : seq.ring_pages) state_->ring.alloc.free(p);
  for (auto& p : seq.comp_pages) state_->comp.alloc.free(p);
  for (auto& p : seq.key_pages) state_->keys.alloc.free(p);
  seq.ring_pages.clear();
  seq.comp_pages.clear();
  seq.key_pages.clear();
  state_->slot_used[seq.slot] = false;
  seq.slot = -1;
  seq.owner = nullptr;
}

// Pages for the compressed entries and index keys of every layer after n_total positions.
Status GpuModel::reserve_pages(GpuSequence& seq, int64_t n_total) {
  const ModelConfig& c = config_;
  for (int l = 0; l < c.n_layers; ++l) {
    const int r = c.layers[l].compress_ratio;
    if (r == 0) continue;
    const int64_t pages = pages_for(n_total / r);
    if (layer_has_compressed(c, l)) SPW_TRY(grow(*state_, state_->comp, l, seq.slot, seq.comp_pages[l], pages));
    if (layer_has_index_keys(c, l)) SPW_TRY(grow(*state_, state_->keys, l, seq.slot, seq.key_pages[l], pages));
  }
  return {};
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
    engram_recent_append(c, host_weights_->engram_token_map, ch.tokens, seq.engram_recent);
  }
}

Result<std::vector<float>> GpuModel::forward(GpuSequence& seq, std::span<const int32_t> tokens,
                                             const ForwardOptions& options) {
  GpuState& st = *state_;
  if (int64_t(tokens.size()) > options_.budget.max_step_tokens)
    return make_error("forward: ", tokens.size(), " tokens in one call, the budget allows ",
                      options_.budget.max_step_tokens);
  ArenaScope scope(st.arena);
  GpuStep s{config_, *st.w, *host_weights_, numerics_, st, {StepChunk{&seq, tokens}}, options_.linear_path, st.stream,
            options_.moe_dispatch, options_.moe_paths};
  if (Status e = begin_step(s); !e.ok()) return make_error("forward: ", e.error().message);
  const int first = options.all_logits ? 0 : s.n - 1;
  const RowRange out_rows[] = {{first, s.n - first}};
  DeviceSpan<float> logits;
  SPW_TRY(run_step(s, options, out_rows, logits));
  std::vector<float> out;
  SPW_TRY(s.download(logits.get(), logits.size(), out));
  end_step(s);
  return out;
}

bool GpuModel::chunk_computes_as_decode(int n_tokens) const {
  return n_tokens >= 1 && linear_uses_gemv(options_.linear_path, n_tokens) &&
         cuda::sparse_attn_uses_split(n_tokens, config_.n_heads) && n_tokens <= invariant_decode_rows();
}

Result<std::vector<std::vector<float>>> GpuModel::forward_chunks(std::span<const ChunkInput> chunks, bool as_decode) {
  GpuState& st = *state_;
  if (chunks.empty()) return make_error("forward_chunks: no chunks");
  ArenaScope scope(st.arena);
  const LinearPath decode_path =
      options_.linear_path == LinearPath::kAuto ? options_.decode_linear_path : options_.linear_path;
  GpuStep s{config_, *st.w, *host_weights_, numerics_, st, {}, as_decode ? decode_path : options_.linear_path,
            st.stream, options_.moe_dispatch, options_.moe_paths};
  for (size_t b = 0; b < chunks.size(); ++b) {
    if (!chunks[b].seq) return make_error("forward_chunks: chunk ", b, " has no sequence");
    if (int64_t(chunks[b].tokens.size()) > options_.budget.max_step_tokens)
      return make_error("forward_chunks: chunk ", b, " has ", chunks[b].tokens.size(),
                        " tokens, the budget allows ", options_.budget.max_step_tokens);
    s.chunks.push_back(StepChunk{chunks[b].seq, chunks[b].tokens});
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
  return {};
}

// ---- loading ----

namespace {

template <class T>
Status fill(DeviceBuffer<T>& buf, size_t n, T value) {
  return upload(std::vector<T>(n, value), buf);
}

Status alloc_pool(KvPool& pool, const cuda::KvRowFormat& fmt, int64_t n_pages, const ModelConfig& c,
                  const MemoryPlan& plan, int max_seqs) {
  pool.fmt = fmt;
  pool.max_seqs = max_seqs;
  pool.max_pages_per_seq = plan.max_pages_per_seq;
  pool.alloc = cuda::KvPageAllocator(int32_t(n_pages));
  SPW_TRY(pool.pages.alloc(size_t(n_pages) * cuda::kv_page_nbytes(fmt)));
  // Unused page-table entries point at page 0 (never read: rows beyond a sequence's count are not
  // addressed), so a stray read stays in bounds.
  return fill(pool.page_table, size_t(c.n_layers) * max_seqs * plan.max_pages_per_seq, int32_t(0));
}

Status alloc_compressor(CompressorBuffers& cb, const cuda::CompressorShape& shape, int max_seqs) {
  cb.shape = shape;
  const size_t n = size_t(max_seqs) * shape.ratio * shape.width;
  SPW_TRY(cb.kv.alloc(n));
  SPW_TRY(cb.score.alloc(n));
  if (shape.overlap) {
    SPW_TRY(cb.prev_kv.alloc(n));
    SPW_TRY(cb.prev_score.alloc(n));
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<GpuModel>> load_gpu_model(const std::string& model_dir, const Numerics& numerics,
                                                 const GpuModelOptions& options) {
  auto config = read_model_config(model_dir);
  if (!config.ok()) return config.error();
  if (!config->is_v41() && numerics.fake_quant && !numerics.bf16_activations)
    return make_error("load_gpu_model: V4 with fake quant but without bf16 activations is not supported on the GPU: "
                      "its quantized KV rows keep the RoPE channels in bf16, where this CPU mode keeps f32 (use "
                      "Numerics::reference() or Numerics::exact())");
  // The GPU uploads the routed experts' stored bytes (MXFP4 or EXL3 trellis): no f32 host copy of
  // them, which at full width would be ~54 GB per layer (and an EXL3 decode of ~37 min per layer).
  LoadOptions load;
  load.routed_expert_values = false;
  load.on_progress = options.on_progress;
  auto weights = load_weights(model_dir, *config, load);
  if (!weights.ok()) return weights.error();

  std::unique_ptr<GpuModel> m(new GpuModel());
  m->config_ = std::move(config.value());
  m->numerics_ = numerics;
  m->options_ = options;
  m->host_weights_ = std::move(weights.value());
  const ModelConfig& c = m->config_;
  m->plan_ = plan_memory(c, options.budget, numerics.fake_quant);
  m->state_ = std::make_unique<GpuState>();
  GpuState& st = *m->state_;

  auto w = upload_weights(c, *m->host_weights_, numerics);
  if (!w.ok()) return w.error();
  st.w = std::move(w.value());

  const int S = options.budget.max_seqs;
  const KvPlan& kv = m->plan_.kv;
  const KvFormats formats = kv_formats(c, numerics.fake_quant);
  SPW_TRY(alloc_pool(st.ring, formats.ring, kv.ring_pages, c, m->plan_, S));
  SPW_TRY(alloc_pool(st.comp, formats.compressed, kv.compressed_pages, c, m->plan_, S));
  SPW_TRY(alloc_pool(st.keys, formats.index_key, kv.index_key_pages, c, m->plan_, S));

  st.comp_state.resize(c.n_layers);
  st.idx_comp_state.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerCompressors lc = layer_compressors(c, l);
    if (lc.comp.ratio > 0) SPW_TRY(alloc_compressor(st.comp_state[l], lc.comp, S));
    if (lc.idx_comp.ratio > 0) SPW_TRY(alloc_compressor(st.idx_comp_state[l], lc.idx_comp, S));
  }
  if (options.budget.max_rollback_tokens > 0) {
    st.rollback = rollback_layout(c, options.budget.max_rollback_tokens, cuda::kv_row_nbytes(formats.ring));
    SPW_TRY(st.rollback_area.alloc(size_t(S) * st.rollback.slot_floats));
  }

  SPW_TRY(upload(ref::rope_frequencies({c.rope_theta, c.d_rope, false}), st.rope_main));
  SPW_TRY(upload(ref::rope_frequencies({c.compress_rope_theta, c.d_rope, true, c.yarn_factor, c.yarn_original_len,
                                        c.yarn_beta_fast, c.yarn_beta_slow}),
                 st.rope_compress));
  if (c.is_v41() && !c.engram_layers.empty()) {
    st.engram_params = ref::engram_hash_params(c.engram_layers, c.engram_vocab_size, c.engram_compressed_vocab_size,
                                               c.engram_max_ngram, c.engram_n_heads);
    for (auto& p : st.engram_params) p.pad_id = m->host_weights_->engram_token_map[c.engram_pad_token_id];
    for (int layer : c.engram_layers) {
      const EngramWeights& ew = m->host_weights_->layers[layer].engram;
      EngramTables& t = st.engram_tables.emplace_back();
      SPW_TRY(t.table.alloc_copy(ew.table->data, ew.table->nbytes));
      SPW_TRY(t.scale.alloc_copy(ew.table_scale->data, ew.table_scale->nbytes));
      std::vector<float> qk(ew.q_weight.size());
      for (size_t i = 0; i < qk.size(); ++i) qk[i] = ew.q_weight[i] * ew.k_weight[i];
      SPW_TRY(upload(qk, t.qk));
    }
  }
  const int max_in = max_linear_in(c);
  SPW_TRY(linear_workspace_alloc(st.ws, step_max_rows(options.budget), max_in,
                                 std::max(size_t(64) << 20, size_t(128) * max_in * sizeof(float))));
  const int64_t exl3_width = exl3_workspace_width(c);  // the plan counts this workspace
  SPW_TRY(exl3_cuda_workspace_alloc(st.exl3_ws, exl3_width, exl3_width));
  st.expert_tables.resize(c.n_layers);
  st.exl3_moe.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    // EXL3 experts compute x·Ŵ from fp16 operands (cuda/exl3_gemm.h): not an f32 product.
    const DeviceLayer& dl = st.w->layers[l];
    if (!numerics.bf16_activations && (dl.shared.is_exl3() || (!dl.experts.empty() && dl.experts[0].is_exl3())))
      return make_error("load_gpu_model: numerics without bf16 activations (Numerics::exact()) need dense routed "
                        "experts; layer ", l, " has EXL3 experts, which the GPU multiplies in fp16");
    SPW_TRY(expert_table_build(st.w->layers[l].experts, st.expert_tables[l]));
    SPW_TRY(exl3_moe_table_build(st.w->layers[l].experts, c.swiglu_limit, st.exl3_moe[l]));
    if (st.exl3_moe[l].ready() && !st.exl3_moe_ws.buf)
      SPW_TRY(exl3_cuda_moe_workspace_alloc(st.exl3_moe_ws, kDeviceDispatchRows * c.top_k, st.exl3_moe[l].layer.d,
                                            st.exl3_moe[l].layer.f));
  }
  if (m->plan_.sample_nbytes > 0) SPW_TRY(st.sample_ws.alloc(m->plan_.sample_nbytes));
  SPW_TRY(st.pick_ws.alloc(m->plan_.pick_nbytes));
  SPW_TRY(st.arena.init(m->plan_.step_arena_nbytes));
  SPW_TRY(st.staging.init(m->plan_.staging_host_nbytes));
  st.cuda_graphs = options.cuda_graphs;
  SPW_CUDA_TRY(cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking));
  st.slot_used.assign(S, false);
  // The uploads above ran on the legacy stream; the model's stream does not wait for it.
  SPW_CUDA_TRY(cudaDeviceSynchronize());
  // Every weight lives on the device (or, for Engram's tables, in mapped host buffers) now: drop the host
  // copies and the checkpoint's maps, keeping only the token map the host-side Engram hashing reads.
  auto kept = std::make_unique<ModelWeights>();
  kept->engram_token_map = std::move(m->host_weights_->engram_token_map);
  m->host_weights_ = std::move(kept);
  return m;
}

}  // namespace spw::engine
