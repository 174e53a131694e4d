// OpenAI chat-completions JSON → ChatRequest. Every rejection names the JSON path and value.
#include "chat/chat_encoding.h"
#include "chat/json_limits.h"
#include "chat/py_json.h"

namespace spw {

using ojson = nlohmann::ordered_json;

namespace {

Result<ChatRole> parse_role(const ojson& m, const std::string& where) {
  if (!m.contains("role") || !m["role"].is_string()) {
    return make_error(where, ".role: missing or not a string");
  }
  const std::string& r = m["role"].get_ref<const std::string&>();
  if (r == "system") return ChatRole::system;
  if (r == "developer") return ChatRole::developer;
  if (r == "user") return ChatRole::user;
  if (r == "assistant") return ChatRole::assistant;
  if (r == "tool") return ChatRole::tool;
  return make_error(where, ".role: unknown role \"", r,
                    "\" (expected system, developer, user, assistant or tool)");
}

// Text of an optional string field; null and absent read as "".
Result<std::string> optional_string(const ojson& m, const char* key, const std::string& where) {
  if (!m.contains(key) || m[key].is_null()) return std::string();
  if (!m[key].is_string()) return make_error(where, ".", key, ": expected a string, got ", m[key].type_name());
  return m[key].get<std::string>();
}

Status parse_content(const ojson& m, ChatMessage& out, const std::string& where) {
  if (!m.contains("content") || m["content"].is_null()) return {};
  const ojson& c = m["content"];
  if (c.is_string()) {
    out.content = c.get<std::string>();
    return {};
  }
  if (!c.is_array()) return make_error(where, ".content: expected a string, null or an array, got ", c.type_name());
  std::vector<ContentPart> parts;
  for (size_t j = 0; j < c.size(); ++j) {
    const ojson& p = c[j];
    const std::string pw = where + ".content[" + std::to_string(j) + "]";
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
      return make_error(pw, ": expected an object with a string \"type\"");
    }
    const std::string& type = p["type"].get_ref<const std::string&>();
    ContentPart part;
    if (type == "text") {
      if (p.contains("text") && !p["text"].is_null()) {
        if (!p["text"].is_string()) return make_error(pw, ".text: expected a string");
        part.text = p["text"].get<std::string>();
      }
    } else if (type == "image_url" || type == "image") {
      part.kind = ContentPart::Kind::image;
      const ojson* u = nullptr;
      if (type == "image_url" && p.contains("image_url")) {
        u = p["image_url"].is_object() && p["image_url"].contains("url") ? &p["image_url"]["url"] : &p["image_url"];
      } else if (p.contains("url")) {
        u = &p["url"];
      }
      if (!u || !u->is_string() || u->get_ref<const std::string&>().empty()) {
        return make_error(pw, ": image part without a URL");
      }
      part.image_url = u->get<std::string>();
    } else {
      return make_error(pw, ".type: unsupported content part type \"", type, "\" (expected text or image_url)");
    }
    parts.push_back(std::move(part));
  }
  out.parts = std::move(parts);
  return {};
}

Status parse_tool_calls(const ojson& m, ChatMessage& out, const std::string& where) {
  if (!m.contains("tool_calls") || m["tool_calls"].is_null()) return {};
  const ojson& tcs = m["tool_calls"];
  if (!tcs.is_array()) return make_error(where, ".tool_calls: expected an array");
  for (size_t j = 0; j < tcs.size(); ++j) {
    const ojson& tc = tcs[j];
    const std::string tw = where + ".tool_calls[" + std::to_string(j) + "]";
    if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object()) {
      return make_error(tw, ": expected an object with a \"function\" object");
    }
    const ojson& f = tc["function"];
    ToolCall call;
    auto id = optional_string(tc, "id", tw);
    if (!id.ok()) return id.error();
    call.id = *id;
    if (!f.contains("name") || !f["name"].is_string()) return make_error(tw, ".function.name: missing or not a string");
    call.name = f["name"].get<std::string>();
    if (f.contains("arguments") && f["arguments"].is_string()) {
      call.arguments = f["arguments"].get<std::string>();
    } else if (f.contains("arguments") && f["arguments"].is_object()) {
      call.arguments = py_json_dumps(f["arguments"]);
    } else {
      return make_error(tw, ".function.arguments: expected a JSON string");
    }
    out.tool_calls.push_back(std::move(call));
  }
  return {};
}

}  // namespace

