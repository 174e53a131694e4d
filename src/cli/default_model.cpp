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

bool is_default_model(const std::string& dir) {
  const std::string demo = default_model_dir();
  std::error_code ec;
  return !demo.empty() && std::filesystem::equivalent(dir, demo, ec);
}

}  // namespace spw::cli
