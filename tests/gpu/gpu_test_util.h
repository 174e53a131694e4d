// Small helpers shared by the GPU tests (spw_gpu_tests): whether a device is present, and uploads.
// A missing GPU is a test failure, not a skip: callers ASSERT_TRUE(have_gpu()) with a message.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

namespace spw::gpu_test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// A device copy of v with 16 spare bytes (kernels may read a vector's tail in 16-byte loads). The copy
// is ordered before later work on the legacy default stream; callers using other streams must
// synchronise first (a pageable cudaMemcpy may return before its DMA lands).
template <class T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, v.size() * sizeof(T) + 16), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

}  // namespace spw::gpu_test
