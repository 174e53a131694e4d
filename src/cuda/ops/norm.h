// bf16 rounding of f32 activations and RMSNorm over rows, on the GPU (ops/ref/linalg.h twins).
//
// Contract: device pointers, row-major f32; "bf16 activations" are f32 values rounded to bf16
// (model.h Numerics). Work is queued on `stream`; errors are launch errors only.
//   round_bf16: x[n] in place, RNE, NaN stays NaN: identical to ref::round_bf16_inplace.
//   rms_norm:   y[r] = w · (x[r] · rsqrt(mean(x[r]²) + eps)) per row of width d, w may be null
//               (weightless); y == x allowed; round_out additionally rounds y to bf16.
// Accuracy: round_bf16 bit-exact. rms_norm sums squares in f64 like the reference but in a tree
// order, so mean(x²) can differ from the reference's in the last f64 bits; after the f32 rounding
// the results are bit-exact except when that sum lies within ~1e-12 (relative) of an f32 rounding
// midpoint (tests allow 2 f32 ulp, or 1 bf16 ulp with round_out).
// Limits: n, n_rows·d < 2^62; rows of any width ≥ 1.
// Tests: tests/gpu/test_cuda_ops_norm.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace spw::cuda {

Status round_bf16(float* x, int64_t n, cudaStream_t stream);

Status rms_norm(const float* x, const float* w, float* y, int64_t n_rows, int64_t d, float eps, bool round_out,
                cudaStream_t stream);

// rms_norm, then RoPE on each row's last d_rope channels (rope.h; row r at positions[r / rows_per_pos], forward),
// then, with round_out, bf16 again: the reference's norm, to_activation, rope, to_activation in one launch,
// bit-identical to rms_norm followed by rope_apply_rounded(round_out = true) (and without round_out, to rms_norm
// and rope_apply).
Status rms_norm_rope(const float* x, const float* w, float* y, int64_t n_rows, int64_t d, float eps, bool round_out,
                     int d_rope, const float* freqs, const int64_t* positions, int64_t rows_per_pos,
                     cudaStream_t stream);

}  // namespace spw::cuda
