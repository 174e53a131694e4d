// PNG through libpng's low-level read API (the simplified API composites alpha and converts
// gamma), with the transforms that match Pillow's convert("RGB"): palette → its colours (tRNS
// ignored), 1/2/4-bit grey scaled to 8 bits, 16-bit channels → high byte, alpha dropped, grey
// replicated; 16-bit grey without alpha is clipped to 255 per value (Pillow's I;16 → RGB). No gamma
// or ICC transform.
//
// libpng reports errors by longjmp. All libpng calls live in read_png_pixels, whose frame holds no
// object with a destructor; the state it fills lives in the caller's PngState.
#include <png.h>

#include <csetjmp>
#include <cstring>
#include <string>
#include <vector>

#include "vision/decoders.h"

namespace spw::vision {
namespace {

struct PngState {
  std::span<const uint8_t> bytes;
  size_t pos = 0;
  const ImageLimits* limits = nullptr;
  char message[200] = {};
  Status size_status;        // set by the size check inside read_png_pixels
  bool gray16 = false;       // rows hold 16-bit big-endian grey
  std::vector<uint8_t> raw;  // decoded rows: RGB, or 16-bit grey when gray16
  std::vector<png_bytep> rows;
  png_uint_32 width = 0, height = 0;
};

void png_read_bytes(png_structp png, png_bytep out, size_t n) {
  auto* s = static_cast<PngState*>(png_get_io_ptr(png));
  if (n > s->bytes.size() - s->pos) png_error(png, "the data ends early (truncated file)");
  std::memcpy(out, s->bytes.data() + s->pos, n);
  s->pos += n;
}

[[noreturn]] void png_fail(png_structp png, png_const_charp msg) {
  auto* s = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(s->message, sizeof s->message, "%s", msg);
  png_longjmp(png, 1);
}

void png_warn(png_structp, png_const_charp) {}  // warnings (bad ancillary chunks) do not stop decoding

// false: a libpng error (s.message) or a size refusal (s.size_status).
bool read_png_pixels(png_structp png, png_infop info, PngState& s) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_read_fn(png, &s, png_read_bytes);
  // Ancillary chunks (text, ICC) are decompressed into memory: bound what one may take.
  png_set_chunk_malloc_max(png, 8u << 20);
  png_set_chunk_cache_max(png, 1000);
  png_read_info(png, info);
  int bit_depth = 0, color_type = 0, interlace = 0;
  png_get_IHDR(png, info, &s.width, &s.height, &bit_depth, &color_type, &interlace, nullptr, nullptr);
  s.size_status = check_declared_size("PNG", s.width, s.height, *s.limits);
  if (!s.size_status.ok()) return false;

  s.gray16 = color_type == PNG_COLOR_TYPE_GRAY && bit_depth == 16;
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (bit_depth == 16 && !s.gray16) png_set_strip_16(png);
  // Expanding a palette or low-bit grey also turns a tRNS chunk into alpha: drop it as well.
  if ((color_type & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS)) png_set_strip_alpha(png);
  if ((color_type == PNG_COLOR_TYPE_GRAY || color_type == PNG_COLOR_TYPE_GRAY_ALPHA) && !s.gray16) {
    png_set_gray_to_rgb(png);
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t row_nbytes = png_get_rowbytes(png, info);
  const size_t want = s.gray16 ? size_t(s.width) * 2 : size_t(s.width) * 3;
  if (row_nbytes != want) png_error(png, "unexpected row layout after the colour transforms");
  s.raw.resize(row_nbytes * s.height);
  s.rows.resize(s.height);
  for (png_uint_32 y = 0; y < s.height; ++y) s.rows[y] = s.raw.data() + y * row_nbytes;
  png_read_image(png, s.rows.data());
  return true;
}

}  // namespace

Result<RgbImage> decode_png(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  PngState s;
  s.bytes = bytes;
  s.limits = &limits;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, png_fail, png_warn);
  if (!png) return make_error("PNG decoder: out of memory");
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return make_error("PNG decoder: out of memory");
  }
  const bool ok = read_png_pixels(png, info, s);
  png_destroy_read_struct(&png, &info, nullptr);
  if (!s.size_status.ok()) return s.size_status.error();
  if (!ok) return make_error("corrupt or truncated PNG data (", s.message, "); send a complete, valid image");

  RgbImage out(int(s.width), int(s.height));
  if (!s.gray16) {
    out.rgb = std::move(s.raw);
    return out;
  }
  for (size_t i = 0; i < size_t(s.width) * s.height; ++i) {
    const unsigned v = unsigned(s.raw[2 * i]) << 8 | s.raw[2 * i + 1];
    const uint8_t c = v > 255 ? 255 : uint8_t(v);
    out.rgb[3 * i] = out.rgb[3 * i + 1] = out.rgb[3 * i + 2] = c;
  }
  return out;
}

}  // namespace spw::vision
