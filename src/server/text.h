// The server's one door to the tokenizer (src/tokenizer): prompt text → ids, ids → text, and a
// per-request streaming decoder. A model directory without tokenizer.json is served on token ids
// only: text prompts get a 400 naming the missing file, outputs carry `token_ids` and empty text.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/text_span.h"

namespace spw {
class Tokenizer;
class IncrementalDecoder;
}  // namespace spw

namespace spw::server {

class TokenTrie;

class Text {
 public:
  // Loads <model_dir>/tokenizer.json if present; a present but broken file is an error.
  static Result<std::unique_ptr<Text>> load(const std::string& model_dir);
  ~Text();

  bool has_tokenizer() const { return tokenizer_ != nullptr; }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  Result<std::vector<int32_t>> encode(std::string_view text, bool parse_special) const;
  // A chat prompt: markers parsed, no added token split out of `plain` (the client's text).
  Result<std::vector<int32_t>> encode_with_plain_spans(std::string_view text, std::span<const TextSpan> plain) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const;
  // One token as a string for logprobs ("token_id:N" without a tokenizer, as vLLM spells it).
  std::string token_text(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Every token's bytes as a trie (constrained decoding); built on first use. Needs a tokenizer.
  std::shared_ptr<const TokenTrie> token_trie() const;

  // Text completed by each new id; never a partial UTF-8 character.
  class Decoder {
   public:
    Decoder(const Text& text, bool skip_special);
    ~Decoder();
    std::string push(int32_t id);
    std::string flush();

   private:
    std::unique_ptr<IncrementalDecoder> impl_;
  };

 private:
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string missing_message_;
  mutable std::once_flag trie_once_;
  mutable std::shared_ptr<const TokenTrie> trie_;
};

}  // namespace spw::server
