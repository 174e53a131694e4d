#include "chat/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace spw {

void py_json_append_string(std::string& out, std::string_view s) {
  out.push_back('"');
  py_json_append_escaped(out, s);
  out.push_back('"');
}

void py_json_append_escaped(std::string& out, std::string_view s) {
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out.push_back(c);
        }
    }
  }
}

// Python's float repr: the shortest round-trip digits, fixed notation when the decimal exponent
// lies in [-4, 16), otherwise d.ddde±XX.
std::string py_float_repr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v < 0 ? "-Infinity" : "Infinity";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  std::string out;
  if (sci.front() == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.') digits.push_back(c);
  }
  int exp10 = std::atoi(std::string(sci.substr(e + 1)).c_str());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int decpt = exp10 + 1;
  if (decpt <= -4 || decpt > 16) {
    out.push_back(digits[0]);
    if (digits.size() > 1) {
      out.push_back('.');
      out.append(digits, 1);
    }
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += ebuf;
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    out += digits;
    out.append(static_cast<size_t>(decpt) - digits.size(), '0');
    out += ".0";
  } else {
    out.append(digits, 0, static_cast<size_t>(decpt));
    out.push_back('.');
    out.append(digits, static_cast<size_t>(decpt));
  }
  return out;
}

namespace {

using ojson = nlohmann::ordered_json;

void dump_scalar(std::string& out, const ojson& v) {
  using T = ojson::value_t;
  switch (v.type()) {
    case T::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case T::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case T::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case T::number_float: out += py_float_repr(v.get<double>()); break;
    case T::string: py_json_append_string(out, v.get_ref<const std::string&>()); break;
    default: out += "null"; break;  // null, binary, discarded
  }
}

// One open array or object: where its iteration stands.
struct Open {
  const ojson* container;
  ojson::const_iterator next;
};

}  // namespace

// Iterative, so a value of any depth dumps without growing the call stack.
std::string py_json_dumps(const ojson& value) {
  std::string out;
  std::vector<Open> open;
  const ojson* v = &value;
  while (true) {
    if (v) {
      if (v->is_array() || v->is_object()) {
        out.push_back(v->is_array() ? '[' : '{');
        open.push_back({v, v->cbegin()});
      } else {
        dump_scalar(out, *v);
      }
      v = nullptr;
    }
    if (open.empty()) break;
    Open& top = open.back();
    if (top.next == top.container->cend()) {
      out.push_back(top.container->is_array() ? ']' : '}');
      open.pop_back();
      continue;
    }
    if (top.next != top.container->cbegin()) out += ", ";
    if (top.container->is_object()) {
      py_json_append_string(out, top.next.key());
      out += ": ";
    }
    v = &*top.next;
    ++top.next;
  }
  return out;
}

}  // namespace spw
