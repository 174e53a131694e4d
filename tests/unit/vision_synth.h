// Test helpers of the vision tests: the synthetic image formula that
// tools/vision/make_processor_goldens.py evaluates too (so golden inputs need not be stored), a
// file reader, and FNV-1a-64.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "vision/image.h"

namespace spw::vision::test {

inline RgbImage synth_image(int w, int h, uint32_t seed) {
  RgbImage img(w, h);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        uint32_t hsh = (uint32_t(x) * 73856093u) ^ (uint32_t(y) * 19349663u) ^ (uint32_t(c) * 83492791u + seed * 2654435761u);
        hsh ^= hsh >> 13;
        hsh *= 1274126177u;
        hsh ^= hsh >> 16;
        int64_t g = c == 0 ? int64_t(x) * 255 / std::max(w - 1, 1)
                  : c == 1 ? int64_t(y) * 255 / std::max(h - 1, 1)
                           : int64_t(x + y) * 255 / std::max(w + h - 2, 1);
        const int64_t checker = ((x / 7 + y / 5) & 1) ? 40 : -40;
        const int64_t v = g + int64_t(hsh & 31) - 16 + checker;
        img.row(y)[3 * x + c] = uint8_t(std::clamp<int64_t>(v, 0, 255));
      }
    }
  }
  return img;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  const std::string s = read_file(path);
  return {s.begin(), s.end()};
}

inline uint64_t fnv1a64(const std::vector<uint8_t>& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t b : bytes) {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  return h;
}

inline const std::string kVisionData = std::string(SPW_SOURCE_DIR) + "/tests/unit/data/vision/";

}  // namespace spw::vision::test
