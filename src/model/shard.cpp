#include "model/shard.h"

#include <string>

namespace spw {
namespace {

// Rows [row0, row0 + n_rows) and columns [col0, col0 + n_cols) of l. The slice keeps l's kind (the forward's
// numerics depend on it) and stem (the checkpoint tensor it comes from).
Linear slice(const Linear& l, int row0, int n_rows, int col0, int n_cols) {
  Linear out;
  out.n_out = n_rows;
  out.n_in = n_cols;
  out.kind = l.kind;
  out.stem = l.stem;
  out.w.resize(size_t(n_rows) * n_cols);
  for (int r = 0; r < n_rows; ++r) {
    const float* src = l.w.data() + size_t(row0 + r) * l.n_in + col0;
    std::copy(src, src + n_cols, out.w.data() + size_t(r) * n_cols);
  }
  return out;
}

Linear rows(const Linear& l, int row0, int n_rows) { return slice(l, row0, n_rows, 0, l.n_in); }
Linear cols(const Linear& l, int col0, int n_cols) { return slice(l, 0, l.n_out, col0, n_cols); }

// Hidden channels [f0, f0 + n_f) of an expert: gate and up rows, down columns. The SwiGLU is per channel, so the
// slice's output is its channels' part of the expert's output.
Expert width_slice(const Expert& e, int f0, int n_f) {
  return Expert{rows(e.w1, f0, n_f), cols(e.w2, f0, n_f), rows(e.w3, f0, n_f)};
}

Result<LayerWeights> shard_layer(const LayerWeights& full, const ModelConfig& c, const ParallelPlan& plan, int rank,
                                 int layer) {
  if (!full.loaded()) return make_error("sharding: layer ", layer, "'s weights are not loaded");
  for (size_t e = 0; e < full.experts.size(); ++e)
    if (full.experts[e].w1.empty())
      return make_error("sharding: layer ", layer, " expert ", e,
                        " has no values (a model loaded with routed_expert_values = false cannot be sharded)");
  // Everything replicated is a copy (routed experts included, for a moment: one layer at a time).
  LayerWeights lw = full;
  const int tp = plan.tp;
  if (tp > 1) {
    // Heads [h0, h0 + n_h): their wq_b rows and sinks.
    const int D = c.d_head, R = c.o_lora_rank, G = c.o_groups, n_h = c.n_heads / tp, h0 = rank * n_h;
    lw.wq_b = rows(full.wq_b, h0 * D, n_h * D);
    lw.attn_sink.assign(full.attn_sink.begin() + h0, full.attn_sink.begin() + h0 + n_h);
    if (tp <= G) {
      // Whole groups [g0, g0 + n_g): their wo_a blocks, and wo_b's columns of their ranks.
      const int n_g = G / tp, g0 = rank * n_g;
      lw.wo_a = rows(full.wo_a, g0 * R, n_g * R);
      lw.wo_b = cols(full.wo_b, g0 * R, n_g * R);
    } else {
      // Part j of group g: wo_a[g]'s input columns of these heads, and wo_b's columns of group g.
      const int ranks_per_group = tp / G, g = rank / ranks_per_group, j = rank % ranks_per_group;
      lw.wo_a = slice(full.wo_a, g * R, R, j * n_h * D, n_h * D);
      lw.wo_b = cols(full.wo_b, g * R, R);
    }
    const int n_f = c.d_expert / tp;
    lw.shared = width_slice(full.shared, rank * n_f, n_f);
    if (plan.ep == 1)
      for (size_t e = 0; e < lw.experts.size(); ++e) lw.experts[e] = width_slice(full.experts[e], rank * n_f, n_f);
  }
  if (plan.ep > 1) {
    const RankRole role = shard_role(c, plan, rank, nullptr);
    for (int e = 0; e < int(lw.experts.size()); ++e)
      if (e < role.expert_begin || e >= role.expert_end) lw.experts[size_t(e)] = Expert{};
  }
  return lw;
}

}  // namespace

Status check_parallel_plan(const ModelConfig& c, const ParallelPlan& plan) {
  const int tp = plan.tp, ep = plan.ep;
  const std::string what = "parallel plan tp=" + std::to_string(tp) + " ep=" + std::to_string(ep);
  if (tp < 1 || ep < 1) return make_error(what, ": tp and ep must be at least 1");
  const int n = plan.n_ranks();
  if ((tp != 1 && tp != n) || (ep != 1 && ep != n))
    return make_error(what, ": tp and ep must each be 1 or the group size ", n, " (both split the same ranks)");
  if (c.n_heads % tp != 0) return make_error(what, ": tp must divide num_attention_heads = ", c.n_heads);
  if (c.o_groups % tp != 0 && tp % c.o_groups != 0)
    return make_error(what, ": tp must divide o_groups = ", c.o_groups,
                      " or be a multiple of it (a rank holds whole output groups or part of one)");
  if (c.vocab_size % tp != 0) return make_error(what, ": tp must divide vocab_size = ", c.vocab_size);
  if (c.d_expert % tp != 0)
    return make_error(what, ": tp must divide the expert width moe_intermediate_size = ", c.d_expert);
  const int n_f = c.d_expert / tp;
  if (tp > 1 && n_f > c.act_block && n_f % c.act_block != 0)
    return make_error(what, ": tp cuts moe_intermediate_size = ", c.d_expert, " into slices of ", n_f,
                      " channels, which straddle the activation quant blocks of ", c.act_block,
                      " before the down projections (a slice must be a multiple of a block or narrower than one)");
  if (c.n_experts % ep != 0) return make_error(what, ": ep must divide n_routed_experts = ", c.n_experts);
  return {};
}

ModelConfig shard_config(const ModelConfig& c, const ParallelPlan& plan) {
  ModelConfig out = c;
  out.n_heads = c.n_heads / plan.tp;
  out.o_groups = plan.tp <= c.o_groups ? c.o_groups / plan.tp : 1;
  return out;
}

RankRole shard_role(const ModelConfig& c, const ParallelPlan& plan, int rank, comm::Communicator* comm) {
  RankRole role;
  role.comm = comm;
  role.heads_split = role.shared_split = role.vocab_split = plan.tp > 1;
  const int n_e = c.n_experts / plan.ep;
  role.expert_begin = plan.ep > 1 ? rank * n_e : 0;
  role.expert_end = plan.ep > 1 ? (rank + 1) * n_e : c.n_experts;
  return role;
}

Result<std::unique_ptr<ModelWeights>> shard_weights(const ModelWeights& full, const ModelConfig& c,
                                                    const ParallelPlan& plan, int rank) {
  auto w = std::make_unique<ModelWeights>();
  w->embed = full.embed;
  const int n_vocab = int(c.vocab_size / plan.tp);
  w->head = plan.tp > 1 ? rows(full.head, rank * n_vocab, n_vocab) : full.head;
  w->norm = full.norm;
  w->hc_head = full.hc_head;
  w->engram_token_map = full.engram_token_map;
  for (size_t l = 0; l < full.layers.size(); ++l) {
    auto lw = shard_layer(full.layers[l], c, plan, rank, int(l));
    if (!lw.ok()) return lw.error();
    w->layers.push_back(std::move(lw.value()));
  }
  return w;
}

}  // namespace spw
