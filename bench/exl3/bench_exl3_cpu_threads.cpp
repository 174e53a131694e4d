// bench_exl3_cpu_threads: how the CPU EXL3 kernels scale with threads on this machine, and why not.
//
//   bench_exl3_cpu_threads [max_threads]      (default: all hardware threads)
//
// Prints the machine's CPU topology and CPU quota (what 'N cores' means in a VM or container), then for
// T = 1, 2, 4, ... up to max_threads (and max_threads itself), each with a fresh ThreadPool(T):
//   - read GB/s: the STREAM-like sum of bench_exl3_cpu;
//   - compute ×: T chunks of a fixed register-only FMA loop, one per thread, time ÷ the time at T = 1.
//     1.0 means T independent cores; ~2 means pairs of threads share a core (SMT) or a CPU quota binds;
//   - fork/join µs: a job of T chunks that each busy-wait 20 µs, minus 20 µs;
//   - exl3_matmul_cpu 8192² K = 3 mul1, m = 1 and exl3_moe_cpu for one V4.1 layer (6 experts × 1 token):
//     µs, speed-up over T = 1, trellis GB/s, % of the same T's read bandwidth.
// Then the two EXL3 rows again at max_threads with the pool's spin budget 0 (workers sleep between calls)
// and with 4 parts of the tile grid per thread (over-decomposition, for unequal threads): what each is worth;
// and with the approximate int16-activation kernel (Exl3Activations::kInt16) where the machine runs it. Why: on the H200 host (bench/results/exl3_h200.md) 16 threads ran 8192² m = 1 only
// 1.74× faster than the 2-core dev box; this separates core count, SMT, quota, fork/join and memory.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "base/thread_pool.h"
#include "cpu/exl3_gemm.h"
#include "cpu/exl3_moe.h"
#include "cpu_bench_util.h"
#include "formats/exl3.h"

namespace {

using spw::Exl3Codebook;
using spw::Exl3Tensor;
using namespace spw::bench;

std::string first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return "(not readable)";
  return line;
}

// The value after ':' on the first line of `path` that starts with `key`.
std::string field(const char* path, const char* key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return line.substr(line.find(':') + 2);
  return "(not found)";
}

// Lines that tell what 'N hardware threads' means here: SMT siblings, the CPUs this process may use, and a
// CPU quota (cgroup v2 cpu.max, or v1 cfs quota/period) that can bind before the core count does.
void print_topology() {
  std::printf("CPU: %s; %u hardware threads, cpu MHz %s\n", field("/proc/cpuinfo", "model name").c_str(),
              std::thread::hardware_concurrency(), field("/proc/cpuinfo", "cpu MHz").c_str());
  std::printf("cpu0 SMT siblings %s; cpu%u siblings %s; allowed CPUs %s\n",
              first_line("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list").c_str(),
              std::thread::hardware_concurrency() - 1,
              first_line(("/sys/devices/system/cpu/cpu" + std::to_string(std::thread::hardware_concurrency() - 1) +
                          "/topology/thread_siblings_list").c_str()).c_str(),
              field("/proc/self/status", "Cpus_allowed_list").c_str());
  std::printf("CPU quota: cgroup v2 cpu.max %s; v1 cfs quota %s / period %s µs\n\n",
              first_line("/sys/fs/cgroup/cpu.max").c_str(), first_line("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").c_str(),
              first_line("/sys/fs/cgroup/cpu/cpu.cfs_period_us").c_str());
}

// A register-only FMA loop (16 independent chains): the same work per call whatever the thread count.
float fma_work(int iters, float seed) {
  float a[16];
  for (int j = 0; j < 16; ++j) a[j] = seed + j;
  for (int i = 0; i < iters; ++i)
    for (int j = 0; j < 16; ++j) a[j] = a[j] * 0.99999f + 1e-5f;
  float s = 0;
  for (float v : a) s += v;
  return s;
}

// Seconds for T chunks of fma_work(iters) on a pool of T threads (best of 5).
double compute_seconds(spw::ThreadPool& pool, int iters) {
  std::vector<float> sink(pool.size() * 16);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    pool.parallel_for(pool.size(), [&](size_t a, size_t b) {
      for (size_t i = a; i < b; ++i) sink[i * 16] = fma_work(iters, float(i));
    });
    best = std::min(best, seconds_since(t0));
  }
  if (sink[0] == 42) std::printf(" ");
  return best;
}

