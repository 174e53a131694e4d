// The GPU vision tower; the contract is in vision_tower_cuda.h, the computation in vision_tower.h.
#include "vision/vision_tower_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "cuda/ops/norm.h"
#include "engine/device_buffer.h"
#include "formats/dtypes.h"
#include "vision/vision_tower.h"

namespace spw::vision {
namespace {

using engine::DeviceBuffer;

constexpr float kNormEps = 1e-6f;
constexpr size_t kScoreBytes = size_t(512) << 20;  // attention scores of the heads run at once

Status cublas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return {};
  return make_error("cuBLAS error ", int(s), " in ", what);
}
#define SPW_CUBLAS_TRY(call) SPW_TRY(cublas_status((call), #call))

int blocks_for(int64_t n, int threads) { return int(std::min<int64_t>((n + threads - 1) / threads, 65535 * 8)); }

// y[t, o] += b[o] for a row-major [n, width] y.
__global__ void add_bias_kernel(float* y, const float* b, int64_t n, int64_t width) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * width; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += b[i % width];
}

// x[i] += y[i].
__global__ void add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

// 2-D rotate-half RoPE on q and k of qkv [n, 3d] in place: for token t at (row, col) of an n_w-wide grid and
// each head, slot j < d_head/2 pairs with j + d_head/2 and turns by row·f_j (j < n_freq) or col·f_(j − n_freq).
__global__ void rope_2d_kernel(float* qkv, const double* inv_freq, int n, int n_w, int d, int n_heads, int d_head) {
  const int half = d_head / 2, n_freq = d_head / 4;
  const int64_t total = int64_t(n) * 2 * n_heads * half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int j = int(i % half);
    const int64_t rest = i / half;
    const int h = int(rest % n_heads), which = int((rest / n_heads) % 2), t = int(rest / (2 * n_heads));
    const int row = t / n_w, col = t % n_w;
    const double angle = j < n_freq ? row * inv_freq[j] : col * inv_freq[j - n_freq];
    const float c = float(cos(angle)), s = float(sin(angle));
    float* v = qkv + int64_t(t) * 3 * d + int64_t(which) * d + int64_t(h) * d_head;
    const float x1 = v[j], x2 = v[j + half];
    v[j] = x1 * c - x2 * s;
    v[j + half] = x2 * c + x1 * s;
  }
}

// Softmax of each row of s [rows, width] in place (one block per row).
__global__ void softmax_rows_kernel(float* s, int64_t width) {
  float* row = s + int64_t(blockIdx.x) * width;
  __shared__ float red[32];
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) m = fmaxf(m, row[i]);
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
  __syncthreads();
  m = -INFINITY;
  for (int w = 0; w < int(blockDim.x / 32); ++w) m = fmaxf(m, red[w]);
  __syncthreads();
  float sum = 0;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    const float e = expf(row[i] - m);
    row[i] = e;
    sum += e;
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffff, sum, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = sum;
  __syncthreads();
  sum = 0;
  for (int w = 0; w < int(blockDim.x / 32); ++w) sum += red[w];
  const float inv = 1.0f / sum;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) row[i] *= inv;
}

// act[t, i] = silu(gate) · up, gate_up [n, 2·di] = gate | up.
__global__ void swiglu_kernel(const float* gate_up, float* act, int64_t n, int64_t di) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * di; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / di, c = i % di;
    const float g = gate_up[t * 2 * di + c], u = gate_up[t * 2 * di + di + c];
    act[i] = g / (1.0f + expf(-g)) * u;
  }
}

// Aligner input: cells [n_cells, d·r²] from vit [n_h·n_w, d], channel-major (c·r² + i·r + j), zero past the grid.
__global__ void unfold_kernel(const float* vit, float* cells, int n_h, int n_w, int d, int r) {
  const int n_llm_w = (n_w + r - 1) / r, n_llm_h = (n_h + r - 1) / r;
  const int64_t per_cell = int64_t(d) * r * r, total = int64_t(n_llm_h) * n_llm_w * per_cell;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t cell = i / per_cell, f = i % per_cell;
    const int c = int(f / (r * r)), ij = int(f % (r * r)), ii = ij / r, jj = ij % r;
    const int row = int(cell / n_llm_w) * r + ii, col = int(cell % n_llm_w) * r + jj;
    cells[i] = row < n_h && col < n_w ? vit[(int64_t(row) * n_w + col) * d + c] : 0.0f;
  }
}

