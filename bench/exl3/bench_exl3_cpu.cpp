// bench_exl3_cpu: EXL3 x·W on the CPU against the machine's own read bandwidth, in one run.
//
//   bench_exl3_cpu [threads]        (default: all hardware threads)
//
// 1. Read bandwidth: all threads sum a 1 GiB buffer (best of 3) — the roofline for streaming trellis.
// 1b. The fp16 → fp32 conversion of one V4.1 expert tensor's factors: one value at a time vs f16_to_f32_n.
// 2. exl3_matmul_cpu (default ISA and decode) at K = 2, 3, 4 × {mul1, mcg} on 8192×8192 and the V4.1
//    expert shapes 5120×2304 (w1/w3) and 2304×5120 (w2), m = 1, 4, 16, 64: µs per call, trellis GB/s,
//    % of the measured read bandwidth.
// 2b. Where AMX is used (m ≥ kAmxMinTokens), the same kernel with it off at m = 16 and 64; then the lower SIMD kernels this machine also runs (AVX2, AVX-512 below AVX-512 FP16) on the same K = 3
//    tensors, for a same-run comparison.
// 3. Decode modes side by side (arithmetic vs 65,536-entry table) at K = 3, m = 1 and 16.
// 3b. Where the machine runs it, the approximate int16-activation kernel (K = 3 mul1, m = 1, 4, 8).
// 4. exl3_moe_cpu for one V4.1 layer: 6 experts × 1 token (K = 3 mul1), and 6 experts × 8 tokens; exact,
//    then with int16 activations where the machine runs them.
// Tensors: random trellis words (any bit pattern is a valid trellis), fixed seed, no files. Every call
// reads a different copy of the trellis from a 512 MiB pool (no cache reuse between calls). Timing:
// wall clock over repeated calls until ≥ 0.15 s (at least 3 calls) after one warm-up call.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "base/thread_pool.h"
#include "cpu/exl3_gemm.h"
#include "cpu/exl3_moe.h"
#include "formats/dtypes.h"
#include "formats/exl3.h"
#include "cpu_bench_util.h"

namespace {

using spw::Exl3Codebook;
using spw::Exl3Tensor;
using namespace spw::bench;

}  // namespace

