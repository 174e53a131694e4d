#include "ops/ref/hyper_connection.h"

#include <cmath>

#include "ops/ref/linalg.h"

namespace spw::ref {

HcCoefficients hc_split_sinkhorn(const float* mixes, const float* scale, const float* base, int hc,
                                 int sinkhorn_iters, float hc_eps) {
  HcCoefficients c;
  c.pre.resize(hc);
  c.post.resize(hc);
  c.comb.resize(size_t(hc) * hc);
  for (int j = 0; j < hc; ++j) {
    c.pre[j] = sigmoid(mixes[j] * scale[0] + base[j]) + hc_eps;
    c.post[j] = 2.0f * sigmoid(mixes[hc + j] * scale[1] + base[hc + j]);
  }
  float* m = c.comb.data();
  for (int j = 0; j < hc; ++j) {  // softmax over k for each row j
    float mx = -INFINITY;
    for (int k = 0; k < hc; ++k) {
      m[j * hc + k] = mixes[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
      mx = std::fmax(mx, m[j * hc + k]);
    }
    float sum = 0.f;
    for (int k = 0; k < hc; ++k) sum += (m[j * hc + k] = std::exp(m[j * hc + k] - mx));
    for (int k = 0; k < hc; ++k) m[j * hc + k] = m[j * hc + k] / sum + hc_eps;
  }
  auto normalize_columns = [&] {
    for (int k = 0; k < hc; ++k) {
      float s = 0.f;
      for (int j = 0; j < hc; ++j) s += m[j * hc + k];
      for (int j = 0; j < hc; ++j) m[j * hc + k] /= (s + hc_eps);
    }
  };
  auto normalize_rows = [&] {
    for (int j = 0; j < hc; ++j) {
      float s = 0.f;
      for (int k = 0; k < hc; ++k) s += m[j * hc + k];
      for (int k = 0; k < hc; ++k) m[j * hc + k] /= (s + hc_eps);
    }
  };
  normalize_columns();
  for (int it = 1; it < sinkhorn_iters; ++it) {
    normalize_rows();
    normalize_columns();
  }
  return c;
}

void hc_mixes(const float* x_streams, const float* fn, size_t n_out, size_t hc_d, float norm_eps, float* mixes) {
  double ss = 0.0;
  for (size_t i = 0; i < hc_d; ++i) ss += double(x_streams[i]) * x_streams[i];
  float inv = 1.0f / std::sqrt(float(ss / double(hc_d)) + norm_eps);
  for (size_t o = 0; o < n_out; ++o) {
    float acc = 0.f;
    const float* w = fn + o * hc_d;
    for (size_t i = 0; i < hc_d; ++i) acc += w[i] * x_streams[i];
    mixes[o] = acc * inv;
  }
}

void hc_collapse(const float* x_streams, const float* pre, int hc, size_t d, float* y) {
  for (size_t i = 0; i < d; ++i) {
    float acc = 0.f;
    for (int j = 0; j < hc; ++j) acc += pre[j] * x_streams[j * d + i];
    y[i] = acc;
  }
}

void hc_expand(float* x_streams, const float* y, const float* post, const float* comb, int hc, size_t d) {
  std::vector<float> out(size_t(hc) * d);
  for (int k = 0; k < hc; ++k)
    for (size_t i = 0; i < d; ++i) {
      // Mix first, then add the sublayer output: the reference's order of f32 additions.
      float mixed = 0.f;
      for (int j = 0; j < hc; ++j) mixed += comb[j * hc + k] * x_streams[j * d + i];
      out[k * d + i] = post[k] * y[i] + mixed;
    }
  std::copy(out.begin(), out.end(), x_streams);
}

}  // namespace spw::ref
