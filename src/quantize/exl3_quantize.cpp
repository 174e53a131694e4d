// One tensor through the EXL3 quantizer; see exl3_quantize.h for the contract and spec sections.
#include "quantize/exl3_quantize.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "quantize/exl3_polish.h"
#include "quantize/trellis_encode.h"

namespace spw::quant {
namespace {

// In-place normalized Sylvester Hadamard of order 128 on a strided vector.
void had128(double* v, int64_t stride) {
  for (int s = 1; s < 128; s <<= 1)
    for (int i = 0; i < 128; ++i)
      if (!(i & s)) {
        double a = v[i * stride], b = v[(i + s) * stride];
        v[i * stride] = a + b;
        v[(i + s) * stride] = a - b;
      }
  const double r = 1.0 / std::sqrt(128.0);
  for (int i = 0; i < 128; ++i) v[i * stride] *= r;
}

// X ← Hk·X (blocks of 128 rows) for X [rows][cols].
void had_left(std::vector<double>& x, int64_t rows, int64_t cols) {
  for (int64_t b = 0; b < rows; b += 128)
    for (int64_t j = 0; j < cols; ++j) had128(&x[size_t(b * cols + j)], cols);
}

// X ← X·Hn (blocks of 128 columns).
void had_right(std::vector<double>& x, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t b = 0; b < cols; b += 128) had128(&x[size_t(i * cols + b)], 1);
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Lower Cholesky factor of a symmetric matrix in place (upper part zeroed); false if not PD.
bool cholesky(std::vector<double>& a, int64_t k) {
  for (int64_t j = 0; j < k; ++j) {
    double d = a[size_t(j * k + j)];
    for (int64_t p = 0; p < j; ++p) d -= a[size_t(j * k + p)] * a[size_t(j * k + p)];
    if (!(d > 0) || !std::isfinite(d)) return false;
    const double ljj = std::sqrt(d);
    a[size_t(j * k + j)] = ljj;
    for (int64_t i = j + 1; i < k; ++i) {
      double s = a[size_t(i * k + j)];
      const double* ri = &a[size_t(i * k)];
      const double* rj = &a[size_t(j * k)];
      for (int64_t p = 0; p < j; ++p) s -= ri[p] * rj[p];
      a[size_t(i * k + j)] = s / ljj;
    }
    for (int64_t i = 0; i < j; ++i) a[size_t(i * k + j)] = 0;
  }
  return true;
}

// Solves A·x = b for symmetric PD A (copied), small ridge added if needed; false on failure.
bool solve_spd(std::vector<double> a, std::vector<double>& b, int64_t k) {
  double mean_diag = 0;
  for (int64_t i = 0; i < k; ++i) mean_diag += a[size_t(i * k + i)];
  mean_diag /= double(k);
  if (!(mean_diag > 0)) return false;
  for (int64_t i = 0; i < k; ++i) a[size_t(i * k + i)] += 1e-9 * mean_diag;
  if (!cholesky(a, k)) return false;
  for (int64_t i = 0; i < k; ++i) {  // forward: C·y = b
    double s = b[size_t(i)];
    for (int64_t p = 0; p < i; ++p) s -= a[size_t(i * k + p)] * b[size_t(p)];
    b[size_t(i)] = s / a[size_t(i * k + i)];
  }
  for (int64_t i = k - 1; i >= 0; --i) {  // backward: Cᵀ·x = y
    double s = b[size_t(i)];
    for (int64_t p = i + 1; p < k; ++p) s -= a[size_t(p * k + i)] * b[size_t(p)];
    b[size_t(i)] = s / a[size_t(i * k + i)];
  }
  for (double v : b)
    if (!std::isfinite(v)) return false;
  return true;
}

std::vector<double> identity(int64_t k) {
  std::vector<double> h(size_t(k * k), 0.0);
  for (int64_t i = 0; i < k; ++i) h[size_t(i * k + i)] = 1.0;
  return h;
}

// Σ_j a_jᵀ H b_j for column sets a, b [k][n]; H empty = identity.
double trace_form(const std::vector<double>& h, const double* a, const double* b, int64_t k, int64_t n) {
  if (h.empty()) {
    double s = 0;
    for (int64_t i = 0; i < k * n; ++i) s += a[i] * b[i];
    return s;
  }
  // Σ_{i,l} H_il Σ_j a_ij b_lj = Σ_il H_il (A Bᵀ)_il
  double s = 0;
  std::vector<double> hb(static_cast<size_t>(n));
  for (int64_t i = 0; i < k; ++i) {
    std::fill(hb.begin(), hb.end(), 0.0);
    for (int64_t l = 0; l < k; ++l) {
      const double hil = h[size_t(i * k + l)];
      if (hil == 0) continue;
      const double* bl = b + l * n;
      for (int64_t j = 0; j < n; ++j) hb[size_t(j)] += hil * bl[j];
    }
    const double* ai = a + i * n;
    for (int64_t j = 0; j < n; ++j) s += ai[j] * hb[size_t(j)];
  }
  return s;
}

uint16_t to_f16(double v) { return exl3_f64_to_f16(v); }

}  // namespace

void hessian_add_outer(std::vector<double>& h, const float* x, const float* weights, int m, int d) {
  hessian_add_outer_rows(h, x, weights, m, d, 0, d);
}

// Vectorized along a row of h (no reduction: every element still adds its tokens in order, and this file is built
// with -ffp-contract=off), so the clones give the same bits as the plain loop.
__attribute__((target_clones("avx512f", "avx2", "default"))) void hessian_add_outer_rows(
    std::vector<double>& h, const float* x, const float* weights, int m, int d, int a0, int a1) {
  std::vector<double> xd(static_cast<size_t>(d));
  double* hd = h.data();
  for (int t = 0; t < m; ++t) {
    const double w = weights ? weights[t] : 1.0;
    for (int a = 0; a < d; ++a) xd[size_t(a)] = x[size_t(t) * d + a];
    const double* xv = xd.data();
    for (int a = a0; a < a1; ++a) {
      const double xa = w * xv[a];
      double* row = hd + size_t(a) * d;
#pragma GCC ivdep
      for (int b = 0; b < d; ++b) row[b] += xa * xv[b];
    }
  }
}

double codebook_sigma(Exl3Codebook cb) {
  const float* lut = exl3_codebook_lut_f32(cb);
  double s = 0, s2 = 0;
  for (int i = 0; i < 65536; ++i) {
    s += lut[i];
    s2 += double(lut[i]) * lut[i];
  }
  const double mean = s / 65536;
  return std::sqrt(s2 / 65536 - mean * mean);
}

double exl3_proxy_error(const float* w, const float* wq, int64_t k, int64_t n, const std::vector<double>& h) {
  std::vector<double> wd(size_t(k * n)), dd(size_t(k * n));
  for (int64_t i = 0; i < k * n; ++i) {
    wd[size_t(i)] = w[i];
    dd[size_t(i)] = double(wq[i]) - double(w[i]);
  }
  const double den = trace_form(h, wd.data(), wd.data(), k, n);
  if (!(den > 0)) return 0;
  return trace_form(h, dd.data(), dd.data(), k, n) / den;
}

Result<std::vector<double>> block_ldl(const std::vector<double>& h, int64_t k) {
  std::vector<double> c = h;
  if (!cholesky(c, k)) return make_error("Hessian is not positive definite");
  // L = C · blockdiag(C_ii)^-1: each 16-column block times the inverse of its diagonal block.
  std::vector<double> l(size_t(k * k), 0.0);
  for (int64_t b = 0; b < k; b += 16) {
    double inv[16][16] = {};
    for (int c0 = 0; c0 < 16; ++c0) {  // inverse of the lower-triangular block, column by column
      for (int r = 0; r < 16; ++r) {
        double s = (r == c0) ? 1.0 : 0.0;
        for (int p = 0; p < r; ++p) s -= c[size_t((b + r) * k + b + p)] * inv[p][c0];
        inv[r][c0] = s / c[size_t((b + r) * k + b + r)];
      }
    }
    for (int64_t i = b; i < k; ++i)
      for (int cc = 0; cc < 16; ++cc) {
        double s = 0;
        for (int p = 0; p < 16; ++p) s += c[size_t(i * k + b + p)] * inv[p][cc];
        l[size_t(i * k + b + cc)] = s;
      }
  }
  return l;
}

Exl3Tensor QuantizedTensor::view(const std::string& name) const {
  Exl3Tensor t;
  t.name = name;
  t.k = k;
  t.n = n;
  t.bits.k_x2 = 2 * bits;
  t.codebook = codebook;
  t.trellis = trellis.data();
  t.suh = suh;
  t.svh = svh;
  return t;
}

std::vector<QuantizeCandidate> quantize_candidates(const QuantizeParams& prm, bool h_usable) {
  std::vector<QuantizeCandidate> c{{prm.sigma_reg, 0, prm.scale_mult}};
  if (h_usable) c.insert(c.end(), prm.alternatives.begin(), prm.alternatives.end());
  return c;
}

Result<QuantizedTensor> quantize_search(const QuantizeParams& prm, bool h_usable,
                                        const std::function<Result<QuantizedTensor>(const QuantizeParams&)>& one) {
  const std::vector<QuantizeCandidate> cands = quantize_candidates(prm, h_usable);
  Result<QuantizedTensor> best = make_error("no candidate");
  for (size_t i = 0; i < cands.size(); ++i) {
    QuantizeParams p = candidate_params(prm, cands[i]);
    if (cands.size() > 1) p.polish_passes = 0;
    auto r = one(p);
    if (!r.ok()) return r.error();
    r->candidate = int(i);
    if (!best.ok() || r->proxy_err < best->proxy_err) best = std::move(r);
  }
  if (cands.size() > 1 && prm.polish_passes > 0) {
    auto r = one(candidate_params(prm, cands[size_t(best->candidate)]));
    if (!r.ok()) return r.error();
    r->candidate = best->candidate;
    if (r->proxy_err < best->proxy_err) best = std::move(r);
  }
  best->candidates = int(cands.size());
  return best;
}

uint64_t tensor_seed(uint64_t seed, int layer, int expert, int w) {
  uint64_t z = seed ^ (uint64_t(layer) << 40) ^ (uint64_t(expert) << 8) ^ uint64_t(w);
  z = (z ^ (z >> 33)) * 0xff51afd7ed558ccdull;
  z = (z ^ (z >> 33)) * 0xc4ceb9fe1a85ec53ull;
  return z ^ (z >> 33);
}

QuantizeParams candidate_params(const QuantizeParams& prm, const QuantizeCandidate& c) {
  QuantizeParams p = prm;
  p.sigma_reg = c.sigma_reg;
  p.seed = prm.seed + c.seed_offset;
  p.scale_mult = c.scale_mult;
  p.alternatives.clear();
  return p;
}

bool hessian_usable(const std::vector<double>& h, int64_t k) {
  if (h.empty()) return false;
  double mean_diag = 0;
  bool finite = true;
  for (double v : h) finite &= std::isfinite(v);
  for (int64_t i = 0; i < k; ++i) mean_diag += h[size_t(i * k + i)];
  mean_diag /= double(k);
  return finite && mean_diag > 1e-20;
}

namespace {

// One candidate: the whole quantizer at prm.sigma_reg and prm.seed (inputs already validated).
Result<QuantizedTensor> quantize_one(const float* w, int64_t k, int64_t n, const std::vector<double>& h_in,
                                     const QuantizeParams& prm) {
  QuantizedTensor out;
  out.k = k;
  out.n = n;
  out.bits = prm.bits;
  out.codebook = prm.codebook;

  // 1. Regularised Hessian (original basis). Unusable → identity (uncalibrated fallback).
  std::vector<double> hd;
  if (!h_in.empty()) {
    double mean_diag = 0;
    bool finite = true;
    for (double v : h_in) finite &= std::isfinite(v);
    for (int64_t i = 0; i < k; ++i) mean_diag += h_in[size_t(i * k + i)];
    mean_diag /= double(k);
    if (finite && mean_diag > 1e-20) {
      hd = h_in;
      for (int64_t i = 0; i < k; ++i) hd[size_t(i * k + i)] += prm.sigma_reg * mean_diag;
    } else {
      out.fell_back_to_identity = true;
    }
  }

  // 2. Random signs.
  uint64_t rng = prm.seed;
  std::vector<double> su(static_cast<size_t>(k)), sv(static_cast<size_t>(n));
  for (auto& v : su) v = (splitmix64(rng) >> 63) ? -1.0 : 1.0;
  for (auto& v : sv) v = (splitmix64(rng) >> 63) ? -1.0 : 1.0;

  // 3. Output-channel scales, output Hadamard, input-channel scales, input Hadamard.
  std::vector<double> t(size_t(k * n));
  for (int64_t i = 0; i < k * n; ++i) t[size_t(i)] = w[i];
  std::vector<double> col_rms(size_t(n), 0.0);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < n; ++j) col_rms[size_t(j)] += t[size_t(i * n + j)] * t[size_t(i * n + j)];
  double mean_rms = 0;
  for (auto& v : col_rms) mean_rms += (v = std::sqrt(v / double(k)));
  mean_rms /= double(n);
  for (int64_t j = 0; j < n; ++j) {
    const double oc = mean_rms > 0 ? col_rms[size_t(j)] / mean_rms : 0.0;
    sv[size_t(j)] *= oc;
    for (int64_t i = 0; i < k; ++i) t[size_t(i * n + j)] = oc > 0 ? t[size_t(i * n + j)] / sv[size_t(j)] : 0.0;
  }
  had_right(t, k, n);
  for (int64_t i = 0; i < k; ++i) {
    double rms = 0;
    for (int64_t j = 0; j < n; ++j) rms += t[size_t(i * n + j)] * t[size_t(i * n + j)];
    rms = std::sqrt(rms / double(n));
    su[size_t(i)] *= rms > 0 ? rms : 1.0;
    for (int64_t j = 0; j < n; ++j) t[size_t(i * n + j)] /= su[size_t(i)];
  }
  had_left(t, k, n);
  const double cb_sigma = codebook_sigma(prm.codebook);
  for (auto& v : t) v *= cb_sigma;
  for (auto& v : su) v /= cb_sigma;

