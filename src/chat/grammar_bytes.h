// Byte classes the JSON grammars (tool-call arguments, response_format schemas) share: JSON
// whitespace and an incremental UTF-8 validator whose state fits in one byte of a grammar state.
#pragma once

#include <cstdint>

namespace spw::grammar_bytes {

inline bool is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// One byte of a well-formed UTF-8 stream (no overlongs, surrogates or code points past U+10FFFF).
// `need`: bits 0-1 count the continuation bytes still owed, bits 4-6 narrow the next one.
inline bool utf8_step(uint8_t& need, unsigned char c) {
  static constexpr unsigned char kLo[5] = {0x80, 0xA0, 0x80, 0x90, 0x80};
  static constexpr unsigned char kHi[5] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
  if (need & 3) {
    const int r = need >> 4;
    if (c < kLo[r] || c > kHi[r]) return false;
    need = uint8_t((need & 3) - 1);
    return true;
  }
  if (c < 0x80) return true;
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c == 0xE0) need = 2 | 1 << 4;
  else if (c == 0xED) need = 2 | 2 << 4;
  else if (c >= 0xE1 && c <= 0xEF) need = 2;
  else if (c == 0xF0) need = 3 | 3 << 4;
  else if (c == 0xF4) need = 3 | 4 << 4;
  else if (c >= 0xF1 && c <= 0xF3) need = 3;
  else return false;
  return true;
}

}  // namespace spw::grammar_bytes
