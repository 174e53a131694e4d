// ToolCallGrammar: accepts what src/chat's encoder writes for assistant tool calls (both families,
// several schemas, every split point), rejects wrong names, unknown / duplicate / missing required
// parameters, bad JSON and schema violations, and never reaches a state without a way forward.
#include <deque>
#include <optional>
#include <random>
#include <unordered_map>

#include <gtest/gtest.h>

#include "chat/dsml.h"
#include "chat/stream_parser.h"
#include "chat/tool_call_grammar.h"

namespace spw {
namespace {

using ojson = nlohmann::ordered_json;

std::vector<ToolSpec> weather_tools() {
  return {
      make_tool("get_weather", "Current weather",
                ojson::parse(R"({"type": "object", "properties": {
                  "city": {"type": "string"},
                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                  "days": {"type": "integer"},
                  "detail": {"type": "boolean"}},
                  "required": ["city"]})")),
      make_tool("get_time", "Local time", ojson::parse(R"({"type": "object", "properties": {}})")),
      make_tool("search", "Search",
                ojson::parse(R"({"type": "object", "properties": {
                  "query": {"type": "string", "maxLength": 12},
                  "filters": {"type": "object"},
                  "limit": {"type": "number"},
                  "tags": {"type": "array"},
                  "extra": {}},
                  "required": ["query", "filters"]})")),
  };
}

ToolCallGrammar make_grammar(const std::vector<ToolSpec>& tools, ChatFamily family = ChatFamily::v41,
                             bool thinking = false, bool parallel = true) {
  auto g = ToolCallGrammar::build(tools, {family, thinking, parallel});
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message);
  return std::move(g.value());
}

// What the encoder writes for an assistant turn that makes `calls` (without the end of sentence).
std::string encoded_calls(const std::vector<ToolSpec>& tools, const std::vector<ToolCall>& calls, ChatFamily family) {
  ChatRequest req;
  req.options.family = family;
  req.tools = tools;
  ChatMessage user;
  user.role = ChatRole::user;
  user.content = "hi";
  ChatMessage assistant;
  assistant.role = ChatRole::assistant;
  assistant.tool_calls = calls;
  req.messages = {user, assistant};
  auto prompt = encode_chat(req);
  EXPECT_TRUE(prompt.ok()) << (prompt.ok() ? "" : prompt.error().message);
  const std::string head = std::string(chat_tokens::assistant) + std::string(chat_tokens::think_close);
  const size_t from = prompt->rfind(head) + head.size();
  const size_t to = prompt->rfind(chat_tokens::eos);
  return prompt->substr(from, to - from);
}

bool accepts(const ToolCallGrammar& g, std::string_view text) {
  auto s = g.start();
  return g.feed(s, text) && g.accepting(s);
}

// Length of the longest prefix the automaton takes (text.size() when it takes all of it).
size_t live_prefix(const ToolCallGrammar& g, std::string_view text) {
  auto s = g.start();
  for (size_t i = 0; i < text.size(); ++i)
    if (!g.step(s, static_cast<unsigned char>(text[i]))) return i;
  return text.size();
}

const std::vector<std::vector<ToolCall>> kCallSets = {
    {{"c0", "get_weather", R"({"city": "Paris"})"}},
    {{"c0", "get_weather", R"({"city": "Saint-Étienne <north>", "unit": "celsius", "days": 3, "detail": false})"}},
    {{"c0", "get_time", "{}"}},
    {{"c0", "search", R"({"query": "a\nb \"c\"", "filters": {"k": [1, 2.5, -3e-4, true, null, "x\\y"], "o": {}}, "limit": 10.5})"},
     {"c1", "get_time", "{}"},
     {"c2", "get_weather", R"({"city": "Oslo", "days": -12})"}},
    {{"c0", "search", R"({"filters": {}, "query": "", "tags": [], "extra": "free text"})"}},
    {{"c0", "search", R"({"filters": {"a": {"b": {"c": [[[]]]}}}, "query": "q", "extra": {"json": 1}})"}},
};

