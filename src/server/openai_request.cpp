#include "server/openai_request.h"

#include <charconv>
#include <cmath>
#include <limits>

namespace spw::server {
namespace {

constexpr int kMaxTopLogprobs = 20;
constexpr size_t kMaxStopSequences = 16;
constexpr size_t kMaxLogitBias = 1024;

ApiError wrong_type(const std::string& name, const char* expected, const Json& v) {
  return bad_request("'" + name + "' must be " + expected + ", got " + json_type_name(v), name);
}

// Reads optional fields of one object; the first error sticks and later reads return nothing.
class Fields {
 public:
  explicit Fields(const Json& body) : body_(body) {}
  bool failed() const { return error_.has_value(); }
  const ApiError& error() const { return *error_; }
  void fail(ApiError e) {
    if (!error_) error_ = std::move(e);
  }

  const Json* get(const std::string& name) {
    if (failed()) return nullptr;
    auto it = body_.find(name);
    if (it == body_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<bool> boolean(const std::string& name) {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) return fail(wrong_type(name, "a boolean", *v)), std::nullopt;
    return v->get<bool>();
  }

  std::optional<double> number(const std::string& name, double lo, double hi) {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) return fail(wrong_type(name, "a number", *v)), std::nullopt;
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi)) {
      fail(bad_request("'" + name + "' must be between " + fmt(lo) + " and " + fmt(hi) + ", got " + fmt(x), name));
      return std::nullopt;
    }
    return x;
  }

  std::optional<int64_t> integer(const std::string& name, int64_t lo, int64_t hi) {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    if (!integral(*v)) return fail(wrong_type(name, "an integer", *v)), std::nullopt;
    const int64_t x = v->is_number_unsigned() ? int64_t(std::min<uint64_t>(v->get<uint64_t>(), uint64_t(INT64_MAX)))
                                              : v->get<int64_t>();
    if (x < lo || x > hi) {
      fail(bad_request("'" + name + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                           ", got " + std::to_string(x),
                       name));
      return std::nullopt;
    }
    return x;
  }

  std::optional<std::string> string(const std::string& name) {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_string()) return fail(wrong_type(name, "a string", *v)), std::nullopt;
    return v->get<std::string>();
  }

  static bool integral(const Json& v) {
    if (v.is_number_integer()) return true;
    // 5.0 is accepted as 5, as Python clients may send it.
    if (v.is_number_float()) {
      const double d = v.get<double>();
      return std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18;
    }
    return false;
  }

 private:
  static std::string fmt(double x) {
    std::string s = std::to_string(x);
    while (s.size() > 1 && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }
  const Json& body_;
  std::optional<ApiError> error_;
};

int64_t as_int64(const Json& v) {
  if (v.is_number_unsigned()) return int64_t(std::min<uint64_t>(v.get<uint64_t>(), uint64_t(INT64_MAX)));
  if (v.is_number_integer()) return v.get<int64_t>();
  return int64_t(v.get<double>());
}

std::optional<std::vector<int32_t>> token_ids(Fields& f, const Json& v, const std::string& name) {
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& e = v[i];
    const std::string at = name + "[" + std::to_string(i) + "]";
    if (!Fields::integral(e)) return f.fail(wrong_type(at, "an integer token id", e)), std::nullopt;
    const int64_t id = as_int64(e);
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      return f.fail(bad_request("'" + at + "' is " + std::to_string(id) + ", not a token id", name)), std::nullopt;
    ids.push_back(int32_t(id));
  }
  return ids;
}

