// The LLM-side layout of an image (reference image_processor.py, specs §5.6): each placeholder
// token in a prompt becomes
//   [IMAGE_START] + ([IMAGE] x n_llm_w + [IMAGE_NEW_LINE]) x n_llm_h + [IMAGE_END]
// where every position carries the config's image_token_id and only the token type tells them
// apart; IMAGE slots take the aligner's rows in reading order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "vision/image_processor.h"

namespace spw::vision {

// The reference's token types (TEXT = -1, then IMAGE_START, IMAGE, IMAGE_NEW_LINE, IMAGE_END).
enum class TokenType : int8_t { text = -1, image_start = 0, image = 1, image_new_line = 2, image_end = 3 };

std::vector<TokenType> image_token_types(int n_llm_h, int n_llm_w);

// Where one image's span sits in the expanded prompt.
struct ImageSpan {
  size_t start = 0;  // index of its IMAGE_START
  ImageGrid grid;
};

struct ExpandedPrompt {
  std::vector<int32_t> ids;      // placeholders expanded, every image position = image_token_id
  std::vector<TokenType> types;  // one per id
  std::vector<ImageSpan> images;
};

// Expands the i-th occurrence of image_token_id in `ids` into the span of grids[i]. An Error when
// the number of placeholders and of images differ (as the reference's ValueError).
Result<ExpandedPrompt> expand_image_placeholders(std::span<const int32_t> ids, int32_t image_token_id,
                                                 std::span<const ImageGrid> grids);

}  // namespace spw::vision
