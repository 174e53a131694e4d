// Determinism: every choice point is decided by the next byte. Property names and enum values are
// matched as ranges of sorted strings; a number or an enum value that could go on ends at the first
// byte that does not continue it, and that byte is then read by what follows.
#include "chat/json_schema_grammar.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "chat/grammar_bytes.h"

namespace spw {
namespace {

using grammar_bytes::is_ws;
using grammar_bytes::utf8_step;

using ojson = nlohmann::ordered_json;

enum Scalar : uint8_t { kNone, kString, kNumber, kEnum, kKeyName };
enum Phase : uint8_t { oFirst, oKey, oColon, oValue, oAfter, aFirst, aValue, aAfter };
enum Num : uint8_t { nMinus, nZero, nInt, nDot, nFrac, nE, nESign, nExp, nExp2 };

constexpr int kMaxWs = 2;
constexpr uint32_t kMaxNumber = 32, kMaxInteger = 20;

bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// The first-byte class of a JSON value: choices need their alternatives' classes disjoint.
enum FirstByte : uint8_t { fString = 1, fObject = 2, fArray = 4, fNumber = 8, fTrue = 16, fFalse = 32, fNull = 64 };
uint8_t first_byte_class(unsigned char c) {
  switch (c) {
    case '"': return fString;
    case '{': return fObject;
    case '[': return fArray;
    case 't': return fTrue;
    case 'f': return fFalse;
    case 'n': return fNull;
    default: return c == '-' || is_digit(c) ? fNumber : 0;
  }
}

// Narrows [lo, hi) of sorted strings sharing their first `pos` bytes to those continuing with c.
template <class Name>
bool narrow(uint16_t& lo, uint16_t& hi, uint16_t& pos, unsigned char c, Name name) {
  auto continues = [&](size_t i) {
    const std::string& n = name(i);
    return n.size() > pos && static_cast<unsigned char>(n[pos]) == c;
  };
  size_t l = lo;
  while (l < hi && !continues(l)) ++l;
  if (l == hi) return false;
  size_t h = l;
  while (h < hi && continues(h)) ++h;
  lo = uint16_t(l);
  hi = uint16_t(h);
  ++pos;
  return true;
}

const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$schema",
                                            "$id", "$comment", "deprecated", "readOnly", "writeOnly",
                                            "$defs", "definitions", "strict"};
const std::set<std::string> kKeywords = {"type", "enum", "const", "properties", "required", "additionalProperties",
                                         "items", "minItems", "maxItems", "anyOf", "oneOf", "$ref"};

}  // namespace

bool JsonSchemaGrammar::State::operator==(const State& o) const {
  return root == o.root && depth == o.depth && scalar == o.scalar && sub == o.sub && utf8_need == o.utf8_need &&
         ws == o.ws && started == o.started && key == o.key && node == o.node && lo == o.lo && hi == o.hi &&
         pos == o.pos && len == o.len && std::equal(frames.begin(), frames.begin() + depth, o.frames.begin());
}

size_t JsonSchemaGrammar::StateHash::operator()(const State& s) const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(s.root | uint64_t(s.depth) << 16 | uint64_t(s.scalar) << 24 | uint64_t(s.sub) << 32 |
      uint64_t(s.utf8_need) << 40 | uint64_t(s.ws) << 48 | uint64_t(s.started) << 56 | uint64_t(s.key) << 57);
  mix(s.node | uint64_t(s.lo) << 16 | uint64_t(s.hi) << 32 | uint64_t(s.pos) << 48);
  mix(s.len);
  for (int d = 0; d < s.depth; ++d) {
    const Frame& f = s.frames[size_t(d)];
    mix(f.node | uint64_t(f.phase) << 16 | uint64_t(f.pending) << 24 | uint64_t(f.count) << 32);
    mix(f.used);
  }
  return size_t(h);
}

