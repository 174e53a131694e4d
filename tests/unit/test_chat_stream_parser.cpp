// StreamParser: official parse results for golden assistant turns, split invariance (every
// two-way split and single bytes), truncation at every prefix, and malformed DSML; each with whole
// calls and with streamed arguments.
#include <fstream>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "chat/stream_parser.h"

namespace spw {
namespace {

using ojson = nlohmann::ordered_json;

ojson load_goldens(const std::string& family) {
  const std::string path = std::string(SPW_SOURCE_DIR) + "/tests/unit/data/chat_goldens_" + family + ".json";
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ojson::parse(ss.str());
}

struct Outcome {
  ParsedCompletion msg;
  bool operator==(const Outcome& o) const {
    if (msg.reasoning_content != o.msg.reasoning_content || msg.content != o.msg.content) return false;
    if (msg.tool_calls.size() != o.msg.tool_calls.size()) return false;
    for (size_t i = 0; i < msg.tool_calls.size(); ++i) {
      const ToolCall& a = msg.tool_calls[i];
      const ToolCall& b = o.msg.tool_calls[i];
      if (a.id != b.id || a.name != b.name || a.arguments != b.arguments) return false;
    }
    return true;
  }
};

std::ostream& operator<<(std::ostream& os, const Outcome& o) {
  os << "{reasoning: \"" << o.msg.reasoning_content << "\", content: \"" << o.msg.content << "\", calls: [";
  for (const ToolCall& c : o.msg.tool_calls) os << c.id << ":" << c.name << ":" << c.arguments << "; ";
  return os << "]}";
}

Outcome parse_pieces(const std::vector<std::string_view>& pieces, bool thinking, bool stream_arguments = false) {
  StreamParserOptions options{thinking, "call_"};
  options.stream_arguments = stream_arguments;
  StreamParser p(options);
  Outcome o;
  for (std::string_view s : pieces) append_delta(o.msg, p.push(s));
  append_delta(o.msg, p.finish());
  return o;
}

Outcome parse_whole(std::string_view text, bool thinking, bool stream_arguments = false) {
  return parse_pieces({text}, thinking, stream_arguments);
}

void expect_split_invariant(std::string_view text, bool thinking, bool stream_arguments = false) {
  const Outcome whole = parse_whole(text, thinking, stream_arguments);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ASSERT_EQ(parse_pieces({text.substr(0, cut), text.substr(cut)}, thinking, stream_arguments), whole)
        << "cut at " << cut;
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  ASSERT_EQ(parse_pieces(bytes, thinking, stream_arguments), whole) << "single bytes";
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::string_view> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::min<size_t>(text.size() - i, 1 + rng() % 7);
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    ASSERT_EQ(parse_pieces(pieces, thinking, stream_arguments), whole) << "random split " << trial;
  }
}

void check_family(const std::string& family) {
  const ojson doc = load_goldens(family);
  ASSERT_GE(doc["completions"].size(), 15u);
  size_t n_calls = 0;
  for (const ojson& c : doc["completions"]) {
    SCOPED_TRACE(family + "/" + c["name"].get<std::string>());
    const std::string text = c["text"].get<std::string>();
    const bool thinking = c["thinking"].get<bool>();
    const Outcome got = parse_whole(text, thinking);
    const ojson& want = c["expected"];
    EXPECT_EQ(got.msg.reasoning_content, want["reasoning_content"].get<std::string>());
    EXPECT_EQ(got.msg.content, want["content"].get<std::string>());
    ASSERT_EQ(got.msg.tool_calls.size(), want["tool_calls"].size());
    for (size_t i = 0; i < got.msg.tool_calls.size(); ++i) {
      EXPECT_EQ(got.msg.tool_calls[i].id, "call_" + std::to_string(i));
      EXPECT_EQ(got.msg.tool_calls[i].name, want["tool_calls"][i]["name"].get<std::string>());
      EXPECT_EQ(got.msg.tool_calls[i].arguments, want["tool_calls"][i]["arguments"].get<std::string>());
    }
    n_calls += got.msg.tool_calls.size();
    expect_split_invariant(text, thinking);
    // Well-formed DSML: streamed arguments add up to the same calls.
    EXPECT_EQ(parse_whole(text, thinking, /*stream_arguments=*/true), got);
    expect_split_invariant(text, thinking, /*stream_arguments=*/true);
  }
  EXPECT_GT(n_calls, 5u);
}

TEST(ChatStreamParser, V4GoldenCompletions) { check_family("v4"); }
TEST(ChatStreamParser, V41GoldenCompletions) { check_family("v41"); }

// A stream cut anywhere before the first invoke closes yields all of its text back (markers
// aside): reasoning + "</think>" + content reproduces the prefix.
TEST(ChatStreamParser, TruncationLosesNoText) {
  for (const char* family : {"v4", "v41"}) {
    const ojson doc = load_goldens(family);
    for (const ojson& c : doc["completions"]) {
      const std::string text = c["text"].get<std::string>();
      const bool thinking = c["thinking"].get<bool>();
      for (size_t cut = 0; cut <= text.size(); ++cut) {
        const std::string prefix = text.substr(0, cut);
        if (prefix.find("<｜end▁of▁sentence｜>") != std::string::npos) break;
        const Outcome o = parse_whole(prefix, thinking);
        if (!o.msg.tool_calls.empty()) break;
        const bool closed = thinking && prefix.find("</think>") != std::string::npos;
        const std::string rebuilt = o.msg.reasoning_content + (closed ? "</think>" : "") + o.msg.content;
        ASSERT_EQ(rebuilt, prefix) << family << "/" << c["name"].get<std::string>() << " cut " << cut;
      }
    }
  }
}

TEST(ChatStreamParser, HoldsBackOnlyPossibleMarkup) {
  StreamParser p(StreamParserOptions{true, "call_"});
  StreamDelta d = p.push("I think a < b </th");
  EXPECT_EQ(d.reasoning_content, "I think a < b ");
  d = p.push("ink>Answer\n");
  EXPECT_EQ(d.reasoning_content, "");
  EXPECT_EQ(d.content, "Answer");  // "\n" may start "\n\n<｜DSML｜..."
  d = p.push("\nmore <｜DS");
  EXPECT_EQ(d.content, "\n\nmore ");  // the held "\n" and the new text
  d = p.push("x");
  EXPECT_EQ(d.content, "<｜DSx");
  d = p.finish();
  EXPECT_TRUE(d.empty());
}

TEST(ChatStreamParser, ToolCallsEmittedWholeAtInvokeClose) {
  StreamParser p(StreamParserOptions{false, "req7-"});
  StreamDelta d = p.push("Checking.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get\">\n");
  EXPECT_EQ(d.content, "Checking.");
  EXPECT_TRUE(d.tool_calls.empty());
  d = p.push("<｜DSML｜ parameter name=\"q\" string=\"true\">a \"b\"\n</｜DSML｜ parameter>\n"
             "<｜DSML｜ parameter name=\"n\" string=\"false\">[1, 2]</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].index, 0);
  EXPECT_EQ(d.tool_calls[0].id, "req7-0");
  EXPECT_EQ(d.tool_calls[0].name, "get");
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"q\": \"a \\\"b\\\"\\n\", \"n\": [1, 2]}");
  d = p.push("<｜DSML｜ invoke name=\"none\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].index, 1);
  EXPECT_EQ(d.tool_calls[0].arguments, "{}");
  EXPECT_TRUE(p.finish().empty());
}

struct MalformedCase {
  const char* name;
  std::string text;
  std::string content;  // expected content
  size_t n_calls;
};

TEST(ChatStreamParser, MalformedDsmlBecomesContent) {
  const std::string open4 = "\n\n<｜DSML｜tool_calls>\n";
  const std::string call4 = "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n</｜DSML｜invoke>\n";
  const std::string close4 = "</｜DSML｜tool_calls>";
  const std::vector<MalformedCase> cases = {
      {"text_instead_of_invoke", "A" + open4 + "hello", "A" + open4 + "hello", 0},
      {"unterminated_block", "A" + open4 + "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"tr",
       "A" + open4 + "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"tr", 0},
      {"bad_string_flag", open4 + "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"maybe\">x</｜DSML｜parameter>",
       open4 + "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"maybe\">x</｜DSML｜parameter>", 0},
      {"invoke_without_name", open4 + "<｜DSML｜invoke>\n</｜DSML｜invoke>\n" + close4,
       open4 + "<｜DSML｜invoke>\n</｜DSML｜invoke>\n" + close4, 0},
      {"duplicate_parameter",
       open4 + "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n"
               "<｜DSML｜parameter name=\"a\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n" + close4,
       open4 + "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n"
               "<｜DSML｜parameter name=\"a\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n" + close4,
       0},
      {"eos_inside_block", open4 + "<｜DSML｜invoke name=\"f\"><｜end▁of▁sentence｜>tail",
       open4 + "<｜DSML｜invoke name=\"f\">tail", 0},
      {"good_call_then_garbage", open4 + call4 + "oops", "\noops", 1},
      {"good_call_truncated_close", open4 + call4 + "</｜DSML｜tool_", "\n</｜DSML｜tool_", 1},
      {"text_after_block", open4 + call4 + close4 + "After.", "After.", 1},
      {"empty_block_is_consumed", "A" + open4 + close4 + "B", "AB", 0},
      {"mixed_spelling_is_malformed", open4 + "<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n" + close4,
       open4 + "<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n" + close4, 0},
      {"value_may_contain_invoke_close",
       open4 + "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\"></｜DSML｜invoke></｜DSML｜parameter>\n</｜DSML｜invoke>\n" + close4,
       "", 1},
      {"opener_without_newlines", "A<｜DSML｜tool_calls>\n" + call4 + close4, "A", 1},
      {"parameter_close_without_gt",
       open4 + "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter\n",
       open4 + "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter\n", 0},
  };
  for (const MalformedCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Outcome o = parse_whole(c.text, false);
    EXPECT_EQ(o.msg.content, c.content);
    EXPECT_EQ(o.msg.tool_calls.size(), c.n_calls);
    expect_split_invariant(c.text, false);
    expect_split_invariant(c.text, true);
  }
}

TEST(ChatStreamParser, ReasoningWithoutCloseStaysReasoning) {
  const Outcome o = parse_whole("still thinking </thi", true);
  EXPECT_EQ(o.msg.reasoning_content, "still thinking </thi");
  EXPECT_EQ(o.msg.content, "");
  const Outcome chat = parse_whole("</think>x", false);
  EXPECT_EQ(chat.msg.content, "</think>x");
}

TEST(ChatStreamParser, StreamedArgumentsArriveAsGenerated) {
  StreamParserOptions options{false, "req7-"};
  options.stream_arguments = true;
  StreamParser p(options);
  StreamDelta d = p.push("Checking.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get\">\n");
  EXPECT_EQ(d.content, "Checking.");
  ASSERT_EQ(d.tool_calls.size(), 1u);  // the header: index, id, name
  EXPECT_EQ(d.tool_calls[0].index, 0);
  EXPECT_EQ(d.tool_calls[0].id, "req7-0");
  EXPECT_EQ(d.tool_calls[0].name, "get");
  EXPECT_EQ(d.tool_calls[0].arguments, "");
  d = p.push("<｜DSML｜ parameter name=\"q\" string=\"true\">a \"b");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_TRUE(d.tool_calls[0].is_fragment());
  EXPECT_EQ(d.tool_calls[0].index, 0);
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"q\": \"a \\\"b");
  d = p.push("\"\n</｜DSML｜ par");  // the possible closing tag is held back
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "\\\"\\n");
  d = p.push("ameter>\n<｜DSML｜ parameter name=\"n\" string=\"false\">[1, ");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "\", \"n\": [1, ");
  d = p.push("2]</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "2]}");
  d = p.push("<｜DSML｜ invoke name=\"none\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>");
  ASSERT_EQ(d.tool_calls.size(), 1u);  // header and arguments of a call that fits one push: one delta
  EXPECT_EQ(d.tool_calls[0].index, 1);
  EXPECT_EQ(d.tool_calls[0].id, "req7-1");
  EXPECT_EQ(d.tool_calls[0].arguments, "{}");
  EXPECT_TRUE(p.finish().empty());
}

