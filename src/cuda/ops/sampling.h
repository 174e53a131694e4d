// Token selection on the GPU over logits [n_seqs, vocab] f32: greedy argmax and a temperature /
// top-k / min-p / top-p sampler driven by one host-supplied uniform u ∈ [0, 1) per sequence.
//
// Relation to the server's sampler (runtime/sampler.cpp, Sampler::draw): the same pipeline and the
// same math after its penalties — candidates in descending logit order (ties: lower id), top-k cut,
// p_i = exp((l_i − l_max)/T) in f64, trailing zero-probability (masked −inf) candidates dropped, min-p
// cut (p_i ≥ min_p·p_0), top-p cut (the smallest prefix whose mass reaches top_p·Σp), then the CDF
// inverted at u·Σp. Presence/frequency penalties and grammar masks are not applied here: the
// caller applies them to the logits first (masked tokens as −inf). temperature ≤ 0 is greedy.
// Given the same u the GPU picks the server's token, except that the f64 sums run in a different
// order and CUDA's f64 exp may differ from glibc's by an ulp: a different token needs u·Σp (or
// top_p·Σp) within ~1e-15 relative of a CDF boundary.
//
// Contract: device pointers. argmax: out[s] = the lowest id of the maximum logit of row s.
// sample: params [n_seqs], u [n_seqs] f64, out [n_seqs] int32 (overwritten); logits finite or −inf
// with at least one finite value per row; workspace of sample_workspace_nbytes(n_seqs, vocab) bytes,
// one per stream. The sampler sorts every row (CUB segmented radix sort, stable, so equal logits
// keep ascending ids): O(vocab) memory traffic per row, several launches.
// Limits: n_seqs · vocab < 2^31.
// Tests: tests/gpu/test_cuda_ops_sampling.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "base/status.h"

namespace spw::cuda {

struct SampleParams {
  float temperature = 0.f;  // ≤ 0: greedy
  int32_t top_k = 0;        // ≤ 0 or ≥ vocab: off
  float top_p = 1.f;        // ≥ 1: off
  float min_p = 0.f;        // ≤ 0: off
};

Status argmax(const float* logits, int64_t n_seqs, int64_t vocab, int32_t* out, cudaStream_t stream);

Result<size_t> sample_workspace_nbytes(int64_t n_seqs, int64_t vocab);

Status sample(const float* logits, int64_t n_seqs, int64_t vocab, const SampleParams* params, const double* u,
              void* workspace, size_t workspace_nbytes, int32_t* out, cudaStream_t stream);

}  // namespace spw::cuda
