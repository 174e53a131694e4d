// KV compression (specs §4.4, §5.2): learned gated pooling of groups of `ratio` tokens into one
// entry, streamed token by token so that prefill, chunked prefill and decode agree exactly.
#pragma once

#include <vector>

#include "model/model.h"

namespace spw::detail {

// Adds one token's projected rows (kv and gate score, each [width] f32; `score` already includes
// `ape` where the model has one) at position `pos`. When the token completes group pos/ratio,
// writes the pooled entry [width, or width/2 with overlap] to `entry` and returns true.
// overlap (V4 ratio 4): channels [0, width/2) of the previous group's tokens and channels
// [width/2, width) of this group's tokens share one softmax per channel; the first group has no
// previous group (kv 0, score −∞).
bool compressor_push(CompressorState& state, int ratio, int width, bool overlap, int64_t pos, const float* kv,
                     const float* score, std::vector<float>& entry);

}  // namespace spw::detail
