// The per-format decoders behind decode_image (image_decode.cpp), which has already checked the
// magic number and the encoded size. Each checks the declared size with check_declared_size before
// decoding pixels. Internal to src/vision.
#pragma once

#include <span>

#include "vision/image_decode.h"

namespace spw::vision {

Result<RgbImage> decode_png(std::span<const uint8_t> bytes, const ImageLimits& limits);
Result<RgbImage> decode_jpeg(std::span<const uint8_t> bytes, const ImageLimits& limits);
Result<RgbImage> decode_webp(std::span<const uint8_t> bytes, const ImageLimits& limits);
Result<RgbImage> decode_gif(std::span<const uint8_t> bytes, const ImageLimits& limits);

// An Error naming the format, the size and the limit when width x height is empty or over
// limits.max_pixels.
Status check_declared_size(const char* format, int64_t width, int64_t height, const ImageLimits& limits);

}  // namespace spw::vision
