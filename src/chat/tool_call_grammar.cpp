// The automaton is deterministic: every choice point is decided by the next byte (literal
// candidates in one set never prefix each other; names are matched as ranges of sorted names).
// The one place the language would need lookahead, an enum value followed by '<', is avoided by
// dropping enums whose values contain '<' (the property then takes free text).
#include "chat/tool_call_grammar.h"

#include <algorithm>
#include <cstring>

#include "chat/dsml.h"
#include "chat/grammar_bytes.h"

namespace spw {
namespace {

using grammar_bytes::is_ws;
using grammar_bytes::utf8_step;

using ojson = nlohmann::ordered_json;

enum Lit : int {
  kBlockOpen, kInvokeOpen, kBlockClose, kNameEnd, kParamOpen, kInvokeClose, kStringAttr,
  kAttrTrue, kAttrFalse, kAttrEnd, kParamClose, kThinkClose, kNumLits
};
enum Phase : uint8_t { kThink, kGap, kLits, kToolName, kParamName, kText, kEnum, kJson, kDone };
enum Ctx : uint8_t { kLead, kBlock, kBody, kAfterInvoke };

constexpr int kMaxWs = 2;

constexpr uint16_t bit(int lit) { return uint16_t(1u << lit); }

std::vector<uint16_t> kmp_failure(const std::string& lit) {
  std::vector<uint16_t> fail(lit.size(), 0);
  for (size_t i = 1, k = 0; i < lit.size(); ++i) {
    while (k > 0 && lit[i] != lit[k]) k = fail[k - 1];
    if (lit[i] == lit[k]) ++k;
    fail[i] = uint16_t(k);
  }
  return fail;
}

// Narrows the range [s.lo, s.hi) of sorted names that share their first s.pos bytes to those
// continuing with c. Those form one run, as the names are sorted.
template <class Name>
bool narrow(ToolCallGrammar::State& s, unsigned char c, Name name) {
  auto continues = [&](size_t i) {
    const std::string& n = name(i);
    return n.size() > s.pos && static_cast<unsigned char>(n[s.pos]) == c;
  };
  size_t lo = s.lo;
  while (lo < s.hi && !continues(lo)) ++lo;
  if (lo == s.hi) return false;
  size_t hi = lo;
  while (hi < s.hi && continues(hi)) ++hi;
  s.lo = uint16_t(lo);
  s.hi = uint16_t(hi);
  ++s.pos;
  return true;
}

bool strings_without_lt(const ojson& values) {
  if (!values.is_array() || values.empty()) return false;
  for (const ojson& v : values)
    if (!v.is_string() || v.get_ref<const std::string&>().find('<') != std::string::npos) return false;
  return true;
}

// A property's value forms: string schemas (or enums of strings) as text only; typed ones as JSON
// only, held to the schema; anything else either way. The JSON side compiles leniently: a tool's
// schema may use keywords the grammar lacks, and those parts then take any value.
ToolCallGrammar::Param make_param(const std::string& name, const ojson& schema, JsonSchemaGrammar& json) {
  ToolCallGrammar::Param p;
  p.name = name;
  if (!schema.is_object()) return p;
  const auto type_it = schema.find("type");
  const std::string type = type_it != schema.end() && type_it->is_string() ? type_it->get<std::string>() : "";
  const auto enum_it = schema.find("enum");
  const bool text_enum = enum_it != schema.end() && strings_without_lt(*enum_it);
  if (type == "string" || (type.empty() && text_enum)) {
    p.allow_json = false;
    if (text_enum) {
      for (const ojson& v : *enum_it) p.enum_values.push_back(v.get<std::string>());
      std::sort(p.enum_values.begin(), p.enum_values.end());
      p.enum_values.erase(std::unique(p.enum_values.begin(), p.enum_values.end()), p.enum_values.end());
    }
    const auto max_it = schema.find("maxLength");
    if (max_it != schema.end() && max_it->is_number_integer() && max_it->get<int64_t>() >= 0)
      p.max_length = max_it->get<int64_t>();
    return p;
  }
  for (const char* t : {"integer", "number", "boolean", "null", "object", "array"})
    if (type == t) p.allow_text = false;
  auto root = json.add(schema, /*strict=*/false);  // lenient: never fails
  p.json_root = root.ok() ? root.value() : JsonSchemaGrammar::kAny;
  return p;
}

}  // namespace

size_t ToolCallGrammar::StateHash::operator()(const State& s) const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(s.phase | s.ctx << 8 | s.ws << 16 | uint64_t(s.utf8_need) << 24);
  mix(uint64_t(s.is_text) << 1 | uint64_t(s.cands) << 2 | uint64_t(s.pos) << 18 | uint64_t(s.lo) << 34 |
      uint64_t(s.hi) << 50);
  mix(uint64_t(uint16_t(s.tool)) | uint64_t(uint16_t(s.param)) << 16);
  mix(s.len);
  mix(s.used);
  if (s.phase == kJson) mix(JsonSchemaGrammar::StateHash()(s.json));
  return size_t(h);
}

