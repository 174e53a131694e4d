// Block coordinate descent after LDLQ; see exl3_polish.h for the derivation and the contract.
#include "quantize/exl3_polish.h"

#include <algorithm>
#include <cmath>

namespace spw::quant {

void polish_block_targets(const double* h_block, const double* g_rows, const double* t_rows,
                          const double* delta_rows, int64_t n, PolishBlock& b, std::vector<float>& tiles) {
  b.n = n;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) {
      b.h[r][c] = h_block[r * 16 + c];
      b.chol[r][c] = 0;
    }
  for (int j = 0; j < 16; ++j) {  // H_ii = C·Cᵀ (PD: a diagonal block of a PD matrix)
    double d = b.h[j][j];
    for (int p = 0; p < j; ++p) d -= b.chol[j][p] * b.chol[j][p];
    b.chol[j][j] = std::sqrt(d);
    for (int i = j + 1; i < 16; ++i) {
      double s = b.h[i][j];
      for (int p = 0; p < j; ++p) s -= b.chol[i][p] * b.chol[j][p];
      b.chol[i][j] = s / b.chol[j][j];
    }
  }
  // off = G_i − H_ii·Δ_i.
  b.off.resize(size_t(16 * n));
  for (int r = 0; r < 16; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double s = g_rows[r * n + j];
      for (int c = 0; c < 16; ++c) s -= b.h[r][c] * delta_rows[c * n + j];
      b.off[size_t(r * n + j)] = s;
    }
  // targets = T_i + H_ii⁻¹·off (two triangular solves per column).
  const int64_t n_tn = n / 16;
  tiles.resize(size_t(n_tn * 256));
  for (int64_t j = 0; j < n; ++j) {
    double y[16];
    for (int r = 0; r < 16; ++r) {
      double s = b.off[size_t(r * n + j)];
      for (int p = 0; p < r; ++p) s -= b.chol[r][p] * y[p];
      y[r] = s / b.chol[r][r];
    }
    for (int r = 15; r >= 0; --r) {
      double s = y[r];
      for (int p = r + 1; p < 16; ++p) s -= b.chol[p][r] * y[p];
      y[r] = s / b.chol[r][r];
    }
    for (int r = 0; r < 16; ++r) tiles[size_t((j / 16) * 256 + r * 16 + j % 16)] = float(t_rows[r * n + j] + y[r]);
  }
}

bool polish_tile_improves(const PolishBlock& b, const double* t_rows, const double* delta_rows, int64_t tn,
                          const float* dec) {
  const int64_t n = b.n;
  double change = 0;
  for (int c = 0; c < 16; ++c) {
    const int64_t j = tn * 16 + c;
    double e0[16], e1[16];
    for (int r = 0; r < 16; ++r) {
      e0[r] = delta_rows[r * n + j];
      e1[r] = t_rows[r * n + j] - double(dec[r * 16 + c]);
    }
    for (int r = 0; r < 16; ++r) {
      double h0 = 0, h1 = 0;
      for (int p = 0; p < 16; ++p) {
        h0 += b.h[r][p] * e0[p];
        h1 += b.h[r][p] * e1[p];
      }
      change += e1[r] * h1 - e0[r] * h0 + 2 * (e1[r] - e0[r]) * b.off[size_t(r * n + j)];
    }
  }
  return change < 0;
}

void polish_tile_keep(const double* t_rows, int64_t n, int64_t tn, const float* dec, double* q_rows,
                      double* delta_rows, double* d_new_rows) {
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) {
      const int64_t at = r * n + tn * 16 + c;
      const double e1 = t_rows[at] - double(dec[r * 16 + c]);
      d_new_rows[at] = e1 - delta_rows[at];
      q_rows[at] = dec[r * 16 + c];
      delta_rows[at] = e1;
    }
}

int64_t polish_pass(const std::vector<double>& hi, const std::vector<double>& t, std::vector<double>& q,
                    std::vector<double>& delta, std::vector<uint16_t>& words, TrellisEncoder& enc, int64_t k,
                    int64_t n) {
  const int64_t n_tk = k / 16, n_tn = n / 16, n_words = 16 * enc.bits();
  std::vector<double> g(size_t(k * n), 0.0);  // G = hi·Δ, kept current as blocks change
  for (int64_t i = 0; i < k; ++i)
    for (int64_t l = 0; l < k; ++l) {
      const double h = hi[size_t(i * k + l)];
      if (h == 0) continue;
      for (int64_t j = 0; j < n; ++j) g[size_t(i * n + j)] += h * delta[size_t(l * n + j)];
    }
  PolishBlock block;
  std::vector<float> tiles;
  std::vector<double> d_new(size_t(16 * n));
  std::vector<uint16_t> wbuf(static_cast<size_t>(n_words));
  double h_block[256];
  float dec[256];
  int64_t changed = 0;
  for (int64_t tk = 0; tk < n_tk; ++tk) {
    const int64_t r0 = tk * 16;
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) h_block[r * 16 + c] = hi[size_t((r0 + r) * k + r0 + c)];
    double* q_rows = &q[size_t(r0 * n)];
    double* delta_rows = &delta[size_t(r0 * n)];
    const double* t_rows = &t[size_t(r0 * n)];
    polish_block_targets(h_block, &g[size_t(r0 * n)], t_rows, delta_rows, n, block, tiles);
    std::fill(d_new.begin(), d_new.end(), 0.0);
    int64_t block_changed = 0;
    for (int64_t tn = 0; tn < n_tn; ++tn) {
      enc.encode_tile_rowmajor(&tiles[size_t(tn * 256)], wbuf.data(), dec);
      if (!polish_tile_improves(block, t_rows, delta_rows, tn, dec)) continue;
      ++block_changed;
      std::copy(wbuf.begin(), wbuf.end(), words.begin() + (tk * n_tn + tn) * n_words);
      polish_tile_keep(t_rows, n, tn, dec, q_rows, delta_rows, d_new.data());
    }
    if (!block_changed) continue;
    changed += block_changed;
    for (int64_t i = 0; i < k; ++i)  // G += hi[:, block]·(Δ_new − Δ_old)
      for (int r = 0; r < 16; ++r) {
        const double h = hi[size_t(i * k + r0 + r)];
        if (h == 0) continue;
        const double* dr = &d_new[size_t(r * n)];
        double* gi = &g[size_t(i * n)];
        for (int64_t j = 0; j < n; ++j) gi[j] += h * dr[j];
      }
  }
  return changed;
}

}  // namespace spw::quant
