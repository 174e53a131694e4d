// One tensor through the EXL3 quantizer on the GPU; see exl3_quantize_cuda.h. The numbered steps
// are those of exl3_quantize_tensor (quantize/exl3_quantize.cpp); host-side arithmetic on small
// vectors (signs, channel scales, the global-scale grid) is the CPU code's, in the same order.
#include "quantize/cuda/exl3_quantize_cuda.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "quantize/cuda/cuda_check.h"
#include "quantize/exl3_polish.h"

namespace spw::quant {
namespace {

constexpr int kThreads = 256;
unsigned blocks_for(int64_t count) { return unsigned((count + kThreads - 1) / kThreads); }

// A stream-ordered device buffer, freed on the stream when it goes out of scope.
template <class T>
struct DevBuf {
  T* p = nullptr;
  cudaStream_t s = nullptr;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  ~DevBuf() { reset(); }
  void reset() {
    if (p) cudaFreeAsync(p, s);
    p = nullptr;
  }
  Status alloc(int64_t count, cudaStream_t stream) {
    s = stream;
    return cuda_status(cudaMallocAsync(&p, size_t(std::max<int64_t>(count, 1)) * sizeof(T), stream), "cudaMallocAsync");
  }
};

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ int perm_row(int p) {
  const int t = p >> 3, j = p & 7;
  return 2 * (t & 3) + (j & 1) + 8 * ((j >> 1) & 1);
}
__device__ __forceinline__ int perm_col(int p) {
  const int t = p >> 3, j = p & 7;
  return (t >> 2) + 8 * ((j >> 2) & 1);
}

__global__ void f32_to_f64_kernel(const float* __restrict__ a, int64_t count, double* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = a[i];
}
__global__ void f64_to_f32_kernel(const double* __restrict__ a, int64_t count, float* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = float(a[i]);
}
// Σ_i x[i][j]² per column, i ascending (the CPU's order).
__global__ void col_sumsq_kernel(const double* __restrict__ x, int64_t k, int64_t n, double* __restrict__ out) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  double s = 0;
  for (int64_t i = 0; i < k; ++i) s += x[i * n + j] * x[i * n + j];
  out[j] = s;
}
// Σ_j x[i][j]² per row, j ascending.
__global__ void row_sumsq_kernel(const double* __restrict__ x, int64_t k, int64_t n, double* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= k) return;
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += x[i * n + j] * x[i * n + j];
  out[i] = s;
}
// x[i][j] ← sv[j] ≠ 0 ? x / sv[j] : 0 (the CPU's oc > 0 test: sv = ±oc).
__global__ void div_cols_kernel(double* __restrict__ x, int64_t k, int64_t n, const double* __restrict__ sv) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= k * n) return;
  const double s = sv[i % n];
  x[i] = s != 0 ? x[i] / s : 0.0;
}
__global__ void div_rows_kernel(double* __restrict__ x, int64_t k, int64_t n, const double* __restrict__ su) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < k * n) x[i] /= su[i / n];
}
// out[i][j] = f[i]·x[i][j] (rows) or x[i][j]·f[j] (cols); out may alias x.
__global__ void mul_rows_kernel(const double* x, int64_t k, int64_t n, const double* __restrict__ f, double* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < k * n) out[i] = f[i / n] * x[i];
}
__global__ void mul_cols_kernel(const double* x, int64_t k, int64_t n, const double* __restrict__ f, double* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < k * n) out[i] = x[i] * f[i % n];
}
__global__ void scale_kernel(double* __restrict__ x, int64_t count, double s) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] *= s;
}
__global__ void add_diag_kernel(double* __restrict__ h, int64_t k, double add) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < k) h[i * k + i] += add;
}
__global__ void copy_diag_kernel(const double* __restrict__ h, int64_t k, double* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < k) out[i] = h[i * k + i];
}
// m ← m ∘ H (h null: identity).
__global__ void hadamard_product_kernel(double* __restrict__ m, int64_t k, const double* __restrict__ h) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < k * k) m[i] *= h ? h[i] : (i / k == i % k ? 1.0 : 0.0);
}
// Sample tiles for the global-scale search: out[s][p] = float(scale[s]·t[tile s at position p]).
__global__ void gather_tiles_kernel(const double* __restrict__ t, int64_t n, const int64_t* __restrict__ tile_tk,
                                    const int64_t* __restrict__ tile_tn, const double* __restrict__ scale,
                                    int n_tiles, float* __restrict__ out) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= n_tiles * 256) return;
  const int s = idx >> 8, p = idx & 255;
  out[idx] = float(scale[s] * t[(tile_tk[s] * 16 + perm_row(p)) * n + tile_tn[s] * 16 + perm_col(p)]);
}
// dd = double(float(x[i][j]·svh[j])) − w[i][j]: ΔW of the decoded tensor, as exl3_weight_ref rounds it.
__global__ void weight_delta_kernel(const double* x, int64_t k, int64_t n, const double* __restrict__ svh,
                                    const double* __restrict__ w, double* dd) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < k * n) dd[i] = double(float(x[i] * svh[i % n])) - w[i];
}
// num[j] = Σ_i a[i][j]·c[i][j], den[j] = Σ_i b[i][j]·c[i][j] (i ascending).
__global__ void col_dots_kernel(const double* __restrict__ a, const double* __restrict__ b, const double* __restrict__ c,
                                int64_t k, int64_t n, double* __restrict__ num, double* __restrict__ den) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  double sn = 0, sd = 0;
  for (int64_t i = 0; i < k; ++i) {
    sn += a[i * n + j] * c[i * n + j];
    sd += b[i * n + j] * c[i * n + j];
  }
  num[j] = sn;
  den[j] = sd;
}
// out[i] = Σ_j a[i][j]·b[i][j] (j ascending).
__global__ void row_dots_kernel(const double* __restrict__ a, const double* __restrict__ b, int64_t k, int64_t n,
                                double* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= k) return;
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += a[i * n + j] * b[i * n + j];
  out[i] = s;
}

