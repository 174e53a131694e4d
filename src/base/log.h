// Logging through spdlog: one logger, level set once from settings at start-up.
#pragma once

#include <spdlog/spdlog.h>

namespace spw {
// Levels: "trace", "debug", "info", "warn", "error", "off".
void log_init(const std::string& level);
}  // namespace spw

#define SPW_LOG_INFO(...) spdlog::info(__VA_ARGS__)
#define SPW_LOG_WARN(...) spdlog::warn(__VA_ARGS__)
#define SPW_LOG_DEBUG(...) spdlog::debug(__VA_ARGS__)
#define SPW_LOG_ERROR(...) spdlog::error(__VA_ARGS__)
