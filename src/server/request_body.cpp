#include "server/request_body.h"

#include <utility>

#include "chat/json_limits.h"

namespace spw::server {

ApiResult<Json> parse_body(std::string_view body) {
  auto j = parse_json_bounded(body);
  if (!j.ok()) return bad_request("the request body " + j.error().message);
  if (!j->is_object()) return bad_request("the request body must be a JSON object");
  return std::move(j).value();
}

}  // namespace spw::server
