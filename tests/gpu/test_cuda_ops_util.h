// Shared helpers of the tests/gpu/test_cuda_ops_*.cpp suites (src/cuda/ops against ops/ref and
// formats/quant): device buffers with guard regions, bitwise and tolerance comparisons that name the
// first mismatching index, NaN checks. A missing GPU is a failure (SPW_REQUIRE_GPU), not a skip.
#pragma once
#if defined(SPW_HAVE_CUDA)

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "gpu_test_util.h"
#include "formats/dtypes.h"

namespace spw::cuda_test {

// n values from N(mean, sd²) with a fixed seed; rounded to bf16 values when `bf16` (activations).
inline std::vector<float> normal(size_t n, float mean, float sd, uint32_t seed, bool bf16 = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16 ? round_bf16(nd(rng)) : nd(rng);
  return v;
}

// Asserts that a Status-returning call succeeded, printing its error otherwise.
#define SPW_ASSERT_OK(expr)                                   \
  do {                                                        \
    auto spw_status_ = (expr);                                \
    ASSERT_TRUE(spw_status_.ok()) << spw_status_.error().message; \
  } while (0)

// A device copy of a host vector with kGuardBytes of a byte pattern on both sides; guards_intact()
// says whether a kernel wrote outside the payload.
template <class T>
class Guarded {
 public:
  static constexpr size_t kGuardBytes = 1024;
  static constexpr uint8_t kPattern = 0xA5;

  explicit Guarded(const std::vector<T>& host) : n_(host.size()) {
    std::vector<uint8_t> all(total_bytes(), kPattern);
    if (n_) std::memcpy(all.data() + kGuardBytes, host.data(), n_ * sizeof(T));
    EXPECT_EQ(cudaMalloc(&base_, all.size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(base_, all.data(), all.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit Guarded(size_t n) : Guarded(std::vector<T>(n)) {}
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  ~Guarded() { cudaFree(base_); }

  T* get() { return reinterpret_cast<T*>(static_cast<uint8_t*>(base_) + kGuardBytes); }
  size_t size() const { return n_; }

  std::vector<T> download() const {
    std::vector<uint8_t> all = download_all();
    std::vector<T> out(n_);
    if (n_) std::memcpy(out.data(), all.data() + kGuardBytes, n_ * sizeof(T));
    return out;
  }

  ::testing::AssertionResult guards_intact() const {
    std::vector<uint8_t> all = download_all();
    for (size_t i = 0; i < kGuardBytes; ++i) {
      if (all[i] != kPattern) return ::testing::AssertionFailure() << "guard before the output overwritten at byte " << i;
      if (all[kGuardBytes + n_ * sizeof(T) + i] != kPattern)
        return ::testing::AssertionFailure() << "guard after the output overwritten at byte " << i;
    }
    return ::testing::AssertionSuccess();
  }

 private:
  size_t total_bytes() const { return n_ * sizeof(T) + 2 * kGuardBytes; }
  std::vector<uint8_t> download_all() const {
    std::vector<uint8_t> all(total_bytes());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(all.data(), base_, all.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return all;
  }

  void* base_ = nullptr;
  size_t n_ = 0;
};

inline uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

// Bitwise equality; on failure: how many differ, the first index, both values.
template <class T>
::testing::AssertionResult bits_equal(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  size_t n_diff = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && n_diff++ == 0) first = i;
  if (n_diff == 0) return ::testing::AssertionSuccess();
  std::ostringstream s;
  s.precision(9);
  s << n_diff << " of " << got.size() << " differ; first at index " << first << ": got " << +got[first] << ", want "
    << +want[first];
  if constexpr (std::is_same_v<T, float>)
    s << std::hex << " (bits 0x" << bits_of(got[first]) << " vs 0x" << bits_of(want[first]) << ")";
  return ::testing::AssertionFailure() << s.str();
}

// |got − want| ≤ tol(i) for every element (NaN never passes); on failure: count, first index, values,
// and the largest error relative to its tolerance. Also reports how many were bit-identical.
inline ::testing::AssertionResult within(const std::vector<float>& got, const std::vector<float>& want,
                                         const std::function<double(size_t)>& tol, size_t* n_exact = nullptr) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  size_t n_bad = 0, first = 0, exact = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (bits_of(got[i]) == bits_of(want[i])) {
      ++exact;
      continue;
    }
    const double err = std::fabs(double(got[i]) - double(want[i])), t = tol(i);
    if (!(err <= t)) {
      if (n_bad++ == 0) first = i;
    }
    if (t > 0) worst = std::max(worst, err / t);
  }
  if (n_exact) *n_exact = exact;
  if (n_bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream s;
  s.precision(9);
  s << n_bad << " of " << got.size() << " outside tolerance (" << exact << " bit-exact); first at index " << first
    << ": got " << got[first] << ", want " << want[first] << ", tol " << tol(first) << "; worst err/tol " << worst;
  return ::testing::AssertionFailure() << s.str();
}

inline ::testing::AssertionResult no_nan(const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (std::isnan(v[i])) return ::testing::AssertionFailure() << "NaN at index " << i;
  return ::testing::AssertionSuccess();
}

}  // namespace spw::cuda_test

#endif  // SPW_HAVE_CUDA
