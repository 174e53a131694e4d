// GIF through giflib: the first frame only, read record by record so that nothing after it is
// decompressed. Laid out as Pillow lays out a GIF's first frame: a canvas of the logical screen
// (grown when the frame reaches past it), filled with the frame's transparent index when its
// graphic-control extension sets one and with index 0 otherwise, the frame drawn at its offset, then
// every index mapped through the local colour table, else the global one, else read as a grey
// level. Transparency is dropped (convert("RGB")). Indices past the end of a colour table map to
// grey (i, i, i), as in Pillow's palette, which starts as a grey ramp.
#include <gif_lib.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "vision/decoders.h"

namespace spw::vision {
namespace {

struct GifReader {
  std::span<const uint8_t> bytes;
  size_t pos = 0;
};

int gif_read_bytes(GifFileType* gif, GifByteType* out, int n) {
  auto* r = static_cast<GifReader*>(gif->UserData);
  const size_t take = std::min(size_t(n < 0 ? 0 : n), r->bytes.size() - r->pos);
  std::memcpy(out, r->bytes.data() + r->pos, take);
  r->pos += take;
  return int(take);
}

struct GifFile {
  GifFileType* gif = nullptr;
  ~GifFile() {
    int error = 0;
    if (gif) DGifCloseFile(gif, &error);
  }
};

Error corrupt(int code) {
  const char* why = GifErrorString(code);
  return make_error("corrupt or truncated GIF data (", why ? why : "unknown error", "); send a complete, valid image");
}

}  // namespace

Result<RgbImage> decode_gif(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  GifReader reader{bytes};
  int error = 0;
  GifFile file{DGifOpen(&reader, gif_read_bytes, &error)};
  if (!file.gif) return corrupt(error);
  GifFileType* gif = file.gif;
  // The screen may be 0x0 (the frame then sets the size); a huge one is refused before any pixel.
  if (gif->SWidth > 0 && gif->SHeight > 0) SPW_TRY(check_declared_size("GIF", gif->SWidth, gif->SHeight, limits));

  int transparent = -1;
  for (;;) {
    GifRecordType type;
    if (DGifGetRecordType(gif, &type) == GIF_ERROR) return corrupt(gif->Error);
    if (type == TERMINATE_RECORD_TYPE) return make_error("the GIF has no image frame; send an image with pixels");
    if (type == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* ext = nullptr;
      if (DGifGetExtension(gif, &code, &ext) == GIF_ERROR) return corrupt(gif->Error);
      if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4) transparent = (ext[1] & 1) ? ext[4] : -1;
      while (ext) {
        if (DGifGetExtensionNext(gif, &ext) == GIF_ERROR) return corrupt(gif->Error);
      }
      continue;
    }
    if (type != IMAGE_DESC_RECORD_TYPE) continue;
    if (DGifGetImageDesc(gif) == GIF_ERROR) return corrupt(gif->Error);
    const GifImageDesc& frame = gif->Image;
    SPW_TRY(check_declared_size("GIF (first frame)", frame.Width, frame.Height, limits));
    const int64_t canvas_w = std::max<int64_t>(gif->SWidth, int64_t(frame.Left) + frame.Width);
    const int64_t canvas_h = std::max<int64_t>(gif->SHeight, int64_t(frame.Top) + frame.Height);
    SPW_TRY(check_declared_size("GIF", canvas_w, canvas_h, limits));

    std::vector<uint8_t> index(size_t(canvas_w) * size_t(canvas_h), uint8_t(transparent >= 0 ? transparent : 0));
    std::vector<GifPixelType> line(size_t(frame.Width));
    auto read_row = [&](int y) -> Status {
      if (DGifGetLine(gif, line.data(), frame.Width) == GIF_ERROR) return corrupt(gif->Error);
      std::memcpy(&index[size_t(frame.Top + y) * size_t(canvas_w) + size_t(frame.Left)], line.data(), line.size());
      return {};
    };
    if (frame.Interlace) {
      static constexpr int kStart[4] = {0, 4, 2, 1}, kStep[4] = {8, 8, 4, 2};
      for (int pass = 0; pass < 4; ++pass) {
        for (int y = kStart[pass]; y < frame.Height; y += kStep[pass]) SPW_TRY(read_row(y));
      }
    } else {
      for (int y = 0; y < frame.Height; ++y) SPW_TRY(read_row(y));
    }

    const ColorMapObject* map = frame.ColorMap ? frame.ColorMap : gif->SColorMap;
    uint8_t palette[256][3];
    for (int i = 0; i < 256; ++i) palette[i][0] = palette[i][1] = palette[i][2] = uint8_t(i);
    if (map) {
      for (int i = 0; i < std::min(map->ColorCount, 256); ++i) {
        palette[i][0] = map->Colors[i].Red;
        palette[i][1] = map->Colors[i].Green;
        palette[i][2] = map->Colors[i].Blue;
      }
    }
    RgbImage out{int(canvas_w), int(canvas_h)};
    for (size_t i = 0; i < index.size(); ++i) std::memcpy(&out.rgb[3 * i], palette[index[i]], 3);
    return out;
  }
}

}  // namespace spw::vision
