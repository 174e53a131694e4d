// Every route's request body → one JSON object, parsed within spw::JsonLimits (nesting depth and
// value count, chat/json_limits.h) before any DOM is built, so no later copy, comparison or dump of
// the body can recurse deeper than JsonLimits::max_depth. The body's size is bounded before this by
// the transport (--max-body-bytes). Never throws.
// Tests: tests/unit/test_json_limits.cpp, tests/python/server/test_json_limits.py;
// fuzz/server (fuzz_chat_request, fuzz_completion_request).
#pragma once

#include <string_view>

#include "server/api_error.h"
#include "server/json.h"

namespace spw::server {

// A 400 naming what to change: not JSON (with nlohmann's position), too deep or too many values (with
// the limit), or not an object.
ApiResult<Json> parse_body(std::string_view body);

}  // namespace spw::server
