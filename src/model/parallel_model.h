// Tensor parallel (TP) and expert parallel (EP) of the CPU reference forward: a full Model split over the ranks of
// one in-process loopback group (comm/loopback.h), one thread per rank, so CI runs every parallel path on the CPU
// against the single-device Model (tests/unit/test_model_parallel.cpp).
//
// Ranks. A ParallelPlan (model/shard.h) is one group of max(tp, ep) ranks; tp and ep are each 1 or the group
// size. Each rank is a Model built from a shard config, the rank's weights (sliced from the full model's f32
// weights) and a RankRole, and keeps its own SequenceState. Every rank runs the unchanged reference code; the
// shard config makes the attention code see the rank's heads, and the RankRole adds the collectives.
//
// What is split (everything else is computed identically on every rank):
// - Attention, by tp: each rank holds n_heads / tp heads (wq_b's rows and the attention sinks of those heads). The
//   grouped output projection follows the heads: with tp <= o_groups a rank holds whole groups (their wo_a blocks
//   and wo_b's columns of them); with tp > o_groups it holds part of one group g (wo_a[g]'s input columns of its
//   heads and wo_b's columns of g). The projection is linear, so the ranks' outputs are parts of the full output:
//   one all_reduce after wo_b, before its bf16 rounding. The q low-rank A projection and norm, the single-latent
//   KV (window ring), the compressors, compressed entries and the indexer are shared by all heads and replicated.
// - Routed experts: with ep > 1 each rank holds a contiguous block of n_experts / ep experts; with ep = 1 and
//   tp > 1 each rank holds a width slice (d_expert / tp hidden channels: w1 and w3 rows, w2 columns) of every
//   expert. The router is replicated and every rank already has every token (an all-gather style dispatch: no
//   all_to_all); a rank runs its experts, or its slices, on the tokens routed to them.
// - Shared expert, by tp: a width slice per rank; with tp = 1 it is whole on every rank.
// - One all_reduce per MoE sums the ranks' routed parts (plus the shared slices), before the bf16 rounding; a
//   whole shared expert is added after it, once.
// - Head, by tp: each rank projects its contiguous block of vocab / tp rows; an all_gather gives rank-major blocks
//   [rank, n, vocab / tp], reordered to [n, vocab]. Every rank returns the same logits, bit for bit.
// - Replicated: embedding, hyper-connections, norms, Engram (V4.1), the router, the head's collapse and norm.
//
// Numerics against the single-device Model. Every replicated value and every row slice is computed by the same
// f32 operations (the reference matmul sums each output's dot product sequentially over its inputs). What
// differs: a dot product over split inputs (wo_b's over the groups, wo_a's over a split group's heads, w2's over
// width slices) and the MoE's sum of experts are added per rank, then across ranks in rank order, so the f32
// rounding order differs. With Numerics::exact() that is the only difference. EP alone regroups only the sum of a
// token's routed experts: with top_k = 2 that sum is one addition whichever rank holds which expert, and the
// result is the single device's, bit for bit, in both numerics. With Numerics::reference() the roundings inside a rank's part
// also differ: tp > o_groups rounds each rank's part of a group's wo_a output to bf16 and fake-quantizes it (FP8,
// per block) before wo_b; a width slice's hidden is quantized before w2 with its own block scale when it is
// narrower than act_block (the block's amax is on no single rank: model/linear.cpp), and its w2 output is rounded
// to bf16 per slice. Downstream, a bf16 rounding of a value that differs in its last f32 bits may flip by one bf16
// step, and a top-k between near-equal scores (indexer, router) may choose differently. The tolerances, measured
// and reasoned, are in the test.
//
// Limits: one forward at a time per ParallelModel (a group's collectives are in flight); the full model must be
// loaded with every layer and routed expert value, and must outlive the ParallelModel (V4.1's Engram tables stay
// in its checkpoint's memory map).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "comm/communicator.h"
#include "model/model.h"
#include "model/shard.h"

namespace spw {

class ParallelModel {
 public:
  // Splits `full` by `plan`; the ranks take full's numerics. Errors: check_parallel_plan's, and shard_weights'
  // (layers or experts not loaded).
  static Result<std::unique_ptr<ParallelModel>> create(const Model& full, const ParallelPlan& plan);
  ~ParallelModel();

  const ParallelPlan& plan() const { return plan_; }
  int n_ranks() const { return int(ranks_.size()); }
  const Model& rank_model(int rank) const { return *ranks_[size_t(rank)]; }

  // One sequence's state, a copy on every rank.
  struct Sequence {
    std::vector<SequenceState> ranks;
  };
  Sequence new_sequence() const;

  // Appends `tokens` to `seq` on every rank, each rank's forward on its own thread with its own options
  // (rank_options[r], one per rank, the same all_logits), and returns each rank's logits [n, vocab] (n =
  // tokens.size() with all_logits, else 1); they are the same on every rank. Rank r's callbacks run on rank r's
  // thread, concurrently with the other ranks'; on_intermediate sees the rank's own part of what is split ("attn.q",
  // "attn.o": its heads; "moe.routed", "moe.shared": its part of the sum); a before_layer must give every rank the
  // same streams (they are replicated). Errors: options that do not fit, and input that Model::validate_input
  // rejects, both checked before any rank starts (a rank that stopped early would leave the others waiting in a
  // collective), leaving `seq` unchanged.
  Result<std::vector<std::vector<float>>> forward_every_rank(Sequence& seq, std::span<const int32_t> tokens,
                                                             std::span<const ForwardOptions> rank_options) const;
  // Rank 0's logits of forward_every_rank without callbacks.
  Result<std::vector<float>> forward(Sequence& seq, std::span<const int32_t> tokens, bool all_logits = false) const;

 private:
  ParallelModel() = default;
  ParallelPlan plan_;
  std::vector<std::unique_ptr<comm::Communicator>> comms_;
  std::vector<std::unique_ptr<Model>> ranks_;
};

}  // namespace spw