TEST(ToolCallGrammar, AcceptsEncoderOutputAtEverySplit) {
  const auto tools = weather_tools();
  for (ChatFamily family : {ChatFamily::v41, ChatFamily::v4}) {
    const ToolCallGrammar g = make_grammar(tools, family);
    for (const auto& calls : kCallSets) {
      const std::string text = encoded_calls(tools, calls, family);
      ASSERT_TRUE(accepts(g, text)) << text << "\nrejected at byte " << live_prefix(g, text);
      // Any split: the state after a prefix, copied, takes the rest; no proper prefix accepts.
      for (size_t split = 0; split < text.size(); ++split) {
        auto s = g.start();
        ASSERT_TRUE(g.feed(s, std::string_view(text).substr(0, split)));
        EXPECT_FALSE(g.accepting(s)) << split;
        auto copy = s;
        ASSERT_TRUE(g.feed(copy, std::string_view(text).substr(split))) << split;
        EXPECT_TRUE(g.accepting(copy));
      }
      // The parser reads back the same calls.
      const ParsedCompletion parsed = parse_completion(text, {});
      ASSERT_EQ(parsed.tool_calls.size(), calls.size());
      for (size_t i = 0; i < calls.size(); ++i) {
        EXPECT_EQ(parsed.tool_calls[i].name, calls[i].name);
        EXPECT_EQ(ojson::parse(parsed.tool_calls[i].arguments), ojson::parse(calls[i].arguments));
      }
    }
  }
}

TEST(ToolCallGrammar, SpellingFollowsTheFamily) {
  const auto tools = weather_tools();
  const std::vector<ToolCall> calls = {{"c0", "get_time", "{}"}};
  EXPECT_FALSE(accepts(make_grammar(tools, ChatFamily::v4), encoded_calls(tools, calls, ChatFamily::v41)));
  EXPECT_FALSE(accepts(make_grammar(tools, ChatFamily::v41), encoded_calls(tools, calls, ChatFamily::v4)));
}

TEST(ToolCallGrammar, ThinkingComesFirst) {
  const auto tools = weather_tools();
  const ToolCallGrammar g = make_grammar(tools, ChatFamily::v41, /*thinking=*/true);
  const std::string calls = encoded_calls(tools, {{"c0", "get_time", "{}"}}, ChatFamily::v41);
  EXPECT_TRUE(accepts(g, "I should call <｜DSML｜ calls> </thin the tool.</think>" + calls));
  EXPECT_TRUE(accepts(g, "</think>" + calls));
  EXPECT_FALSE(accepts(g, calls));  // the block alone is still reasoning
  auto s = g.start();
  EXPECT_TRUE(g.feed(s, "reasoning without end"));
  EXPECT_FALSE(g.accepting(s));
}

