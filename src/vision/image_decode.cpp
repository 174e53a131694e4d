// decode_image: encoded-size limit, magic-number dispatch, and the unsupported-format message.
#include "vision/decoders.h"

namespace spw::vision {

Result<RgbImage> decode_image(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  if (bytes.empty()) return make_error("the image is empty (0 bytes); send PNG, JPEG, WebP or GIF data");
  if (bytes.size() > limits.max_encoded_bytes) {
    return make_error("the image is ", bytes.size(), " bytes, over the limit of ", limits.max_encoded_bytes,
                      " bytes per image; compress or downscale it");
  }
  const auto format = sniff_image_format(bytes);
  if (!format) {
    const std::string other = guess_other_format(bytes);
    return make_error("unsupported image format", other.empty() ? std::string() : " (the bytes look like " + other + ")",
                      "; send PNG, JPEG, WebP or GIF");
  }
  switch (*format) {
    case ImageFormat::png: return decode_png(bytes, limits);
    case ImageFormat::jpeg: return decode_jpeg(bytes, limits);
    case ImageFormat::webp: return decode_webp(bytes, limits);
    case ImageFormat::gif: return decode_gif(bytes, limits);
  }
  return make_error("unsupported image format");
}

}  // namespace spw::vision
