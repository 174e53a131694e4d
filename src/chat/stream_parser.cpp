// The grammar follows the official parse_tool_calls(), with whitespace between tags tolerated:
//   "\n\n"? <｜DSML｜B> ws (<｜DSML｜I ws name="N"> ws (<｜DSML｜P name="K" string="true|false">V</｜DSML｜P> ws)*
//   </｜DSML｜I> ws)* </｜DSML｜B>
// with B/I/P = tool_calls/invoke/parameter (V4) or " calls"/" invoke"/" parameter" (V4.1).
// Block parsing is resumable: cur_ and scan_ remember how far the buffer has been checked, so a
// long argument fed byte by byte costs O(length), not O(length²). A streamed call emits the same
// argument text the whole call would have, in pieces: `{` (or `, `) and the key and an opening
// quote at each parameter header, the escaped value as it arrives, the closing quote at the
// parameter's end and `}` (or `{}`) at the invoke's end.
#include "chat/stream_parser.h"

#include <algorithm>
#include <array>

#include "chat/py_json.h"

namespace spw {

namespace tok = chat_tokens;

namespace {

enum class Match { yes, no, partial };

Match match_at(std::string_view buf, size_t pos, std::string_view lit) {
  const size_t n = std::min(lit.size(), buf.size() - pos);
  if (buf.compare(pos, n, lit.substr(0, n)) != 0) return Match::no;
  return n == lit.size() ? Match::yes : Match::partial;
}

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string tag(std::string_view open, std::string_view name, std::string_view close = "") {
  std::string s(open);
  s += tok::dsml;
  s += name;
  s += close;
  return s;
}

const std::string kOpenV4 = tag("<", kDsmlV4.block, ">");
const std::string kOpenV41 = tag("<", kDsmlV41.block, ">");
const std::string kOpenV4Nl = "\n\n" + kOpenV4;
const std::string kOpenV41Nl = "\n\n" + kOpenV41;

// Length of the longest proper suffix of buf that is a prefix of one of the markers.
size_t held_suffix(std::string_view buf, const std::string_view* markers, size_t n_markers) {
  size_t best = 0;
  for (size_t m = 0; m < n_markers; ++m) {
    const std::string_view mk = markers[m];
    const size_t max_len = std::min(buf.size(), mk.size() - 1);
    for (size_t len = max_len; len > best; --len) {
      if (buf.compare(buf.size() - len, len, mk.substr(0, len)) == 0) {
        best = len;
        break;
      }
    }
  }
  return best;
}

// Length of an incomplete UTF-8 sequence at the end of buf (0 when it ends on a boundary).
size_t incomplete_utf8_tail(std::string_view buf) {
  for (size_t i = 1; i <= std::min<size_t>(3, buf.size()); ++i) {
    const auto c = static_cast<unsigned char>(buf[buf.size() - i]);
    if ((c & 0xC0) == 0x80) continue;
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > i ? i : 0;
  }
  return 0;
}

}  // namespace

StreamParser::StreamParser(StreamParserOptions options)
    : options_(std::move(options)), state_(options_.thinking ? State::reasoning : State::content) {}

StreamDelta StreamParser::push(std::string_view text) {
  StreamDelta out;
  buf_.append(text);
  run(out);
  return out;
}

StreamDelta StreamParser::finish() {
  StreamDelta out;
  if (streaming_call_) close_streamed_call(out);
  if (state_ == State::reasoning) {
    out.reasoning_content += buf_;
  } else {
    out.content += buf_;
  }
  buf_.clear();
  state_ = State::content;
  cur_ = 0;
  return out;
}

void StreamParser::run(StreamDelta& out) {
  for (;;) {
    if (state_ != State::block) {
      if (!scan_text(out)) return;
      continue;
    }
    const Advance step = advance_block(out);
    if (step == Advance::need_more) return;
    if (step == Advance::fail) degrade(out);
  }
}

bool StreamParser::scan_text(StreamDelta& out) {
  std::string& sink = state_ == State::reasoning ? out.reasoning_content : out.content;
  const std::string_view view(buf_);
  if (state_ == State::reasoning) {
    const size_t close = view.find(tok::think_close);
    const size_t eos = view.find(tok::eos);
    if (close != std::string_view::npos || eos != std::string_view::npos) {
      const bool is_close = close < eos;
      const size_t at = std::min(close, eos);
      sink.append(view.substr(0, at));
      buf_.erase(0, at + (is_close ? tok::think_close.size() : tok::eos.size()));
      if (is_close) state_ = State::content;
      return true;
    }
    const std::array<std::string_view, 2> markers{tok::think_close, tok::eos};
    const size_t hold = held_suffix(view, markers.data(), markers.size());
    sink.append(view.substr(0, view.size() - hold));
    buf_.erase(0, view.size() - hold);
    return false;
  }
  const size_t eos = view.find(tok::eos);
  const size_t open4 = options_.tool_calls ? view.find(kOpenV4) : std::string_view::npos;
  const size_t open41 = options_.tool_calls ? view.find(kOpenV41) : std::string_view::npos;
  const size_t at = std::min({eos, open4, open41});
  if (at != std::string_view::npos) {
    if (at == eos) {
      sink.append(view.substr(0, at));
      buf_.erase(0, at + tok::eos.size());
      return true;
    }
    // A block opens: the "\n\n" before it belongs to the markup (kept for degrading).
    const size_t start = at >= 2 && view.substr(at - 2, 2) == "\n\n" ? at - 2 : at;
    sink.append(view.substr(0, start));
    const bool v4 = at == open4;
    spelling_ = v4 ? &kDsmlV4 : &kDsmlV41;
    buf_.erase(0, start);
    cur_ = (at - start) + (v4 ? kOpenV4.size() : kOpenV41.size());
    sub_ = Sub::invoke_or_close;
    state_ = State::block;
    return true;
  }
  const std::array<std::string_view, 5> markers{tok::eos, kOpenV4Nl, kOpenV41Nl, kOpenV4, kOpenV41};
  const size_t hold = held_suffix(view, markers.data(), options_.tool_calls ? markers.size() : 1);
  sink.append(view.substr(0, view.size() - hold));
  buf_.erase(0, view.size() - hold);
  return false;
}

// Advances the block parse by one element. On fail, cur_ is where the markup went wrong.
StreamParser::Advance StreamParser::advance_block(StreamDelta& out) {
  const std::string_view b(buf_);
  const DsmlSpelling& s = *spelling_;
  auto skip_ws = [&] {
    while (cur_ < b.size() && is_ws(b[cur_])) ++cur_;
  };
  // Matches lit at cur_ and advances past it.
  auto expect = [&](std::string_view lit) -> Advance {
    switch (match_at(b, cur_, lit)) {
      case Match::yes: cur_ += lit.size(); return Advance::progress;
      case Match::partial: return Advance::need_more;
      case Match::no: return Advance::fail;
    }
    return Advance::fail;
  };
  // Reads up to (not including) the next '"' into dst.
  auto read_quoted = [&](std::string& dst) -> Advance {
    const size_t q = b.find('"', cur_);
    if (q == std::string_view::npos) return Advance::need_more;
    dst.assign(b.substr(cur_, q - cur_));
    cur_ = q;
    return Advance::progress;
  };

  switch (sub_) {
    case Sub::invoke_or_close: {
      skip_ws();
      if (cur_ == b.size()) return Advance::need_more;
      const std::string invoke = tag("<", s.invoke);
      const std::string close = tag("</", s.block, ">");
      const Match mi = match_at(b, cur_, invoke);
      const Match mc = match_at(b, cur_, close);
      if (mi == Match::yes) {
        cur_ += invoke.size();
        sub_ = Sub::invoke_name;
        return Advance::progress;
      }
      if (mc == Match::yes) {
        cur_ += close.size();
        buf_.erase(0, cur_);
        cur_ = 0;
        state_ = State::content;
        return Advance::progress;
      }
      return mi == Match::partial || mc == Match::partial ? Advance::need_more : Advance::fail;
    }
    case Sub::invoke_name: {
      // A restart from the tag's end keeps this idempotent when more text is needed.
      const size_t start = cur_;
      skip_ws();
      Advance st = expect("name=\"");
      if (st == Advance::progress) st = read_quoted(call_name_);
      if (st == Advance::progress) st = expect("\">");
      if (st == Advance::need_more) {
        cur_ = start;
        return st;
      }
      if (st == Advance::fail) return st;
      params_.clear();
      sub_ = Sub::invoke_body;
      if (options_.stream_arguments) {
        out.tool_calls.push_back(
            ToolCallDelta{n_calls_, options_.tool_call_id_prefix + std::to_string(n_calls_), call_name_, ""});
        streaming_call_ = true;
        commit(cur_);
      }
      return Advance::progress;
    }
    case Sub::invoke_body: {
      skip_ws();
      if (cur_ == b.size()) return Advance::need_more;
      const std::string param = tag("<", s.parameter);
      const std::string end = tag("</", s.invoke, ">");
      const Match mp = match_at(b, cur_, param);
      const Match me = match_at(b, cur_, end);
      if (mp == Match::yes) {
        param_start_ = cur_;
        cur_ += param.size();
        sub_ = Sub::param_head;
        return Advance::progress;
      }
      if (me == Match::yes) {
        cur_ += end.size();
        if (streaming_call_) {
          close_streamed_call(out);
          commit(cur_);
          sub_ = Sub::invoke_or_close;
          return Advance::progress;
        }
        std::string args = "{";
        for (size_t i = 0; i < params_.size(); ++i) {
          if (i) args += ", ";
          py_json_append_string(args, params_[i].first);
          args += ": ";
          args += params_[i].second;
        }
        args += "}";
        out.tool_calls.push_back(ToolCallDelta{n_calls_, options_.tool_call_id_prefix + std::to_string(n_calls_),
                                               call_name_, std::move(args)});
        ++n_calls_;
        buf_.erase(0, cur_);
        cur_ = 0;
        sub_ = Sub::invoke_or_close;
        return Advance::progress;
      }
      return mp == Match::partial || me == Match::partial ? Advance::need_more : Advance::fail;
    }
    case Sub::param_head: {
      const size_t start = cur_;
      Advance st = expect(" name=\"");
      if (st == Advance::progress) st = read_quoted(param_name_);
      if (st == Advance::progress) st = expect("\" string=\"");
      if (st == Advance::progress) {
        const Match mt = match_at(b, cur_, "true");
        const Match mf = match_at(b, cur_, "false");
        if (mt == Match::yes || mf == Match::yes) {
          param_is_string_ = mt == Match::yes;
          cur_ += param_is_string_ ? 4 : 5;
        } else {
          st = mt == Match::partial || mf == Match::partial ? Advance::need_more : Advance::fail;
        }
      }
      if (st == Advance::progress) st = expect("\">");
      if (st == Advance::need_more) {
        cur_ = start;
        return st;
      }
      if (st == Advance::fail) return st;
      const bool duplicate = std::any_of(params_.begin(), params_.end(),
                                         [&](const auto& p) { return p.first == param_name_; });
      if (duplicate) {
        cur_ = param_start_;
        return Advance::fail;
      }
      sub_ = Sub::param_value;
      if (streaming_call_) {
        std::string head = params_.empty() ? "{" : ", ";
        py_json_append_string(head, param_name_);
        head += param_is_string_ ? ": \"" : ": ";
        emit_arguments(out, head);
        params_.emplace_back(param_name_, "");
        commit(cur_);
      }
      value_start_ = cur_;
      scan_ = cur_;
      return Advance::progress;
    }
    case Sub::param_value: {
      const std::string end = tag("</", s.parameter);
      size_t p = b.find(end, scan_);
      if (p == std::string_view::npos) {
        if (streaming_call_) stream_value(out);
        const size_t size = buf_.size();
        scan_ = std::max(value_start_, size >= end.size() ? size - end.size() + 1 : 0);
        return Advance::need_more;
      }
      if (streaming_call_) {  // everything before the closing tag is value text
        emit_value(out, p);
        p = 0;
      }
      const std::string_view v(buf_);
      cur_ = p + end.size();
      if (cur_ == v.size()) {
        cur_ = value_start_;
        scan_ = p;
        return Advance::need_more;
      }
      if (v[cur_] != '>') return Advance::fail;
      ++cur_;
      if (streaming_call_) {
        if (param_is_string_) emit_arguments(out, "\"");
        commit(cur_);
        sub_ = Sub::invoke_body;
        return Advance::progress;
      }
      const std::string_view value = v.substr(value_start_, p - value_start_);
      std::string json;
      if (param_is_string_) {
        py_json_append_string(json, value);
      } else {
        json.assign(value);
      }
      params_.emplace_back(param_name_, std::move(json));
      sub_ = Sub::invoke_body;
      return Advance::progress;
    }
  }
  return Advance::fail;
}

void StreamParser::degrade(StreamDelta& out) {
  if (streaming_call_) close_streamed_call(out);
  out.content.append(buf_, 0, cur_);
  buf_.erase(0, cur_);
  cur_ = 0;
  state_ = State::content;
}

void StreamParser::emit_arguments(StreamDelta& out, std::string_view piece) {
  if (piece.empty()) return;
  if (!out.tool_calls.empty() && out.tool_calls.back().index == n_calls_) {
    out.tool_calls.back().arguments += piece;
  } else {
    out.tool_calls.push_back(ToolCallDelta{n_calls_, "", "", std::string(piece)});
  }
}

void StreamParser::emit_value(StreamDelta& out, size_t end) {
  const std::string_view value = std::string_view(buf_).substr(0, end);
  if (param_is_string_) {
    std::string escaped;
    py_json_append_escaped(escaped, value);
    emit_arguments(out, escaped);
  } else {
    emit_arguments(out, value);
  }
  commit(end);
}

void StreamParser::stream_value(StreamDelta& out) {
  const std::string end = tag("</", spelling_->parameter);
  const std::string_view view(buf_);
  const std::string_view markers[] = {end};
  const size_t hold = std::max(held_suffix(view, markers, 1), incomplete_utf8_tail(view));
  emit_value(out, view.size() - hold);
}

void StreamParser::close_streamed_call(StreamDelta& out) {
  if (sub_ == Sub::param_value && param_is_string_) emit_arguments(out, "\"");
  emit_arguments(out, params_.empty() ? "{}" : "}");
  params_.clear();
  streaming_call_ = false;
  ++n_calls_;
}

void StreamParser::commit(size_t end) {
  buf_.erase(0, end);
  cur_ -= std::min(cur_, end);
  value_start_ = 0;
  scan_ = 0;
}

void append_delta(StreamDelta& into, const StreamDelta& more) {
  into.reasoning_content += more.reasoning_content;
  into.content += more.content;
  for (const ToolCallDelta& d : more.tool_calls) {
    if (d.is_fragment() && !into.tool_calls.empty() && into.tool_calls.back().index == d.index) {
      into.tool_calls.back().arguments += d.arguments;
    } else {
      into.tool_calls.push_back(d);
    }
  }
}

void append_delta(ParsedCompletion& into, const StreamDelta& delta) {
  into.reasoning_content += delta.reasoning_content;
  into.content += delta.content;
  for (const ToolCallDelta& d : delta.tool_calls) {
    if (d.is_fragment() && !into.tool_calls.empty()) {
      into.tool_calls.back().arguments += d.arguments;
    } else {
      into.tool_calls.push_back(ToolCall{d.id, d.name, d.arguments});
    }
  }
}

ParsedCompletion parse_completion(std::string_view text, const StreamParserOptions& options) {
  StreamParser parser(options);
  ParsedCompletion result;
  append_delta(result, parser.push(text));
  append_delta(result, parser.finish());
  return result;
}

}  // namespace spw
