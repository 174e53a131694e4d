// OpenAI request bodies → typed requests, with validation. Wrong types and out-of-range values
// give a 400 ApiError naming the field (`param`); unknown fields are ignored; null means absent.
// Parsing never throws (tests/unit/test_server_request_fuzz.cpp feeds it random mutations).
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "runtime/request.h"
#include "server/api_error.h"
#include "server/json.h"

namespace spw::server {

// response_format: free text, any JSON object, or JSON held to a schema (constrained decoding,
// src/server/response_format.h).
struct ResponseFormat {
  enum class Type { text, json_object, json_schema };
  Type type = Type::text;
  Json schema;  // json_schema: json_schema.schema
};

// Fields shared by /v1/completions and /v1/chat/completions.
struct GenerationParams {
  std::optional<int64_t> max_tokens;   // max_tokens, or max_completion_tokens (chat)
  runtime::SamplingParams sampling;
  std::vector<std::string> stop;       // text stop sequences (not included in the output)
  std::vector<int32_t> stop_token_ids; // extension (vLLM): stop when one of these ids is sampled
  bool ignore_eos = false;             // extension (vLLM)
  bool stream = false;
  bool include_usage = false;          // stream_options.include_usage
  int n = 1;                           // choices: independent sequences, 1..kMaxChoices
  ResponseFormat response_format;
  bool prompt_logprobs = false;        // /v1/completions echo with logprobs: score the prompt too
};

inline constexpr int kMaxChoices = 16;

inline constexpr size_t kMaxPrompts = 64;  // prompts in one /v1/completions request

struct CompletionRequest {
  using Prompt = std::variant<std::string, std::vector<int32_t>>;  // text, or token ids
  std::string model;
  std::vector<Prompt> prompts;  // ≥ 1; choices are indexed prompt-major: prompt p, choice i → p·n + i
  bool echo = false;
  GenerationParams gen;
};

struct ChatCompletionRequest {
  std::string model;
  GenerationParams gen;
  // tool_choice: "auto" (default), "none", "required", or the name of one function.
  std::string tool_choice = "auto";
  bool parallel_tool_calls = true;  // with an enforced tool_choice: more than one call allowed
};

ApiResult<CompletionRequest> parse_completion_request(const Json& body);
// The chat-specific parts (messages, tools, thinking) are read by src/chat from the same body.
ApiResult<ChatCompletionRequest> parse_chat_completion_request(const Json& body);

// /tokenize and /detokenize.
struct TokenizeRequest {
  std::optional<std::string> prompt;  // text; or `messages` (then the body goes to the chat encoder)
  bool has_messages = false;
  bool add_special_tokens = true;     // parse special-token text in the prompt
};
ApiResult<TokenizeRequest> parse_tokenize_request(const Json& body);
ApiResult<std::vector<int32_t>> parse_detokenize_request(const Json& body);

}  // namespace spw::server
