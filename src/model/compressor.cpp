#include "model/compressor.h"

#include <cmath>
#include <cstring>

namespace spw::detail {

bool compressor_push(CompressorState& st, int ratio, int width, bool overlap, int64_t pos, const float* kv,
                     const float* score, std::vector<float>& entry) {
  const size_t rows_nbytes = size_t(ratio) * width;
  if (st.kv.empty()) {
    st.kv.assign(rows_nbytes, 0.f);
    st.score.assign(rows_nbytes, -INFINITY);
  }
  const int slot = int(pos % ratio);
  std::memcpy(st.kv.data() + size_t(slot) * width, kv, sizeof(float) * width);
  std::memcpy(st.score.data() + size_t(slot) * width, score, sizeof(float) * width);
  if ((pos + 1) % ratio != 0) return false;

  const int d_out = overlap ? width / 2 : width;
  entry.assign(d_out, 0.f);
  std::vector<float> s, v;
  for (int ch = 0; ch < d_out; ++ch) {
    s.clear();
    v.clear();
    if (overlap && st.has_prev) {
      for (int i = 0; i < ratio; ++i) {
        s.push_back(st.prev_score[size_t(i) * width + ch]);
        v.push_back(st.prev_kv[size_t(i) * width + ch]);
      }
    }
    const int own_ch = overlap ? d_out + ch : ch;
    for (int i = 0; i < ratio; ++i) {
      s.push_back(st.score[size_t(i) * width + own_ch]);
      v.push_back(st.kv[size_t(i) * width + own_ch]);
    }
    float m = -INFINITY;
    for (float x : s) m = std::fmax(m, x);
    float sum = 0.f, acc = 0.f;
    for (size_t i = 0; i < s.size(); ++i) {
      float e = std::exp(s[i] - m);
      sum += e;
      acc += e * v[i];
    }
    entry[ch] = acc / sum;
  }
  if (overlap) {
    st.prev_kv = st.kv;
    st.prev_score = st.score;
    st.has_prev = true;
  }
  return true;
}

}  // namespace spw::detail
