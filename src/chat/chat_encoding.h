// Chat prompt encoding for DeepSeek-V4-Flash and DeepSeek-V4.1-Flash (spec §8).
//
// The releases ship no Jinja template; DeepSeek's `encoding/encoding_dsv4.py` (V4) and
// `encoding/encoding.py` (V4.1) are authoritative. encode_chat() reproduces their
// `encode_messages(...)` byte for byte (defaults: drop_thinking=True, add_default_bos_token=True,
// no context), for OpenAI-shaped requests mapped as serving wrappers do it: when tools are given,
// they ride on message 0, which is a system message (an empty one is inserted if the first message
// is not a system message).
//
// Contract: returns the prompt TEXT with special tokens spelled out (`<｜User｜>`, `<think>`, ...)
// and the byte spans of it that hold the client's text: message content, reasoning, tool results,
// tool schemas, tool-call names and arguments. Tokenize it with
// Tokenizer::encode_with_plain_spans(text, client_spans): the template's markers become control
// tokens while marker text inside client content stays ordinary text, so a message cannot forge a
// turn, a think block or a tool call. Nothing aborts on user input: every rejection is an Error
// whose message names the message index, field and value.
//
// Where we are stricter than the official encoder (it would accept or crash):
//   - a tool message must answer a tool call of the nearest earlier assistant message with calls;
//   - V4 tool-call arguments that are valid JSON but not an object are an error (official: crash);
//   - content-part types other than text / image_url / image are an error (official V4.1 renders
//     "[Unsupported t]" in user turns and drops them elsewhere);
//   - V4 accepts text-only content-part lists (joined by "\n\n", as V4 does for tool results);
//     images need V4.1.
// Tests: tests/unit/test_chat_encoding.cpp against goldens made by tools/chat/make_chat_goldens.py.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "base/text_span.h"

namespace spw {

enum class ChatFamily { v4, v41 };

// `developer` is a V4 role (rendered like a user turn); V4.1 has none and renders it as `system`,
// which is what OpenAI's developer messages are.
enum class ChatRole { system, developer, user, assistant, tool };

const char* chat_role_name(ChatRole role);

// One element of an OpenAI content array. Images become `<｜deepseek_image｜>` placeholders (V4.1);
// the image processor expands each placeholder later.
struct ContentPart {
  enum class Kind { text, image };
  Kind kind = Kind::text;
  std::string text;       // Kind::text
  std::string image_url;  // Kind::image (URL or data: URI; carried for the image processor)
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text as the client sent it (normally an object)
};

struct ChatMessage {
  ChatRole role = ChatRole::user;
  std::string content;                            // used when parts is empty
  std::optional<std::vector<ContentPart>> parts;  // set when the client sent a content array
  std::string reasoning_content;                  // assistant turns
  std::vector<ToolCall> tool_calls;               // assistant turns
  std::string tool_call_id;                       // tool turns
};

// An OpenAI tool ("type": "function"). `function` is the function object exactly as received, in
// key order: the prompt embeds it with Python json.dumps formatting, so the order is part of the
// output. make_tool() builds it from the three usual fields.
struct ToolSpec {
  nlohmann::ordered_json function;
};
ToolSpec make_tool(std::string name, std::string description, nlohmann::ordered_json parameters);

// V4: absent, "high" (both add nothing) or "max" (a fixed "Reasoning Effort: Absolute maximum..."
// preamble). V4.1: absent (= "high"), an int 1..100, or "low"/"high"/"max" = 50/75/100; rendered as
// "Reasoning Effort: N (range 1-100, ...)" in thinking mode only. Both validate in chat mode too.
using ReasoningEffort = std::variant<std::monostate, int, std::string>;

struct ChatOptions {
  ChatFamily family = ChatFamily::v41;
  bool thinking = false;  // the official thinking_mode: "thinking" (true) or "chat" (false)
  ReasoningEffort reasoning_effort;
};

struct ChatRequest {
  std::vector<ChatMessage> messages;
  std::vector<ToolSpec> tools;
  ChatOptions options;
};

// A prompt and the spans of it that came from the client (sorted, non-overlapping).
struct EncodedChat {
  std::string text;
  std::vector<TextSpan> client_spans;
};

// Appends template markup and client text to a prompt, recording where client text lies.
class PromptBuilder {
 public:
  explicit PromptBuilder(std::string_view markup = {});
  void markup(std::string_view s);
  void client(std::string_view s);
  EncodedChat take() && { return std::move(prompt_); }

 private:
  EncodedChat prompt_;
};

// Builds the prompt (see the contract above).
Result<EncodedChat> encode_chat_prompt(const ChatRequest& request);
// The prompt text alone, for trusted input (goldens, calibration data): tokenizing it whole lets
// marker text in the content act as markers.
Result<std::string> encode_chat(const ChatRequest& request);

// Reads an OpenAI chat-completions body: messages (role, content as string / null / array of
// parts, reasoning_content, tool_calls, tool_call_id), tools, reasoning_effort, and the thinking
// switch from "thinking" (bool, or {"type": "enabled"|"disabled"}) or
// "chat_template_kwargs": {"thinking": bool}. Parse the body as ordered_json so tool schemas keep
// their key order. The family comes from the served model, not from the body.
Result<ChatRequest> parse_chat_request(const nlohmann::ordered_json& body, ChatFamily family);

}  // namespace spw
