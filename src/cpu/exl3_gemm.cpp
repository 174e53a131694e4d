// EXL3 x·W on the CPU: stages, work split, dispatch, state-extraction tables and the scalar tile
// kernel. See exl3_gemm.h.
#include "cpu/exl3_gemm.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "formats/dtypes.h"

namespace spw {

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Vbmi: return "avx512vbmi";
    case CpuIsa::kAvx512Fp16: return "avx512fp16";
  }
  return "?";
}

CpuIsa cpu_isa_detect() {
  static const CpuIsa isa = [] {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
      if (__builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512fp16")) return CpuIsa::kAvx512Fp16;
      if (__builtin_cpu_supports("avx512vbmi")) return CpuIsa::kAvx512Vbmi;
      return CpuIsa::kAvx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
      return CpuIsa::kAvx2;
#endif
    return CpuIsa::kScalar;
  }();
  return isa;
}

namespace {

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// A broken invariant of the table builder (a state byte outside its chunk): abort, it is a bug.
void lanes_check(bool ok, int k_x2, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "exl3_lanes: k_x2=%d: %s\n", k_x2, what);
  std::abort();
}

// Shuffle bytes for the state whose window starts at stream bit a, relative to a chunk starting at
// word cw: element bytes 3, 2, 1 ← stream bytes ⌊a/8⌋ + 0, 1, 2 (MSB-first; the third only when the
// window reaches it), byte 0 ← zero.
void state_bytes(int64_t a, int64_t cw, int k_x2, uint8_t* ctrl4, uint32_t* shl) {
  const int64_t b0 = floor_div(a, 8);
  *shl = static_cast<uint32_t>(a - 8 * b0);
  ctrl4[0] = 0x80;
  for (int i = 0; i < 3; ++i) {
    const int64_t sb = b0 + i, w = floor_div(sb, 4), rel = w - cw;
    if (sb > floor_div(a + 15, 8)) {  // byte-aligned window: the third byte would be shifted out anyway
      ctrl4[3 - i] = 0x80;
      continue;
    }
    lanes_check(rel >= 0 && rel < 4, k_x2, "state byte outside its chunk");
    ctrl4[3 - i] = static_cast<uint8_t>(4 * rel + 3 - (sb - 4 * w));
  }
}

void build_lanes(Exl3Bits bits, detail::Exl3Lanes& L) {
  const int nw = bits.words_per_tile() / 2;
  L.n_words = nw;
  int64_t a[256];  // stream bit where position p's 16-bit window starts (negative: wraps to the end)
  int64_t end = 0;
  for (int p = 0; p < 256; ++p) {
    end += bits.step_bits(p);
    a[p] = end - 16;
  }
  L.n_edge8 = L.n_edge16 = 0;
  for (int q = 0; q < 32; ++q) {
    int64_t cw = floor_div(a[8 * q], 32);
    if (cw >= 0 && cw + 4 > nw) cw = nw - 4;
    L.base8[q] = static_cast<int32_t>(cw);
    if (cw < 0) ++L.n_edge8;
    for (int e = 0; e < 8; ++e) state_bytes(a[8 * q + e], cw, bits.k_x2, &L.shuf8[q][4 * e], &L.shl8[q][e]);
  }
  for (int q = 0; q < 16; ++q) {
    int64_t base = floor_div(a[16 * q], 32);
    if (base >= 0 && base + 8 > nw) base = nw - 8;
    L.base16[q] = static_cast<int32_t>(base);
    if (base < 0) ++L.n_edge16;
    for (int g = 0; g < 4; ++g) {
      int64_t cg = std::min<int64_t>(floor_div(a[16 * q + 4 * g], 32) - base, 4);
      lanes_check(cg >= 0, bits.k_x2, "chunk before its window");
      for (int i = 0; i < 4; ++i) L.perm16[q][4 * g + i] = static_cast<uint32_t>(cg + i);
      for (int e = 4 * g; e < 4 * g + 4; ++e)
        state_bytes(a[16 * q + e], base + cg, bits.k_x2, &L.shuf16[q][4 * e], &L.shl16[q][e]);
    }
  }
  lanes_check(L.n_edge8 >= 1 && L.n_edge8 <= 2 && L.n_edge16 == 1, bits.k_x2, "unexpected ring-wrap vectors");
}

// Per-thread scratch that grows and is kept.
float* scratch(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace

namespace detail {

const Exl3Lanes& exl3_lanes(Exl3Bits bits) {
  static Exl3Lanes* tables = [] {
    auto* out = new Exl3Lanes[17];
    for (int k_x2 = 2; k_x2 <= 16; ++k_x2) build_lanes(Exl3Bits{k_x2}, out[k_x2]);
    return out;
  }();
  return tables[bits.k_x2];
}

void had128_f32_scalar(float* v) {
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

void exl3_expand_x(const float* x, const float* suh, int64_t k, float* xe, int64_t tk_stride, CpuIsa isa) {
  static const auto perm_row32 = [] {
    std::array<int, 32> p{};
    for (int i = 0; i < 32; ++i) p[i] = exl3_perm_row(i);
    return p;
  }();
  alignas(64) float v[128];
  for (int64_t b = 0; b < k; b += 128) {
    for (int c = 0; c < 128; ++c) v[c] = x[b + c] * suh[b + c];
    if (isa >= CpuIsa::kAvx2) had128_f32_avx2(v);
    else had128_f32_scalar(v);
    for (int tk = 0; tk < 8; ++tk)
      for (int p = 0; p < 32; ++p) xe[(b / 16 + tk) * tk_stride + p] = v[tk * 16 + perm_row32[p]];
  }
}

void exl3_finish_y(const float* u, int64_t n_splits, int64_t u_stride, const float* svh, const float* bias,
                   int64_t n, float* y, CpuIsa isa) {
  alignas(64) float v[128];
  for (int64_t b = 0; b < n; b += 128) {
    std::memcpy(v, u + b, sizeof v);
    for (int64_t s = 1; s < n_splits; ++s)
      for (int j = 0; j < 128; ++j) v[j] += u[s * u_stride + b + j];
    if (isa >= CpuIsa::kAvx2) had128_f32_avx2(v);
    else had128_f32_scalar(v);
    if (bias)
      for (int j = 0; j < 128; ++j) y[b + j] = v[j] * svh[b + j] + bias[b + j];
    else
      for (int j = 0; j < 128; ++j) y[b + j] = v[j] * svh[b + j];
  }
}

void exl3_tiles_scalar(const Exl3Part& P, Exl3Decode) {
  const Exl3Tensor& t = *P.t;
  const float* lut = exl3_codebook_lut_f32(t.codebook);
  thread_local std::vector<float> acc_v;
  float* acc = scratch(acc_v, static_cast<size_t>(P.m) * 16);
  uint16_t st[256];
  float vals[256];
  for (int64_t tn = P.tn0; tn < P.tn1; ++tn) {
    std::fill(acc, acc + P.m * 16, 0.0f);
    for (int64_t tk = P.tk0; tk < P.tk1; ++tk) {
      exl3_tile_states(t.tile(tk, tn), t.bits, st);
      for (int p = 0; p < 256; ++p) vals[p] = lut[st[p]];
      for (int64_t i = 0; i < P.m; ++i) {
        const float* x = P.xe + (tk * P.m + i) * 32;
        float* a = acc + i * 16;
        for (int p = 0; p < 256; ++p) a[exl3_perm_col(p)] += vals[p] * x[p & 31];
      }
    }
    for (int64_t i = 0; i < P.m; ++i) std::memcpy(P.u + i * P.ldu + tn * 16, acc + i * 16, 16 * sizeof(float));
  }
}

Exl3TileFn exl3_tile_fn(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512Fp16: return exl3_tiles_avx512fp16;
    case CpuIsa::kAvx512Vbmi: return exl3_tiles_avx512vbmi;
    case CpuIsa::kAvx512: return exl3_tiles_avx512;
    case CpuIsa::kAvx2: return exl3_tiles_avx2;
    case CpuIsa::kScalar: break;
  }
  return exl3_tiles_scalar;
}

bool exl3_int16_ready() {
#if defined(__x86_64__)
  static const bool ready = cpu_isa_detect() >= CpuIsa::kAvx512Vbmi && __builtin_cpu_supports("avx512vnni");
  return ready;
#else
  return false;
#endif
}

bool exl3_use_int16(const Exl3CpuOptions& opt, const Exl3Tensor& t, int64_t m) {
  return opt.activations == Exl3Activations::kInt16 && t.codebook == Exl3Codebook::kMul1 && m < kAmxMinTokens &&
         opt.decode == Exl3Decode::kArith && std::min(opt.isa, cpu_isa_detect()) >= CpuIsa::kAvx512Vbmi &&
         exl3_int16_ready();
}

void exl3_quantize_xe(const float* xe, int64_t n_tk, int64_t m, int64_t i, int16_t* xq, float* scale) {
  for (int64_t b = 0; b * 8 < n_tk; ++b) {
    const int64_t tk0 = 8 * b, tk1 = std::min(n_tk, tk0 + 8);
    float amax = 0;
    for (int64_t tk = tk0; tk < tk1; ++tk) {
      const float* v = xe + (tk * m + i) * 32;
      for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(v[l]));
    }
    const float s = amax > 0 ? amax / kExl3Int16Max : 1.0f, inv = 1.0f / s;
    scale[b * m + i] = s;
    for (int64_t tk = tk0; tk < tk1; ++tk) {
      const float* v = xe + (tk * m + i) * 32;
      int16_t* q = xq + (tk * m + i) * 32;
      for (int l = 0; l < 32; ++l)
        q[l] = static_cast<int16_t>(std::clamp(std::nearbyint(v[l] * inv), -float(kExl3Int16Max), float(kExl3Int16Max)));
    }
  }
}

void exl3_split(int64_t n_tk, int64_t n_tn, int64_t n_parts, int64_t* k_splits, int64_t* n_splits) {
  // Among pk·pn = n_parts (pk | n_parts), the smallest largest part; column ranges narrower than 4 tiles
  // (short contiguous runs of trellis) only when nothing else fits; ties go to fewer k-slices.
  int64_t best_pk = 1, best_pn = std::min(n_parts, n_tn);
  double best = 1e300;
  for (int64_t pk = 1; pk <= std::min(n_parts, n_tk); ++pk) {
    if (n_parts % pk) continue;
    const int64_t pn = std::min(n_parts / pk, n_tn);
    const int64_t wn = (n_tn + pn - 1) / pn, wk = (n_tk + pk - 1) / pk;
    double cost = double(wn) * wk * (wn < 4 && pn > 1 ? 1.5 : 1.0);
    if (cost < best * 0.999) {
      best = cost;
      best_pk = pk;
      best_pn = pn;
    }
  }
  *k_splits = best_pk;
  *n_splits = best_pn;
}

Exl3Part exl3_part(const Exl3Tensor& t, const float* xe, int64_t m, int64_t k_splits, int64_t n_splits, int64_t index,
                   float* u, int64_t ldu) {
  const int64_t n_tk = t.k / 16, n_tn = t.n / 16;
  const int64_t ks = index / n_splits, ns = index % n_splits;
  Exl3Part p{};
  p.t = &t;
  p.xe = xe;
  p.m = m;
  p.tk0 = ks * n_tk / k_splits;
  p.tk1 = (ks + 1) * n_tk / k_splits;
  p.tn0 = ns * n_tn / n_splits;
  p.tn1 = (ns + 1) * n_tn / n_splits;
  p.u = u + ks * m * ldu;
  p.ldu = ldu;
  return p;
}

void exl3_factors(const Exl3Tensor& t, std::vector<float>& suh, std::vector<float>& svh, std::vector<float>& bias) {
  suh.resize(t.k);
  svh.resize(t.n);
  bias.resize(t.bias.size());
  f16_to_f32_n(t.suh.data(), suh.data(), suh.size());
  f16_to_f32_n(t.svh.data(), svh.data(), svh.size());
  f16_to_f32_n(t.bias.data(), bias.data(), bias.size());
}

}  // namespace detail

void exl3_matmul_cpu_opts(const Exl3CpuOptions& opt, const Exl3Tensor& t, const float* x, int64_t m, float* y,
                          ThreadPool* pool) {
  const CpuIsa isa = std::min(opt.isa, cpu_isa_detect());
  ThreadPool& tp = pool ? *pool : global_pool();
  const int64_t n_tk = t.k / 16, n_tn = t.n / 16;
  thread_local std::vector<float> suh, svh, bias, xe_v, u_v, xq_scale_v;
  thread_local std::vector<int16_t> xq_v;
  detail::exl3_factors(t, suh, svh, bias);
  // (thread_local names inside the lambdas would mean the worker's own copies: use pointers.)
  const float* suh_p = suh.data();
  const float* svh_p = svh.data();
  const float* bias_p = bias.empty() ? nullptr : bias.data();

  int64_t k_splits = 1, n_splits = 1;
  const int64_t ppt = std::max(1, opt.parts_per_thread);
  detail::exl3_split(n_tk, n_tn, static_cast<int64_t>(tp.size()) * ppt, &k_splits, &n_splits);
  if (opt.k_splits > 0) {
    k_splits = std::min<int64_t>(opt.k_splits, n_tk);
    n_splits = std::max<int64_t>(1, std::min<int64_t>(n_tn, static_cast<int64_t>(tp.size()) / k_splits));
  }
  // Small problems run stages 1 and 3 on the calling thread (a pool round trip costs more).
  const size_t grain_x = static_cast<size_t>(std::max<int64_t>(1, 65536 / t.k));
  const size_t grain_y = static_cast<size_t>(std::max<int64_t>(1, 65536 / (t.n * k_splits)));

  // Stage 1: xe = had128(x ∘ suh) in lane order (and quantized, for the int16 kernel).
  float* xe = scratch(xe_v, static_cast<size_t>(m) * n_tk * 32);
  const bool int16 = detail::exl3_use_int16(opt, t, m);
  int16_t* xq = nullptr;
  float* xq_scale = nullptr;
  if (int16) {
    xq_v.resize(static_cast<size_t>(m) * n_tk * 32);
    xq_scale_v.resize(static_cast<size_t>(m) * ((n_tk + 7) / 8));
    xq = xq_v.data();
    xq_scale = xq_scale_v.data();
  }
  tp.parallel_for(static_cast<size_t>(m), [&](size_t a, size_t b) {
    for (size_t i = a; i < b; ++i) {
      detail::exl3_expand_x(x + i * t.k, suh_p, t.k, xe + i * 32, m * 32, isa);
      if (int16) detail::exl3_quantize_xe(xe, n_tk, m, static_cast<int64_t>(i), xq, xq_scale);
    }
  }, grain_x);

  // Stage 2: u = xr · Ŵ per part; one k-slice writes y directly.
  float* u = k_splits == 1 ? y : scratch(u_v, static_cast<size_t>(k_splits) * m * t.n);
  const detail::Exl3TileFn fn = detail::exl3_tile_fn(isa);
  tp.parallel_for(static_cast<size_t>(k_splits * n_splits), [&](size_t a, size_t b) {
    for (size_t q = a; q < b; ++q)
    {
      detail::Exl3Part part = detail::exl3_part(t, xe, m, k_splits, n_splits, static_cast<int64_t>(q), u, t.n);
      part.amx = opt.amx;
      part.xq = xq;
      part.xq_scale = xq_scale;
      if (int16) detail::exl3_tiles_int16(part);
      else fn(part, opt.decode);
    }
  }, 1, static_cast<size_t>(ppt));

  // Stage 3: y = had128(Σ slices) ∘ svh + bias.
  tp.parallel_for(static_cast<size_t>(m), [&](size_t a, size_t b) {
    for (size_t i = a; i < b; ++i)
      detail::exl3_finish_y(u + i * t.n, k_splits, m * t.n, svh_p, bias_p, t.n,
                            y + i * t.n, isa);
  }, grain_y);
}

void exl3_matmul_cpu_isa(CpuIsa isa, const Exl3Tensor& t, const float* x, int64_t m, float* y, ThreadPool* pool) {
  Exl3CpuOptions opt;
  opt.isa = isa;
  exl3_matmul_cpu_opts(opt, t, x, m, y, pool);
}

void exl3_matmul_cpu(const Exl3Tensor& t, const float* x, int64_t m, float* y, ThreadPool* pool) {
  exl3_matmul_cpu_isa(cpu_isa_detect(), t, x, m, y, pool);
}

}  // namespace spw
