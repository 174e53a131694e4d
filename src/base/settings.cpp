#include "base/settings.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>

namespace spw {
namespace {

// The variable's value, or an empty view when it is unset.
std::string_view env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string_view(v) : std::string_view();
}

// A switch that is on unless the variable is exactly "0".
bool on_unless_zero(const char* name, bool dflt) { return env(name) == "0" ? false : dflt; }

}  // namespace

Settings settings_from_env() {
  Settings s;
  GpuSettings& g = s.gpu;
  g.pdl = on_unless_zero("SPILLWAY_PDL", g.pdl);
  const std::string_view mma = env("SPILLWAY_GEMV_MMA");
  g.gemv_mma = mma == "1" ? GemvMma::kOn : mma == "0" ? GemvMma::kOff : GemvMma::kAuto;
  g.kv_share_pages = on_unless_zero("SPILLWAY_KV_SHARE_PAGES", g.kv_share_pages);
  g.f32_split_gemm = !env("SPILLWAY_F32_SPLIT_GEMM").starts_with("0");
  g.attn_mma = on_unless_zero("SPILLWAY_ATTN_MMA", g.attn_mma);
  g.attn_vec4 = on_unless_zero("SPILLWAY_ATTN_VEC4", g.attn_vec4);
  g.attn_fused = on_unless_zero("SPILLWAY_ATTN_FUSED", g.attn_fused);
  g.exl3_grouped = on_unless_zero("SPILLWAY_EXL3_GROUPED", g.exl3_grouped);
  const std::string_view decode = env("SPILLWAY_EXL3_DECODE");
  g.exl3_decode = decode == "fused"     ? Exl3DecodeKernel::kFused
                  : decode == "grouped" ? Exl3DecodeKernel::kGrouped
                                        : Exl3DecodeKernel::kByRows;
  if (const char* rows = std::getenv("SPILLWAY_DENSE_DEVICE_ROWS")) g.dense_device_rows = std::max(0, std::atoi(rows));
  if (const char* spin = std::getenv("SPILLWAY_CPU_SPIN_US"); spin && *spin) s.cpu_spin_us = std::max(0, std::atoi(spin));
  return s;
}

const Settings& settings() {
  static const Settings s = settings_from_env();
  return s;
}

}  // namespace spw
