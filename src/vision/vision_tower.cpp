// CPU reference of the vision tower and aligner; the contract is in vision_tower.h.
#include "vision/vision_tower.h"

#include <algorithm>
#include <cmath>

#include "base/thread_pool.h"
#include "formats/dtypes.h"

namespace spw::vision {
namespace {

constexpr float kNormEps = 1e-6f;

// y[t] = W x[t] (+ b): W [n_out, n_in] row-major, x [n_tokens, n_in], y [n_tokens, n_out].
std::vector<float> linear(const std::vector<float>& x, int64_t n_tokens, const std::vector<float>& weight,
                          const std::vector<float>* bias, int64_t n_out, int64_t n_in) {
  std::vector<float> y(size_t(n_tokens * n_out));
  // Tokens in parallel: each output value is one loop in index order, so the result never depends on the
  // thread count.
  global_pool().parallel_for(size_t(n_tokens), [&](size_t t0, size_t t1) {
    for (int64_t t = int64_t(t0); t < int64_t(t1); ++t) {
      const float* xt = x.data() + t * n_in;
      for (int64_t o = 0; o < n_out; ++o) {
        const float* wo = weight.data() + o * n_in;
        float acc = 0;
        for (int64_t i = 0; i < n_in; ++i) acc += wo[i] * xt[i];
        y[size_t(t * n_out + o)] = acc + (bias ? (*bias)[size_t(o)] : 0.0f);
      }
    }
  });
  return y;
}

std::vector<float> rms_norm(const std::vector<float>& x, int64_t n_tokens, int64_t d, const std::vector<float>& weight) {
  std::vector<float> y(x.size());
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x.data() + t * d;
    float ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += xt[i] * xt[i];
    const float inv = 1.0f / std::sqrt(ss / float(d) + kNormEps);
    for (int64_t i = 0; i < d; ++i) y[size_t(t * d + i)] = xt[i] * inv * weight[size_t(i)];
  }
  return y;
}

// Rotates one head vector in place: slots j and j + d_head/2 form a pair turned by angle[j].
void rope_2d(float* v, int d_head, const std::vector<float>& cos_a, const std::vector<float>& sin_a) {
  const int half = d_head / 2;
  for (int j = 0; j < half; ++j) {
    const float x1 = v[j], x2 = v[j + half];
    v[j] = x1 * cos_a[size_t(j)] - x2 * sin_a[size_t(j)];
    v[j + half] = x2 * cos_a[size_t(j)] + x1 * sin_a[size_t(j)];
  }
}

// Multi-head bidirectional attention on qkv [n, 3d] (q | k | v), RoPE applied to q and k first.
// Returns [n, d], heads concatenated.
std::vector<float> attention(std::vector<float>& qkv, int n_h, int n_w, int d, int n_heads, double theta) {
  const int n = n_h * n_w, d_head = d / n_heads, half = d_head / 2, n_freq = d_head / 4;
  std::vector<double> inv_freq(static_cast<size_t>(n_freq));
  for (int i = 0; i < n_freq; ++i) inv_freq[size_t(i)] = std::pow(theta, -2.0 * i / half);
  std::vector<float> cos_a(static_cast<size_t>(half)), sin_a(static_cast<size_t>(half));
  for (int t = 0; t < n; ++t) {
    const int row = t / n_w, col = t % n_w;
    for (int j = 0; j < half; ++j) {
      const double angle = j < n_freq ? row * inv_freq[size_t(j)] : col * inv_freq[size_t(j - n_freq)];
      cos_a[size_t(j)] = float(std::cos(angle));
      sin_a[size_t(j)] = float(std::sin(angle));
    }
    for (int h = 0; h < n_heads; ++h) {
      rope_2d(qkv.data() + size_t(t) * 3 * d + size_t(h) * d_head, d_head, cos_a, sin_a);
      rope_2d(qkv.data() + size_t(t) * 3 * d + d + size_t(h) * d_head, d_head, cos_a, sin_a);
    }
  }
  const float scale = 1.0f / std::sqrt(float(d_head));
  std::vector<float> out(static_cast<size_t>(n) * d, 0.0f);
  // (head, query) pairs in parallel, each with its own scores: per pair the same loops as one thread.
  global_pool().parallel_for(size_t(n_heads) * size_t(n), [&](size_t p0, size_t p1) {
    std::vector<float> score(static_cast<size_t>(n));
    for (size_t pair = p0; pair < p1; ++pair) {
      const int h = int(pair / size_t(n)), tq = int(pair % size_t(n));
      const float* q = qkv.data() + size_t(tq) * 3 * d + size_t(h) * d_head;
      float max_s = -INFINITY;
      for (int tk = 0; tk < n; ++tk) {
        const float* k = qkv.data() + size_t(tk) * 3 * d + d + size_t(h) * d_head;
        float s = 0;
        for (int i = 0; i < d_head; ++i) s += q[i] * k[i];
        score[size_t(tk)] = s * scale;
        max_s = std::max(max_s, score[size_t(tk)]);
      }
      float denom = 0;
      for (int tk = 0; tk < n; ++tk) denom += score[size_t(tk)] = std::exp(score[size_t(tk)] - max_s);
      float* o = out.data() + size_t(tq) * d + size_t(h) * d_head;
      for (int tk = 0; tk < n; ++tk) {
        const float p = score[size_t(tk)] / denom;
        const float* v = qkv.data() + size_t(tk) * 3 * d + 2 * d + size_t(h) * d_head;
        for (int i = 0; i < d_head; ++i) o[i] += p * v[i];
      }
    }
  });
  return out;
}

}  // namespace

