// Internal state of a loaded Tokenizer, shared by tokenizer_load.cpp (tokenizer.json -> Impl) and
// tokenizer.cpp (encode/decode). Not part of the public API.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace spw {

struct TokenStringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct Tokenizer::Impl {
  struct SplitRule {
    std::unique_ptr<tok::Regex> regex;
    tok::SplitBehavior behavior = tok::SplitBehavior::isolated;
    bool invert = false;
  };

  // Vocabulary: id -> raw token string, decoded bytes, special flag; string -> id (added first).
  std::vector<std::string> tokens;
  std::vector<std::string> token_bytes;
  std::vector<uint8_t> special;
  std::unordered_map<std::string, int32_t, TokenStringHash, std::equal_to<>> token_ids;

  std::vector<tok::NormalForm> normalizers;  // applied in order; empty = identity
  tok::AddedTokenMatcher raw_added;          // added tokens with normalized=false
  tok::AddedTokenMatcher normalized_added;   // added tokens with normalized=true
  std::vector<SplitRule> splits;             // Split pre-tokenizers before ByteLevel
  bool add_prefix_space = false;
  std::unique_ptr<tok::Regex> byte_level_regex;  // GPT-2 regex when ByteLevel use_regex
  std::unique_ptr<tok::BpeModel> bpe;
};

Result<std::unique_ptr<Tokenizer::Impl>> parse_tokenizer_json(std::string_view json_text, const std::string& origin);

}  // namespace spw
