// The DeepSeek-V4 / V4.1 text forward on the CPU: the reference engine every fast path is
// tested against (specs/deepseek-v4.md §4, §5). Written imperatively, one op per line with a
// shape comment; state lives in SequenceState so prefill, chunked prefill and decode share code.
#pragma once

#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "model/config.h"
#include "model/routing_counts.h"
#include "model/image_positions.h"
#include "model/kv_history.h"
#include "model/weights.h"
#include "ops/ref/engram_hash.h"

namespace spw {

namespace comm {
class Communicator;
}

// The reference's low-precision steps (bf16 activations, activation quant before FP8/FP4
// products, fp8/fp4 KV and indexer keys) are part of the model's numerics. `reference()`
// reproduces them; `exact()` turns them all off (f32 throughout), which is what Hugging Face
// Transformers computes when run in float32.
struct Numerics {
  bool bf16_activations = true;
  bool fake_quant = true;
  // V4.1 decode quirk (specs §5.2): a ratio-2 index owner that produced no new latent this step
  // reads the index keys published last (layer 20's) instead of its own. The reference does this.
  bool stale_index_k = true;

  static Numerics reference() { return {}; }
  static Numerics exact() { return {false, false, true}; }
};

// Streaming state of one compressor: the rows of the group being filled and, for V4's
// overlapping ratio-4 compressor, the previous complete group.
struct CompressorState {
  std::vector<float> kv, score;            // [ratio, width] f32
  std::vector<float> prev_kv, prev_score;  // [ratio, width] f32 (overlap only)
  bool has_prev = false;
};

struct LayerState {
  std::vector<float> window;       // ring [window, d_head], slot = position mod window
  CompressorState comp, idx_comp;  // main compressor, V4 indexer compressor
  std::vector<float> compressed;   // [n_entries, d_head] stored entries (after RoPE, fake quant)
  std::vector<float> index_keys;   // [n_entries, index_head_dim]
};

// What Model::truncate needs to take back the tail of one forward: the state that forward overwrote
// (window ring rows, compressor groups) and the rows it pushed, so any prefix of its tokens can be
// kept without recomputing them. Costs [n, D] per layer for the ring and [n, 2·width] per compressor.
struct RollbackLog {
  struct Layer {
    std::vector<float> window;                    // [n, D] ring rows the forward's tokens replaced, in order
    CompressorState comp, idx_comp;               // before the forward
    std::vector<float> comp_rows, idx_comp_rows;  // [n, 2, width]: each token's pushed kv and score rows
    size_t compressed_size = 0, index_keys_size = 0;  // before the forward
  };
  HostRollback host;  // valid: describes the sequence's last forward
  std::vector<Layer> layers;
};

struct SequenceState {
  int64_t n_past = 0;
  std::vector<LayerState> layers;
  std::vector<int64_t> engram_recent;  // compressed ids of the last max_ngram−1 tokens, newest last
  int published_index_k_layer = -1;    // V4.1: whose index keys are "shared" (stale_index_k)
  // Set by the caller before a forward that Model::truncate may take back (at most `window` tokens);
  // any other forward drops the log.
  bool keep_rollback = false;
  RollbackLog rollback;
};

struct ForwardOptions {
  bool all_logits = false;  // logits for every new position, else only the last
  // Called with the residual stream [n_tokens, hc, d] after each layer (golden comparisons).
  std::function<void(int layer, const std::vector<float>& streams)> on_layer;
  // Called before each layer with its input streams [n_tokens, hc, d], which it may replace
  // (teacher-forced per-layer comparisons against a reference's own streams).
  std::function<void(int layer, std::vector<float>& streams)> before_layer;
  // Called with named intermediates of every layer, for debugging against reference dumps and the
  // GPU engine (which reports the same names): "engram.out" [n, hc, d] (V4.1 Engram layers),
  // "attn.in" [n, d], "attn.q" [n, H, D], "attn.kv" [n, D], "attn.sel" [n, width] (selected compressed
  // entry ids as floats, −1 padded; order and width are the engine's own), "attn.o" [n, H, D],
  // "attn.out", "ffn.in" [n, d], "moe.experts", "moe.weights" [n, top_k], "moe.routed", "moe.shared",
  // "ffn.out" [n, d].
  std::function<void(const char* name, int layer, const float* data, size_t count)> on_intermediate;
  // GPU engine only, after on_intermediate: may overwrite a float intermediate's values (same count; not
  // the id tables attn.sel / moe.experts, nor moe.weights, whose slot order is the engine's own), and the
  // engine goes on with them: tests feed each step the reference's inputs, so a difference cannot compound.
  std::function<void(const char* name, int layer, std::vector<float>& values)> replace_intermediate;
  // When set, every layer's routing choices are added to it (model/routing_counts.h; CPU model only, the GPU
  // engine keeps its own counts on the device).
  RoutingCounts* routing_counts = nullptr;
};

// One forward pass of one sequence that the caller advances a layer at a time: Model::begin_forward, then
// Model::run_layer once per layer in order, then Model::finish_forward. Model::forward is exactly these calls.
// Callers that hold one layer's weights at a time (the streamed calibration, quantize/calibration.cpp) run many
// sequences' forwards layer by layer. A forward refers to its SequenceState, which must outlive it.
class LayerwiseForward {
 public:
  LayerwiseForward(LayerwiseForward&&) noexcept;
  LayerwiseForward& operator=(LayerwiseForward&&) noexcept;
  ~LayerwiseForward();
  int next_layer() const;

