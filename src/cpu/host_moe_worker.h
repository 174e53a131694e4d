// The CPU side of the host-expert runtime: a thread that serves a HostMoeMailbox (cpu/host_moe_mailbox.h).
// For each request it computes, over the slots whose id is ≥ 0 (the experts placed on the CPU),
//   y[t] = Σ_slots weight · (silu(min(x[t]·W1_e, L)) · clamp(x[t]·W3_e, ±L)) · W2_e     (exl3_moe_cpu)
// into the mailbox's y (zeroed first), on its own thread pool, and marks the request done.
//
// Polling: the thread spins on the mailbox for `spin_us` after its last request (a decode step's layers
// arrive every few hundred µs), then sleeps `idle_sleep_us` between looks, so an idle server costs no core.
// Contract: layers[l][e] names expert e of layer l where it is on the CPU (null elsewhere); a request
// naming a null expert or a layer out of range is a bug of the poster, answered with y = 0 and counted in
// bad_requests() (never a crash of the server thread). The mailbox memory outlives the worker.
// Tests: tests/unit/test_host_moe_worker.cpp (a thread plays the GPU).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "base/thread_pool.h"
#include "cpu/exl3_moe.h"
#include "cpu/host_moe_mailbox.h"

namespace spw {

struct HostMoeWorkerOptions {
  int n_threads = 0;         // the worker's pool (0: the machine's hardware threads)
  int spin_us = 2000;        // busy polling after a request
  int idle_sleep_us = 100;   // between polls once idle
  float swiglu_limit = 0.f;  // L above (≤ 0: no clamp)
  Exl3CpuOptions kernel;     // exl3_moe_cpu's options (e.g. the approximate int16 activations)
};

class HostMoeWorker {
 public:
  HostMoeWorker(const HostMoeMailbox& box, std::vector<std::vector<Exl3ExpertWeights>> layers,
                const HostMoeWorkerOptions& options);
  ~HostMoeWorker();  // stops the thread (a request in flight is finished first)
  HostMoeWorker(const HostMoeWorker&) = delete;
  HostMoeWorker& operator=(const HostMoeWorker&) = delete;

  uint64_t requests_served() const { return served_.load(std::memory_order_relaxed); }
  uint64_t bad_requests() const { return bad_.load(std::memory_order_relaxed); }
  // Seconds spent computing requests (the CPU tier's busy time, for /metrics and benchmarks).
  double busy_seconds() const { return double(busy_ns_.load(std::memory_order_relaxed)) * 1e-9; }

 private:
  void loop();
  void serve(uint32_t seq);

  HostMoeMailbox box_;
  std::vector<std::vector<Exl3ExpertWeights>> layers_;
  HostMoeWorkerOptions options_;
  std::unique_ptr<ThreadPool> pool_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> served_{0}, bad_{0}, busy_ns_{0};
  std::thread thread_;
};

}  // namespace spw
