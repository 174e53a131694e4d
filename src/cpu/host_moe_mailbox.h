// The mailbox through which a GPU stream hands one MoE layer's tokens to the CPU expert runtime and
// takes back their output, with no host synchronization on the stream (engine/host_experts.h posts and
// collects; cpu/host_moe_worker.h serves). It lives in pinned host memory mapped into the device's
// address space; this header is plain C++ that both compilers read.
//
// Protocol, one request in flight at a time (a stream's layers run in order):
//   GPU  writes x, ids, weights of n_tokens rows, then layer and n_tokens, then (system-scope release)
//        request_seq = request_seq + 1;
//   CPU  sees request_seq ≠ done_seq (acquire), computes y [n_tokens][d] for the slots with ids ≥ 0,
//        then (release) done_seq = request_seq;
//   GPU  waits until done_seq = request_seq (acquire), then reads y. A wait that times out sets
//        `failed` and leaves y unread (engine/host_experts.h reports it after the step).
// Both sequence numbers wrap at 2^32 and are compared for equality only.
#pragma once

#include <cstddef>
#include <cstdint>

namespace spw {

struct alignas(64) HostMoeMailboxHeader {
  uint32_t request_seq = 0;  // written by the GPU
  uint32_t done_seq = 0;     // written by the CPU worker
  uint32_t failed = 0;       // written by the GPU when a wait times out
  int32_t layer = 0;         // of the request in flight
  int32_t n_tokens = 0;
};

// The mailbox's arrays, each 64-byte aligned after the header: x [max_tokens][d] fp32, ids and weights
// [max_tokens][top_k] (an id < 0 is a slot the GPU computes), y [max_tokens][d] fp32.
struct HostMoeMailboxLayout {
  int64_t max_tokens = 0, d = 0, top_k = 0;

  static constexpr size_t align(size_t n) { return (n + 63) / 64 * 64; }
  size_t x_offset() const { return align(sizeof(HostMoeMailboxHeader)); }
  size_t ids_offset() const { return x_offset() + align(size_t(max_tokens) * d * sizeof(float)); }
  size_t weights_offset() const { return ids_offset() + align(size_t(max_tokens) * top_k * sizeof(int32_t)); }
  size_t y_offset() const { return weights_offset() + align(size_t(max_tokens) * top_k * sizeof(float)); }
  size_t nbytes() const { return y_offset() + align(size_t(max_tokens) * d * sizeof(float)); }
};

// Pointers into one mailbox (host or device addresses of the same bytes).
struct HostMoeMailbox {
  HostMoeMailboxHeader* header = nullptr;
  float* x = nullptr;
  int32_t* ids = nullptr;
  float* weights = nullptr;
  float* y = nullptr;
  HostMoeMailboxLayout layout;
};

inline HostMoeMailbox host_moe_mailbox_at(void* base, const HostMoeMailboxLayout& layout) {
  char* b = static_cast<char*>(base);
  HostMoeMailbox m;
  m.header = reinterpret_cast<HostMoeMailboxHeader*>(b);
  m.x = reinterpret_cast<float*>(b + layout.x_offset());
  m.ids = reinterpret_cast<int32_t*>(b + layout.ids_offset());
  m.weights = reinterpret_cast<float*>(b + layout.weights_offset());
  m.y = reinterpret_cast<float*>(b + layout.y_offset());
  m.layout = layout;
  return m;
}

}  // namespace spw
