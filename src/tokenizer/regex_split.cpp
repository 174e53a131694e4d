#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex_split.h"

#include <pcre2.h>

#include <cstdlib>

#include "tokenizer/utf8.h"

namespace spw::tok {

namespace {

struct OnigCategoryDelta {
  std::string_view name;
  std::string_view add;     // PCRE2 class items Oniguruma's \p{name} matches beyond the base Unicode
  std::string_view remove;  // items it no longer matches
};

#include "tokenizer/generated/onig_categories.inc"

const OnigCategoryDelta* find_delta(std::string_view name) {
  for (const auto& d : kOnigCategoryDeltas) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

// PCRE2's Unicode data must be at least the base the deltas were computed against.
Status check_pcre2_unicode() {
  char version[32] = {};
  pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, version);
  const auto major = [](std::string_view v) { return std::atoi(std::string(v.substr(0, v.find('.'))).c_str()); };
  if (major(version) < major(kOnigBaseUnicode)) {
    return make_error("PCRE2 Unicode data ", version, " is older than ", kOnigBaseUnicode,
                      " (needed to reproduce tokenizers' \\p{...} classes)");
  }
  return {};
}

// \p{X} / \P{X} rewritten to match tokenizers' Oniguruma sets. Other property names pass through.
Result<std::string> translate_property(std::string_view p, std::string_view name, bool negated, bool in_class) {
  const std::string pcre = std::string(negated ? "\\P{" : "\\p{") + std::string(name) + "}";
  const OnigCategoryDelta* d = find_delta(name);
  if (d == nullptr || (d->add.empty() && d->remove.empty())) return pcre;
  const std::string add(d->add), remove(d->remove);
  if (in_class) {
    if (!negated && remove.empty()) return pcre + add;
    if (negated && add.empty()) return pcre + remove;
    return make_error("regex \"", p, "\": ", pcre, " inside a character class cannot be matched to tokenizers' Unicode data");
  }
  if (!negated) {
    std::string out = "(?:";
    if (!remove.empty()) out += "(?![" + remove + "])";
    return out + "[" + pcre + add + "])";
  }
  std::string out = "(?:";
  if (!add.empty()) out += "(?![" + add + "])";
  return out + "[" + pcre + remove + "])";
}

// Unicode White_Space, the meaning of `\s` in Oniguruma and in Rust's regex crate.
constexpr std::string_view kWhiteSpaceItems =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
constexpr std::string_view kHexItems = "0-9a-fA-F";

}  // namespace

Result<std::string> translate_oniguruma(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  size_t class_start = 0;  // index in p just after '[' or '[^'
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's' || e == 'h') {
        const std::string_view items = e == 's' ? kWhiteSpaceItems : kHexItems;
        if (in_class) {
          out.append(items);
        } else {
          out.append("[").append(items).append("]");
        }
        continue;
      }
      if (e == 'p' || e == 'P') {
        std::string_view name;
        bool negated = e == 'P';
        if (i + 1 < p.size() && p[i + 1] == '{') {
          const size_t close = p.find('}', i + 2);
          if (close == std::string_view::npos) return make_error("regex \"", p, "\": unterminated \\p{");
          name = p.substr(i + 2, close - i - 2);
          i = close;
        } else if (i + 1 < p.size()) {
          name = p.substr(i + 1, 1);
          ++i;
        }
        if (!name.empty() && name[0] == '^') {
          negated = !negated;
          name.remove_prefix(1);
        }
        auto t = translate_property(p, name, negated, in_class);
        if (!t) return t.error();
        out.append(t.value());
        continue;
      }
      if (e == 'S' || e == 'H') {
        if (in_class) {
          return make_error("regex \"", p, "\": negated class escape \\", e,
                            " inside a character class is unsupported");
        }
        out.append("[^").append(e == 'S' ? kWhiteSpaceItems : kHexItems).append("]");
        continue;
      }
      out.push_back('\\');
      out.push_back(e);
      continue;
    }
    if (!in_class) {
      if (c == '[') {
        in_class = true;
        out.push_back(c);
        if (i + 1 < p.size() && p[i + 1] == '^') {
          out.push_back('^');
          ++i;
        }
        class_start = i + 1;
        continue;
      }
      out.push_back(c);
      continue;
    }
    // Inside a character class.
    if (c == ']' && i != class_start) {
      in_class = false;
      out.push_back(c);
      continue;
    }
    if (c == '[') {
      if (i + 1 < p.size() && p[i + 1] == ':') {
        const size_t close = p.find(":]", i + 2);
        if (close == std::string_view::npos) return make_error("regex \"", p, "\": unterminated POSIX class");
        out.append(p.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
      return make_error("regex \"", p, "\": nested character classes are unsupported");
    }
    if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
      return make_error("regex \"", p, "\": character class intersection (&&) is unsupported");
    }
    out.push_back(c);
  }
  return out;
}

