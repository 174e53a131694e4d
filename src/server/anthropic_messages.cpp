// POST /v1/messages: the Anthropic Messages API over the chat path of /v1/chat/completions.
// anthropic_request.cpp rewrites the body into the chat machinery's inputs; chat_prompt() encodes
// it (and builds the tool-call grammar for tool_choice any / tool), submit() queues it, and the
// stream parser's deltas become Anthropic content blocks (anthropic_response.cpp).
#include "server/anthropic_request.h"
#include "server/anthropic_response.h"
#include "server/http_server.h"
#include "server/openai_api.h"
#include "server/grammar_constraint.h"

namespace spw::server {
namespace {

constexpr auto kPingEvery = std::chrono::milliseconds(2000);  // a ping event after 2 s of silence
constexpr auto kGonePoll = std::chrono::milliseconds(200);    // non-streaming: how often the connection is probed

HttpReply error_reply(const ApiError& e) { return anthropic_error_reply(e); }

struct StopInfo {
  std::string reason;
  Json sequence;  // the stop sequence that matched, or null
};

StopInfo stop_info(const std::string& finish, const GenerationRun& run, bool any_tool_use) {
  if (finish == "length") return {"max_tokens", Json()};
  if (!run.stop_sequence().empty()) return {"stop_sequence", run.stop_sequence()};
  return {any_tool_use ? "tool_use" : "end_turn", Json()};
}

Json message_json(const std::string& id, const std::string& model, Json content, const Json& stop_reason,
                  const Json& stop_sequence, Json usage) {
  return Json{{"id", id},
              {"type", "message"},
              {"role", "assistant"},
              {"model", model},
              {"content", std::move(content)},
              {"stop_reason", stop_reason},
              {"stop_sequence", stop_sequence},
              {"usage", std::move(usage)}};
}

Json usage(int64_t input_tokens, int64_t output_tokens) {
  return Json{{"input_tokens", input_tokens}, {"output_tokens", output_tokens}};
}

}  // namespace

HttpReply OpenAiApi::messages(const std::string& body, const ClientGone& gone) {
  auto j = parse_body(body);
  if (!j.ok) return error_reply(j.error);
  auto parsed = parse_messages_request(j.value);
  if (!parsed.ok) return error_reply(parsed.error);
  const MessagesRequest& req = parsed.value;
  if (!text_.has_tokenizer())
    return error_reply(bad_request("messages need a tokenizer and " + settings_.model_dir + " has no tokenizer.json"));
  auto prompt = chat_prompt(req.chat_body, req.chat);
  if (!prompt.ok) return error_reply(prompt.error);
  MakeConstraint constraint;
  if (prompt.value.grammar) {
    constraint = [grammar = prompt.value.grammar, trie = text_.token_trie(), eos = model_.eos_id] {
      return std::make_shared<ToolCallConstraint>(grammar, trie, eos);
    };
  }
  const int64_t n_prompt = int64_t(prompt.value.ids.size());
  auto streams = submit(std::move(prompt.value.ids), req.chat.gen, "messages", constraint, prompt.value.images);
  if (!streams.ok) return error_reply(streams.error);

  std::string id = make_request_id("msg");
  id[3] = '_';
  auto run = std::make_shared<GenerationRun>(text_, streams.value[0], req.chat.gen, model_.eos_id,
                                             /*skip_special=*/false);
  StreamParserOptions popts;
  popts.thinking = prompt.value.thinking;
  popts.tool_calls = req.chat.tool_choice != "none";
  popts.tool_call_id_prefix = "toolu_" + id.substr(id.size() - 16) + "_";
  auto parser = std::make_shared<StreamParser>(popts);
  const std::string model = model_.id;
  const RunList runs{run};

  if (!req.chat.gen.stream) {
    ContentBlocks blocks;
    std::string finish;
    std::optional<ApiError> failed;
    const bool finished = drive_runs(
        runs,
        [&](size_t, GenerationRun::Update& update) {
          if (update.finish_reason && *update.finish_reason == "error") {
            failed = ApiError{500, update.error, "api_error", "", ""};
            return false;
          }
          blocks.push(parser->push(update.text));
          if (update.finish_reason) {
            blocks.push(parser->finish());
            finish = *update.finish_reason;
          }
          return true;
        },
        [&](bool) { return !(gone && gone()); }, kGonePoll);
    if (failed) return error_reply(*failed);
    if (!finished) return error_reply({499, "the client closed the connection", "client_closed", "", ""});
    blocks.close();
    const StopInfo stop = stop_info(finish, *run, blocks.any_tool_use());
    return HttpReply::json(message_json(id, model, blocks.content(), stop.reason, stop.sequence,
                                        usage(run->n_prompt_tokens(), run->n_completion_tokens())));
  }

  HttpReply reply;
  reply.content_type = "text/event-stream";
  reply.sse = [run, runs, parser, id, model, n_prompt](const SseWrite& write) {
    auto event = [&](const char* name, const Json& data) { return write(anthropic_sse(name, data)); };
    if (!event("message_start", Json{{"type", "message_start"},
                                     {"message", message_json(id, model, Json::array(), Json(), Json(),
                                                              usage(n_prompt, 0))}}) ||
        !event("ping", Json{{"type", "ping"}})) {
      run->cancel();
      return;
    }
    ContentBlocks blocks(event);
    std::string finish;
    bool failed = false;
    const bool finished = drive_runs(
        runs,
        [&](size_t, GenerationRun::Update& update) {
          if (update.finish_reason && *update.finish_reason == "error") {
            event("error", anthropic_error_json({500, update.error, "api_error", "", ""}));
            failed = true;
            return false;
          }
          blocks.push(parser->push(update.text));
          if (update.finish_reason) {
            blocks.push(parser->finish());
            finish = *update.finish_reason;
          }
          return blocks.ok();
        },
        [&](bool idle) { return !idle || event("ping", Json{{"type", "ping"}}); }, kPingEvery);
    if (failed || !finished) return;
    blocks.close();
    if (!blocks.ok()) return;
    const StopInfo stop = stop_info(finish, *run, blocks.any_tool_use());
    if (!event("message_delta", Json{{"type", "message_delta"},
                                     {"delta", Json{{"stop_reason", stop.reason}, {"stop_sequence", stop.sequence}}},
                                     {"usage", usage(run->n_prompt_tokens(), run->n_completion_tokens())}}))
      return;
    event("message_stop", Json{{"type", "message_stop"}});
  };
  return reply;
}

}  // namespace spw::server