Result<std::vector<float>> vit_forward_ref(const VisionWeights& w, const std::vector<float>& patches, int n_h, int n_w) {
  const VisionConfig& c = w.config;
  const int64_t d = c.d_model, di = c.d_inter, n_in = 3LL * c.patch_size * c.patch_size;
  if (n_h <= 0 || n_w <= 0) return make_error("vit_forward_ref: empty patch grid ", n_h, "x", n_w);
  const int64_t n = int64_t(n_h) * n_w;
  if (int64_t(patches.size()) != n * n_in)
    return make_error("vit_forward_ref: ", patches.size(), " patch values for a ", n_h, "x", n_w, " grid of ", n_in,
                      "-value patches (expected ", n * n_in, ")");
  // [n, d]
  std::vector<float> x = linear(patches, n, w.patch_embed, &w.patch_embed_bias, d, n_in);
  for (const VitBlockWeights& blk : w.blocks) {
    // [n, d]
    std::vector<float> h = rms_norm(x, n, d, blk.norm1);
    // [n, 3d]: q | k | v, each [n_heads, d_head]
    std::vector<float> qkv = linear(h, n, blk.wqkv, &blk.wqkv_bias, 3 * d, d);
    // [n, d]
    std::vector<float> attn = attention(qkv, n_h, n_w, int(d), c.n_heads, c.rope_theta);
    // [n, d]
    std::vector<float> proj = linear(attn, n, blk.wo, &blk.wo_bias, d, d);
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
    // [n, d]
    h = rms_norm(x, n, d, blk.norm2);
    // [n, 2·d_inter]: gate | up
    std::vector<float> gate_up = linear(h, n, blk.w1, nullptr, 2 * di, d);
    // [n, d_inter]
    std::vector<float> act(size_t(n * di));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < di; ++i) {
        const float g = gate_up[size_t(t * 2 * di + i)], u = gate_up[size_t(t * 2 * di + di + i)];
        act[size_t(t * di + i)] = g / (1.0f + std::exp(-g)) * u;
      }
    }
    // [n, d]
    std::vector<float> mlp = linear(act, n, blk.w2, nullptr, d, di);
    for (size_t i = 0; i < x.size(); ++i) x[i] += mlp[i];
  }
  return rms_norm(x, n, d, w.norm);
}

