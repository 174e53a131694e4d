// bench_exl3_cpu_tiles: the cost of one 16×16 EXL3 tile in each CPU tile kernel, with the trellis hot in cache,
// one thread — the decode and accumulate work alone, without DRAM (bench_exl3_cpu measures whole products
// against the read bandwidth).
//
//   bench_exl3_cpu_tiles [k n]        (default 2048 2048: a 1.5 MB K = 3 trellis, resident in L2/L3)
//
// For K = 3 mul1 and mcg, m = 1, 4, 8, 10, 12, 16, 32, 64: ns per tile of every SIMD kernel this machine runs
// (exl3_tile_fn over the whole grid as one part) and, where AMX is ready, the top kernel with it on and off.
// Activations: constant 0.5 (the kernels' work does not depend on values). Timing: steady_clock over enough
// calls for ≥ 2 M tiles after one warm-up call; printed as a markdown table.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cpu/exl3_gemm.h"

namespace {

double ns_per_tile(const spw::detail::Exl3Part& p, spw::detail::Exl3TileFn fn) {
  const int64_t tiles = (p.tk1 - p.tk0) * (p.tn1 - p.tn0);
  fn(p, spw::Exl3Decode::kArith);
  const int64_t reps = 2000000 / tiles + 1;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < reps; ++r) fn(p, spw::Exl3Decode::kArith);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s / double(reps) / double(tiles) * 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t k = argc > 2 ? std::atoll(argv[1]) : 2048, n = argc > 2 ? std::atoll(argv[2]) : 2048;
  if (k <= 0 || n <= 0 || k % 128 || n % 128) {
    std::fprintf(stderr, "usage: bench_exl3_cpu_tiles [k n] (multiples of 128)\n");
    return 2;
  }
  const spw::CpuIsa top = spw::cpu_isa_detect();
  const bool amx = spw::detail::amx_ready();
  std::printf("# bench_exl3_cpu_tiles: %lldx%lld, K = 3, one thread, isa %s, AMX %s\n\n", static_cast<long long>(k),
              static_cast<long long>(n), spw::cpu_isa_name(top), amx ? "ready" : "not available");
  std::vector<uint16_t> trellis(static_cast<size_t>(k / 16) * (n / 16) * 48);
  std::mt19937 rng(1);
  for (auto& w : trellis) w = static_cast<uint16_t>(rng());
  std::printf("| cb | m |");
  for (int isa = 1; isa <= static_cast<int>(top); ++isa) std::printf(" %s |", spw::cpu_isa_name(spw::CpuIsa(isa)));
  if (amx) std::printf(" %s, AMX off |", spw::cpu_isa_name(top));
  std::printf("\n|---|---|");
  for (int isa = 1; isa <= static_cast<int>(top) + (amx ? 1 : 0); ++isa) std::printf("---|");
  std::printf("\n");
  for (spw::Exl3Codebook cb : {spw::Exl3Codebook::kMul1, spw::Exl3Codebook::kMcg}) {
    spw::Exl3Tensor t;
    t.k = k, t.n = n, t.bits.k_x2 = 6, t.codebook = cb, t.trellis = trellis.data();
    for (int64_t m : {1, 4, 8, 10, 12, 16, 32, 64}) {
      std::vector<float> xe(static_cast<size_t>(m) * (k / 16) * 32, 0.5f), u(static_cast<size_t>(m) * n);
      spw::detail::Exl3Part p{&t, xe.data(), m, 0, k / 16, 0, n / 16, u.data(), n};
      std::printf("| %s | %lld |", spw::exl3_codebook_name(cb), static_cast<long long>(m));
      for (int isa = 1; isa <= static_cast<int>(top); ++isa)
        std::printf(" %.1f |", ns_per_tile(p, spw::detail::exl3_tile_fn(spw::CpuIsa(isa))));
      if (amx) {
        p.amx = false;
        std::printf(" %.1f |", ns_per_tile(p, spw::detail::exl3_tile_fn(top)));
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}
