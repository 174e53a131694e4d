// A byte range [begin, end) of a string. The chat encoder uses it to tell the tokenizer which parts
// of a prompt came from the client (see Tokenizer::encode_with_plain_spans).
#pragma once

#include <cstddef>

namespace spw {

struct TextSpan {
  size_t begin = 0;
  size_t end = 0;
};

}  // namespace spw