Result<ToolCallGrammar> ToolCallGrammar::build(const std::vector<ToolSpec>& tools, const ToolCallGrammarOptions& options) {
  ToolCallGrammar g;
  g.options_ = options;
  std::vector<std::string> skipped;
  for (const ToolSpec& spec : tools) {
    const ojson& f = spec.function;
    const auto name_it = f.find("name");
    if (name_it == f.end() || !name_it->is_string()) continue;
    Tool tool;
    tool.name = name_it->get<std::string>();
    if (tool.name.empty() || tool.name.find('"') != std::string::npos) {
      skipped.push_back(tool.name);
      continue;
    }
    const auto params_it = f.find("parameters");
    const ojson empty = ojson::object();
    const ojson& params = params_it != f.end() && params_it->is_object() ? *params_it : empty;
    const auto props_it = params.find("properties");
    if (props_it != params.end() && props_it->is_object()) {
      for (const auto& [key, schema] : props_it->items()) {
        if (key.empty() || key.find('"') != std::string::npos) continue;
        tool.params.push_back(make_param(key, schema, g.json_));
      }
    }
    if (tool.params.size() > 64)
      return make_error("tool \"", tool.name, "\" has ", tool.params.size(),
                        " properties; constrained tool calls support at most 64");
    std::sort(tool.params.begin(), tool.params.end(), [](const Param& a, const Param& b) { return a.name < b.name; });
    bool callable = true;
    const auto req_it = params.find("required");
    if (req_it != params.end() && req_it->is_array()) {
      for (const ojson& r : *req_it) {
        if (!r.is_string()) continue;
        const auto it = std::find_if(tool.params.begin(), tool.params.end(),
                                     [&](const Param& p) { return p.name == r.get_ref<const std::string&>(); });
        if (it == tool.params.end()) callable = false;
        else tool.required |= uint64_t(1) << (it - tool.params.begin());
      }
    }
    if (!callable) {
      skipped.push_back(tool.name);
      continue;
    }
    const bool duplicate = std::any_of(g.tools_.begin(), g.tools_.end(), [&](const Tool& t) { return t.name == tool.name; });
    if (!duplicate) g.tools_.push_back(std::move(tool));
  }
  if (g.tools_.empty()) {
    std::string names;
    for (const std::string& n : skipped) names += (names.empty() ? "\"" : ", \"") + n + "\"";
    return make_error("no tool can be called: a tool needs a non-empty name without '\"', and every required "
                      "parameter must be a property whose name has no '\"'",
                      names.empty() ? std::string() : " (rejected: " + names + ")");
  }
  std::sort(g.tools_.begin(), g.tools_.end(), [](const Tool& a, const Tool& b) { return a.name < b.name; });

  const DsmlSpelling& sp = options.family == ChatFamily::v4 ? kDsmlV4 : kDsmlV41;
  const std::string d(chat_tokens::dsml);
  g.lits_.resize(kNumLits);
  g.lits_[kBlockOpen] = "<" + d + std::string(sp.block) + ">";
  g.lits_[kInvokeOpen] = "<" + d + std::string(sp.invoke) + " name=\"";
  g.lits_[kBlockClose] = "</" + d + std::string(sp.block) + ">";
  g.lits_[kNameEnd] = "\">";
  g.lits_[kParamOpen] = "<" + d + std::string(sp.parameter) + " name=\"";
  g.lits_[kInvokeClose] = "</" + d + std::string(sp.invoke) + ">";
  g.lits_[kStringAttr] = "\" string=\"";
  g.lits_[kAttrTrue] = "true";
  g.lits_[kAttrFalse] = "false";
  g.lits_[kAttrEnd] = "\">";
  g.lits_[kParamClose] = "</" + d + std::string(sp.parameter) + ">";
  g.lits_[kThinkClose] = std::string(chat_tokens::think_close);
  g.close_fail_ = kmp_failure(g.lits_[kParamClose]);
  g.think_fail_ = kmp_failure(g.lits_[kThinkClose]);
  return g;
}