Result<ChatRequest> parse_chat_request(const ojson& body, ChatFamily family) {
  ChatRequest req;
  req.options.family = family;
  if (!body.is_object()) return make_error("request: expected a JSON object");
  // Tools and arguments are copied and dumped by recursive code (nlohmann's copy, the encoder): a
  // body that did not come through parse_json_bounded is held to the same depth here.
  if (const size_t max_depth = JsonLimits{}.max_depth; json_depth_exceeds(body, max_depth)) {
    return make_error("request: nests arrays/objects more than ", max_depth, " levels deep (this server's limit)");
  }
  if (!body.contains("messages") || !body["messages"].is_array()) {
    return make_error("messages: missing or not an array");
  }
  const ojson& msgs = body["messages"];
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const ojson& m = msgs[i];
    if (!m.is_object()) return make_error(where, ": expected an object");
    ChatMessage msg;
    auto role = parse_role(m, where);
    if (!role.ok()) return role.error();
    msg.role = *role;
    SPW_TRY(parse_content(m, msg, where));
    auto rc = optional_string(m, "reasoning_content", where);
    if (!rc.ok()) return rc.error();
    msg.reasoning_content = *rc;
    SPW_TRY(parse_tool_calls(m, msg, where));
    auto id = optional_string(m, "tool_call_id", where);
    if (!id.ok()) return id.error();
    msg.tool_call_id = *id;
    req.messages.push_back(std::move(msg));
  }
  if (body.contains("tools") && !body["tools"].is_null()) {
    const ojson& tools = body["tools"];
    if (!tools.is_array()) return make_error("tools: expected an array");
    for (size_t i = 0; i < tools.size(); ++i) {
      const ojson& t = tools[i];
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
          !t["function"].contains("name") || !t["function"]["name"].is_string()) {
        return make_error("tools[", i, "]: expected {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
      req.tools.push_back(ToolSpec{t["function"]});
    }
  }
  if (body.contains("reasoning_effort") && !body["reasoning_effort"].is_null()) {
    const ojson& e = body["reasoning_effort"];
    if (e.is_number_integer()) {
      const bool fits = e.is_number_unsigned() ? e.get<uint64_t>() <= 1000 : e.get<int64_t>() >= -1000;
      if (!fits) return make_error("reasoning_effort: ", e.dump(), " is out of range (expected 1-100)");
      req.options.reasoning_effort = static_cast<int>(e.get<int64_t>());
    } else if (e.is_string()) {
      req.options.reasoning_effort = e.get<std::string>();
    } else {
      return make_error("reasoning_effort: expected an integer or a string, got ", e.type_name());
    }
  }
  const ojson* th = nullptr;
  if (body.contains("thinking")) th = &body["thinking"];
  if (body.contains("chat_template_kwargs") && body["chat_template_kwargs"].is_object() &&
      body["chat_template_kwargs"].contains("thinking")) {
    th = &body["chat_template_kwargs"]["thinking"];
  }
  if (th && !th->is_null()) {
    if (th->is_boolean()) {
      req.options.thinking = th->get<bool>();
    } else if (th->is_object() && th->contains("type") && (*th)["type"].is_string()) {
      const std::string& type = (*th)["type"].get_ref<const std::string&>();
      if (type != "enabled" && type != "disabled") {
        return make_error("thinking.type: \"", type, "\" (expected enabled or disabled)");
      }
      req.options.thinking = type == "enabled";
    } else {
      return make_error("thinking: expected a boolean or {\"type\": \"enabled\"|\"disabled\"}");
    }
  }
  return req;
}

}  // namespace spw
