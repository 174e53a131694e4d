// Lightning Indexer: chooses, for each new token, which compressed entries it attends to
// (specs §4.5 V4, §5.2 V4.1). Returns per token the selected entry ids, ascending.
#pragma once

#include <cstdint>
#include <vector>

#include "model/forward_context.h"

namespace spw::detail {

// V4 CSA layer: runs the indexer's own compressor over the new tokens (appending index keys),
// then selects the top-index_topk visible entries per token. x [n, d] normed input, cq [n, q_lora].
std::vector<std::vector<int32_t>> v4_indexer_select(ForwardContext& s, int layer, const float* x, const float* cq);

// V4.1 index source (KV source or re-index layer). `produced` = latents this layer produced in
// this step (decides whether it republishes its index keys, see Numerics::stale_index_k).
// A candidate source also publishes s.candidates; a re-index layer is masked by them.
std::vector<std::vector<int32_t>> v41_indexer_select(ForwardContext& s, int layer, const float* x, const float* cq,
                                                     int produced);

// select_candidate_blocks for one query: scores [n_entries] (−∞ = invisible), blocks of
// block_size, the block holding entry newest forced in, top-n_blocks_keep finite blocks kept.
// Returns a per-entry mask.
std::vector<char> select_candidate_blocks(const std::vector<float>& scores, int block_size, int64_t newest,
                                          int n_blocks_keep);

}  // namespace spw::detail
