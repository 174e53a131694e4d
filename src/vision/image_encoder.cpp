#include "vision/image_encoder.h"

#include "vision/vision_tower.h"

namespace spw::vision {
namespace {

class CpuImageEncoder final : public ImageEncoder {
 public:
  explicit CpuImageEncoder(VisionWeights w) : w_(std::move(w)) {}
  const VisionConfig& config() const override { return w_.config; }
  int d_llm() const override { return w_.d_llm; }
  std::string_view device() const override { return "cpu"; }
  Result<std::vector<float>> span_embeddings(const ProcessedImage& image) override {
    return image_span_embeddings_ref(w_, image);
  }

 private:
  VisionWeights w_;
};

}  // namespace

std::unique_ptr<ImageEncoder> make_cpu_image_encoder(VisionWeights weights) {
  return std::make_unique<CpuImageEncoder>(std::move(weights));
}

}  // namespace spw::vision
