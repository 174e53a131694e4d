#include "server/anthropic_request.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace spw::server {
namespace {

constexpr size_t kMaxStopSequences = 16;

ApiError invalid(const std::string& path, const std::string& what) { return bad_request(path + ": " + what, path); }

ApiError wrong_type(const std::string& path, const char* expected, const Json& v) {
  return invalid(path, std::string("must be ") + expected + ", got " + json_type_name(v));
}

// A member of an object; null reads as absent.
const Json* member(const Json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

bool integral(const Json& v) {
  if (v.is_number_integer()) return true;
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18;
}

int64_t as_int64(const Json& v) {
  if (v.is_number_unsigned()) return int64_t(std::min<uint64_t>(v.get<uint64_t>(), uint64_t(INT64_MAX)));
  if (v.is_number_integer()) return v.get<int64_t>();
  return int64_t(v.get<double>());
}

std::optional<ApiError> read_integer(const Json& v, const std::string& path, int64_t lo, int64_t hi, int64_t& out) {
  if (!integral(v)) return wrong_type(path, "an integer", v);
  out = as_int64(v);
  if (out < lo || out > hi)
    return invalid(path, "must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " +
                             std::to_string(out));
  return std::nullopt;
}

std::optional<ApiError> read_number(const Json& v, const std::string& path, double lo, double hi, bool lo_open,
                                    float& out) {
  if (!v.is_number()) return wrong_type(path, "a number", v);
  const double x = v.get<double>();
  const bool low_ok = lo_open ? x > lo : x >= lo;
  if (!(low_ok && x <= hi))
    return invalid(path, std::string("must be ") + (lo_open ? "greater than " : "at least ") + std::to_string(lo) +
                             " and at most " + std::to_string(hi) + ", got " + std::to_string(x));
  out = float(x);
  return std::nullopt;
}

// A member that is a string, or null.
const std::string* string_member(const Json& obj, const char* key) {
  const Json* v = member(obj, key);
  return v && v->is_string() ? &v->get_ref<const std::string&>() : nullptr;
}

// A content block: an object with a string "type"; that type.
ApiResult<std::string> block_type(const Json& block, const std::string& at) {
  if (!block.is_object()) return wrong_type(at, "an object", block);
  const std::string* type = string_member(block, "type");
  if (!type) return invalid(at + ".type", "Field required (a string)");
  return *type;
}

// A block's required string field.
ApiResult<std::string> string_field(const Json& block, const std::string& at, const char* key) {
  const std::string* v = string_member(block, key);
  if (!v) return invalid(at + "." + key, "must be a string");
  return *v;
}

ApiError unsupported_block(const std::string& path, const std::string& type, const char* where) {
  return invalid(path + ".type", "\"" + type + "\" blocks are not supported " + where + " (this server takes text" +
                                     (std::string(where) == "in user messages" ? ", image, tool_result" : "") + " blocks)");
}

// The texts of a string or an array of {"type": "text", "text"} blocks.
ApiResult<std::vector<std::string>> texts(const Json& content, const std::string& path) {
  if (content.is_string()) return std::vector<std::string>{content.get<std::string>()};
  if (!content.is_array()) return wrong_type(path, "a string or an array of text blocks", content);
  std::vector<std::string> out;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string at = path + "." + std::to_string(i);
    auto type = block_type(content[i], at);
    if (!type.ok) return type.error;
    if (type.value != "text") return unsupported_block(at, type.value, "here");
    auto text = string_field(content[i], at, "text");
    if (!text.ok) return text.error;
    out.push_back(std::move(text.value));
  }
  return out;
}

Json text_parts(const std::vector<std::string>& texts) {
  Json parts = Json::array();
  for (const auto& t : texts) parts.push_back(Json{{"type", "text"}, {"text", t}});
  return parts;
}

std::string joined(const std::vector<std::string>& texts) {
  std::string out;
  for (size_t i = 0; i < texts.size(); ++i) out += (i ? "\n\n" : "") + texts[i];
  return out;
}

// An image block's source as the URL of an OpenAI image part: {"type": "base64", "media_type", "data"} →
// a data: URL; {"type": "url", "url"} keeps its URL (which the image reader refuses: the server fetches
// nothing).
ApiResult<std::string> image_url(const Json& b, const std::string& at) {
  const Json* source = member(b, "source");
  if (!source || !source->is_object()) return invalid(at + ".source", "an image block needs a source object");
  auto type = string_field(*source, at + ".source", "type");
  if (!type.ok) return type.error;
  if (type.value == "url") return string_field(*source, at + ".source", "url");
  if (type.value != "base64")
    return invalid(at + ".source.type", "\"" + type.value + "\" image sources are not supported (send base64 data)");
  auto media = string_field(*source, at + ".source", "media_type");
  if (!media.ok) return media.error;
  auto data = string_field(*source, at + ".source", "data");
  if (!data.ok) return data.error;
  return "data:" + media.value + ";base64," + data.value;
}

// One tool_result block → an OpenAI tool message.
ApiResult<Json> tool_message(const Json& b, const std::string& at) {
  auto id = string_field(b, at, "tool_use_id");
  if (!id.ok) return id.error;
  std::string text;
  if (const Json* content = member(b, "content")) {
    auto t = texts(*content, at + ".content");
    if (!t.ok) return t.error;
    text = joined(t.value);
  }
  if (const Json* e = member(b, "is_error")) {
    if (!e->is_boolean()) return wrong_type(at + ".is_error", "a boolean", *e);
    if (e->get<bool>()) text = "Error: " + text;
  }
  return Json{{"role", "tool"}, {"tool_call_id", id.value}, {"content", text}};
}

// A user turn: its tool results as tool messages, then its text as one user message.
std::optional<ApiError> user_turn(const Json& content, const std::string& path, Json& out) {
  if (content.is_string()) {
    out.push_back(Json{{"role", "user"}, {"content", content}});
    return std::nullopt;
  }
  Json parts = Json::array();  // texts and images, in order
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& b = content[i];
    const std::string at = path + "." + std::to_string(i);
    auto type = block_type(b, at);
    if (!type.ok) return type.error;
    if (type.value == "text") {
      auto t = string_field(b, at, "text");
      if (!t.ok) return t.error;
      parts.push_back(Json{{"type", "text"}, {"text", std::move(t.value)}});
    } else if (type.value == "image") {
      auto url = image_url(b, at);
      if (!url.ok) return url.error;
      parts.push_back(Json{{"type", "image_url"}, {"image_url", Json{{"url", std::move(url.value)}}}});
    } else if (type.value == "tool_result") {
      auto m = tool_message(b, at);
      if (!m.ok) return m.error;
      out.push_back(std::move(m.value));
    } else {
      return unsupported_block(at, type.value, "in user messages");
    }
  }
  if (!parts.empty()) out.push_back(Json{{"role", "user"}, {"content", std::move(parts)}});
  return std::nullopt;
}

