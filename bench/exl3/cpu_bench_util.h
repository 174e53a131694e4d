// Helpers shared by the CPU EXL3 benchmarks (bench_exl3_cpu, bench_exl3_cpu_threads): wall-clock timing,
// the STREAM-like read bandwidth, a pool of random trellis words (a fresh copy per call, no cache reuse)
// and random EXL3 tensors over it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "base/thread_pool.h"
#include "formats/exl3.h"

namespace spw::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline double read_bandwidth_gbs(spw::ThreadPool& pool) {
  const size_t n = (size_t(1) << 30) / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  pool.parallel_for(n, [&](size_t a, size_t b) {
    for (size_t i = a; i < b; ++i) buf[i] = i;
  });
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<uint64_t> partial(pool.size() * 8, 0);
    auto t0 = Clock::now();
    pool.parallel_for(n / 8, [&](size_t a, size_t b) {
      uint64_t s[8] = {};
      for (size_t i = a; i < b; ++i)
        for (int j = 0; j < 8; ++j) s[j] += buf[8 * i + j];
      uint64_t tot = 0;
      for (uint64_t v : s) tot += v;
      partial[(a * pool.size() / (n / 8)) * 8] += tot;
    });
    const double dt = seconds_since(t0);
    uint64_t sum = 0;
    for (uint64_t v : partial) sum += v;
    if (sum == 42) std::printf(" ");  // keeps the sum alive
    best = std::max(best, double(n * sizeof(uint64_t)) / dt / 1e9);
  }
  return best;
}

// Random trellis pool; tensors are views at rotating offsets.
struct Pool {
  std::vector<uint16_t> words;
  size_t next = 0;
  explicit Pool(size_t nbytes) : words(nbytes / 2) {
    uint64_t s = 12345;
    for (size_t i = 0; i + 4 <= words.size(); i += 4) {
      uint64_t r = splitmix(s);
      for (int j = 0; j < 4; ++j) words[i + j] = static_cast<uint16_t>(r >> (16 * j));
    }
  }
  const uint16_t* take(size_t n_words) {
    if (next + n_words > words.size()) next = 0;
    const uint16_t* p = words.data() + next;
    next += (n_words + 31) & ~size_t(31);  // 64-byte steps
    return p;
  }
};

inline spw::Exl3Tensor make_tensor(int64_t k, int64_t n, int k_x2, spw::Exl3Codebook cb, uint64_t seed) {
  spw::Exl3Tensor t;
  t.name = "bench";
  t.k = k;
  t.n = n;
  t.bits.k_x2 = k_x2;
  t.codebook = cb;
  t.suh.resize(k);
  t.svh.resize(n);
  for (auto& v : t.suh) v = spw::exl3_f64_to_f16(((splitmix(seed) & 1) ? 1 : -1) * 0.03);
  for (auto& v : t.svh) v = spw::exl3_f64_to_f16(((splitmix(seed) & 1) ? 1 : -1) * 1.0);
  return t;
}

// Calls fn(copy) with a fresh trellis copy each time; returns seconds per call.
template <class Fn>
double time_calls(Fn&& fn) {
  fn();
  int calls = 0;
  auto t0 = Clock::now();
  double dt = 0;
  while (calls < 3 || dt < 0.15) {
    fn();
    ++calls;
    dt = seconds_since(t0);
  }
  return dt / calls;
}

}  // namespace spw::bench
