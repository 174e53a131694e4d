// The GPU forward's per-step memory: a device arena and a pinned host staging buffer, both
// allocated once at load (sizes from the memory planner, memory_plan.h), so that a step never calls
// cudaMalloc / cudaFree (cudaFree synchronises the device) and every copy is async on the model's
// stream.
//
// DeviceArena: one device buffer, bump-allocated. A step takes a mark, sublayers take nested marks
// (ArenaScope) and release them when done; the memory is reused by later kernels of the SAME stream,
// which run after the earlier ones, so release needs no synchronisation. Hazard: a pointer that must
// outlive a scope (the step's token arrays, the V4.1 selection) is allocated in the outer scope.
// An allocation beyond the buffer is an error that names the request and the arena size (the plan
// was too small: a bug in memory_plan.cpp's step_arena_nbytes).
//
// PinnedStaging: host memory (cudaHostAlloc) that uploads are written into before their
// cudaMemcpyAsync, and downloads land in. Bump-allocated, never reused before the stream has been
// synchronised (the copy may not have run yet); when full it synchronises the stream and starts
// over, which is correct, only slower. Every synchronisation of the step resets it.
// Tests: through the forward (tests/gpu/test_engine_golden.cpp, test_engine_batch.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/device_buffer.h"

namespace spw::engine {

// A non-owning device array (from the arena).
template <class T>
struct DeviceSpan {
  T* p = nullptr;
  size_t n = 0;
  T* get() const { return p; }
  size_t size() const { return n; }
  size_t nbytes() const { return n * sizeof(T); }
};

class DeviceArena {
 public:
  static constexpr size_t kAlign = 256;
  Status init(size_t nbytes);
  size_t capacity() const { return buf_.size(); }
  size_t mark() const { return top_; }
  void release(size_t mark) { top_ = mark; }
  size_t high_water() const { return high_; }

  // n elements (at least one, so the pointer is never null).
  template <class T>
  Status alloc(DeviceSpan<T>& out, size_t n) {
    void* p = nullptr;
    SPW_TRY(alloc_bytes((n ? n : 1) * sizeof(T), p));
    out = {static_cast<T*>(p), n};
    return {};
  }

 private:
  Status alloc_bytes(size_t nbytes, void*& p);
  DeviceBuffer<uint8_t> buf_;
  size_t top_ = 0, high_ = 0;
};

// Releases the arena to the mark taken at construction.
class ArenaScope {
 public:
  explicit ArenaScope(DeviceArena& a) : a_(a), mark_(a.mark()) {}
  ~ArenaScope() { a_.release(mark_); }
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

 private:
  DeviceArena& a_;
  size_t mark_;
};

class PinnedStaging {
 public:
  PinnedStaging() = default;
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  ~PinnedStaging();
  Status init(size_t nbytes);

  // Queues dst[0..nbytes) ← src through the staging buffer on `stream`.
  Status upload_bytes(void* dst, const void* src, size_t nbytes, cudaStream_t stream);
  // dst[0..nbytes) ← src (device), then synchronises the stream (the host needs the values now).
  Status download_bytes(void* dst, const void* src, size_t nbytes, cudaStream_t stream);
  // Synchronises the stream; the staging buffer is free again afterwards.
  Status sync(cudaStream_t stream);

  // Batching: between begin_batch() and end_batch(), uploads are only written into the staging buffer,
  // at offsets mirroring their destinations, and end_batch() issues one copy per run of nearby
  // destinations (arena allocations in a row: one copy, padding included). A step's dozen small
  // uploads cost ~3 µs of host time and ~1 µs of GPU time each when copied one by one, before the
  // step's first kernel (a kernel trace: 16 copies per decode step). Nothing may read the
  // destinations before end_batch() (no kernel launches in between); a download ends the batch first.
  void begin_batch() { batching_ = true; }
  Status end_batch(cudaStream_t stream);
  // Leaves batch mode without copying (a failed step).
  void abandon_batch() { batching_ = false, run_n_ = 0; }

 private:
  Status flush_run(cudaStream_t stream);
  uint8_t* host_ = nullptr;
  size_t cap_ = 0, top_ = 0;
  bool batching_ = false;
  uint8_t* run_dst_ = nullptr;  // the open run: device [run_dst_, +run_n_) ← host_ + run_host_
  size_t run_host_ = 0, run_n_ = 0;
};

// Batches the uploads of a scope (PinnedStaging::begin_batch); abandons the batch if not ended.
class StagingBatch {
 public:
  explicit StagingBatch(PinnedStaging& s) : s_(s) { s_.begin_batch(); }
  ~StagingBatch() {
    if (open_) s_.abandon_batch();
  }
  Status end(cudaStream_t stream) {
    open_ = false;
    return s_.end_batch(stream);
  }
  StagingBatch(const StagingBatch&) = delete;
  StagingBatch& operator=(const StagingBatch&) = delete;

 private:
  PinnedStaging& s_;
  bool open_ = true;
};

}  // namespace spw::engine
