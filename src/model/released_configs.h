// The released config.json files, embedded at build time from models/configs/ (the one copy, which
// tools/make_header_only_checkpoint.py and tools/synth/make_synthetic_model.py read too).
#pragma once

#include <string_view>

namespace spw {

// DeepSeek-V4.1-Flash's config.json (specs/deepseek-v4.md §1.2).
std::string_view released_config_v41_flash();

}  // namespace spw
