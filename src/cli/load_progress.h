// Progress of loading a checkpoint's layers: a bar redrawn in place when stderr is a terminal, else a
// log line at each quarter (so a log file shows that loading moves without a line per layer).
#pragma once

#include <functional>
#include <string>

namespace spw::cli {

std::function<void(int done, int total)> layer_progress(std::string what);
// The same for other units ("sequences", ...).
std::function<void(int done, int total)> progress(std::string what, std::string unit);

}  // namespace spw::cli