TEST(ChatStreamParser, StreamedArgumentsHoldBackIncompleteUtf8) {
  StreamParserOptions options{false, "call_"};
  options.stream_arguments = true;
  StreamParser p(options);
  StreamDelta d = p.push("<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"city\" string=\"true\">");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"city\": \"");
  d = p.push("Orl\xC3");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "Orl");
  d = p.push("\xA9" "ans");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "\xC3\xA9" "ans");
}

// A streamed call cannot be withdrawn: malformed markup after its header closes its arguments and
// only what follows the last emitted byte becomes content.
struct StreamedMalformedCase {
  const char* name;
  std::string text;
  std::string content;
  std::vector<std::string> arguments;  // of each call, in order
};

TEST(ChatStreamParser, MalformedDsmlWithStreamedArguments) {
  const std::string open4 = "\n\n<｜DSML｜tool_calls>\n";
  const std::string invoke_f = "<｜DSML｜invoke name=\"f\">";
  const std::string call4 = invoke_f + "\n<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n</｜DSML｜invoke>\n";
  const std::string close4 = "</｜DSML｜tool_calls>";
  const std::string param_a1 = "<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>";
  const std::string param_a2 = "<｜DSML｜parameter name=\"a\" string=\"true\">2</｜DSML｜parameter>";
  const std::vector<StreamedMalformedCase> cases = {
      {"text_instead_of_invoke", "A" + open4 + "hello", "A" + open4 + "hello", {}},
      {"invoke_without_name", open4 + "<｜DSML｜invoke>\n</｜DSML｜invoke>\n" + close4,
       open4 + "<｜DSML｜invoke>\n</｜DSML｜invoke>\n" + close4, {}},
      {"unterminated_parameter_head", "A" + open4 + invoke_f + "\n<｜DSML｜parameter name=\"a\" string=\"tr",
       "A\n<｜DSML｜parameter name=\"a\" string=\"tr", {"{}"}},
      {"bad_string_flag", open4 + invoke_f + "\n<｜DSML｜parameter name=\"a\" string=\"maybe\">x</｜DSML｜parameter>",
       "\n<｜DSML｜parameter name=\"a\" string=\"maybe\">x</｜DSML｜parameter>", {"{}"}},
      {"duplicate_parameter", open4 + invoke_f + "\n" + param_a1 + "\n" + param_a2 + "\n</｜DSML｜invoke>\n" + close4,
       "\n" + param_a2 + "\n</｜DSML｜invoke>\n" + close4, {"{\"a\": \"1\"}"}},
      {"eos_inside_block", open4 + invoke_f + "<｜end▁of▁sentence｜>tail", "tail", {"{}"}},
      {"truncated_string_value", open4 + invoke_f + "\n<｜DSML｜parameter name=\"a\" string=\"true\">ab\"c",
       "", {"{\"a\": \"ab\\\"c\"}"}},
      {"truncated_raw_value", open4 + invoke_f + "\n<｜DSML｜parameter name=\"n\" string=\"false\">[1, 2",
       "", {"{\"n\": [1, 2}"}},
      {"truncated_in_closing_tag", open4 + invoke_f + "\n<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜para",
       "</｜DSML｜para", {"{\"a\": \"x\"}"}},
      {"parameter_close_without_gt",
       open4 + invoke_f + "\n<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter\n",
       "</｜DSML｜parameter\n", {"{\"a\": \"x\"}"}},
      {"good_call_then_garbage", open4 + call4 + "oops", "\noops", {"{\"a\": \"x\"}"}},
      {"second_call_cut", open4 + call4 + invoke_f + "\n", "\n", {"{\"a\": \"x\"}", "{}"}},
      {"value_may_contain_invoke_close",
       open4 + invoke_f + "\n<｜DSML｜parameter name=\"a\" string=\"true\"></｜DSML｜invoke></｜DSML｜parameter>\n</｜DSML｜invoke>\n" + close4,
       "", {"{\"a\": \"</｜DSML｜invoke>\"}"}},
  };
  for (const StreamedMalformedCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Outcome o = parse_whole(c.text, false, /*stream_arguments=*/true);
    EXPECT_EQ(o.msg.content, c.content);
    ASSERT_EQ(o.msg.tool_calls.size(), c.arguments.size());
    for (size_t i = 0; i < c.arguments.size(); ++i) {
      EXPECT_EQ(o.msg.tool_calls[i].id, "call_" + std::to_string(i));
      EXPECT_EQ(o.msg.tool_calls[i].name, "f");
      EXPECT_EQ(o.msg.tool_calls[i].arguments, c.arguments[i]);
    }
    expect_split_invariant(c.text, false, /*stream_arguments=*/true);
    expect_split_invariant(c.text, true, /*stream_arguments=*/true);
  }
}

