// The top level of the forward: embedding, the blocks with their hyper-connections, the head.
#include "model/model.h"

#include <cstring>

#include "model/forward_context.h"
#include "model/kv_history.h"
#include "ops/ref/hyper_connection.h"
#include "ops/ref/linalg.h"
#include "ops/ref/rope.h"

namespace spw {

using detail::ForwardContext;

struct Model::Impl {
  std::vector<float> rope_main, rope_compress;
  std::vector<ref::EngramHashParams> engram_params;
};

Model::Model(ModelConfig config, std::unique_ptr<ModelWeights> weights, Numerics numerics, RankRole role)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      numerics_(numerics),
      role_(role),
      impl_(std::make_unique<Impl>()) {
  const ModelConfig& c = config_;
  impl_->rope_main = ref::rope_frequencies({c.rope_theta, c.d_rope, false});
  impl_->rope_compress = ref::rope_frequencies(
      {c.compress_rope_theta, c.d_rope, true, c.yarn_factor, c.yarn_original_len, c.yarn_beta_fast, c.yarn_beta_slow});
  if (c.is_v41() && !c.engram_layers.empty()) {
    impl_->engram_params = ref::engram_hash_params(c.engram_layers, c.engram_vocab_size, c.engram_compressed_vocab_size,
                                                   c.engram_max_ngram, c.engram_n_heads);
    for (auto& p : impl_->engram_params) p.pad_id = weights_->engram_token_map[c.engram_pad_token_id];
  }
}

Model::~Model() = default;

SequenceState Model::new_sequence() const {
  SequenceState s;
  s.layers.resize(config_.n_layers);
  return s;
}

namespace {

// One hyper-connection site: coefficients from the streams of every new token.
std::vector<ref::HcCoefficients> hc_coefficients(const ModelConfig& c, const HcWeights& hw, const float* streams,
                                                 int n) {
  const int hc = c.hc_mult, n_mix = (2 + hc) * hc;
  const size_t hc_d = size_t(hc) * c.d_model;
  std::vector<ref::HcCoefficients> out(n);
  std::vector<float> mixes(n_mix);
  for (int i = 0; i < n; ++i) {
    ref::hc_mixes(streams + i * hc_d, hw.fn.data(), n_mix, hc_d, c.norm_eps, mixes.data());
    out[i] = ref::hc_split_sinkhorn(mixes.data(), hw.scale.data(), hw.base.data(), hc, c.hc_sinkhorn_iters, c.hc_eps);
  }
  return out;
}

// x[n, d] = norm(Σ_j pre_j X_j) with `pre` per token.
void collapse_and_norm(ForwardContext& s, const float* streams, const std::vector<const std::vector<float>*>& pre,
                       const std::vector<float>& norm_w, float* x) {
  const int d = s.c.d_model, hc = s.c.hc_mult;
  for (int i = 0; i < s.n; ++i) ref::hc_collapse(streams + size_t(i) * hc * d, pre[i]->data(), hc, d, x + size_t(i) * d);
  detail::to_activation(s, x, size_t(s.n) * d);
  ref::rms_norm(x, norm_w.data(), x, s.n, d, s.c.norm_eps);
  detail::to_activation(s, x, size_t(s.n) * d);
}

void expand(ForwardContext& s, float* streams, const float* y, const std::vector<ref::HcCoefficients>& co) {
  const int d = s.c.d_model, hc = s.c.hc_mult;
  for (int i = 0; i < s.n; ++i)
    ref::hc_expand(streams + size_t(i) * hc * d, y + size_t(i) * d, co[i].post.data(), co[i].comb.data(), hc, d);
  detail::to_activation(s, streams, size_t(s.n) * hc * d);
}

}  // namespace

Status Model::validate_input(const SequenceState& seq, std::span<const int32_t> tokens,
                             const ImagePositions& images) const {
  if (tokens.empty()) return make_error("forward: no tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= config_.vocab_size)
      return make_error("token id ", t, " is outside the vocabulary (0..", config_.vocab_size - 1, ")");
  if (seq.layers.size() != size_t(config_.n_layers)) return make_error("forward: sequence state belongs to another model");
  if (seq.keep_rollback && int64_t(tokens.size()) > config_.window)
    return make_error("a forward that may be taken back (speculative verification) takes at most ", config_.window,
                      " tokens, the attention window; got ", tokens.size());
  if (!images.empty()) {
    if (!config_.is_v41()) return make_error("image positions: only a V4.1 model takes images");
    if (images.is_image.size() != tokens.size())
      return make_error("image positions: a mask of ", images.is_image.size(), " for ", tokens.size(), " tokens");
    const size_t n_image = images.count();
    if (images.rows.size() != n_image * size_t(config_.d_model))
      return make_error("image positions: ", images.rows.size(), " row values for ", n_image, " image positions of width ",
                        config_.d_model);
    if (seq.keep_rollback) return make_error("a forward that may be taken back holds text only, not image positions");
  }
  return {};
}

// A forward between layers: its context (which refers to the caller's sequence and to the tokens and options
// kept here), the residual streams and V4.1's carried collapse weights.
struct LayerwiseForward::State {
  State(const Model& m, const std::vector<float>& rope_main, const std::vector<float>& rope_compress,
        const std::vector<ref::EngramHashParams>& engram_params, SequenceState& seq, std::span<const int32_t> toks,
        const ForwardOptions& opts, std::span<const uint8_t> image_mask)
      : tokens(toks.begin(), toks.end()),
        is_image(image_mask.begin(), image_mask.end()),
        options(opts),
        s{m.config(), m.weights(), m.numerics(), seq, tokens, seq.n_past, int(tokens.size()), rope_main,
          rope_compress, engram_params, {}, {}, &options, &m.rank_role(), is_image} {}

  std::vector<int32_t> tokens;
  std::vector<uint8_t> is_image;  // empty: every token is text
  ForwardOptions options;
  ForwardContext s;
  std::vector<float> streams;                // [n, hc, d]
  std::vector<ref::HcCoefficients> carried;  // V4.1 single-pass mHC: the previous sublayer's collapse weights
  std::vector<float> x, y;                   // [n, d] sublayer input and output
  std::vector<ref::HcCoefficients> ffn_co;   // the FFN site's coefficients, between its input and its output
  int next = 0;
};

LayerwiseForward::LayerwiseForward(std::unique_ptr<State> state) : state_(std::move(state)) {}
LayerwiseForward::LayerwiseForward(LayerwiseForward&&) noexcept = default;
LayerwiseForward& LayerwiseForward::operator=(LayerwiseForward&&) noexcept = default;
LayerwiseForward::~LayerwiseForward() = default;
int LayerwiseForward::next_layer() const { return state_->next; }

Result<LayerwiseForward> Model::begin_forward(SequenceState& seq, std::span<const int32_t> tokens,
                                              const ForwardOptions& options, const ImagePositions& images) const {
  SPW_TRY(validate_input(seq, tokens, images));
  detail::rollback_begin(seq, tokens);
  auto st = std::make_unique<LayerwiseForward::State>(*this, impl_->rope_main, impl_->rope_compress,
                                                   impl_->engram_params, seq, tokens, options, images.is_image);
  const ModelConfig& c = config_;
  const int n = st->s.n, d = c.d_model, hc = c.hc_mult;
  const size_t hc_d = size_t(hc) * d;

  // [n, hc, d]: hc copies of the embedding.
  st->streams.resize(size_t(n) * hc_d);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < hc; ++j)
      std::memcpy(st->streams.data() + i * hc_d + size_t(j) * d, weights_->embed.data() + size_t(tokens[i]) * d,
                  sizeof(float) * d);
  // Image positions take their rows instead, rounded as the reference's copy into its BF16 stream.
  if (!images.empty()) {
    std::vector<float> row(d);
    size_t k = 0;
    for (int i = 0; i < n; ++i) {
      if (!images.is_image[size_t(i)]) continue;
      std::memcpy(row.data(), images.rows.data() + k++ * d, sizeof(float) * d);
      detail::to_activation(st->s, row.data(), row.size());
      for (int j = 0; j < hc; ++j) std::memcpy(st->streams.data() + i * hc_d + size_t(j) * d, row.data(), sizeof(float) * d);
    }
  }

  // V4.1 single-pass mHC: the collapse weights come from the previous sublayer; one-hot at the start.
  std::vector<float> one_hot(hc, 0.f);
  one_hot[0] = 1.f;
  st->carried.resize(n);
  for (auto& co : st->carried) co.pre = one_hot;
  return LayerwiseForward(std::move(st));
}

Status Model::run_layer(LayerwiseForward& fwd) const {
  LayerwiseForward* one = &fwd;
  return run_layer_batch(std::span<LayerwiseForward* const>(&one, 1));
}

Status Model::run_layer_batch(std::span<LayerwiseForward* const> forwards) const {
  const ModelConfig& c = config_;
  if (forwards.empty()) return {};
  const int l = forwards[0]->state_->next;
  if (l >= c.n_layers) return make_error("run_layer: the forward has run all ", c.n_layers, " layers");
  for (LayerwiseForward* f : forwards)
    if (f->state_->next != l) return make_error("run_layer_batch: forwards at layers ", l, " and ", f->state_->next);
  const LayerWeights& lw = weights_->layers[l];
  if (!lw.loaded()) return make_error("run_layer: layer ", l, "'s weights are not loaded (Model::load_layer)");

  // Up to the FFN input, one forward after another.
  for (LayerwiseForward* fwd : forwards) {
    LayerwiseForward::State& st = *fwd->state_;
    ForwardContext& s = st.s;
    std::vector<float>& streams = st.streams;
    const int n = s.n, d = c.d_model;
    st.x.resize(size_t(n) * d);
    st.y.resize(size_t(n) * d);
    std::vector<const std::vector<float>*> pre(n);

    if (st.options.before_layer) st.options.before_layer(l, streams);
    if (c.layers[l].engram) {
      detail::engram(s, l, streams.data());
      detail::dump(s, "engram.out", l, streams.data(), streams.size());
    }

    // Attention sublayer.
    auto attn_co = hc_coefficients(c, lw.hc_attn, streams.data(), n);
    for (int i = 0; i < n; ++i) pre[i] = c.is_v41() ? &st.carried[i].pre : &attn_co[i].pre;
    collapse_and_norm(s, streams.data(), pre, lw.attn_norm, st.x.data());  // [n, d]
    detail::dump(s, "attn.in", l, st.x.data(), st.x.size());
    SPW_TRY(detail::attention(s, l, st.x.data(), st.y.data()));           // [n, d]
    detail::dump(s, "attn.out", l, st.y.data(), st.y.size());
    expand(s, streams.data(), st.y.data(), attn_co);                        // [n, hc, d]

    // FFN sublayer input.
    st.ffn_co = hc_coefficients(c, lw.hc_ffn, streams.data(), n);
    for (int i = 0; i < n; ++i) pre[i] = c.is_v41() ? &attn_co[i].pre : &st.ffn_co[i].pre;
    collapse_and_norm(s, streams.data(), pre, lw.ffn_norm, st.x.data());
    detail::dump(s, "ffn.in", l, st.x.data(), st.x.size());
  }

  // The MoE of every forward at once: each routed expert runs once on all its tokens.
  std::vector<ForwardContext*> contexts;
  std::vector<const float*> xs;
  std::vector<float*> ys;
  for (LayerwiseForward* fwd : forwards) {
    contexts.push_back(&fwd->state_->s);
    xs.push_back(fwd->state_->x.data());
    ys.push_back(fwd->state_->y.data());
  }
  SPW_TRY(detail::moe_many(contexts, l, xs, ys));

  for (LayerwiseForward* fwd : forwards) {
    LayerwiseForward::State& st = *fwd->state_;
    detail::dump(st.s, "ffn.out", l, st.y.data(), st.y.size());
    expand(st.s, st.streams.data(), st.y.data(), st.ffn_co);
    if (c.is_v41()) st.carried = std::move(st.ffn_co);
    st.ffn_co.clear();
    if (st.options.on_layer) st.options.on_layer(l, st.streams);
    ++st.next;
  }
  return {};
}

Result<std::vector<float>> Model::finish_forward(LayerwiseForward& fwd) const {
  LayerwiseForward::State& st = *fwd.state_;
  const ModelConfig& c = config_;
  const ModelWeights& w = *weights_;
  if (st.next != c.n_layers)
    return make_error("finish_forward: the forward has run ", st.next, " of ", c.n_layers, " layers");
  ForwardContext& s = st.s;
  const int n = s.n, d = c.d_model, hc = c.hc_mult;
  const size_t hc_d = size_t(hc) * d;

  // Head: collapse the streams (V4: hc_head weights; V4.1: the last FFN's pre), norm, project.
  const int first = st.options.all_logits ? 0 : n - 1, n_out = n - first;
  std::vector<float> h(size_t(n_out) * d);
  std::vector<float> head_pre(hc), mixes(hc);
  for (int i = first; i < n; ++i) {
    const float* xs = st.streams.data() + size_t(i) * hc_d;
    if (c.is_v41()) {
      head_pre = st.carried[i].pre;
    } else {
      ref::hc_mixes(xs, w.hc_head.fn.data(), hc, hc_d, c.norm_eps, mixes.data());
      for (int j = 0; j < hc; ++j)
        head_pre[j] = ref::sigmoid(mixes[j] * w.hc_head.scale[0] + w.hc_head.base[j]) + c.hc_eps;
    }
    ref::hc_collapse(xs, head_pre.data(), hc, d, h.data() + size_t(i - first) * d);
  }
  detail::to_activation(s, h.data(), h.size());
  ref::rms_norm(h.data(), w.norm.data(), h.data(), n_out, d, c.norm_eps);
  detail::to_activation(s, h.data(), h.size());
  // [n_out, n_rows]: the whole vocabulary, or this rank's block of it (RankRole::vocab_split).
  const int n_rows = w.head.n_out;
  std::vector<float> logits(size_t(n_out) * n_rows);
  ref::matmul_nt(h.data(), w.head.w.data(), logits.data(), n_out, d, n_rows);
  if (role_.vocab_split) {
    auto all = detail::gather_vocab_blocks(role_, logits, n_out);  // [n_out, vocab]
    if (!all.ok()) return all.error();
    logits = std::move(all.value());
  }

  // Commit the sequence's position and the Engram n-gram history.
  SequenceState& seq = s.seq;
  seq.n_past += n;
  engram_recent_append(c, w.engram_token_map, st.tokens, st.is_image, seq.engram_recent);
  return logits;
}

Result<std::vector<float>> Model::forward(SequenceState& seq, std::span<const int32_t> tokens,
                                          const ForwardOptions& options, const ImagePositions& images) const {
  auto fwd = begin_forward(seq, tokens, options, images);
  if (!fwd.ok()) return fwd.error();
  for (int l = 0; l < config_.n_layers; ++l) SPW_TRY(run_layer(*fwd));
  return finish_forward(*fwd);
}

Status Model::load_layer(int layer, const LoadOptions& options) {
  return load_layer_weights(*weights_, config_, layer, options);
}

void Model::drop_layer(int layer) {
  if (layer >= 0 && size_t(layer) < weights_->layers.size()) weights_->layers[size_t(layer)] = LayerWeights{};
}

Result<std::vector<std::vector<float>>> Model::forward_batch(std::span<SequenceState* const> seqs,
                                                             std::span<const std::span<const int32_t>> tokens,
                                                             const ForwardOptions& options,
                                                             std::span<const ImagePositions> images) const {
  if (seqs.size() != tokens.size())
    return make_error("forward_batch: ", seqs.size(), " sequences but ", tokens.size(), " token lists");
  if (!images.empty() && images.size() != seqs.size())
    return make_error("forward_batch: ", seqs.size(), " sequences but ", images.size(), " image position lists");
  auto images_of = [&](size_t i) { return images.empty() ? ImagePositions{} : images[i]; };
  // Validate everything first so that an error leaves every sequence as it was.
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (auto st = validate_input(*seqs[i], tokens[i], images_of(i)); !st.ok())
      return make_error("sequence ", i, ": ", st.error().message);
  }
  // Layer by layer over all the sequences, so each layer's MoE runs once for every sequence's tokens (each routed
  // expert reads its weights once per step instead of once per sequence); per sequence this is exactly forward().
  std::vector<LayerwiseForward> forwards;
  forwards.reserve(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto fwd = begin_forward(*seqs[i], tokens[i], options, images_of(i));
    if (!fwd.ok()) return make_error("sequence ", i, ": ", fwd.error().message);
    forwards.push_back(std::move(fwd.value()));
  }
  std::vector<LayerwiseForward*> all;
  for (auto& fwd : forwards) all.push_back(&fwd);
  for (int l = 0; l < config_.n_layers; ++l) SPW_TRY(run_layer_batch(all));
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < forwards.size(); ++i) {
    auto r = finish_forward(forwards[i]);
    if (!r.ok()) return make_error("sequence ", i, ": ", r.error().message);
    out.push_back(std::move(r.value()));
  }
  return out;
}

Result<std::unique_ptr<Model>> load_model(const std::string& model_dir, Numerics numerics,
                                          const LoadOptions& options) {
  auto config = read_model_config(model_dir);
  if (!config.ok()) return config.error();
  auto weights = load_weights(model_dir, *config, options);
  if (!weights.ok()) return weights.error();
  if (config->is_v41() && !config->engram_layers.empty()) {
    // The tables must have exactly the rows the hash constants address.
    auto params = ref::engram_hash_params(config->engram_layers, config->engram_vocab_size,
                                          config->engram_compressed_vocab_size, config->engram_max_ngram,
                                          config->engram_n_heads);
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].n_rows != config->engram_num_embeddings[i])
        return make_error(model_dir, "/config.json: engram_num_embeddings[", i, "] = ", config->engram_num_embeddings[i],
                          " but the hash primes for this config address ", params[i].n_rows, " rows");
  }
  return std::make_unique<Model>(std::move(config.value()), std::move(weights.value()), numerics);
}

}  // namespace spw