// Microseconds of fork/join: T chunks each busy for 20 µs, median of 200 jobs, minus 20 µs.
double fork_join_us(spw::ThreadPool& pool) {
  std::vector<double> t;
  for (int rep = 0; rep < 200; ++rep) {
    const auto t0 = Clock::now();
    pool.parallel_for(pool.size(), [&](size_t, size_t) {
      const auto s = Clock::now();
      while (seconds_since(s) < 20e-6) {}
    });
    t.push_back(seconds_since(t0) * 1e6 - 20);
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

struct Exl3Case {
  std::vector<Exl3Tensor> w;  // one 8192² tensor, then 6 experts × (w1, w3, w2)
  std::vector<spw::Exl3ExpertWeights> experts;
  size_t dense_bytes = 0, moe_bytes = 0;
};

Exl3Case make_case() {
  Exl3Case c;
  c.w.reserve(19);
  c.w.push_back(make_tensor(8192, 8192, 6, Exl3Codebook::kMul1, 7));
  for (int e = 0; e < 6; ++e) {
    c.w.push_back(make_tensor(5120, 2304, 6, Exl3Codebook::kMul1, 100 + 3 * e));
    c.w.push_back(make_tensor(5120, 2304, 6, Exl3Codebook::kMul1, 101 + 3 * e));
    c.w.push_back(make_tensor(2304, 5120, 6, Exl3Codebook::kMul1, 102 + 3 * e));
  }
  for (int e = 0; e < 6; ++e) c.experts.push_back({&c.w[1 + 3 * e], &c.w[2 + 3 * e], &c.w[3 + 3 * e]});
  c.dense_bytes = c.w[0].trellis_nbytes();
  for (size_t i = 1; i < c.w.size(); ++i) c.moe_bytes += c.w[i].trellis_nbytes();
  return c;
}

struct Exl3Times {
  double dense_s, moe_s;
};

Exl3Times time_exl3(Exl3Case& c, Pool& words, spw::ThreadPool& pool, const spw::Exl3CpuOptions& opt = {}) {
  static std::vector<float> x(8192, 0.01f), y(8192);
  static std::vector<float> out(5120);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  const int32_t ids[6] = {0, 1, 2, 3, 4, 5};
  const float wts[6] = {1.f / 6, 1.f / 6, 1.f / 6, 1.f / 6, 1.f / 6, 1.f / 6};
  Exl3Times t{};
  t.dense_s = time_calls([&] {
    c.w[0].trellis = words.take(c.w[0].trellis_nbytes() / 2);
    spw::exl3_matmul_cpu_opts(opt, c.w[0], x.data(), 1, y.data(), &pool);
  });
  t.moe_s = time_calls([&] {
    for (size_t i = 1; i < c.w.size(); ++i) c.w[i].trellis = words.take(c.w[i].trellis_nbytes() / 2);
    spw::exl3_moe_cpu(c.experts.data(), 6, x.data(), 1, ids, wts, 6, 10.0f, out.data(), &pool, opt);
  });
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t max_threads = argc > 1 ? std::max<size_t>(1, std::strtoul(argv[1], nullptr, 10)) : hw;
  std::printf("# bench_exl3_cpu_threads: 1..%zu threads, isa %s\n\n", max_threads,
              spw::cpu_isa_name(spw::cpu_isa_detect()));
  print_topology();

  std::vector<size_t> counts;
  for (size_t t = 1; t < max_threads; t *= 2) counts.push_back(t);
  counts.push_back(max_threads);

  Pool words(size_t(512) << 20);
  Exl3Case c = make_case();
  // Calibrate the compute loop to ~2 ms on one thread.
  int iters = 1 << 16;
  {
    spw::ThreadPool one(1);
    while (compute_seconds(one, iters) < 2e-3) iters *= 2;
  }

  std::printf("| threads | read GB/s | compute × (1.0 = own core) | fork/join µs | 8192² m=1 µs | speed-up | "
              "GB/s | %% of read | MoE 6×1 µs | speed-up | GB/s | %% of read |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  double compute1 = 0, dense1 = 0, moe1 = 0;
  double bw_max = 0;
  for (size_t T : counts) {
    spw::ThreadPool pool(T);
    const double bw = read_bandwidth_gbs(pool);
    const double comp = compute_seconds(pool, iters);
    const double fj = T > 1 ? fork_join_us(pool) : 0.0;
    const Exl3Times e = time_exl3(c, words, pool);
    if (T == 1) {
      compute1 = comp;
      dense1 = e.dense_s;
      moe1 = e.moe_s;
    }
    bw_max = bw;
    const double dgb = c.dense_bytes / e.dense_s / 1e9, mgb = c.moe_bytes / e.moe_s / 1e9;
    std::printf("| %zu | %.1f | %.2f | %.1f | %.0f | %.2f | %.2f | %.1f%% | %.0f | %.2f | %.2f | %.1f%% |\n", T, bw,
                comp / compute1, fj, e.dense_s * 1e6, dense1 / e.dense_s, dgb, 100 * dgb / bw, e.moe_s * 1e6,
                moe1 / e.moe_s, mgb, 100 * mgb / bw);
    std::fflush(stdout);
  }

  auto report = [&](const char* what, const Exl3Times& e) {
    std::printf("- %s: 8192² m=1 %.0f µs (%.2f GB/s), MoE 6×1 %.0f µs (%.2f GB/s)\n", what, e.dense_s * 1e6,
                c.dense_bytes / e.dense_s / 1e9, e.moe_s * 1e6, c.moe_bytes / e.moe_s / 1e9);
  };
  std::printf("\nAt %zu threads (read bandwidth %.1f GB/s), against the defaults above (spin %d µs, parts per "
              "thread %d):\n", max_threads, bw_max, spw::ThreadPool::kDefaultSpinUs, spw::Exl3CpuOptions{}.parts_per_thread);
  {
    spw::ThreadPool sleepy(max_threads, 0);
    report("spin 0 (workers sleep between calls)", time_exl3(c, words, sleepy));
  }
  spw::ThreadPool pool(max_threads);
  spw::Exl3CpuOptions more_parts;
  more_parts.parts_per_thread = 4;
  report("4 parts per thread", time_exl3(c, words, pool, more_parts));
  if (spw::detail::exl3_int16_ready()) {
    spw::Exl3CpuOptions int16;
    int16.activations = spw::Exl3Activations::kInt16;
    report("int16 activations (approximate)", time_exl3(c, words, pool, int16));
  }
  return 0;
}
