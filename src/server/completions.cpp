// POST /v1/completions: prompt as text or token ids, or a batch of either (choices indexed
// prompt-major: prompt p, choice i → p·n + i, as OpenAI does); streaming (SSE) or one JSON body.
#include "server/openai_api.h"
#include "server/response_format.h"

namespace spw::server {
namespace {

constexpr auto kPingEvery = std::chrono::milliseconds(2000);  // an SSE comment after 2 s of silence detects gone clients
constexpr auto kGonePoll = std::chrono::milliseconds(200);    // non-streaming: how often the connection is probed

// OpenAI's legacy logprobs object, grown token by token.
struct CompletionLogprobs {
  Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(),
       text_offset = Json::array();
  size_t offset = 0;

  // The first prompt token, which nothing predicts: null logprobs, as OpenAI and vLLM report it.
  void add_unscored(const Text& text, int32_t id) {
    const std::string s = text.token_text(id);
    tokens.push_back(s);
    token_logprobs.push_back(nullptr);
    top_logprobs.push_back(nullptr);
    text_offset.push_back(offset);
    offset += s.size();
  }
  void add(const Text& text, const runtime::GeneratedToken& t) {
    const std::string s = text.token_text(t.id);
    tokens.push_back(s);
    token_logprobs.push_back(t.logprob);
    Json top = Json::object();
    for (const auto& alt : t.top) top[text.token_text(alt.id)] = alt.logprob;
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(offset);
    offset += s.size();
  }
  Json json() const {
    return Json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs},
                {"text_offset", text_offset}};
  }
};

Json token_ids_json(const std::vector<runtime::GeneratedToken>& toks) {
  Json ids = Json::array();
  for (const auto& t : toks) ids.push_back(t.id);
  return ids;
}

}  // namespace

