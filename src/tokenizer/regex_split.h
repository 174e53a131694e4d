// Pre-tokenizer splitting with PCRE2 (UTF + UCP, JIT): Hugging Face's Split pre-tokenizer and the
// GPT-2 regex of ByteLevel. tokenizers compiles these patterns with Oniguruma (Ruby syntax), so
// `translate_oniguruma` rewrites the few escapes whose meaning differs in PCRE2 before compiling.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;

namespace spw::tok {

// What happens to the matched delimiters (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct Span {
  size_t begin = 0;
  size_t end = 0;
};

// Rewrite escapes whose meaning differs between Oniguruma (as tokenizers uses it) and PCRE2:
// `\s`/`\S` become Unicode White_Space classes (PCRE2's UCP `\s` also matches U+180E), `\h`/`\H`
// hex-digit classes (PCRE2's `\h` is horizontal space), and General_Category `\p{X}`/`\P{X}` get
// the code points tokenizers' newer Unicode data adds or moves (generated/onig_categories.inc).
// Errors name the construct PCRE2 cannot express (nested classes, `&&` intersection).
Result<std::string> translate_oniguruma(std::string_view pattern);

class Regex {
 public:
  // literal: match `pattern` as plain text (Split's {"String": ...} form).
  static Result<std::unique_ptr<Regex>> compile(std::string_view pattern, bool literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Per-thread scratch for matching: one per encode call.
  class MatchData {
   public:
    explicit MatchData(const Regex& re);
    ~MatchData();
    MatchData(const MatchData&) = delete;
    MatchData& operator=(const MatchData&) = delete;
    pcre2_real_match_data_8* get() const { return md_; }

   private:
    pcre2_real_match_data_8* md_;
  };

  // Non-overlapping matches in `text` (valid UTF-8), left to right, as Oniguruma's find_iter
  // reports them: an empty match right after the previous match is skipped.
  void find_all(std::string_view text, MatchData& md, std::vector<Span>& matches) const;

 private:
  explicit Regex(pcre2_real_code_8* code) : code_(code) {}
  pcre2_real_code_8* code_;
};

// Split `text` (offsets are relative to it) the way tokenizers' NormalizedString::split does, and
// append the non-empty pieces to `out`. `matches` is scratch.
void split_by_regex(const Regex& re, Regex::MatchData& md, SplitBehavior behavior, bool invert,
                    std::string_view text, std::vector<Span>& matches, std::vector<Span>& out);

}  // namespace spw::tok
