// What the server needs of a vision tower: the embeddings of a processed image's whole span
// (image_tokens.h's layout), from the CPU reference (CpuImageEncoder) or the GPU tower
// (vision_tower_cuda.h). Implementations may be called from several threads at once.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "vision/image_processor.h"
#include "vision/vision_weights.h"

namespace spw::vision {

class ImageEncoder {
 public:
  virtual ~ImageEncoder() = default;
  virtual const VisionConfig& config() const = 0;
  virtual int d_llm() const = 0;
  virtual std::string_view device() const = 0;  // "cpu" or "cuda"
  // [grid.n_tokens][d_llm].
  virtual Result<std::vector<float>> span_embeddings(const ProcessedImage& image) = 0;
};

// image_span_embeddings_ref over weights it owns.
std::unique_ptr<ImageEncoder> make_cpu_image_encoder(VisionWeights weights);

}  // namespace spw::vision
