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

}  // namespace spw::cuda