JsonSchemaGrammar::JsonSchemaGrammar() {
  add_node({});  // kAny
  Node lit;
  lit.type = Type::enumeration;
  lit.values = {"false", "null", "true"};
  literals_ = add_node(lit);
  lit.values = {"false", "true"};
  booleans_ = add_node(lit);
  lit.values = {"null"};
  null_ = add_node(lit);
  Node obj;
  obj.type = Type::object;
  obj.open = true;
  any_object_ = add_node(obj);
  Node arr;
  arr.type = Type::array;
  any_array_ = add_node(arr);
}

uint16_t JsonSchemaGrammar::any_object() { return any_object_; }

uint16_t JsonSchemaGrammar::add_node(Node n) {
  nodes_.push_back(std::move(n));
  return uint16_t(nodes_.size() - 1);
}

// Compiles one schema document; `strict` decides whether an unsupported part is an error or any value.
struct JsonSchemaGrammar::Compiler {
  JsonSchemaGrammar& g;
  const ojson& doc;
  bool strict;
  std::vector<std::string> refs;  // $refs being expanded (a repeat is recursion)

  Result<uint16_t> unsupported(const std::string& path, const std::string& why) {
    if (!strict) return kAny;
    return make_error("response_format schema at ", path.empty() ? "the root" : path, ": ", why);
  }

  uint8_t classes(uint16_t n) const {
    const Node& node = g.nodes_[n];
    switch (node.type) {
      case Type::any: return 0x7F;
      case Type::object: return fObject;
      case Type::array: return fArray;
      case Type::string: return fString;
      case Type::integer:
      case Type::number: return fNumber;
      case Type::enumeration: {
        uint8_t c = 0;
        for (const std::string& v : node.values) c |= first_byte_class(static_cast<unsigned char>(v[0]));
        return c;
      }
      case Type::choice: {
        uint8_t c = 0;
        for (uint16_t a : node.alternatives) c |= classes(a);
        return c;
      }
    }
    return 0x7F;
  }

  Result<uint16_t> choice(std::vector<uint16_t> alts, const std::string& path) {
    uint8_t seen = 0;
    for (uint16_t a : alts) {
      const uint8_t c = classes(a);
      if (c & seen)
        return unsupported(path, "alternatives (anyOf, oneOf or a list of types) must start differently: at most one "
                                 "each of string, object, array, number/integer, boolean and null");
      seen |= c;
    }
    Node n;
    n.type = Type::choice;
    n.alternatives = std::move(alts);
    return g.add_node(std::move(n));
  }

