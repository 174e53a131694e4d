// Pillow's Image.resize(size, Resampling.BICUBIC) for 8-bit RGB, reimplemented so the image
// processor reproduces the reference's pixels bit for bit: the reference resizes with Pillow
// (ImageOps.pad → ImageOps.contain → Image.resize, bicubic).
//
// The algorithm (Pillow's libImaging/Resample.c, read and rewritten here): a separable convolution,
// one pass into an 8-bit intermediate, then the other. Per axis, output i is centred at
// (i + 0.5) * scale in the source (scale = in / out); the bicubic kernel (a = -0.5, support 2) is
// stretched by max(scale, 1) so that downscaling antialiases; taps run from
// (int)(centre - support + 0.5) to (int)(centre + support + 0.5), clipped to the image; weights are
// normalised in double, then rounded to fixed point with 22 fractional bits; each pass accumulates
// in integers from a rounding bias of 2^21 and clips to 0..255. The 8-bit rounding between the two
// passes is part of the result, and so is the order of the passes:
//   - Pillow <= 12 always runs the horizontal pass first;
//   - Pillow 13.0 runs the vertical pass first when the image loses height and
//     (in_height - out_height) > 2 * (in_width - out_width). Pillow 13's C source was not available
//     to read; this rule was found by comparing both orders with Pillow 13.0.0 on random images and
//     holds on all of 150 random shapes and 700 grid points (2 to 4001 pixels a side).
// We follow Pillow 13.0 (what the reference gets from PyPI today). Against Pillow <= 12 the two
// differ only where Pillow 13 goes vertical first, by a few levels (up to 6 seen) in some pixels.
//
// Verified by tests/unit/test_vision_processor_golden.cpp against Pillow (tools/vision/make_processor_goldens.py).
#pragma once

#include "vision/image.h"

namespace spw::vision {

// `src` resized to width x height (both > 0). Returns a copy when the size is unchanged.
RgbImage resize_bicubic_pil(const RgbImage& src, int width, int height);

}  // namespace spw::vision