std::optional<ApiError> assistant_turn(const Json& content, const std::string& path, Json& out) {
  Json msg{{"role", "assistant"}};
  if (content.is_string()) {
    msg["content"] = content;
    out.push_back(std::move(msg));
    return std::nullopt;
  }
  std::vector<std::string> text;
  std::string reasoning;
  Json calls = Json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& b = content[i];
    const std::string at = path + "." + std::to_string(i);
    auto type = block_type(b, at);
    if (!type.ok) return type.error;
    if (type.value == "text") {
      auto t = string_field(b, at, "text");
      if (!t.ok) return t.error;
      text.push_back(std::move(t.value));
    } else if (type.value == "thinking") {
      auto t = string_field(b, at, "thinking");
      if (!t.ok) return t.error;
      reasoning += t.value;
    } else if (type.value == "redacted_thinking") {
      continue;
    } else if (type.value == "tool_use") {
      auto id = string_field(b, at, "id");
      if (!id.ok) return id.error;
      auto name = string_field(b, at, "name");
      if (!name.ok) return name.error;
      const Json* input = member(b, "input");
      if (input && !input->is_object()) return wrong_type(at + ".input", "an object", *input);
      calls.push_back(Json{{"id", id.value},
                           {"type", "function"},
                           {"function", Json{{"name", name.value}, {"arguments", input ? *input : Json::object()}}}});
    } else {
      return unsupported_block(at, type.value, "in assistant messages");
    }
  }
  msg["content"] = text.empty() ? Json() : Json(joined(text));
  if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
  if (!calls.empty()) msg["tool_calls"] = std::move(calls);
  out.push_back(std::move(msg));
  return std::nullopt;
}