  Result<uint16_t> compile(const ojson& s, const std::string& path, int depth) {
    if (s.is_boolean() && s.get<bool>()) return kAny;
    if (!s.is_object()) return unsupported(path, "a schema must be an object");
    for (const auto& [key, value] : s.items())
      if (!kAnnotations.count(key) && !kKeywords.count(key))
        if (auto r = unsupported(path, "the keyword '" + key + "' is not supported"); !r.ok()) return r;
    if (auto ref = s.find("$ref"); ref != s.end()) return compile_ref(*ref, path, depth);
    if (auto e = s.find("const"); e != s.end()) return enumeration(ojson::array({*e}), path);
    if (auto e = s.find("enum"); e != s.end()) return enumeration(*e, path);
    for (const char* key : {"anyOf", "oneOf"}) {
      auto alts = s.find(key);
      if (alts == s.end()) continue;
      if (!alts->is_array() || alts->empty()) return unsupported(path, std::string("'") + key + "' must be a non-empty array");
      std::vector<uint16_t> ids;
      for (size_t i = 0; i < alts->size(); ++i) {
        auto a = compile((*alts)[i], path + "." + key + "[" + std::to_string(i) + "]", depth);
        if (!a.ok()) return a;
        ids.push_back(a.value());
      }
      return choice(std::move(ids), path + "." + key);
    }
    auto type = s.find("type");
    if (type != s.end() && type->is_array()) {
      std::vector<uint16_t> ids;
      for (const ojson& t : *type) {
        if (!t.is_string()) return unsupported(path, "'type' must name types as strings");
        auto a = compile_typed(s, t.get<std::string>(), path, depth);
        if (!a.ok()) return a;
        ids.push_back(a.value());
      }
      if (ids.empty()) return unsupported(path, "'type' is an empty list");
      return choice(std::move(ids), path + ".type");
    }
    if (type != s.end() && !type->is_string()) return unsupported(path, "'type' must be a string or a list of strings");
    std::string t = type != s.end() ? type->get<std::string>() : "";
    if (t.empty() && (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))) t = "object";
    if (t.empty() && s.contains("items")) t = "array";
    return t.empty() ? Result<uint16_t>(kAny) : compile_typed(s, t, path, depth);
  }

  Result<uint16_t> compile_ref(const ojson& ref, const std::string& path, int depth) {
    if (!ref.is_string()) return unsupported(path, "'$ref' must be a string");
    const std::string r = ref.get<std::string>();
    const ojson* target = nullptr;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      if (!r.starts_with(prefix)) continue;
      const std::string section = std::string(prefix).substr(2, std::strlen(prefix) - 3);
      auto defs = doc.find(section);
      if (defs != doc.end() && defs->is_object()) {
        auto it = defs->find(r.substr(std::strlen(prefix)));
        if (it != defs->end()) target = &*it;
      }
    }
    if (r == "#") target = &doc;
    if (!target) return unsupported(path, "'$ref' \"" + r + "\" does not name an entry of #/$defs or #/definitions");
    if (std::find(refs.begin(), refs.end(), r) != refs.end())
      return unsupported(path, "'$ref' \"" + r + "\" is recursive; recursive schemas are not supported");
    refs.push_back(r);
    auto out = compile(*target, path, depth);
    refs.pop_back();
    return out;
  }

  Result<uint16_t> enumeration(const ojson& values, const std::string& path) {
    if (!values.is_array() || values.empty()) return unsupported(path, "'enum' must be a non-empty array");
    Node n;
    n.type = Type::enumeration;
    for (const ojson& v : values) n.values.push_back(v.dump());
    std::sort(n.values.begin(), n.values.end());
    n.values.erase(std::unique(n.values.begin(), n.values.end()), n.values.end());
    return g.add_node(std::move(n));
  }

  Result<uint16_t> compile_typed(const ojson& s, const std::string& t, const std::string& path, int depth) {
    Node n;
    if (t == "string") n.type = Type::string;
    else if (t == "integer") n.type = Type::integer;
    else if (t == "number") n.type = Type::number;
    else if (t == "boolean") return g.booleans_;
    else if (t == "null") return g.null_;
    else if (t == "object") return compile_object(s, path, depth);
    else if (t == "array") return compile_array(s, path, depth);
    else return unsupported(path, "unknown type \"" + t + "\"");
    return g.add_node(std::move(n));
  }

  Result<uint16_t> compile_object(const ojson& s, const std::string& path, int depth) {
    if (depth >= kMaxDepth) return unsupported(path, "objects and arrays nest deeper than " + std::to_string(kMaxDepth));
    Node n;
    n.type = Type::object;
    auto props = s.find("properties");
    if (props != s.end() && !props->is_object()) return unsupported(path, "'properties' must be an object");
    auto extra = s.find("additionalProperties");
    const bool closed = extra != s.end() && extra->is_boolean() && !extra->get<bool>();
    const bool has_props = props != s.end() && !props->empty();
    if (extra != s.end() && !closed && has_props)
      return unsupported(path, "'additionalProperties' beside 'properties' must be false");
    if (extra != s.end() && !closed && !extra->is_boolean() && !(extra->is_object() && extra->empty()))
      return unsupported(path, "'additionalProperties' must be false, or true without 'properties'");
    if (!has_props) {
      n.open = !closed;
    } else {
      if (props->size() > 64) return unsupported(path, "more than 64 properties");
      for (const auto& [name, schema] : props->items()) {
        auto p = compile(schema, path + ".properties." + name, depth + 1);
        if (!p.ok()) return p;
        const std::string quoted = ojson(name).dump();  // matched as written: JSON-escaped
        n.props.emplace_back(quoted.substr(1, quoted.size() - 2), p.value());
      }
      std::sort(n.props.begin(), n.props.end());
    }
    if (auto req = s.find("required"); req != s.end()) {
      if (!req->is_array()) return unsupported(path, "'required' must be an array of property names");
      for (const ojson& r : *req) {
        const std::string quoted = r.dump();
        auto it = std::find_if(n.props.begin(), n.props.end(), [&](const auto& p) {
          return r.is_string() && "\"" + p.first + "\"" == quoted;
        });
        if (it != n.props.end()) n.required |= uint64_t(1) << (it - n.props.begin());
        else if (!n.open)
          if (auto e = unsupported(path, "'required' names " + r.dump() + ", which is not among 'properties'"); !e.ok())
            return e;
      }
    }
    return g.add_node(std::move(n));
  }

  Result<uint16_t> compile_array(const ojson& s, const std::string& path, int depth) {
    if (depth >= kMaxDepth) return unsupported(path, "objects and arrays nest deeper than " + std::to_string(kMaxDepth));
    Node n;
    n.type = Type::array;
    n.items = kAny;
    if (auto items = s.find("items"); items != s.end()) {
      auto it = compile(*items, path + ".items", depth + 1);
      if (!it.ok()) return it;
      n.items = it.value();
    }
    for (const char* key : {"minItems", "maxItems"}) {
      auto v = s.find(key);
      if (v == s.end()) continue;
      if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > UINT16_MAX)
        return unsupported(path, std::string("'") + key + "' must be an integer from 0 to 65535");
      (key[1] == 'i' ? n.min_items : n.max_items) = uint32_t(v->get<int64_t>());
    }
    if (n.min_items > n.max_items) return unsupported(path, "'minItems' is more than 'maxItems'");
    return g.add_node(std::move(n));
  }
};