// logit_bias: {"<token id>": bias in [-100, 100], ...}, keys as OpenAI sends them (strings).
void read_logit_bias(Fields& f, runtime::SamplingParams& s) {
  const Json* bias = f.get("logit_bias");
  if (!bias) return;
  if (!bias->is_object()) return f.fail(wrong_type("logit_bias", "an object mapping token ids to biases", *bias));
  if (bias->size() > kMaxLogitBias)
    return f.fail(bad_request("'logit_bias' has " + std::to_string(bias->size()) + " entries; at most " +
                                  std::to_string(kMaxLogitBias) + " are allowed",
                              "logit_bias"));
  for (const auto& [key, value] : bias->items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > std::numeric_limits<int32_t>::max())
      return f.fail(bad_request("'logit_bias' key \"" + key + "\" is not a token id (a non-negative integer)",
                                "logit_bias"));
    if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100))
      return f.fail(bad_request("'logit_bias[\"" + key + "\"]' must be a number between -100 and 100, got " +
                                    value.dump(),
                                "logit_bias"));
    s.logit_bias.emplace_back(int32_t(id), float(value.get<double>()));
  }
}

// response_format: {"type": "text"}, {"type": "json_object"}, or {"type": "json_schema",
// "json_schema": {"name": ..., "schema": {...}, "strict": ...}}. The schema itself is checked when
// its grammar is built.
void read_response_format(Fields& f, ResponseFormat& out) {
  const Json* rf = f.get("response_format");
  if (!rf) return;
  if (!rf->is_object()) return f.fail(wrong_type("response_format", "an object", *rf));
  auto type = rf->find("type");
  const std::string t = type != rf->end() && type->is_string() ? type->get<std::string>() : "";
  if (t == "text") return;
  if (t == "json_object") {
    out.type = ResponseFormat::Type::json_object;
    return;
  }
  if (t != "json_schema")
    return f.fail(bad_request("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"",
                              "response_format"));
  auto js = rf->find("json_schema");
  if (js == rf->end() || !js->is_object())
    return f.fail(bad_request("'response_format.json_schema' must be an object with a 'schema'", "response_format"));
  auto schema = js->find("schema");
  if (schema == js->end() || !schema->is_object())
    return f.fail(bad_request("'response_format.json_schema.schema' must be a JSON schema object", "response_format"));
  if (auto name = js->find("name"); name != js->end() && !name->is_string())
    return f.fail(wrong_type("response_format.json_schema.name", "a string", *name));
  if (auto strict = js->find("strict"); strict != js->end() && !strict->is_null() && !strict->is_boolean())
    return f.fail(wrong_type("response_format.json_schema.strict", "a boolean", *strict));
  out.type = ResponseFormat::Type::json_schema;
  out.schema = *schema;
}

