// base/settings.h: each SPILLWAY_* variable parsed with its documented meaning (docs/settings.md).
#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <utility>
#include <string>
#include <vector>

#include "base/settings.h"

namespace spw {
namespace {

// Sets variables for one test and unsets them afterwards.
class EnvScope {
 public:
  EnvScope(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [name, value] : vars) {
      setenv(name, value, 1);
      names_.push_back(name);
    }
  }
  ~EnvScope() {
    for (const std::string& n : names_) unsetenv(n.c_str());
  }

 private:
  std::vector<std::string> names_;
};

TEST(Settings, DefaultsWhenUnset) {
  const Settings s = settings_from_env();
  const Settings d;
  EXPECT_EQ(s.gpu.pdl, d.gpu.pdl);
  EXPECT_TRUE(s.gpu.pdl);
  EXPECT_EQ(s.gpu.gemv_mma, GemvMma::kAuto);
  EXPECT_TRUE(s.gpu.kv_share_pages);
  EXPECT_TRUE(s.gpu.f32_split_gemm);
  EXPECT_TRUE(s.gpu.attn_mma && s.gpu.attn_vec4 && s.gpu.attn_fused && s.gpu.exl3_grouped);
  EXPECT_EQ(s.gpu.exl3_decode, Exl3DecodeKernel::kByRows);
  EXPECT_EQ(s.gpu.dense_device_rows, 0);
  EXPECT_EQ(s.cpu_spin_us, 200);
}

TEST(Settings, SwitchesTurnOffOnlyOnTheirExactValue) {
  {
    EnvScope env{{"SPILLWAY_PDL", "0"}, {"SPILLWAY_ATTN_MMA", "0"}, {"SPILLWAY_ATTN_VEC4", "0"},
                 {"SPILLWAY_ATTN_FUSED", "0"}, {"SPILLWAY_EXL3_GROUPED", "0"}, {"SPILLWAY_F32_SPLIT_GEMM", "0"},
                 {"SPILLWAY_KV_SHARE_PAGES", "0"}};
    const GpuSettings g = settings_from_env().gpu;
    EXPECT_FALSE(g.pdl || g.attn_mma || g.attn_vec4 || g.attn_fused || g.exl3_grouped || g.f32_split_gemm ||
                 g.kv_share_pages);
  }
  {
    EnvScope env{{"SPILLWAY_PDL", "00"}, {"SPILLWAY_ATTN_FUSED", "off"}, {"SPILLWAY_EXL3_GROUPED", ""},
                 {"SPILLWAY_KV_SHARE_PAGES", "1"}};
    const GpuSettings g = settings_from_env().gpu;
    EXPECT_TRUE(g.pdl && g.attn_fused && g.exl3_grouped && g.kv_share_pages);
  }
}

TEST(Settings, OptInsAndValues) {
  EnvScope env{{"SPILLWAY_GEMV_MMA", "1"}, {"SPILLWAY_EXL3_DECODE", "grouped"},
               {"SPILLWAY_DENSE_DEVICE_ROWS", "16"}, {"SPILLWAY_CPU_SPIN_US", "0"}};
  const Settings s = settings_from_env();
  EXPECT_EQ(s.gpu.gemv_mma, GemvMma::kOn);
  EXPECT_EQ(s.gpu.exl3_decode, Exl3DecodeKernel::kGrouped);
  EXPECT_EQ(s.gpu.dense_device_rows, 16);
  EXPECT_EQ(s.cpu_spin_us, 0);
}

TEST(Settings, UnrecognizedValuesKeepTheDefaults) {
  EnvScope env{{"SPILLWAY_EXL3_DECODE", "fastest"}, {"SPILLWAY_DENSE_DEVICE_ROWS", "-5"},
               {"SPILLWAY_CPU_SPIN_US", "-3"}, {"SPILLWAY_GEMV_MMA", "yes"}};
  const Settings s = settings_from_env();
  EXPECT_EQ(s.gpu.exl3_decode, Exl3DecodeKernel::kByRows);
  EXPECT_EQ(s.gpu.dense_device_rows, 0);
  EXPECT_EQ(s.cpu_spin_us, 0);  // clamped, as the thread pool always did
  EXPECT_EQ(s.gpu.gemv_mma, GemvMma::kAuto);
  EnvScope fused{{"SPILLWAY_EXL3_DECODE", "fused"}};
  EnvScope off{{"SPILLWAY_GEMV_MMA", "0"}};
  EXPECT_EQ(settings_from_env().gpu.gemv_mma, GemvMma::kOff);
  EXPECT_EQ(settings_from_env().gpu.exl3_decode, Exl3DecodeKernel::kFused);
}

}  // namespace
}  // namespace spw
