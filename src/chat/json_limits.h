// Bounded JSON parsing for everything a client (or a model) sends: the nesting depth and the number
// of values are checked in a first SAX pass, before any DOM exists. nlohmann's parser is iterative,
// but its copy constructor, comparison and serializer recurse once per nesting level, so a DOM
// 50,000 levels deep overflows a thread's stack the first time it is copied or dumped. Every JSON
// text from outside goes through parse_json_bounded (the server's parse_body, tool-call arguments
// in chat messages); a DOM handed in by other code is checked with json_depth_exceeds.
// Tests: tests/unit/test_json_limits.cpp; fuzz/fuzz_request_json.cpp.
#pragma once

#include <cstddef>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace spw {

struct JsonLimits {
  // Levels of arrays/objects; a scalar at top level is depth 0, `{"a":[1]}` is depth 2. A request's
  // deepest legitimate part is a tool's JSON schema: body → tools[] → tool → function → parameters
  // reaches level 5 and every schema level (properties → name, or items) adds 1 or 2, so 64 leaves room
  // for a schema about 30 levels deep, while the recursive walks that remain (nlohmann's copy,
  // comparison and serializer) stay at most 64 frames deep.
  size_t max_depth = 64;
  // Values of any kind (each scalar, array, object and key counts once). Bounds the DOM whatever the
  // layout of the text: 1 Mi values parsed as empty arrays peak at 74 MB RSS (text included), as
  // 0s at 40 MB (g++ -O2), while a completions prompt of a million token ids still fits.
  size_t max_values = size_t(1) << 20;
};

// Parses `text` as one JSON value. Errors: not JSON (nlohmann's message, with the byte offset),
// nested deeper than limits.max_depth, or more than limits.max_values values; each names the limit.
// Messages start with a verb ("is not valid JSON: ...", "nests arrays/objects more than 64 levels
// deep ...", "has more than ...") so the caller prefixes what was parsed: "the request body ".
Result<nlohmann::ordered_json> parse_json_bounded(std::string_view text, const JsonLimits& limits = {});

// True when `value` nests arrays/objects more than max_depth levels deep. Iterative: safe on any
// DOM, whatever its depth.
bool json_depth_exceeds(const nlohmann::ordered_json& value, size_t max_depth);

}  // namespace spw