template <class T>
Status upload(T* dst, const std::vector<T>& src, cudaStream_t s) {
  return cuda_status(cudaMemcpyAsync(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice, s), "upload");
}
template <class T>
Status download(std::vector<T>& dst, const T* src, cudaStream_t s) {
  QCUDA_TRY(cudaMemcpyAsync(dst.data(), src, dst.size() * sizeof(T), cudaMemcpyDeviceToHost, s));
  return cuda_status(cudaStreamSynchronize(s), "download");
}

}  // namespace

Result<std::unique_ptr<Exl3CudaQuantizer>> Exl3CudaQuantizer::create() {
  std::unique_ptr<Exl3CudaQuantizer> q(new Exl3CudaQuantizer());
  SPW_TRY(quant_cuda_context_create(q->ctx_));
  return Result<std::unique_ptr<Exl3CudaQuantizer>>(std::move(q));
}

Exl3CudaQuantizer::~Exl3CudaQuantizer() {
  if (ctx_.stream) cudaStreamSynchronize(ctx_.stream);
  trellis_cuda_workspace_free(trellis_);
  quant_cuda_context_destroy(ctx_);
}

Status Exl3CudaQuantizer::ensure_trellis(int bits, Exl3Codebook cb, int tiles) {
  if (trellis_.bits == bits && trellis_.codebook == cb && trellis_.max_tiles >= tiles) return {};
  QCUDA_TRY(cudaStreamSynchronize(ctx_.stream));
  return trellis_cuda_workspace_alloc(trellis_, bits, cb, tiles);
}

Result<QuantizedTensor> Exl3CudaQuantizer::quantize(const float* w, int64_t k, int64_t n,
                                                     const std::vector<double>& h_in, const QuantizeParams& prm) {
  const auto t_start = std::chrono::steady_clock::now();
  if (prm.bits < 1 || prm.bits > 8) return make_error("bits ", prm.bits, " outside 1..8");
  if (k <= 0 || n <= 0 || k % 128 != 0 || n % 128 != 0)
    return make_error("shape [", k, ", ", n, "]: both dims must be positive multiples of 128 (pad first)");
  if (!h_in.empty() && h_in.size() != size_t(k * k)) return make_error("Hessian has ", h_in.size(), " entries, expected ", k * k);
  for (int64_t i = 0; i < k * n; ++i)
    if (!std::isfinite(w[i])) return make_error("weight has a non-finite value at [", i / n, ", ", i % n, "]");
  // The CPU's candidate search (quantize_search): same candidates, order, tie rule and polished winner.
  auto best = quantize_search(prm, hessian_usable(h_in, k),
                              [&](const QuantizeParams& p) { return quantize_one(w, k, n, h_in, p); });
  if (!best.ok()) return best;
  best->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return best;
}

