// DeepSeek Engram compressed-token map (spec §5.4 item 1). The reference builds it with a
// tokenizers normalizer chain: NFKC, NFD, StripAccents, Lowercase, Replace([ \t\r\n]+ -> " "),
// Replace(^ $ -> U+E000), Strip, Replace(U+E000 -> " "). Each step here follows that normalizer's
// Rust semantics (see unicode.h); StripAccents removes every General_Category Mark, not only Mn.
#include <unordered_map>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace spw {

namespace {

std::string engram_normalize(std::string_view text) {
  std::string s = tok::normalize(text, tok::NormalForm::nfkc);
  s = tok::normalize(s, tok::NormalForm::nfd);
  std::string no_marks;
  no_marks.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    if (!tok::is_mark(tok::utf8_next(s, i))) no_marks.append(s, start, i - start);
  }
  s = tok::lowercase_per_char(no_marks);
  std::string collapsed;
  collapsed.reserve(s.size());
  bool in_run = false;
  for (const char c : s) {
    const bool ws = c == ' ' || c == '\t' || c == '\r' || c == '\n';
    if (ws && !in_run) collapsed.push_back(' ');
    if (!ws) collapsed.push_back(c);
    in_run = ws;
  }
  // A lone space is protected from Strip (the reference swaps it for a private-use sentinel).
  if (collapsed == " ") return collapsed;
  size_t b = 0;
  size_t e = collapsed.size();
  while (b < e) {
    size_t k = b;
    if (!tok::is_white_space(tok::utf8_next(collapsed, k))) break;
    b = k;
  }
  while (e > b) {
    size_t start;
    if (!tok::is_white_space(tok::utf8_prev(collapsed, e, &start))) break;
    e = start;
  }
  return collapsed.substr(b, e - b);
}

}  // namespace

std::vector<int32_t> engram_compressed_token_map(const Tokenizer& tokenizer, int64_t* n_classes) {
  const size_t n = tokenizer.vocab_size();
  std::vector<int32_t> map(n);
  std::unordered_map<std::string, int32_t> classes;
  classes.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    const int32_t tid = static_cast<int32_t>(id);
    const std::string text = tokenizer.decode(std::span<const int32_t>(&tid, 1), false);
    std::string key;
    if (text.find("\xEF\xBF\xBD") != std::string::npos) {
      key = tokenizer.id_to_token(tid);
    } else {
      key = engram_normalize(text);
      if (key.empty()) key = text;
    }
    auto [it, inserted] = classes.emplace(std::move(key), static_cast<int32_t>(classes.size()));
    map[id] = it->second;
  }
  if (n_classes) *n_classes = static_cast<int64_t>(classes.size());
  return map;
}

}  // namespace spw