Result<uint16_t> JsonSchemaGrammar::add(const ojson& schema, bool strict) {
  Compiler c{*this, schema, strict, {}};
  return c.compile(schema, "", 0);
}

JsonSchemaGrammar::State JsonSchemaGrammar::start(uint16_t root) const {
  State s;
  s.root = root;
  return s;
}

bool JsonSchemaGrammar::feed(State& s, std::string_view text) const {
  for (char c : text)
    if (!step(s, static_cast<unsigned char>(c))) return false;
  return true;
}

bool JsonSchemaGrammar::accepting(const State& s) const {
  if (s.depth != 0 || !s.started) return false;
  switch (s.scalar) {
    case kNone: return true;
    case kNumber: return s.sub == nZero || s.sub == nInt || s.sub == nFrac || s.sub == nExp || s.sub == nExp2;
    case kEnum: return nodes_[s.node].values[s.lo].size() == s.pos;
    default: return false;
  }
}

uint16_t JsonSchemaGrammar::value_node(const State& s) const {
  if (s.depth == 0) return s.root;
  const Frame& f = s.frames[size_t(s.depth - 1)];
  const Node& n = nodes_[f.node];
  if (n.type == Type::array) return n.items;
  return n.open ? kAny : n.props[f.pending].second;
}

bool JsonSchemaGrammar::push(State& s, uint16_t node, uint8_t phase) const {
  if (s.depth >= kMaxDepth) return false;
  s.frames[s.depth] = Frame{node, phase, 0, 0, 0};
  ++s.depth;
  s.ws = 0;
  return true;
}

void JsonSchemaGrammar::value_done(State& s) const {
  s.scalar = kNone;
  s.ws = 0;
  s.len = 0;
  s.sub = 0;
  if (s.depth == 0) return;
  Frame& f = s.frames[size_t(s.depth - 1)];
  if (nodes_[f.node].type == Type::array) {
    ++f.count;
    f.phase = aAfter;
  } else {
    if (!nodes_[f.node].open) f.used |= uint64_t(1) << f.pending;
    f.phase = oAfter;
  }
}

