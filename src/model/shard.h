// How a full model is split over the ranks of a tensor- and expert-parallel group: the plan, its checks against
// the config, and each rank's config, role and weights sliced from the full model's f32 weights. What is split how,
// and why, is in model/parallel_model.h.
#pragma once

#include <algorithm>
#include <memory>

#include "base/status.h"
#include "model/config.h"
#include "model/model.h"
#include "model/weights.h"

namespace spw {

// One group of n_ranks() = max(tp, ep) ranks; tp and ep are each 1 or the group size, so TP2+EP2 is two ranks
// that split the attention, shared expert and head two ways (tp) and the routed experts into two blocks (ep).
struct ParallelPlan {
  int tp = 1;  // attention heads, shared expert width, head vocabulary; routed expert width when ep = 1
  int ep = 1;  // routed experts, in contiguous blocks
  int n_ranks() const { return std::max(tp, ep); }
};

// Errors for a plan the config cannot be split by, naming the field and the values.
Status check_parallel_plan(const ModelConfig& c, const ParallelPlan& plan);

// A rank's config: the full one with n_heads = n_heads / tp and o_groups the groups a rank holds (o_groups / tp,
// or 1 when tp > o_groups and a rank holds part of one group). Widths of sliced experts come from their weights.
// The plan must have passed check_parallel_plan.
ModelConfig shard_config(const ModelConfig& c, const ParallelPlan& plan);

// Rank `rank`'s role (which parts are slices, which experts it runs) in the group `comm` connects.
RankRole shard_role(const ModelConfig& c, const ParallelPlan& plan, int rank, comm::Communicator* comm);

// Rank `rank`'s weights, sliced from `full` (the weights of a Model built from config `c`). V4.1's Engram tables
// stay in full's checkpoint memory map, so `full` must outlive the result. Errors: layers not loaded or routed
// experts without values (the rank forward cannot read slices from the checkpoint).
Result<std::unique_ptr<ModelWeights>> shard_weights(const ModelWeights& full, const ModelConfig& c,
                                                    const ParallelPlan& plan, int rank);

}  // namespace spw
