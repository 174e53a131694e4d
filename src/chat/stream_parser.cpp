// The grammar follows the official parse_tool_calls(), with whitespace between tags tolerated:
//   "\n\n"? <｜DSML｜B> ws (<｜DSML｜I ws name="N"> ws (<｜DSML｜P name="K" string="true|false">V</｜DSML｜P> ws)*
//   </｜DSML｜I> ws)* </｜DSML｜B>
// with B/I/P = tool_calls/invoke/parameter (V4) or " calls"/" invoke"/" parameter" (V4.1).
// Block parsing is resumable: cur_ and scan_ remember how far the buffer has been checked, so a
// long argument fed byte by byte costs O(length), not O(length²).
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
    const Step step = block_step(out);
    if (step == Step::need_more) return;
    if (step == Step::fail) degrade(out);
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
StreamParser::Step StreamParser::block_step(StreamDelta& out) {
  const std::string_view b(buf_);
  const DsmlSpelling& s = *spelling_;
  auto skip_ws = [&] {
    while (cur_ < b.size() && is_ws(b[cur_])) ++cur_;
  };
  // Matches lit at cur_ and advances past it.
  auto expect = [&](std::string_view lit) -> Step {
    switch (match_at(b, cur_, lit)) {
      case Match::yes: cur_ += lit.size(); return Step::progress;
      case Match::partial: return Step::need_more;
      case Match::no: return Step::fail;
    }
    return Step::fail;
  };
  // Reads up to (not including) the next '"' into dst.
  auto read_quoted = [&](std::string& dst) -> Step {
    const size_t q = b.find('"', cur_);
    if (q == std::string_view::npos) return Step::need_more;
    dst.assign(b.substr(cur_, q - cur_));
    cur_ = q;
    return Step::progress;
  };

  switch (sub_) {
    case Sub::invoke_or_close: {
      skip_ws();
      if (cur_ == b.size()) return Step::need_more;
      const std::string invoke = tag("<", s.invoke);
      const std::string close = tag("</", s.block, ">");
      const Match mi = match_at(b, cur_, invoke);
      const Match mc = match_at(b, cur_, close);
      if (mi == Match::yes) {
        cur_ += invoke.size();
        sub_ = Sub::invoke_name;
        return Step::progress;
      }
      if (mc == Match::yes) {
        cur_ += close.size();
        buf_.erase(0, cur_);
        cur_ = 0;
        state_ = State::content;
        return Step::progress;
      }
      return mi == Match::partial || mc == Match::partial ? Step::need_more : Step::fail;
    }
    case Sub::invoke_name: {
      // A restart from the tag's end keeps this idempotent when more text is needed.
      const size_t start = cur_;
      skip_ws();
      Step st = expect("name=\"");
      if (st == Step::progress) st = read_quoted(call_name_);
      if (st == Step::progress) st = expect("\">");
      if (st == Step::need_more) {
        cur_ = start;
        return st;
      }
      if (st == Step::fail) return st;
      params_.clear();
      sub_ = Sub::invoke_body;
      return Step::progress;
    }
    case Sub::invoke_body: {
      skip_ws();
      if (cur_ == b.size()) return Step::need_more;
      const std::string param = tag("<", s.parameter);
      const std::string end = tag("</", s.invoke, ">");
      const Match mp = match_at(b, cur_, param);
      const Match me = match_at(b, cur_, end);
      if (mp == Match::yes) {
        param_start_ = cur_;
        cur_ += param.size();
        sub_ = Sub::param_head;
        return Step::progress;
      }
      if (me == Match::yes) {
        cur_ += end.size();
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
        return Step::progress;
      }
      return mp == Match::partial || me == Match::partial ? Step::need_more : Step::fail;
    }
    case Sub::param_head: {
      const size_t start = cur_;
      Step st = expect(" name=\"");
      if (st == Step::progress) st = read_quoted(param_name_);
      if (st == Step::progress) st = expect("\" string=\"");
      if (st == Step::progress) {
        const Match mt = match_at(b, cur_, "true");
        const Match mf = match_at(b, cur_, "false");
        if (mt == Match::yes || mf == Match::yes) {
          param_is_string_ = mt == Match::yes;
          cur_ += param_is_string_ ? 4 : 5;
        } else {
          st = mt == Match::partial || mf == Match::partial ? Step::need_more : Step::fail;
        }
      }
      if (st == Step::progress) st = expect("\">");
      if (st == Step::need_more) {
        cur_ = start;
        return st;
      }
      if (st == Step::fail) return st;
      const bool duplicate = std::any_of(params_.begin(), params_.end(),
                                         [&](const auto& p) { return p.first == param_name_; });
      if (duplicate) {
        cur_ = param_start_;
        return Step::fail;
      }
      value_start_ = cur_;
      scan_ = cur_;
      sub_ = Sub::param_value;
      return Step::progress;
    }
    case Sub::param_value: {
      const std::string end = tag("</", s.parameter);
      const size_t p = b.find(end, scan_);
      if (p == std::string_view::npos) {
        scan_ = std::max(value_start_, b.size() >= end.size() ? b.size() - end.size() + 1 : 0);
        return Step::need_more;
      }
      cur_ = p + end.size();
      if (cur_ == b.size()) {
        cur_ = value_start_;
        scan_ = p;
        return Step::need_more;
      }
      if (b[cur_] != '>') return Step::fail;
      ++cur_;
      const std::string_view value = b.substr(value_start_, p - value_start_);
      std::string json;
      if (param_is_string_) {
        py_json_append_string(json, value);
      } else {
        json.assign(value);
      }
      params_.emplace_back(param_name_, std::move(json));
      sub_ = Sub::invoke_body;
      return Step::progress;
    }
  }
  return Step::fail;
}

void StreamParser::degrade(StreamDelta& out) {
  out.content.append(buf_, 0, cur_);
  buf_.erase(0, cur_);
  cur_ = 0;
  state_ = State::content;
}

void append_delta(ParsedCompletion& into, const StreamDelta& delta) {
  into.reasoning_content += delta.reasoning_content;
  into.content += delta.content;
  for (const ToolCallDelta& d : delta.tool_calls) {
    into.tool_calls.push_back(ToolCall{d.id, d.name, d.arguments});
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
