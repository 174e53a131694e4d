// libFuzzer target for the tool schema → grammar path: a tools array (as a request's "tools") →
// parse_json_bounded → parse_chat_request → ToolCallGrammar::build → bytes fed to the grammar.
// Input: byte 0 = flags (bit 0: V4.1, bit 1: thinking, bit 2: parallel calls), then the tools JSON,
// then optionally a 0 byte and model output to feed. Checks: nothing crashes, overflows the stack or
// throws; rejections carry a message; feeding the output whole and byte by byte agree.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "chat/chat_encoding.h"
#include "chat/json_limits.h"
#include "chat/tool_call_grammar.h"

namespace {

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "violated: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t split = rest.find('\0');
  const std::string_view tools_text = rest.substr(0, split);
  const std::string_view output = split == std::string_view::npos ? std::string_view() : rest.substr(split + 1);
  auto tools = spw::parse_json_bounded(tools_text);
  if (!tools.ok()) {
    require(!tools.error().message.empty(), "parse error has a message");
    return 0;
  }
  nlohmann::ordered_json body = nlohmann::ordered_json::object();
  body["messages"] = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  body["tools"] = std::move(tools).value();
  const spw::ChatFamily family = (data[0] & 1) ? spw::ChatFamily::v41 : spw::ChatFamily::v4;
  auto chat = spw::parse_chat_request(body, family);
  if (!chat.ok()) {
    require(!chat.error().message.empty(), "chat error has a message");
    return 0;
  }
  spw::ToolCallGrammarOptions options;
  options.family = family;
  options.thinking = (data[0] & 2) != 0;
  options.parallel = (data[0] & 4) != 0;
  auto grammar = spw::ToolCallGrammar::build(chat->tools, options);
  if (!grammar.ok()) {
    require(!grammar.error().message.empty(), "grammar error has a message");
    return 0;
  }
  spw::ToolCallGrammar::State whole = grammar->start();
  const bool whole_ok = grammar->feed(whole, output);
  spw::ToolCallGrammar::State stepped = grammar->start();
  bool stepped_ok = true;
  for (char c : output) {
    if (!grammar->step(stepped, static_cast<unsigned char>(c))) {
      stepped_ok = false;
      break;
    }
  }
  require(whole_ok == stepped_ok, "feed and step agree");
  if (whole_ok) require(whole == stepped, "feed and step reach the same state");
  return 0;
}
