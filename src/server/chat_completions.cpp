// POST /v1/chat/completions: messages → prompt via src/chat (DeepSeek V4/V4.1 encoding), output
// text → reasoning_content / content / tool_calls via src/chat's streaming parser.
#include "chat/stream_parser.h"
#include "server/openai_api.h"

namespace spw::server {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(200);
constexpr int kPingEveryPolls = 10;

Json bytes_json(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

Json chat_logprobs(const Text& text, const std::vector<runtime::GeneratedToken>& toks) {
  Json content = Json::array();
  for (const auto& t : toks) {
    const std::string s = text.token_text(t.id);
    Json top = Json::array();
    for (const auto& alt : t.top) {
      const std::string a = text.token_text(alt.id);
      top.push_back(Json{{"token", a}, {"logprob", alt.logprob}, {"bytes", bytes_json(a)}});
    }
    content.push_back(Json{{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_json(s)}, {"top_logprobs", top}});
  }
  return Json{{"content", content}};
}

Json tool_call_json(int index, const std::string& id, const std::string& name, const std::string& args, bool with_index) {
  Json c;
  if (with_index) c["index"] = index;
  c["id"] = id;
  c["type"] = "function";
  c["function"] = Json{{"name", name}, {"arguments", args}};
  return c;
}

std::string final_reason(const std::string& reason, bool any_tool_calls) {
  return reason == "stop" && any_tool_calls ? "tool_calls" : reason;
}

}  // namespace

ApiResult<std::vector<int32_t>> OpenAiApi::chat_prompt(const Json& body, const ChatCompletionRequest& req,
                                                       bool* thinking) const {
  auto chat = parse_chat_request(body, model_.family);
  if (!chat.ok()) return bad_request(chat.error().message, "messages");
  ChatRequest& c = chat.value();
  if (req.tool_choice == "none") {
    c.tools.clear();
  } else if (req.tool_choice == "required" && c.tools.empty()) {
    return bad_request("tool_choice is \"required\" but no tools were given", "tool_choice");
  } else if (req.tool_choice.starts_with("function:")) {
    const std::string name = req.tool_choice.substr(9);
    std::erase_if(c.tools, [&](const ToolSpec& t) { return !t.function.contains("name") || t.function["name"] != name; });
    if (c.tools.empty()) return bad_request("tool_choice names \"" + name + "\", which is not among the tools", "tool_choice");
  }
  *thinking = c.options.thinking;
  auto prompt = encode_chat(c);
  if (!prompt.ok()) return bad_request(prompt.error().message, "messages");
  auto ids = text_.encode(prompt.value(), /*parse_special=*/true);
  if (!ids.ok()) return bad_request(ids.error().message, "messages");
  return std::move(ids.value());
}

HttpReply OpenAiApi::chat_completions(const std::string& body) {
  auto j = parse_body(body);
  if (!j.ok) return HttpReply::error(j.error);
  auto parsed = parse_chat_completion_request(j.value);
  if (!parsed.ok) return HttpReply::error(parsed.error);
  const ChatCompletionRequest& req = parsed.value;
  if (!text_.has_tokenizer())
    return HttpReply::error(bad_request("chat needs a tokenizer and " + settings_.model_dir +
                                            " has no tokenizer.json; use /v1/completions with token ids",
                                        "messages"));
  bool thinking = false;
  auto ids = chat_prompt(j.value, req, &thinking);
  if (!ids.ok) return HttpReply::error(ids.error);
  auto stream = submit(std::move(ids.value), req.gen, "messages");
  if (!stream.ok) return HttpReply::error(stream.error);

  auto run = std::make_shared<GenerationRun>(text_, stream.value, req.gen, model_.eos_id, /*skip_special=*/false);
  const std::string id = make_request_id("chatcmpl");
  StreamParserOptions popts;
  popts.thinking = thinking;
  popts.tool_call_id_prefix = "call_" + id.substr(id.size() - 16) + "_";  // unique per request
  auto parser = std::make_shared<StreamParser>(popts);
  const bool want_logprobs = req.gen.sampling.top_logprobs >= 0;
  const int64_t created = unix_now();
  const std::string model = model_.id;
  const Text& text = text_;

  if (!req.gen.stream) {
    ParsedCompletion out;
    std::vector<runtime::GeneratedToken> toks;
    std::string finish;
    for (;;) {
      GenerationRun::Step step = run->next(kPoll);
      append_delta(out, parser->push(step.text));
      for (auto& t : step.tokens) toks.push_back(std::move(t));
      if (step.finish_reason) {
        if (*step.finish_reason == "error") return HttpReply::error({500, step.error, "server_error", "", ""});
        append_delta(out, parser->finish());
        finish = final_reason(*step.finish_reason, !out.tool_calls.empty());
        break;
      }
    }
    Json msg;
    msg["role"] = "assistant";
    msg["content"] = out.content.empty() && !out.tool_calls.empty() ? Json() : Json(out.content);
    if (thinking || !out.reasoning_content.empty()) msg["reasoning_content"] = out.reasoning_content;
    if (!out.tool_calls.empty()) {
      Json calls = Json::array();
      for (const auto& c : out.tool_calls) calls.push_back(tool_call_json(0, c.id, c.name, c.arguments, false));
      msg["tool_calls"] = calls;
    }
    Json choice;
    choice["index"] = 0;
    choice["message"] = msg;
    choice["logprobs"] = want_logprobs ? chat_logprobs(text, toks) : Json();
    choice["finish_reason"] = finish;
    Json r = completion_envelope(id, "chat.completion", created, model, Json::array({choice}));
    r["usage"] = usage_json(*run);
    return HttpReply::json(r);
  }

  HttpReply reply;
  reply.content_type = "text/event-stream";
  const bool include_usage = req.gen.include_usage;
  reply.sse = [run, parser, id, created, model, want_logprobs, include_usage, &text](const SseWrite& write) {
    auto chunk = [&](const Json& delta, const std::vector<runtime::GeneratedToken>& toks, const Json& finish) {
      Json choice;
      choice["index"] = 0;
      choice["delta"] = delta;
      choice["logprobs"] = want_logprobs && !toks.empty() ? chat_logprobs(text, toks) : Json();
      choice["finish_reason"] = finish;
      Json c = completion_envelope(id, "chat.completion.chunk", created, model, Json::array({choice}));
      return "data: " + dump_json(c) + "\n\n";
    };
    auto delta_json = [](const StreamDelta& d) {
      Json delta = Json::object();
      if (!d.reasoning_content.empty()) delta["reasoning_content"] = d.reasoning_content;
      if (!d.content.empty()) delta["content"] = d.content;
      if (!d.tool_calls.empty()) {
        Json calls = Json::array();
        for (const auto& c : d.tool_calls) calls.push_back(tool_call_json(c.index, c.id, c.name, c.arguments, true));
        delta["tool_calls"] = calls;
      }
      return delta;
    };
    if (!write(chunk(Json{{"role", "assistant"}, {"content", ""}}, {}, Json()))) return run->cancel();
    bool any_tool_calls = false;
    int idle = 0;
    for (;;) {
      GenerationRun::Step step = run->next(kPoll);
      if (step.finish_reason && *step.finish_reason == "error") {
        write("data: " + dump_json(error_json({500, step.error, "server_error", "", ""})) + "\n\n");
        write("data: [DONE]\n\n");
        return;
      }
      StreamDelta d = parser->push(step.text);
      if (step.finish_reason) {
        StreamDelta tail = parser->finish();
        d.reasoning_content += tail.reasoning_content;
        d.content += tail.content;
        for (auto& c : tail.tool_calls) d.tool_calls.push_back(std::move(c));
      }
      any_tool_calls = any_tool_calls || !d.tool_calls.empty();
      if (!d.empty() || !step.tokens.empty()) {
        idle = 0;
        if (!write(chunk(delta_json(d), step.tokens, Json()))) return run->cancel();
      } else if (!step.finish_reason && ++idle % kPingEveryPolls == 0) {
        if (!write(": ping\n\n")) return run->cancel();
      }
      if (step.finish_reason) {
        if (!write(chunk(Json::object(), {}, final_reason(*step.finish_reason, any_tool_calls)))) return;
        break;
      }
    }
    write_stream_end(write, id, "chat.completion.chunk", created, model, *run, include_usage);
  };
  return reply;
}

}  // namespace spw::server
