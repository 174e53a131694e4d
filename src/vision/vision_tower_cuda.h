// The V4.1 vision tower and aligner on the GPU: vision_tower.h's computation (the CPU reference is the
// oracle), in f32 with cuBLAS SGEMMs for every linear and for attention's two products, and small
// kernels for the rest (RMSNorm from cuda/ops, 2-D RoPE, softmax, SwiGLU, the aligner's unfold, erf-GELU).
// Attention materialises each head's [n, n] scores, a few heads at a time within a bounded workspace
// (one head of the largest image, 9,216 patches, is 340 MB).
//
// Agreement with the CPU reference: f32 throughout, only the summation order differs (cuBLAS's blocked
// products and the norm's f64 tree sum), ~1e-6 relative per op.
//
// One tower serves one encode at a time (a mutex): the server calls it from its request threads.
// Tests: tests/gpu/test_vision_tower_cuda.cpp; timing: bench/vision/bench_vision_tower.cpp.
#pragma once

#include <memory>
#include <vector>

#include "base/status.h"
#include "vision/image_encoder.h"
#include "vision/image_processor.h"
#include "vision/vision_weights.h"

namespace spw::vision {

class VisionTowerCuda final : public ImageEncoder {
 public:
  // Uploads the weights (f32) to the current CUDA device.
  static Result<std::unique_ptr<VisionTowerCuda>> create(const VisionWeights& weights);
  ~VisionTowerCuda() override;
  VisionTowerCuda(const VisionTowerCuda&) = delete;
  VisionTowerCuda& operator=(const VisionTowerCuda&) = delete;

  // vision_encode_ref on the GPU: [n_llm_h·n_llm_w][d_llm].
  Result<std::vector<float>> encode(const ProcessedImage& image);
  // image_span_embeddings_ref on the GPU: [grid.n_tokens][d_llm].
  Result<std::vector<float>> span_embeddings(const ProcessedImage& image) override;
  const VisionConfig& config() const override;
  int d_llm() const override;
  std::string_view device() const override { return "cuda"; }

  // Device bytes the weights take.
  size_t weight_nbytes() const;

 private:
  struct Impl;
  explicit VisionTowerCuda(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace spw::vision
