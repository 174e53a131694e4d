#include "server/text.h"

#include <filesystem>

#include "server/grammar_constraint.h"
#include "tokenizer/tokenizer.h"

namespace spw::server {

Result<std::unique_ptr<Text>> Text::load(const std::string& model_dir) {
  auto text = std::make_unique<Text>();
  const std::string path = model_dir + "/tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    text->missing_message_ = model_dir + " has no tokenizer.json, so this server takes token ids only; send the prompt as an array of token ids";
    return text;
  }
  auto tok = Tokenizer::load(path);
  if (!tok.ok()) return tok.error();
  text->tokenizer_ = std::move(tok.value());
  return text;
}

Text::~Text() = default;

Result<std::vector<int32_t>> Text::encode(std::string_view s, bool parse_special) const {
  if (!tokenizer_) return make_error(missing_message_);
  return tokenizer_->encode(s, parse_special);
}

Result<std::vector<int32_t>> Text::encode_with_plain_spans(std::string_view s, std::span<const TextSpan> plain) const {
  if (!tokenizer_) return make_error(missing_message_);
  return tokenizer_->encode_with_plain_spans(s, plain);
}

std::string Text::decode(std::span<const int32_t> ids, bool skip_special) const {
  return tokenizer_ ? tokenizer_->decode(ids, skip_special) : std::string();
}

std::string Text::token_text(int32_t id) const {
  if (!tokenizer_) return "token_id:" + std::to_string(id);
  return tokenizer_->decode(std::span<const int32_t>(&id, 1), false);
}

std::optional<int32_t> Text::token_to_id(std::string_view token) const {
  return tokenizer_ ? tokenizer_->token_to_id(token) : std::nullopt;
}

std::shared_ptr<const TokenTrie> Text::token_trie() const {
  std::call_once(trie_once_, [this] {
    std::vector<std::string> bytes;
    if (tokenizer_) {
      bytes.resize(tokenizer_->vocab_size());
      for (size_t id = 0; id < bytes.size(); ++id) bytes[id] = std::string(tokenizer_->token_bytes(int32_t(id)));
    }
    trie_ = std::make_shared<const TokenTrie>(std::move(bytes));
  });
  return trie_;
}

Text::Decoder::Decoder(const Text& text, bool skip_special) {
  if (text.tokenizer_) impl_ = std::make_unique<IncrementalDecoder>(*text.tokenizer_, skip_special);
}

Text::Decoder::~Decoder() = default;

std::string Text::Decoder::push(int32_t id) { return impl_ ? impl_->push(id) : std::string(); }

std::string Text::Decoder::flush() { return impl_ ? impl_->flush() : std::string(); }

}  // namespace spw::server
