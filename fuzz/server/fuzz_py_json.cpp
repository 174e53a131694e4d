// libFuzzer target for the py_json path: JSON text (a tool call's arguments, as a client sends them
// in an assistant message) → parse_json_bounded → py_json_dumps, and the same text through the
// encoder's argument rendering (encode_chat). Checks: nothing crashes, overflows the stack or
// throws; py_json_dumps output parses back to an equal value.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "chat/chat_encoding.h"
#include "chat/json_limits.h"
#include "chat/py_json.h"

namespace {

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "violated: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto value = spw::parse_json_bounded(text);
  if (value.ok()) {
    const std::string dumped = spw::py_json_dumps(*value);
    auto again = spw::parse_json_bounded(dumped);
    require(again.ok(), "py_json_dumps output is JSON within the limits");
    require(*again == *value, "py_json_dumps output parses back to the same value");
  } else {
    require(!value.error().message.empty(), "parse error has a message");
  }
  for (spw::ChatFamily family : {spw::ChatFamily::v4, spw::ChatFamily::v41}) {
    spw::ChatRequest req;
    req.options.family = family;
    spw::ChatMessage user;
    user.role = spw::ChatRole::user;
    user.content = "hi";
    spw::ChatMessage assistant;
    assistant.role = spw::ChatRole::assistant;
    assistant.tool_calls.push_back(spw::ToolCall{"call_0", "f", text});
    req.messages = {user, assistant};
    auto prompt = spw::encode_chat(req);
    if (!prompt.ok()) require(!prompt.error().message.empty(), "encoder error has a message");
  }
  return 0;
}
