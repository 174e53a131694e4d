// Image bytes → RgbImage. The format comes from the bytes (magic numbers), never from a claimed MIME
// type. Every failure a client can cause (corrupt or truncated data, an unsupported format, a
// declared size over the pixel limit) is an Error whose message says what to change; nothing aborts.
//
// Pixel semantics follow the reference processor, which opens the bytes with Pillow and calls
// convert("RGB") without an EXIF transpose:
//   - alpha is dropped, not composited (RGBA, LA, palette transparency, WebP alpha);
//   - no EXIF orientation, no ICC profile and no PNG gamma is applied;
//   - 16-bit PNG channels keep their high byte, except 16-bit greyscale without alpha, which
//     Pillow opens as mode I;16 and converts by clipping each value to 255 (a Pillow quirk the
//     reference inherits: such images come out mostly white);
//   - GIF and animated WebP give their first frame only.
// The declared width x height is checked against ImageLimits::max_pixels before any pixel is
// decoded (decompression bombs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "base/status.h"
#include "vision/image.h"

namespace spw::vision {

enum class ImageFormat { png, jpeg, webp, gif };

struct ImageLimits {
  // Encoded bytes of one image (after base64 decoding).
  size_t max_encoded_bytes = size_t(16) << 20;
  // Declared width x height of one image; Pillow warns above 89.5 M and refuses above 179 M, we
  // refuse earlier: a 32 M-pixel image already costs ~100 MB of RGB before it is shrunk to at most
  // max_image_tokens of the model.
  int64_t max_pixels = int64_t(32) << 20;
  // Images in one request.
  int max_images = 16;
};

// The format the bytes start with; nullopt for anything else.
std::optional<ImageFormat> sniff_image_format(std::span<const uint8_t> bytes);
const char* image_format_name(ImageFormat format);  // "PNG", "JPEG", "WebP", "GIF"
// A short guess for bytes no decoder takes ("BMP", "TIFF", "HEIF/AVIF", "SVG", ...), or "" if unknown;
// used to make the unsupported-format message specific.
std::string guess_other_format(std::span<const uint8_t> bytes);

Result<RgbImage> decode_image(std::span<const uint8_t> bytes, const ImageLimits& limits = {});

}  // namespace spw::vision