  // 4. Hessian in the rotated basis: Hk·diag(su)·H·diag(su)·Hk.
  std::vector<double> hi;
  if (!hd.empty()) {
    hi = hd;
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < k; ++j) hi[size_t(i * k + j)] *= su[size_t(i)] * su[size_t(j)];
    had_left(hi, k, k);
    had_right(hi, k, k);
  }

  TrellisEncoder enc(prm.bits, prm.codebook);
  const int64_t n_tk = k / 16, n_tn = n / 16, words = 16 * prm.bits;
  auto gather_tile = [&](const std::vector<double>& src, int64_t tk, int64_t tn, double scale, float* tile) {
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) tile[r * 16 + c] = float(scale * src[size_t((tk * 16 + r) * n + tn * 16 + c)]);
  };

  // 5. Global scale g: plain per-tile search on a spread of tiles, grid then a parabola.
  {
    const int64_t n_tiles = n_tk * n_tn;
    const int n_sample = int(std::min<int64_t>(prm.scale_sample_tiles, n_tiles));
    std::vector<double> grid;
    for (int i = 0; i <= 4; ++i) grid.push_back(0.8 + 0.1 * i);
    std::vector<double> err(grid.size(), 0.0);
    std::vector<uint16_t> wbuf(static_cast<size_t>(words));
    float tile[256], dec[256];
    for (size_t gi = 0; gi < grid.size(); ++gi)
      for (int s = 0; s < n_sample; ++s) {
        const int64_t idx = (int64_t(s) * n_tiles) / n_sample + (s * 7) % std::max<int64_t>(1, n_tiles / n_sample);
        gather_tile(t, idx / n_tn, idx % n_tn, grid[gi], tile);
        enc.encode_tile_rowmajor(tile, wbuf.data(), dec);
        for (int i = 0; i < 256; ++i) {
          const double d = dec[i] / grid[gi] - tile[i] / grid[gi];
          err[gi] += d * d;
        }
      }
    size_t best = size_t(std::min_element(err.begin(), err.end()) - err.begin());
    double g = grid[best];
    if (best > 0 && best + 1 < grid.size()) {
      const double e0 = err[best - 1], e1 = err[best], e2 = err[best + 1];
      const double den = e0 - 2 * e1 + e2;
      if (den > 0) g += 0.5 * 0.1 * (e0 - e2) / den;
    }
    g *= prm.scale_mult;
    out.global_scale = g;
    for (auto& v : t) v *= g;
    for (auto& v : su) v /= g;
  }

  // 6. Block LDL of the rotated Hessian; retries with more damping, else no feedback.
  std::vector<double> l;
  if (!hi.empty() && prm.ldlq) {
    double mean_diag = 0;
    for (int64_t i = 0; i < k; ++i) mean_diag += hi[size_t(i * k + i)];
    mean_diag /= double(k);
    for (int attempt = 0; attempt < 10 && l.empty(); ++attempt) {
      auto r = block_ldl(hi, k);
      if (r.ok()) l = std::move(r.value());
      else
        for (int64_t i = 0; i < k; ++i) hi[size_t(i * k + i)] += 2 * prm.sigma_reg * mean_diag;
    }
    if (l.empty()) out.fell_back_to_identity = true;
  }

  // 7. LDLQ: 16-row blocks from the last up; each block's target carries the error feedback of
  // the rows below it (target_i = T_i + Σ_{j>i} L_jiᵀ (T_j − Q_j)).
  out.trellis.assign(size_t(n_tk * n_tn * words), 0);
  std::vector<double> q(size_t(k * n), 0.0), delta(size_t(k * n), 0.0), target(size_t(16 * n));
  {
    float tile[256], dec[256];
    for (int64_t tk = n_tk - 1; tk >= 0; --tk) {
      const int64_t r0 = tk * 16;
      for (int r = 0; r < 16; ++r)
        for (int64_t j = 0; j < n; ++j) target[size_t(r * n + j)] = t[size_t((r0 + r) * n + j)];
      if (!l.empty())
        for (int64_t jr = r0 + 16; jr < k; ++jr) {
          const double* dj = &delta[size_t(jr * n)];
          for (int r = 0; r < 16; ++r) {
            const double coef = l[size_t(jr * k + r0 + r)];
            if (coef == 0) continue;
            double* tr = &target[size_t(r * n)];
            for (int64_t j = 0; j < n; ++j) tr[j] += coef * dj[j];
          }
        }
      for (int64_t tn = 0; tn < n_tn; ++tn) {
        for (int r = 0; r < 16; ++r)
          for (int c = 0; c < 16; ++c) tile[r * 16 + c] = float(target[size_t(r * n + tn * 16 + c)]);
        enc.encode_tile_rowmajor(tile, &out.trellis[size_t((tk * n_tn + tn) * words)], dec);
        for (int r = 0; r < 16; ++r)
          for (int c = 0; c < 16; ++c) q[size_t((r0 + r) * n + tn * 16 + c)] = dec[r * 16 + c];
      }
      for (int r = 0; r < 16; ++r)
        for (int64_t j = 0; j < n; ++j) {
          const size_t at = size_t((r0 + r) * n + j);
          delta[at] = t[at] - q[at];
        }
    }
  }
  // 7b. Polish: block coordinate descent on the LDLQ result (exl3_polish.h).
  if (!l.empty()) {
    for (int pass = 0; pass < prm.polish_passes; ++pass) polish_pass(hi, t, q, delta, out.trellis, enc, k, n);
    out.polish_passes = prm.polish_passes;
  }
  out.inner.resize(q.size());
  for (size_t i = 0; i < q.size(); ++i) out.inner[i] = float(q[i]);

  // 8. Pack scales, measure; 9. refit the channel scales by least squares (original basis).
  auto measure = [&](const std::vector<double>& su_d, const std::vector<double>& sv_d, std::vector<uint16_t>& suh,
                     std::vector<uint16_t>& svh) -> Result<double> {
    suh.resize(static_cast<size_t>(k));
    svh.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < k; ++i) suh[size_t(i)] = to_f16(su_d[size_t(i)]);
    for (int64_t j = 0; j < n; ++j) svh[size_t(j)] = to_f16(sv_d[size_t(j)]);
    for (uint16_t v : suh)
      if ((v & 0x7c00) == 0x7c00) return make_error("input scale overflows fp16 (weights too large for EXL3)");
    for (uint16_t v : svh)
      if ((v & 0x7c00) == 0x7c00) return make_error("output scale overflows fp16 (weights too large for EXL3)");
    out.suh = suh;
    out.svh = svh;
    std::vector<float> wq = exl3_weight_ref(out.view("measure"));
    return exl3_proxy_error(w, wq.data(), k, n, hd.empty() ? std::vector<double>{} : h_in);
  };
  std::vector<uint16_t> suh0, svh0;
  auto err0 = measure(su, sv, suh0, svh0);
  if (!err0.ok()) return err0.error();
  out.proxy_err_before_refit = out.proxy_err = *err0;

  if (prm.refit) {
    const std::vector<double> hr = hd.empty() ? identity(k) : hd;
    // B = Hk·Ŵ·Hn; W_q = diag(su)·B·diag(sv).
    std::vector<double> b = q;
    had_left(b, k, n);
    had_right(b, k, n);
    std::vector<double> hw(size_t(k * n), 0.0);  // H·W
    for (int64_t i = 0; i < k; ++i)
      for (int64_t l2 = 0; l2 < k; ++l2) {
        const double hil = hr[size_t(i * k + l2)];
        if (hil == 0) continue;
        for (int64_t j = 0; j < n; ++j) hw[size_t(i * n + j)] += hil * w[l2 * n + j];
      }
    std::vector<double> su_r = su, sv_r = sv, qt(size_t(k * n)), hq(static_cast<size_t>(k));
    bool ok = true;
    for (int round = 0; round < prm.refit_rounds && ok; ++round) {
      // Columns: sv_j = (q̃_jᵀ H w_j) / (q̃_jᵀ H q̃_j), q̃_j = su ∘ B_j.
      for (int64_t j = 0; j < n; ++j) {
        if (sv_r[size_t(j)] == 0) continue;
        for (int64_t i = 0; i < k; ++i) qt[size_t(i)] = su_r[size_t(i)] * b[size_t(i * n + j)];
        double num = 0, den = 0;
        for (int64_t i = 0; i < k; ++i) {
          double s = 0;
          for (int64_t l2 = 0; l2 < k; ++l2) s += hr[size_t(i * k + l2)] * qt[size_t(l2)];
          hq[size_t(i)] = s;
          num += hw[size_t(i * n + j)] * qt[size_t(i)];
          den += s * qt[size_t(i)];
        }
        if (den > 0 && std::isfinite(num / den)) sv_r[size_t(j)] = num / den;
      }
      // Rows: ((Q̃Q̃ᵀ) ∘ H)·su = rowsum(Q̃ ∘ (H·W)), Q̃ = B·diag(sv).
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < n; ++j) qt[size_t(i * n + j)] = b[size_t(i * n + j)] * sv_r[size_t(j)];
      std::vector<double> m(size_t(k * k)), rhs(size_t(k), 0.0);
      for (int64_t i = 0; i < k; ++i) {
        for (int64_t a = 0; a <= i; ++a) {
          double s = 0;
          for (int64_t j = 0; j < n; ++j) s += qt[size_t(i * n + j)] * qt[size_t(a * n + j)];
          m[size_t(i * k + a)] = m[size_t(a * k + i)] = s;
        }
        for (int64_t j = 0; j < n; ++j) rhs[size_t(i)] += qt[size_t(i * n + j)] * hw[size_t(i * n + j)];
      }
      for (int64_t i = 0; i < k * k; ++i) m[size_t(i)] *= hr[size_t(i)];
      ok = solve_spd(m, rhs, k);
      if (ok) su_r = rhs;
    }
    if (ok) {
      std::vector<uint16_t> suh1, svh1;
      auto err1 = measure(su_r, sv_r, suh1, svh1);
      if (err1.ok() && *err1 < out.proxy_err) {
        out.proxy_err = *err1;
        out.refit_kept = true;
      } else {
        out.suh = suh0;
        out.svh = svh0;
      }
    } else {
      out.suh = suh0;
      out.svh = svh0;
    }
  }
  out.sigma_reg = hd.empty() ? 0.0 : prm.sigma_reg;
  out.seed = prm.seed;
  out.scale_mult = prm.scale_mult;
  return out;
}

}  // namespace

Result<QuantizedTensor> exl3_quantize_tensor(const float* w, int64_t k, int64_t n, const std::vector<double>& h_in,
                                             const QuantizeParams& prm) {
  const auto t_start = std::chrono::steady_clock::now();
  if (prm.bits < 1 || prm.bits > 8) return make_error("bits ", prm.bits, " outside 1..8");
  if (k <= 0 || n <= 0 || k % 128 != 0 || n % 128 != 0)
    return make_error("shape [", k, ", ", n, "]: both dims must be positive multiples of 128 (pad first)");
  if (!h_in.empty() && h_in.size() != size_t(k * k)) return make_error("Hessian has ", h_in.size(), " entries, expected ", k * k);
  for (int64_t i = 0; i < k * n; ++i)
    if (!std::isfinite(w[i])) return make_error("weight has a non-finite value at [", i / n, ", ", i % n, "]");
  auto best = quantize_search(prm, hessian_usable(h_in, k),
                              [&](const QuantizeParams& p) { return quantize_one(w, k, n, h_in, p); });
  if (!best.ok()) return best;
  best->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return best;
}

}  // namespace spw::quant
