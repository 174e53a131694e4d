#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace spw::tok {

void AddedTokenMatcher::build(std::vector<AddedTokenSpec> tokens) {
  tokens_ = std::move(tokens);
  nodes_.assign(1, Node{});
  first_byte_.fill(false);
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& s = tokens_[t].content;
    if (s.empty()) continue;
    first_byte_[static_cast<uint8_t>(s[0])] = true;
    int32_t node = 0;
    for (const char ch : s) {
      const auto b = static_cast<uint8_t>(ch);
      int32_t c = child(node, b);
      if (c < 0) {
        c = static_cast<int32_t>(nodes_.size());
        auto& kids = nodes_[node].children;
        kids.insert(std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{0})), {b, c});
        nodes_.push_back(Node{});
      }
      node = c;
    }
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int32_t>(t);  // first pattern wins ties
  }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t b) const {
  const auto& kids = nodes_[node].children;
  auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{0}));
  return (it != kids.end() && it->first == b) ? it->second : -1;
}

void AddedTokenMatcher::split(std::string_view text, bool parse_special, std::span<const TextSpan> plain,
                              const std::function<void(std::string_view)>& on_gap,
                              const std::function<void(int32_t)>& on_token) const {
  size_t start_offset = 0;  // end of the last emitted token
  size_t i = 0;
  size_t i_plain = 0;  // first plain span that ends after i
  while (i < text.size()) {
    while (i_plain < plain.size() && plain[i_plain].end <= i) ++i_plain;
    if (i_plain < plain.size() && plain[i_plain].begin <= i) {
      i = plain[i_plain].end;  // no token starts inside a plain span
      continue;
    }
    if (!first_byte_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    // Longest token starting at i that ends before the next plain span.
    const size_t limit = i_plain < plain.size() ? plain[i_plain].begin : text.size();
    int32_t node = 0;
    int32_t found = -1;
    size_t found_end = 0;
    for (size_t k = i; k < limit; ++k) {
      node = child(node, static_cast<uint8_t>(text[k]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) {
        found = nodes_[node].token;
        found_end = k + 1;
      }
    }
    if (found < 0) {
      ++i;
      continue;
    }
    const AddedTokenSpec& tok = tokens_[found];
    size_t start = i;
    size_t stop = found_end;
    i = found_end;  // the scan resumes after the raw match whatever happens below
    if (tok.special && !parse_special) continue;
    if (tok.single_word) {
      bool start_ok = true;
      if (start > 0) {
        size_t b;
        start_ok = !is_word_char(utf8_prev(text, start, &b));
      }
      bool stop_ok = true;
      if (stop < text.size()) {
        size_t k = stop;
        stop_ok = !is_word_char(utf8_next(text, k));
      }
      if (!start_ok || !stop_ok) continue;
    }
    if (tok.lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t b;
        if (!is_white_space(utf8_prev(text, s, &b))) break;
        s = b;
      }
      const size_t plain_before = i_plain > 0 ? plain[i_plain - 1].end : 0;
      start = std::max({s, start_offset, plain_before});
    }
    if (tok.rstrip) {
      while (stop < limit) {
        size_t k = stop;
        if (!is_white_space(utf8_next(text, k))) break;
        stop = k;
      }
    }
    if (start_offset < start) on_gap(text.substr(start_offset, start - start_offset));
    on_token(tok.id);
    start_offset = stop;
  }
  if (start_offset < text.size()) on_gap(text.substr(start_offset));
}

}  // namespace spw::tok