 private:
  friend class Model;
  struct State;
  explicit LayerwiseForward(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// A Model that is one rank of a tensor- and expert-parallel group (model/parallel_model.h builds them from a
// full model and says how the weights are split). Its weights are the rank's shard; its forward adds the ranks'
// partial sublayer outputs through `comm` and gathers the head's vocabulary blocks, so every rank's forward
// returns the full logits. The default (no communicator) is a single device.
struct RankRole {
  comm::Communicator* comm = nullptr;  // the group, used by this rank's thread only
  // The attention weights hold a slice of the heads (and their part of the output projection): the sublayer
  // output is this rank's part of a sum.
  bool heads_split = false;
  // The shared expert holds a slice of its width: its output is a part, added to the routed part before the
  // sum; otherwise it is whole on every rank and added once, after the sum.
  bool shared_split = false;
  // The head holds this rank's contiguous block of vocabulary rows.
  bool vocab_split = false;
  // The routed experts this rank runs (with a communicator its routed output is always a part: these experts,
  // or a slice of every expert's width).
  int expert_begin = 0, expert_end = std::numeric_limits<int>::max();
};

class Model {
 public:
  Model(ModelConfig config, std::unique_ptr<ModelWeights> weights, Numerics numerics, RankRole role = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  const Numerics& numerics() const { return numerics_; }
  const RankRole& rank_role() const { return role_; }
  // The weights the forward uses (callers that also need them, e.g. the calibration's router, share this copy).
  const ModelWeights& weights() const { return *weights_; }
  void set_numerics(const Numerics& n) { numerics_ = n; }

  SequenceState new_sequence() const;

  // Appends `tokens` to `seq` (a prefill chunk of any length, or one decode token) and returns
  // logits [n, vocab] (n = tokens.size() with all_logits, else 1). `images` marks the tokens that are image
  // positions (model/image_positions.h; V4.1 only). Errors: those of validate_input.
  Result<std::vector<float>> forward(SequenceState& seq, std::span<const int32_t> tokens,
                                     const ForwardOptions& options = {}, const ImagePositions& images = {}) const;

  // forward() in three parts (LayerwiseForward). begin_forward validates like forward and embeds; run_layer runs
  // the forward's next layer (error: its weights are not loaded); finish_forward, after the last layer, applies the
  // head, commits the sequence's position and returns what forward would.
  Result<LayerwiseForward> begin_forward(SequenceState& seq, std::span<const int32_t> tokens,
                                         const ForwardOptions& options = {}, const ImagePositions& images = {}) const;
  Status run_layer(LayerwiseForward& fwd) const;
  // run_layer for several forwards at the same layer, their MoE together: each routed expert runs once on the
  // tokens of all of them (and, without values loaded, is dequantized once). Each forward's result is what
  // run_layer gives.
  Status run_layer_batch(std::span<LayerwiseForward* const> forwards) const;
  Result<std::vector<float>> finish_forward(LayerwiseForward& fwd) const;

  // Layer weights for a model loaded with LoadOptions::layer_weights = false (or to free memory): load_layer
  // reads and checks layer `layer` from the checkpoint, drop_layer frees it.
  Status load_layer(int layer, const LoadOptions& options = {});
  void drop_layer(int layer);

  // Takes back the positions [n_past, seq.n_past) of the sequence's last forward, which must have run with
  // SequenceState::keep_rollback (n_past ≥ the position that forward started at). The state is then
  // what forwarding only the kept tokens would have left, their rows as the longer forward computed
  // them (which equals forwarding them alone, except that V4.1's stale-index-key quirk computes a
  // one-token forward as a decode step). The log stays, so a later truncate may go back further,
  // down to that start.
  Status truncate(SequenceState& seq, int64_t n_past) const;

  // Errors for token lists the model cannot take (empty, ids outside the vocabulary, foreign state, more than
  // `window` tokens for a forward that keeps a rollback log) and for image positions it cannot take (a model
  // other than V4.1, a mask or rows of the wrong size, images in a forward that keeps a rollback log).
  Status validate_input(const SequenceState& seq, std::span<const int32_t> tokens,
                        const ImagePositions& images = {}) const;

  // Several independent sequences in one call; results match calling forward on each, bit for bit (the layers run
  // for all sequences in turn and each layer's MoE runs once for all of them: run_layer_batch; the options'
  // callbacks therefore come layer by layer across the sequences). Inputs are validated before any sequence
  // advances, so an invalid input leaves every sequence unchanged.
  // `images`: empty, or one per sequence.
  Result<std::vector<std::vector<float>>> forward_batch(std::span<SequenceState* const> seqs,
                                                        std::span<const std::span<const int32_t>> tokens,
                                                        const ForwardOptions& options = {},
                                                        std::span<const ImagePositions> images = {}) const;

 private:
  struct Impl;
  ModelConfig config_;
  std::unique_ptr<ModelWeights> weights_;
  Numerics numerics_;
  RankRole role_;
  std::unique_ptr<Impl> impl_;
};

// Reads config, loads weights, validates them against each other.
Result<std::unique_ptr<Model>> load_model(const std::string& model_dir, Numerics numerics,
                                          const LoadOptions& options = {});

}  // namespace spw
