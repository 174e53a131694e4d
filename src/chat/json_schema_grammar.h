// JSON values restricted by a JSON schema, as a byte-level automaton for constrained decoding:
// response_format (json_object / json_schema) masks tokens with it directly
// (src/server/grammar_constraint.h), and the tool-call grammar (tool_call_grammar.h) runs it for
// every string="false" parameter value, so both paths constrain JSON the same way.
//
// Accepted language: one JSON value, compact or with at most 2 whitespace bytes between tokens
// (none before or after the top-level value), nesting ≤ 16, numbers ≤ 32 characters with an
// exponent of at most two digits (integers ≤ 20 characters), so every number fits a double; object
// keys unique where the schema names them (free keys of an open object are not tracked).
// Supported schema subset (docs/server.md lists it for users):
//   type (one name or an array of names), enum, const, properties, required,
//   additionalProperties (false, or absent: only the listed properties are written), items,
//   minItems, maxItems, anyOf / oneOf, $ref into #/$defs or #/definitions (not recursive);
//   annotations (title, description, default, examples, $schema, $id, $comment) are ignored.
//   An object schema without properties takes any keys and values; {} is any value.
//   Alternatives (anyOf, oneOf, a type array) must differ in their first byte: at most one of
//   string / object / array / number-or-integer / true / false / null among them (an enum or const
//   counts as the kinds of its values).
// A strict schema fails to compile on anything else, naming the keyword and where it is; a lenient
// one (tool parameters, whose schemas may use anything) ignores unsupported keywords, leaving
// their restriction unenforced, and reads a schema it cannot compile as any value.
// Every live state can still reach acceptance. Tests: tests/unit/test_json_schema_grammar.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace spw {

class JsonSchemaGrammar {
 public:
  static constexpr int kMaxDepth = 16;

  struct Frame {  // one open object or array
    uint16_t node = 0;
    uint8_t phase = 0;
    uint8_t pending = 0;  // object: the property whose value comes next
    uint16_t count = 0;   // array: items so far
    uint64_t used = 0;    // object: properties written (bit per sorted index)
    bool operator==(const Frame&) const = default;
  };
  // Plain data, cheap to copy and hash: the mask tries every token from a copy.
  struct State {
    uint16_t root = 0;
    uint8_t depth = 0;
    uint8_t scalar = 0;  // what the bytes now belong to (the .cpp's Scalar)
    uint8_t sub = 0;     // string escape / number part
    uint8_t utf8_need = 0;
    uint8_t ws = 0;
    bool started = false, key = false;
    uint16_t node = 0;        // enum being matched
    uint16_t lo = 0, hi = 0;  // enum values or property names still matching
    uint16_t pos = 0;         // bytes matched of them
    uint16_t len = 0;         // number characters
    std::array<Frame, kMaxDepth> frames{};
    bool operator==(const State& o) const;
  };
  struct StateHash {
    size_t operator()(const State& s) const;
  };

  // Adds a schema's nodes; returns its root for start(). Strict: an unsupported schema is an error.
  Result<uint16_t> add(const nlohmann::ordered_json& schema, bool strict);
  // The root of "any JSON object" (response_format json_object).
  uint16_t any_object();
  // The root of any JSON value.
  static constexpr uint16_t kAny = 0;

  JsonSchemaGrammar();
  State start(uint16_t root) const;
  // Consumes one byte; false when it is not allowed (s is then unspecified).
  bool step(State& s, unsigned char c) const;
  bool feed(State& s, std::string_view text) const;
  // A complete value (a number or an enum value may still go on).
  bool accepting(const State& s) const;

 private:
  enum class Type : uint8_t { any, object, array, string, integer, number, enumeration, choice };
  struct Node {
    Type type = Type::any;
    std::vector<std::pair<std::string, uint16_t>> props;  // object: sorted by name
    uint64_t required = 0;
    bool open = false;           // object: any keys, any values
    uint16_t items = 0;          // array
    uint32_t min_items = 0, max_items = UINT16_MAX;
    std::vector<std::string> values;  // enumeration: serialized JSON values, sorted
    std::vector<uint16_t> alternatives;  // choice
  };
  struct Compiler;

  uint16_t add_node(Node n);
  bool start_value(State& s, uint16_t node, unsigned char c) const;
  bool step_container(State& s, unsigned char c) const;
  bool step_string(State& s, unsigned char c) const;
  bool step_number(State& s, unsigned char c) const;
  bool step_enum(State& s, unsigned char c) const;
  void value_done(State& s) const;
  bool push(State& s, uint16_t node, uint8_t phase) const;
  uint16_t value_node(const State& s) const;  // what the next value must match

  std::vector<Node> nodes_;
  uint16_t literals_ = 0, booleans_ = 0, null_ = 0, any_object_ = 0, any_array_ = 0;
};

}  // namespace spw
