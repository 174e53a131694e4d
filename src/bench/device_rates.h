// The H200's own rates, measured in the same process as the engine benchmark (`spillway bench`):
// HBM bandwidth and the bf16 tensor-core rate, the denominators of the roofline percentages.
//
// copy bandwidth: cudaMemcpyAsync device-to-device of `nbytes` (≥ 1 GiB), read + write bytes counted
//   (2·nbytes per copy), best of `iters` after one warm-up; the same definition as bench/dense.
// bf16 GEMM rate: cuBLAS cublasGemmEx m = n = k = `dim`, bf16 inputs and output, fp32 compute
//   (CUBLAS_COMPUTE_32F), operands filled with random bf16 in [-1, 1] (zeros would draw less power
//   and clock higher), 2·dim³ FLOPs per call, best of `iters` after one warm-up.
// Host rates: measure_mapped_read_bandwidth below; host DRAM read by the CPU: host_rates.h.
// Errors: CUDA / cuBLAS failures (allocation included), as Status with the call that failed.
// Used by bench.cpp; verified by comparing with bench/dense's copy bandwidth on the same GPU.
#pragma once

#include <cstddef>

#include "base/status.h"

namespace spw::bench {

Result<double> measure_copy_bandwidth(size_t nbytes, int iters);  // bytes/s
Result<double> measure_bf16_gemm_rate(int dim, int iters);        // FLOP/s

// Pinned host memory read by the GPU (the HostGpu expert tier's medium): `kernel` is a kernel reading `nbytes` of
// mapped pinned memory (zero-copy, 16-byte loads over the whole grid), `copy` cudaMemcpyAsync of the same bytes
// host-to-device; bytes/s, best of `iters` after one warm-up.
struct MappedReadRates {
  double kernel = 0, copy = 0;
};
Result<MappedReadRates> measure_mapped_read_bandwidth(size_t nbytes, int iters);

}  // namespace spw::bench
