// Special-token spellings of the DeepSeek V4 / V4.1 chat format (spec §8), shared by the prompt
// encoder and the streaming output parser. V4.1 renames the DSML tags: `tool_calls` becomes
// ` calls`, and `invoke` / `parameter` gain a leading space.
#pragma once

#include <string_view>

namespace spw::chat_tokens {

inline constexpr std::string_view bos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view eos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view user = "<｜User｜>";
inline constexpr std::string_view assistant = "<｜Assistant｜>";
inline constexpr std::string_view system = "<｜System｜>";  // V4.1 only
inline constexpr std::string_view think_open = "<think>";
inline constexpr std::string_view think_close = "</think>";
inline constexpr std::string_view image = "<｜deepseek_image｜>";  // V4.1 image placeholder
inline constexpr std::string_view dsml = "｜DSML｜";

}  // namespace spw::chat_tokens

namespace spw {

// The DSML tag names of one family, e.g. "<" + dsml + block + ">".
struct DsmlSpelling {
  std::string_view block;      // "tool_calls" | " calls"
  std::string_view invoke;     // "invoke" | " invoke"
  std::string_view parameter;  // "parameter" | " parameter"
};

inline constexpr DsmlSpelling kDsmlV4{"tool_calls", "invoke", "parameter"};
inline constexpr DsmlSpelling kDsmlV41{" calls", " invoke", " parameter"};

}  // namespace spw
