// WebP through libwebp. A still image decodes straight to RGB (alpha dropped, as Pillow's
// convert("RGB") drops it); an animation gives its first frame as libwebp's animation decoder
// composes it on a transparent-black canvas, which is what Pillow's WebP plugin shows.
#include <webp/decode.h>
#include <webp/demux.h>

#include <cstring>

#include "vision/decoders.h"

namespace spw::vision {
namespace {

const char* vp8_status_text(VP8StatusCode code) {
  switch (code) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported feature";
    case VP8_STATUS_SUSPENDED: return "suspended";
    case VP8_STATUS_USER_ABORT: return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "the data ends early (truncated file)";
    default: return "error";
  }
}

Error corrupt(const char* why) {
  return make_error("corrupt or truncated WebP data (", why, "); send a complete, valid image");
}

struct AnimDecoder {
  WebPAnimDecoder* d = nullptr;
  ~AnimDecoder() {
    if (d) WebPAnimDecoderDelete(d);
  }
};

Result<RgbImage> first_frame(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  WebPData data{bytes.data(), bytes.size()};
  WebPAnimDecoderOptions options;
  if (!WebPAnimDecoderOptionsInit(&options)) return corrupt("decoder version mismatch");
  options.color_mode = MODE_RGBA;
  options.use_threads = 0;
  AnimDecoder dec{WebPAnimDecoderNew(&data, &options)};
  if (!dec.d) return corrupt("bad animation container");
  WebPAnimInfo info;
  if (!WebPAnimDecoderGetInfo(dec.d, &info)) return corrupt("bad animation container");
  SPW_TRY(check_declared_size("WebP", info.canvas_width, info.canvas_height, limits));
  uint8_t* rgba = nullptr;
  int timestamp = 0;
  if (!WebPAnimDecoderGetNext(dec.d, &rgba, &timestamp)) return corrupt("the first frame does not decode");
  RgbImage out(int(info.canvas_width), int(info.canvas_height));
  const size_t n = size_t(out.width) * size_t(out.height);
  for (size_t i = 0; i < n; ++i) std::memcpy(&out.rgb[3 * i], rgba + 4 * i, 3);
  return out;
}

}  // namespace

Result<RgbImage> decode_webp(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  WebPBitstreamFeatures features;
  const VP8StatusCode status = WebPGetFeatures(bytes.data(), bytes.size(), &features);
  if (status != VP8_STATUS_OK) return corrupt(vp8_status_text(status));
  SPW_TRY(check_declared_size("WebP", features.width, features.height, limits));
  if (features.has_animation) return first_frame(bytes, limits);
  RgbImage out(features.width, features.height);
  if (!WebPDecodeRGBInto(bytes.data(), bytes.size(), out.rgb.data(), out.rgb.size(), out.width * 3)) {
    return corrupt("the image data does not decode");
  }
  return out;
}

}  // namespace spw::vision