Result<std::vector<float>> aligner_forward_ref(const VisionWeights& w, const std::vector<float>& vit, int n_h,
                                               int n_w) {
  const int64_t d = w.config.d_model, r = w.config.downsample_ratio, D = w.d_llm;
  if (n_h <= 0 || n_w <= 0) return make_error("aligner_forward_ref: empty patch grid ", n_h, "x", n_w);
  if (int64_t(vit.size()) != int64_t(n_h) * n_w * d)
    return make_error("aligner_forward_ref: ", vit.size(), " values for a ", n_h, "x", n_w, " grid of width ", d,
                      " (expected ", int64_t(n_h) * n_w * d, ")");
  const int64_t n_llm_h = (n_h + r - 1) / r, n_llm_w = (n_w + r - 1) / r, n_cells = n_llm_h * n_llm_w;
  const int64_t n_cell_in = r * r * d;
  // [n_cells, r²·d], channel-major cells; positions past the grid stay zero (the padding)
  std::vector<float> cells(size_t(n_cells * n_cell_in), 0.0f);
  for (int64_t cy = 0; cy < n_llm_h; ++cy) {
    for (int64_t cx = 0; cx < n_llm_w; ++cx) {
      float* cell = cells.data() + (cy * n_llm_w + cx) * n_cell_in;
      for (int64_t i = 0; i < r; ++i) {
        for (int64_t j = 0; j < r; ++j) {
          const int64_t row = cy * r + i, col = cx * r + j;
          if (row >= n_h || col >= n_w) continue;
          const float* src = vit.data() + (row * n_w + col) * d;
          for (int64_t ch = 0; ch < d; ++ch) cell[ch * r * r + i * r + j] = src[ch];
        }
      }
    }
  }
  // [n_cells, D]
  std::vector<float> h = linear(cells, n_cells, w.aligner_w1, &w.aligner_w1_bias, D, n_cell_in);
  for (float& v : h) v = 0.5f * v * (1.0f + std::erf(v * float(M_SQRT1_2)));
  // [n_cells, D]
  return linear(h, n_cells, w.aligner_w2, &w.aligner_w2_bias, D, D);
}

Result<std::vector<float>> vision_encode_ref(const VisionWeights& w, const ProcessedImage& image) {
  const ImageGrid& g = image.grid;
  const int64_t r = w.config.downsample_ratio;
  if (g.n_llm_h != (g.n_vit_h + r - 1) / r || g.n_llm_w != (g.n_vit_w + r - 1) / r)
    return make_error("vision_encode_ref: the image's LLM grid ", g.n_llm_h, "x", g.n_llm_w,
                      " does not follow from its ViT grid ", g.n_vit_h, "x", g.n_vit_w, " and downsample_ratio ", r);
  std::vector<float> patches(image.patches.size());
  for (size_t i = 0; i < patches.size(); ++i) patches[i] = bf16_to_f32(image.patches[i]);
  auto vit = vit_forward_ref(w, patches, g.n_vit_h, g.n_vit_w);
  if (!vit) return vit.error();
  return aligner_forward_ref(w, *vit, g.n_vit_h, g.n_vit_w);
}

std::vector<float> lay_out_span(const ImageGrid& g, const std::vector<float>& cells, const std::vector<float>& start,
                                const std::vector<float>& newline, const std::vector<float>& end) {
  const size_t row = size_t(g.n_llm_w) * start.size();
  std::vector<float> out;
  out.reserve(size_t(g.n_tokens) * start.size());
  out.insert(out.end(), start.begin(), start.end());
  for (int y = 0; y < g.n_llm_h; ++y) {
    out.insert(out.end(), cells.begin() + std::ptrdiff_t(y * row), cells.begin() + std::ptrdiff_t((y + 1) * row));
    out.insert(out.end(), newline.begin(), newline.end());
  }
  out.insert(out.end(), end.begin(), end.end());
  return out;
}

Result<std::vector<float>> image_span_embeddings_ref(const VisionWeights& w, const ProcessedImage& image) {
  auto cells = vision_encode_ref(w, image);
  if (!cells) return cells.error();
  return lay_out_span(image.grid, *cells, w.image_start, w.image_newline, w.image_end);
}

}  // namespace spw::vision
