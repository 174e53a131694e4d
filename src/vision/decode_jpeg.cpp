// JPEG through TurboJPEG (libjpeg-turbo), with the defaults Pillow's decoder also uses: accurate
// integer IDCT and fancy upsampling, libjpeg's own YCbCr → RGB; greyscale JPEGs are replicated to
// RGB. CMYK/YCCK JPEGs are refused (Pillow would convert them; they are rare in chat clients).
// libjpeg warnings (a premature end of data, corrupt entropy data) are errors here, as Pillow
// refuses truncated JPEGs too.
#include <turbojpeg.h>

#include <string>

#include "vision/decoders.h"

namespace spw::vision {
namespace {

struct TjHandle {
  tjhandle h = tjInitDecompress();
  ~TjHandle() {
    if (h) tjDestroy(h);
  }
};

}  // namespace

Result<RgbImage> decode_jpeg(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  TjHandle tj;
  if (!tj.h) return make_error("JPEG decoder: ", tjGetErrorStr2(nullptr));
  auto* data = const_cast<unsigned char*>(bytes.data());  // TurboJPEG 2.x takes a non-const pointer; it does not write
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj.h, data, (unsigned long)bytes.size(), &width, &height, &subsamp, &colorspace) != 0) {
    return make_error("corrupt or truncated JPEG data (", tjGetErrorStr2(tj.h), "); send a complete, valid image");
  }
  if (width <= 0 || height <= 0) return make_error("corrupt or truncated JPEG data (no frame header); send a complete, valid image");
  SPW_TRY(check_declared_size("JPEG", width, height, limits));
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    return make_error("CMYK JPEG images are not supported; convert the image to RGB (or send PNG)");
  }
  RgbImage out(width, height);
  if (tjDecompress2(tj.h, data, (unsigned long)bytes.size(), out.rgb.data(), width, 0, height, TJPF_RGB, 0) != 0) {
    return make_error("corrupt or truncated JPEG data (", tjGetErrorStr2(tj.h), "); send a complete, valid image");
  }
  return out;
}

}  // namespace spw::vision
