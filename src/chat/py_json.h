// JSON text exactly as Python's `json.dumps(value, ensure_ascii=False)` writes it: separators
// ", " and ": ", keys in insertion order, non-ASCII unescaped, control characters as \uXXXX
// (lowercase hex), floats in Python repr form (1.0, 1e-05, 1e+16). DeepSeek's encoders embed tool
// schemas and non-string tool arguments this way, and their DSML decoder builds arguments this way.
// Limits: integers beyond 64 bits arrive from nlohmann as doubles, so they print as floats (Python
// keeps them exact); NaN/Infinity never reach here because nlohmann rejects them on parse. Any depth
// is safe: the dump is iterative (tests/unit/test_json_limits.cpp dumps 100,000 levels).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace spw {

std::string py_json_dumps(const nlohmann::ordered_json& value);
void py_json_append_string(std::string& out, std::string_view s);   // quoted and escaped
void py_json_append_escaped(std::string& out, std::string_view s);  // escaped, without the quotes
std::string py_float_repr(double v);

}  // namespace spw
