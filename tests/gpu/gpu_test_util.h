// Small helpers shared by the GPU tests (spw_gpu_tests): whether a device is present, and uploads.
// A missing GPU is a test failure, not a skip: tests start with SPW_REQUIRE_GPU().
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace spw::gpu_test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Fails the current test (never skips it) when no CUDA device is present.
#define SPW_REQUIRE_GPU() \
  ASSERT_TRUE(::spw::gpu_test::have_gpu()) << "no CUDA device: run spw_gpu_tests on the GPU machine (scripts/gpu_test.sh)"

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

// n deterministic token ids in [0, vocab) from a 64-bit LCG seeded with `seed`.
inline std::vector<int32_t> lcg_tokens(int n, uint64_t seed, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    t[i] = int32_t((seed >> 33) % uint64_t(vocab));
  }
  return t;
}

}  // namespace spw::gpu_test
