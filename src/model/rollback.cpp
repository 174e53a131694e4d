// Taking back the tail of a forward (Model::truncate, RollbackLog in model/model.h): what speculative
// decoding needs after its drafted tokens were verified and only some of them accepted.
//
// A forward of n tokens starting at position p changes a sequence's state in four places; the log
// keeps what undoing each needs, and truncate(m) keeps tokens [p, m):
// - the window ring: positions p..p+n−1 replaced the rows of p−W..p+n−1−W (n ≤ W, so no slot is
//   written twice); the replaced rows of positions ≥ m are put back;
// - the compressors: the state before the forward is restored and the rows of positions p..m−1 are
//   pushed again (compressor_push is a pure function of the rows, so this is exact);
// - compressed entries and index keys: one per group completed, so a layer that grew keeps
//   (m / r − p / r) of its new entries;
// - the Engram history and V4.1's published index-key layer, recomputed from the kept tokens.
#include <algorithm>
#include <cstring>

#include "model/compressor.h"
#include "model/forward_context.h"
#include "model/model.h"

namespace spw {
namespace detail {

void rollback_begin(SequenceState& seq, std::span<const int32_t> tokens) {
  RollbackLog& log = seq.rollback;
  if (!seq.keep_rollback) {
    if (log.host.valid) log = RollbackLog{};
    return;
  }
  log.host.begin(seq.n_past, tokens, seq.engram_recent, seq.published_index_k_layer);
  log.layers.resize(seq.layers.size());
  for (size_t l = 0; l < seq.layers.size(); ++l) {
    const LayerState& ls = seq.layers[l];
    RollbackLog::Layer& ll = log.layers[l];
    ll.window.clear();
    ll.comp = ls.comp;
    ll.idx_comp = ls.idx_comp;
    ll.comp_rows.clear();
    ll.idx_comp_rows.clear();
    ll.compressed_size = ls.compressed.size();
    ll.index_keys_size = ls.index_keys.size();
  }
}

void rollback_window(ForwardContext& s, int layer) {
  if (!s.seq.keep_rollback) return;
  const int W = s.c.window, D = s.c.d_head;
  const std::vector<float>& ring = s.seq.layers[layer].window;
  std::vector<float>& saved = s.seq.rollback.layers[layer].window;
  saved.resize(size_t(s.n) * D);
  for (int i = 0; i < s.n; ++i)
    std::memcpy(saved.data() + size_t(i) * D, ring.data() + size_t((s.p + i) % W) * D, sizeof(float) * D);
}

bool compressor_push_logged(ForwardContext& s, int layer, CompressorState& state, int ratio, int width, bool overlap,
                            int64_t pos, const float* kv, const float* score, std::vector<float>& entry) {
  if (s.seq.keep_rollback) {
    RollbackLog::Layer& ll = s.seq.rollback.layers[layer];
    std::vector<float>& rows = &state == &s.seq.layers[layer].comp ? ll.comp_rows : ll.idx_comp_rows;
    rows.insert(rows.end(), kv, kv + width);
    rows.insert(rows.end(), score, score + width);
  }
  return compressor_push(state, ratio, width, overlap, pos, kv, score, entry);
}

namespace {

// The compressor as it was after position m − 1: the state before the forward (which started at p),
// then the rows of positions p..m−1 pushed again. rows: [n, 2, width] for the forward's n tokens.
void replay_compressor(CompressorState& state, const CompressorState& before, const std::vector<float>& rows, size_t n,
                       int ratio, bool overlap, int64_t p, int64_t m) {
  state = before;
  if (rows.empty()) return;
  const size_t width = rows.size() / (2 * n);
  std::vector<float> entry;
  for (int64_t pos = p; pos < m; ++pos) {
    const float* kv = rows.data() + size_t(pos - p) * 2 * width;
    compressor_push(state, ratio, int(width), overlap, pos, kv, kv + width, entry);
  }
}

// A store of one entry per completed group that grew in the forward keeps the entries of groups completed
// before m.
void keep_entries(std::vector<float>& store, size_t size_before, size_t entry_width, int ratio, int64_t p, int64_t m) {
  if (store.size() > size_before) store.resize(size_before + size_t(m / ratio - p / ratio) * entry_width);
}

}  // namespace
}  // namespace detail

Status Model::truncate(SequenceState& seq, int64_t n_past) const {
  const RollbackLog& log = seq.rollback;
  SPW_TRY(log.host.check(n_past, seq.n_past));
  const ModelConfig& c = config_;
  const int64_t p = log.host.n_before, m = n_past;
  const size_t n = log.host.tokens.size();
  const int W = c.window, D = c.d_head;
  for (int l = 0; l < c.n_layers; ++l) {
    LayerState& ls = seq.layers[size_t(l)];
    const RollbackLog::Layer& ll = log.layers[size_t(l)];
    for (size_t i = size_t(m - p); i < n && !ll.window.empty(); ++i)
      std::memcpy(ls.window.data() + size_t((p + int64_t(i)) % W) * D, ll.window.data() + i * D, sizeof(float) * D);
    const LayerPlan& plan = c.layers[size_t(l)];
    const int r = plan.compress_ratio;
    if (r == 0) continue;
    const bool v4_overlap = !c.is_v41() && plan.attn == AttnKind::Csa;
    detail::replay_compressor(ls.comp, ll.comp, ll.comp_rows, n, r, v4_overlap, p, m);
    detail::replay_compressor(ls.idx_comp, ll.idx_comp, ll.idx_comp_rows, n, r, /*overlap=*/true, p, m);
    detail::keep_entries(ls.compressed, ll.compressed_size, size_t(D), r, p, m);
    detail::keep_entries(ls.index_keys, ll.index_keys_size, size_t(c.index_head_dim), r, p, m);
  }
  log.host.restore(c, weights_->engram_token_map, numerics_.stale_index_k, m, seq.engram_recent,
                   seq.published_index_k_layer);
  seq.n_past = m;
  return {};
}

}  // namespace spw
