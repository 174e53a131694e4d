// An 8-bit RGB image: what every decoder produces and what the image processor takes, the same
// pixels the reference gets from Pillow's Image.convert("RGB").
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace spw::vision {

struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // [height][width][3], rows top to bottom, R G B

  RgbImage() = default;
  RgbImage(int w, int h, uint8_t fill = 0) : width(w), height(h), rgb(size_t(w) * size_t(h) * 3, fill) {}
  uint8_t* row(int y) { return rgb.data() + size_t(y) * size_t(width) * 3; }
  const uint8_t* row(int y) const { return rgb.data() + size_t(y) * size_t(width) * 3; }
};

}  // namespace spw::vision
