// POST /v1/completions: prompt as text or token ids; streaming (SSE) or one JSON body.
#include "server/openai_api.h"

namespace spw::server {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(200);
constexpr int kPingEveryPolls = 10;  // an SSE comment every ~2 s of silence detects gone clients

// OpenAI's legacy logprobs object, grown token by token.
struct CompletionLogprobs {
  Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(),
       text_offset = Json::array();
  size_t offset = 0;

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

HttpReply OpenAiApi::completions(const std::string& body) {
  auto j = parse_body(body);
  if (!j.ok) return HttpReply::error(j.error);
  auto parsed = parse_completion_request(j.value);
  if (!parsed.ok) return HttpReply::error(parsed.error);
  const CompletionRequest& req = parsed.value;

  std::vector<int32_t> ids;
  std::string echo_text;
  if (const auto* s = std::get_if<std::string>(&req.prompt)) {
    auto enc = text_.encode(*s, true);
    if (!enc.ok()) return HttpReply::error(bad_request(enc.error().message, "prompt"));
    ids = std::move(enc.value());
    if (req.echo) echo_text = *s;
  } else {
    ids = std::get<std::vector<int32_t>>(req.prompt);
    if (req.echo) echo_text = text_.decode(ids, false);
  }
  auto stream = submit(std::move(ids), req.gen, "prompt");
  if (!stream.ok) return HttpReply::error(stream.error);

  auto run = std::make_shared<GenerationRun>(text_, stream.value, req.gen, model_.eos_id, /*skip_special=*/true);
  const bool want_logprobs = req.gen.sampling.top_logprobs >= 0;
  const std::string id = make_request_id("cmpl");
  const int64_t created = unix_now();
  const std::string model = model_.id;
  const Text& text = text_;

  if (!req.gen.stream) {
    std::string out = echo_text;
    std::vector<runtime::GeneratedToken> toks;
    CompletionLogprobs lp;
    std::string finish;
    for (;;) {
      GenerationRun::Step step = run->next(kPoll);
      out += step.text;
      for (auto& t : step.tokens) {
        if (want_logprobs) lp.add(text, t);
        toks.push_back(std::move(t));
      }
      if (step.finish_reason) {
        if (*step.finish_reason == "error") return HttpReply::error({500, step.error, "server_error", "", ""});
        finish = *step.finish_reason;
        break;
      }
    }
    Json choice;
    choice["index"] = 0;
    choice["text"] = out;
    choice["logprobs"] = want_logprobs ? lp.json() : Json();
    choice["finish_reason"] = finish;
    choice["token_ids"] = token_ids_json(toks);
    Json r = completion_envelope(id, "text_completion", created, model, Json::array({choice}));
    r["usage"] = usage_json(*run);
    return HttpReply::json(r);
  }

  HttpReply reply;
  reply.content_type = "text/event-stream";
  const bool include_usage = req.gen.include_usage;
  reply.sse = [run, id, created, model, want_logprobs, include_usage, echo_text, &text](const SseWrite& write) {
    auto chunk = [&](const std::string& piece, const std::vector<runtime::GeneratedToken>& toks, const Json& finish) {
      Json choice;
      choice["index"] = 0;
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
    if (!echo_text.empty() && !write(chunk(echo_text, {}, Json()))) return run->cancel();
    int idle = 0;
    for (;;) {
      GenerationRun::Step step = run->next(kPoll);
      if (step.finish_reason && *step.finish_reason == "error") {
        write("data: " + dump_json(error_json({500, step.error, "server_error", "", ""})) + "\n\n");
        write("data: [DONE]\n\n");
        return;
      }
      if (!step.text.empty() || !step.tokens.empty()) {
        idle = 0;
        if (!write(chunk(step.text, step.tokens, Json()))) return run->cancel();
      } else if (!step.finish_reason && ++idle % kPingEveryPolls == 0) {
        if (!write(": ping\n\n")) return run->cancel();
      }
      if (step.finish_reason) {
        if (!write(chunk("", {}, *step.finish_reason))) return;
        break;
      }
    }
    write_stream_end(write, id, "text_completion", created, model, *run, include_usage);
  };
  return reply;
}

}  // namespace spw::server
