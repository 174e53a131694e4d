// Reads a golden case written by tools/golden/gen_v4.py / gen_v41.py (see the fixture READMEs).
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "formats/dtypes.h"
#include "formats/safetensors.h"

namespace spw::golden {

inline std::string fixture_dir(const std::string& arch) {
  return std::string(SPW_SOURCE_DIR) + "/tests/golden/fixtures/" + arch;
}

// Any float tensor (F32 or BF16) as f32.
inline std::vector<float> read_floats(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  if (!t) return {};
  std::vector<float> out(t->numel());
  for (size_t i = 0; i < out.size(); ++i) {
    if (t->dtype == DType::F32) {
      std::memcpy(&out[i], t->data + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, t->data + 2 * i, 2);
      out[i] = bf16_to_f32(b);
    }
  }
  return out;
}

inline std::vector<int32_t> read_ids(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  if (!t) return {};
  std::vector<int32_t> out(t->numel());
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t v;
    std::memcpy(&v, t->data + 8 * i, 8);
    out[i] = int32_t(v);
  }
  return out;
}

inline size_t argmax(const float* v, size_t n) {
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

}  // namespace spw::golden
