// Prompt encoding, in the official encoders' order: (V4.1) image blocks → placeholders; tool
// messages merged into user turns as <tool_result> blocks (consecutive user turns merge too);
// tool results sorted by the order of the calls they answer; in thinking mode without tools,
// turns before the last user turn lose their reasoning (V4 also drops developer turns there);
// then each turn is rendered and the assistant header follows the last user-like turn.
#include "chat/chat_encoding.h"

#include <algorithm>
#include <map>

#include "chat/dsml.h"
#include "chat/json_limits.h"
#include "chat/py_json.h"

namespace spw {

namespace tok = chat_tokens;
using ojson = nlohmann::ordered_json;

const char* chat_role_name(ChatRole role) {
  switch (role) {
    case ChatRole::system: return "system";
    case ChatRole::developer: return "developer";
    case ChatRole::user: return "user";
    case ChatRole::assistant: return "assistant";
    case ChatRole::tool: return "tool";
  }
  return "?";
}

ToolSpec make_tool(std::string name, std::string description, ojson parameters) {
  ojson f = ojson::object();
  f["name"] = std::move(name);
  f["description"] = std::move(description);
  f["parameters"] = std::move(parameters);
  return ToolSpec{std::move(f)};
}

PromptBuilder::PromptBuilder(std::string_view markup) : prompt_{std::string(markup), {}} {}

void PromptBuilder::markup(std::string_view s) { prompt_.text += s; }

void PromptBuilder::client(std::string_view s) {
  if (s.empty()) return;
  const size_t begin = prompt_.text.size();
  prompt_.text += s;
  std::vector<TextSpan>& spans = prompt_.client_spans;
  if (!spans.empty() && spans.back().end == begin) {
    spans.back().end = prompt_.text.size();
  } else {
    spans.push_back({begin, prompt_.text.size()});
  }
}

namespace {

constexpr std::string_view kReasoningEffortMaxV4 =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
    "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, "
    "and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

// The tools section; the schemas are the client's text.
void render_tools(ChatFamily family, const std::vector<ToolSpec>& tools, PromptBuilder& prompt) {
  const DsmlSpelling& s = family == ChatFamily::v4 ? kDsmlV4 : kDsmlV41;
  const std::string d(tok::dsml);
  const std::string block = d + std::string(s.block);
  const std::string invoke = d + std::string(s.invoke);
  const std::string param = d + std::string(s.parameter);
  std::string out;
  out += "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can "
         "invoke tools by writing a \"<" + block + ">\" block like the following:\n\n";
  out += "<" + block + ">\n";
  out += "<" + invoke + " name=\"$TOOL_NAME\">\n";
  out += "<" + param + " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + param + ">\n";
  out += "...\n";
  out += "</" + invoke + ">\n";
  out += "<" + invoke + " name=\"$TOOL_NAME2\">\n";
  out += "...\n";
  out += "</" + invoke + ">\n";
  out += "</" + block + ">\n\n";
  out += "String parameters should be specified as is and set `string=\"true\"`. For all other types "
         "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
         "`string=\"false\"`.\n\n";
  out += "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
         "inside <think>...</think> BEFORE any tool calls or final response.\n\n";
  out += "Otherwise, output directly after </think> with tool calls or final response.\n\n";
  out += "### Available Tool Schemas\n\n";
  prompt.markup(out);
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i) prompt.markup("\n");
    prompt.client(py_json_dumps(tools[i].function));
  }
  prompt.markup("\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
                "tool calls.\n");
}

// The argument object a call renders from. V4 json.loads() the text once and falls back to
// {"arguments": text} when it is not JSON (a JSON non-object is an error: the official code
// crashes); V4.1 also unwraps a double-encoded string and falls back for any non-object.
Result<ojson> call_arguments(ChatFamily family, const ToolCall& call, size_t i_msg, size_t i_call) {
  ojson fallback = ojson::object();
  fallback["arguments"] = call.arguments;
  auto bounded = parse_json_bounded(call.arguments);
  if (!bounded.ok()) {
    if (!ojson::accept(call.arguments)) return fallback;  // not JSON: rendered as text
    return make_error("messages[", i_msg, "].tool_calls[", i_call, "].function.arguments ", bounded.error().message);
  }
  ojson parsed = std::move(bounded).value();
  if (parsed.is_object()) return parsed;
  if (family == ChatFamily::v4) {
    return make_error("messages[", i_msg, "].tool_calls[", i_call,
                      "].function.arguments: must be a JSON object (or non-JSON text), got ",
                      parsed.type_name());
  }
  if (parsed.is_string()) {
    auto inner = parse_json_bounded(parsed.get_ref<const std::string&>());
    if (inner.ok() && inner->is_object()) return std::move(inner).value();
  }
  return fallback;
}

