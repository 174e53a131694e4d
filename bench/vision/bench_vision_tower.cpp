// Encode time of the GPU vision tower (vision/vision_tower_cuda.h) per image, at the released V4.1 tower's
// shape (32 layers, width 1024, 16 heads, SwiGLU 2816, aligner into 5120; random weights: the time does not
// depend on the values), for a 544x544 image and for the largest grid the processor makes (a square image
// at max_image_tokens). Beside it, the f32 SGEMM rate of this device measured in the same run (8192³, the
// tower's products are f32 without TF32), so the tower's achieved FLOP rate reads as a share of it.
// Usage: bench_vision_tower [repeats=5]. Markdown on stdout.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "vision/image_processor.h"
#include "vision/vision_tower_cuda.h"

using namespace spw;
using namespace spw::vision;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double sgemm_tflops() {
  const int n = 8192;
  float *a, *b, *c;
  cudaMalloc(&a, size_t(n) * n * 4);
  cudaMalloc(&b, size_t(n) * n * 4);
  cudaMalloc(&c, size_t(n) * n * 4);
  cudaMemset(a, 0, size_t(n) * n * 4);
  cudaMemset(b, 0, size_t(n) * n * 4);
  cublasHandle_t h;
  cublasCreate(&h);
  cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
  const float one = 1, zero = 0;
  cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
  cudaDeviceSynchronize();
  const int reps = 5;
  const double t0 = now_s();
  for (int i = 0; i < reps; ++i) cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
  cudaDeviceSynchronize();
  const double t = (now_s() - t0) / reps;
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * double(n) * n / t / 1e12;
}

// Products of one encode (linears, both attention products, the aligner), in FLOPs.
double encode_flops(const VisionConfig& c, const ImageGrid& g, int d_llm) {
  const double n = double(g.n_vit_h) * g.n_vit_w, d = c.d_model, di = c.d_inter, r2 = double(c.downsample_ratio) * c.downsample_ratio;
  const double cells = double(g.n_llm_h) * g.n_llm_w;
  const double per_layer = 2 * n * (3 * d * d + d * d + 2 * di * d + di * d) + 2 * 2 * n * n * d;
  return 2 * n * 3 * c.patch_size * c.patch_size * d + c.n_layers * per_layer + 2 * cells * (r2 * d * d_llm + double(d_llm) * d_llm);
}

VisionWeights random_weights(const VisionConfig& c, int D) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 0.02f);
  auto fill = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  const size_t d = size_t(c.d_model), di = size_t(c.d_inter), p = 3 * size_t(c.patch_size) * c.patch_size;
  const size_t r2 = size_t(c.downsample_ratio) * c.downsample_ratio;
  VisionWeights w;
  w.config = c;
  w.d_llm = D;
  w.patch_embed = fill(d * p);
  w.patch_embed_bias = fill(d);
  for (int b = 0; b < c.n_layers; ++b)
    w.blocks.push_back({std::vector<float>(d, 1.f), std::vector<float>(d, 1.f), fill(3 * d * d), fill(3 * d), fill(d * d),
                        fill(d), fill(2 * di * d), fill(d * di)});
  w.norm.assign(d, 1.f);
  w.aligner_w1 = fill(size_t(D) * r2 * d);
  w.aligner_w1_bias = fill(size_t(D));
  w.aligner_w2 = fill(size_t(D) * D);
  w.aligner_w2_bias = fill(size_t(D));
  w.image_start = w.image_end = w.image_newline = fill(size_t(D));
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
  VisionConfig c;  // the released tower's defaults (vision_config.h)
  const int d_llm = 5120;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const double peak = sgemm_tflops();
  auto tower = VisionTowerCuda::create(random_weights(c, d_llm));
  if (!tower.ok()) {
    std::fprintf(stderr, "%s\n", tower.error().message.c_str());
    return 1;
  }
  std::printf("# GPU vision tower, %s\n\nf32 SGEMM (8192³, no TF32): %.1f TFLOP/s. Tower weights %.2f GB (f32).\n\n",
              prop.name, peak, (*tower)->weight_nbytes() / 1e9);
  std::printf("| image | ViT patches | LLM positions | encode ms (median of %d) | TFLOP/s | of SGEMM rate |\n|---|---|---|---|---|---|\n",
              repeats);
  for (const auto& [w, h] : {std::pair{544, 544}, std::pair{4000, 4000}}) {
    auto grid = plan_image_grid(w, h, c);
    if (!grid.ok()) return 1;
    ProcessedImage image;
    image.grid = *grid;
    image.patches.assign(size_t(grid->n_vit_h) * grid->n_vit_w * 3 * c.patch_size * c.patch_size, 0x3f00);
    std::vector<double> times;
    for (int i = 0; i < repeats + 1; ++i) {
      const double t0 = now_s();
      auto out = (*tower)->encode(image);
      if (!out.ok()) {
        std::fprintf(stderr, "%s\n", out.error().message.c_str());
        return 1;
      }
      if (i > 0) times.push_back(now_s() - t0);  // the first run allocates the workspaces
    }
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2];
    const double tflops = encode_flops(c, *grid, d_llm) / t / 1e12;
    std::printf("| %dx%d | %dx%d | %lld | %.1f | %.1f | %.0f%% |\n", w, h, grid->n_vit_h, grid->n_vit_w,
                (long long)grid->n_tokens, t * 1e3, tflops, 100 * tflops / peak);
  }
  return 0;
}
