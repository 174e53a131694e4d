// The DSML tool-call block as a byte-level automaton, for constrained decoding of
// tool_choice = "required" or a named function (the server masks every token whose text would
// take the automaton to a dead state; src/server/grammar_constraint.h).
//
// Accepted language (family spelling B/I/P as in chat/dsml.h; ws = at most 2 of ' ' '\n' '\t' '\r'):
//   [reasoning "</think>"]                       only with options.thinking; any text before it
//   ["\n\n"] <｜DSML｜B> ws
//   ( <｜DSML｜I name="TOOL"> ws
//       ( <｜DSML｜P name="KEY" string="true|false">VALUE</｜DSML｜P> ws )*
//     </｜DSML｜I> ws )+                          one invoke unless options.parallel
//   </｜DSML｜B>
// then only end-of-sequence (accepting()). This is what src/chat's encoder writes for an assistant
// turn with tool calls and what its StreamParser turns back into tool calls.
//   - TOOL is one of the tools' names; KEY one of that tool's `parameters.properties`, each at most
//     once; the invoke closes only when every `required` key is present.
//   - string="true" values are plain text (valid UTF-8, without "</｜DSML｜P"); string="false"
//     values are one JSON value held to the property's schema by JsonSchemaGrammar (the same
//     automaton as response_format; compiled leniently, so unsupported keywords allow any value)
//     and nothing else, not even whitespace around it.
//   - A property's schema picks the forms: "type": "string" → string="true" only, with `enum`
//     (strings without '<') as the only values and `maxLength` in characters; "integer" / "number" /
//     "boolean" / "null" / "object" / "array" → string="false" only. Other schemas allow both forms.
//   - Names containing '"' cannot be written in DSML: such properties are left out, and a tool with
//     such a name (or with such a required property) cannot be called.
// Every live state can still reach acceptance, so masking never leaves a sequence without a token.
// Tests: tests/unit/test_tool_call_grammar.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "chat/chat_encoding.h"
#include "chat/json_schema_grammar.h"

namespace spw {

struct ToolCallGrammarOptions {
  ChatFamily family = ChatFamily::v41;  // DSML spelling
  bool thinking = false;                // the output starts with reasoning closed by </think>
  bool parallel = true;                 // more than one invoke in the block
};

class ToolCallGrammar {
 public:
  // Plain data, cheap to copy: the mask tries every token from a copy.
  struct State {
    uint8_t phase = 0, ctx = 0, ws = 0, utf8_need = 0;
    bool is_text = false;
    uint16_t cands = 0;  // candidate literals (bit per literal id)
    uint16_t pos = 0;    // position in a literal, a name, or the terminator match
    uint16_t lo = 0, hi = 0;  // range of sorted names still matching
    int16_t tool = -1, param = -1;
    uint32_t len = 0;     // characters of the current text value (maxLength)
    uint64_t used = 0;    // parameters written in the current invoke (bit per sorted index)
    JsonSchemaGrammar::State json;  // the current string="false" value
    bool operator==(const State&) const = default;
  };
  struct StateHash {
    size_t operator()(const State& s) const;
  };

  // `tools` as the request sent them (already narrowed to one tool for a named tool_choice).
  // Fails when no tool can be called or a tool has more than 64 properties.
  static Result<ToolCallGrammar> build(const std::vector<ToolSpec>& tools, const ToolCallGrammarOptions& options);

  State start() const;
  // Consumes one byte; false when it is not allowed (s is then unspecified).
  bool step(State& s, unsigned char c) const;
  bool feed(State& s, std::string_view text) const;
  // The block is complete: only end-of-sequence may follow.
  bool accepting(const State& s) const;

  struct Param {
    std::string name;
    bool allow_text = true, allow_json = true;
    uint16_t json_root = JsonSchemaGrammar::kAny;  // the schema of a JSON value, in json_
    std::vector<std::string> enum_values;  // sorted; non-empty: the only text values
    int64_t max_length = -1;               // text characters; -1 = unbounded
  };
  struct Tool {
    std::string name;
    std::vector<Param> params;  // sorted by name
    uint64_t required = 0;      // bit per params index
  };

 private:
  bool step_lits(State& s, unsigned char c) const;
  bool step_gap(State& s, unsigned char c) const;
  bool step_text(State& s, unsigned char c) const;
  bool step_json(State& s, unsigned char c) const;
  void complete_literal(State& s, int lit) const;
  void json_value_done(State& s) const;
  uint16_t gap_candidates(const State& s) const;
  size_t kmp(const std::string& lit, const std::vector<uint16_t>& fail, size_t pos, unsigned char c) const;

  ToolCallGrammarOptions options_;
  std::vector<Tool> tools_;           // sorted by name
  JsonSchemaGrammar json_;            // every property's JSON value schema
  std::vector<std::string> lits_;     // literal table, indexed by the Lit enum in the .cpp
  std::vector<uint16_t> close_fail_;  // KMP failure table of the parameter close tag
  std::vector<uint16_t> think_fail_;
};

}  // namespace spw
