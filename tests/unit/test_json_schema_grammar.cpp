// JsonSchemaGrammar: accepts JSON that matches the schema and nothing else, compiles the documented
// subset, rejects the rest by name (strict) or widens it to any value (lenient), and never leaves
// a live state without a way to finish.
#include <gtest/gtest.h>

#include <random>

#include "chat/json_schema_grammar.h"

namespace spw {
namespace {

using ojson = nlohmann::ordered_json;

const ojson kCity = ojson::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "enum": ["Paris", "Berlin"]},
    "pop": {"type": "integer"},
    "loc": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
    "mayor": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    "kind": {"$ref": "#/$defs/kind"}
  },
  "required": ["name", "pop"],
  "$defs": {"kind": {"enum": [1, 12, "x"]}}
})");

bool accepts(const JsonSchemaGrammar& g, uint16_t root, const std::string& text) {
  auto s = g.start(root);
  return g.feed(s, text) && g.accepting(s);
}

TEST(JsonSchemaGrammar, AcceptsMatchingJson) {
  JsonSchemaGrammar g;
  const auto root = g.add(kCity, true);
  ASSERT_TRUE(root.ok()) << root.error().message;
  for (const char* ok : {R"({"name":"Paris","pop":3})", R"({"pop": -20, "name": "Berlin"})",
                         R"({"name":"Paris","pop":0,"loc":{"lat":1.5e-3},"tags":["a","b\"\u00e9"],"mayor":null})",
                         R"({"name":"Paris","pop":1,"kind":12})", R"({"name":"Paris","pop":1,"kind":1,"mayor":"x"})"})
    EXPECT_TRUE(accepts(g, root.value(), ok)) << ok;
}

TEST(JsonSchemaGrammar, RejectsWhatTheSchemaForbids) {
  JsonSchemaGrammar g;
  const auto root = g.add(kCity, true).value();
  for (const char* bad : {R"({"name":"Rome","pop":3})",          // not in the enum
                          R"({"name":"Paris"})",                 // required pop missing
                          R"({"name":"Paris","pop":3.5})",       // not an integer
                          R"({"name":"Paris","pop":3,"x":1})",   // unknown key
                          R"({"name":"Paris","name":"Paris","pop":3})",  // repeated key
                          R"({"name":"Paris","pop":3,"loc":{}})",        // nested required
                          R"({"name":"Paris","pop":3,"tags":[]})",       // minItems
                          R"({"name":"Paris","pop":3,"tags":["a","b","c"]})",  // maxItems
                          R"({"name":"Paris","pop":3,"kind":2})", R"({"name":"Paris","pop":3,"mayor":1})",
                          R"( {"name":"Paris","pop":3})", R"([1])", R"({"name":"Paris","pop":3} )"})
    EXPECT_FALSE(accepts(g, root, bad)) << bad;
}

TEST(JsonSchemaGrammar, AnyObjectAndAnyValue) {
  JsonSchemaGrammar g;
  const auto obj = g.any_object();
  EXPECT_TRUE(accepts(g, obj, R"({"a":[1,{"b":null}],"c":"d","e":true})"));
  EXPECT_FALSE(accepts(g, obj, R"([1])"));
  EXPECT_FALSE(accepts(g, obj, R"({"a":01})"));
  EXPECT_TRUE(accepts(g, JsonSchemaGrammar::kAny, "-0.5E+12"));
  EXPECT_FALSE(accepts(g, JsonSchemaGrammar::kAny, "1e123"));  // exponents of at most two digits
}

TEST(JsonSchemaGrammar, StrictRejectsUnsupportedKeywordsByName) {
  JsonSchemaGrammar g;
  const auto pattern = g.add(ojson::parse(R"({"type":"object","properties":{"a":{"type":"string","pattern":"x"}}})"), true);
  ASSERT_FALSE(pattern.ok());
  EXPECT_NE(pattern.error().message.find("'pattern'"), std::string::npos);
  EXPECT_NE(pattern.error().message.find("properties.a"), std::string::npos);
  EXPECT_FALSE(g.add(ojson::parse(R"({"anyOf":[{"type":"integer"},{"type":"number"}]})"), true).ok());
  EXPECT_FALSE(g.add(ojson::parse(R"({"$ref":"#/$defs/a","$defs":{"a":{"type":"array","items":{"$ref":"#/$defs/a"}}}})"), true).ok());
  // Lenient: an unsupported keyword is not enforced, an unsupported schema takes any value.
  const auto lenient = g.add(ojson::parse(R"({"type":"object","properties":{"a":{"type":"string","pattern":"x"},
                                                "b":{"anyOf":[{"type":"integer"},{"type":"number"}]}}})"), false);
  ASSERT_TRUE(lenient.ok());
  EXPECT_TRUE(accepts(g, lenient.value(), R"({"a":"y","b":[true]})"));
  EXPECT_FALSE(accepts(g, lenient.value(), R"({"a":1})"));
}

// Random walks over the bytes the grammar allows, then a check that the walk can always finish:
// from every reached state some byte is allowed, until the value is complete.
TEST(JsonSchemaGrammar, RandomWalksNeverDeadEnd) {
  JsonSchemaGrammar g;
  const auto root = g.add(kCity, true).value();
  for (uint64_t seed = 0; seed < 300; ++seed) {
    std::mt19937_64 rng(seed);
    auto s = g.start(root);
    std::string text;
    for (int step = 0; step < 400; ++step) {
      std::vector<unsigned char> allowed;
      for (int c = 0; c < 256; ++c) {
        auto t = s;
        if (g.step(t, static_cast<unsigned char>(c))) allowed.push_back(static_cast<unsigned char>(c));
      }
      if (allowed.empty()) {
        ASSERT_TRUE(g.accepting(s)) << "dead end after: " << text;
        break;
      }
      // Prefer structure over free text so that walks close their values.
      unsigned char c = allowed[rng() % allowed.size()];
      for (unsigned char p : {'"', '}', ']', ','})
        if (rng() % 3 == 0 && std::find(allowed.begin(), allowed.end(), p) != allowed.end()) c = p;
      ASSERT_TRUE(g.step(s, c));
      text.push_back(static_cast<char>(c));
    }
    if (g.accepting(s)) {
      const ojson v = ojson::parse(text, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << text;
      EXPECT_TRUE(v.contains("name") && v.contains("pop") && v["pop"].is_number()) << text;
    }
  }
}

}  // namespace
}  // namespace spw
