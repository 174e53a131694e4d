#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#include "base/settings.h"

namespace spw {

namespace {

using Clock = std::chrono::steady_clock;

// The job word: generation (high 32 bits) | chunk count (16) | next unclaimed chunk (16).
constexpr int kNextBits = 16;
constexpr uint64_t kFieldMask = (uint64_t(1) << kNextBits) - 1;
uint32_t generation_of(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
size_t chunks_of(uint64_t w) { return static_cast<size_t>((w >> kNextBits) & kFieldMask); }
size_t next_of(uint64_t w) { return static_cast<size_t>(w & kFieldMask); }
uint64_t make_word(uint32_t generation, size_t chunks) {
  return (uint64_t(generation) << 32) | (uint64_t(chunks) << kNextBits);
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The pool whose job this thread is running (nested calls run inline).
thread_local const ThreadPool* tl_running_in = nullptr;

}  // namespace

ThreadPool::ThreadPool(size_t n_threads, int spin_us) : spin_us_(spin_us >= 0 ? spin_us : settings().cpu_spin_us) {
  if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  epoch_.fetch_add(1, std::memory_order_release);
  epoch_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain,
                              size_t chunks_per_thread) {
  if (n == 0) return;
  grain = std::max<size_t>(1, grain);
  const size_t chunks =
      std::min({size() * std::max<size_t>(1, chunks_per_thread), n / grain, size_t(kFieldMask)});
  if (chunks <= 1 || tl_running_in == this) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> lock(caller_, std::try_to_lock);
  if (!lock.owns_lock()) {  // another thread's job is running: do this one here rather than wait
    fn(0, n);
    return;
  }
  fn_ = &fn;
  n_ = n;
  chunks_done_.store(0, std::memory_order_relaxed);
  const uint32_t generation = generation_of(job_.load(std::memory_order_relaxed)) + 1;
  const uint64_t word = make_word(generation, chunks);
  job_.store(word, std::memory_order_release);
  epoch_.fetch_add(1, std::memory_order_release);
  epoch_.notify_all();

  const ThreadPool* outer = tl_running_in;  // a worker of another pool may call this one
  tl_running_in = this;
  run_chunks(word);
  tl_running_in = outer;

  // Wait for the chunks other threads claimed: poll for the spin budget, then sleep.
  const auto deadline = Clock::now() + std::chrono::microseconds(spin_us_);
  for (uint32_t i = 0;; ++i) {
    const uint32_t done = chunks_done_.load(std::memory_order_acquire);
    if (done == static_cast<uint32_t>(chunks)) break;
    if ((i & 63) == 63 && Clock::now() > deadline)
      chunks_done_.wait(done, std::memory_order_acquire);
    else
      cpu_relax();
  }
  fn_ = nullptr;
}

void ThreadPool::run_chunks(uint64_t word) {
  const uint32_t generation = generation_of(word);
  for (;;) {
    const size_t chunks = chunks_of(word), c = next_of(word);
    if (c >= chunks) return;
    if (!job_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
      if (generation_of(word) != generation) return;  // a newer job: not ours to touch
      continue;
    }
    // Chunk c is ours; the job cannot finish (nor fn_ change) until we count it done.
    (*fn_)(c * n_ / chunks, (c + 1) * n_ / chunks);
    if (chunks_done_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) chunks_done_.notify_all();
    word = job_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop() {
  tl_running_in = this;
  // Generation 0: no job exists before the constructor returns. (Reading the job word here instead lost the
  // first job for a worker that started after it was published: it took that job as seen and slept through it.)
  uint32_t seen = 0;
  for (;;) {
    auto deadline = Clock::now() + std::chrono::microseconds(spin_us_);
    uint64_t word = 0;
    for (uint32_t i = 0;; ++i) {
      if (stop_.load(std::memory_order_acquire)) return;
      word = job_.load(std::memory_order_acquire);
      if (generation_of(word) != seen) break;
      if ((i & 63) == 63 && Clock::now() > deadline) {
        // Sleep until the next job is published (read the epoch before re-checking the job: no lost wake-up).
        const uint32_t e = epoch_.load(std::memory_order_acquire);
        word = job_.load(std::memory_order_acquire);
        if (generation_of(word) != seen || stop_.load(std::memory_order_acquire)) continue;
        epoch_.wait(e, std::memory_order_acquire);
        deadline = Clock::now() + std::chrono::microseconds(spin_us_);
      } else {
        cpu_relax();
      }
    }
    seen = generation_of(word);
    run_chunks(word);
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
