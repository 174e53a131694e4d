#include "bench/model_costs.h"

#include <algorithm>
#include <cstdlib>

#include "cuda/attn/kv_pages.h"
#include "engine/memory_plan.h"
#include "model/inventory.h"

namespace spw::bench {
namespace {

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }
bool has(const std::string& s, const char* p) { return s.find(p) != std::string::npos; }

// "layers.L.…" → L, else -1.
int layer_of(const std::string& name) {
  if (!starts_with(name, "layers.")) return -1;
  return std::atoi(name.c_str() + 7);
}

// "….ffn.experts.E.…" → E, else -1.
int expert_of(const std::string& name) {
  const size_t at = name.find(".ffn.experts.");
  return at == std::string::npos ? -1 : std::atoi(name.c_str() + at + 13);
}

std::string strip_prefix(const std::string& name) { return starts_with(name, "model.") ? name.substr(6) : name; }

// Logical weights of a linear's stored weight tensor (0 for anything that is not a matmul operand).
int64_t linear_params(const std::string& name, const TensorInfo& t) {
  if (t.shape.size() == 3 && has(name, ".trellis")) return t.shape[0] * 16 * t.shape[1] * 16;  // EXL3 [k/16, n/16, 16K]
  if (t.shape.size() != 2) return 0;
  if (has(name, ".scale") || has(name, ".ape") || has(name, "tid2eid") || has(name, ".engram.embed.") ||
      has(name, "_base"))
    return 0;
  const int64_t n = t.shape[0] * t.shape[1];
  return t.dtype == DType::I8 ? 2 * n : n;  // MXFP4: two weights per byte
}

// Number of positions 0..pos attended through compressed entries or index keys at ratio r.
double entries_at(double pos, int ratio) { return ratio > 0 ? (pos + 1) / ratio : 0; }

}  // namespace

int64_t DecodeBytes::layer_total() const {
  int64_t s = 0;
  for (const LayerBytes& l : layers) s += l.dense + l.routed;
  return s;
}

int64_t DecodeBytes::engram_host_total() const {
  int64_t s = 0;
  for (const LayerBytes& l : layers) s += l.engram_host;
  return s;
}

DecodeBytes decode_bytes(const Checkpoint& ckpt, const ModelConfig& c) {
  DecodeBytes out;
  out.layers.resize(c.n_layers);
  std::vector<int64_t> expert_nbytes(c.n_layers, 0);
  std::vector<std::vector<bool>> expert_seen(c.n_layers, std::vector<bool>(c.n_experts, false));
  for (const auto& [raw_name, t] : ckpt.tensors()) {
    const std::string name = strip_prefix(raw_name);
    const std::string role = tensor_role(name);
    if (role == "draft (MTP/DSpark)" || role == "vision" || role == "engram token map") continue;
    const int64_t nb = int64_t(t->nbytes);
    if (role == "embedding") {
      out.embed_row = t->shape.empty() || t->shape[0] == 0 ? 0 : nb / t->shape[0];
      continue;
    }
    if (role == "head") {
      out.head = nb;
      continue;
    }
    const int l = layer_of(name);
    if (l < 0) {
      out.final_other += nb;  // final norm, V4 head mHC
      continue;
    }
    if (l >= c.n_layers) continue;
    LayerBytes& lb = out.layers[l];
    if (role == "engram tables") {
      // (max_ngram − 1) · n_heads rows per token of each table (and of its scale tensor).
      const int64_t rows_per_token = int64_t(c.engram_max_ngram - 1) * c.engram_n_heads;
      if (!t->shape.empty() && t->shape[0] > 0) lb.engram_host += rows_per_token * (nb / t->shape[0]);
      continue;
    }
    if (const int e = expert_of(name); e >= 0) {
      expert_nbytes[l] += nb;
      if (e < c.n_experts) expert_seen[l][e] = true;
      continue;
    }
    if (has(name, "tid2eid")) {
      const int64_t row = t->shape.empty() || t->shape[0] == 0 ? 0 : nb / t->shape[0];  // one token's routes
      lb.dense += row;
      out.dense_by_role[role] += row;
      continue;
    }
    lb.dense += nb;
    if (role == "shared experts") lb.shared += nb;
    out.dense_by_role[role] += nb;
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const int64_t n_found = std::count(expert_seen[l].begin(), expert_seen[l].end(), true);
    LayerBytes& lb = out.layers[l];
    lb.expert = n_found ? expert_nbytes[l] / n_found : 0;
    lb.routed = int64_t(c.top_k) * lb.expert;
  }
  return out;
}

