// Embedding row gather on the GPU: the first op of the forward (model.cpp: hc copies of embed[id]).
//
// Contract: table [vocab, d] f32 on the device; tokens [n_tokens] int32 on the device;
// out [n_tokens, n_copies, d] f32 (overwritten), out[t][c] = table[tokens[t]] for every copy c.
// An id outside [0, vocab) is a caller bug (the model validates ids on the host): its rows are
// written as NaN instead of reading out of bounds, so the NaN checks downstream catch it.
// Accuracy: a copy, bit-exact.
// Tests: tests/gpu/test_cuda_ops_norm.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace spw::cuda {

Status embedding_gather(const float* table, int64_t vocab, int64_t d, const int32_t* tokens, int64_t n_tokens,
                        int n_copies, float* out, cudaStream_t stream);

}  // namespace spw::cuda
