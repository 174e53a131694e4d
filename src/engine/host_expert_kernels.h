// The GPU side of the host-expert mailbox (cpu/host_moe_mailbox.h): kernels that post one MoE layer's
// CPU-placed slots to the CPU worker and add its answer back, on the stream, with no host synchronization
// (CUDA-graph capturable; the sequence numbers live in the mailbox, so a replayed graph posts fresh ones).
// Plain <<<>>> launches: each is an ordinary stream dependency of its neighbours (cuda/launch.h).
// Tests: tests/gpu/test_engine_spill.cpp (through the forward).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "cpu/host_moe_mailbox.h"

namespace spw::engine {

// box: device addresses of the mailbox. For every token t < n and slot j < top_k with e = experts[t·K + j]:
//   on_cpu[e] → box.ids = e, gpu_experts = −1;  else box.ids = −1, gpu_experts = e  (e < 0 stays −1 in both).
// x [n][d] and weights [n][K] are copied into the mailbox, then the request is published.
// n ≤ box.layout.max_tokens (checked).
Status host_moe_post_cuda(const HostMoeMailbox& box, int layer, const float* x, const int32_t* experts,
                          const float* weights, const uint8_t* on_cpu, int n, int top_k, int32_t* gpu_experts,
                          cudaStream_t stream);

// Waits for the worker's answer to the last post, then acc [n][d] += y. After timeout_ns without an answer
// the wait gives up: header.failed = 1 and acc is left as it is.
Status host_moe_collect_cuda(const HostMoeMailbox& box, float* acc, int n, uint64_t timeout_ns, cudaStream_t stream);

}  // namespace spw::engine