ApiResult<Json> chat_messages(const Json& body) {
  Json out = Json::array();
  if (const Json* system = member(body, "system")) {
    auto t = texts(*system, "system");
    if (!t.ok) return t.error;
    out.push_back(Json{{"role", "system"}, {"content", system->is_string() ? Json(*system) : text_parts(t.value)}});
  }
  const Json* msgs = member(body, "messages");
  if (!msgs) return invalid("messages", "Field required");
  if (!msgs->is_array()) return wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) return invalid("messages", "must not be empty");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const Json& m = (*msgs)[i];
    const std::string at = "messages." + std::to_string(i);
    if (!m.is_object()) return wrong_type(at, "an object", m);
    const Json* role = member(m, "role");
    if (!role || !role->is_string()) return invalid(at + ".role", "must be \"user\" or \"assistant\"");
    const Json* content = member(m, "content");
    if (!content || !(content->is_string() || content->is_array()))
      return invalid(at + ".content", "must be a string or an array of content blocks");
    std::optional<ApiError> e;
    if (*role == "user") {
      e = user_turn(*content, at + ".content", out);
    } else if (*role == "assistant") {
      if (i + 1 == msgs->size())
        return invalid(at, "a final assistant message (prefill) is not supported; end with a user message");
      e = assistant_turn(*content, at + ".content", out);
    } else {
      return invalid(at + ".role", "must be \"user\" or \"assistant\", got \"" + role->get<std::string>() +
                                       "\" (put system text in the top-level 'system' field)");
    }
    if (e) return *e;
  }
  return out;
}

