// Added-token extraction, as Hugging Face tokenizers' AddedVocabulary::find_matches does it: a
// leftmost-longest, non-overlapping scan over all token contents (their Aho-Corasick automaton;
// here a byte trie walked from each candidate position), then the per-token flags: a special token
// is skipped when special parsing is off, `single_word` rejects matches touching word characters,
// `lstrip`/`rstrip` swallow the adjacent Unicode whitespace. Spans of the text can be marked plain:
// no token is matched there (see Tokenizer::encode_with_plain_spans).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/text_span.h"

namespace spw::tok {

struct AddedTokenSpec {
  std::string content;  // the text to find (already normalized for the normalized set)
  int32_t id = 0;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
};

class AddedTokenMatcher {
 public:
  void build(std::vector<AddedTokenSpec> tokens);
  bool empty() const { return tokens_.empty(); }

  // Split `text` (valid UTF-8) into gaps and added tokens, in order. on_gap gets non-empty text
  // between tokens; on_token gets the id of each token found. No match overlaps one of `plain`
  // (sorted, non-overlapping byte ranges of `text`): their text always lands in a gap.
  void split(std::string_view text, bool parse_special, std::span<const TextSpan> plain,
             const std::function<void(std::string_view)>& on_gap,
             const std::function<void(int32_t)>& on_token) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                  // index into tokens_
  };
  int32_t child(int32_t node, uint8_t b) const;

  std::vector<AddedTokenSpec> tokens_;
  std::vector<Node> nodes_;
  std::array<bool, 256> first_byte_{};
};

}  // namespace spw::tok