HttpReply OpenAiApi::completions(const std::string& body, const ClientGone& gone) {
  auto j = parse_body(body);
  if (!j.ok) return HttpReply::error(j.error);
  auto parsed = parse_completion_request(j.value);
  if (!parsed.ok) return HttpReply::error(parsed.error);
  const CompletionRequest& req = parsed.value;
  if (auto e = unknown_model(req.model)) return HttpReply::error(*e);
  auto format = response_format_constraint(req.gen.response_format, text_, model_.eos_id);
  if (!format.ok) return HttpReply::error(format.error);

  // Every prompt's sequences are submitted before any output is read: all or none (an early
  // return drops the runs made so far, which cancels their sequences).
  RunList runs;
  std::vector<std::string> echo_texts;  // per run
  std::vector<std::vector<int32_t>> prompt_ids;  // per run
  for (size_t p = 0; p < req.prompts.size(); ++p) {
    std::vector<int32_t> ids;
    std::string echo_text;
    if (const auto* s = std::get_if<std::string>(&req.prompts[p])) {
      auto enc = text_.encode(*s, true);
      if (!enc.ok()) return HttpReply::error(bad_request(enc.error().message, "prompt"));
      ids = std::move(enc.value());
      if (req.echo) echo_text = *s;
    } else {
      ids = std::get<std::vector<int32_t>>(req.prompts[p]);
      if (req.echo) echo_text = text_.decode(ids, false);
    }
    const std::vector<int32_t> ids_copy = req.gen.prompt_logprobs ? ids : std::vector<int32_t>{};
    auto streams = submit(std::move(ids), req.gen, "prompt", format.value);
    if (!streams.ok) return HttpReply::error(streams.error);
    for (auto& stream : streams.value) {
      runs.push_back(std::make_shared<GenerationRun>(text_, stream, req.gen, model_.eos_id, /*skip_special=*/true));
      echo_texts.push_back(echo_text);
      prompt_ids.push_back(ids_copy);
    }
  }
  const size_t runs_per_prompt = size_t(req.gen.n);
  const bool want_logprobs = req.gen.sampling.top_logprobs >= 0;
  const std::string id = make_request_id("cmpl");
  const int64_t created = unix_now();
  const ModelInfo model = model_;
  const Text& text = text_;

  if (!req.gen.stream) {
    struct Out {
      std::string text;
      std::vector<runtime::GeneratedToken> toks;
      CompletionLogprobs lp;
      std::string finish;
    };
    std::vector<Out> outs(runs.size());
    for (size_t i = 0; i < outs.size(); ++i) outs[i].text = echo_texts[i];
    // With echo and logprobs the prompt's tokens come first; the scheduler scores them during
    // prefill, before any generated token arrives.
    auto add_prompt_logprobs = [&](size_t i) {
      if (!req.gen.prompt_logprobs || prompt_ids[i].empty()) return;
      CompletionLogprobs lp;
      lp.add_unscored(text, prompt_ids[i][0]);
      for (const auto& t : runs[i]->prompt_logprobs()) lp.add(text, t);
      outs[i].lp = std::move(lp);
    };
    std::vector<bool> scored(runs.size(), false);
    std::optional<ApiError> failed;
    const bool finished = drive_runs(
        runs,
        [&](size_t i, GenerationRun::Update& update) {
          Out& o = outs[i];
          if (!scored[i] && (!update.tokens.empty() || update.finish_reason)) {
            add_prompt_logprobs(i);
            scored[i] = true;
          }
          o.text += update.text;
          for (auto& t : update.tokens) {
            if (want_logprobs) o.lp.add(text, t);
            o.toks.push_back(std::move(t));
          }
          if (update.finish_reason && *update.finish_reason == "error") {
            failed = ApiError{500, update.error, "server_error", "", ""};
            return false;
          }
          if (update.finish_reason) o.finish = *update.finish_reason;
          return true;
        },
        [&](bool) { return !(gone && gone()); }, kGonePoll);
    if (failed) return HttpReply::error(*failed);
    if (!finished) return HttpReply::error({499, "the client closed the connection", "client_closed", "", ""});
    Json choices = Json::array();
    for (size_t i = 0; i < outs.size(); ++i) {
      Json choice;
      choice["index"] = i;
      choice["text"] = outs[i].text;
      choice["logprobs"] = want_logprobs ? outs[i].lp.json() : Json();
      choice["finish_reason"] = outs[i].finish;
      choice["token_ids"] = token_ids_json(outs[i].toks);
      choices.push_back(std::move(choice));
    }
    Json r = completion_envelope(id, "text_completion", created, model, std::move(choices));
    r["usage"] = usage_json(runs, runs_per_prompt);
    return HttpReply::json(r);
  }

  HttpReply reply;
  reply.content_type = "text/event-stream";
  const bool include_usage = req.gen.include_usage;
  reply.sse = [runs, id, created, model, want_logprobs, include_usage, echo_texts, runs_per_prompt,
               &text](const SseWrite& write) {
    auto chunk = [&](size_t index, const std::string& piece, const std::vector<runtime::GeneratedToken>& toks,
                     const Json& finish) {
      Json choice;
      choice["index"] = index;
      choice["text"] = piece;
      if (want_logprobs && !toks.empty()) {
        CompletionLogprobs lp;
        for (const auto& t : toks) lp.add(text, t);
        choice["logprobs"] = lp.json();
      } else {
        choice["logprobs"] = Json();
      }
      choice["finish_reason"] = finish;
      choice["token_ids"] = token_ids_json(toks);
      Json c = completion_envelope(id, "text_completion", created, model, Json::array({choice}));
      return "data: " + dump_json(c) + "\n\n";
    };
    for (size_t i = 0; i < runs.size(); ++i)
      if (!echo_texts[i].empty() && !write(chunk(i, echo_texts[i], {}, Json()))) {
        for (const auto& run : runs) run->cancel();
        return;
      }
    bool failed = false;
    const bool finished = drive_runs(
        runs,
        [&](size_t i, GenerationRun::Update& update) {
          if (update.finish_reason && *update.finish_reason == "error") {
            write("data: " + dump_json(error_json({500, update.error, "server_error", "", ""})) + "\n\n");
            failed = true;
            return false;
          }
          if ((!update.text.empty() || !update.tokens.empty()) && !write(chunk(i, update.text, update.tokens, Json())))
            return false;
          return !update.finish_reason || write(chunk(i, "", {}, *update.finish_reason));
        },
        [&](bool idle) { return !idle || write(": ping\n\n"); }, kPingEvery);
    if (failed) {
      write("data: [DONE]\n\n");
      return;
    }
    if (finished)
      write_stream_end(write, id, "text_completion", created, model, runs, include_usage, runs_per_prompt);
  };
  return reply;
}

}  // namespace spw::server
