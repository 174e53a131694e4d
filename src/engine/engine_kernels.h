// The few glue kernels of the GPU forward that no kernel library provides: the MoE dispatch and
// combine (gather a subset of rows, add rows back at their tokens), element-wise add / scale, the
// V4 indexer's Hadamard transform and the HCA layers' "every visible entry" selection.
// One thread per output element, f32, each value computed by the same single operation as the CPU
// reference (model/moe.cpp, indexer.cpp), so results are bit-exact.
// Contract: device pointers, row-major f32 [*, d]; queued on `stream`; errors are launch errors.
//   gather_rows_cuda:      out[j] = x[rows[j]], j < n_rows.
//   scatter_add_rows_cuda: acc[rows[j]] += y[j]; the rows of one call must be distinct (one expert's
//                          tokens), so calls in expert order add in the reference's order.
//   add_cuda:              out[i] = a[i] + b[i] (out may alias a or b), rounded to bf16 with round_out.
//   scale_cuda:            x[i] *= s.
//   hadamard_rows_cuda:    ref::hadamard_rows on each row of x [n_rows, n] in place (n a power of two):
//                          one thread per row runs the reference's butterflies in its order, then
//                          multiplies by 1/sqrt(n) computed on the host as the reference does.
//   iota_select_cuda:      sel[i, g] = g < visible[i] ? g : −1, g < stride.
//   count_routes_cuda:     counts[e] += #{i < n : experts[i] = e} for 0 ≤ e < n_experts (atomics: counts are
//                          integers, so the order does not matter); serve --record-routing.
// Tested through the forward (tests/gpu/test_engine_golden.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace spw::engine {

Status gather_rows_cuda(const float* x, const int32_t* rows, int64_t n_rows, int64_t d, float* out,
                        cudaStream_t stream);
Status scatter_add_rows_cuda(float* acc, const float* y, const int32_t* rows, int64_t n_rows, int64_t d,
                             cudaStream_t stream);
Status add_cuda(const float* a, const float* b, int64_t n, float* out, cudaStream_t stream, bool round_out = false);
Status scale_cuda(float* x, int64_t n, float s, cudaStream_t stream);
Status hadamard_rows_cuda(float* x, int64_t n_rows, int n, cudaStream_t stream);
Status iota_select_cuda(const int64_t* visible, int64_t n_rows, int64_t stride, int32_t* sel, cudaStream_t stream);
Status count_routes_cuda(const int32_t* experts, int64_t n, int n_experts, unsigned long long* counts,
                         cudaStream_t stream);

}  // namespace spw::engine