void read_generation(Fields& f, GenerationParams& g, bool chat) {
  auto& s = g.sampling;
  if (auto v = f.integer("max_tokens", 1, INT32_MAX)) g.max_tokens = *v;
  if (chat)
    if (auto v = f.integer("max_completion_tokens", 1, INT32_MAX)) g.max_tokens = *v;
  if (auto v = f.number("temperature", 0, 2)) s.temperature = float(*v);
  if (auto v = f.number("top_p", 0, 1)) {
    if (*v <= 0) f.fail(bad_request("'top_p' must be greater than 0, got 0", "top_p"));
    s.top_p = float(*v);
  }
  if (auto v = f.integer("top_k", -1, INT32_MAX)) s.top_k = int(std::max<int64_t>(*v, 0));
  if (auto v = f.number("min_p", 0, 1)) s.min_p = float(*v);
  if (auto v = f.number("presence_penalty", -2, 2)) s.presence_penalty = float(*v);
  if (auto v = f.number("frequency_penalty", -2, 2)) s.frequency_penalty = float(*v);
  if (auto v = f.number("repetition_penalty", 0, 2)) {
    if (*v <= 0) f.fail(bad_request("'repetition_penalty' must be greater than 0, got 0", "repetition_penalty"));
    s.repetition_penalty = float(*v);
  }
  if (auto v = f.integer("seed", INT64_MIN, INT64_MAX)) s.seed = uint64_t(*v);
  if (auto v = f.integer("n", 1, kMaxChoices)) g.n = int(*v);
  read_logit_bias(f, s);
  if (chat) {
    const bool logprobs = f.boolean("logprobs").value_or(false);
    const auto top = f.integer("top_logprobs", 0, kMaxTopLogprobs);
    if (top && !logprobs) f.fail(bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs"));
    if (logprobs) s.top_logprobs = int(top.value_or(0));
  } else {
    if (auto v = f.integer("logprobs", 0, kMaxTopLogprobs)) s.top_logprobs = int(*v);
  }
  if (const Json* stop = f.get("stop")) {
    if (stop->is_string()) {
      g.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > kMaxStopSequences)
        f.fail(bad_request("'stop' has " + std::to_string(stop->size()) + " sequences; at most " +
                               std::to_string(kMaxStopSequences) + " are allowed",
                           "stop"));
      for (size_t i = 0; i < stop->size() && !f.failed(); ++i) {
        if (!(*stop)[i].is_string()) f.fail(wrong_type("stop[" + std::to_string(i) + "]", "a string", (*stop)[i]));
        else g.stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      f.fail(wrong_type("stop", "a string or an array of strings", *stop));
    }
    std::erase_if(g.stop, [](const std::string& s) { return s.empty(); });
  }
  if (const Json* ids = f.get("stop_token_ids")) {
    if (!ids->is_array()) f.fail(wrong_type("stop_token_ids", "an array of integers", *ids));
    else if (auto v = token_ids(f, *ids, "stop_token_ids")) g.stop_token_ids = std::move(*v);
  }
  if (auto v = f.boolean("ignore_eos")) g.ignore_eos = *v;
  if (auto v = f.boolean("stream")) g.stream = *v;
  if (const Json* so = f.get("stream_options")) {
    if (!so->is_object()) {
      f.fail(wrong_type("stream_options", "an object", *so));
    } else {
      Fields inner(*so);
      if (auto v = inner.boolean("include_usage")) g.include_usage = *v;
      if (inner.failed()) {
        ApiError e = inner.error();
        e.message = "stream_options." + e.message.substr(1, std::string::npos);
        e.message.insert(0, "'");
        e.param = "stream_options." + e.param;
        f.fail(e);
      }
    }
  }
  read_response_format(f, g.response_format);
}

// prompt: a string, a list of token ids, or a non-empty list of either (a batch).
void read_prompts(Fields& f, const Json& prompt, std::vector<CompletionRequest::Prompt>& out) {
  const char* expected = "a string, an array of token ids, or an array of strings or of token-id arrays";
  auto one = [&](const Json& v, const std::string& name) {
    if (v.is_string()) {
      out.emplace_back(v.get<std::string>());
    } else if (v.is_array()) {
      if (v.empty()) return f.fail(bad_request("'" + name + "' is empty", "prompt"));
      if (auto ids = token_ids(f, v, name)) out.emplace_back(std::move(*ids));
    } else {
      f.fail(wrong_type(name, "a string or an array of token ids", v));
    }
  };
  if (prompt.is_string()) return one(prompt, "prompt");
  if (!prompt.is_array()) return f.fail(wrong_type("prompt", expected, prompt));
  if (prompt.empty()) return f.fail(bad_request("'prompt' is empty", "prompt"));
  if (!prompt[0].is_string() && !prompt[0].is_array()) return one(prompt, "prompt");  // one list of token ids
  if (prompt.size() > kMaxPrompts)
    return f.fail(bad_request("'prompt' has " + std::to_string(prompt.size()) + " prompts; at most " +
                                  std::to_string(kMaxPrompts) + " are allowed",
                              "prompt"));
  for (size_t i = 0; i < prompt.size() && !f.failed(); ++i) {
    if (prompt[i].is_string() != prompt[0].is_string())
      return f.fail(bad_request("'prompt' mixes strings and token-id arrays; send one kind", "prompt"));
    one(prompt[i], "prompt[" + std::to_string(i) + "]");
  }
}

std::string read_model(Fields& f) { return f.string("model").value_or(""); }

ApiError not_object() { return bad_request("the request body must be a JSON object"); }

}  // namespace

