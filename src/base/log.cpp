#include "base/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace spw {

void log_init(const std::string& level) {
  // Logs go to stderr so that generated text on stdout stays clean for pipes.
  auto logger = spdlog::stderr_color_mt("spillway");
  logger->set_pattern("%^[%H:%M:%S.%e %l]%$ %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
}

}  // namespace spw
