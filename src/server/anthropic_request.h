// Anthropic Messages request bodies (POST /v1/messages) → the inputs of the chat machinery: the
// sampling fields as a ChatCompletionRequest, and messages / system / tools / thinking rewritten
// as an OpenAI chat-completions body that src/chat's parse_chat_request() reads. Nothing here
// encodes prompts or generates; anthropic_messages.cpp hands both to OpenAiApi's chat path.
//
// Mapping (docs/server.md, "Anthropic Messages API"):
//   - system (string or text blocks) → a system message;
//   - user text blocks → a user message; tool_result blocks → tool messages (in their order,
//     before the turn's text), content string or text blocks, is_error → "Error: " before the text;
//   - assistant text → content, thinking → reasoning_content, tool_use → tool_calls (input is
//     the arguments object), redacted_thinking dropped;
//   - tools {name, description, input_schema} → function tools; tool_choice auto / any / tool /
//     none → "auto" / "required" / the named function / "none"; disable_parallel_tool_use →
//     parallel_tool_calls false;
//   - thinking {"type": "enabled", budget_tokens} / {"type": "disabled"} → the model's thinking
//     mode (the budget is validated, not enforced: the model has no reasoning budget).
// Rejected with a 400 that names the field (Anthropic's "messages.0.content.1" spelling): missing
// model / max_tokens / messages, wrong types and ranges, roles other than user / assistant, image
// and document blocks, server tools, and a final assistant message (prefill is not supported).
// Unknown top-level fields (metadata, service_tier, ...) and cache_control are ignored.
// Parsing never throws.
#pragma once

#include "server/api_error.h"
#include "server/json.h"
#include "server/openai_request.h"

namespace spw::server {

struct MessagesRequest {
  ChatCompletionRequest chat;  // model, gen (max_tokens, sampling, stop_sequences, stream), tool_choice
  Json chat_body;              // {"messages", "tools", "thinking"} in OpenAI chat-completions shape
};

ApiResult<MessagesRequest> parse_messages_request(const Json& body);

}  // namespace spw::server
