// The collectives tensor- and expert-parallel code talks to (docs/ARCHITECTURE.md: never NCCL directly).
// One Communicator per rank of a group; every rank of the group calls the same operations in the same
// order with the same sizes (a collective), each from its own thread.
//
// Two backends: NcclCommunicator (comm/nccl_communicator.h, device buffers, enqueued on a CUDA stream) and
// the loopback group (comm/loopback.h, host buffers, in-process threads), so every parallel code path runs
// in CI on the CPU.
//
// Results are deterministic and the same on every rank: sums add the ranks' values in rank order on the
// loopback backend; NCCL's ring/tree order is its own but fixed for a given communicator and size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "base/status.h"

namespace spw::comm {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;  // "loopback" or "nccl"

  // out[i] = Σ_r in_r[i], i < n; out may be in.
  virtual Status all_reduce(const float* in, float* out, size_t n) = 0;
  // out[r·n + i] = in_r[i]: every rank's n values, in rank order.
  virtual Status all_gather(const float* in, size_t n, float* out) = 0;
  // in: [size·n]; out[i] = Σ_r in_r[rank·n + i]: this rank's block of the sum.
  virtual Status reduce_scatter(const float* in, size_t n, float* out) = 0;
  // Personalised exchange with per-rank counts (expert-parallel dispatch and combine): rank r sends
  // send_counts[j] floats, starting at offset Σ_{k<j} send_counts[k] of `in`, to rank j, and receives
  // recv_counts[j] floats from rank j at offset Σ_{k<j} recv_counts[k] of `out`. recv_counts[j] must equal
  // rank j's send_counts[r] (each side knows its counts: exchange them first with all_gather).
  virtual Status all_to_all(const float* in, std::span<const size_t> send_counts, float* out,
                            std::span<const size_t> recv_counts) = 0;
};

}  // namespace spw::comm
