// The OpenAI layer: request bodies in, replies out. Knows nothing of HTTP sockets (transport is
// http_server.cpp); replies are either a finished body or an SSE producer that the transport
// drives on the connection's thread. Every method returns a reply; none throws.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
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
#include "vision/image_decode.h"
#include "vision/vision_config.h"
#include "vision/image_encoder.h"

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
  std::string id;  // the served model name; requests naming another model get 404 model_not_found
  ChatFamily family = ChatFamily::v41;
  int32_t eos_id = 1;
  std::string system_fingerprint;  // see make_system_fingerprint
  // The vision tower's settings; nullopt for a model without one, which refuses image inputs.
  std::optional<vision::VisionConfig> vision;
  // The tower that encodes images, loaded when the runner takes images (ModelRunner::takes_images); null:
  // images are refused.
  std::shared_ptr<vision::ImageEncoder> image_encoder{};
};

// "spw-<version>-<12 hex digits>": the digits hash the model's config.json text and the numerics
// mode, so the fingerprint changes when the build's version, the model or the numerics change,
// which is what OpenAI's system_fingerprint promises clients.
std::string make_system_fingerprint(std::string_view model_config_text, std::string_view numerics);

class OpenAiApi {
 public:
  OpenAiApi(runtime::Scheduler& scheduler, const Text& text, const ServerSettings& settings, ModelInfo model);

  // Non-streaming requests poll `gone` while they wait and cancel their sequences when it is true.
  HttpReply completions(const std::string& body, const ClientGone& gone = {});
  HttpReply chat_completions(const std::string& body, const ClientGone& gone = {});
  // POST /v1/messages, the Anthropic Messages API (anthropic_messages.cpp). It checks the API key
  // itself, from x-api-key (Anthropic clients) or Authorization: Bearer, and answers errors in
  // Anthropic's shape.
  // POST /v1/messages (Anthropic); the transport has checked the key (x-api-key or Bearer).
  HttpReply messages(const std::string& body, const ClientGone& gone = {});
  HttpReply models() const;
  // GET /v1/models/{id}: the served model, or 404 model_not_found for any other id.
  HttpReply model(const std::string& id) const;
  HttpReply tokenize(const std::string& body) const;
  HttpReply detokenize(const std::string& body) const;

 private:
  // Checks lengths against --max-model-len / --max-tokens-limit and submits gen.n sequences to the
  // scheduler (choice i seeded with choice_seed(seed, i), constrained by its own constraint() when
  // given). All or none: a refused choice cancels the ones already queued.
  using MakeConstraint = std::function<std::shared_ptr<runtime::LogitsConstraint>()>;
  ApiResult<std::vector<std::shared_ptr<runtime::RequestStream>>> submit(std::vector<int32_t> prompt,
                                                                         const GenerationParams& gen,
                                                                         const char* prompt_noun,
                                                                         const MakeConstraint& constraint = {},
                                                                         std::shared_ptr<const runtime::PromptImages> images = {});
  struct ChatPrompt {
    std::vector<int32_t> ids;
    bool thinking = false;
    // Set for tool_choice "required" or a named function: the grammar every choice must follow.
    std::shared_ptr<const ToolCallGrammar> grammar;
    std::shared_ptr<const runtime::PromptImages> images;  // set when the messages hold images
  };
  Json model_json() const;
  ApiResult<ChatPrompt> chat_prompt(const Json& body, const ChatCompletionRequest& req) const;
  // Image parts of a chat request (chat_images.cpp), decoded in order; a 400 naming the part when one cannot
  // be used, or when the model does not take images.
  ApiResult<std::vector<vision::RgbImage>> chat_images(const ChatRequest& chat) const;
  // Expands each image placeholder of `ids` into its span and encodes the images (chat_images.cpp).
  ApiResult<std::shared_ptr<const runtime::PromptImages>> prompt_images(std::vector<int32_t>& ids,
                                                                         const std::vector<vision::RgbImage>& images) const;
  // A 404 model_not_found for a request whose `model` is neither empty nor the served model id.
  std::optional<ApiError> unknown_model(const std::string& requested) const;

  runtime::Scheduler& scheduler_;
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
// completion_tokens summed over the choices; prompt_tokens once per prompt, the runs being
// `runs_per_prompt` choices of each prompt in turn (0: all runs share one prompt).
Json usage_json(const RunList& runs, size_t runs_per_prompt = 0);
// {"id", "object", "created", "model", "system_fingerprint", "choices"} — the envelope of every
// completion response and chunk.
Json completion_envelope(const std::string& id, const char* object, int64_t created, const ModelInfo& model,
                         Json choices);
// The end of an SSE stream: the usage chunk (stream_options.include_usage) and `data: [DONE]`.
void write_stream_end(const SseWrite& write, const std::string& id, const char* object, int64_t created,
                      const ModelInfo& model, const RunList& runs, bool include_usage, size_t runs_per_prompt = 0);

}  // namespace spw::server
