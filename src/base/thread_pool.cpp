#include "base/thread_pool.h"

#include <algorithm>
#include <memory>

namespace spw {

ThreadPool::ThreadPool(size_t n_threads) {
  if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain) {
  if (n == 0) return;
  grain = std::max<size_t>(1, grain);
  size_t chunks = std::min(size(), (n + grain - 1) / grain);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  job_ = &fn;
  job_n_ = n;
  job_chunks_ = chunks;
  next_chunk_ = 0;
  chunks_done_ = 0;
  ++generation_;
  wake_.notify_all();
  // The caller works too.
  while (next_chunk_ < job_chunks_) {
    size_t c = next_chunk_++;
    lock.unlock();
    fn(c * job_n_ / job_chunks_, (c + 1) * job_n_ / job_chunks_);
    lock.lock();
    ++chunks_done_;
  }
  done_.wait(lock, [this] { return chunks_done_ == job_chunks_; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(size_t) {
  size_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ && next_chunk_ < job_chunks_); });
    if (stop_) return;
    seen = generation_;
    while (job_ && next_chunk_ < job_chunks_) {
      size_t c = next_chunk_++;
      auto* fn = job_;
      size_t n = job_n_, chunks = job_chunks_;
      lock.unlock();
      (*fn)(c * n / chunks, (c + 1) * n / chunks);
      lock.lock();
      if (++chunks_done_ == job_chunks_) done_.notify_all();
    }
  }
}

namespace {
std::unique_ptr<ThreadPool>& pool_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
}  // namespace

ThreadPool& global_pool() {
  auto& p = pool_slot();
  if (!p) p = std::make_unique<ThreadPool>();
  return *p;
}

void set_global_pool_threads(size_t n_threads) { pool_slot() = std::make_unique<ThreadPool>(n_threads); }

}  // namespace spw
