// The image positions among one forward's tokens (V4.1 vision, specs §5.1, §5.3, §5.4, §5.6). An image
// position keeps its token id (the config's image_token_id) but:
//   - its embedding is its row of `rows` (the aligner's output, or image_start / image_newline /
//     image_end), rounded to the activation type as the reference's copy into the BF16 stream is;
//   - every router selects its experts with `bias_vl` instead of `bias` (weights stay unbiased);
//   - Engram adds nothing to it (gate 0), and it is DEAD in the n-gram history: no n-gram of a later
//     text position reaches back across it.
// Attention treats it as any other position (causal).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace spw {

struct ImagePositions {
  std::span<const uint8_t> is_image;  // one per token (nonzero: an image position); empty: every token is text
  std::span<const float> rows;        // [image positions, d_model]: their embeddings, in token order

  bool empty() const { return is_image.empty(); }
  size_t count() const {
    size_t n = 0;
    for (uint8_t b : is_image) n += b != 0;
    return n;
  }
};

}  // namespace spw
