// Encode: repair UTF-8 -> split out non-normalized added tokens -> normalize the gaps -> split out
// normalized added tokens -> Split pre-tokenizers (depth first, so no piece list is materialised
// for the whole text) -> ByteLevel (prefix space, GPT-2 regex) -> cached BPE per pre-token.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace spw {

namespace {

// Per-call scratch: PCRE2 match data (not shareable across threads) and one span list per depth.
struct EncodeScratch {
  std::vector<std::unique_ptr<tok::Regex::MatchData>> split_md;
  std::unique_ptr<tok::Regex::MatchData> byte_level_md;
  std::vector<std::vector<tok::Span>> pieces;  // [depth]
  std::vector<tok::Span> matches;
  std::string prefixed;
};

class Encoder {
 public:
  Encoder(const Tokenizer::Impl& impl, std::vector<int32_t>& out) : impl_(impl), out_(out) {
    for (const auto& s : impl.splits) sc_.split_md.push_back(std::make_unique<tok::Regex::MatchData>(*s.regex));
    if (impl.byte_level_regex) sc_.byte_level_md = std::make_unique<tok::Regex::MatchData>(*impl.byte_level_regex);
    sc_.pieces.resize(impl.splits.size() + 1);
  }

  // `plain`: byte ranges of `text`, sorted and non-overlapping, where no added token is matched.
  void encode(std::string_view text, bool parse_special, std::span<const TextSpan> plain) {
    impl_.raw_added.split(
        text, parse_special, plain,
        [&](std::string_view gap) { normalized_segment(gap, parse_special, spans_within(plain, text, gap)); },
        [&](int32_t id) { out_.push_back(id); });
  }

 private:
  // The spans of `plain` (ranges of `whole`) that meet `part` (a view into `whole`), relative to it.
  static std::vector<TextSpan> spans_within(std::span<const TextSpan> plain, std::string_view whole,
                                            std::string_view part) {
    const size_t begin = static_cast<size_t>(part.data() - whole.data());
    const size_t end = begin + part.size();
    std::vector<TextSpan> out;
    for (const TextSpan& s : plain) {
      if (s.end <= begin || s.begin >= end) continue;
      out.push_back({std::max(s.begin, begin) - begin, std::min(s.end, end) - begin});
    }
    return out;
  }

  void normalized_segment(std::string_view text, bool parse_special, const std::vector<TextSpan>& plain) {
    if (impl_.normalizers.empty()) {
      added_split(text, parse_special, plain);
      return;
    }
    auto normalize = [&](std::string_view piece) {
      std::string n(piece);
      for (const tok::NormalForm f : impl_.normalizers) n = tok::normalize(n, f);
      return n;
    };
    if (plain.empty()) {
      added_split(normalize(text), parse_special, plain);
      return;
    }
    // Offsets do not survive normalization, so plain and other runs are normalized one by one.
    std::string normalized;
    std::vector<TextSpan> normalized_plain;
    size_t pos = 0;
    for (const TextSpan& s : plain) {
      normalized += normalize(text.substr(pos, s.begin - pos));
      const size_t begin = normalized.size();
      normalized += normalize(text.substr(s.begin, s.end - s.begin));
      normalized_plain.push_back({begin, normalized.size()});
      pos = s.end;
    }
    normalized += normalize(text.substr(pos));
    added_split(normalized, parse_special, normalized_plain);
  }

  void added_split(std::string_view text, bool parse_special, std::span<const TextSpan> plain) {
    if (impl_.normalized_added.empty()) {
      pre_tokenize(text, 0);
      return;
    }
    impl_.normalized_added.split(
        text, parse_special, plain, [&](std::string_view gap) { pre_tokenize(gap, 0); },
        [&](int32_t id) { out_.push_back(id); });
  }

  void pre_tokenize(std::string_view piece, size_t depth) {
    if (piece.empty()) return;
    if (depth == impl_.splits.size()) {
      byte_level(piece);
      return;
    }
    const auto& rule = impl_.splits[depth];
    std::vector<tok::Span>& parts = sc_.pieces[depth];
    parts.clear();
    tok::split_by_regex(*rule.regex, *sc_.split_md[depth], rule.behavior, rule.invert, piece, sc_.matches, parts);
    // `parts` is reused by deeper calls only at deeper depths, so iterating it here is safe.
    for (size_t k = 0; k < parts.size(); ++k) {
      const tok::Span s = parts[k];
      pre_tokenize(piece.substr(s.begin, s.end - s.begin), depth + 1);
    }
  }

