// libFuzzer target: image bytes → decode_image (PNG, JPEG, WebP, GIF through the codec libraries),
// then the V4.1 processor on what decodes (resize, pad, patches), and the same bytes read as a chat
// image_url string. Limits are small so one input stays fast; the contract is "an Error or a valid
// image, never a crash, hang or overread". Seeds: tests/unit/data/vision/decode (scripts/fuzz.sh).
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "vision/image_decode.h"
#include "vision/image_processor.h"
#include "vision/image_url.h"

// formats/dtypes.cpp does not compile under clang 14 (it asks __builtin_cpu_supports for "f16c"), and
// the processor needs only this function from it: the same round-to-nearest-even, for finite values.
namespace spw {
uint16_t f32_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
}  // namespace spw

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace spw::vision;
  ImageLimits limits;
  limits.max_pixels = 1 << 20;
  limits.max_encoded_bytes = 1 << 20;
  auto image = decode_image({data, size}, limits);
  if (image.ok()) {
    const RgbImage& im = image.value();
    if (im.width <= 0 || im.height <= 0 || im.rgb.size() != size_t(im.width) * im.height * 3) __builtin_trap();
    VisionConfig cfg;
    cfg.max_image_tokens = 64;
    cfg.min_pixels = 0;
    auto processed = process_image(im, cfg);
    if (processed.ok() && processed->grid.n_tokens > cfg.max_image_tokens) __builtin_trap();
  }
  (void)image_url_bytes(std::string_view(reinterpret_cast<const char*>(data), size), limits);
  return 0;
}
