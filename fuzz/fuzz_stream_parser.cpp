// libFuzzer target for StreamParser (src/chat/stream_parser.h). Input: byte 0 = flags (bit 0:
// thinking), byte 1 = split seed, the rest = generated text. Checks, aborting on violation:
//   - whole-text, seeded-split and byte-by-byte feeding give identical results, with whole calls and
//     with streamed arguments;
//   - when no tool call was emitted and the text holds neither an end-of-sentence token nor a DSML
//     block close (an empty block is valid markup and is consumed), no text is lost:
//     reasoning + "</think>" (if one closed the reasoning) + content == the input text;
//   - every emitted tool call, whole or streamed, has arguments shaped "{...}" and ids
//     "call_<index>" in order.
// Build and run: fuzz/chat/run.sh [SECONDS].
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "chat/stream_parser.h"

namespace {

using spw::ParsedCompletion;

ParsedCompletion parse_split(std::string_view text, bool thinking, bool stream_arguments, uint32_t seed, int mode) {
  spw::StreamParserOptions options{thinking, "call_"};
  options.stream_arguments = stream_arguments;
  spw::StreamParser p(options);
  ParsedCompletion out;
  size_t i = 0;
  uint32_t state = seed * 2654435761u + 1;
  while (i < text.size()) {
    size_t n = text.size() - i;
    if (mode == 1) {
      state = state * 1664525u + 1013904223u;
      n = std::min<size_t>(n, 1 + (state >> 24) % 16);
    } else if (mode == 2) {
      n = 1;
    }
    spw::append_delta(out, p.push(text.substr(i, n)));
    i += n;
  }
  spw::append_delta(out, p.finish());
  return out;
}

bool same(const ParsedCompletion& a, const ParsedCompletion& b) {
  if (a.reasoning_content != b.reasoning_content || a.content != b.content) return false;
  if (a.tool_calls.size() != b.tool_calls.size()) return false;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    if (a.tool_calls[i].id != b.tool_calls[i].id || a.tool_calls[i].name != b.tool_calls[i].name ||
        a.tool_calls[i].arguments != b.tool_calls[i].arguments) {
      return false;
    }
  }
  return true;
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "stream parser invariant violated: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const bool thinking = data[0] & 1;
  const uint32_t seed = data[1];
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);

  for (const bool stream_arguments : {false, true}) {
    const ParsedCompletion all = parse_split(text, thinking, stream_arguments, seed, 0);
    if (!same(all, parse_split(text, thinking, stream_arguments, seed, 1))) fail("seeded split differs from whole");
    if (!same(all, parse_split(text, thinking, stream_arguments, seed, 2))) fail("byte-by-byte differs from whole");
    for (size_t i = 0; i < all.tool_calls.size(); ++i) {
      const std::string& args = all.tool_calls[i].arguments;
      if (args.size() < 2 || args.front() != '{' || args.back() != '}') fail("arguments not {...}");
      if (all.tool_calls[i].id != "call_" + std::to_string(i)) fail("tool call ids out of order");
    }
  }
  const ParsedCompletion whole = parse_split(text, thinking, false, seed, 0);
  const std::string close_v4 = "</" + std::string(spw::chat_tokens::dsml) + std::string(spw::kDsmlV4.block) + ">";
  const std::string close_v41 = "</" + std::string(spw::chat_tokens::dsml) + std::string(spw::kDsmlV41.block) + ">";
  const bool consumed_markup = text.find(spw::chat_tokens::eos) != std::string_view::npos ||
                               text.find(close_v4) != std::string_view::npos ||
                               text.find(close_v41) != std::string_view::npos;
  if (whole.tool_calls.empty() && !consumed_markup) {
    const size_t close = text.find(spw::chat_tokens::think_close);
    const bool closed = thinking && close != std::string_view::npos;
    const std::string rebuilt =
        whole.reasoning_content + (closed ? std::string(spw::chat_tokens::think_close) : "") + whole.content;
    if (rebuilt != text) fail("text lost");
  }
  return 0;
}
