// Pillow-compatible bicubic resize (contract and algorithm in pil_resize.h).
#include "vision/pil_resize.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/status.h"

namespace spw::vision {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// Taps of one axis: output i reads `count[i]` source samples from `first[i]`, with fixed-point
// weights weight[i * ksize + t].
struct AxisTaps {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weight;
};

AxisTaps axis_taps(int in_size, int out_size) {
  constexpr double kSupport = 2.0;
  const double scale = double(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = kSupport * filterscale;
  AxisTaps t;
  t.ksize = int(std::ceil(support)) * 2 + 1;
  t.first.resize(size_t(out_size));
  t.count.resize(size_t(out_size));
  t.weight.assign(size_t(out_size) * size_t(t.ksize), 0);
  std::vector<double> w(size_t(t.ksize));
  for (int i = 0; i < out_size; ++i) {
    const double center = (i + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int lo = int(center - support + 0.5);  // truncation, as in C
    if (lo < 0) lo = 0;
    int hi = int(center + support + 0.5);
    if (hi > in_size) hi = in_size;
    const int n = hi - lo;
    double sum = 0.0;
    for (int x = 0; x < n; ++x) {
      w[size_t(x)] = bicubic((x + lo - center + 0.5) * ss);
      sum += w[size_t(x)];
    }
    for (int x = 0; x < n; ++x) {
      const double k = sum != 0.0 ? w[size_t(x)] / sum : w[size_t(x)];
      const double fixed = k * (1 << kPrecisionBits);
      t.weight[size_t(i) * size_t(t.ksize) + size_t(x)] = k < 0 ? int32_t(-0.5 + fixed) : int32_t(0.5 + fixed);
    }
    t.first[size_t(i)] = lo;
    t.count[size_t(i)] = n;
  }
  return t;
}

uint8_t clip8(int64_t acc) {
  if (acc >= (int64_t(1) << kPrecisionBits << 8)) return 255;
  if (acc <= 0) return 0;
  return uint8_t(acc >> kPrecisionBits);
}

// Rows [row0, row0 + out.height) of `src`, resampled horizontally into `out`.
void resample_rows(const RgbImage& src, int row0, const AxisTaps& t, RgbImage& out) {
  for (int y = 0; y < out.height; ++y) {
    const uint8_t* in = src.row(row0 + y);
    uint8_t* o = out.row(y);
    for (int x = 0; x < out.width; ++x) {
      const int32_t* k = &t.weight[size_t(x) * size_t(t.ksize)];
      int64_t acc[3] = {1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1)};
      for (int j = 0; j < t.count[size_t(x)]; ++j) {
        const uint8_t* p = in + size_t(t.first[size_t(x)] + j) * 3;
        for (int c = 0; c < 3; ++c) acc[c] += int64_t(p[c]) * k[j];
      }
      for (int c = 0; c < 3; ++c) o[3 * x + c] = clip8(acc[c]);
    }
  }
}

// `src` resampled vertically into `out`; tap rows are offset by -row0.
void resample_columns(const RgbImage& src, int row0, const AxisTaps& t, RgbImage& out) {
  for (int y = 0; y < out.height; ++y) {
    const int32_t* k = &t.weight[size_t(y) * size_t(t.ksize)];
    const int first = t.first[size_t(y)] - row0;
    uint8_t* o = out.row(y);
    for (int x = 0; x < out.width * 3; ++x) {
      int64_t acc = 1 << (kPrecisionBits - 1);
      for (int j = 0; j < t.count[size_t(y)]; ++j) acc += int64_t(src.row(first + j)[x]) * k[j];
      o[x] = clip8(acc);
    }
  }
}

}  // namespace

RgbImage resize_bicubic_pil(const RgbImage& src, int width, int height) {
  SPW_CHECK(width > 0 && height > 0 && src.width > 0 && src.height > 0);
  if (width == src.width && height == src.height) return src;
  const AxisTaps horiz = axis_taps(src.width, width);
  const AxisTaps vert = axis_taps(src.height, height);
  const bool need_horizontal = width != src.width;
  const bool need_vertical = height != src.height;
  if (!need_vertical) {
    RgbImage out(width, height);
    resample_rows(src, 0, horiz, out);
    return out;
  }
  if (!need_horizontal) {
    RgbImage out(width, height);
    resample_columns(src, 0, vert, out);
    return out;
  }
  const bool vertical_first = height < src.height && (src.height - height) > 2 * (src.width - width);
  if (vertical_first) {
    RgbImage mid(src.width, height);
    resample_columns(src, 0, vert, mid);
    RgbImage out(width, height);
    resample_rows(mid, 0, horiz, out);
    return out;
  }
  // Only the source rows some output row reads are resampled horizontally.
  const int row0 = vert.first.front();
  const int row_end = vert.first.back() + vert.count.back();
  RgbImage mid(width, row_end - row0);
  resample_rows(src, row0, horiz, mid);
  RgbImage out(width, height);
  resample_columns(mid, row0, vert, out);
  return out;
}

}  // namespace spw::vision
