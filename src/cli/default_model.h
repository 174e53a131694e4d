// The bundled demo model (models/demo), used by `serve` and `run` when no --model is given.
#pragma once

#include <string>
#include <vector>

namespace spw::cli {

// The first that exists of: <exe>/../../models/demo (the build tree), <exe>/../share/spillway/models/demo
// (an install), and the source tree this binary was built from. Empty if none exists.
std::string default_model_dir();

// Whether dir is that directory (the same files, whatever the path's spelling).
bool is_default_model(const std::string& dir);

}  // namespace spw::cli
