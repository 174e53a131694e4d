#include "model/inventory.h"

#include <set>

namespace spw {
namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Layer index of "layers.N.…", else −1.
int layer_of(const std::string& name) {
  if (!starts_with(name, "layers.")) return -1;
  return std::atoi(name.c_str() + 7);
}

// Expert index of "….ffn.experts.E.…", else −1.
int expert_of(const std::string& name) {
  auto at = name.find(".ffn.experts.");
  if (at == std::string::npos) return -1;
  return std::atoi(name.c_str() + at + 13);
}

int64_t logical_params(const TensorInfo& t) {
  if (t.dtype == DType::F8_E8M0) return 0;  // scales are not parameters
  return t.dtype == DType::I8 ? 2 * t.numel() : t.numel();
}

void add(InventoryGroup& g, const TensorInfo& t) {
  g.n_tensors += 1;
  g.n_params += logical_params(t);
  g.nbytes += int64_t(t.nbytes);
  g.nbytes_by_dtype[std::string(dtype_name(t.dtype))] += int64_t(t.nbytes);
}

}  // namespace

std::string tensor_role(const std::string& name) {
  if (starts_with(name, "mtp.")) return "draft (MTP/DSpark)";
  if (starts_with(name, "vision.") || starts_with(name, "aligner.") || starts_with(name, "image_")) return "vision";
  if (name == "embed.weight") return "embedding";
  if (name == "head.weight") return "head";
  if (name == "engram_token_map") return "engram token map";  // host-side hashing input, not a device weight
  if (has(name, ".engram.embed.")) return "engram tables";
  if (has(name, ".engram.")) return "engram projections";
  if (has(name, ".ffn.experts.")) return "routed experts";
  if (has(name, ".ffn.shared_experts.")) return "shared experts";
  if (has(name, ".ffn.gate.")) return "router";
  if (has(name, ".attn.compressor.") || has(name, ".attn.indexer.")) return "compressor and indexer";
  if (has(name, ".attn.")) return "attention";
  if (has(name, "hc_")) return "hyper-connections";
  return "norms and other";
}

Inventory take_inventory(const Checkpoint& ckpt, const ModelConfig& config) {
  Inventory inv;
  std::vector<std::set<int>> experts(config.n_layers);
  inv.expert_nbytes_by_layer.assign(config.n_layers, std::vector<int64_t>(std::max(0, config.n_experts), 0));
  std::set<int> layers_seen;
  int64_t dense_per_token = 0, expert_total = 0, shared_total = 0, embed_row = 0, engram_rows = 0;
  for (const auto& [raw_name, t] : ckpt.tensors()) {
    const std::string name = starts_with(raw_name, "model.") ? raw_name.substr(6) : raw_name;
    const std::string role = tensor_role(name);
    add(inv.groups[role], *t);
    add(inv.total, *t);
    const int layer = layer_of(name);
    if (layer >= 0 && layer < config.n_layers) layers_seen.insert(layer);
    const int expert = expert_of(name);
    if (layer >= 0 && layer < config.n_layers && expert >= 0) {
      experts[layer].insert(expert);
      expert_total += int64_t(t->nbytes);
      if (expert < config.n_experts) inv.expert_nbytes_by_layer[layer][expert] += int64_t(t->nbytes);
      if (layer == 0 && expert == 0) inv.expert_nbytes += int64_t(t->nbytes);
      continue;
    }
    if (role == "draft (MTP/DSpark)" || role == "vision" || role == "engram token map") continue;
    if (role == "engram tables") inv.engram_table_nbytes += int64_t(t->nbytes);
    else inv.dense_nbytes += int64_t(t->nbytes);
    if (role == "embedding") {
      embed_row = int64_t(t->nbytes) / std::max<int64_t>(1, t->shape.empty() ? 1 : t->shape[0]);
    } else if (role == "engram tables") {
      // 24 rows of each table per token (n-gram sizes × heads), not the table.
      if (!t->shape.empty() && t->shape[0] > 0) engram_rows += int64_t(t->nbytes) / t->shape[0];
    } else if (role == "shared experts") {
      shared_total += int64_t(t->nbytes);
    } else {
      dense_per_token += int64_t(t->nbytes);
    }
  }
  inv.n_layers_found = int(layers_seen.size());
  for (auto& e : experts) inv.experts_per_layer.push_back(int(e.size()));
  const int64_t rows_per_token = int64_t(std::max(0, config.engram_max_ngram - 1)) * config.engram_n_heads;
  // Per token: every dense weight, the shared experts, top_k routed experts per layer (their
  // average size), one embedding row and the Engram rows.
  const int64_t n_expert_instances = int64_t(config.n_layers) * config.n_experts;
  const int64_t avg_expert = n_expert_instances ? expert_total / n_expert_instances : 0;
  inv.dense_decode_nbytes_per_token = dense_per_token + shared_total + embed_row;
  inv.engram_decode_nbytes_per_token = engram_rows * rows_per_token;
  inv.decode_nbytes_per_token = inv.dense_decode_nbytes_per_token + int64_t(config.n_layers) * config.top_k * avg_expert +
                                inv.engram_decode_nbytes_per_token;
  return inv;
}

}  // namespace spw
