#include "cli/default_model.h"

#include <filesystem>

namespace spw::cli {

std::string default_model_dir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> candidates;
  if (!ec) {
    candidates.push_back(exe.parent_path() / "../../models/demo");
    candidates.push_back(exe.parent_path() / "../share/spillway/models/demo");
  }
  candidates.push_back(fs::path(SPW_SOURCE_DIR) / "models/demo");
  for (const auto& c : candidates)
    if (fs::exists(c / "config.json", ec)) return fs::weakly_canonical(c, ec).string();
  return {};
}

}  // namespace spw::cli
