// Small device-memory helpers of the GPU forward: owning device and mapped pinned host buffers,
// checked CUDA calls, and synchronous host <-> device copies for loading (upload / download run on
// the legacy default stream; a step's copies go through step_arena.h on the model's stream).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
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

// Pinned host memory mapped into the device's address space (cudaHostAllocMapped): kernels read it
// over PCIe through device_ptr().
class MappedHostBuffer {
 public:
  MappedHostBuffer() = default;
  MappedHostBuffer(const MappedHostBuffer&) = delete;
  MappedHostBuffer& operator=(const MappedHostBuffer&) = delete;
  MappedHostBuffer(MappedHostBuffer&& o) noexcept
      : host_(std::exchange(o.host_, nullptr)), dev_(std::exchange(o.dev_, nullptr)) {}
  ~MappedHostBuffer() {
    if (host_) cudaFreeHost(host_);
  }
  MappedHostBuffer& operator=(MappedHostBuffer&& o) noexcept {
    if (this != &o) {
      if (host_) cudaFreeHost(host_);
      host_ = std::exchange(o.host_, nullptr);
      dev_ = std::exchange(o.dev_, nullptr);
    }
    return *this;
  }
  // nbytes of pinned mapped memory, zeroed.
  Status alloc(size_t nbytes) {
    SPW_CUDA_TRY(cudaHostAlloc(&host_, nbytes ? nbytes : 1, cudaHostAllocMapped));
    std::memset(host_, 0, nbytes ? nbytes : 1);
    SPW_CUDA_TRY(cudaHostGetDevicePointer(&dev_, host_, 0));
    return {};
  }
  Status alloc_copy(const void* src, size_t nbytes) {
    SPW_CUDA_TRY(cudaHostAlloc(&host_, nbytes ? nbytes : 1, cudaHostAllocMapped));
    if (nbytes) std::memcpy(host_, src, nbytes);
    SPW_CUDA_TRY(cudaHostGetDevicePointer(&dev_, host_, 0));
    return {};
  }
  void* host_ptr() const { return host_; }
  void* device_ptr() const { return dev_; }

 private:
  void* host_ = nullptr;
  void* dev_ = nullptr;
};

// Where the pieces of a chunked arena go: 256-byte aligned in the last chunk, else at the start of a new chunk of
// max(nbytes, kChunkBytes): one allocation per chunk, not per piece. Chunk is MappedHostBuffer or
// DeviceBuffer<uint8_t> (anything with alloc(nbytes)); chunks live as long as the arena.
template <class Chunk>
class ChunkedPieces {
 public:
  static constexpr size_t kChunkBytes = size_t(256) << 20;
  struct Place {
    Chunk* chunk = nullptr;
    size_t offset = 0;
  };
  Result<Place> place(size_t nbytes) {
    size_t at = (used_ + 255) / 256 * 256;
    if (chunks_.empty() || at + nbytes > capacity_) {
      const size_t chunk_bytes = std::max(nbytes, kChunkBytes);
      Chunk c;
      SPW_TRY(c.alloc(chunk_bytes));
      chunks_.push_back(std::move(c));
      capacity_ = chunk_bytes;
      allocated_ += chunk_bytes;
      at = 0;
    }
    used_ = at + nbytes;
    return Place{&chunks_.back(), at};
  }
  size_t allocated_nbytes() const { return allocated_; }

 private:
  std::vector<Chunk> chunks_;
  size_t capacity_ = 0, used_ = 0, allocated_ = 0;
};

// Pinned mapped host memory handed out in pieces (one cudaHostAlloc per chunk, not per tensor: pinning is slow,
// and a spilled 40-layer model has tens of thousands of expert tensors). copy() returns a 256-byte aligned copy
// of src, by its device address and its host address.
class MappedHostArena {
 public:
  struct Piece {
    const void* device = nullptr;
    const void* host = nullptr;
  };
  Result<Piece> copy(const void* src, size_t nbytes) {
    auto at = pieces_.place(nbytes);
    if (!at.ok()) return at.error();
    char* host = static_cast<char*>(at->chunk->host_ptr()) + at->offset;
    std::memcpy(host, src, nbytes);
    nbytes_ += nbytes;
    return Piece{static_cast<const char*>(at->chunk->device_ptr()) + at->offset, host};
  }
  size_t nbytes() const { return nbytes_; }                              // bytes copied in (without alignment and chunk tails)
  size_t pinned_nbytes() const { return pieces_.allocated_nbytes(); }  // host memory pinned for it

 private:
  ChunkedPieces<MappedHostBuffer> pieces_;
  size_t nbytes_ = 0;
};

// Device memory handed out in pieces, for the model's many weight tensors: a few hundred allocations instead of
// one per tensor, and no per-tensor rounding by the allocator (which gives a block of a few MiB whole 2 MiB pages:
// a 2.8 MiB expert tensor alone would take 4 MiB).
class WeightArena {
 public:
  // A 256-byte aligned device copy of nbytes at src (host memory, synchronously).
  Result<void*> copy(const void* src, size_t nbytes) {
    auto at = pieces_.place(nbytes);
    if (!at.ok()) return at.error();
    uint8_t* dst = at->chunk->get() + at->offset;
    if (nbytes) SPW_CUDA_TRY(cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice));
    return static_cast<void*>(dst);
  }
  size_t allocated_nbytes() const { return pieces_.allocated_nbytes(); }

 private:
  ChunkedPieces<DeviceBuffer<uint8_t>> pieces_;
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