// A DSML tool-call block; names, keys and values are the client's text.
Status render_tool_calls(ChatFamily family, const std::vector<ToolCall>& calls, size_t i_msg,
                         PromptBuilder& prompt) {
  const DsmlSpelling& s = family == ChatFamily::v4 ? kDsmlV4 : kDsmlV41;
  const std::string d(tok::dsml);
  prompt.markup("\n\n<" + d + std::string(s.block) + ">\n");
  for (size_t i = 0; i < calls.size(); ++i) {
    auto args = call_arguments(family, calls[i], i_msg, i);
    if (!args.ok()) return args.error();
    if (i) prompt.markup("\n");
    prompt.markup("<" + d + std::string(s.invoke) + " name=\"");
    prompt.client(calls[i].name);
    prompt.markup("\">\n");
    bool first = true;
    for (const auto& [key, value] : args->items()) {
      if (!first) prompt.markup("\n");
      first = false;
      const bool is_str = value.is_string();
      prompt.markup("<" + d + std::string(s.parameter) + " name=\"");
      prompt.client(key);
      prompt.markup(std::string("\" string=\"") + (is_str ? "true" : "false") + "\">");
      prompt.client(is_str ? value.get_ref<const std::string&>() : py_json_dumps(value));
      prompt.markup("</" + d + std::string(s.parameter) + ">");
    }
    prompt.markup("\n</" + d + std::string(s.invoke) + ">");
  }
  prompt.markup("\n</" + d + std::string(s.block) + ">");
  return {};
}

// A message's content as parts: its content array, or its content string as one text part.
std::vector<ContentPart> parts_of(const ChatMessage& m) {
  if (m.parts) return *m.parts;
  return {ContentPart{ContentPart::Kind::text, m.content, ""}};
}

// Parts flattened the way the encoders flatten non-user turns: texts (images as placeholders)
// joined by blank lines.
void render_parts(const std::vector<ContentPart>& parts, PromptBuilder& prompt) {
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) prompt.markup("\n\n");
    const ContentPart& p = parts[i];
    if (p.kind == ContentPart::Kind::text) {
      prompt.client(p.text);
    } else {
      prompt.markup(tok::image);
    }
  }
}

struct Block {
  bool is_tool_result = false;
  std::vector<ContentPart> parts;
  std::string tool_use_id;
};

// A turn after merging: user turns hold blocks, other turns point at their source message.
struct Turn {
  ChatRole role;
  std::vector<ContentPart> content;
  std::vector<Block> blocks;
  const ChatMessage* src = nullptr;
  bool carries_tools = false;
};

Status validate(const ChatRequest& req) {
  const ChatFamily family = req.options.family;
  const ChatMessage* last_calls = nullptr;
  for (size_t i = 0; i < req.messages.size(); ++i) {
    const ChatMessage& m = req.messages[i];
    const std::string where = "messages[" + std::to_string(i) + "] (" + chat_role_name(m.role) + ")";
    if (m.role == ChatRole::developer && family == ChatFamily::v4 && m.content.empty() && !m.parts) {
      return make_error(where, ": developer message needs non-empty content");
    }
    if (m.parts) {
      for (size_t j = 0; j < m.parts->size(); ++j) {
        const ContentPart& p = (*m.parts)[j];
        if (p.kind == ContentPart::Kind::image && family == ChatFamily::v4) {
          return make_error(where, ": content[", j, "]: images need DeepSeek-V4.1");
        }
        if (p.kind == ContentPart::Kind::image && p.image_url.empty()) {
          return make_error(where, ": content[", j, "]: image part without a URL");
        }
        if (family == ChatFamily::v41 && p.kind == ContentPart::Kind::text &&
            p.text.find(tok::image) != std::string::npos) {
          return make_error(where, ": content[", j, "]: text contains the image placeholder ",
                            tok::image, "; send images as image_url parts");
        }
      }
    }
    if (family == ChatFamily::v41 && !m.parts && m.content.find(tok::image) != std::string::npos) {
      return make_error(where, ": content contains the image placeholder ", tok::image,
                        "; send images as image_url parts");
    }
    if (family == ChatFamily::v41 && m.reasoning_content.find(tok::image) != std::string::npos) {
      return make_error(where, ": reasoning_content contains the image placeholder ", tok::image);
    }
    if (m.role == ChatRole::assistant && !m.tool_calls.empty()) last_calls = &m;
    if (m.role == ChatRole::tool) {
      const bool found =
          last_calls && std::any_of(last_calls->tool_calls.begin(), last_calls->tool_calls.end(),
                                    [&](const ToolCall& c) { return c.id == m.tool_call_id; });
      if (!found) {
        return make_error(where, ": tool_call_id \"", m.tool_call_id,
                          "\" answers no tool call of the preceding assistant message");
      }
    }
  }
  return {};
}

