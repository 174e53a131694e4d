// Routed experts from EXL3 weights on the CPU; see exl3_moe.h.
#include "cpu/exl3_moe.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "ops/ref/moe.h"

namespace spw {
namespace {

// One product of a batch: u = xe · Ŵ over `parts` parts of t's tile grid (u: k_splits slices of [m][n]).
struct Job {
  const Exl3Tensor* t;
  const float* xe;
  int64_t m;
  float* u;
  int64_t k_splits, n_splits;
  const int16_t* xq = nullptr;  // set: the int16 kernel (Exl3Activations::kInt16)
  const float* xq_scale = nullptr;
};

// Runs every part of every job in one pass over the pool. Jobs of equal shape get equal part counts,
// chosen so the total divides evenly over the threads.
void run_jobs(std::vector<Job>& jobs, ThreadPool& tp, const Exl3CpuOptions& opt) {
  const int64_t n_threads = static_cast<int64_t>(tp.size()), n_jobs = static_cast<int64_t>(jobs.size());
  const int64_t ppt = std::max(1, opt.parts_per_thread), slots = n_threads * ppt;
  const int64_t parts = slots / std::gcd(n_jobs, slots);
  for (Job& j : jobs) detail::exl3_split(j.t->k / 16, j.t->n / 16, parts, &j.k_splits, &j.n_splits);
  std::vector<int64_t> first(jobs.size() + 1, 0);
  for (size_t i = 0; i < jobs.size(); ++i) first[i + 1] = first[i] + jobs[i].k_splits * jobs[i].n_splits;
  const CpuIsa isa = std::min(opt.isa, cpu_isa_detect());
  const detail::Exl3TileFn fn = detail::exl3_tile_fn(isa);
  tp.parallel_for(static_cast<size_t>(first.back()), [&](size_t a, size_t b) {
    for (size_t q = a; q < b; ++q) {
      const size_t i = std::upper_bound(first.begin(), first.end(), static_cast<int64_t>(q)) - first.begin() - 1;
      const Job& j = jobs[i];
      detail::Exl3Part part =
          detail::exl3_part(*j.t, j.xe, j.m, j.k_splits, j.n_splits, static_cast<int64_t>(q) - first[i], j.u, j.t->n);
      part.amx = opt.amx;
      part.xq = j.xq;
      part.xq_scale = j.xq_scale;
      if (j.xq) detail::exl3_tiles_int16(part);
      else fn(part, opt.decode);
    }
  }, 1, static_cast<size_t>(ppt));
}

struct Factors {
  std::vector<float> suh, svh, bias;
};

}  // namespace

void exl3_moe_cpu(const Exl3ExpertWeights* experts, int64_t n_experts, const float* x, int64_t n_tokens,
                  const int32_t* expert_ids, const float* weights, int64_t top_k, float swiglu_limit, float* out,
                  ThreadPool* pool, const Exl3CpuOptions& opt) {
  ThreadPool& tp = pool ? *pool : global_pool();
  const CpuIsa isa = std::min(opt.isa, cpu_isa_detect());

  // Group the (token, slot) assignments by expert: rows [row0[a], row0[a + 1]) belong to active expert a.
  std::vector<int64_t> count(n_experts, 0);
  for (int64_t r = 0; r < n_tokens * top_k; ++r) {
    const int32_t e = expert_ids[r];
    if (e < 0) continue;
    if (e >= n_experts) {
      std::fprintf(stderr, "exl3_moe_cpu: expert id %d >= n_experts %lld\n", e, static_cast<long long>(n_experts));
      std::abort();
    }
    ++count[e];
  }
  std::vector<int64_t> active, row0{0};
  for (int64_t e = 0; e < n_experts; ++e)
    if (count[e]) {
      active.push_back(e);
      row0.push_back(row0.back() + count[e]);
    }
  if (active.empty()) return;
  const int64_t n_active = static_cast<int64_t>(active.size()), n_rows = row0.back();
  std::vector<int64_t> row_token(n_rows), fill(n_experts, 0), slot_of(n_experts, -1);
  std::vector<float> row_weight(n_rows);
  for (int64_t a = 0; a < n_active; ++a) slot_of[active[a]] = a;
  for (int64_t r = 0; r < n_tokens * top_k; ++r) {
    const int32_t e = expert_ids[r];
    if (e < 0) continue;
    const int64_t row = row0[slot_of[e]] + fill[e]++;
    row_token[row] = r / top_k;
    row_weight[row] = weights[r];
  }

  const Exl3Tensor& w1_0 = *experts[active[0]].w1;
  const int64_t d = w1_0.k, f = w1_0.n;
  const int64_t n_tk1 = d / 16, n_tk2 = f / 16;

  // fp32 factors of every matrix used (3 per active expert).
  thread_local std::vector<Factors> fac;
  if (fac.size() < static_cast<size_t>(3 * n_active)) fac.resize(3 * n_active);
  for (int64_t a = 0; a < n_active; ++a) {
    const Exl3ExpertWeights& ew = experts[active[a]];
    detail::exl3_factors(*ew.w1, fac[3 * a].suh, fac[3 * a].svh, fac[3 * a].bias);
    detail::exl3_factors(*ew.w3, fac[3 * a + 1].suh, fac[3 * a + 1].svh, fac[3 * a + 1].bias);
    detail::exl3_factors(*ew.w2, fac[3 * a + 2].suh, fac[3 * a + 2].svh, fac[3 * a + 2].bias);
  }
  const Factors* fp = fac.data();
  auto bias_of = [](const Factors& F) { return F.bias.empty() ? nullptr : F.bias.data(); };

  // Scratch (per calling thread, kept): expanded inputs, slice sums, activations.
  thread_local std::vector<float> xe13, xe2, u13, u2, y2, s13, s2;
  thread_local std::vector<int16_t> xq13, xq2;  // quantized xe13, xe2 where the int16 kernel runs
  const int64_t max_parts = static_cast<int64_t>(tp.size()) * std::max(1, opt.parts_per_thread);  // k_splits ≤ parts
  xe13.resize(static_cast<size_t>(2 * n_rows * n_tk1 * 32));
  xe2.resize(static_cast<size_t>(n_rows * n_tk2 * 32));
  u13.resize(static_cast<size_t>(2 * max_parts * n_rows * f));
  u2.resize(static_cast<size_t>(max_parts * n_rows * d));
  y2.resize(static_cast<size_t>(n_rows * d));
  float* xe13_p = xe13.data();
  float* xe2_p = xe2.data();
  float* u13_p = u13.data();
  float* u2_p = u2.data();
  float* y2_p = y2.data();
  // Int16 activations per matrix (w1, w3, w2 of each active expert): exl3_use_int16.
  std::vector<char> use_int16(static_cast<size_t>(3 * n_active));
  bool any13 = false, any2 = false;
  for (int64_t a = 0; a < n_active; ++a) {
    const Exl3ExpertWeights& ew = experts[active[a]];
    const int64_t m = row0[a + 1] - row0[a];
    use_int16[3 * a] = detail::exl3_use_int16(opt, *ew.w1, m);
    use_int16[3 * a + 1] = detail::exl3_use_int16(opt, *ew.w3, m);
    use_int16[3 * a + 2] = detail::exl3_use_int16(opt, *ew.w2, m);
    any13 = any13 || use_int16[3 * a] || use_int16[3 * a + 1];
    any2 = any2 || use_int16[3 * a + 2];
  }
  if (any13) {
    xq13.resize(xe13.size());
    s13.resize(static_cast<size_t>(2 * n_rows * n_tk1 / 8));
  }
  if (any2) {
    xq2.resize(xe2.size());
    s2.resize(static_cast<size_t>(n_rows * n_tk2 / 8));
  }
  int16_t* xq13_p = xq13.data();
  int16_t* xq2_p = xq2.data();
  float* s13_p = s13.data();
  float* s2_p = s2.data();
  const size_t grain1 = static_cast<size_t>(std::max<int64_t>(1, 32768 / d));
  const size_t grain2 = static_cast<size_t>(std::max<int64_t>(1, 32768 / f));

  // Row r of active expert a: its two expanded inputs (gate, up).
  std::vector<int64_t> row_expert(n_rows);
  for (int64_t a = 0; a < n_active; ++a)
    for (int64_t r = row0[a]; r < row0[a + 1]; ++r) row_expert[r] = a;
  tp.parallel_for(static_cast<size_t>(2 * n_rows), [&](size_t lo, size_t hi) {
    for (size_t q = lo; q < hi; ++q) {
      const int64_t r = static_cast<int64_t>(q) / 2, which = static_cast<int64_t>(q) % 2, a = row_expert[r];
      // Layout: expert a's gate block, then its up block, each [n_tk1][m_a][32].
      const int64_t m = row0[a + 1] - row0[a];
      const int64_t block = (2 * row0[a] + which * m) * n_tk1 * 32;
      float* dst = xe13_p + block + (r - row0[a]) * 32;
      detail::exl3_expand_x(x + row_token[r] * d, fp[3 * a + which].suh.data(), d, dst, m * 32, isa);
      if (use_int16[3 * a + which])
        detail::exl3_quantize_xe(xe13_p + block, n_tk1, m, r - row0[a], xq13_p + block, s13_p + block / (32 * 8)  /* a scale per 8 k-tiles of the block */);
    }
  }, grain1);

  // Pass 1: gate and up of every active expert.
  std::vector<Job> jobs;
  std::vector<float*> u13_at(2 * n_active);
  for (int64_t a = 0; a < n_active; ++a) {
    const int64_t m = row0[a + 1] - row0[a];
    for (int which = 0; which < 2; ++which) {
      const Exl3ExpertWeights& ew = experts[active[a]];
      u13_at[2 * a + which] = u13_p + (2 * row0[a] + which * m) * max_parts * f;
      const int64_t block = (2 * row0[a] + which * m) * n_tk1 * 32;
      const bool q = use_int16[3 * a + which];
      jobs.push_back({which ? ew.w3 : ew.w1, xe13_p + block, m, u13_at[2 * a + which], 1, 1,
                      q ? xq13_p + block : nullptr, q ? s13_p + block / (32 * 8) : nullptr});
    }
  }
  run_jobs(jobs, tp, opt);

  // SwiGLU per row, then the down projection's expanded input.
  tp.parallel_for(static_cast<size_t>(n_rows), [&](size_t lo, size_t hi) {
    thread_local std::vector<float> g_u;
    if (g_u.size() < static_cast<size_t>(2 * f)) g_u.resize(2 * f);
    float* g = g_u.data();
    float* u = g + f;
    for (size_t rr = lo; rr < hi; ++rr) {
      const int64_t r = static_cast<int64_t>(rr), a = row_expert[r], m = row0[a + 1] - row0[a], i = r - row0[a];
      const Job& jg = jobs[2 * a];
      const Job& ju = jobs[2 * a + 1];
      detail::exl3_finish_y(jg.u + i * f, jg.k_splits, m * f, fp[3 * a].svh.data(), bias_of(fp[3 * a]), f, g, isa);
      detail::exl3_finish_y(ju.u + i * f, ju.k_splits, m * f, fp[3 * a + 1].svh.data(), bias_of(fp[3 * a + 1]), f, u, isa);
      ref::swiglu(g, u, g, static_cast<size_t>(f), swiglu_limit, row_weight[r]);
      detail::exl3_expand_x(g, fp[3 * a + 2].suh.data(), f, xe2_p + row0[a] * n_tk2 * 32 + i * 32, m * 32, isa);
      if (use_int16[3 * a + 2])
        detail::exl3_quantize_xe(xe2_p + row0[a] * n_tk2 * 32, n_tk2, m, i, xq2_p + row0[a] * n_tk2 * 32, s2_p + row0[a] * n_tk2 / 8);
    }
  }, grain2);

  // Pass 2: down projections.
  std::vector<Job> jobs2;
  for (int64_t a = 0; a < n_active; ++a) {
    const int64_t m = row0[a + 1] - row0[a];
    const bool q = use_int16[3 * a + 2];
    jobs2.push_back({experts[active[a]].w2, xe2_p + row0[a] * n_tk2 * 32, m, u2_p + row0[a] * max_parts * d, 1, 1,
                     q ? xq2_p + row0[a] * n_tk2 * 32 : nullptr, q ? s2_p + row0[a] * n_tk2 / 8 : nullptr});
  }
  run_jobs(jobs2, tp, opt);
  tp.parallel_for(static_cast<size_t>(n_rows), [&](size_t lo, size_t hi) {
    for (size_t rr = lo; rr < hi; ++rr) {
      const int64_t r = static_cast<int64_t>(rr), a = row_expert[r], m = row0[a + 1] - row0[a], i = r - row0[a];
      const Job& j = jobs2[a];
      detail::exl3_finish_y(j.u + i * d, j.k_splits, m * d, fp[3 * a + 2].svh.data(), bias_of(fp[3 * a + 2]), d,
                            y2_p + r * d, isa);
    }
  }, grain1);
  // Scatter-add in row order (fixed, so results do not depend on threads).
  for (int64_t r = 0; r < n_rows; ++r) {
    float* o = out + row_token[r] * d;
    const float* y = y2_p + r * d;
    for (int64_t c = 0; c < d; ++c) o[c] += y[c];
  }
}

}  // namespace spw
