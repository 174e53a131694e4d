// The small host-side parts of a sequence's state that both runners keep beside their KV (the CPU
// reference's SequenceState, the GPU's GpuSequence), advanced the same way by a forward and by taking
// positions back (Model::truncate, GpuModel::truncate).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "model/config.h"

namespace spw {

// V4.1 Engram: `recent` (the compressed ids of the last max_ngram − 1 tokens, newest last; DEAD for image
// positions) after `tokens`; unchanged for models without Engram layers. token_map: token id → compressed id.
// is_image: empty (all text) or one per token, nonzero at image positions.
void engram_recent_append(const ModelConfig& c, std::span<const int32_t> token_map, std::span<const int32_t> tokens,
                          std::span<const uint8_t> is_image, std::vector<int64_t>& recent);

// V4.1: the layer whose index keys are published after a forward of positions [p, m) that started with
// `published` (the latest KV source that produced a latent, or every KV source without the stale-key quirk).
int published_index_layer_after(const ModelConfig& c, bool stale_index_k, int published, int64_t p, int64_t m);

// The host part of a rollback log: where a forward kept for rollback started, its tokens, and the
// Engram history and published index layer before it. The runners keep their KV part beside it.
struct HostRollback {
  bool valid = false;
  int64_t n_before = 0;
  std::vector<int32_t> tokens;
  std::vector<int64_t> engram_recent;
  int published_index_k_layer = -1;

  void begin(int64_t n_past, std::span<const int32_t> forward_tokens, const std::vector<int64_t>& recent,
             int published);
  // Whether truncating a sequence now at n_end positions to n_past is within the logged forward.
  Status check(int64_t n_past, int64_t n_end) const;
  // The Engram history and published index layer after keeping positions [n_before, n_past).
  void restore(const ModelConfig& c, std::span<const int32_t> token_map, bool stale_index_k, int64_t n_past,
               std::vector<int64_t>& recent, int& published) const;
};

}  // namespace spw