Result<QuantizedTensor> Exl3CudaQuantizer::quantize_one(const float* w, int64_t k, int64_t n,
                                                         const std::vector<double>& h_in, const QuantizeParams& prm) {
  cudaStream_t s = ctx_.stream;

  QuantizedTensor out;
  out.k = k;
  out.n = n;
  out.bits = prm.bits;
  out.codebook = prm.codebook;
  const int64_t kn = k * n, kk = k * k;

  // 1. Regularised Hessian (original basis): d_h = H as given (proxy error), d_hd = regularised.
  bool use_h = false;
  double mean_diag_in = 0;
  if (!h_in.empty()) {
    bool finite = true;
    for (double v : h_in) finite &= std::isfinite(v);
    for (int64_t i = 0; i < k; ++i) mean_diag_in += h_in[size_t(i * k + i)];
    mean_diag_in /= double(k);
    use_h = finite && mean_diag_in > 1e-20;
    out.fell_back_to_identity = !use_h;
  }
  DevBuf<double> d_h, d_hd, d_hi;
  if (use_h) {
    SPW_TRY(d_h.alloc(kk, s));
    SPW_TRY(d_hd.alloc(kk, s));
    SPW_TRY(d_hi.alloc(kk, s));
    SPW_TRY(upload(d_h.p, h_in, s));
    QCUDA_TRY(cudaMemcpyAsync(d_hd.p, d_h.p, size_t(kk) * sizeof(double), cudaMemcpyDeviceToDevice, s));
    add_diag_kernel<<<blocks_for(k), kThreads, 0, s>>>(d_hd.p, k, prm.sigma_reg * mean_diag_in);
  }

  // 2. Random signs.
  uint64_t rng = prm.seed;
  std::vector<double> su(static_cast<size_t>(k)), sv(static_cast<size_t>(n));
  for (auto& v : su) v = (splitmix64(rng) >> 63) ? -1.0 : 1.0;
  for (auto& v : sv) v = (splitmix64(rng) >> 63) ? -1.0 : 1.0;

  // 3. Output-channel scales, output Hadamard, input-channel scales, input Hadamard.
  DevBuf<float> d_w32;
  DevBuf<double> d_w, d_t, d_vec_k, d_vec_n;
  SPW_TRY(d_w32.alloc(kn, s));
  SPW_TRY(d_w.alloc(kn, s));
  SPW_TRY(d_t.alloc(kn, s));
  SPW_TRY(d_vec_k.alloc(k, s));
  SPW_TRY(d_vec_n.alloc(n, s));
  QCUDA_TRY(cudaMemcpyAsync(d_w32.p, w, size_t(kn) * sizeof(float), cudaMemcpyHostToDevice, s));
  f32_to_f64_kernel<<<blocks_for(kn), kThreads, 0, s>>>(d_w32.p, kn, d_w.p);
  QCUDA_TRY(cudaMemcpyAsync(d_t.p, d_w.p, size_t(kn) * sizeof(double), cudaMemcpyDeviceToDevice, s));
  std::vector<double> col_rms(static_cast<size_t>(n)), row_rms(static_cast<size_t>(k));
  col_sumsq_kernel<<<blocks_for(n), kThreads, 0, s>>>(d_t.p, k, n, d_vec_n.p);
  SPW_TRY(download(col_rms, d_vec_n.p, s));
  double mean_rms = 0;
  for (auto& v : col_rms) mean_rms += (v = std::sqrt(v / double(k)));
  mean_rms /= double(n);
  for (int64_t j = 0; j < n; ++j) sv[size_t(j)] *= mean_rms > 0 ? col_rms[size_t(j)] / mean_rms : 0.0;
  SPW_TRY(upload(d_vec_n.p, sv, s));
  div_cols_kernel<<<blocks_for(kn), kThreads, 0, s>>>(d_t.p, k, n, d_vec_n.p);
  had_right_cuda(ctx_, d_t.p, k, n);
  row_sumsq_kernel<<<blocks_for(k), kThreads, 0, s>>>(d_t.p, k, n, d_vec_k.p);
  SPW_TRY(download(row_rms, d_vec_k.p, s));
  for (int64_t i = 0; i < k; ++i) {
    const double rms = std::sqrt(row_rms[size_t(i)] / double(n));
    su[size_t(i)] *= rms > 0 ? rms : 1.0;
  }
  SPW_TRY(upload(d_vec_k.p, su, s));
  div_rows_kernel<<<blocks_for(kn), kThreads, 0, s>>>(d_t.p, k, n, d_vec_k.p);
  had_left_cuda(ctx_, d_t.p, k, n);
  const double cb_sigma = codebook_sigma(prm.codebook);
  scale_kernel<<<blocks_for(kn), kThreads, 0, s>>>(d_t.p, kn, cb_sigma);
  for (auto& v : su) v /= cb_sigma;

  // 4. Hessian in the rotated basis: Hk·diag(su)·H·diag(su)·Hk.
  if (use_h) {
    SPW_TRY(upload(d_vec_k.p, su, s));
    hessian_rotate_cuda(ctx_, d_hd.p, d_vec_k.p, k, d_hi.p);
  }

  const int64_t n_tk = k / 16, n_tn = n / 16, words = 16 * prm.bits;
  const float* lut = exl3_codebook_lut_f32(prm.codebook);

  // 5. Global scale g: the CPU's sample tiles and grid, encoded on the GPU in one launch.
  {
    const int64_t n_tiles = n_tk * n_tn;
    const int n_sample = int(std::min<int64_t>(prm.scale_sample_tiles, n_tiles));
    std::vector<double> grid;
    for (int i = 0; i <= 4; ++i) grid.push_back(0.8 + 0.1 * i);
    const int n_enc = int(grid.size()) * n_sample;
    std::vector<int64_t> tile_tk, tile_tn;
    std::vector<double> tile_scale;
    for (size_t gi = 0; gi < grid.size(); ++gi)
      for (int si = 0; si < n_sample; ++si) {
        const int64_t idx = (int64_t(si) * n_tiles) / n_sample + (si * 7) % std::max<int64_t>(1, n_tiles / n_sample);
        tile_tk.push_back(idx / n_tn);
        tile_tn.push_back(idx % n_tn);
        tile_scale.push_back(grid[gi]);
      }
    SPW_TRY(ensure_trellis(prm.bits, prm.codebook, int(std::max<int64_t>(n_tn, n_enc))));
    DevBuf<int64_t> d_tk, d_tn;
    DevBuf<double> d_sc;
    DevBuf<float> d_tg;
    DevBuf<uint16_t> d_st;
    SPW_TRY(d_tk.alloc(n_enc, s));
    SPW_TRY(d_tn.alloc(n_enc, s));
    SPW_TRY(d_sc.alloc(n_enc, s));
    SPW_TRY(d_tg.alloc(int64_t(n_enc) * 256, s));
    SPW_TRY(d_st.alloc(int64_t(n_enc) * 256, s));
    SPW_TRY(upload(d_tk.p, tile_tk, s));
    SPW_TRY(upload(d_tn.p, tile_tn, s));
    SPW_TRY(upload(d_sc.p, tile_scale, s));
    gather_tiles_kernel<<<blocks_for(int64_t(n_enc) * 256), kThreads, 0, s>>>(d_t.p, n, d_tk.p, d_tn.p, d_sc.p, n_enc,
                                                                              d_tg.p);
    SPW_TRY(trellis_encode_tiles_cuda(d_tg.p, n_enc, d_st.p, trellis_, s));
    std::vector<float> targets(size_t(n_enc) * 256);
    std::vector<uint16_t> states(size_t(n_enc) * 256);
    SPW_TRY(download(targets, d_tg.p, s));
    SPW_TRY(download(states, d_st.p, s));
    std::vector<double> err(grid.size(), 0.0);
    float tile[256], dec[256];
    for (int e = 0; e < n_enc; ++e) {
      for (int p = 0; p < 256; ++p) {
        const int at = exl3_perm_row(p) * 16 + exl3_perm_col(p);
        tile[at] = targets[size_t(e) * 256 + size_t(p)];
        dec[at] = lut[states[size_t(e) * 256 + size_t(p)]];
      }
      const double g = tile_scale[size_t(e)];
      for (int i = 0; i < 256; ++i) {
        const double d = dec[i] / g - tile[i] / g;
        err[size_t(e / n_sample)] += d * d;
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
    scale_kernel<<<blocks_for(kn), kThreads, 0, s>>>(d_t.p, kn, g);
    for (auto& v : su) v /= g;
  }

  // 6. Block LDL of the rotated Hessian; retries with more damping, else no feedback.
  DevBuf<double> d_l;
  bool have_l = false;
  if (use_h && prm.ldlq) {
    SPW_TRY(d_l.alloc(kk, s));
    std::vector<double> diag(static_cast<size_t>(k));
    copy_diag_kernel<<<blocks_for(k), kThreads, 0, s>>>(d_hi.p, k, d_vec_k.p);
    SPW_TRY(download(diag, d_vec_k.p, s));
    double mean_diag = 0;
    for (double v : diag) mean_diag += v;
    mean_diag /= double(k);
    for (int attempt = 0; attempt < 10 && !have_l; ++attempt) {
      bool not_pd = false;
      SPW_TRY(block_ldl_cuda(ctx_, d_hi.p, k, d_l.p, &not_pd));
      if (!not_pd) have_l = true;
      else add_diag_kernel<<<blocks_for(k), kThreads, 0, s>>>(d_hi.p, k, 2 * prm.sigma_reg * mean_diag);
    }
    if (!have_l) out.fell_back_to_identity = true;
  }
  const bool polish = have_l && prm.polish_passes > 0;
  if (!polish) d_hi.reset();  // the rotated Hessian is not needed past the LDL (and the polish)

  // 7. LDLQ: 16-row blocks from the last up, all tiles of a block in one Viterbi launch.
  DevBuf<double> d_q, d_delta;
  DevBuf<float> d_targets;
  DevBuf<uint16_t> d_states, d_words;
  SPW_TRY(d_q.alloc(kn, s));
  SPW_TRY(d_delta.alloc(kn, s));
  SPW_TRY(d_targets.alloc(n_tn * 256, s));
  SPW_TRY(d_states.alloc(n_tn * 256, s));
  SPW_TRY(d_words.alloc(n_tk * n_tn * words, s));
  QCUDA_TRY(cudaMemsetAsync(d_delta.p, 0, size_t(kn) * sizeof(double), s));
  for (int64_t tk = n_tk - 1; tk >= 0; --tk) {
    const int64_t r0 = tk * 16;
    ldlq_targets_cuda(ctx_, d_t.p, have_l ? d_l.p : nullptr, d_delta.p, k, n, r0, d_targets.p);
    SPW_TRY(trellis_encode_tiles_cuda(d_targets.p, int(n_tn), d_states.p, trellis_, s));
    trellis_pack_tiles_cuda(d_states.p, int(n_tn), prm.bits, d_words.p + tk * n_tn * words, s);
    ldlq_decode_cuda(ctx_, d_states.p, trellis_.lut32, d_t.p, n, r0, d_q.p, d_delta.p);
  }
  QCUDA_TRY(cudaGetLastError());
  out.trellis.resize(size_t(n_tk * n_tn * words));
  SPW_TRY(download(out.trellis, d_words.p, s));

  // 7b. Polish (exl3_polish.h): G = hi·Δ stays on the GPU; per block, the host downloads its rows,
  // makes the targets and the keep decisions with the CPU's functions, the GPU encodes the tiles.
  for (int pass = 0; polish && pass < prm.polish_passes; ++pass) {
    DevBuf<double> d_g, d_dnew;
    SPW_TRY(d_g.alloc(kn, s));
    SPW_TRY(d_dnew.alloc(16 * n, s));
    SPW_TRY(gemm_cuda(ctx_, d_hi.p, d_delta.p, d_g.p, k, k, n));
    const size_t rows = size_t(16 * n);
    std::vector<double> g_rows(rows), t_rows(rows), delta_rows(rows), q_rows(rows), d_new(rows), h_block(256);
    std::vector<float> tiles, tc(size_t(n_tn * 256));
    std::vector<uint16_t> states(size_t(n_tn * 256));
    PolishBlock block;
    float dec[256];
    for (int64_t tk = 0; tk < n_tk; ++tk) {
      const int64_t r0 = tk * 16;
      QCUDA_TRY(cudaMemcpy2DAsync(h_block.data(), 16 * sizeof(double), d_hi.p + r0 * k + r0, size_t(k) * sizeof(double),
                                  16 * sizeof(double), 16, cudaMemcpyDeviceToHost, s));
      QCUDA_TRY(cudaMemcpyAsync(t_rows.data(), d_t.p + r0 * n, rows * sizeof(double), cudaMemcpyDeviceToHost, s));
      QCUDA_TRY(cudaMemcpyAsync(delta_rows.data(), d_delta.p + r0 * n, rows * sizeof(double), cudaMemcpyDeviceToHost, s));
      QCUDA_TRY(cudaMemcpyAsync(q_rows.data(), d_q.p + r0 * n, rows * sizeof(double), cudaMemcpyDeviceToHost, s));
      SPW_TRY(download(g_rows, d_g.p + r0 * n, s));
      polish_block_targets(h_block.data(), g_rows.data(), t_rows.data(), delta_rows.data(), n, block, tiles);
      for (int64_t tn = 0; tn < n_tn; ++tn)  // row-major tiles → tensor-core order (the encoder's input)
        for (int p = 0; p < 256; ++p) tc[size_t(tn * 256 + p)] = tiles[size_t(tn * 256 + exl3_perm_row(p) * 16 + exl3_perm_col(p))];
      SPW_TRY(upload(d_targets.p, tc, s));
      SPW_TRY(trellis_encode_tiles_cuda(d_targets.p, int(n_tn), d_states.p, trellis_, s));
      SPW_TRY(download(states, d_states.p, s));
      std::fill(d_new.begin(), d_new.end(), 0.0);
      bool changed = false;
      for (int64_t tn = 0; tn < n_tn; ++tn) {
        const uint16_t* st = &states[size_t(tn * 256)];
        for (int p = 0; p < 256; ++p) dec[exl3_perm_row(p) * 16 + exl3_perm_col(p)] = lut[st[p]];
        if (!polish_tile_improves(block, t_rows.data(), delta_rows.data(), tn, dec)) continue;
        changed = true;
        exl3_pack_tile(st, prm.bits, &out.trellis[size_t((tk * n_tn + tn) * words)]);
        polish_tile_keep(t_rows.data(), n, tn, dec, q_rows.data(), delta_rows.data(), d_new.data());
      }
      if (!changed) continue;
      SPW_TRY(upload(d_q.p + r0 * n, q_rows, s));
      SPW_TRY(upload(d_delta.p + r0 * n, delta_rows, s));
      SPW_TRY(upload(d_dnew.p, d_new, s));
      // G += hi[:, block]·(Δ_new − Δ_old). Column-major view: Gᵀ [n][k] += (Δ_new − Δ_old)ᵀ [n][16] ·
      // hi[:, block]ᵀ [16][k], the latter being hi's row-major storage from column r0 (ld k).
      const double one = 1.0;
      QCUBLAS_TRY(cublasDgemm(ctx_.blas, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(k), 16, &one, d_dnew.p, int(n),
                              d_hi.p + r0, int(k), &one, d_g.p, int(n)));
    }
    QCUDA_TRY(cudaStreamSynchronize(s));  // the host row buffers die here; pageable uploads are staged already
  }
  if (polish) out.polish_passes = prm.polish_passes;
  d_hi.reset();
  {
    DevBuf<float> d_inner;
    SPW_TRY(d_inner.alloc(kn, s));
    f64_to_f32_kernel<<<blocks_for(kn), kThreads, 0, s>>>(d_q.p, kn, d_inner.p);
    out.inner.resize(size_t(kn));
    SPW_TRY(download(out.inner, d_inner.p, s));
  }

  // 8. Pack scales, measure (proxy error of the decoded tensor against H as given, or I).
  const double* h_proxy = use_h ? d_h.p : nullptr;
  DevBuf<double> d_x, d_scratch;
  SPW_TRY(d_x.alloc(kn, s));
  SPW_TRY(d_scratch.alloc(kn, s));
  auto den = trace_form_cuda(ctx_, h_proxy, d_w.p, d_w.p, k, n, d_scratch.p);
  if (!den.ok()) return den.error();
  auto measure = [&](const std::vector<double>& su_d, const std::vector<double>& sv_d, std::vector<uint16_t>& suh,
                     std::vector<uint16_t>& svh) -> Result<double> {
    suh.resize(static_cast<size_t>(k));
    svh.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < k; ++i) suh[size_t(i)] = exl3_f64_to_f16(su_d[size_t(i)]);
    for (int64_t j = 0; j < n; ++j) svh[size_t(j)] = exl3_f64_to_f16(sv_d[size_t(j)]);
    for (uint16_t v : suh)
      if ((v & 0x7c00) == 0x7c00) return make_error("input scale overflows fp16 (weights too large for EXL3)");
    for (uint16_t v : svh)
      if ((v & 0x7c00) == 0x7c00) return make_error("output scale overflows fp16 (weights too large for EXL3)");
    out.suh = suh;
    out.svh = svh;
    std::vector<double> fk(static_cast<size_t>(k)), fn(static_cast<size_t>(n));
    for (int64_t i = 0; i < k; ++i) fk[size_t(i)] = exl3_f16_to_f32(suh[size_t(i)]);
    for (int64_t j = 0; j < n; ++j) fn[size_t(j)] = exl3_f16_to_f32(svh[size_t(j)]);
    SPW_TRY(upload(d_vec_k.p, fk, s));
    SPW_TRY(upload(d_vec_n.p, fn, s));
    // exl3_weight_ref: diag(suh)·Hk·Ŵ·Hn·diag(svh) in fp64, rounded to fp32 once.
    QCUDA_TRY(cudaMemcpyAsync(d_x.p, d_q.p, size_t(kn) * sizeof(double), cudaMemcpyDeviceToDevice, s));
    had_left_cuda(ctx_, d_x.p, k, n);
    mul_rows_kernel<<<blocks_for(kn), kThreads, 0, s>>>(d_x.p, k, n, d_vec_k.p, d_x.p);
    had_right_cuda(ctx_, d_x.p, k, n);
    weight_delta_kernel<<<blocks_for(kn), kThreads, 0, s>>>(d_x.p, k, n, d_vec_n.p, d_w.p, d_x.p);
    if (!(*den > 0)) return 0.0;
    auto num = trace_form_cuda(ctx_, h_proxy, d_x.p, d_x.p, k, n, d_scratch.p);
    if (!num.ok()) return num.error();
    return *num / *den;
  };
  std::vector<uint16_t> suh0, svh0;
  auto err0 = measure(su, sv, suh0, svh0);
  if (!err0.ok()) return err0.error();
  out.proxy_err_before_refit = out.proxy_err = *err0;

  // 9. Refit the channel scales by least squares (original basis, regularised H or I).
  if (prm.refit) {
    const double* hr = use_h ? d_hd.p : nullptr;
    DevBuf<double> d_b, d_hw, d_qt, d_m;
    SPW_TRY(d_b.alloc(kn, s));
    SPW_TRY(d_hw.alloc(kn, s));
    SPW_TRY(d_qt.alloc(kn, s));
    SPW_TRY(d_m.alloc(kk, s));
    // B = Hk·Ŵ·Hn; W_q = diag(su)·B·diag(sv).
    QCUDA_TRY(cudaMemcpyAsync(d_b.p, d_q.p, size_t(kn) * sizeof(double), cudaMemcpyDeviceToDevice, s));
    had_left_cuda(ctx_, d_b.p, k, n);
    had_right_cuda(ctx_, d_b.p, k, n);
    if (hr) SPW_TRY(gemm_cuda(ctx_, hr, d_w.p, d_hw.p, k, k, n));  // H·W
    else QCUDA_TRY(cudaMemcpyAsync(d_hw.p, d_w.p, size_t(kn) * sizeof(double), cudaMemcpyDeviceToDevice, s));
    std::vector<double> su_r = su, sv_r = sv, num(static_cast<size_t>(n)), dens(static_cast<size_t>(n));
    std::vector<double> rhs(static_cast<size_t>(k)), diag(static_cast<size_t>(k));
    DevBuf<double> d_num, d_diag, d_work;
    DevBuf<int> d_info;
    SPW_TRY(d_num.alloc(n, s));
    SPW_TRY(d_diag.alloc(k, s));
    SPW_TRY(d_info.alloc(1, s));
    int lwork = 0;
    QCUSOLVER_TRY(cusolverDnDpotrf_bufferSize(ctx_.solver, CUBLAS_FILL_MODE_LOWER, int(k), d_m.p, int(k), &lwork));
    SPW_TRY(d_work.alloc(lwork, s));
    bool ok = true;
    for (int round = 0; round < prm.refit_rounds && ok; ++round) {
      // Columns: sv_j = (q̃_jᵀ H w_j) / (q̃_jᵀ H q̃_j), q̃_j = su ∘ B_j.
      SPW_TRY(upload(d_vec_k.p, su_r, s));
      mul_rows_kernel<<<blocks_for(kn), kThreads, 0, s>>>(d_b.p, k, n, d_vec_k.p, d_qt.p);
      const double* hq = d_qt.p;
      if (hr) {
        SPW_TRY(gemm_cuda(ctx_, hr, d_qt.p, d_scratch.p, k, k, n));
        hq = d_scratch.p;
      }
      col_dots_kernel<<<blocks_for(n), kThreads, 0, s>>>(d_hw.p, hq, d_qt.p, k, n, d_num.p, d_vec_n.p);
      SPW_TRY(download(num, d_num.p, s));
      SPW_TRY(download(dens, d_vec_n.p, s));
      for (int64_t j = 0; j < n; ++j) {
        if (sv_r[size_t(j)] == 0) continue;
        const double nd = num[size_t(j)], dd = dens[size_t(j)];
        if (dd > 0 && std::isfinite(nd / dd)) sv_r[size_t(j)] = nd / dd;
      }
      // Rows: ((Q̃Q̃ᵀ) ∘ H)·su = rowsum(Q̃ ∘ (H·W)), Q̃ = B·diag(sv).
      SPW_TRY(upload(d_vec_n.p, sv_r, s));
      mul_cols_kernel<<<blocks_for(kn), kThreads, 0, s>>>(d_b.p, k, n, d_vec_n.p, d_qt.p);
      const double one = 1.0, zero = 0.0;
      // Row-major Q̃ is column-major Q̃ᵀ (n×k): M = (Q̃ᵀ)ᵀ·Q̃ᵀ.
      QCUBLAS_TRY(cublasDgemm(ctx_.blas, CUBLAS_OP_T, CUBLAS_OP_N, int(k), int(k), int(n), &one, d_qt.p, int(n), d_qt.p,
                              int(n), &zero, d_m.p, int(k)));
      row_dots_kernel<<<blocks_for(k), kThreads, 0, s>>>(d_qt.p, d_hw.p, k, n, d_vec_k.p);
      hadamard_product_kernel<<<blocks_for(kk), kThreads, 0, s>>>(d_m.p, k, hr);
      // solve_spd: ridge 1e-9·mean diag, Cholesky, two triangular solves.
      copy_diag_kernel<<<blocks_for(k), kThreads, 0, s>>>(d_m.p, k, d_diag.p);
      SPW_TRY(download(diag, d_diag.p, s));
      double mean_diag = 0;
      for (double v : diag) mean_diag += v;
      mean_diag /= double(k);
      if (!(mean_diag > 0)) {
        ok = false;
        break;
      }
      add_diag_kernel<<<blocks_for(k), kThreads, 0, s>>>(d_m.p, k, 1e-9 * mean_diag);
      QCUSOLVER_TRY(cusolverDnDpotrf(ctx_.solver, CUBLAS_FILL_MODE_LOWER, int(k), d_m.p, int(k), d_work.p, lwork,
                                     d_info.p));
      int info = 0;
      QCUDA_TRY(cudaMemcpyAsync(&info, d_info.p, sizeof(int), cudaMemcpyDeviceToHost, s));
      QCUDA_TRY(cudaStreamSynchronize(s));
      if (info != 0) {
        ok = false;
        break;
      }
      QCUSOLVER_TRY(cusolverDnDpotrs(ctx_.solver, CUBLAS_FILL_MODE_LOWER, int(k), 1, d_m.p, int(k), d_vec_k.p, int(k),
                                     d_info.p));
      SPW_TRY(download(rhs, d_vec_k.p, s));
      for (double v : rhs) ok &= std::isfinite(v);
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
  QCUDA_TRY(cudaStreamSynchronize(s));
  out.sigma_reg = use_h ? prm.sigma_reg : 0.0;
  out.seed = prm.seed;
  out.scale_mult = prm.scale_mult;
  return out;
}

Result<QuantizedTensor> exl3_quantize_tensor_cuda(const float* w, int64_t k, int64_t n, const std::vector<double>& h,
                                                  const QuantizeParams& params) {
  auto q = Exl3CudaQuantizer::create();
  if (!q.ok()) return q.error();
  return (*q)->quantize(w, k, n, h, params);
}

}  // namespace spw::quant
