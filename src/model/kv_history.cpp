#include "model/kv_history.h"

#include "ops/ref/engram_hash.h"

namespace spw {

void engram_recent_append(const ModelConfig& c, std::span<const int32_t> token_map, std::span<const int32_t> tokens,
                          std::span<const uint8_t> is_image, std::vector<int64_t>& recent) {
  if (!c.is_v41() || c.engram_layers.empty()) return;
  for (size_t i = 0; i < tokens.size(); ++i)
    recent.push_back(!is_image.empty() && is_image[i] ? ref::kEngramDead : token_map[size_t(tokens[i])]);
  const size_t keep = size_t(c.engram_max_ngram - 1);
  if (recent.size() > keep) recent.erase(recent.begin(), recent.end() - std::ptrdiff_t(keep));
}

int published_index_layer_after(const ModelConfig& c, bool stale_index_k, int published, int64_t p, int64_t m) {
  if (!c.is_v41()) return published;
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerPlan& plan = c.layers[size_t(l)];
    const int r = plan.compress_ratio;
    if (plan.kv_source && plan.index_source && r > 0 && (m / r > p / r || !stale_index_k)) published = l;
  }
  return published;
}

void HostRollback::begin(int64_t n_past, std::span<const int32_t> forward_tokens, const std::vector<int64_t>& recent,
                         int published) {
  valid = true;
  n_before = n_past;
  tokens.assign(forward_tokens.begin(), forward_tokens.end());
  engram_recent = recent;
  published_index_k_layer = published;
}

Status HostRollback::check(int64_t n_past, int64_t n_end) const {
  if (!valid) return make_error("truncate: the sequence's last forward kept no rollback log (set keep_rollback before it)");
  if (n_past < n_before || n_past > n_end)
    return make_error("truncate: position ", n_past, " is outside the last forward's span [", n_before, ", ", n_end, "]");
  return {};
}

void HostRollback::restore(const ModelConfig& c, std::span<const int32_t> token_map, bool stale_index_k, int64_t n_past,
                           std::vector<int64_t>& recent, int& published) const {
  published = published_index_layer_after(c, stale_index_k, published_index_k_layer, n_before, n_past);
  recent = engram_recent;
  engram_recent_append(c, token_map, std::span<const int32_t>(tokens).first(size_t(n_past - n_before)), {}, recent);
}

}  // namespace spw
