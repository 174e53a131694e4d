#include "cli/load_progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "base/log.h"

namespace spw::cli {

std::function<void(int, int)> layer_progress(std::string what) { return progress(std::move(what), "layers"); }

std::function<void(int, int)> progress(std::string what, std::string unit) {
  const auto start = std::chrono::steady_clock::now();
  auto last_quarter = std::make_shared<int>(0);
  return [what = std::move(what), unit = std::move(unit), start, last_quarter](int done, int total) {
    if (total <= 0) return;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (isatty(STDERR_FILENO)) {
      constexpr int kWidth = 30;
      const int filled = done * kWidth / total;
      std::fprintf(stderr, "\r%s [%.*s%*s] %d/%d %s, %.0f s%s", what.c_str(), filled,
                   "##############################", kWidth - filled, "", done, total, unit.c_str(), seconds,
                   done == total ? "\n" : "");
      return;
    }
    const int quarter = done * 4 / total;
    if (quarter > *last_quarter) {
      *last_quarter = quarter;
      SPW_LOG_INFO("{}: {}/{} {} ({:.0f} s)", what, done, total, unit, seconds);
    }
  };
}

}  // namespace spw::cli
