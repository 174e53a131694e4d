// UTF-8 helpers for the tokenizer: validation, U+FFFD repair with the Unicode "maximal subpart"
// policy (what Python's bytes.decode("utf-8", "replace") and Rust's String::from_utf8_lossy do,
// so repaired text matches what Hugging Face tokenizers sees), and GPT-2's byte-level alphabet.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace spw::tok {

// Length of the well-formed UTF-8 sequence at s[i], or 0 if the bytes there are not one. When
// `incomplete` is given it is set when the bytes are a valid but truncated prefix at the end of s.
size_t utf8_sequence_length(std::string_view s, size_t i, bool* incomplete = nullptr);

// Number of bytes the maximal-subpart rule consumes for the ill-formed sequence at s[i] (>= 1).
size_t utf8_invalid_length(std::string_view s, size_t i);

bool utf8_is_valid(std::string_view s);

// Replace every maximal ill-formed subpart by U+FFFD.
std::string utf8_repair(std::string_view s);

// Decode the code point at s[i] (s must be valid UTF-8 there) and advance i.
char32_t utf8_next(std::string_view s, size_t& i);
// Code point ending just before s[end] (valid UTF-8), with its start in *start.
char32_t utf8_prev(std::string_view s, size_t end, size_t* start);
void utf8_append(std::string& out, char32_t cp);

// GPT-2 bytes_to_unicode: printable bytes map to themselves, the rest to U+0100.. in byte order.
const std::array<char32_t, 256>& byte_level_alphabet();
// Inverse of the alphabet; -1 for code points outside it.
int byte_level_byte(char32_t cp);

}  // namespace spw::tok
