// ThreadPool: every index of [0, n) runs exactly once, for any thread count, grain and chunking; jobs
// published back to back never mix (a late worker must not run a chunk of the next job); nested and
// concurrent callers are served; sleeping workers (spin budget 0) are woken and joined.
#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace spw {
namespace {

// Runs one parallel_for over n items and checks each index was visited exactly once.
void expect_exact_cover(ThreadPool& pool, size_t n, size_t grain, size_t chunks_per_thread) {
  std::vector<std::atomic<int>> hits(n);
  for (auto& h : hits) h.store(0);
  std::atomic<size_t> calls{0};
  pool.parallel_for(n, [&](size_t a, size_t b) {
    ASSERT_LT(a, b);
    ASSERT_LE(b, n);
    calls.fetch_add(1);
    for (size_t i = a; i < b; ++i) hits[i].fetch_add(1);
  }, grain, chunks_per_thread);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i << " of " << n;
  EXPECT_LE(calls.load(), pool.size() * chunks_per_thread);
  if (n > 0) {
    EXPECT_GE(calls.load(), 1u);
  }
}

TEST(ThreadPool, CoversEveryIndexOnce) {
  for (size_t threads : {1, 2, 3, 8})
    for (int spin : {0, 200}) {
      ThreadPool pool(threads, spin);
      EXPECT_EQ(pool.size(), threads);
      for (size_t n : {0, 1, 2, 7, 64, 1000, 4097})
        for (size_t grain : {1, 3, 100})
          for (size_t cpt : {1, 4}) expect_exact_cover(pool, n, grain, cpt);
    }
}

TEST(ThreadPool, GrainBoundsTheChunkCount) {
  ThreadPool pool(4, 0);
  std::atomic<size_t> calls{0}, min_len{~size_t(0)};
  pool.parallel_for(1000, [&](size_t a, size_t b) {
    calls.fetch_add(1);
    size_t cur = min_len.load();
    while (b - a < cur && !min_len.compare_exchange_weak(cur, b - a)) {}
  }, 300);
  EXPECT_LE(calls.load(), 1000u / 300);
  EXPECT_GE(min_len.load(), 300u);
}

TEST(ThreadPool, HugeChunkRequestsAreCapped) {
  ThreadPool pool(2, 0);
  std::atomic<size_t> calls{0}, covered{0};
  pool.parallel_for(200000, [&](size_t a, size_t b) {
    calls.fetch_add(1);
    covered.fetch_add(b - a);
  }, 1, 1000000);
  EXPECT_EQ(covered.load(), 200000u);
  EXPECT_LE(calls.load(), 65535u);
}

// Many short jobs back to back, each writing its own job number: a chunk run under the wrong job (a stale
// claim) would leave a slot with another number.
TEST(ThreadPool, BackToBackJobsNeverMix) {
  for (int spin : {0, 50, 1000}) {
    ThreadPool pool(4, spin);
    std::vector<uint32_t> slot(64);
    for (uint32_t job = 1; job <= 5000; ++job) {
      pool.parallel_for(slot.size(), [&, job](size_t a, size_t b) {
        for (size_t i = a; i < b; ++i) slot[i] = job;
      }, 1, 4);
      for (size_t i = 0; i < slot.size(); ++i) ASSERT_EQ(slot[i], job) << "slot " << i << ", spin " << spin;
    }
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(4, 100);
  std::vector<std::atomic<int>> hits(32 * 16);
  for (auto& h : hits) h.store(0);
  pool.parallel_for(32, [&](size_t a, size_t b) {
    for (size_t i = a; i < b; ++i)
      pool.parallel_for(16, [&, i](size_t c, size_t d) {
        for (size_t j = c; j < d; ++j) hits[i * 16 + j].fetch_add(1);
      });
  });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(ThreadPool, ConcurrentCallersAllComplete) {
  ThreadPool pool(3, 100);
  constexpr int kCallers = 4, kJobs = 300;
  std::vector<std::atomic<uint64_t>> sums(kCallers);
  for (auto& s : sums) s.store(0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c)
    callers.emplace_back([&, c] {
      for (int j = 0; j < kJobs; ++j)
        pool.parallel_for(100, [&](size_t a, size_t b) {
          uint64_t s = 0;
          for (size_t i = a; i < b; ++i) s += i;
          sums[c].fetch_add(s);
        });
    });
  for (auto& t : callers) t.join();
  for (auto& s : sums) EXPECT_EQ(s.load(), uint64_t(kJobs) * (99 * 100 / 2));
}

// A job of one chunk per thread in which every chunk waits (up to 10 s) until all threads have arrived: it
// completes in time only if every worker takes part. Returns whether all arrived.
bool all_threads_join(ThreadPool& pool) {
  const size_t n = pool.size();
  std::atomic<size_t> arrived{0};
  std::atomic<bool> timed_out{false};
  pool.parallel_for(n, [&](size_t, size_t) {
    arrived.fetch_add(1);
    const auto t0 = std::chrono::steady_clock::now();
    while (arrived.load() < n) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) {
        timed_out = true;
        return;
      }
      std::this_thread::yield();
    }
  });
  return !timed_out && arrived.load() == n;
}

// Workers that went to sleep (no spin budget, a pause between jobs) take part again once woken.
TEST(ThreadPool, SleepingWorkersWakeForTheNextJob) {
  ThreadPool pool(4, 0);
  for (int round = 0; round < 20; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_TRUE(all_threads_join(pool)) << "round " << round;
  }
}

// A job published before a worker thread has even started must still reach it (a worker that took the
// current job word as already seen at start-up slept through the first job: ctest -j2).
TEST(ThreadPool, WorkersThatStartLateTakeTheFirstJob) {
  for (int i = 0; i < 200; ++i) {
    ThreadPool pool(4, i % 2 ? 0 : 100);
    ASSERT_TRUE(all_threads_join(pool)) << "pool " << i;
  }
}

}  // namespace
}  // namespace spw
