#include "tokenizer/unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>

#include "base/status.h"
#include "tokenizer/utf8.h"

namespace spw::tok {

bool is_white_space(char32_t cp) { return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE); }

bool is_mark(char32_t cp) { return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_M_MASK) != 0; }

bool is_word_char(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  const uint32_t gc = U_GET_GC_MASK(c);
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || (gc & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0 ||
         u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL);
}

std::string normalize(std::string_view s, NormalForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case NormalForm::nfc: n = icu::Normalizer2::getNFCInstance(status); break;
    case NormalForm::nfd: n = icu::Normalizer2::getNFDInstance(status); break;
    case NormalForm::nfkc: n = icu::Normalizer2::getNFKCInstance(status); break;
    case NormalForm::nfkd: n = icu::Normalizer2::getNFKDInstance(status); break;
  }
  SPW_CHECK(U_SUCCESS(status) && n != nullptr);
  const icu::UnicodeString in = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  if (n->isNormalized(in, status) && U_SUCCESS(status)) return std::string(s);
  status = U_ZERO_ERROR;
  const icu::UnicodeString out = n->normalize(in, status);
  SPW_CHECK(U_SUCCESS(status));
  std::string result;
  out.toUTF8String(result);
  return result;
}

std::string lowercase_per_char(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const char32_t cp = utf8_next(s, i);
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
      continue;
    }
    UChar src[2];
    int32_t src_len = 0;
    U16_APPEND_UNSAFE(src, src_len, static_cast<UChar32>(cp));
    UChar dst[8];
    UErrorCode status = U_ZERO_ERROR;
    const int32_t dst_len = u_strToLower(dst, 8, src, src_len, "", &status);
    SPW_CHECK(U_SUCCESS(status) && dst_len <= 8);
    int32_t k = 0;
    while (k < dst_len) {
      UChar32 c;
      U16_NEXT(dst, k, dst_len, c);
      utf8_append(out, static_cast<char32_t>(c));
    }
  }
  return out;
}

}  // namespace spw::tok
