// The OpenAI layer: request bodies in, replies out. Knows nothing of HTTP sockets (transport is
// http_server.cpp); replies are either a finished body or an SSE producer that the transport
// drives on the connection's thread. Every method returns a reply; none throws.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "chat/chat_encoding.h"
#include "chat/tool_call_grammar.h"
#include "runtime/scheduler.h"
#include "server/api_error.h"
#include "server/generation.h"
#include "server/request_body.h"
#include "server/settings.h"
#include "server/text.h"

namespace spw::server {

// Writes one SSE event's bytes; false once the client is gone.
using SseWrite = std::function<bool(const std::string&)>;
// True once the client of a non-streaming request has closed its connection (the transport's
// probe; empty when it has none).
using ClientGone = std::function<bool()>;

struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  std::function<void(const SseWrite&)> sse;  // set: stream this instead of body

  static HttpReply json(const Json& j, int status = 200);
  static HttpReply error(const ApiError& e);
};

struct ModelInfo {
  std::string id;
  ChatFamily family = ChatFamily::v41;
  int32_t eos_id = 1;
};

class OpenAiApi {
 public:
  OpenAiApi(runtime::Engine& engine, const Text& text, const ServerSettings& settings, ModelInfo model);

  // Non-streaming requests poll `gone` while they wait and cancel their sequences when it is true.
  HttpReply completions(const std::string& body, const ClientGone& gone = {});
  HttpReply chat_completions(const std::string& body, const ClientGone& gone = {});
  HttpReply models() const;
  HttpReply tokenize(const std::string& body) const;
  HttpReply detokenize(const std::string& body) const;

 private:
  // Checks lengths against --max-model-len / --max-tokens-limit and submits gen.n sequences to the
  // engine (choice i seeded with choice_seed(seed, i), constrained by its own constraint() when
  // given). All or none: a refused choice cancels the ones already queued.
  using MakeConstraint = std::function<std::shared_ptr<runtime::LogitsConstraint>()>;
  ApiResult<std::vector<std::shared_ptr<runtime::RequestStream>>> submit(std::vector<int32_t> prompt,
                                                                         const GenerationParams& gen,
                                                                         const char* prompt_noun,
                                                                         const MakeConstraint& constraint = {});
  struct ChatPrompt {
    std::vector<int32_t> ids;
    bool thinking = false;
    // Set for tool_choice "required" or a named function: the grammar every choice must follow.
    std::shared_ptr<const ToolCallGrammar> grammar;
  };
  ApiResult<ChatPrompt> chat_prompt(const Json& body, const ChatCompletionRequest& req) const;

  runtime::Engine& engine_;
  const Text& text_;
  const ServerSettings& settings_;
  ModelInfo model_;
};

// Helpers shared by the completion and chat handlers (openai_api.cpp).
std::string make_request_id(const char* prefix);
int64_t unix_now();
// The seed of choice i of a request with `seed`: the seed itself for choice 0 (so n = 1 is unchanged),
// a splitmix64 mix of seed and i for the others.
uint64_t choice_seed(uint64_t seed, int i);
// prompt_tokens once, completion_tokens summed over the choices.
Json usage_json(const RunList& runs);
// {"id", "object", "created", "model", "choices"} — the envelope of every completion response and chunk.
Json completion_envelope(const std::string& id, const char* object, int64_t created, const std::string& model,
                         Json choices);
// The end of an SSE stream: the usage chunk (stream_options.include_usage) and `data: [DONE]`.
void write_stream_end(const SseWrite& write, const std::string& id, const char* object, int64_t created,
                      const std::string& model, const RunList& runs, bool include_usage);

}  // namespace spw::server