bool JsonSchemaGrammar::start_value(State& s, uint16_t node, unsigned char c) const {
  const Node& n = nodes_[node];
  auto number = [&] {
    if (c != '-' && !is_digit(c)) return false;
    s.scalar = kNumber;
    s.node = node;
    s.sub = c == '-' ? nMinus : c == '0' ? nZero : nInt;
    s.len = 1;
    return true;
  };
  auto enumeration = [&](uint16_t e) {
    s.scalar = kEnum;
    s.node = e;
    s.lo = 0;
    s.hi = uint16_t(nodes_[e].values.size());
    s.pos = 0;
    return narrow(s.lo, s.hi, s.pos, c, [&](size_t i) -> const std::string& { return nodes_[e].values[i]; });
  };
  auto string = [&] {
    if (c != '"') return false;
    s.scalar = kString;
    s.key = false;
    s.sub = 0;
    return true;
  };
  s.ws = 0;
  switch (n.type) {
    case Type::any:
      if (c == '{') return push(s, any_object_, oFirst);
      if (c == '[') return push(s, any_array_, aFirst);
      if (c == 't' || c == 'f' || c == 'n') return enumeration(literals_);
      return string() || number();
    case Type::object: return c == '{' && push(s, node, oFirst);
    case Type::array: return c == '[' && push(s, node, aFirst);
    case Type::string: return string();
    case Type::integer:
    case Type::number: return number();
    case Type::enumeration: return enumeration(node);
    case Type::choice:
      for (uint16_t a : n.alternatives) {
        State t = s;
        if (start_value(t, a, c)) {
          s = t;
          return true;
        }
      }
      return false;
  }
  return false;
}

bool JsonSchemaGrammar::step(State& s, unsigned char c) const {
  switch (s.scalar) {
    case kString: return step_string(s, c);
    case kNumber: return step_number(s, c);
    case kEnum: return step_enum(s, c);
    case kKeyName: {
      Frame& f = s.frames[size_t(s.depth - 1)];
      const auto& props = nodes_[f.node].props;
      auto unused = [&](size_t i) { return !((f.used >> i) & 1); };
      if (c == '"') {
        if (props[s.lo].first.size() != s.pos || !unused(s.lo)) return false;
        f.pending = uint8_t(s.lo);
        f.phase = oColon;
        s.scalar = kNone;
        s.ws = 0;
        return true;
      }
      if (!narrow(s.lo, s.hi, s.pos, c, [&](size_t i) -> const std::string& { return props[i].first; })) return false;
      for (size_t i = s.lo; i < s.hi; ++i)
        if (unused(i)) return true;
      return false;
    }
    default: break;
  }
  if (s.depth == 0) {
    if (s.started) return false;
    s.started = true;
    return start_value(s, s.root, c);
  }
  return step_container(s, c);
}

