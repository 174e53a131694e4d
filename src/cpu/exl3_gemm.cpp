// EXL3 x·W on the CPU: stages, dispatch and the scalar tile kernel. See exl3_gemm.h.
#include "cpu/exl3_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace spw {

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "?";
}

CpuIsa cpu_isa_detect() {
  static const CpuIsa isa = [] {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
      return CpuIsa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
      return CpuIsa::kAvx2;
#endif
    return CpuIsa::kScalar;
  }();
  return isa;
}

namespace {

// In-place fp32 Sylvester Hadamard of 128 values, normalized.
void had128_f32(float* v) {
  for (int s = 1; s < 128; s <<= 1)
    for (int i = 0; i < 128; i += 2 * s)
      for (int j = i; j < i + s; ++j) {
        float a = v[j], b = v[j + s];
        v[j] = a + b;
        v[j + s] = a - b;
      }
  const float r = 0.08838834764831845f;
  for (int i = 0; i < 128; ++i) v[i] *= r;
}

std::vector<int32_t> window_starts(Exl3Bits bits) {
  std::vector<int32_t> starts(256);
  const int64_t ring = int64_t(bits.words_per_tile()) * 16;
  int64_t end = 0;
  for (int p = 0; p < 256; ++p) {
    end += bits.step_bits(p);
    starts[p] = static_cast<int32_t>(((end - 16) % ring + ring) % ring + 32);
  }
  return starts;
}

}  // namespace

namespace detail {

void exl3_tiles_scalar(const Exl3Tensor& t, const float* xe, int64_t m, int64_t tn0, int64_t tn1,
                       const int32_t* starts, float* u) {
  const float* lut = exl3_codebook_lut_f32(t.codebook);
  const int nw = t.words_per_tile() / 2;
  const int64_t n_tk = t.k / 16;
  uint32_t buf[66];
  float vals[256];
  std::vector<float> acc(static_cast<size_t>(m) * 16);
  for (int64_t tn = tn0; tn < tn1; ++tn) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t tk = 0; tk < n_tk; ++tk) {
      const uint16_t* tile = t.tile(tk, tn);
      for (int i = 0; i < nw; ++i) buf[i + 1] = uint32_t(tile[2 * i]) | (uint32_t(tile[2 * i + 1]) << 16);
      buf[0] = buf[nw];
      buf[nw + 1] = buf[1];
      for (int p = 0; p < 256; ++p) {
        int s = starts[p], w = s >> 5, off = s & 31;
        uint64_t win = (uint64_t(buf[w]) << 32) | buf[w + 1];
        vals[p] = lut[(win >> (48 - off)) & 0xffff];
      }
      for (int64_t i = 0; i < m; ++i) {
        const float* x = xe + (i * n_tk + tk) * 32;
        float* a = &acc[i * 16];
        for (int p = 0; p < 256; ++p) a[exl3_perm_col(p)] += vals[p] * x[p & 31];
      }
    }
    for (int64_t i = 0; i < m; ++i) std::memcpy(u + i * t.n + tn * 16, &acc[i * 16], 16 * sizeof(float));
  }
}

}  // namespace detail

void exl3_matmul_cpu_isa(CpuIsa isa, const Exl3Tensor& t, const float* x, int64_t m, float* y, ThreadPool* pool) {
  if (static_cast<int>(isa) > static_cast<int>(cpu_isa_detect())) isa = cpu_isa_detect();
  ThreadPool& tp = pool ? *pool : global_pool();
  const int64_t n_tk = t.k / 16, n_tn = t.n / 16;
  std::vector<int32_t> starts = window_starts(t.bits);
  std::vector<float> suh(t.k), svh(t.n), bias(t.bias.size());
  for (int64_t i = 0; i < t.k; ++i) suh[i] = exl3_f16_to_f32(t.suh[i]);
  for (int64_t j = 0; j < t.n; ++j) svh[j] = exl3_f16_to_f32(t.svh[j]);
  for (size_t j = 0; j < bias.size(); ++j) bias[j] = exl3_f16_to_f32(t.bias[j]);

  // Stage 1: xr = had128(x ∘ suh), laid out per k-tile in the kernels' lane order (32 floats).
  std::vector<float> xe(static_cast<size_t>(m) * n_tk * 32);
  int perm_row32[32];
  for (int p = 0; p < 32; ++p) perm_row32[p] = exl3_perm_row(p);
  tp.parallel_for(static_cast<size_t>(m), [&](size_t i0, size_t i1) {
    std::vector<float> xr(t.k);
    for (size_t i = i0; i < i1; ++i) {
      for (int64_t c = 0; c < t.k; ++c) xr[c] = x[i * t.k + c] * suh[c];
      for (int64_t b = 0; b < t.k; b += 128) had128_f32(&xr[b]);
      for (int64_t tk = 0; tk < n_tk; ++tk)
        for (int p = 0; p < 32; ++p) xe[(i * n_tk + tk) * 32 + p] = xr[tk * 16 + perm_row32[p]];
    }
  });

  // Stage 2: u = xr · Ŵ, output tiles split across threads.
  detail::Exl3TileFn fn = isa == CpuIsa::kAvx512 ? detail::exl3_tiles_avx512
                          : isa == CpuIsa::kAvx2 ? detail::exl3_tiles_avx2
                                                 : detail::exl3_tiles_scalar;
  tp.parallel_for(static_cast<size_t>(n_tn), [&](size_t a, size_t b) {
    fn(t, xe.data(), m, static_cast<int64_t>(a), static_cast<int64_t>(b), starts.data(), y);
  });

  // Stage 3: y = had128(u) ∘ svh + bias, in place.
  const int64_t n_blocks = t.n / 128;
  tp.parallel_for(static_cast<size_t>(m * n_blocks), [&](size_t a, size_t b) {
    for (size_t q = a; q < b; ++q) {
      float* v = y + (q / n_blocks) * t.n + (q % n_blocks) * 128;
      const int64_t c0 = (q % n_blocks) * 128;
      had128_f32(v);
      for (int j = 0; j < 128; ++j) v[j] = v[j] * svh[c0 + j] + (bias.empty() ? 0.0f : bias[c0 + j]);
    }
  });
}

void exl3_matmul_cpu(const Exl3Tensor& t, const float* x, int64_t m, float* y, ThreadPool* pool) {
  exl3_matmul_cpu_isa(cpu_isa_detect(), t, x, m, y, pool);
}

}  // namespace spw
