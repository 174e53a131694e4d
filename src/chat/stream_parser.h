// Streaming parser for generated DeepSeek V4 / V4.1 text → OpenAI-shaped deltas.
//
// Feed the text pieces an incremental detokenizer yields (special tokens spelled out); get
// `reasoning_content` (everything before `</think>` when the prompt ended in thinking mode), then
// `content`, and `tool_calls` parsed from DSML blocks. Both spellings are recognised whatever the
// model: V4 `<｜DSML｜tool_calls>` / `<｜DSML｜invoke name="…">` / `<｜DSML｜parameter …>` and V4.1
// `<｜DSML｜ calls>` / `<｜DSML｜ invoke …>` / `<｜DSML｜ parameter …>`.
//
// Contract:
//   - Text is emitted as soon as it cannot be the start of markup; only a suffix that could still
//     become `</think>`, `<｜end▁of▁sentence｜>` or a DSML block opener (with the "\n\n" the
//     encoder puts before it) is held back. Inside a DSML block, by default, text is held until
//     the current invoke closes; each tool call is emitted whole (index, id, name, arguments) at
//     its `</｜DSML｜invoke>`. With `stream_arguments`, a call is emitted as soon as its invoke
//     header is complete (index, id, name, arguments ""), and its arguments follow as fragments
//     (ToolCallDelta with an empty id) as the values arrive, holding back only text that could
//     still be a parameter's closing tag or an incomplete UTF-8 sequence.
//   - Arguments are built as the official decoder builds them: `{"k": v, ...}` in Python json
//     style, v = the JSON-quoted text for string="true", the raw text for string="false".
//   - Malformed DSML (an unexpected byte, a duplicate parameter, an unterminated block at
//     finish()) turns the unparsed markup back into plain content: no text is lost, nothing aborts.
//     A streamed call cannot be taken back: its arguments are closed where the markup went wrong
//     (an open string value gets its quote, the object its brace) and only the markup after the
//     last emitted byte becomes content.
//   - `<｜end▁of▁sentence｜>` is swallowed. Text after a closed DSML block is content again.
//   - The concatenation of all deltas (and the tool-call list, fragments appended to their call)
//     does not depend on how the stream is split into pieces. For well-formed DSML it does not
//     depend on `stream_arguments` either.
// Tests: tests/unit/test_chat_stream_parser.cpp; fuzz target fuzz/fuzz_stream_parser.cpp.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/chat_encoding.h"
#include "chat/dsml.h"

namespace spw {

// A tool call, or (empty id and name) a fragment of the arguments of call `index`.
struct ToolCallDelta {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments;  // the JSON object text, or the fragment's piece of it
  bool is_fragment() const { return id.empty(); }
};

struct StreamDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
};
// Appends `more` to `into`, a fragment joining the call before it when that is its call.
void append_delta(StreamDelta& into, const StreamDelta& more);

struct StreamParserOptions {
  bool thinking = false;                  // the prompt ended in `<think>`
  std::string tool_call_id_prefix = "call_";  // ids are prefix + index; make it unique per request
  bool tool_calls = true;  // false (tool_choice "none"): DSML blocks are plain content, never calls
  bool stream_arguments = false;  // emit calls at their invoke header and arguments as they arrive
};

class StreamParser {
 public:
  explicit StreamParser(StreamParserOptions options);
  StreamDelta push(std::string_view text);
  StreamDelta finish();  // flushes held-back text; the parser is spent afterwards

 private:
  enum class State { reasoning, content, block };
  enum class Sub { invoke_or_close, invoke_name, invoke_body, param_head, param_value };
  enum class Advance { progress, need_more, fail };

  void run(StreamDelta& out);
  bool scan_text(StreamDelta& out);  // reasoning / content states; true when a marker was consumed
  Advance advance_block(StreamDelta& out);
  void degrade(StreamDelta& out);    // buf_[0, cur_) back to content
  // Streamed calls: buf_ always starts at the first byte not yet emitted.
  void emit_arguments(StreamDelta& out, std::string_view piece);
  void emit_value(StreamDelta& out, size_t end);  // buf_[0, end) as value text, then erased
  void stream_value(StreamDelta& out);            // the value text that cannot be markup
  void close_streamed_call(StreamDelta& out);     // the arguments' closing quote and brace
  void commit(size_t end);                        // buf_[0, end) consumed

  StreamParserOptions options_;
  State state_;
  std::string buf_;  // unconsumed text; in block state it starts at the uncommitted markup
  // Block state.
  const DsmlSpelling* spelling_ = nullptr;
  Sub sub_ = Sub::invoke_or_close;
  size_t cur_ = 0;          // parse position in buf_
  size_t param_start_ = 0;  // where the current <｜DSML｜parameter tag began
  size_t value_start_ = 0;
  size_t scan_ = 0;         // resume point for terminator searches
  std::string call_name_;
  std::string param_name_;
  bool param_is_string_ = false;
  std::vector<std::pair<std::string, std::string>> params_;  // name → JSON value text ("" when streamed)
  int n_calls_ = 0;
  bool streaming_call_ = false;  // the current call's header was emitted (stream_arguments)
};

// The final message assembled from deltas, and one-shot parsing of a whole completion.
struct ParsedCompletion {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCall> tool_calls;
};
void append_delta(ParsedCompletion& into, const StreamDelta& delta);
ParsedCompletion parse_completion(std::string_view text, const StreamParserOptions& options);

}  // namespace spw
