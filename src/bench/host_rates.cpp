#include "bench/host_rates.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace spw::bench {

double measure_host_read_bandwidth(size_t nbytes, int threads, int iters) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  const size_t words = nbytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buf(new uint64_t[words]);
  const size_t share = (words / size_t(threads)) / 8 * 8;
  std::atomic<uint64_t> sink{0};
  double best = 1e30;
  for (int it = 0; it < std::max(1, iters) + 1; ++it) {  // the first pass fills the pages and is not timed
    std::vector<std::thread> pool;
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::chrono::steady_clock::time_point t0;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        uint64_t* p = buf.get() + size_t(t) * share;
        if (it == 0) {
          for (size_t i = 0; i < share; ++i) p[i] = i * 0x9E3779B97F4A7C15ull;
          return;
        }
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) {
        }
        uint64_t a[8] = {};
        for (size_t i = 0; i < share; i += 8)
          for (int k = 0; k < 8; ++k) a[k] += p[i + k];
        sink.fetch_add(a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7], std::memory_order_relaxed);
      });
    if (it > 0) {
      while (ready.load() < threads) {
      }
      t0 = std::chrono::steady_clock::now();
      go.store(true, std::memory_order_release);
    }
    for (auto& th : pool) th.join();
    if (it > 0) best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return double(share * size_t(threads) * sizeof(uint64_t)) / best;
}

}  // namespace spw::bench
