// OpenAI-style errors: every failure a client can cause ends as one of these, serialised as
// {"error": {"message", "type", "param", "code"}} with the HTTP status. Handlers never throw.
#pragma once

#include <string>

#include "server/json.h"

namespace spw::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" → null
  std::string code;   // "" → null
};

inline ApiError bad_request(std::string message, std::string param = {}, std::string code = {}) {
  return {400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

inline Json error_json(const ApiError& e) {
  Json inner;
  inner["message"] = e.message;
  inner["type"] = e.type;
  inner["param"] = e.param.empty() ? Json() : Json(e.param);
  inner["code"] = e.code.empty() ? Json() : Json(e.code);
  Json out;
  out["error"] = std::move(inner);
  return out;
}

// A value or an ApiError (the server's Result).
template <class T>
struct ApiResult {
  ApiResult(T v) : value(std::move(v)), ok(true) {}  // NOLINT: implicit by design
  ApiResult(ApiError e) : error(std::move(e)), ok(false) {}  // NOLINT
  T value{};
  ApiError error;
  bool ok;
};

}  // namespace spw::server
