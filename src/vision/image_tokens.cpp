// Image span layout and placeholder expansion (contract in image_tokens.h).
#include "vision/image_tokens.h"

#include <algorithm>

namespace spw::vision {

std::vector<TokenType> image_token_types(int n_llm_h, int n_llm_w) {
  std::vector<TokenType> types;
  types.reserve(size_t(num_image_tokens(n_llm_h, n_llm_w)));
  types.push_back(TokenType::image_start);
  for (int row = 0; row < n_llm_h; ++row) {
    types.insert(types.end(), size_t(n_llm_w), TokenType::image);
    types.push_back(TokenType::image_new_line);
  }
  types.push_back(TokenType::image_end);
  return types;
}

Result<ExpandedPrompt> expand_image_placeholders(std::span<const int32_t> ids, int32_t image_token_id,
                                                 std::span<const ImageGrid> grids) {
  const auto n_placeholders = size_t(std::count(ids.begin(), ids.end(), image_token_id));
  if (n_placeholders != grids.size()) {
    return make_error("the prompt has ", n_placeholders, " image placeholders but ", grids.size(),
                      " images were given; send one image per placeholder");
  }
  ExpandedPrompt out;
  size_t next = 0;
  for (const int32_t id : ids) {
    if (id != image_token_id) {
      out.ids.push_back(id);
      out.types.push_back(TokenType::text);
      continue;
    }
    const ImageGrid& g = grids[next++];
    out.images.push_back({out.ids.size(), g});
    const std::vector<TokenType> types = image_token_types(g.n_llm_h, g.n_llm_w);
    out.ids.insert(out.ids.end(), types.size(), image_token_id);
    out.types.insert(out.types.end(), types.begin(), types.end());
  }
  return out;
}

}  // namespace spw::vision
