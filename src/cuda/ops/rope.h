// Partial interleaved RoPE on the GPU (ops/ref/rope.h twin): rotates the LAST d_rope channels of
// each vector, pair i = channels (d − d_rope + 2i, +1), by angle pos·freqs[i] (inverse: −angle).
//
// Contract: x [n_vectors, d] f32 on the device, in place. positions [n_vectors / vectors_per_pos]
// int64 on the device: vector v uses positions[v / vectors_per_pos] (e.g. q [n_tokens, n_heads, d]
// with vectors_per_pos = n_heads; one vector per position for kv). freqs [d_rope/2] f32 on the device,
// from ref::rope_frequencies (plain or YaRN).
// Numerics: angle = f32(pos)·freq in f32 and the rotation a·c − b·s, a·s + b·c without FMA, as the
// reference; cos/sin are evaluated in f64 and rounded to f32, the correctly rounded value, which
// glibc's cosf/sinf return nearly always. Results are bit-exact except where glibc's f32 cos/sin are
// off by an ulp (the test allows 2·FLT_EPSILON·(|a|+|b|) per output and reports the exact share).
// Limits: d_rope even, 0 < d_rope ≤ d; n_vectors a multiple of vectors_per_pos.
// Tests: tests/gpu/test_cuda_ops_rope.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace spw::cuda {

Status rope_apply(float* x, int64_t n_vectors, int64_t d, int d_rope, const float* freqs, const int64_t* positions,
                  int64_t vectors_per_pos, bool inverse, cudaStream_t stream);

// rope_apply with the bf16 rounding around it in the same launch: round_in rounds every channel of each vector
// before the rotation, round_out after it — the reference's to_activation before and after the RoPE, bit for bit
// (ops/ref/linalg.h round_bf16), in one pass instead of up to three. With either, d must be even.
Status rope_apply_rounded(float* x, int64_t n_vectors, int64_t d, int d_rope, const float* freqs,
                          const int64_t* positions, int64_t vectors_per_pos, bool inverse, bool round_in,
                          bool round_out, cudaStream_t stream);

}  // namespace spw::cuda