ToolCallGrammar::State ToolCallGrammar::start() const {
  State s;
  s.phase = options_.thinking ? kThink : kGap;
  s.ctx = kLead;
  return s;
}

bool ToolCallGrammar::accepting(const State& s) const { return s.phase == kDone; }

bool ToolCallGrammar::feed(State& s, std::string_view text) const {
  for (char c : text)
    if (!step(s, static_cast<unsigned char>(c))) return false;
  return true;
}

size_t ToolCallGrammar::kmp(const std::string& lit, const std::vector<uint16_t>& fail, size_t pos, unsigned char c) const {
  while (pos > 0 && static_cast<unsigned char>(lit[pos]) != c) pos = fail[pos - 1];
  if (static_cast<unsigned char>(lit[pos]) == c) ++pos;
  return pos;
}

bool ToolCallGrammar::step(State& s, unsigned char c) const {
  switch (s.phase) {
    case kThink: {
      const std::string& close = lits_[kThinkClose];
      s.pos = uint16_t(kmp(close, think_fail_, s.pos, c));
      if (s.pos == close.size()) {
        s.phase = kGap;
        s.ctx = kLead;
        s.pos = 0;
        s.ws = 0;
      }
      return true;
    }
    case kGap: return step_gap(s, c);
    case kLits: return step_lits(s, c);
    case kToolName:
      if (c == '"') {
        if (tools_[s.lo].name.size() != s.pos) return false;
        s.tool = int16_t(s.lo);
        s.phase = kLits;
        s.cands = bit(kNameEnd);
        s.pos = 1;
        return true;
      }
      return narrow(s, c, [&](size_t i) -> const std::string& { return tools_[i].name; });
    case kParamName: {
      const Tool& t = tools_[size_t(s.tool)];
      auto unused = [&](size_t i) { return !((s.used >> i) & 1); };
      if (c == '"') {
        if (t.params[s.lo].name.size() != s.pos || !unused(s.lo)) return false;
        s.param = int16_t(s.lo);
        s.phase = kLits;
        s.cands = bit(kStringAttr);
        s.pos = 1;
        return true;
      }
      if (!narrow(s, c, [&](size_t i) -> const std::string& { return t.params[i].name; })) return false;
      for (size_t i = s.lo; i < s.hi; ++i)
        if (unused(i)) return true;
      return false;
    }
    case kEnum: {
      const auto& values = tools_[size_t(s.tool)].params[size_t(s.param)].enum_values;
      if (narrow(s, c, [&](size_t i) -> const std::string& { return values[i]; })) return true;
      if (c != '<' || values[s.lo].size() != s.pos) return false;
      s.phase = kLits;
      s.cands = bit(kParamClose);
      s.pos = 1;
      return true;
    }
    case kText: return step_text(s, c);
    case kJson:
      // The value fills the tag exactly: it ends at the close tag's '<' once it is complete.
      if (c == '<' && json_.accepting(s.json)) {
        s.phase = kLits;
        s.cands = bit(kParamClose);
        s.pos = 1;
        return true;
      }
      return json_.step(s.json, c);
    default: return false;  // kDone: only end-of-sequence
  }
}

uint16_t ToolCallGrammar::gap_candidates(const State& s) const {
  switch (s.ctx) {
    case kLead: return bit(kBlockOpen);
    case kBlock: return bit(kInvokeOpen);
    case kAfterInvoke: return uint16_t((options_.parallel ? bit(kInvokeOpen) : 0) | bit(kBlockClose));
    default: {
      const Tool& t = tools_[size_t(s.tool)];
      const uint64_t all = t.params.size() == 64 ? ~uint64_t(0) : (uint64_t(1) << t.params.size()) - 1;
      uint16_t c = 0;
      if (s.used != all) c |= bit(kParamOpen);
      if ((s.used & t.required) == t.required) c |= bit(kInvokeClose);
      return c;
    }
  }
}

bool ToolCallGrammar::step_gap(State& s, unsigned char c) const {
  // Before the block only "\n\n" (as the encoder writes it): the parser takes exactly that as
  // part of the markup, any other whitespace would come back as content.
  const bool lead = s.ctx == kLead;
  if (is_ws(c)) {
    if (s.ws >= kMaxWs || (lead && c != '\n')) return false;
    ++s.ws;
    return true;
  }
  if (c != '<' || (lead && s.ws == 1)) return false;
  const uint16_t cands = gap_candidates(s);
  if (!cands) return false;
  s.phase = kLits;
  s.cands = cands;
  s.pos = 1;  // every candidate starts with '<'
  s.ws = 0;
  return true;
}