ApiResult<Json> chat_tools(const Json& tools) {
  if (!tools.is_array()) return wrong_type("tools", "an array", tools);
  Json out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string at = "tools." + std::to_string(i);
    if (!t.is_object()) return wrong_type(at, "an object", t);
    if (const Json* type = member(t, "type"); type && *type != "custom")
      return invalid(at + ".type", "only custom tools (name, description, input_schema) are supported, got " +
                                       type->dump());
    const Json* name = member(t, "name");
    if (!name || !name->is_string() || name->get_ref<const std::string&>().empty())
      return invalid(at + ".name", "must be a non-empty string");
    const Json* schema = member(t, "input_schema");
    if (!schema) return invalid(at + ".input_schema", "Field required");
    if (!schema->is_object()) return wrong_type(at + ".input_schema", "an object", *schema);
    Json fn{{"name", *name}};
    if (const Json* d = member(t, "description")) {
      if (!d->is_string()) return wrong_type(at + ".description", "a string", *d);
      fn["description"] = *d;
    }
    fn["parameters"] = *schema;
    out.push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

bool has_tool(const Json& tools, const std::string& name) {
  for (const auto& t : tools)
    if (t["function"]["name"] == name) return true;
  return false;
}

std::optional<ApiError> read_tool_choice(const Json& tc, const Json& tools, ChatCompletionRequest& r) {
  if (!tc.is_object()) return wrong_type("tool_choice", "an object", tc);
  const std::string* type_field = string_member(tc, "type");
  if (!type_field) return invalid("tool_choice.type", "must be \"auto\", \"any\", \"tool\" or \"none\"");
  const std::string& type = *type_field;
  if (type == "auto" || type == "none") {
    r.tool_choice = type;
  } else if (type == "any") {
    if (tools.empty()) return invalid("tool_choice", "{\"type\": \"any\"} needs at least one tool in 'tools'");
    r.tool_choice = "required";
  } else if (type == "tool") {
    auto name = string_field(tc, "tool_choice", "name");
    if (!name.ok) return name.error;
    if (!has_tool(tools, name.value))
      return invalid("tool_choice.name", "\"" + name.value + "\" is not among the tools");
    r.tool_choice = "function:" + name.value;
  } else {
    return invalid("tool_choice.type", "must be \"auto\", \"any\", \"tool\" or \"none\", got \"" + type + "\"");
  }
  if (const Json* p = member(tc, "disable_parallel_tool_use")) {
    if (!p->is_boolean()) return wrong_type("tool_choice.disable_parallel_tool_use", "a boolean", *p);
    r.parallel_tool_calls = !p->get<bool>();
  }
  return std::nullopt;
}

ApiResult<bool> read_thinking(const Json& th) {
  if (!th.is_object()) return wrong_type("thinking", "an object", th);
  const std::string* type = string_member(th, "type");
  if (!type) return invalid("thinking.type", "must be \"enabled\" or \"disabled\"");
  if (*type == "disabled") return false;
  if (*type == "adaptive") return true;
  if (*type != "enabled") return invalid("thinking.type", "must be \"enabled\" or \"disabled\", got \"" + *type + "\"");
  const Json* budget = member(th, "budget_tokens");
  if (!budget) return invalid("thinking.budget_tokens", "Field required");
  int64_t n = 0;
  if (auto e = read_integer(*budget, "thinking.budget_tokens", 1, INT32_MAX, n)) return *e;
  return true;
}

std::optional<ApiError> read_sampling(const Json& body, GenerationParams& g) {
  const Json* mt = member(body, "max_tokens");
  if (!mt) return invalid("max_tokens", "Field required");
  int64_t n = 0;
  if (auto e = read_integer(*mt, "max_tokens", 1, INT32_MAX, n)) return e;
  g.max_tokens = n;
  auto& s = g.sampling;
  if (const Json* v = member(body, "temperature"))
    if (auto e = read_number(*v, "temperature", 0, 1, false, s.temperature)) return e;
  if (const Json* v = member(body, "top_p"))
    if (auto e = read_number(*v, "top_p", 0, 1, true, s.top_p)) return e;
  if (const Json* v = member(body, "top_k")) {
    if (auto e = read_integer(*v, "top_k", 0, INT32_MAX, n)) return e;
    s.top_k = int(n);
  }
  if (const Json* v = member(body, "stop_sequences")) {
    if (!v->is_array()) return wrong_type("stop_sequences", "an array of strings", *v);
    if (v->size() > kMaxStopSequences)
      return invalid("stop_sequences", "has " + std::to_string(v->size()) + " sequences; at most " +
                                           std::to_string(kMaxStopSequences) + " are allowed");
    for (size_t i = 0; i < v->size(); ++i) {
      const Json& stop = (*v)[i];
      if (!stop.is_string()) return wrong_type("stop_sequences." + std::to_string(i), "a string", stop);
      if (!stop.get_ref<const std::string&>().empty()) g.stop.push_back(stop.get<std::string>());
    }
  }
  if (const Json* v = member(body, "stream")) {
    if (!v->is_boolean()) return wrong_type("stream", "a boolean", *v);
    g.stream = v->get<bool>();
  }
  return std::nullopt;
}

}  // namespace

ApiResult<MessagesRequest> parse_messages_request(const Json& body) {
  if (!body.is_object()) return bad_request("the request body must be a JSON object");
  MessagesRequest r;
  const Json* model = member(body, "model");
  if (!model) return invalid("model", "Field required");
  if (!model->is_string()) return wrong_type("model", "a string", *model);
  r.chat.model = model->get<std::string>();
  if (auto e = read_sampling(body, r.chat.gen)) return *e;
  auto messages = chat_messages(body);
  if (!messages.ok) return messages.error;
  r.chat_body["messages"] = std::move(messages.value);
  Json tools = Json::array();
  if (const Json* t = member(body, "tools")) {
    auto converted = chat_tools(*t);
    if (!converted.ok) return converted.error;
    tools = std::move(converted.value);
  }
  if (const Json* tc = member(body, "tool_choice"))
    if (auto e = read_tool_choice(*tc, tools, r.chat)) return *e;
  if (!tools.empty()) r.chat_body["tools"] = std::move(tools);
  if (const Json* th = member(body, "thinking")) {
    auto thinking = read_thinking(*th);
    if (!thinking.ok) return thinking.error;
    r.chat_body["thinking"] = thinking.value;
  }
  return r;
}

}  // namespace spw::server