bool JsonSchemaGrammar::step_container(State& s, unsigned char c) const {
  Frame& f = s.frames[size_t(s.depth - 1)];
  const Node& n = nodes_[f.node];
  if (is_ws(c)) {
    if (s.ws >= kMaxWs) return false;
    ++s.ws;
    return true;
  }
  const uint64_t all = n.props.size() == 64 ? ~uint64_t(0) : (uint64_t(1) << n.props.size()) - 1;
  const bool more_keys = n.open || (f.used & all) != all;
  const bool may_close = (f.used & n.required) == n.required;
  auto pop = [&] {
    --s.depth;
    value_done(s);
    return true;
  };
  switch (f.phase) {
    case oFirst:
    case oKey:
      if (c == '}' && f.phase == oFirst && may_close) return pop();
      if (c != '"' || !more_keys) return false;
      s.ws = 0;
      if (n.open) {
        s.scalar = kString;
        s.key = true;
        s.sub = 0;
      } else {
        s.scalar = kKeyName;
        s.lo = 0;
        s.hi = uint16_t(n.props.size());
        s.pos = 0;
      }
      return true;
    case oColon:
      if (c != ':') return false;
      f.phase = oValue;
      s.ws = 0;
      return true;
    case oAfter:
      if (c == ',' && more_keys) {
        f.phase = oKey;
        s.ws = 0;
        return true;
      }
      return c == '}' && may_close && pop();
    case aFirst:
      if (c == ']' && n.min_items == 0) return pop();
      f.phase = aValue;
      return start_value(s, value_node(s), c);
    case aAfter:
      if (c == ',' && f.count < n.max_items && f.count < UINT16_MAX) {
        f.phase = aValue;
        s.ws = 0;
        return true;
      }
      return c == ']' && f.count >= n.min_items && pop();
    default:  // oValue, aValue
      return start_value(s, value_node(s), c);
  }
}

bool JsonSchemaGrammar::step_string(State& s, unsigned char c) const {
  if (s.sub == 0) {
    if (s.utf8_need == 0 && c == '"') {
      if (s.key) {
        s.key = false;
        s.scalar = kNone;
        s.ws = 0;
        s.frames[size_t(s.depth - 1)].phase = oColon;
      } else {
        value_done(s);
      }
      return true;
    }
    if (s.utf8_need == 0 && c == '\\') {
      s.sub = 1;
      return true;
    }
    if (c < 0x20) return false;
    return utf8_step(s.utf8_need, c);
  }
  if (s.sub == 1) {
    if (c == 0 || !std::strchr("\"\\/bfnrtu", c)) return false;
    s.sub = c == 'u' ? 2 : 0;
    return true;
  }
  if (!is_hex(c)) return false;
  s.sub = s.sub == 5 ? 0 : uint8_t(s.sub + 1);
  return true;
}

bool JsonSchemaGrammar::step_number(State& s, unsigned char c) const {
  const bool int_only = nodes_[s.node].type == Type::integer;
  const uint32_t cap = int_only ? kMaxInteger : kMaxNumber;
  const bool digit = is_digit(c), dot = c == '.' && !int_only, exp = (c == 'e' || c == 'E') && !int_only;
  uint8_t next = 0xFF;
  switch (s.sub) {
    case nMinus: next = digit ? (c == '0' ? nZero : nInt) : 0xFF; break;
    case nZero: next = dot ? nDot : exp ? nE : 0xFE; break;
    case nInt: next = digit ? nInt : dot ? nDot : exp ? nE : 0xFE; break;
    case nDot: next = digit ? nFrac : 0xFF; break;
    case nFrac: next = digit ? nFrac : exp ? nE : 0xFE; break;
    case nE: next = (c == '+' || c == '-') ? nESign : digit ? nExp : 0xFF; break;
    case nESign: next = digit ? nExp : 0xFF; break;
    case nExp: next = digit ? nExp2 : 0xFE; break;
    case nExp2: next = digit ? 0xFF : 0xFE; break;  // |exponent| < 100: every value fits a double
  }
  if (next == 0xFF) return false;
  if (next == 0xFE) {  // the number ended before c; c belongs to what follows
    value_done(s);
    return step(s, c);
  }
  // States that still need a digit must leave room for it under the cap.
  const uint32_t owed = (next == nDot || next == nE || next == nESign) ? 1 : 0;
  if (s.len + 1u + owed > cap) return false;
  ++s.len;
  s.sub = next;
  return true;
}

bool JsonSchemaGrammar::step_enum(State& s, unsigned char c) const {
  const auto& values = nodes_[s.node].values;
  if (narrow(s.lo, s.hi, s.pos, c, [&](size_t i) -> const std::string& { return values[i]; })) return true;
  if (values[s.lo].size() != s.pos) return false;
  value_done(s);
  return step(s, c);
}

}  // namespace spw
