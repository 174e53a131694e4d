// Small device-memory helpers of the GPU forward: an owning buffer, checked CUDA calls, and
// synchronous host <-> device copies of small arrays (the step's positions, page tables, routing).
// Everything runs on the legacy default stream (stream 0), so a cudaMemcpy is ordered after every
// kernel queued before it; that is simple and correct, and one of the reasons the first GpuModel
// is slow (gpu_model.h lists the others).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "base/status.h"

namespace spw::engine {

inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return make_error("CUDA error in ", what, ": ", cudaGetErrorString(e));
}
#define SPW_CUDA_TRY(call) SPW_TRY(::spw::engine::cuda_status((call), #call))

// An owning device allocation of n elements of T (cudaMalloc; freed in the destructor).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { reset(); }

  // Allocates n elements (at least one, so that the pointer is never null); old contents are freed.
  Status alloc(size_t n) {
    reset();
    void* p = nullptr;
    SPW_CUDA_TRY(cudaMalloc(&p, (n ? n : 1) * sizeof(T)));
    p_ = static_cast<T*>(p);
    n_ = n;
    return {};
  }
  void reset() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t nbytes() const { return n_ * sizeof(T); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

template <class T>
Status upload(const T* src, size_t n, DeviceBuffer<T>& dst) {
  SPW_TRY(dst.alloc(n));
  if (n) SPW_CUDA_TRY(cudaMemcpy(dst.get(), src, n * sizeof(T), cudaMemcpyHostToDevice));
  return {};
}
template <class T>
Status upload(const std::vector<T>& src, DeviceBuffer<T>& dst) {
  return upload(src.data(), src.size(), dst);
}

template <class T>
Status download(const T* src, size_t n, std::vector<T>& dst) {
  dst.resize(n);
  if (n) SPW_CUDA_TRY(cudaMemcpy(dst.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost));
  return {};
}

}  // namespace spw::engine
