// libFuzzer target for a /v1/completions body as the server reads it: parse_body (depth and value
// limits, src/server/request_body.h) → parse_completion_request. Input: the body. Checks: nothing
// crashes, overflows the stack or throws; rejections are 400s with a message; accepted requests
// respect the documented ranges (src/server/openai_request.h).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <variant>

#include "chat/json_limits.h"
#include "server/openai_request.h"
#include "server/request_body.h"

namespace {

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "violated: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto body = spw::server::parse_body(text);
  if (!body.ok) {
    require(body.error.status == 400 && !body.error.message.empty(), "parse_body error is a 400 with a message");
    return 0;
  }
  require(body.value.is_object(), "accepted body is an object");
  require(!spw::json_depth_exceeds(body.value, spw::JsonLimits{}.max_depth), "accepted body within the depth limit");
  auto req = spw::server::parse_completion_request(body.value);
  if (!req.ok) {
    require(req.error.status == 400 && !req.error.message.empty(), "request error is a 400 with a message");
    return 0;
  }
  const auto& gen = req.value.gen;
  require(gen.n >= 1 && gen.n <= spw::server::kMaxChoices, "n in range");
  require(!gen.max_tokens || *gen.max_tokens >= 0, "max_tokens not negative");
  if (const auto* ids = std::get_if<std::vector<int32_t>>(&req.value.prompt)) {
    for (int32_t id : *ids) require(id >= 0, "token ids not negative");
  }
  return 0;
}