ApiResult<CompletionRequest> parse_completion_request(const Json& body) {
  if (!body.is_object()) return not_object();
  Fields f(body);
  CompletionRequest r;
  r.model = read_model(f);
  const Json* prompt = f.get("prompt");
  if (!f.failed() && !prompt) return bad_request("'prompt' is required", "prompt");
  if (prompt) read_prompts(f, *prompt, r.prompts);
  if (auto v = f.boolean("echo")) r.echo = *v;
  if (const Json* suffix = f.get("suffix")) {
    if (!suffix->is_string()) f.fail(wrong_type("suffix", "a string", *suffix));
    else if (!suffix->get<std::string>().empty()) f.fail(bad_request("'suffix' is not supported", "suffix"));
  }
  read_generation(f, r.gen, false);
  if (f.failed()) return f.error();
  r.gen.prompt_logprobs = r.echo && r.gen.sampling.top_logprobs >= 0;
  if (r.gen.prompt_logprobs && r.gen.stream)
    return bad_request("'echo' with 'logprobs' is supported without streaming only; set stream to false", "echo");
  if (r.prompts.size() * size_t(r.gen.n) > kMaxPrompts)
    return bad_request(std::to_string(r.prompts.size()) + " prompts × n = " + std::to_string(r.gen.n) + " is " +
                           std::to_string(r.prompts.size() * size_t(r.gen.n)) + " sequences; at most " +
                           std::to_string(kMaxPrompts) + " are allowed in one request",
                       "prompt");
  return r;
}

ApiResult<ChatCompletionRequest> parse_chat_completion_request(const Json& body) {
  if (!body.is_object()) return not_object();
  Fields f(body);
  ChatCompletionRequest r;
  r.model = read_model(f);
  const Json* messages = f.get("messages");
  if (!f.failed()) {
    if (!messages) return bad_request("'messages' is required", "messages");
    if (!messages->is_array()) return wrong_type("messages", "an array", *messages);
    if (messages->empty()) return bad_request("'messages' must not be empty", "messages");
  }
  if (const Json* tc = f.get("tool_choice")) {
    if (tc->is_string()) {
      r.tool_choice = tc->get<std::string>();
      if (r.tool_choice != "auto" && r.tool_choice != "none" && r.tool_choice != "required")
        f.fail(bad_request("'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                           "\"function\": {\"name\": ...}}, got \"" + r.tool_choice + "\"",
                           "tool_choice"));
    } else if (tc->is_object()) {
      auto fn = tc->find("function");
      if (fn == tc->end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
        f.fail(bad_request("'tool_choice.function.name' must be a string", "tool_choice"));
      else
        r.tool_choice = "function:" + (*fn)["name"].get<std::string>();
    } else {
      f.fail(wrong_type("tool_choice", "a string or an object", *tc));
    }
  }
  if (auto v = f.boolean("parallel_tool_calls")) r.parallel_tool_calls = *v;
  read_generation(f, r.gen, true);
  if (f.failed()) return f.error();
  return r;
}

ApiResult<TokenizeRequest> parse_tokenize_request(const Json& body) {
  if (!body.is_object()) return not_object();
  Fields f(body);
  TokenizeRequest r;
  r.prompt = f.string("prompt");
  if (const Json* m = f.get("messages")) {
    if (!m->is_array()) f.fail(wrong_type("messages", "an array", *m));
    r.has_messages = true;
  }
  if (auto v = f.boolean("add_special_tokens")) r.add_special_tokens = *v;
  if (f.failed()) return f.error();
  if (!r.prompt && !r.has_messages) return bad_request("'prompt' (a string) or 'messages' is required", "prompt");
  return r;
}

ApiResult<std::vector<int32_t>> parse_detokenize_request(const Json& body) {
  if (!body.is_object()) return not_object();
  Fields f(body);
  const Json* tokens = f.get("tokens");
  if (!tokens) return bad_request("'tokens' is required", "tokens");
  if (!tokens->is_array()) return wrong_type("tokens", "an array of integers", *tokens);
  auto ids = token_ids(f, *tokens, "tokens");
  if (!ids) return f.error();
  return std::move(*ids);
}

}  // namespace spw::server
