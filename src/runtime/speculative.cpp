#include "runtime/speculative.h"

#include <algorithm>

namespace spw::runtime {

Result<SpeculativeMode> parse_speculative_mode(std::string_view name) {
  if (name == "off") return SpeculativeMode::off;
  if (name == "ngram") return SpeculativeMode::ngram;
  return make_error("unknown speculative mode '", name, "': use off or ngram");
}

const char* to_string(SpeculativeMode mode) { return mode == SpeculativeMode::ngram ? "ngram" : "off"; }

void DraftLength::on_step() {
  if (cooldown_ > 0) --cooldown_;
}

void DraftLength::on_verified(int drafted, int accepted) {
  if (drafted <= 0) return;
  if (accepted >= drafted) {
    len_ = std::min(max_, 2 * len_);
    failures_ = 0;
    return;
  }
  len_ = std::clamp(accepted + 1, 1, max_);
  if (accepted > 0) {
    failures_ = 0;
    return;
  }
  cooldown_ = std::min(kMaxCooldown, 1 << std::min(failures_, 6));
  ++failures_;
}

}  // namespace spw::runtime
