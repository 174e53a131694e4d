// Unicode properties and normalization for the tokenizer, backed by ICU (libicu-dev). The
// predicates follow the Rust definitions Hugging Face tokenizers uses (char::is_whitespace,
// regex `\w`, unicode-normalization's is_combining_mark) so our results match theirs.
#pragma once

#include <string>
#include <string_view>

namespace spw::tok {

enum class NormalForm { nfc, nfd, nfkc, nfkd };

// Unicode White_Space (Rust char::is_whitespace, regex `\s`).
bool is_white_space(char32_t cp);
// Rust regex `\w`: Alphabetic, Mark, Decimal_Number, Connector_Punctuation, Join_Control.
bool is_word_char(char32_t cp);
// General_Category Mark (Mn, Mc, Me): what tokenizers' StripAccents removes.
bool is_mark(char32_t cp);

// s must be valid UTF-8.
std::string normalize(std::string_view s, NormalForm form);
// Full lowercase mapping applied code point by code point (no context rules such as final
// sigma), as tokenizers' Lowercase normalizer does.
std::string lowercase_per_char(std::string_view s);

}  // namespace spw::tok
