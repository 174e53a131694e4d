// Shared helpers of the spw_cuda_attn GPU tests (tests/gpu/test_cuda_attn_*.cpp): device buffers
// with guard regions, a paged pool whose sequences' pages interleave, and comparison helpers that
// print the first mismatching index.
#pragma once

#if defined(SPW_HAVE_CUDA)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "cuda/attn/kv_pages.h"

namespace spw::attn_test {

// A device array of n elements with kGuard sentinel elements on both sides.
template <class T>
class DevBuf {
 public:
  static constexpr size_t kGuard = 64;
  DevBuf(size_t n, T sentinel) : n_(n), sentinel_(sentinel) {
    EXPECT_EQ(cudaMalloc(&base_, sizeof(T) * (n + 2 * kGuard)), cudaSuccess);
    std::vector<T> init(n + 2 * kGuard, sentinel);
    EXPECT_EQ(cudaMemcpy(base_, init.data(), sizeof(T) * init.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit DevBuf(const std::vector<T>& v, T sentinel = T{}) : DevBuf(v.size(), sentinel) { upload(v); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { cudaFree(base_); }

  T* get() const { return base_ + kGuard; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& v) {
    ASSERT_LE(v.size(), n_);
    ASSERT_EQ(cudaMemcpy(get(), v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), get(), sizeof(T) * n_, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  // The guards still hold the sentinel (bytewise).
  void expect_guards(const char* what) const {
    std::vector<T> all(n_ + 2 * kGuard);
    ASSERT_EQ(cudaMemcpy(all.data(), base_, sizeof(T) * all.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < kGuard; ++i) {
      ASSERT_EQ(std::memcmp(&all[i], &sentinel_, sizeof(T)), 0) << what << ": guard before the buffer overwritten at " << i;
      ASSERT_EQ(std::memcmp(&all[kGuard + n_ + i], &sentinel_, sizeof(T)), 0)
          << what << ": guard after the buffer overwritten at " << i;
    }
  }

 private:
  T* base_ = nullptr;
  size_t n_;
  T sentinel_;
};

// A paged pool for n_seqs sequences of up to max_rows logical rows each. Pages are handed out
// round-robin over the sequences (so neighbouring pages belong to different sequences), and
// n_spare_pages more are never mapped: they must keep their 0xAB fill.
class TestPool {
 public:
  TestPool(const cuda::KvRowFormat& fmt, int n_seqs, int64_t max_rows, int n_spare_pages = 2)
      : fmt_(fmt),
        pages_per_seq_(int32_t((max_rows + cuda::kKvPageRows - 1) / cuda::kKvPageRows)),
        n_pages_(n_seqs * pages_per_seq_ + n_spare_pages),
        pool_(size_t(n_pages_) * cuda::kv_page_nbytes(fmt), uint8_t(0xAB)),
        table_(size_t(n_seqs) * std::max(pages_per_seq_, 1), int32_t(-1)) {
    cuda::KvPageAllocator alloc(n_pages_);
    std::vector<int32_t> table(table_.size(), -1);
    for (int32_t p = 0; p < pages_per_seq_; ++p)
      for (int s = 0; s < n_seqs; ++s) {
        auto got = alloc.alloc(1);
        EXPECT_TRUE(got.ok());
        table[size_t(s) * pages_per_seq_ + p] = got.value()[0];
        used_.push_back(got.value()[0]);
      }
    EXPECT_EQ(alloc.n_free(), n_spare_pages);
    table_.upload(table);
  }
  cuda::KvPages view() const {
    cuda::KvPages v;
    v.pool = pool_.get();
    v.page_table = table_.get();
    v.max_pages_per_seq = pages_per_seq_;
    v.fmt = fmt_;
    return v;
  }
  // Pages never mapped still hold 0xAB; the guards around pool and table are intact.
  void expect_untouched(const char* what) const {
    pool_.expect_guards(what);
    table_.expect_guards(what);
    std::vector<uint8_t> bytes = pool_.download();
    const size_t page_nbytes = cuda::kv_page_nbytes(fmt_);
    for (int32_t p = 0; p < n_pages_; ++p) {
      if (std::find(used_.begin(), used_.end(), p) != used_.end()) continue;
      for (size_t b = 0; b < page_nbytes; ++b)
        ASSERT_EQ(bytes[size_t(p) * page_nbytes + b], 0xAB) << what << ": unmapped page " << p << " written at byte " << b;
    }
  }

 private:
  cuda::KvRowFormat fmt_;
  int32_t pages_per_seq_, n_pages_;
  DevBuf<uint8_t> pool_;
  DevBuf<int32_t> table_;
  std::vector<int32_t> used_;
};

// Writes rows x [n, d] to (seqs[i], rows[i]) of the pool.
inline void write_rows(const cuda::KvPages& kv, const std::vector<float>& x, const std::vector<int32_t>& seqs,
                       const std::vector<int64_t>& rows) {
  if (seqs.empty()) return;
  DevBuf<float> dx(x);
  DevBuf<int32_t> ds(seqs);
  DevBuf<int64_t> dr(rows);
  Status st = cuda::kv_write_rows_cuda(kv, dx.get(), ds.get(), dr.get(), int32_t(seqs.size()), nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Every element finite; |got − want| ≤ atol; reports the first failure with its index.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double atol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << ": non-finite output at " << i << " (" << got[i] << ")";
    const double err = std::fabs(double(got[i]) - double(want[i]));
    ASSERT_LE(err, atol) << what << ": first mismatch at index " << i << ": got " << got[i] << " want " << want[i];
    max_err = std::max(max_err, err);
  }
  std::printf("[   info   ] %s: max |err| %.3g (atol %.3g)\n", what.c_str(), max_err, atol);
}

// Bit-identical floats; reports the first difference.
inline void expect_bits_equal(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
        << what << ": first difference at index " << i << ": got " << got[i] << " want " << want[i];
}

inline float max_abs(const std::vector<float>& v) {
  float m = 0.f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace spw::attn_test
#endif  // SPW_HAVE_CUDA