__global__ void gelu_erf_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

Status launched(const char* what) { return engine::cuda_status(cudaGetLastError(), what); }

Status upload(const std::vector<float>& v, DeviceBuffer<float>& dst) {
  SPW_TRY(dst.alloc(v.size()));
  SPW_CUDA_TRY(cudaMemcpy(dst.get(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
  return {};
}

struct DeviceBlock {
  DeviceBuffer<float> norm1, norm2, wqkv, wqkv_bias, wo, wo_bias, w1, w2;
};

}  // namespace

struct VisionTowerCuda::Impl {
  VisionConfig config;
  int d_llm = 0;
  DeviceBuffer<float> patch_embed, patch_embed_bias, norm, aligner_w1, aligner_w1_bias, aligner_w2, aligner_w2_bias;
  std::vector<DeviceBlock> blocks;
  DeviceBuffer<double> inv_freq;
  DeviceBuffer<float> scores;  // attention scores, kept between encodes
  std::vector<float> image_start, image_end, image_newline;
  size_t weight_nbytes = 0;
  cublasHandle_t cublas = nullptr;
  cudaStream_t stream = nullptr;
  std::mutex mutex;

  ~Impl() {
    if (cublas) cublasDestroy(cublas);
    if (stream) cudaStreamDestroy(stream);
  }

  // y [n, n_out] = x [n, n_in] · Wᵀ (+ b), row-major, W [n_out, n_in].
  Status linear(const float* x, int64_t n, const float* w, const float* b, int64_t n_out, int64_t n_in, float* y) {
    const float one = 1.f, zero = 0.f;
    SPW_CUBLAS_TRY(cublasSgemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(n_out), int(n), int(n_in), &one, w, int(n_in), x,
                               int(n_in), &zero, y, int(n_out)));
    if (b) {
      add_bias_kernel<<<blocks_for(n * n_out, 256), 256, 0, stream>>>(y, b, n, n_out);
      SPW_TRY(launched("add_bias_kernel"));
    }
    return {};
  }

  // out [n, d] = attention over qkv [n, 3d] (RoPE already applied), heads in groups that fit kScoreBytes.
  Status attention(const float* qkv, int64_t n, float* out) {
    const int d = config.d_model, heads = config.n_heads, dh = d / heads;
    const size_t per_head = size_t(n) * size_t(n) * sizeof(float);
    const int group = int(std::clamp<size_t>(kScoreBytes / per_head, 1, size_t(heads)));
    if (scores.size() < size_t(group) * size_t(n) * size_t(n)) SPW_TRY(scores.alloc(size_t(group) * size_t(n) * size_t(n)));
    const float scale = 1.0f / std::sqrt(float(dh)), one = 1.f, zero = 0.f;
    for (int h0 = 0; h0 < heads; h0 += group) {
      const int g = std::min(group, heads - h0);
      // S_h [n_q, n_k] = scale · Q_h K_hᵀ (column-major S' [n_k, n_q]).
      SPW_CUBLAS_TRY(cublasSgemmStridedBatched(cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(n), dh, &scale,
                                               qkv + d + int64_t(h0) * dh, 3 * d, dh, qkv + int64_t(h0) * dh, 3 * d, dh,
                                               &zero, scores.get(), int(n), int64_t(n) * n, g));
      softmax_rows_kernel<<<unsigned(int64_t(g) * n), 256, 0, stream>>>(scores.get(), n);
      SPW_TRY(launched("softmax_rows_kernel"));
      // O_h [n_q, dh] = P_h V_h (column-major O' [dh, n_q] = V' P'), written into out's head columns.
      SPW_CUBLAS_TRY(cublasSgemmStridedBatched(cublas, CUBLAS_OP_N, CUBLAS_OP_N, dh, int(n), int(n), &one,
                                               qkv + 2 * d + int64_t(h0) * dh, 3 * d, dh, scores.get(), int(n),
                                               int64_t(n) * n, &zero, out + int64_t(h0) * dh, d, dh, g));
    }
    return {};
  }

  Result<std::vector<float>> encode(const ProcessedImage& image) {
    const ImageGrid& g = image.grid;
    const int64_t r = config.downsample_ratio;
    if (g.n_vit_h <= 0 || g.n_vit_w <= 0) return make_error("vision encode: empty patch grid");
    if (g.n_llm_h != (g.n_vit_h + r - 1) / r || g.n_llm_w != (g.n_vit_w + r - 1) / r)
      return make_error("vision encode: the image's LLM grid ", g.n_llm_h, "x", g.n_llm_w,
                        " does not follow from its ViT grid ", g.n_vit_h, "x", g.n_vit_w, " and downsample_ratio ", r);
    const int64_t n = int64_t(g.n_vit_h) * g.n_vit_w, d = config.d_model, di = config.d_inter;
    const int64_t n_in = 3LL * config.patch_size * config.patch_size;
    if (int64_t(image.patches.size()) != n * n_in)
      return make_error("vision encode: ", image.patches.size(), " patch values for a ", g.n_vit_h, "x", g.n_vit_w,
                        " grid (expected ", n * n_in, ")");
    std::lock_guard lock(mutex);
    std::vector<float> patches(image.patches.size());
    for (size_t i = 0; i < patches.size(); ++i) patches[i] = bf16_to_f32(image.patches[i]);
    const int64_t n_cells = int64_t(g.n_llm_h) * g.n_llm_w, D = d_llm;
    DeviceBuffer<float> in, x, h, qkv, big, act, cells;
    SPW_TRY(upload(patches, in));
    SPW_TRY(x.alloc(size_t(n * d)));
    SPW_TRY(h.alloc(size_t(n * d)));
    SPW_TRY(qkv.alloc(size_t(n * 3 * d)));
    SPW_TRY(big.alloc(size_t(n * std::max(2 * di, d))));  // gate | up, or the attention output
    SPW_TRY(act.alloc(size_t(std::max(n * di, n_cells * r * r * d))));  // SwiGLU output, or the aligner's cells
    SPW_TRY(cells.alloc(size_t(2 * n_cells * D)));
    SPW_TRY(linear(in.get(), n, patch_embed.get(), patch_embed_bias.get(), d, n_in, x.get()));
    for (DeviceBlock& blk : blocks) {
      SPW_TRY(cuda::rms_norm(x.get(), blk.norm1.get(), h.get(), n, d, kNormEps, false, stream));
      SPW_TRY(linear(h.get(), n, blk.wqkv.get(), blk.wqkv_bias.get(), 3 * d, d, qkv.get()));
      rope_2d_kernel<<<blocks_for(n * config.d_model, 256), 256, 0, stream>>>(
          qkv.get(), inv_freq.get(), int(n), g.n_vit_w, int(d), config.n_heads, int(d / config.n_heads));
      SPW_TRY(launched("rope_2d_kernel"));
      SPW_TRY(attention(qkv.get(), n, big.get()));
      SPW_TRY(linear(big.get(), n, blk.wo.get(), blk.wo_bias.get(), d, d, h.get()));
      add_kernel<<<blocks_for(n * d, 256), 256, 0, stream>>>(x.get(), h.get(), n * d);
      SPW_TRY(launched("add_kernel"));
      SPW_TRY(cuda::rms_norm(x.get(), blk.norm2.get(), h.get(), n, d, kNormEps, false, stream));
      SPW_TRY(linear(h.get(), n, blk.w1.get(), nullptr, 2 * di, d, big.get()));
      swiglu_kernel<<<blocks_for(n * di, 256), 256, 0, stream>>>(big.get(), act.get(), n, di);
      SPW_TRY(launched("swiglu_kernel"));
      SPW_TRY(linear(act.get(), n, blk.w2.get(), nullptr, d, di, h.get()));
      add_kernel<<<blocks_for(n * d, 256), 256, 0, stream>>>(x.get(), h.get(), n * d);
      SPW_TRY(launched("add_kernel"));
    }
    SPW_TRY(cuda::rms_norm(x.get(), norm.get(), h.get(), n, d, kNormEps, false, stream));
    // Aligner: unfold, w1 + GELU, w2.
    unfold_kernel<<<blocks_for(n_cells * r * r * d, 256), 256, 0, stream>>>(h.get(), act.get(), g.n_vit_h, g.n_vit_w,
                                                                            int(d), int(r));
    SPW_TRY(launched("unfold_kernel"));
    float* h1 = cells.get();
    float* h2 = cells.get() + n_cells * D;
    SPW_TRY(linear(act.get(), n_cells, aligner_w1.get(), aligner_w1_bias.get(), D, r * r * d, h1));
    gelu_erf_kernel<<<blocks_for(n_cells * D, 256), 256, 0, stream>>>(h1, n_cells * D);
    SPW_TRY(launched("gelu_erf_kernel"));
    SPW_TRY(linear(h1, n_cells, aligner_w2.get(), aligner_w2_bias.get(), D, D, h2));
    std::vector<float> out(size_t(n_cells * D));
    SPW_CUDA_TRY(cudaMemcpyAsync(out.data(), h2, out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
    SPW_CUDA_TRY(cudaStreamSynchronize(stream));
    return out;
  }
};

VisionTowerCuda::VisionTowerCuda(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
VisionTowerCuda::~VisionTowerCuda() = default;

Result<std::unique_ptr<VisionTowerCuda>> VisionTowerCuda::create(const VisionWeights& w) {
  SPW_TRY(check_vision_shapes(w.config));
  auto impl = std::make_unique<Impl>();
  impl->config = w.config;
  impl->d_llm = w.d_llm;
  impl->image_start = w.image_start;
  impl->image_end = w.image_end;
  impl->image_newline = w.image_newline;
  SPW_CUDA_TRY(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  SPW_CUBLAS_TRY(cublasCreate(&impl->cublas));
  SPW_CUBLAS_TRY(cublasSetStream(impl->cublas, impl->stream));
  SPW_CUBLAS_TRY(cublasSetMathMode(impl->cublas, CUBLAS_PEDANTIC_MATH));  // f32 products, no TF32
  auto put = [&](const std::vector<float>& v, DeviceBuffer<float>& dst) -> Status {
    impl->weight_nbytes += v.size() * sizeof(float);
    return upload(v, dst);
  };
  SPW_TRY(put(w.patch_embed, impl->patch_embed));
  SPW_TRY(put(w.patch_embed_bias, impl->patch_embed_bias));
  SPW_TRY(put(w.norm, impl->norm));
  SPW_TRY(put(w.aligner_w1, impl->aligner_w1));
  SPW_TRY(put(w.aligner_w1_bias, impl->aligner_w1_bias));
  SPW_TRY(put(w.aligner_w2, impl->aligner_w2));
  SPW_TRY(put(w.aligner_w2_bias, impl->aligner_w2_bias));
  impl->blocks.resize(w.blocks.size());
  for (size_t b = 0; b < w.blocks.size(); ++b) {
    const VitBlockWeights& src = w.blocks[b];
    DeviceBlock& dst = impl->blocks[b];
    SPW_TRY(put(src.norm1, dst.norm1));
    SPW_TRY(put(src.norm2, dst.norm2));
    SPW_TRY(put(src.wqkv, dst.wqkv));
    SPW_TRY(put(src.wqkv_bias, dst.wqkv_bias));
    SPW_TRY(put(src.wo, dst.wo));
    SPW_TRY(put(src.wo_bias, dst.wo_bias));
    SPW_TRY(put(src.w1, dst.w1));
    SPW_TRY(put(src.w2, dst.w2));
  }
  // The rotation frequencies theta^(-2i/(d_head/2)), i < d_head/4, in f64 as the CPU reference computes them.
  const int d_head = w.config.d_model / w.config.n_heads, half = d_head / 2;
  std::vector<double> inv_freq(size_t(d_head / 4));
  for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(w.config.rope_theta, -2.0 * double(i) / half);
  SPW_TRY(impl->inv_freq.alloc(inv_freq.size()));
  SPW_CUDA_TRY(cudaMemcpy(impl->inv_freq.get(), inv_freq.data(), inv_freq.size() * sizeof(double), cudaMemcpyHostToDevice));
  return std::unique_ptr<VisionTowerCuda>(new VisionTowerCuda(std::move(impl)));
}

Result<std::vector<float>> VisionTowerCuda::encode(const ProcessedImage& image) { return impl_->encode(image); }

Result<std::vector<float>> VisionTowerCuda::span_embeddings(const ProcessedImage& image) {
  auto cells = impl_->encode(image);
  if (!cells.ok()) return cells.error();
  return lay_out_span(image.grid, *cells, impl_->image_start, impl_->image_newline, impl_->image_end);
}

size_t VisionTowerCuda::weight_nbytes() const { return impl_->weight_nbytes; }
const VisionConfig& VisionTowerCuda::config() const { return impl_->config; }
int VisionTowerCuda::d_llm() const { return impl_->d_llm; }

}  // namespace spw::vision
