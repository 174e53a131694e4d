// The NCCL backend of comm/communicator.h: device buffers, every collective enqueued on the rank's CUDA
// stream (the caller's model stream), returning once it is enqueued.
//
// Process model: one process per host, one thread per GPU. A serve process owns the scheduler, the KV
// layer and the prefix cache; with tensor or expert parallelism its runner drives one GpuModel per GPU,
// each from its own thread, and they exchange activations through NCCL. So tokens and logits never cross
// a process boundary, and ncclCommInitAll builds the whole group without an out-of-band id exchange.
// Serving more than one host, or independent replicas, is separate processes (docs: replicas behind a
// load balancer).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"

namespace spw::comm {

// One communicator per entry of `devices` (CUDA device ordinals, distinct), rank i on devices[i] and
// enqueuing on streams[i] (created by the caller on that device). Errors: NCCL's, naming the call.
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(std::span<const int> devices,
                                                                   std::span<const cudaStream_t> streams);

}  // namespace spw::comm
