// bench_quantize: seconds per V4.1-shaped routed-expert tensor, CUDA quantizer vs CPU quantizer,
// and the projected time for all 46,080 routed-expert tensors of V4.1-Flash on one GPU.
// Shapes (EXL3 orientation [k = in][n = out]): gate/up 5120×2304 (two per expert), down 2304×5120.
// W: Gaussian with uneven row/column scales and outliers; H: XᵀX/m of 2k correlated, unevenly
// scaled feature rows (a real-ish calibration Hessian). The first CUDA call is a warm-up (cuBLAS,
// cuSOLVER, pools) and not timed. "2 workers" is what `spillway quantize --device cuda` does: two
// threads, each with its own Exl3CudaQuantizer (stream), so one tensor's host work and small-grid
// phases overlap the other's Viterbi; its seconds per tensor = wall time / tensors.
// Usage: bench_quantize [--bits K] [--reps N] [--cpu] [--identity] [--single-candidate]
//   The default is what `spillway quantize` does: the per-tensor candidate search (4 full
//   quantizations with a real Hessian); --single-candidate times one (exllamav3's amount of work).
//   --cpu also times the CPU quantizer once per shape (slow: ~15 min per tensor, one thread).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "quantize/cuda/exl3_quantize_cuda.h"
#include "quantize/exl3_quantize.h"

