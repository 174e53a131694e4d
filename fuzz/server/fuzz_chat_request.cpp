// libFuzzer target for a /v1/chat/completions body as the server reads it: parse_body (depth and
// value limits, src/server/request_body.h) → parse_chat_completion_request → parse_chat_request →
// the tool-call grammar (when tool_choice enforces a call) → encode_chat. Input: byte 0 = flags
// (bit 0: V4.1 instead of V4), the rest = the body. Checks: nothing crashes, overflows the stack or
// throws; every rejection carries a message; an accepted body's DOM is within the depth limit.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "chat/chat_encoding.h"
#include "chat/json_limits.h"
#include "chat/tool_call_grammar.h"
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
  if (size < 1) return 0;
  const spw::ChatFamily family = (data[0] & 1) ? spw::ChatFamily::v41 : spw::ChatFamily::v4;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  auto body = spw::server::parse_body(text);
  if (!body.ok) {
    require(body.error.status == 400 && !body.error.message.empty(), "parse_body error is a 400 with a message");
    return 0;
  }
  require(!spw::json_depth_exceeds(body.value, spw::JsonLimits{}.max_depth), "accepted body within the depth limit");
  auto req = spw::server::parse_chat_completion_request(body.value);
  if (!req.ok) {
    require(!req.error.message.empty(), "request error has a message");
    return 0;
  }
  require(req.value.gen.n >= 1 && req.value.gen.n <= spw::server::kMaxChoices, "n in range");
  auto chat = spw::parse_chat_request(body.value, family);
  if (!chat.ok()) {
    require(!chat.error().message.empty(), "chat error has a message");
    return 0;
  }
  if (req.value.tool_choice != "auto" && req.value.tool_choice != "none" && !chat->tools.empty()) {
    spw::ToolCallGrammarOptions options;
    options.family = family;
    options.thinking = chat->options.thinking;
    options.parallel = req.value.parallel_tool_calls;
    auto grammar = spw::ToolCallGrammar::build(chat->tools, options);
    if (!grammar.ok()) require(!grammar.error().message.empty(), "grammar error has a message");
  }
  auto prompt = spw::encode_chat(*chat);
  if (!prompt.ok()) require(!prompt.error().message.empty(), "encoder error has a message");
  return 0;
}
