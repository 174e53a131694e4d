// tokenizer.json -> Tokenizer::Impl. Every feature we cannot reproduce exactly is refused here with
// an error naming the file and the feature, rather than encoding differently from tokenizers.
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace spw {

namespace {

using nlohmann::json;

// GPT-2's pre-tokenizer regex, as tokenizers' ByteLevel uses it (Oniguruma syntax).
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string type_of(const json& j) { return j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : ""; }

bool flag(const json& j, const char* key, bool fallback) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
}

// Byte-level token string -> raw bytes; false if it uses a code point outside the alphabet.
bool to_raw_bytes(std::string_view token, std::string& out) {
  out.clear();
  size_t i = 0;
  while (i < token.size()) {
    const int b = tok::byte_level_byte(tok::utf8_next(token, i));
    if (b < 0) return false;
    out.push_back(static_cast<char>(b));
  }
  return true;
}

Status parse_normalizer(const json& j, const std::string& origin, std::vector<tok::NormalForm>& out) {
  if (j.is_null()) return {};
  const std::string type = type_of(j);
  if (type == "Sequence") {
    for (const json& n : j.at("normalizers")) SPW_TRY(parse_normalizer(n, origin, out));
    return {};
  }
  if (type == "NFC") out.push_back(tok::NormalForm::nfc);
  else if (type == "NFD") out.push_back(tok::NormalForm::nfd);
  else if (type == "NFKC") out.push_back(tok::NormalForm::nfkc);
  else if (type == "NFKD") out.push_back(tok::NormalForm::nfkd);
  else return make_error(origin, ": normalizer \"", type, "\" is unsupported (supported: Sequence, NFC, NFD, NFKC, NFKD)");
  return {};
}

Status parse_pre_tokenizer(const json& j, const std::string& origin, Tokenizer::Impl& impl, bool& have_byte_level) {
  if (j.is_null()) return make_error(origin, ": pre_tokenizer null is unsupported (byte-level BPE needs ByteLevel)");
  const std::string type = type_of(j);
  if (type == "Sequence") {
    for (const json& p : j.at("pretokenizers")) SPW_TRY(parse_pre_tokenizer(p, origin, impl, have_byte_level));
    return {};
  }
  if (have_byte_level) {
    return make_error(origin, ": pre_tokenizer \"", type, "\" after ByteLevel is unsupported (ByteLevel must be last)");
  }
  if (type == "Split") {
    const json& pattern = j.at("pattern");
    bool literal = false;
    std::string text;
    if (pattern.contains("Regex")) {
      text = pattern["Regex"].get<std::string>();
    } else if (pattern.contains("String")) {
      text = pattern["String"].get<std::string>();
      literal = true;
    } else {
      return make_error(origin, ": Split pattern ", pattern.dump(), " is unsupported (need Regex or String)");
    }
    auto re = tok::Regex::compile(text, literal);
    if (!re) return make_error(origin, ": Split pre_tokenizer: ", re.error().message);
    Tokenizer::Impl::SplitRule rule;
    rule.regex = std::move(re.value());
    const std::string behavior = j.at("behavior").get<std::string>();
    if (behavior == "Isolated") rule.behavior = tok::SplitBehavior::isolated;
    else if (behavior == "Removed") rule.behavior = tok::SplitBehavior::removed;
    else if (behavior == "MergedWithPrevious") rule.behavior = tok::SplitBehavior::merged_with_previous;
    else if (behavior == "MergedWithNext") rule.behavior = tok::SplitBehavior::merged_with_next;
    else if (behavior == "Contiguous") rule.behavior = tok::SplitBehavior::contiguous;
    else return make_error(origin, ": Split behavior \"", behavior, "\" is unsupported");
    rule.invert = flag(j, "invert", false);
    impl.splits.push_back(std::move(rule));
    return {};
  }
  if (type == "ByteLevel") {
    have_byte_level = true;
    impl.add_prefix_space = flag(j, "add_prefix_space", true);
    if (flag(j, "use_regex", true)) {
      auto re = tok::Regex::compile(kGpt2Regex, false);
      SPW_CHECK(re.ok());
      impl.byte_level_regex = std::move(re.value());
    }
    return {};
  }
  return make_error(origin, ": pre_tokenizer \"", type, "\" is unsupported (supported: Sequence, Split, ByteLevel)");
}

Status parse_model(const json& m, const std::string& origin, Tokenizer::Impl& impl) {
  const std::string type = type_of(m);
  if (!type.empty() && type != "BPE") return make_error(origin, ": model \"", type, "\" is unsupported (only BPE)");
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0) {
    return make_error(origin, ": BPE dropout is unsupported");
  }
  if (flag(m, "byte_fallback", false)) return make_error(origin, ": BPE byte_fallback is unsupported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && !m[key].is_null() && !m[key].get<std::string>().empty()) {
      return make_error(origin, ": BPE ", key, " is unsupported");
    }
  }
  const json& vocab = m.at("vocab");
  std::unordered_map<std::string, int32_t> ids;
  ids.reserve(vocab.size());
  tok::BpeConfig config;
  int32_t max_id = -1;
  std::string raw;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > (1 << 30)) return make_error(origin, ": vocab id ", id, " for \"", it.key(), "\" is out of range");
    ids.emplace(it.key(), static_cast<int32_t>(id));
    max_id = std::max(max_id, static_cast<int32_t>(id));
    if (to_raw_bytes(it.key(), raw)) config.vocab_bytes.emplace_back(raw, static_cast<int32_t>(id));
  }
  impl.tokens.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [token, id] : ids) {
    impl.tokens[id] = token;
    impl.token_ids.emplace(token, id);
  }
  const json& merges = m.at("merges");
  config.merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string a, b;
    const json& e = merges[r];
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return make_error(origin, ": merge ", r, " (\"", s, "\") is not two tokens separated by one space");
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return make_error(origin, ": merge ", r, " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    std::array<int32_t, 3> triple{};
    const std::string* parts[3] = {&a, &b, nullptr};
    const std::string merged = a + b;
    parts[2] = &merged;
    for (int k = 0; k < 3; ++k) {
      auto it = ids.find(*parts[k]);
      if (it == ids.end()) return make_error(origin, ": merge ", r, ": token \"", *parts[k], "\" is not in the vocab");
      triple[k] = it->second;
    }
    config.merges.push_back(triple);
  }
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    auto it = ids.find(m["unk_token"].get<std::string>());
    if (it == ids.end()) return make_error(origin, ": unk_token is not in the vocab");
    config.unk_id = it->second;
  }
  config.fuse_unk = flag(m, "fuse_unk", false);
  config.ignore_merges = flag(m, "ignore_merges", false);
  impl.bpe = std::make_unique<tok::BpeModel>(std::move(config));
  return {};
}

