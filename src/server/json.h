// The server's JSON type: insertion-ordered, so tool schemas keep their key order (the chat
// encoder embeds them verbatim) and responses read in OpenAI's field order. Dumps never throw:
// invalid UTF-8 from a model is replaced, not an exception.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace spw::server {

using Json = nlohmann::ordered_json;

// "an integer", "a string", ...: for error messages that say what a field held instead.
inline const char* json_type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a number";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    default: return "an unsupported value";
  }
}

inline std::string dump_json(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace spw::server
