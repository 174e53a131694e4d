// A fixed pool of worker threads for data-parallel loops on the CPU reference path.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace spw {

class ThreadPool {
 public:
  // n_threads == 0 picks std::thread::hardware_concurrency().
  explicit ThreadPool(size_t n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }

  // Calls fn(begin, end) on disjoint sub-ranges covering [0, n), in parallel, and waits.
  // The calling thread takes a share. Chunks hold at least `grain` items.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain = 1);

 private:
  void worker_loop(size_t index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0;
  size_t job_chunks_ = 0;
  size_t next_chunk_ = 0;
  size_t chunks_done_ = 0;
  size_t generation_ = 0;
  bool stop_ = false;
};

// The process-wide pool used by the reference ops (sized once at start-up).
ThreadPool& global_pool();
void set_global_pool_threads(size_t n_threads);

}  // namespace spw