// Cut anywhere, streamed calls are closed objects; the calls a whole-call parse of the same prefix
// finds come first, identical; where every value is a string, the arguments are valid JSON.
TEST(ChatStreamParser, StreamedTruncationClosesArguments) {
  size_t n_checked = 0;
  for (const char* family : {"v4", "v41"}) {
    const ojson doc = load_goldens(family);
    for (const ojson& c : doc["completions"]) {
      const std::string text = c["text"].get<std::string>();
      const bool thinking = c["thinking"].get<bool>();
      const bool all_strings = text.find("string=\"false\"") == std::string::npos;
      for (size_t cut = 0; cut <= text.size(); ++cut) {
        const std::string prefix = text.substr(0, cut);
        const Outcome streamed = parse_whole(prefix, thinking, /*stream_arguments=*/true);
        const Outcome whole = parse_whole(prefix, thinking);
        ASSERT_GE(streamed.msg.tool_calls.size(), whole.msg.tool_calls.size()) << "cut " << cut;
        for (size_t i = 0; i < streamed.msg.tool_calls.size(); ++i) {
          const ToolCall& call = streamed.msg.tool_calls[i];
          ASSERT_TRUE(call.arguments.starts_with("{") && call.arguments.ends_with("}")) << call.arguments;
          if (i < whole.msg.tool_calls.size()) {
            ASSERT_EQ(call.arguments, whole.msg.tool_calls[i].arguments) << "cut " << cut;
            ASSERT_EQ(call.name, whole.msg.tool_calls[i].name);
          }
          if (all_strings) {
            ASSERT_TRUE(nlohmann::json::accept(call.arguments)) << call.arguments << " cut " << cut;
            ++n_checked;
          }
        }
      }
    }
  }
  EXPECT_GT(n_checked, 100u);
}

}  // namespace
}  // namespace spw
