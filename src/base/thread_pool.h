// A fixed pool of worker threads for data-parallel loops on the CPU (reference ops, EXL3 CPU kernels,
// host experts, the quantizer).
//
// Why not a mutex and condition variable (the first version): the EXL3 CPU kernels make three pool calls
// per product and a MoE layer several products, each call 0.1–2 ms long. Every call woke every worker through
// a system call, and the woken workers then queued on one mutex. Here a call
// publishes its job in one atomic word; workers that finished a job moments ago are still spinning on that
// word and start at once, and only workers idle for longer than the spin budget sleep (C++20 atomic wait,
// a futex) and need the wake-up (bench_exl3_cpu_threads times the kernels with and without the spin; on the
// 2-core dev box the two are equal, fork/join 0.6–1.1 µs). Chunks are claimed by compare-and-swap on the same word, which carries the
// job's generation, so a worker that is late for one job can never run a chunk of the next one.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "base/settings.h"

namespace spw {

class ThreadPool {
 public:
  // n_threads == 0 picks std::thread::hardware_concurrency(). spin_us: how long an idle worker polls for
  // the next job before it sleeps (negative: settings().cpu_spin_us, SPILLWAY_CPU_SPIN_US, default kDefaultSpinUs).
  explicit ThreadPool(size_t n_threads = 0, int spin_us = -1);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }
  int spin_us() const { return spin_us_; }

  // Calls fn(begin, end) on disjoint sub-ranges covering [0, n), in parallel, and waits. The calling
  // thread takes a share. Chunks hold at least `grain` items; there are at most size() × chunks_per_thread
  // chunks (more than one per thread lets fast threads take over work of slow or late ones).
  // Called from inside one of this pool's jobs, or while another thread's call is running on this pool,
  // fn(0, n) runs on the calling thread: nesting and concurrent callers are safe, not parallel.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain = 1,
                    size_t chunks_per_thread = 1);

  static constexpr int kDefaultSpinUs = Settings{}.cpu_spin_us;

 private:
  void worker_loop();
  // Claims and runs chunks of the job in `word` until none is left or a newer job replaced it.
  void run_chunks(uint64_t word);

  std::vector<std::thread> workers_;
  int spin_us_ = kDefaultSpinUs;
  std::mutex caller_;                       // one parallel call at a time
  std::atomic<uint64_t> job_{0};            // generation (32 bits) | chunk count (16) | next unclaimed chunk (16)
  std::atomic<uint32_t> epoch_{0};          // bumped per job; sleeping workers wait on it
  std::atomic<uint32_t> chunks_done_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(size_t, size_t)>* fn_ = nullptr;  // stable while the job's chunks run
  size_t n_ = 0;
};

// The process-wide pool used by the reference ops (sized once at start-up).
ThreadPool& global_pool();
void set_global_pool_threads(size_t n_threads);

}  // namespace spw
