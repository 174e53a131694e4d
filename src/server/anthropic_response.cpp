#include "server/anthropic_response.h"

namespace spw::server {

std::string anthropic_sse(const char* name, const Json& data) {
  return std::string("event: ") + name + "\ndata: " + dump_json(data) + "\n\n";
}

int anthropic_error_status(const ApiError& e) { return e.status == 503 ? 529 : e.status; }

Json anthropic_error_json(const ApiError& e) {
  const char* type = "api_error";
  switch (anthropic_error_status(e)) {
    case 400: type = "invalid_request_error"; break;
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 529: type = "overloaded_error"; break;
    default: break;
  }
  return Json{{"type", "error"}, {"error", Json{{"type", type}, {"message", e.message}}}};
}

void ContentBlocks::emit(const char* event, Json data) {
  if (!emit_ || !ok_) return;
  ok_ = emit_(event, data);
}

void ContentBlocks::close() {
  if (open_ == Open::none) return;
  const size_t index = content_.size() - 1;
  if (open_ == Open::thinking)
    emit("content_block_delta", Json{{"type", "content_block_delta"},
                                     {"index", index},
                                     {"delta", Json{{"type", "signature_delta"}, {"signature", ""}}}});
  emit("content_block_stop", Json{{"type", "content_block_stop"}, {"index", index}});
  open_ = Open::none;
}

void ContentBlocks::open(Open kind) {
  if (open_ == kind) return;
  close();
  Json block = kind == Open::thinking ? Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                      : Json{{"type", "text"}, {"text", ""}};
  content_.push_back(block);
  if (kind == Open::thinking) block.erase("signature");  // the start event carries no signature yet
  emit("content_block_start",
       Json{{"type", "content_block_start"}, {"index", content_.size() - 1}, {"content_block", std::move(block)}});
  open_ = kind;
}

void ContentBlocks::append(Open kind, const std::string& piece) {
  if (piece.empty()) return;
  open(kind);
  const char* field = kind == Open::thinking ? "thinking" : "text";
  content_.back()[field] = content_.back()[field].get<std::string>() + piece;
  emit("content_block_delta",
       Json{{"type", "content_block_delta"},
            {"index", content_.size() - 1},
            {"delta", Json{{"type", kind == Open::thinking ? "thinking_delta" : "text_delta"}, {field, piece}}}});
}

void ContentBlocks::tool_use(const ToolCallDelta& call) {
  Json input = Json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
  if (!input.is_object()) {
    append(Open::text, call.name + call.arguments);
    return;
  }
  close();
  any_tool_use_ = true;
  Json block{{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", Json::object()}};
  const size_t index = content_.size();
  emit("content_block_start", Json{{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
  emit("content_block_delta",
       Json{{"type", "content_block_delta"},
            {"index", index},
            {"delta", Json{{"type", "input_json_delta"}, {"partial_json", dump_json(input)}}}});
  emit("content_block_stop", Json{{"type", "content_block_stop"}, {"index", index}});
  block["input"] = std::move(input);
  content_.push_back(std::move(block));
}

void ContentBlocks::push(const StreamDelta& d) {
  append(Open::thinking, d.reasoning_content);
  append(Open::text, d.content);
  for (const auto& call : d.tool_calls) tool_use(call);
}

HttpReply anthropic_error_reply(const ApiError& e) {
  HttpReply r = HttpReply::json(anthropic_error_json(e), anthropic_error_status(e));
  if (r.status == 529 || r.status == 429) r.headers.emplace_back("Retry-After", "1");
  return r;
}

}  // namespace spw::server