namespace {

using spw::quant::QuantizedTensor;
using spw::quant::QuantizeParams;

struct Problem {
  int64_t k, n;
  std::vector<float> w;
  std::vector<double> h;
};

Problem make_problem(int64_t k, int64_t n, bool identity, uint32_t seed) {
  Problem p{k, n, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> cs(static_cast<size_t>(n)), rs(static_cast<size_t>(k));
  for (auto& v : cs) v = 0.02f * std::exp(0.3f * nd(rng));
  for (auto& v : rs) v = std::exp(0.2f * nd(rng));
  p.w.resize(size_t(k * n));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < n; ++j) p.w[size_t(i * n + j)] = rs[size_t(i)] * cs[size_t(j)] * nd(rng);
  if (identity) return p;
  // H = XᵀX/m, accumulated on the GPU (the CPU reference would take minutes at k = 5120).
  const int64_t m = 2 * k;
  std::vector<float> x(size_t(m * k)), fs(static_cast<size_t>(k));
  for (auto& v : fs) v = std::exp(0.7f * nd(rng));
  for (int64_t t = 0; t < m; ++t) {
    const float c0 = nd(rng), c1 = nd(rng);
    for (int64_t a = 0; a < k; ++a) x[size_t(t * k + a)] = fs[size_t(a)] * (nd(rng) + 0.6f * (a % 2 ? c0 : c1));
  }
  spw::quant::QuantCudaContext ctx;
  float* dx = nullptr;
  double* dh = nullptr;
  if (!spw::quant::quant_cuda_context_create(ctx).ok() || cudaMalloc(&dx, x.size() * 4) != cudaSuccess ||
      cudaMalloc(&dh, size_t(k * k) * 8) != cudaSuccess) {
    std::fprintf(stderr, "bench_quantize: CUDA setup failed\n");
    std::exit(1);
  }
  cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(dh, 0, size_t(k * k) * 8);
  cudaDeviceSynchronize();  // the legacy-stream copy/memset must land before the non-blocking stream reads
  auto st = spw::quant::hessian_accumulate_cuda(ctx, dx, nullptr, m, k, dh);
  if (!st.ok()) {
    std::fprintf(stderr, "bench_quantize: %s\n", st.error().message.c_str());
    std::exit(1);
  }
  cudaStreamSynchronize(ctx.stream);
  p.h.resize(size_t(k * k));
  cudaMemcpy(p.h.data(), dh, p.h.size() * 8, cudaMemcpyDeviceToHost);
  for (auto& v : p.h) v /= double(m);
  cudaFree(dx);
  cudaFree(dh);
  spw::quant::quant_cuda_context_destroy(ctx);
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  int bits = 3, reps = 3;
  bool cpu = false, identity = false, single = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--bits") && i + 1 < argc) bits = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--cpu")) cpu = true;
    else if (!std::strcmp(argv[i], "--identity")) identity = true;
    else if (!std::strcmp(argv[i], "--single-candidate")) single = true;
    else {
      std::fprintf(stderr, "usage: bench_quantize [--bits K] [--reps N] [--cpu] [--identity] [--single-candidate]\n");
      return 2;
    }
  }
  auto quantizer = spw::quant::Exl3CudaQuantizer::create();
  if (!quantizer.ok()) {
    std::fprintf(stderr, "bench_quantize: %s\n", quantizer.error().message.c_str());
    return 1;
  }
  QuantizeParams qp;
  qp.bits = bits;
  qp.seed = 1;
  if (single) qp.alternatives.clear();
  std::printf("bench_quantize: K=%d mul1, %s Hessian, LDLQ + refit, %zu candidate(s) per tensor\n", bits,
              identity ? "identity" : "real-ish", spw::quant::quantize_candidates(qp, !identity).size());
  std::printf("%-12s %10s %12s %14s %12s %12s %10s\n", "shape", "cuda s", "cuda proxy", "2 workers s/t", "cpu s",
              "cpu proxy", "speedup");
  double per_expert = 0, per_expert_2w = 0;
  for (auto [k, n, count] : {std::tuple<int64_t, int64_t, int>{5120, 2304, 2}, {2304, 5120, 1}}) {
    const Problem p = make_problem(k, n, identity, uint32_t(k));
    auto warm = (*quantizer)->quantize(p.w.data(), k, n, p.h, qp);
    if (!warm.ok()) {
      std::fprintf(stderr, "bench_quantize: %s\n", warm.error().message.c_str());
      return 1;
    }
    double best = 1e30, proxy = 0;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      auto q = (*quantizer)->quantize(p.w.data(), k, n, p.h, qp);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!q.ok()) {
        std::fprintf(stderr, "bench_quantize: %s\n", q.error().message.c_str());
        return 1;
      }
      best = std::min(best, s);
      proxy = q->proxy_err;
    }
    per_expert += count * best;
    // Two workers, reps tensors each.
    double two_workers = 0;
    {
      auto second = spw::quant::Exl3CudaQuantizer::create();
      if (!second.ok()) {
        std::fprintf(stderr, "bench_quantize: %s\n", second.error().message.c_str());
        return 1;
      }
      bool failed = false;
      auto work = [&](spw::quant::Exl3CudaQuantizer* q) {
        for (int r = 0; r < reps; ++r)
          if (!q->quantize(p.w.data(), k, n, p.h, qp).ok()) failed = true;
      };
      (*second)->quantize(p.w.data(), k, n, p.h, qp);  // warm-up
      const auto t0 = std::chrono::steady_clock::now();
      std::thread a(work, quantizer->get()), b(work, second->get());
      a.join();
      b.join();
      two_workers = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (2.0 * reps);
      if (failed) {
        std::fprintf(stderr, "bench_quantize: a two-worker run failed\n");
        return 1;
      }
    }
    per_expert_2w += count * two_workers;
    char shape[48];
    std::snprintf(shape, sizeof shape, "%lldx%lld", (long long)k, (long long)n);
    if (cpu) {
      auto c = spw::quant::exl3_quantize_tensor(p.w.data(), k, n, p.h, qp);
      if (!c.ok()) {
        std::fprintf(stderr, "bench_quantize: cpu: %s\n", c.error().message.c_str());
        return 1;
      }
      std::printf("%-12s %10.3f %12.6g %14.3f %12.1f %12.6g %9.0fx\n", shape, best, proxy, two_workers, c->seconds,
                  c->proxy_err, c->seconds / best);
    } else {
      std::printf("%-12s %10.3f %12.6g %14.3f %12s %12s %10s\n", shape, best, proxy, two_workers, "-", "-", "-");
    }
    std::fflush(stdout);
  }
  for (auto [label, s] : {std::pair<const char*, double>{"1 worker", per_expert}, {"2 workers", per_expert_2w}})
    std::printf("%s: per expert (2 gate/up + 1 down) %.3f s; all 46,080 routed-expert tensors %.0f s = %.2f h on one GPU\n",
                label, s, s * 46080.0 / 3.0, s * 46080.0 / 3.0 / 3600);
  return 0;
}
