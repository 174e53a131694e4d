#include "engine/step_arena.h"

#include <algorithm>

namespace spw::engine {

Status DeviceArena::init(size_t nbytes) {
  SPW_TRY(buf_.alloc(nbytes));
  top_ = high_ = 0;
  return {};
}

Status DeviceArena::alloc_bytes(size_t nbytes, void*& p) {
  const size_t start = (top_ + kAlign - 1) / kAlign * kAlign;
  if (start + nbytes > buf_.size())
    return make_error("step arena exhausted: ", nbytes, " B requested at offset ", start, " of ", buf_.size(),
                      " B (memory_plan.cpp's step_arena_nbytes undercounts this step)");
  p = buf_.get() + start;
  top_ = start + nbytes;
  high_ = std::max(high_, top_);
  return {};
}

PinnedStaging::~PinnedStaging() {
  if (host_) cudaFreeHost(host_);
}

Status PinnedStaging::init(size_t nbytes) {
  void* p = nullptr;
  SPW_CUDA_TRY(cudaHostAlloc(&p, nbytes, cudaHostAllocDefault));
  host_ = static_cast<uint8_t*>(p);
  cap_ = nbytes;
  top_ = 0;
  return {};
}

Status PinnedStaging::sync(cudaStream_t stream) {
  SPW_CUDA_TRY(cudaStreamSynchronize(stream));
  top_ = 0;
  return {};
}

Status PinnedStaging::flush_run(cudaStream_t stream) {
  if (run_n_ == 0) return {};
  const size_t n = run_n_;
  run_n_ = 0;
  SPW_CUDA_TRY(cudaMemcpyAsync(run_dst_, host_ + run_host_, n, cudaMemcpyHostToDevice, stream));
  return {};
}

Status PinnedStaging::end_batch(cudaStream_t stream) {
  batching_ = false;
  return flush_run(stream);
}

Status PinnedStaging::upload_bytes(void* dst, const void* src, size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return {};
  if (batching_ && nbytes <= cap_) {
    // Joins the open run when the destination is the next arena allocation: the first kAlign boundary at or
    // after the run's end. The bytes in between are the previous allocation's padding, which no one owns,
    // so copying staging garbage over them is harmless; any other allocation in between would start on
    // that boundary, so the destination would be further on.
    uint8_t* d = static_cast<uint8_t*>(dst);
    const uintptr_t run_end = reinterpret_cast<uintptr_t>(run_dst_) + run_n_;
    const uintptr_t next = (run_end + DeviceArena::kAlign - 1) / DeviceArena::kAlign * DeviceArena::kAlign;
    if (run_n_ > 0 && reinterpret_cast<uintptr_t>(d) == next && run_host_ + size_t(d - run_dst_) + nbytes <= cap_) {
      std::memcpy(host_ + run_host_ + size_t(d - run_dst_), src, nbytes);
      run_n_ = size_t(d - run_dst_) + nbytes;
      top_ = run_host_ + run_n_;
      return {};
    }
    SPW_TRY(flush_run(stream));
    size_t start = (top_ + 15) / 16 * 16;
    if (start + nbytes > cap_) {
      SPW_TRY(sync(stream));
      start = 0;
    }
    std::memcpy(host_ + start, src, nbytes);
    run_dst_ = d, run_host_ = start, run_n_ = nbytes;
    top_ = start + nbytes;
    return {};
  }
  if (batching_) SPW_TRY(flush_run(stream));
  if (nbytes > cap_) {  // larger than the whole buffer: a pageable copy on the stream, waited for
    SPW_CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream));
    return sync(stream);
  }
  size_t start = (top_ + 15) / 16 * 16;
  if (start + nbytes > cap_) {
    SPW_TRY(sync(stream));
    start = 0;
  }
  std::memcpy(host_ + start, src, nbytes);
  SPW_CUDA_TRY(cudaMemcpyAsync(dst, host_ + start, nbytes, cudaMemcpyHostToDevice, stream));
  top_ = start + nbytes;
  return {};
}

Status PinnedStaging::download_bytes(void* dst, const void* src, size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return {};
  if (batching_) SPW_TRY(end_batch(stream));
  if (nbytes > cap_) {
    SPW_CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream));
    return sync(stream);
  }
  // Stream order puts this copy after the pending uploads that read the staging buffer.
  SPW_CUDA_TRY(cudaMemcpyAsync(host_ + cap_ - nbytes, src, nbytes, cudaMemcpyDeviceToHost, stream));
  SPW_TRY(sync(stream));
  std::memcpy(dst, host_ + cap_ - nbytes, nbytes);
  return {};
}

}  // namespace spw::engine