std::vector<int64_t> kv_read_nbytes(const ModelConfig& c, int64_t n_ctx) {
  const engine::KvFormats f = engine::kv_formats(c, /*quantized_kv=*/true);  // the bench runs reference numerics
  const int64_t window_row = int64_t(cuda::kv_row_nbytes(f.ring));
  const int64_t entry_row = int64_t(cuda::kv_row_nbytes(f.compressed));
  const int64_t key_row = int64_t(cuda::kv_row_nbytes(f.index_key));
  std::vector<int64_t> out(c.n_layers, 0);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerPlan& p = c.layers[l];
    const int64_t entries = p.compress_ratio > 0 ? n_ctx / p.compress_ratio : 0;
    int64_t b = std::min<int64_t>(n_ctx, c.window) * window_row;
    switch (p.attn) {
      case AttnKind::Window: break;
      case AttnKind::Hca: b += entries * entry_row; break;  // every visible entry
      case AttnKind::Csa:
      case AttnKind::Source: b += entries * key_row + std::min<int64_t>(entries, c.index_topk) * entry_row; break;
      case AttnKind::Reindex:
        b += std::min<int64_t>(entries, int64_t(c.candidate_topk_blocks) * c.candidate_block_size) * key_row +
             std::min<int64_t>(entries, c.index_topk) * entry_row;
        break;
      case AttnKind::Reuse: b += std::min<int64_t>(entries, c.index_topk) * entry_row; break;
    }
    out[l] = b;
  }
  return out;
}

PrefillFlops prefill_flops(const Checkpoint& ckpt, const ModelConfig& c, int64_t prompt_len) {
  PrefillFlops f;
  std::vector<int64_t> expert_params(c.n_layers, 0);
  std::vector<std::vector<bool>> expert_seen(c.n_layers, std::vector<bool>(c.n_experts, false));
  for (const auto& [raw_name, t] : ckpt.tensors()) {
    const std::string name = strip_prefix(raw_name);
    const std::string role = tensor_role(name);
    if (role == "draft (MTP/DSpark)" || role == "vision" || role == "embedding" || role == "head") continue;
    const int l = layer_of(name);
    if (l < 0 || l >= c.n_layers) continue;
    const int64_t params = linear_params(name, *t);
    if (const int e = expert_of(name); e >= 0) {
      expert_params[l] += params;
      if (e < c.n_experts) expert_seen[l][e] = true;
      continue;
    }
    f.linear += 2.0 * double(params);
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const int64_t n_found = std::count(expert_seen[l].begin(), expert_seen[l].end(), true);
    if (n_found) f.routed += 2.0 * c.top_k * double(expert_params[l]) / double(n_found);
  }
  // Attention and indexer, averaged over positions: the sums are linear in pos except for the
  // min()s, so sum them per position (prompts are at most a few 10^5 positions).
  const double qk_pv = 2.0 * 2.0 * c.n_heads * c.d_head;  // per attended key: QK and PV
  const double score = 2.0 * c.index_n_heads * c.index_head_dim;
  const double cand = double(c.candidate_topk_blocks) * c.candidate_block_size;
  double attn = 0, idx = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerPlan& p = c.layers[l];
    for (int64_t pos = 0; pos < prompt_len; ++pos) {
      const double entries = entries_at(double(pos), p.compress_ratio);
      double keys = std::min<double>(double(pos + 1), c.window);
      switch (p.attn) {
        case AttnKind::Window: break;
        case AttnKind::Hca: keys += entries; break;
        case AttnKind::Csa:
        case AttnKind::Source:
          keys += std::min<double>(entries, c.index_topk);
          idx += score * entries;
          break;
        case AttnKind::Reindex:
          keys += std::min<double>(entries, c.index_topk);
          idx += score * std::min(entries, cand);
          break;
        case AttnKind::Reuse: keys += std::min<double>(entries, c.index_topk); break;
      }
      attn += qk_pv * keys;
    }
  }
  if (prompt_len > 0) {
    f.attention = attn / double(prompt_len);
    f.indexer = idx / double(prompt_len);
  }
  return f;
}

}  // namespace spw::bench
