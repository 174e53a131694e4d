// Internal to the model layer: the context of one forward pass of one sequence, and the
// sublayers the block is made of. Not part of the model's public API.
#pragma once

#include <span>
#include <vector>

#include "model/model.h"

namespace spw::detail {

struct ForwardContext {
  const ModelConfig& c;
  const ModelWeights& w;
  const Numerics& num;
  SequenceState& seq;
  std::span<const int32_t> tokens;
  int64_t p = 0;  // position of tokens[0]
  int n = 0;      // number of new tokens
  const std::vector<float>& rope_main;      // θ 10000, no YaRN (window-only layers)
  const std::vector<float>& rope_compress;  // compress_rope_theta + YaRN (compressed layers)
  const std::vector<ref::EngramHashParams>& engram_params;
  // V4.1 publications of this forward: the latest index source's selection per token (entry ids,
  // sorted ascending) and the candidate source's per-token entry mask.
  std::vector<std::vector<int32_t>> topk;
  std::vector<std::vector<char>> candidates;
  const ForwardOptions* options = nullptr;
  const RankRole* role = nullptr;  // the model's place in a parallel group (never null)
  std::span<const uint8_t> is_image;  // per token, nonzero at image positions (ImagePositions); empty: all text
};

// Whether token i of the forward is an image position.
inline bool is_image_position(const ForwardContext& s, int i) { return !s.is_image.empty() && s.is_image[size_t(i)]; }

// Reports a named intermediate to ForwardOptions::on_intermediate, if set.
inline void dump(const ForwardContext& s, const char* name, int layer, const float* data, size_t count) {
  if (s.options && s.options->on_intermediate) s.options->on_intermediate(name, layer, data, count);
}

// y[n_tokens, l.n_out] = x·Wᵀ with the reference's precision for the weight's format: FP8/FP4
// weights see a quantized activation (block act_block); BF16 products are rounded to bf16
// unless round_out is false; F32 products stay f32.
void linear(const ForwardContext& s, const Linear& l, const float* x, int n_tokens, float* y, bool round_out = true);

// Rounds to bf16 when the numerics keep bf16 activations.
void to_activation(const ForwardContext& s, float* x, size_t n);

// out[n, d] = attention sublayer of layer `layer` on normed input x[n, d]. Errors: the parallel group's
// all-reduce (RankRole::heads_split).
Status attention(ForwardContext& s, int layer, const float* x, float* out);

// out[i][n_i, d] = MoE sublayer (router → experts → combine, plus the shared expert) of each context's input
// x[i] [n_i, d], every expert run once on the tokens of all contexts routed to it. Each context's output equals
// what it alone would give, bit for bit (everything is per token, and each token adds its experts in index order).
// Routed experts without values (LoadOptions::routed_expert_values = false) are dequantized from the checkpoint as
// they are used. Errors: a routed expert that cannot be read.
Status moe_many(std::span<ForwardContext* const> contexts, int layer, std::span<const float* const> x,
                std::span<float* const> out);

// The rollback log (RollbackLog): rollback_begin starts or drops it for a forward of `tokens` (that
// Model::validate_input accepted);
// rollback_window records the ring rows of `layer` the forward is about to replace; compressor_push_logged
// is compressor_push that also records the pushed rows when the log is on.
void rollback_begin(SequenceState& seq, std::span<const int32_t> tokens);
void rollback_window(ForwardContext& s, int layer);
bool compressor_push_logged(ForwardContext& s, int layer, CompressorState& state, int ratio, int width, bool overlap,
                            int64_t pos, const float* kv, const float* score, std::vector<float>& entry);

// Tensor and expert parallelism (RankRole, model/parallel_model.h). all_reduce_ranks sums this rank's partial
// x[count] with the other ranks' in place (the same bits on every rank). gather_vocab_blocks turns every rank's
// logits for its vocabulary block, local [n_rows, vocab / size], into the full [n_rows, vocab].
Status all_reduce_ranks(const RankRole& role, float* x, size_t count);
Result<std::vector<float>> gather_vocab_blocks(const RankRole& role, const std::vector<float>& local, int n_rows);

// V4.1 Engram: gates table rows into the residual streams X[n, hc, d] in place.
void engram(ForwardContext& s, int layer, float* streams);

}  // namespace spw::detail
