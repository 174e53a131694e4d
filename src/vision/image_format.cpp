// Format detection from magic numbers, and the size check every decoder runs first.
#include <cstring>

#include "vision/decoders.h"

namespace spw::vision {
namespace {

bool starts_with(std::span<const uint8_t> b, size_t at, const char* magic, size_t n) {
  return b.size() >= at + n && std::memcmp(b.data() + at, magic, n) == 0;
}

}  // namespace

std::optional<ImageFormat> sniff_image_format(std::span<const uint8_t> b) {
  if (starts_with(b, 0, "\x89PNG\r\n\x1a\n", 8)) return ImageFormat::png;
  if (starts_with(b, 0, "\xff\xd8\xff", 3)) return ImageFormat::jpeg;
  if (starts_with(b, 0, "RIFF", 4) && starts_with(b, 8, "WEBP", 4)) return ImageFormat::webp;
  if (starts_with(b, 0, "GIF87a", 6) || starts_with(b, 0, "GIF89a", 6)) return ImageFormat::gif;
  return std::nullopt;
}

const char* image_format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::png: return "PNG";
    case ImageFormat::jpeg: return "JPEG";
    case ImageFormat::webp: return "WebP";
    case ImageFormat::gif: return "GIF";
  }
  return "?";
}

std::string guess_other_format(std::span<const uint8_t> b) {
  if (starts_with(b, 0, "BM", 2)) return "BMP";
  if (starts_with(b, 0, "II*\0", 4) || starts_with(b, 0, "MM\0*", 4)) return "TIFF";
  if (starts_with(b, 4, "ftyp", 4)) return "HEIF/AVIF";
  if (starts_with(b, 0, "\0\0\1\0", 4)) return "ICO";
  if (starts_with(b, 0, "%PDF", 4)) return "PDF";
  if (starts_with(b, 0, "<svg", 4) || starts_with(b, 0, "<?xml", 5)) return "SVG";
  if (starts_with(b, 0, "\xff\x0a", 2) || starts_with(b, 4, "jP  ", 4)) return "JPEG XL/JPEG 2000";
  return "";
}

Status check_declared_size(const char* format, int64_t width, int64_t height, const ImageLimits& limits) {
  if (width <= 0 || height <= 0) {
    return make_error(format, " image declares an empty size (", width, "x", height, "); send an image with pixels");
  }
  if (width > limits.max_pixels / height) {
    return make_error(format, " image is ", width, "x", height, " pixels, over the limit of ", limits.max_pixels,
                      " pixels per image; downscale it before sending");
  }
  return {};
}

}  // namespace spw::vision