// The V4.1 budget or V4 level to render; errors name the value.
Result<int> resolve_effort(const ChatOptions& o) {
  const ReasoningEffort& e = o.reasoning_effort;
  if (o.family == ChatFamily::v4) {
    if (std::holds_alternative<std::monostate>(e)) return 0;
    if (const auto* s = std::get_if<std::string>(&e); s && (*s == "high" || *s == "max")) {
      return *s == "max" ? 1 : 0;
    }
    const std::string shown =
        std::holds_alternative<int>(e) ? std::to_string(std::get<int>(e)) : "\"" + std::get<std::string>(e) + "\"";
    return make_error("reasoning_effort: ", shown,
                      " is not valid for DeepSeek-V4 (expected \"high\" or \"max\")");
  }
  if (std::holds_alternative<std::monostate>(e)) return 75;
  if (const int* n = std::get_if<int>(&e)) {
    if (*n >= 1 && *n <= 100) return *n;
    return make_error("reasoning_effort: ", *n,
                      " is not valid for DeepSeek-V4.1 (expected an integer 1-100 or low/high/max)");
  }
  const std::string& s = std::get<std::string>(e);
  if (s == "low") return 50;
  if (s == "high") return 75;
  if (s == "max") return 100;
  return make_error("reasoning_effort: \"", s,
                    "\" is not valid for DeepSeek-V4.1 (expected an integer 1-100 or low/high/max)");
}

std::vector<Turn> merge_turns(const ChatRequest& req) {
  const bool v41 = req.options.family == ChatFamily::v41;
  std::vector<Turn> turns;
  const bool insert_system = !req.tools.empty() &&
                             (req.messages.empty() || req.messages[0].role != ChatRole::system);
  if (insert_system) turns.push_back(Turn{ChatRole::system, {}, {}, nullptr, true});
  for (const ChatMessage& m : req.messages) {
    if (m.role == ChatRole::tool) {
      Block b{true, parts_of(m), m.tool_call_id};
      if (!turns.empty() && turns.back().role == ChatRole::user) {
        turns.back().blocks.push_back(std::move(b));
      } else {
        turns.push_back(Turn{ChatRole::user, {}, {std::move(b)}, &m, false});
      }
    } else if (m.role == ChatRole::user) {
      std::vector<Block> blocks;
      if (m.parts && v41) {
        for (const ContentPart& p : *m.parts) blocks.push_back(Block{false, {p}, ""});
      } else {
        blocks.push_back(Block{false, parts_of(m), ""});
      }
      if (!turns.empty() && turns.back().role == ChatRole::user) {
        for (Block& b : blocks) turns.back().blocks.push_back(std::move(b));
      } else {
        turns.push_back(Turn{ChatRole::user, {}, std::move(blocks), &m, false});
      }
    } else {
      // V4.1 has no developer role; OpenAI's developer messages are system instructions.
      const ChatRole role = v41 && m.role == ChatRole::developer ? ChatRole::system : m.role;
      turns.push_back(Turn{role, parts_of(m), {}, &m, false});
    }
  }
  if (!req.tools.empty()) turns[0].carries_tools = true;
  return turns;
}

// Stable-sorts the tool results of each user turn by the position of their call in the nearest
// earlier assistant turn with calls; unknown ids sort as position 0, as in the official code.
void sort_tool_results(std::vector<Turn>& turns) {
  std::map<std::string, size_t> order;
  for (Turn& t : turns) {
    if (t.role == ChatRole::assistant && t.src && !t.src->tool_calls.empty()) {
      order.clear();
      for (size_t i = 0; i < t.src->tool_calls.size(); ++i) {
        if (!t.src->tool_calls[i].id.empty()) order[t.src->tool_calls[i].id] = i;
      }
    } else if (t.role == ChatRole::user) {
      std::vector<Block> results;
      for (const Block& b : t.blocks) {
        if (b.is_tool_result) results.push_back(b);
      }
      if (results.size() < 2 || order.empty()) continue;
      std::stable_sort(results.begin(), results.end(), [&](const Block& a, const Block& b) {
        auto key = [&](const Block& x) {
          auto it = order.find(x.tool_use_id);
          return it == order.end() ? size_t{0} : it->second;
        };
        return key(a) < key(b);
      });
      size_t k = 0;
      for (Block& b : t.blocks) {
        if (b.is_tool_result) b = results[k++];
      }
    }
  }
}