Status parse_added_tokens(const json& list, const std::string& origin, Tokenizer::Impl& impl) {
  std::vector<tok::AddedTokenSpec> raw_specs, normalized_specs;
  std::unordered_map<std::string, bool> seen;
  std::vector<std::string> special_contents;
  for (const json& t : list) {
    tok::AddedTokenSpec spec;
    spec.content = t.at("content").get<std::string>();
    if (spec.content.empty() || seen.count(spec.content)) continue;
    seen[spec.content] = true;
    const int64_t json_id = t.at("id").get<int64_t>();
    if (json_id < 0 || json_id > (1 << 30)) return make_error(origin, ": added token id ", json_id, " is out of range");
    // tokenizers keeps the model's id for a token already in the vocab.
    auto existing = impl.token_ids.find(spec.content);
    spec.id = existing != impl.token_ids.end() ? existing->second : static_cast<int32_t>(json_id);
    spec.special = flag(t, "special", false);
    spec.single_word = flag(t, "single_word", false);
    spec.lstrip = flag(t, "lstrip", false);
    spec.rstrip = flag(t, "rstrip", false);
    impl.token_ids[spec.content] = spec.id;
    if (spec.special) special_contents.push_back(spec.content);
    const bool normalized = flag(t, "normalized", !spec.special);
    // tokenizers matches a normalized token by its normalized text, and id_to_token and decode
    // return that text too; token_to_id still takes the original content.
    if (normalized) {
      for (const tok::NormalForm f : impl.normalizers) spec.content = tok::normalize(spec.content, f);
    }
    if (static_cast<size_t>(spec.id) >= impl.tokens.size()) impl.tokens.resize(spec.id + 1);
    impl.tokens[spec.id] = spec.content;
    (normalized ? normalized_specs : raw_specs).push_back(std::move(spec));
  }
  impl.raw_added.build(std::move(raw_specs));
  impl.normalized_added.build(std::move(normalized_specs));
  impl.special.assign(impl.tokens.size(), 0);
  for (const std::string& c : special_contents) impl.special[impl.token_ids.at(c)] = 1;
  return {};
}

}  // namespace

Result<std::unique_ptr<Tokenizer::Impl>> parse_tokenizer_json(std::string_view json_text, const std::string& origin) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    return make_error(origin, ": not valid JSON: ", e.what());
  }
  auto impl = std::make_unique<Tokenizer::Impl>();
  try {
    for (const char* key : {"truncation", "padding"}) {
      if (j.contains(key) && !j[key].is_null()) return make_error(origin, ": ", key, " is unsupported (must be null)");
    }
    if (!j.contains("model")) return make_error(origin, ": no \"model\"");
    SPW_TRY(parse_normalizer(j.value("normalizer", json()), origin, impl->normalizers));
    bool have_byte_level = false;
    SPW_TRY(parse_pre_tokenizer(j.value("pre_tokenizer", json()), origin, *impl, have_byte_level));
    if (!have_byte_level) return make_error(origin, ": pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)");
    const json decoder = j.value("decoder", json());
    if (type_of(decoder) != "ByteLevel") {
      return make_error(origin, ": decoder ", decoder.is_null() ? std::string("null") : "\"" + type_of(decoder) + "\"",
                        " is unsupported (only ByteLevel)");
    }
    SPW_TRY(parse_model(j["model"], origin, *impl));
    SPW_TRY(parse_added_tokens(j.value("added_tokens", json::array()), origin, *impl));
  } catch (const json::exception& e) {
    return make_error(origin, ": malformed field: ", e.what());
  }
  // Decoded bytes per id: tokenizers' ByteLevel decoder maps each token through the byte alphabet,
  // or keeps its UTF-8 text when a character falls outside it (added tokens such as "<｜User｜>").
  impl->token_bytes.resize(impl->tokens.size());
  for (size_t id = 0; id < impl->tokens.size(); ++id) {
    if (!to_raw_bytes(impl->tokens[id], impl->token_bytes[id])) impl->token_bytes[id] = impl->tokens[id];
  }
  return impl;
}

}  // namespace spw
