// Anthropic Messages replies: the content blocks built from src/chat's stream-parser deltas (the
// same parser /v1/chat/completions uses), SSE events, and errors in Anthropic's shape.
//
// ContentBlocks contract: push() the parser's deltas in order; reasoning opens (or extends) a
// `thinking` block, content a `text` block, each tool call becomes one whole `tool_use` block
// (input = its parsed arguments). A new kind of block closes the open one; a thinking block
// closes with a signature_delta (the signature is empty: this server has nothing to sign and
// ignores signatures it is sent). With an emitter, every change is also an SSE event
// (content_block_start / _delta / _stop); an emitter that returns false (client gone) stops the
// events, and ok() turns false. Within one delta, reasoning comes before content before calls.
// A tool call whose arguments are not a JSON object (free DSML from an unconstrained model) is
// returned as text, so a client never gets a tool_use it cannot parse.
#pragma once

#include <functional>
#include <string>

#include "chat/stream_parser.h"
#include "server/api_error.h"
#include "server/json.h"
#include "server/openai_api.h"

namespace spw::server {

// One SSE event: "event: <name>\ndata: <json>\n\n".
std::string anthropic_sse(const char* name, const Json& data);

// {"type": "error", "error": {"type", "message"}}: the error type follows the HTTP status
// (400 invalid_request_error, 401 authentication_error, 404 not_found_error, 413
// request_too_large, 429 rate_limit_error, 503/529 overloaded_error, other 5xx api_error).
// An overloaded server (queue full, shutting down) answers 529, as Anthropic does.
Json anthropic_error_json(const ApiError& e);
int anthropic_error_status(const ApiError& e);
// The error as a reply (status, body, Retry-After on 429/529).
HttpReply anthropic_error_reply(const ApiError& e);

class ContentBlocks {
 public:
  using Emit = std::function<bool(const char* event, const Json& data)>;
  explicit ContentBlocks(Emit emit = {}) : emit_(std::move(emit)) {}

  void push(const StreamDelta& d);
  void close();  // closes the open block (call once the output is complete)
  bool ok() const { return ok_; }
  bool any_tool_use() const { return any_tool_use_; }
  const Json& content() const { return content_; }  // the finished blocks, for the non-streaming reply

 private:
  enum class Open { none, thinking, text };
  void open(Open kind);
  void append(Open kind, const std::string& piece);
  void tool_use(const ToolCallDelta& call);
  void emit(const char* event, Json data);

  Emit emit_;
  Json content_ = Json::array();
  Open open_ = Open::none;
  bool ok_ = true;
  bool any_tool_use_ = false;
};

}  // namespace spw::server