  void byte_level(std::string_view piece) {
    if (impl_.add_prefix_space && piece.front() != ' ') {
      sc_.prefixed.assign(" ");
      sc_.prefixed.append(piece);
      piece = sc_.prefixed;
    }
    if (!impl_.byte_level_regex) {
      impl_.bpe->encode(piece, out_);
      return;
    }
    std::vector<tok::Span>& words = sc_.pieces.back();
    words.clear();
    tok::split_by_regex(*impl_.byte_level_regex, *sc_.byte_level_md, tok::SplitBehavior::isolated, false, piece,
                        sc_.matches, words);
    for (const tok::Span& w : words) impl_.bpe->encode(piece.substr(w.begin, w.end - w.begin), out_);
  }

  const Tokenizer::Impl& impl_;
  std::vector<int32_t>& out_;
  EncodeScratch sc_;
};

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& tokenizer_json_path) {
  std::ifstream in(tokenizer_json_path, std::ios::binary);
  if (!in) return make_error(tokenizer_json_path, ": cannot open tokenizer file");
  std::stringstream buf;
  buf << in.rdbuf();
  return load_from_string(buf.str(), tokenizer_json_path);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::load_from_string(std::string_view json_text, const std::string& origin) {
  auto impl = parse_tokenizer_json(json_text, origin);
  if (!impl) return impl.error();
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl.value())));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  std::string repaired;
  if (!tok::utf8_is_valid(text)) {
    repaired = tok::utf8_repair(text);
    text = repaired;
  }
  Encoder(*impl_, out).encode(text, parse_special, {});
  return out;
}

std::vector<int32_t> Tokenizer::encode_with_plain_spans(std::string_view text, std::span<const TextSpan> plain) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (tok::utf8_is_valid(text)) {
    Encoder(*impl_, out).encode(text, /*parse_special=*/true, plain);
    return out;
  }
  // Repair run by run so that the spans still mark the same text.
  std::string repaired;
  std::vector<TextSpan> repaired_plain;
  size_t pos = 0;
  for (const TextSpan& s : plain) {
    repaired += tok::utf8_repair(text.substr(pos, s.begin - pos));
    const size_t begin = repaired.size();
    repaired += tok::utf8_repair(text.substr(s.begin, s.end - s.begin));
    repaired_plain.push_back({begin, repaired.size()});
    pos = s.end;
  }
  repaired += tok::utf8_repair(text.substr(pos));
  Encoder(*impl_, out).encode(repaired, /*parse_special=*/true, repaired_plain);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (const int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl_->tokens.size()) continue;
    if (skip_special && impl_->special[id]) continue;
    bytes.append(impl_->token_bytes[id]);
  }
  return tok::utf8_is_valid(bytes) ? bytes : tok::utf8_repair(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->token_ids.find(token);
  if (it == impl_->token_ids.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->tokens.size()) return {};
  return impl_->tokens[id];
}

size_t Tokenizer::vocab_size() const { return impl_->tokens.size(); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[id] != 0;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->token_bytes.size()) return {};
  return impl_->token_bytes[id];
}

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string IncrementalDecoder::push(int32_t id) {
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  pending_.append(tokenizer_.token_bytes(id));
  // Emit everything up to a trailing sequence that is a valid but incomplete prefix; ill-formed
  // bytes become U+FFFD now, exactly as a full decode would replace them.
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    bool incomplete = false;
    const size_t n = tok::utf8_sequence_length(pending_, i, &incomplete);
    if (n > 0) {
      out.append(pending_, i, n);
      i += n;
    } else if (incomplete) {
      break;
    } else {
      out.append("\xEF\xBF\xBD");
      i += tok::utf8_invalid_length(pending_, i);
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out = tok::utf8_repair(pending_);
  pending_.clear();
  return out;
}

}  // namespace spw