bool ToolCallGrammar::step_lits(State& s, unsigned char c) const {
  uint16_t next = 0;
  int done = -1;
  for (int l = 0; l < kNumLits; ++l) {
    if (!(s.cands & bit(l))) continue;
    const std::string& lit = lits_[size_t(l)];
    if (s.pos < lit.size() && static_cast<unsigned char>(lit[s.pos]) == c) {
      next |= bit(l);
      if (size_t(s.pos) + 1 == lit.size()) done = l;
    }
  }
  if (!next) return false;
  s.cands = next;
  ++s.pos;
  if (done >= 0) complete_literal(s, done);
  return true;
}

void ToolCallGrammar::complete_literal(State& s, int lit) const {
  auto to_lits = [&](uint16_t cands) {
    s.phase = kLits;
    s.cands = cands;
    s.pos = 0;
  };
  auto to_gap = [&](Ctx ctx) {
    s.phase = kGap;
    s.ctx = ctx;
    s.ws = 0;
    s.cands = 0;
    s.pos = 0;
  };
  switch (lit) {
    case kBlockOpen: to_gap(kBlock); break;
    case kInvokeOpen:
      s.phase = kToolName;
      s.lo = 0;
      s.hi = uint16_t(tools_.size());
      s.pos = 0;
      break;
    case kNameEnd:
      s.used = 0;
      s.lo = s.hi = 0;
      to_gap(kBody);
      break;
    case kParamOpen:
      s.phase = kParamName;
      s.lo = 0;
      s.hi = uint16_t(tools_[size_t(s.tool)].params.size());
      s.pos = 0;
      break;
    case kStringAttr: {
      const Param& p = tools_[size_t(s.tool)].params[size_t(s.param)];
      s.lo = s.hi = 0;
      to_lits(uint16_t((p.allow_text ? bit(kAttrTrue) : 0) | (p.allow_json ? bit(kAttrFalse) : 0)));
      break;
    }
    case kAttrTrue:
    case kAttrFalse:
      s.is_text = lit == kAttrTrue;
      to_lits(bit(kAttrEnd));
      break;
    case kAttrEnd: {
      const Param& p = tools_[size_t(s.tool)].params[size_t(s.param)];
      s.pos = 0;
      s.len = 0;
      s.cands = 0;
      if (!s.is_text) {
        s.phase = kJson;
        s.json = json_.start(p.json_root);
        s.ws = 0;
      } else if (!p.enum_values.empty()) {
        s.phase = kEnum;
        s.lo = 0;
        s.hi = uint16_t(p.enum_values.size());
      } else {
        s.phase = kText;
        s.utf8_need = 0;
      }
      break;
    }
    case kParamClose:
      s.used |= uint64_t(1) << s.param;
      s.param = -1;
      s.len = 0;
      s.lo = s.hi = 0;
      s.is_text = false;
      s.json = {};
      to_gap(kBody);
      break;
    case kInvokeClose:
      s.tool = -1;
      s.used = 0;
      to_gap(kAfterInvoke);
      break;
    case kBlockClose:
      s.phase = kDone;
      s.cands = 0;
      s.pos = 0;
      break;
    default: break;
  }
}

// Free text up to the parameter close tag, matched with KMP; bytes that fall out of a partial
// match are value text and count towards maxLength.
bool ToolCallGrammar::step_text(State& s, unsigned char c) const {
  const std::string& close = lits_[kParamClose];
  if (!utf8_step(s.utf8_need, c)) return false;
  if (size_t(s.pos) + 1 == close.size()) {  // "</｜DSML｜P" seen: the parser needs '>' now
    if (c != '>') return false;
    complete_literal(s, kParamClose);
    return true;
  }
  const size_t np = kmp(close, close_fail_, s.pos, c);
  const int64_t max = tools_[size_t(s.tool)].params[size_t(s.param)].max_length;
  if (max < 0) {  // no count kept: text states repeat, and so do their cached masks
    s.pos = uint16_t(np);
    return true;
  }
  const size_t n_out = s.pos + 1 - np;
  uint32_t chars = 0;
  for (size_t k = 0; k < n_out; ++k) {
    const unsigned char b = k < s.pos ? static_cast<unsigned char>(close[k]) : c;
    chars += (b & 0xC0) != 0x80;
  }
  if (int64_t(s.len) + chars > max) return false;
  s.len += chars;
  s.pos = uint16_t(np);
  return true;
}

}  // namespace spw