Result<std::unique_ptr<Regex>> Regex::compile(std::string_view pattern, bool literal) {
  SPW_TRY(check_pcre2_unicode());
  std::string translated;
  if (literal) {
    translated = std::string(pattern);
  } else {
    auto t = translate_oniguruma(pattern);
    if (!t) return t.error();
    translated = std::move(t.value());
  }
  pcre2_compile_context* ctx = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(ctx, PCRE2_NEWLINE_LF);
  // Oniguruma's Ruby syntax: ^ and $ are line anchors.
  const uint32_t options = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options, &err,
                                   &err_offset, ctx);
  pcre2_compile_context_free(ctx);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return make_error("regex \"", pattern, "\" does not compile with PCRE2 at offset ", err_offset, ": ",
                      reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: the interpreter is the fallback
  return std::unique_ptr<Regex>(new Regex(code));
}

Regex::~Regex() { pcre2_code_free(code_); }

Regex::MatchData::MatchData(const Regex& re) : md_(pcre2_match_data_create_from_pattern(re.code_, nullptr)) {
  SPW_CHECK(md_ != nullptr);
}

Regex::MatchData::~MatchData() { pcre2_match_data_free(md_); }

void Regex::find_all(std::string_view text, MatchData& md, std::vector<Span>& matches) const {
  matches.clear();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t search_from = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (search_from <= text.size()) {
    int rc = pcre2_match(code_, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code_, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(), nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    SPW_CHECK(rc > 0);  // resource limits are not reachable with tokenizer patterns on bounded input
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t s = ov[0];
    const size_t e = ov[1];
    if (s == e && have_last && last_end == e) {
      if (search_from >= text.size()) break;
      size_t i = search_from;
      utf8_next(text, i);
      search_from = i;
      continue;
    }
    matches.push_back({s, e});
    have_last = true;
    last_end = e;
    search_from = e;
  }
}

void split_by_regex(const Regex& re, Regex::MatchData& md, SplitBehavior behavior, bool invert,
                    std::string_view text, std::vector<Span>& matches, std::vector<Span>& out) {
  if (text.empty()) return;
  re.find_all(text, md, matches);
  // Walk the (piece, is_match) sequence covering `text` without materialising it.
  const size_t first_out = out.size();
  bool previous_match = false;
  bool have_piece = false;
  auto emit = [&](size_t b, size_t e, bool is_match) {
    if (invert) is_match = !is_match;
    switch (behavior) {
      case SplitBehavior::isolated:
        out.push_back({b, e});
        break;
      case SplitBehavior::removed:
        if (!is_match) out.push_back({b, e});
        break;
      case SplitBehavior::contiguous:
        if (have_piece && is_match == previous_match) {
          out.back().end = e;
        } else {
          out.push_back({b, e});
        }
        break;
      case SplitBehavior::merged_with_previous:
        if (is_match && !previous_match && have_piece) {
          out.back().end = e;
        } else {
          out.push_back({b, e});
        }
        break;
      case SplitBehavior::merged_with_next:
        // Handled in a second pass below (it runs right to left in tokenizers).
        out.push_back({b, e});
        break;
    }
    previous_match = is_match;
    have_piece = true;
  };
  if (behavior != SplitBehavior::merged_with_next) {
    size_t prev = 0;
    for (const Span& m : matches) {
      if (prev != m.begin) emit(prev, m.begin, false);
      emit(m.begin, m.end, true);
      prev = m.end;
    }
    if (prev != text.size()) emit(prev, text.size(), false);
  } else {
    // Build the sequence, then merge each match into the piece after it, right to left.
    struct Piece {
      Span span;
      bool is_match;
    };
    std::vector<Piece> pieces;
    size_t prev = 0;
    for (const Span& m : matches) {
      if (prev != m.begin) pieces.push_back({{prev, m.begin}, invert});
      pieces.push_back({m, !invert});
      prev = m.end;
    }
    if (prev != text.size()) pieces.push_back({{prev, text.size()}, invert});
    std::vector<Span> merged;
    bool prev_match = false;
    for (size_t k = pieces.size(); k-- > 0;) {
      const Piece& p = pieces[k];
      if (p.is_match && !prev_match && !merged.empty()) {
        merged.back().begin = p.span.begin;
      } else {
        merged.push_back(p.span);
      }
      prev_match = p.is_match;
    }
    for (size_t k = merged.size(); k-- > 0;) out.push_back(merged[k]);
  }
  // Pieces are never empty except for zero-length matches; tokenizers drops empty splits.
  size_t w = first_out;
  for (size_t r = first_out; r < out.size(); ++r) {
    if (out[r].end > out[r].begin) out[w++] = out[r];
  }
  out.resize(w);
}

}  // namespace spw::tok
