// Pillow's Image.resize(size, Resampling.BICUBIC) for 8-bit RGB, reimplemented so the image
// processor reproduces the reference's pixels bit for bit: the reference resizes with Pillow
// (ImageOps.pad → ImageOps.contain → Image.resize, bicubic).
//
// The algorithm (Pillow's libImaging/Resample.c, read and rewritten here): a separable convolution,
// horizontal pass first into an 8-bit intermediate, then vertical. Per axis, output i is centred at
// (i + 0.5) * scale in the source (scale = in / out); the bicubic kernel (a = -0.5, support 2) is
// stretched by max(scale, 1) so that downscaling antialiases; taps run from
// (int)(centre - support + 0.5) to (int)(centre + support + 0.5), clipped to the image; weights are
// normalised in double, then rounded to fixed point with 22 fractional bits; each pass accumulates
// in integers from a rounding bias of 2^21 and clips to 0..255. The 8-bit rounding between the two
// passes is part of the result.
//
// Verified by tests/unit/test_vision_processor_golden.cpp against Pillow (tools/vision/make_processor_goldens.py).
#pragma once

#include "vision/image.h"

namespace spw::vision {

// `src` resized to width x height (both > 0). Returns a copy when the size is unchanged.
RgbImage resize_bicubic_pil(const RgbImage& src, int width, int height);

}  // namespace spw::vision
