// The server's JSON type: insertion-ordered, so tool schemas keep their key order (the chat
// encoder embeds them verbatim) and responses read in OpenAI's field order. Dumps never throw:
// invalid UTF-8 from a model is replaced, not an exception.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace spw::server {

using Json = nlohmann::ordered_json;

inline std::string dump_json(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace spw::server