int main(int argc, char** argv) {
  const size_t threads = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : std::max(1u, std::thread::hardware_concurrency());
  spw::ThreadPool pool(threads);
  const auto t_start = Clock::now();
  const spw::CpuIsa isa = spw::cpu_isa_detect();
  std::printf("# bench_exl3_cpu: %zu threads, isa %s\n\n", pool.size(), spw::cpu_isa_name(isa));
  const double bw = read_bandwidth_gbs(pool);
  std::printf("read bandwidth (sum over 1 GiB, %zu threads, best of 3): %.1f GB/s\n\n", pool.size(), bw);

  // The per-call factor conversion (suh + svh of one V4.1 expert tensor, 5120 + 2304 fp16 values): one value
  // at a time through exl3_f16_to_f32 (what every product did before f16_to_f32_n) and f16_to_f32_n (F16C).
  {
    std::vector<uint16_t> h(5120 + 2304);
    for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(0x3000 + (i * 37) % 0x3000);
    std::vector<float> f(h.size());
    const double scalar = time_calls([&] {
      for (size_t i = 0; i < h.size(); ++i) f[i] = spw::exl3_f16_to_f32(h[i]);
    });
    const double batch = time_calls([&] { spw::f16_to_f32_n(h.data(), f.data(), h.size()); });
    std::printf("fp16 factors of one V4.1 expert tensor (7424 values) to fp32: %.2f µs one at a time, %.2f µs "
                "batched (F16C where present)\n\n", scalar * 1e6, batch * 1e6);
  }

  Pool tp(size_t(512) << 20);
  std::vector<float> x(64 * 8192), y(64 * 8192);
  uint64_t s = 99;
  for (auto& v : x) v = static_cast<float>((splitmix(s) >> 40) * 0x1p-24 - 0.5);

  struct Shape { const char* name; int64_t k, n; };
  const Shape shapes[] = {{"dense", 8192, 8192}, {"v41_w13", 5120, 2304}, {"v41_w2", 2304, 5120}};
  auto run_one = [&](const Shape& sh, int K, Exl3Codebook cb, int64_t m, spw::Exl3Decode dec,
                     spw::CpuIsa run_isa, bool amx = true) {
    Exl3Tensor t = make_tensor(sh.k, sh.n, 2 * K, cb, 7);
    spw::Exl3CpuOptions opt;
    opt.isa = run_isa;
    opt.amx = amx;
    opt.decode = dec;
    const double sec = time_calls([&] {
      t.trellis = tp.take(t.trellis_nbytes() / 2);
      spw::exl3_matmul_cpu_opts(opt, t, x.data(), m, y.data(), &pool);
    });
    const double gbs = double(t.trellis_nbytes()) / sec / 1e9;
    std::printf("| %s | %d | %s | %lldx%lld | %lld | %.0f | %.2f | %.1f%% |\n", sh.name, K, spw::exl3_codebook_name(cb),
                static_cast<long long>(sh.k), static_cast<long long>(sh.n), static_cast<long long>(m), sec * 1e6, gbs,
                100.0 * gbs / bw);
    std::fflush(stdout);
  };

  std::printf("## exl3_matmul_cpu (decode: arith)\n\n");
  std::printf("| tensor | K | cb | k×n | m | µs | trellis GB/s | %% of read bw |\n|---|---|---|---|---|---|---|---|\n");
  for (const Shape& sh : shapes)
    for (int K : {2, 3, 4})
      for (Exl3Codebook cb : {Exl3Codebook::kMul1, Exl3Codebook::kMcg})
        for (int64_t m : {1, 4, 16, 64}) run_one(sh, K, cb, m, spw::Exl3Decode::kArith, isa);

  // Same process, same tensors: the top kernel without AMX (where it has it), then each lower SIMD kernel
  // this machine runs, so ISA gains are read within one run.
  if (spw::detail::amx_ready()) {
    std::printf("\n## the %s kernel without AMX, m ≥ %lld (K = 3, decode: arith)\n\n", spw::cpu_isa_name(isa),
                static_cast<long long>(spw::detail::kAmxMinTokens));
    std::printf("| tensor | K | cb | k×n | m | µs | trellis GB/s | %% of read bw |\n|---|---|---|---|---|---|---|---|\n");
    for (const Shape& sh : shapes)
      for (Exl3Codebook cb : {Exl3Codebook::kMul1, Exl3Codebook::kMcg})
        for (int64_t m : {16, 64}) run_one(sh, 3, cb, m, spw::Exl3Decode::kArith, isa, false);
  }
  for (int lower = static_cast<int>(spw::CpuIsa::kAvx2); lower < static_cast<int>(isa); ++lower) {
    const auto li = static_cast<spw::CpuIsa>(lower);
    std::printf("\n## the %s kernel on the same tensors (K = 3, decode: arith)\n\n", spw::cpu_isa_name(li));
    std::printf("| tensor | K | cb | k×n | m | µs | trellis GB/s | %% of read bw |\n|---|---|---|---|---|---|---|---|\n");
    for (const Shape& sh : shapes)
      for (Exl3Codebook cb : {Exl3Codebook::kMul1, Exl3Codebook::kMcg})
        for (int64_t m : {1, 4, 16, 64}) run_one(sh, 3, cb, m, spw::Exl3Decode::kArith, li);
  }

  std::printf("\n## decode modes (K = 3): table lookup (gather)\n\n");
  std::printf("| tensor | K | cb | k×n | m | µs | trellis GB/s | %% of read bw |\n|---|---|---|---|---|---|---|---|\n");
  for (const Shape& sh : shapes)
    for (Exl3Codebook cb : {Exl3Codebook::kMul1, Exl3Codebook::kMcg})
      for (int64_t m : {1, 16}) run_one(sh, 3, cb, m, spw::Exl3Decode::kLut, isa);

  // The approximate int16-activation kernel (Exl3Activations::kInt16, MUL1 only), where the machine runs it.
  if (spw::detail::exl3_int16_ready()) {
    std::printf("\n## int16 activations (Exl3Activations::kInt16, approximate: ~2e-4 relative error), K = 3 mul1\n\n");
    std::printf("| tensor | K | cb | k×n | m | µs | trellis GB/s | %% of read bw |\n|---|---|---|---|---|---|---|---|\n");
    for (const Shape& sh : shapes)
      for (int64_t m : {1, 4, 8}) {
        Exl3Tensor t = make_tensor(sh.k, sh.n, 6, Exl3Codebook::kMul1, 7);
        spw::Exl3CpuOptions opt;
        opt.activations = spw::Exl3Activations::kInt16;
        const double sec = time_calls([&] {
          t.trellis = tp.take(t.trellis_nbytes() / 2);
          spw::exl3_matmul_cpu_opts(opt, t, x.data(), m, y.data(), &pool);
        });
        const double gbs = double(t.trellis_nbytes()) / sec / 1e9;
        std::printf("| %s | 3 | mul1 | %lldx%lld | %lld | %.0f | %.2f | %.1f%% |\n", sh.name, static_cast<long long>(sh.k),
                    static_cast<long long>(sh.n), static_cast<long long>(m), sec * 1e6, gbs, 100.0 * gbs / bw);
        std::fflush(stdout);
      }
  }

  // One V4.1 MoE layer: 6 routed experts (K = 3 mul1), d = 5120, f = 2304.
  std::printf("\n## exl3_moe_cpu: one V4.1 layer, K = 3 mul1 (d 5120, f 2304)\n\n");
  std::printf("| experts × tokens | µs | trellis MB read | trellis GB/s | %% of read bw |\n|---|---|---|---|---|\n");
  std::vector<Exl3Tensor> w;
  for (int e = 0; e < 6; ++e) {
    w.push_back(make_tensor(5120, 2304, 6, Exl3Codebook::kMul1, 100 + 3 * e));
    w.push_back(make_tensor(5120, 2304, 6, Exl3Codebook::kMul1, 101 + 3 * e));
    w.push_back(make_tensor(2304, 5120, 6, Exl3Codebook::kMul1, 102 + 3 * e));
  }
  std::vector<spw::Exl3ExpertWeights> experts(6);
  for (int e = 0; e < 6; ++e) experts[e] = {&w[3 * e], &w[3 * e + 1], &w[3 * e + 2]};
  const bool int16_ready = spw::detail::exl3_int16_ready();
  for (int64_t n_tokens : {1, 8})
      for (bool int16 : {false, true}) {
      if (int16 && !int16_ready) continue;
      spw::Exl3CpuOptions opt;
      if (int16) opt.activations = spw::Exl3Activations::kInt16;
      std::vector<int32_t> ids(n_tokens * 6);
      std::vector<float> wts(n_tokens * 6, 1.0f / 6), out(n_tokens * 5120, 0.0f);
      for (int64_t j = 0; j < n_tokens; ++j)
        for (int sl = 0; sl < 6; ++sl) ids[j * 6 + sl] = static_cast<int32_t>((sl + j) % 6);
      size_t nbytes = 0;
      for (const Exl3Tensor& t : w) nbytes += t.trellis_nbytes();
      const double sec = time_calls([&] {
        for (Exl3Tensor& t : w) t.trellis = tp.take(t.trellis_nbytes() / 2);
        spw::exl3_moe_cpu(experts.data(), 6, x.data(), n_tokens, ids.data(), wts.data(), 6, 10.0f, out.data(), &pool,
                          opt);
      });
      const double gbs = double(nbytes) / sec / 1e9;
      std::printf("| 6 × %lld%s | %.0f | %.1f | %.2f | %.1f%% |\n", static_cast<long long>(n_tokens),
                  int16 ? " (int16 activations)" : "", sec * 1e6, nbytes / 1e6, gbs, 100.0 * gbs / bw);
    }
  std::printf("\ntotal bench time: %.1f s\n", seconds_since(t_start));
  return 0;
}
