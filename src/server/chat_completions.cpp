// POST /v1/chat/completions: messages → prompt via src/chat (DeepSeek V4/V4.1 encoding), output
// text → reasoning_content / content / tool_calls via src/chat's streaming parser.
#include "chat/stream_parser.h"
#include "server/openai_api.h"
#include "server/grammar_constraint.h"
#include "server/response_format.h"

namespace spw::server {
namespace {

constexpr auto kPingEvery = std::chrono::milliseconds(2000);  // an SSE comment after 2 s of silence
constexpr auto kGonePoll = std::chrono::milliseconds(200);    // non-streaming: how often the connection is probed

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

// A whole call (message.tool_calls), or in a stream (with_index) a call's first delta or, without
// an id, a fragment of its arguments.
Json tool_call_json(int index, const std::string& id, const std::string& name, const std::string& args, bool with_index) {
  Json c;
  if (with_index) c["index"] = index;
  if (with_index && id.empty()) {
    c["function"] = Json{{"arguments", args}};
    return c;
  }
  c["id"] = id;
  c["type"] = "function";
  c["function"] = Json{{"name", name}, {"arguments", args}};
  return c;
}

std::string final_reason(const std::string& reason, bool any_tool_calls) {
  return reason == "stop" && any_tool_calls ? "tool_calls" : reason;
}

}  // namespace

ApiResult<OpenAiApi::ChatPrompt> OpenAiApi::chat_prompt(const Json& body, const ChatCompletionRequest& req) const {
  auto chat = parse_chat_request(body, model_.family);
  if (!chat.ok()) return bad_request(chat.error().message, "messages");
  ChatRequest& c = chat.value();
  auto images = chat_images(c);
  if (!images.ok) return images.error;
  const bool named = req.tool_choice.starts_with("function:");
  if (req.tool_choice == "none") {
    c.tools.clear();
  } else if (req.tool_choice == "required" && c.tools.empty()) {
    return bad_request("tool_choice is \"required\" but no tools were given", "tool_choice");
  } else if (named) {
    const std::string name = req.tool_choice.substr(9);
    std::erase_if(c.tools, [&](const ToolSpec& t) { return !t.function.contains("name") || t.function["name"] != name; });
    if (c.tools.empty()) return bad_request("tool_choice names \"" + name + "\", which is not among the tools", "tool_choice");
  }
  ChatPrompt out;
  out.thinking = c.options.thinking;
  if (named || req.tool_choice == "required") {
    ToolCallGrammarOptions options;
    options.family = model_.family;
    options.thinking = c.options.thinking;
    options.parallel = req.parallel_tool_calls;
    auto grammar = ToolCallGrammar::build(c.tools, options);
    if (!grammar.ok()) return bad_request("tool_choice " + req.tool_choice + ": " + grammar.error().message, "tools");
    out.grammar = std::make_shared<const ToolCallGrammar>(std::move(grammar.value()));
  }
  auto prompt = encode_chat_prompt(c);
  if (!prompt.ok()) return bad_request(prompt.error().message, "messages");
  auto ids = text_.encode_with_plain_spans(prompt->text, prompt->client_spans);
  if (!ids.ok()) return bad_request(ids.error().message, "messages");
  out.ids = std::move(ids.value());
  if (!images.value.empty()) {
    auto encoded = prompt_images(out.ids, images.value);
    if (!encoded.ok) return encoded.error;
    out.images = std::move(encoded.value);
  }
  return out;
}

HttpReply OpenAiApi::chat_completions(const std::string& body, const ClientGone& gone) {
  auto j = parse_body(body);
  if (!j.ok) return HttpReply::error(j.error);
  auto parsed = parse_chat_completion_request(j.value);
  if (!parsed.ok) return HttpReply::error(parsed.error);
  const ChatCompletionRequest& req = parsed.value;
  if (auto e = unknown_model(req.model)) return HttpReply::error(*e);
  if (!text_.has_tokenizer())
    return HttpReply::error(bad_request("chat needs a tokenizer and " + settings_.model_dir +
                                            " has no tokenizer.json; use /v1/completions with token ids",
                                        "messages"));
  auto prompt = chat_prompt(j.value, req);
  if (!prompt.ok) return HttpReply::error(prompt.error);
  const bool thinking = prompt.value.thinking;
  auto format = response_format_constraint(req.gen.response_format, text_, model_.eos_id);
  if (!format.ok) return HttpReply::error(format.error);
  MakeConstraint constraint = format.value;
  if (constraint && prompt.value.grammar)
    return HttpReply::error(bad_request("response_format cannot be combined with tool_choice \"required\" or a named "
                                        "function; send one of them",
                                        "response_format"));
  if (constraint && thinking)
    return HttpReply::error(bad_request("response_format is not supported with thinking; turn thinking off",
                                        "response_format"));
  if (prompt.value.grammar) {
    constraint = [grammar = prompt.value.grammar, trie = text_.token_trie(), eos = model_.eos_id] {
      return std::make_shared<ToolCallConstraint>(grammar, trie, eos);
    };
  }
  auto streams = submit(std::move(prompt.value.ids), req.gen, "messages", constraint, prompt.value.images);
  if (!streams.ok) return HttpReply::error(streams.error);

  const std::string id = make_request_id("chatcmpl");
  RunList runs;
  std::vector<std::shared_ptr<StreamParser>> parsers;
  for (size_t i = 0; i < streams.value.size(); ++i) {
    runs.push_back(std::make_shared<GenerationRun>(text_, streams.value[i], req.gen, model_.eos_id, /*skip_special=*/false));
    StreamParserOptions popts;
    popts.thinking = thinking;
    popts.tool_calls = req.tool_choice != "none";
    popts.stream_arguments = req.gen.stream;  // a streamed call's arguments arrive as they are generated
    // Unique per request and choice.
    popts.tool_call_id_prefix = "call_" + id.substr(id.size() - 16) + "_" + (i ? std::to_string(i) + "_" : "");
    parsers.push_back(std::make_shared<StreamParser>(popts));
  }
  const bool want_logprobs = req.gen.sampling.top_logprobs >= 0;
  const int64_t created = unix_now();
  const ModelInfo model = model_;
  const Text& text = text_;

  if (!req.gen.stream) {
    struct Out {
      ParsedCompletion msg;
      std::vector<runtime::GeneratedToken> toks;
      std::string finish;
    };
    std::vector<Out> outs(runs.size());
    std::optional<ApiError> failed;
    const bool finished = drive_runs(
        runs,
        [&](size_t i, GenerationRun::Update& update) {
          Out& o = outs[i];
          if (update.finish_reason && *update.finish_reason == "error") {
            failed = ApiError{500, update.error, "server_error", "", ""};
            return false;
          }
          append_delta(o.msg, parsers[i]->push(update.text));
          for (auto& t : update.tokens) o.toks.push_back(std::move(t));
          if (update.finish_reason) {
            append_delta(o.msg, parsers[i]->finish());
            o.finish = final_reason(*update.finish_reason, !o.msg.tool_calls.empty());
          }
          return true;
        },
        [&](bool) { return !(gone && gone()); }, kGonePoll);
    if (failed) return HttpReply::error(*failed);
    if (!finished) return HttpReply::error({499, "the client closed the connection", "client_closed", "", ""});
    Json choices = Json::array();
    for (size_t i = 0; i < outs.size(); ++i) {
      const ParsedCompletion& out = outs[i].msg;
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
      choice["index"] = i;
      choice["message"] = msg;
      choice["logprobs"] = want_logprobs ? chat_logprobs(text, outs[i].toks) : Json();
      choice["finish_reason"] = outs[i].finish;
      choices.push_back(std::move(choice));
    }
    Json r = completion_envelope(id, "chat.completion", created, model, std::move(choices));
    r["usage"] = usage_json(runs);
    return HttpReply::json(r);
  }

  HttpReply reply;
  reply.content_type = "text/event-stream";
  const bool include_usage = req.gen.include_usage;
  reply.sse = [runs, parsers, id, created, model, want_logprobs, include_usage, &text](const SseWrite& write) {
    auto chunk = [&](size_t index, const Json& delta, const std::vector<runtime::GeneratedToken>& toks,
                     const Json& finish) {
      Json choice;
      choice["index"] = index;
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
    for (size_t i = 0; i < runs.size(); ++i)
      if (!write(chunk(i, Json{{"role", "assistant"}, {"content", ""}}, {}, Json()))) {
        for (const auto& run : runs) run->cancel();
        return;
      }
    std::vector<bool> any_tool_calls(runs.size(), false);
    bool failed = false;
    const bool finished = drive_runs(
        runs,
        [&](size_t i, GenerationRun::Update& update) {
          if (update.finish_reason && *update.finish_reason == "error") {
            write("data: " + dump_json(error_json({500, update.error, "server_error", "", ""})) + "\n\n");
            failed = true;
            return false;
          }
          StreamDelta d = parsers[i]->push(update.text);
          if (update.finish_reason) {
            append_delta(d, parsers[i]->finish());
          }
          if (!d.tool_calls.empty()) any_tool_calls[i] = true;
          if ((!d.empty() || !update.tokens.empty()) && !write(chunk(i, delta_json(d), update.tokens, Json()))) return false;
          return !update.finish_reason ||
                 write(chunk(i, Json::object(), {}, final_reason(*update.finish_reason, any_tool_calls[i])));
        },
        [&](bool idle) { return !idle || write(": ping\n\n"); }, kPingEvery);
    if (failed) {
      write("data: [DONE]\n\n");
      return;
    }
    if (finished) write_stream_end(write, id, "chat.completion.chunk", created, model, runs, include_usage);
  };
  return reply;
}

}  // namespace spw::server
