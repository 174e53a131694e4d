// The top level of the GPU forward: embedding, the blocks with their hyper-connections, the head
// (model/model.cpp on the GPU); the sequence slots and page reservation of the KV pools.
#include "engine/gpu_model.h"

#include <algorithm>
#include <cmath>

#include "cuda/ops/embedding.h"
#include "cuda/ops/hyper_connection.h"
#include "cuda/ops/norm.h"
#include "engine/gpu_step.h"
#include "ops/ref/linalg.h"
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
  }
  return *this;
}

GpuSequence::~GpuSequence() {
  if (owner) owner->free_sequence(*this);
}

GpuModel::~GpuModel() {
  if (state_) {
    linear_workspace_free(state_->ws);
    exl3_cuda_workspace_free(state_->exl3_ws);
  }
}

size_t GpuModel::weight_nbytes() const { return state_->w->nbytes; }

namespace {

// Writes page-table row (layer, slot) of a pool from the sequence's page list.
Status upload_page_row(const KvPool& pool, int layer, int slot, const std::vector<int32_t>& pages) {
  int32_t* row = pool.page_table.get() + (size_t(layer) * pool.max_seqs + slot) * pool.max_pages_per_seq;
  SPW_CUDA_TRY(cudaMemcpy(row, pages.data(), pages.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  return {};
}

// Grows `pages` to n_pages pages of `pool` and publishes the row.
Status grow(KvPool& pool, int layer, int slot, std::vector<int32_t>& pages, int64_t n_pages) {
  if (int64_t(pages.size()) >= n_pages) return {};
  auto more = pool.alloc.alloc(int32_t(n_pages - int64_t(pages.size())));
  if (!more.ok()) return make_error("KV pool exhausted: ", more.error().message);
  pages.insert(pages.end(), more->begin(), more->end());
  return upload_page_row(pool, layer, slot, pages);
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
    SPW_TRY(grow(st.ring, l, seq.slot, seq.ring_pages[l], pages_for(c.window)));
    for (CompressorBuffers* cb : {&st.comp_state[l], &st.idx_comp_state[l]})
      if (cb->shape.ratio > 0) SPW_TRY(cuda::compressor_state_reset_cuda(cb->shape, cb->view(), seq.slot, nullptr));
  }
  return seq;
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
    if (layer_has_compressed(c, l)) SPW_TRY(grow(state_->comp, l, seq.slot, seq.comp_pages[l], pages));
    if (layer_has_index_keys(c, l)) SPW_TRY(grow(state_->keys, l, seq.slot, seq.key_pages[l], pages));
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

template <class T>
Status fill(DeviceBuffer<T>& buf, size_t n, T value) {
  return upload(std::vector<T>(n, value), buf);
}

// One hyper-connection site: pre [n, hc], post [n, hc], comb [n, hc, hc] from the streams.
Status hc_coefficients(GpuStep& s, const DeviceHc& hw, const float* streams, DeviceBuffer<float>& pre,
                       DeviceBuffer<float>& post, DeviceBuffer<float>& comb) {
  const ModelConfig& c = s.c;
  const int n = s.n, hc = c.hc_mult, n_mix = (2 + hc) * hc;
  DeviceBuffer<float> mixes;
  SPW_TRY(mixes.alloc(size_t(n) * n_mix));
  SPW_TRY(pre.alloc(size_t(n) * hc));
  SPW_TRY(post.alloc(size_t(n) * hc));
  SPW_TRY(comb.alloc(size_t(n) * hc * hc));
  // [n, (2+hc)·hc]
  SPW_TRY(cuda::hc_mixes(streams, hw.fn, n, n_mix, int64_t(hc) * c.d_model, c.norm_eps, mixes.get(), s.stream));
  // [n, hc], [n, hc], [n, hc, hc]
  return cuda::hc_split_sinkhorn(mixes.get(), hw.scale, hw.base, n, hc, c.hc_sinkhorn_iters, c.hc_eps, pre.get(),
                                 post.get(), comb.get(), s.stream);
}

// x[n, d] = norm(Σ_j pre_j X_j), bf16 after the collapse and after the norm.
Status collapse_and_norm(GpuStep& s, const float* streams, const float* pre, const float* norm_w, float* x) {
  const bool rb = s.num.bf16_activations;
  SPW_TRY(cuda::hc_collapse(streams, pre, s.n, s.c.hc_mult, s.c.d_model, rb, x, s.stream));  // [n, d]
  return cuda::rms_norm(x, norm_w, x, s.n, s.c.d_model, s.c.norm_eps, rb, s.stream);          // [n, d]
}

}  // namespace

Result<std::vector<float>> GpuModel::forward(GpuSequence& seq, std::span<const int32_t> tokens,
                                             const ForwardOptions& options) {
  const ModelConfig& c = config_;
  GpuState& st = *state_;
  if (seq.owner != this) return make_error("forward: the sequence does not belong to this model");
  if (tokens.empty()) return make_error("forward: no tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= c.vocab_size)
      return make_error("token id ", t, " is outside the vocabulary (0..", c.vocab_size - 1, ")");
  if (int64_t(tokens.size()) > options_.budget.max_step_tokens)
    return make_error("forward: ", tokens.size(), " tokens in one call, the budget allows ",
                      options_.budget.max_step_tokens);
  if (seq.n_past + int64_t(tokens.size()) > options_.budget.max_context)
    return make_error("forward: context of ", seq.n_past + int64_t(tokens.size()), " positions exceeds the budget's ",
                      options_.budget.max_context);
  SPW_TRY(reserve_pages(seq, seq.n_past + int64_t(tokens.size())));

  GpuStep s{c, *st.w, *host_weights_, numerics_, st, seq, tokens, seq.n_past, int(tokens.size()), options_.linear_path};
  const int n = s.n, d = c.d_model, hc = c.hc_mult;
  const size_t hc_d = size_t(hc) * d;
  std::vector<int64_t> positions(n);
  for (int i = 0; i < n; ++i) positions[i] = s.p + i;
  SPW_TRY(upload(tokens.data(), tokens.size(), s.tokens_d));
  SPW_TRY(upload(positions, s.pos));
  SPW_TRY(fill(s.slots, n, int32_t(seq.slot)));
  SPW_TRY(fill(s.zeros, n, int32_t(0)));
  SPW_TRY(fill(s.n_tokens, 1, int32_t(n)));
  SPW_TRY(fill(s.pos0s, n, s.p));
  if (c.is_v41()) SPW_TRY(fill(s.topk, size_t(n) * c.index_topk, int32_t(-1)));

  // [n, hc, d]: hc copies of the embedding.
  DeviceBuffer<float> streams, x, y;
  SPW_TRY(streams.alloc(size_t(n) * hc_d));
  SPW_TRY(x.alloc(size_t(n) * d));
  SPW_TRY(y.alloc(size_t(n) * d));
  SPW_TRY(cuda::embedding_gather(st.w->embed, c.vocab_size, d, s.tokens_d.get(), n, hc, streams.get(), s.stream));

  // V4.1 single-pass mHC: the collapse weights come from the previous sublayer; one-hot at the start.
  std::vector<float> one_hot(size_t(n) * hc, 0.f);
  for (int i = 0; i < n; ++i) one_hot[size_t(i) * hc] = 1.f;
  DeviceBuffer<float> carried, pre_a, post_a, comb_a, pre_f, post_f, comb_f;
  SPW_TRY(upload(one_hot, carried));

  for (int l = 0; l < c.n_layers; ++l) {
    const DeviceLayer& lw = st.w->layers[l];
    if (options.before_layer) {  // host copy of the streams, possibly replaced
      std::vector<float> host;
      SPW_TRY(download(streams.get(), streams.size(), host));
      options.before_layer(l, host);
      if (host.size() != streams.size()) return make_error("before_layer changed the size of the streams");
      SPW_CUDA_TRY(cudaMemcpy(streams.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    if (c.layers[l].engram) SPW_TRY(engram(s, l, streams.get()));  // [n, hc, d] in place

    // Attention sublayer.
    SPW_TRY(hc_coefficients(s, lw.hc_attn, streams.get(), pre_a, post_a, comb_a));
    SPW_TRY(collapse_and_norm(s, streams.get(), c.is_v41() ? carried.get() : pre_a.get(), lw.attn_norm, x.get()));
    SPW_TRY(attention(s, l, x.get(), y.get()));                                                    // [n, d]
    SPW_TRY(cuda::hc_expand(streams.get(), y.get(), post_a.get(), comb_a.get(), n, hc, d, numerics_.bf16_activations,
                            s.stream));                                                            // [n, hc, d]

    // FFN sublayer.
    SPW_TRY(hc_coefficients(s, lw.hc_ffn, streams.get(), pre_f, post_f, comb_f));
    SPW_TRY(collapse_and_norm(s, streams.get(), c.is_v41() ? pre_a.get() : pre_f.get(), lw.ffn_norm, x.get()));
    SPW_TRY(moe(s, l, x.get(), y.get()));                                                          // [n, d]
    SPW_TRY(cuda::hc_expand(streams.get(), y.get(), post_f.get(), comb_f.get(), n, hc, d, numerics_.bf16_activations,
                            s.stream));                                                            // [n, hc, d]
    if (c.is_v41()) std::swap(carried, pre_f);
    if (options.on_layer) {
      std::vector<float> host;
      SPW_TRY(download(streams.get(), streams.size(), host));
      options.on_layer(l, host);
    }
  }

  // Head: collapse the streams (V4: hc_head weights; V4.1: the last FFN's pre), norm, project.
  const int first = options.all_logits ? 0 : n - 1, n_out = n - first;
  DeviceBuffer<float> head_pre, h, logits;
  if (c.is_v41()) {
    SPW_TRY(head_pre.alloc(size_t(n_out) * hc));
    SPW_CUDA_TRY(cudaMemcpy(head_pre.get(), carried.get() + size_t(first) * hc, sizeof(float) * n_out * hc,
                            cudaMemcpyDeviceToDevice));
  } else {
    // [n_out, hc] mixes on the GPU; the sigmoid weights on the host (hc numbers per token).
    DeviceBuffer<float> mixes;
    SPW_TRY(mixes.alloc(size_t(n_out) * hc));
    SPW_TRY(cuda::hc_mixes(streams.get() + size_t(first) * hc_d, st.w->hc_head.fn, n_out, hc, int64_t(hc_d),
                           c.norm_eps, mixes.get(), s.stream));
    std::vector<float> m, pre(size_t(n_out) * hc);
    SPW_TRY(download(mixes.get(), mixes.size(), m));
    const HcWeights& hh = host_weights_->hc_head;
    for (int i = 0; i < n_out; ++i)
      for (int j = 0; j < hc; ++j)
        pre[size_t(i) * hc + j] = ref::sigmoid(m[size_t(i) * hc + j] * hh.scale[0] + hh.base[j]) + c.hc_eps;
    SPW_TRY(upload(pre, head_pre));
  }
  SPW_TRY(h.alloc(size_t(n_out) * d));
  SPW_TRY(logits.alloc(size_t(n_out) * c.vocab_size));
  SPW_TRY(cuda::hc_collapse(streams.get() + size_t(first) * hc_d, head_pre.get(), n_out, hc, d,
                            numerics_.bf16_activations, h.get(), s.stream));                       // [n_out, d]
  SPW_TRY(cuda::rms_norm(h.get(), st.w->norm, h.get(), n_out, d, c.norm_eps, numerics_.bf16_activations, s.stream));
  SPW_TRY(linear(s, st.w->head, h.get(), n_out, logits.get()));                                  // [n_out, vocab]
  std::vector<float> out;
  SPW_TRY(download(logits.get(), logits.size(), out));

  // Commit the sequence's position and the Engram n-gram history.
  seq.n_past += n;
  if (c.is_v41() && !c.engram_layers.empty()) {
    for (int32_t t : tokens) seq.engram_recent.push_back(host_weights_->engram_token_map[t]);
    const size_t keep = size_t(c.engram_max_ngram - 1);
    if (seq.engram_recent.size() > keep)
      seq.engram_recent.erase(seq.engram_recent.begin(), seq.engram_recent.end() - keep);
  }
  return out;
}

// ---- loading ----

namespace {

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
  if (!numerics.bf16_activations || !numerics.fake_quant)
    return make_error("load_gpu_model: the GPU forward keeps KV in the reference's compact precisions and needs "
                      "bf16 activations and fake quant on (Numerics::reference())");
  if (options.linear_path == LinearPath::kGemv && options.budget.max_step_tokens > 16)
    return make_error("load_gpu_model: the forced GEMV path takes at most 16 tokens per call, the budget allows ",
                      options.budget.max_step_tokens);
  auto config = read_model_config(model_dir);
  if (!config.ok()) return config.error();
  auto weights = load_weights(model_dir, *config, {});
  if (!weights.ok()) return weights.error();

  std::unique_ptr<GpuModel> m(new GpuModel());
  m->config_ = std::move(config.value());
  m->numerics_ = numerics;
  m->options_ = options;
  m->host_weights_ = std::move(weights.value());
  const ModelConfig& c = m->config_;
  m->plan_ = plan_memory(c, options.budget);
  m->state_ = std::make_unique<GpuState>();
  GpuState& st = *m->state_;

  auto w = upload_weights(c, *m->host_weights_, numerics);
  if (!w.ok()) return w.error();
  st.w = std::move(w.value());

  const int S = options.budget.max_seqs;
  const KvPlan& kv = m->plan_.kv;
  SPW_TRY(alloc_pool(st.ring, c.is_v41() ? cuda::kv_format_window_v41(c.d_head)
                                         : cuda::kv_format_window_v4(c.d_head, c.d_rope),
                     kv.ring_pages, c, m->plan_, S));
  SPW_TRY(alloc_pool(st.comp, c.is_v41() ? cuda::kv_format_compressed_v41(c.d_head)
                                         : cuda::kv_format_compressed_v4(c.d_head, c.d_rope),
                     kv.compressed_pages, c, m->plan_, S));
  SPW_TRY(alloc_pool(st.keys, cuda::kv_format_index_key(c.index_head_dim), kv.index_key_pages, c, m->plan_, S));

  st.comp_state.resize(c.n_layers);
  st.idx_comp_state.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerPlan& p = c.layers[l];
    if (p.attn == AttnKind::Csa || p.attn == AttnKind::Hca) {
      const bool csa = p.attn == AttnKind::Csa;
      SPW_TRY(alloc_compressor(st.comp_state[l], {p.compress_ratio, csa ? 2 * c.d_head : c.d_head, csa}, S));
      if (csa) SPW_TRY(alloc_compressor(st.idx_comp_state[l], {p.compress_ratio, 2 * c.index_head_dim, true}, S));
    } else if (p.kv_source && p.compress_ratio > 1) {
      SPW_TRY(alloc_compressor(st.comp_state[l], {p.compress_ratio, c.d_head, false}, S));
    }
  }

  SPW_TRY(upload(ref::rope_frequencies({c.rope_theta, c.d_rope, false}), st.rope_main));
  SPW_TRY(upload(ref::rope_frequencies({c.compress_rope_theta, c.d_rope, true, c.yarn_factor, c.yarn_original_len,
                                        c.yarn_beta_fast, c.yarn_beta_slow}),
                 st.rope_compress));
  if (c.is_v41() && !c.engram_layers.empty()) {
    st.engram_params = ref::engram_hash_params(c.engram_layers, c.engram_vocab_size, c.engram_compressed_vocab_size,
                                               c.engram_max_ngram, c.engram_n_heads);
    for (auto& p : st.engram_params) p.pad_id = m->host_weights_->engram_token_map[c.engram_pad_token_id];
  }
  const int max_in = max_linear_in(c);
  SPW_TRY(linear_workspace_alloc(st.ws, options.budget.max_step_tokens, max_in,
                                 std::max(size_t(64) << 20, size_t(128) * max_in * sizeof(float))));
  const int64_t exl3_width = (std::max<int64_t>(c.d_model, c.d_expert) + 127) / 128 * 128;
  SPW_TRY(exl3_cuda_workspace_alloc(st.exl3_ws, exl3_width, exl3_width));
  st.slot_used.assign(S, false);
  return m;
}

}  // namespace spw::engine
