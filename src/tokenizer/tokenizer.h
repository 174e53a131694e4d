// Hugging Face tokenizer.json byte-level BPE tokenizer (DeepSeek-V4 / V4.1, GPT-2 style models).
//
// Contract: encode() gives the ids tokenizers' `Tokenizer.encode(text, add_special_tokens=False)`
// gives; decode() gives tokenizers' `decode(ids, skip_special_tokens)`. tokenizers takes Python
// str, so bytes that are not valid UTF-8 are first replaced by U+FFFD, one per maximal ill-formed
// subpart (exactly Python's bytes.decode("utf-8", "replace")). Supported tokenizer.json features:
// model BPE (merges as "a b" strings or ["a", "b"] pairs, ignore_merges, unk_token/fuse_unk);
// normalizer null, Sequence, NFC/NFD/NFKC/NFKD; pre_tokenizer Split (Regex or String; Isolated,
// Removed, MergedWithPrevious, MergedWithNext, Contiguous; invert) in a Sequence ending with one
// ByteLevel (add_prefix_space, use_regex); decoder ByteLevel; added tokens with their flags.
// post_processor is ignored (it only adds special tokens, which add_special_tokens=False skips);
// anything else is refused at load with an error naming the file and the feature.
//
// Thread safety: a loaded Tokenizer is immutable apart from an internal, locked BPE cache; encode
// and decode may run concurrently. Verified by tests/python/tokenizer/test_tokenizer_parity.py
// (ids vs tokenizers on ~10 MB) and tests/unit/test_tokenizer.cpp; speed by bench/tokenizer_bench.py.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/text_span.h"

namespace spw {

class Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& tokenizer_json_path);
  // Same as load() on the JSON text; `origin` names it in errors.
  static Result<std::unique_ptr<Tokenizer>> load_from_string(std::string_view json_text, const std::string& origin);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // parse_special=false leaves special added tokens (special=true in tokenizer.json) as plain text,
  // like tokenizers' `encode_special_tokens = True`; non-special added tokens are always split out.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // encode(text, true), except inside `plain` (byte ranges of `text`, sorted, non-overlapping):
  // there no added token is split out, special or not, so their text goes through the normalizer,
  // pre-tokenizer and BPE like any other text. The chat encoder marks client-supplied content plain
  // so that text such as "<｜Assistant｜>" in a message cannot forge a turn. Plain text is
  // pre-tokenized together with its neighbours, so when the spans hold no added-token text (and
  // the tokenizer has no normalizer) the ids are exactly those of encode(text, true).
  std::vector<int32_t> encode_with_plain_spans(std::string_view text, std::span<const TextSpan> plain) const;
  // Ids outside [0, vocab_size()) or without a token are skipped, as tokenizers does.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Raw vocab string (byte-level form for model tokens, content for added tokens); "" if none.
  std::string id_to_token(int32_t id) const;
  // One past the largest id (model vocab plus added tokens): 129,280 for DeepSeek-V4.
  size_t vocab_size() const;
  bool is_special(int32_t id) const;

  // Bytes a single id decodes to before UTF-8 repair (byte-level decoding of its token).
  std::string_view token_bytes(int32_t id) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenizer: push() returns the text completed by each id, holding back a trailing
// UTF-8 sequence that later bytes could still complete, so it never emits a partial character.
// The concatenation of every push() and flush() equals Tokenizer::decode of all ids.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  std::string push(int32_t id);
  // Returns what is held back (as U+FFFD replacements) and resets.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

// DeepSeek Engram compressed-token map (spec §5.4 item 1): map[id] = class of id, classes numbered
// by first appearance in id order; *n_classes receives their count (99,092 for DeepSeek-V4).
// Normalization follows the reference's tokenizers normalizer chain: NFKC, NFD, strip marks
// (General_Category M: Mn, Mc and Me), per-character lowercase, [ \t\r\n]+ -> " ", a lone " " kept,
// strip White_Space. Verified against tokenizers and a unicodedata reference in the pytest suite.
std::vector<int32_t> engram_compressed_token_map(const Tokenizer& tokenizer, int64_t* n_classes);

}  // namespace spw
