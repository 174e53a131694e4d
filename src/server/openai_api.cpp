#include "server/openai_api.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>

namespace spw::server {

HttpReply HttpReply::json(const Json& j, int status) {
  HttpReply r;
  r.status = status;
  r.body = dump_json(j);
  return r;
}

HttpReply HttpReply::error(const ApiError& e) {
  HttpReply r = json(error_json(e), e.status);
  if (e.status == 503 || e.status == 429) r.headers.emplace_back("Retry-After", "1");
  return r;
}

std::string make_request_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%016llx%08llx", prefix, static_cast<unsigned long long>(salt),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  return buf;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

uint64_t choice_seed(uint64_t seed, int i) {
  if (i == 0) return seed;
  uint64_t z = seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Json usage_json(const RunList& runs, size_t runs_per_prompt) {
  const size_t stride = runs_per_prompt ? runs_per_prompt : std::max<size_t>(runs.size(), 1);
  int64_t completion = 0, prompt = 0, cached = 0;
  for (const auto& run : runs) completion += run->n_completion_tokens();
  for (size_t i = 0; i < runs.size(); i += stride) {
    prompt += runs[i]->n_prompt_tokens();
    cached += runs[i]->n_cached_tokens();
  }
  Json u;
  u["prompt_tokens"] = prompt;
  u["completion_tokens"] = completion;
  u["total_tokens"] = prompt + completion;
  u["prompt_tokens_details"] = Json{{"cached_tokens", cached}};
  // Extension: speculative decoding's drafts over all choices, present when the server speculates.
  if (std::any_of(runs.begin(), runs.end(), [](const auto& run) { return run->speculative(); })) {
    int64_t drafted = 0, accepted = 0;
    for (const auto& run : runs) {
      drafted += run->n_drafted_tokens();
      accepted += run->n_accepted_tokens();
    }
    u["spillway_speculative"] = Json{{"drafted_tokens", drafted}, {"accepted_tokens", accepted}};
  }
  return u;
}

std::string make_system_fingerprint(std::string_view model_config_text, std::string_view numerics) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a: stable across builds and platforms, unlike std::hash
  auto mix = [&](std::string_view s) {
    for (const unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    h = (h ^ 0xff) * 0x100000001b3ull;  // field separator
  };
  mix(model_config_text);
  mix(numerics);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string("spw-") + SPW_VERSION + "-" + std::string(hex, 12);
}

OpenAiApi::OpenAiApi(runtime::Scheduler& scheduler, const Text& text, const ServerSettings& settings, ModelInfo model)
    : scheduler_(scheduler), text_(text), settings_(settings), model_(std::move(model)) {}

ApiResult<std::vector<std::shared_ptr<runtime::RequestStream>>> OpenAiApi::submit(std::vector<int32_t> prompt,
                                                                                  const GenerationParams& gen,
                                                                                  const char* prompt_noun,
                                                                                  const MakeConstraint& constraint,
                                                                                  std::shared_ptr<const runtime::PromptImages> images) {
  const int64_t n_prompt = int64_t(prompt.size());
  const int64_t max_len = settings_.max_model_len;
  if (n_prompt == 0) return bad_request("the prompt is empty", "prompt");
  if (gen.max_tokens && *gen.max_tokens > settings_.max_tokens_limit)
    return bad_request("max_tokens is " + std::to_string(*gen.max_tokens) + ", more than this server's limit of " +
                           std::to_string(settings_.max_tokens_limit) + " (--max-tokens-limit)",
                       "max_tokens");
  if (n_prompt >= max_len || (gen.max_tokens && n_prompt + *gen.max_tokens > max_len)) {
    std::string msg = "This model's maximum context length is " + std::to_string(max_len) +
                      " tokens. However, you requested " +
                      std::to_string(n_prompt + gen.max_tokens.value_or(0)) + " tokens (" + std::to_string(n_prompt) +
                      " in the " + prompt_noun + ", " + std::to_string(gen.max_tokens.value_or(0)) +
                      " in the completion). Please reduce the length of the " + prompt_noun + " or completion.";
    return bad_request(std::move(msg), gen.max_tokens && n_prompt < max_len ? "max_tokens" : "messages",
                       "context_length_exceeded");
  }
  runtime::GenerationRequest req;
  req.prompt = std::move(prompt);
  req.sampling = gen.sampling;
  req.max_tokens = int(gen.max_tokens.value_or(std::min<int64_t>(settings_.max_tokens_limit, max_len - n_prompt)));
  req.stop_token_ids = gen.stop_token_ids;
  req.ignore_eos = gen.ignore_eos;
  req.prompt_logprobs = gen.prompt_logprobs;
  req.images = std::move(images);
  std::vector<std::shared_ptr<runtime::RequestStream>> streams;
  for (int i = 0; i < gen.n; ++i) {
    runtime::GenerationRequest choice = req;
    if (gen.sampling.seed) choice.sampling.seed = choice_seed(*gen.sampling.seed, i);
    if (constraint) choice.constraint = constraint();
    runtime::Submission s = scheduler_.submit(std::move(choice));
    if (s.code == runtime::SubmitCode::ok) {
      streams.push_back(std::move(s.stream));
      continue;
    }
    for (const auto& queued : streams) queued->cancel();
    switch (s.code) {
      case runtime::SubmitCode::invalid: return bad_request(s.message, s.param);
      case runtime::SubmitCode::too_large: return bad_request(s.message, "max_tokens", "kv_capacity_exceeded");
      case runtime::SubmitCode::queue_full: return ApiError{503, s.message, "server_overloaded", "", "queue_full"};
      case runtime::SubmitCode::draining: return ApiError{503, s.message, "server_unavailable", "", "shutting_down"};
      default: return ApiError{500, "unknown submit result", "server_error", "", ""};
    }
  }
  return streams;
}

std::optional<ApiError> OpenAiApi::unknown_model(const std::string& requested) const {
  if (requested.empty() || requested == model_.id) return std::nullopt;
  return ApiError{404, "The model `" + requested + "` does not exist; this server serves `" + model_.id +
                           "` (GET /v1/models lists it)",
                  "invalid_request_error", "model", "model_not_found"};
}

Json OpenAiApi::model_json() const {
  Json m;
  m["id"] = model_.id;
  m["object"] = "model";
  m["created"] = unix_now();
  m["owned_by"] = "spillway";
  m["max_model_len"] = settings_.max_model_len;
  return m;
}

HttpReply OpenAiApi::models() const {
  Json out;
  out["object"] = "list";
  out["data"] = Json::array({model_json()});
  return HttpReply::json(out);
}

HttpReply OpenAiApi::model(const std::string& id) const {
  if (id != model_.id)
    return HttpReply::error({404, "The model '" + id + "' does not exist; this server serves '" + model_.id + "'.",
                             "invalid_request_error", "model", "model_not_found"});
  return HttpReply::json(model_json());
}

HttpReply OpenAiApi::tokenize(const std::string& body) const {
  auto j = parse_body(body);
  if (!j.ok) return HttpReply::error(j.error);
  auto req = parse_tokenize_request(j.value);
  if (!req.ok) return HttpReply::error(req.error);
  std::vector<int32_t> ids;
  if (req.value.has_messages) {
    auto chat = parse_chat_completion_request(j.value);
    if (!chat.ok) return HttpReply::error(chat.error);
    auto p = chat_prompt(j.value, chat.value);
    if (!p.ok) return HttpReply::error(p.error);
    ids = std::move(p.value.ids);
  } else {
    auto e = text_.encode(*req.value.prompt, req.value.add_special_tokens);
    if (!e.ok()) return HttpReply::error(bad_request(e.error().message, "prompt"));
    ids = std::move(e.value());
  }
  Json out;
  out["count"] = ids.size();
  out["max_model_len"] = settings_.max_model_len;
  out["tokens"] = ids;
  return HttpReply::json(out);
}

HttpReply OpenAiApi::detokenize(const std::string& body) const {
  auto j = parse_body(body);
  if (!j.ok) return HttpReply::error(j.error);
  auto ids = parse_detokenize_request(j.value);
  if (!ids.ok) return HttpReply::error(ids.error);
  if (!text_.has_tokenizer()) return HttpReply::error(bad_request("this model has no tokenizer.json", "tokens"));
  Json out;
  out["prompt"] = text_.decode(ids.value, false);
  return HttpReply::json(out);
}

Json completion_envelope(const std::string& id, const char* object, int64_t created, const ModelInfo& model,
                         Json choices) {
  Json c;
  c["id"] = id;
  c["object"] = object;
  c["created"] = created;
  c["model"] = model.id;
  c["system_fingerprint"] = model.system_fingerprint;
  c["choices"] = std::move(choices);
  return c;
}

void write_stream_end(const SseWrite& write, const std::string& id, const char* object, int64_t created,
                      const ModelInfo& model, const RunList& runs, bool include_usage, size_t runs_per_prompt) {
  if (include_usage) {
    Json c = completion_envelope(id, object, created, model, Json::array());
    c["usage"] = usage_json(runs, runs_per_prompt);
    if (!write("data: " + dump_json(c) + "\n\n")) return;
  }
  write("data: [DONE]\n\n");
}

}  // namespace spw::server
