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

Status PinnedStaging::upload_bytes(void* dst, const void* src, size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return {};
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