bool is_user_like(ChatFamily family, const std::vector<Turn>& turns, size_t i) {
  const ChatRole r = turns[i].role;
  if (family == ChatFamily::v4) return r == ChatRole::user || r == ChatRole::developer;
  return r == ChatRole::user || (r == ChatRole::system && i > 0);
}

long last_user_index(ChatFamily family, const std::vector<Turn>& turns) {
  for (size_t i = turns.size(); i-- > 0;) {
    if (is_user_like(family, turns, i)) return static_cast<long>(i);
  }
  return -1;
}

}  // namespace

Result<EncodedChat> encode_chat_prompt(const ChatRequest& req) {
  const ChatFamily family = req.options.family;
  const bool thinking = req.options.thinking;
  auto effort = resolve_effort(req.options);
  if (!effort.ok()) return effort.error();
  SPW_TRY(validate(req));

  std::vector<Turn> turns = merge_turns(req);
  sort_tool_results(turns);

  // drop_thinking=True unless any turn carries tools.
  const bool drop = req.tools.empty();
  if (thinking && drop) {
    const long last = last_user_index(family, turns);
    std::vector<Turn> kept;
    for (size_t i = 0; i < turns.size(); ++i) {
      const ChatRole r = turns[i].role;
      const bool keep = r == ChatRole::user || r == ChatRole::system || r == ChatRole::tool ||
                        static_cast<long>(i) >= last || r == ChatRole::assistant;
      if (keep) kept.push_back(std::move(turns[i]));
    }
    turns = std::move(kept);
  }
  const long last_user = last_user_index(family, turns);

  PromptBuilder prompt(tok::bos);
  for (size_t i = 0; i < turns.size(); ++i) {
    const Turn& t = turns[i];
    if (family == ChatFamily::v4) {
      if (i == 0 && thinking && *effort == 1) prompt.markup(kReasoningEffortMaxV4);
    } else {
      const bool effort_text = i == 0 && thinking;
      if (i == 0 && (effort_text || t.role == ChatRole::system)) prompt.markup(tok::system);
      if (effort_text) {
        prompt.markup("Reasoning Effort: " + std::to_string(*effort) +
                      " (range 1-100, the higher the value, the more thorough the reasoning)\n\n");
      }
    }
    switch (t.role) {
      case ChatRole::system:
        if (family == ChatFamily::v41 && i > 0) prompt.markup(tok::system);
        render_parts(t.content, prompt);
        if (t.carries_tools) {
          prompt.markup("\n\n");
          render_tools(family, req.tools, prompt);
        }
        break;
      case ChatRole::developer:
        prompt.markup(tok::user);
        render_parts(t.content, prompt);
        break;
      case ChatRole::user:
      case ChatRole::tool:
        prompt.markup(tok::user);
        for (size_t k = 0; k < t.blocks.size(); ++k) {
          if (k) prompt.markup("\n\n");
          const Block& b = t.blocks[k];
          if (b.is_tool_result) prompt.markup("<tool_result>");
          render_parts(b.parts, prompt);
          if (b.is_tool_result) prompt.markup("</tool_result>");
        }
        break;
      case ChatRole::assistant: {
        if (thinking && (!drop || static_cast<long>(i) > last_user)) {
          prompt.client(t.src->reasoning_content);
          prompt.markup(tok::think_close);
        }
        render_parts(t.content, prompt);
        if (!t.src->tool_calls.empty()) {
          const size_t i_msg = static_cast<size_t>(t.src - req.messages.data());
          SPW_TRY(render_tool_calls(family, t.src->tool_calls, i_msg, prompt));
        }
        prompt.markup(tok::eos);
        break;
      }
    }
    const bool next_is_assistant = i + 1 < turns.size() && turns[i + 1].role == ChatRole::assistant;
    const bool is_last = i + 1 == turns.size();
    if ((is_last || next_is_assistant) && is_user_like(family, turns, i)) {
      prompt.markup(tok::assistant);
      const bool open = thinking && (!drop || static_cast<long>(i) >= last_user);
      prompt.markup(open ? tok::think_open : tok::think_close);
    }
  }
  return std::move(prompt).take();
}

Result<std::string> encode_chat(const ChatRequest& req) {
  auto prompt = encode_chat_prompt(req);
  if (!prompt.ok()) return prompt.error();
  return std::move(prompt.value().text);
}

}  // namespace spw