// Replaces the first occurrence of `from` in the encoder's text.
std::string mutate(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(ToolCallGrammar, RejectsWhatTheSchemaForbids) {
  const auto tools = weather_tools();
  const ToolCallGrammar g = make_grammar(tools);
  const std::string weather =
      encoded_calls(tools, {{"c0", "get_weather", R"({"city": "Paris", "days": 3})"}}, ChatFamily::v41);
  const std::string search = encoded_calls(
      tools, {{"c0", "search", R"({"query": "q", "filters": {"a": [1, true]}, "limit": 2.5})"}}, ChatFamily::v41);
  ASSERT_TRUE(accepts(g, weather));
  ASSERT_TRUE(accepts(g, search));
  const std::vector<std::string> bad = {
      mutate(weather, "get_weather", "get_weathe"),                    // unknown tool
      mutate(weather, "get_weather", "get_weather2"),                  // unknown tool (longer)
      mutate(weather, "\"city\"", "\"town\""),                         // unknown parameter
      mutate(weather, "name=\"city\" string=\"true\">Paris", "name=\"days\" string=\"false\">4"),  // city missing
      mutate(weather, "name=\"days\" string=\"false\"", "name=\"days\" string=\"true\""),  // integer as text
      mutate(weather, "name=\"city\" string=\"true\"", "name=\"city\" string=\"false\""),  // string as JSON
      mutate(weather, ">3<", ">3.5<"),                                 // not an integer
      mutate(weather, ">3<", ">03<"),                                  // leading zero
      mutate(weather, ">3<", "> 3<"),                                  // space before the JSON value
      mutate(weather, ">3<", ">3 <"),                                  // text after the JSON value
      mutate(weather, ">3<", ">\"3\"<"),                               // a JSON string is not an integer
      mutate(weather, ">3<", ">33333333333333333333333<"),             // integer longer than 20 characters
      mutate(weather, "string=\"false\">3</｜DSML｜ parameter>",
             "string=\"false\">3</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"days\" string=\"false\">4</｜DSML｜ "
             "parameter>"),                                            // duplicate parameter
      mutate(weather, "Paris</｜DSML｜ parameter>", "Paris</｜DSML｜ parameterX"),  // broken close tag
      mutate(weather, "</｜DSML｜ calls>", "</｜DSML｜ calls> and more"),  // text after the block
      mutate(weather, "\n\n<｜DSML｜ calls>", "Sure!\n\n<｜DSML｜ calls>"),  // content before the block
      mutate(weather, "\n\n<｜DSML｜ calls>", "\n\n\n<｜DSML｜ calls>"),  // whitespace run over 2
      mutate(weather, "\n\n<｜DSML｜ calls>", "\n<｜DSML｜ calls>"),   // the parser would keep "\n" as content
      mutate(weather, "\n\n<｜DSML｜ calls>", " <｜DSML｜ calls>"),
      mutate(weather, "</｜DSML｜ invoke>\n</｜DSML｜ calls>", "</｜DSML｜ calls>"),  // invoke not closed
      mutate(search, "{\"a\": [1, true]}", "{\"a\": [1, true}"),       // bad nesting
      mutate(search, "{\"a\": [1, true]}", "{\"a\": [1, tru]}"),       // bad literal
      mutate(search, "{\"a\": [1, true]}", "{\"a\": [1,, true]}"),     // bad separator
      mutate(search, "{\"a\": [1, true]}", "{a: [1, true]}"),          // unquoted key
      mutate(search, "{\"a\": [1, true]}", "{\"a\": [1, true],}"),     // trailing comma
      mutate(search, "{\"a\": [1, true]}", "{\"a\": \"\\x\"}"),        // bad escape
      mutate(search, "{\"a\": [1, true]}", "{\"a\": \"tab\there\"}"),  // raw control character
      mutate(search, "{\"a\": [1, true]}", "[1]"),                     // object expected
      mutate(search, ">2.5<", ">2.<"),                                 // digit owed after '.'
      mutate(search, ">2.5<", ">1e<"),                                 // digit owed after 'e'
      mutate(search, ">q<", ">thirteen chars<"),                       // maxLength 12
      mutate(search, ">q<", ">\xff<"),                                 // invalid UTF-8
      mutate(search, ">q<", ">\xed\xa0\x80<"),                         // a UTF-8 surrogate
      mutate(search, ">q<", ">\xe0\x80\xaf<"),                         // an overlong UTF-8 form
      mutate(search, "{\"a\": [1, true]}", "{\"a\": 1e999}"),           // exponent past two digits
      "\n\n<｜DSML｜ calls>\n</｜DSML｜ calls>",                      // a block without calls
      "",                                                              // nothing at all
  };
  for (const std::string& text : bad) EXPECT_FALSE(accepts(g, text)) << text;
  // A named tool_choice narrows the tools before the grammar is built.
  const ToolCallGrammar only_time = make_grammar({tools[1]});
  EXPECT_FALSE(accepts(only_time, weather));
  EXPECT_TRUE(accepts(only_time, encoded_calls(tools, {{"c0", "get_time", "{}"}}, ChatFamily::v41)));
}

TEST(ToolCallGrammar, EnumsAndParallelCalls) {
  const auto tools = weather_tools();
  const ToolCallGrammar g = make_grammar(tools);
  const std::string celsius =
      encoded_calls(tools, {{"c0", "get_weather", R"({"city": "Paris", "unit": "celsius"})"}}, ChatFamily::v41);
  EXPECT_TRUE(accepts(g, celsius));
  EXPECT_FALSE(accepts(g, mutate(celsius, ">celsius<", ">kelvin<")));
  EXPECT_FALSE(accepts(g, mutate(celsius, ">celsius<", ">celsiu<")));
  EXPECT_FALSE(accepts(g, mutate(celsius, ">celsius<", ">celsiuss<")));
  const std::string two = encoded_calls(tools, {{"c0", "get_time", "{}"}, {"c1", "get_time", "{}"}}, ChatFamily::v41);
  EXPECT_TRUE(accepts(g, two));
  EXPECT_FALSE(accepts(make_grammar(tools, ChatFamily::v41, false, /*parallel=*/false), two));
}

// tool_choice "none": the parser leaves DSML as content, so a model that writes a block anyway
// still returns no tool calls.
TEST(ToolCallGrammar, ParserWithoutToolCallsKeepsMarkupAsContent) {
  const auto tools = weather_tools();
  const std::string text = "Sure." + encoded_calls(tools, {{"c0", "get_time", "{}"}}, ChatFamily::v41);
  const ParsedCompletion with = parse_completion(text + std::string(chat_tokens::eos), {});
  EXPECT_EQ(with.tool_calls.size(), 1u);
  EXPECT_EQ(with.content, "Sure.");
  const ParsedCompletion without = parse_completion(text + std::string(chat_tokens::eos), {.tool_calls = false});
  EXPECT_TRUE(without.tool_calls.empty());
  EXPECT_EQ(without.content, text);
}

TEST(ToolCallGrammar, BuildErrors) {
  EXPECT_FALSE(ToolCallGrammar::build({}, {}).ok());
  // A required parameter that is not a property cannot be written: the tool cannot be called.
  auto r = ToolCallGrammar::build(
      {make_tool("f", "", ojson::parse(R"({"type": "object", "properties": {}, "required": ["x"]})"))}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("\"f\""), std::string::npos) << r.error().message;
  EXPECT_FALSE(ToolCallGrammar::build({make_tool("a\"b", "", ojson::object())}, {}).ok());
  // ... but other tools still can.
  auto ok = ToolCallGrammar::build(
      {make_tool("a\"b", "", ojson::object()), make_tool("g", "", ojson::parse(R"({"properties": {"q\"": {}}})"))}, {});
  ASSERT_TRUE(ok.ok());
  auto s = ok->start();
  EXPECT_FALSE(ok->feed(s, "<｜DSML｜ calls><｜DSML｜ invoke name=\"a"));
}

// Shortest continuation from `s` to acceptance over a small alphabet (the markup's bytes, names,
// JSON punctuation and one digit; no nested '{' or '['): breadth-first over states.
std::optional<std::string> complete(const ToolCallGrammar& g, const ToolCallGrammar::State& from,
                                    const std::string& alphabet) {
  using State = ToolCallGrammar::State;
  std::unordered_map<State, std::pair<State, char>, ToolCallGrammar::StateHash> parent;
  std::deque<State> queue{from};
  parent.emplace(from, std::make_pair(from, '\0'));
  while (!queue.empty() && parent.size() < 2000000) {
    const State s = queue.front();
    queue.pop_front();
    if (g.accepting(s)) {
      std::string path;
      for (State at = s; !(at == from); at = parent.at(at).first) path.insert(path.begin(), parent.at(at).second);
      return path;
    }
    for (char c : alphabet) {
      if ((c == '{' || c == '[') && s.json.depth > 0) continue;  // no nesting: the frontier stays small
      State t = s;
      if (g.step(t, static_cast<unsigned char>(c)) && parent.emplace(t, std::make_pair(s, c)).second) queue.push_back(t);
    }
  }
  return std::nullopt;
}

// Random walks over allowed bytes, then the shortest way out: every reachable state can still
// reach acceptance, and the completed block parses into calls with JSON-object arguments that
// hold the required keys.
TEST(ToolCallGrammar, RandomWalksCanAlwaysFinish) {
  const auto tools = weather_tools();
  std::string alphabet = "0\":,{}[]<>/=\n _celsiusfahrenheit";
  for (const char* lit : {"｜DSML｜ calls invoke parameter name string true false null", "get_weather get_time search",
                          "city unit days detail query filters limit tags extra", "</think>"})
    for (const char* p = lit; *p; ++p)
      if (alphabet.find(*p) == std::string::npos) alphabet.push_back(*p);
  for (bool thinking : {false, true}) {
    const ToolCallGrammar g = make_grammar(tools, ChatFamily::v41, thinking);
    for (uint64_t seed = 0; seed < 150; ++seed) {
      std::mt19937_64 rng(seed);
      auto s = g.start();
      std::string text;
      const int n_steps = int(rng() % 300);
      for (int step = 0; step < n_steps && !g.accepting(s); ++step) {
        std::vector<unsigned char> allowed;
        for (int c = 0; c < 256; ++c) {
          auto t = s;
          if (g.step(t, static_cast<unsigned char>(c))) allowed.push_back(static_cast<unsigned char>(c));
        }
        ASSERT_FALSE(allowed.empty()) << "dead end after: " << text;
        // Every other step in markup-rich choices, so that walks get deep into the block.
        unsigned char c = allowed[rng() % allowed.size()];
        if (allowed.size() > 64 && rng() % 2 == 0 && std::find(allowed.begin(), allowed.end(), '<') != allowed.end())
          c = '<';
        ASSERT_TRUE(g.step(s, c));
        text.push_back(static_cast<char>(c));
      }
      const auto rest = complete(g, s, alphabet);
      ASSERT_TRUE(rest.has_value()) << "no way to finish after: " << ::testing::PrintToString(text);
      text += *rest;
      auto check = g.start();
      ASSERT_TRUE(g.feed(check, text) && g.accepting(check)) << text;
      const ParsedCompletion parsed = parse_completion(text, {.thinking = thinking});
      ASSERT_FALSE(parsed.tool_calls.empty()) << text;
      EXPECT_TRUE(parsed.content.empty()) << text;
      for (const ToolCall& call : parsed.tool_calls) {
        const ojson args = ojson::parse(call.arguments, nullptr, false);
        ASSERT_TRUE(args.is_object()) << call.arguments;
        if (call.name == "get_weather") {
          EXPECT_TRUE(args.contains("city")) << call.arguments;
        }
        if (call.name == "search") {
          EXPECT_TRUE(args.contains("query") && args.contains("filters")) << call.arguments;
        }
      }
    }
  }
}

}  // namespace
}  // namespace spw
