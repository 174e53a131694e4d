// HBM read bandwidth as the EXL3 benchmarks measure it (the roofline's denominator): a grid-stride sum over a
// device buffer with streaming loads, 10 back-to-back launches after one warm-up, timed by CUDA events.
// Include from one .cu file per binary (it defines a kernel).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda_check.h"

namespace spw::bench {

__global__ void hbm_read_kernel(const float4* p, size_t n, float* out) {
  float s = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float4 v = __ldcs(p + i);
    s += v.x + v.y + v.z + v.w;
  }
  if (s == 1234.5f) *out = s;  // keeps the loads alive
}

// Bytes per second read from `buf` (`bytes`, a multiple of 16, far larger than L2).
inline double hbm_read_bandwidth(const void* buf, size_t bytes, int n_sms) {
  float* dummy;
  CK(cudaMalloc(&dummy, 4));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const float4* p = static_cast<const float4*>(buf);
  hbm_read_kernel<<<n_sms * 8, 512>>>(p, bytes / 16, dummy);
  CK(cudaEventRecord(e0));
  for (int i = 0; i < 10; ++i) hbm_read_kernel<<<n_sms * 8, 512>>>(p, bytes / 16, dummy);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  CK(cudaGetLastError());
  float ms;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(dummy));
  return double(bytes) * 10 / (ms * 1e-3);
}

}  // namespace spw::bench
