// The settings that have no command-line flag: SPILLWAY_* environment variables read once, on the first
// call of settings() (the CLI calls it at start-up), into one struct. Nothing outside src/base reads the
// environment: the CLI (or a test or benchmark main) passes these values down, to the kernel libraries
// through their setters and to the engine through its options. Every variable is described in
// docs/settings.md.
//
// Parsing keeps each variable's documented meaning: an on/off switch is off only for the exact value it
// names ("0", or "1" for the opt-in ones), and an unset, empty or unrecognized value keeps the default.
#pragma once

namespace spw {

// How the engine runs EXL3 routed experts of decode steps (SPILLWAY_EXL3_DECODE).
enum class Exl3DecodeKernel { kByRows, kFused, kGrouped };

// FP8 and BF16 decode linears on tensor cores (SPILLWAY_GEMV_MMA): kAuto takes them for batch-invariant decoding
// (each batch then computes every row as alone, the weight read once per 64 rows: the tensor cores win from 4 rows
// and lose little at one) and the scalar weight-streaming GEMV otherwise (faster at one row).
enum class GemvMma { kAuto, kOff, kOn };

// GPU kernel and engine switches, mostly for A/B timing and numerics checks.
struct GpuSettings {
  bool pdl = true;             // SPILLWAY_PDL: programmatic dependent launch where the GPU has it (sm_90+)
  GemvMma gemv_mma = GemvMma::kAuto;  // SPILLWAY_GEMV_MMA: 1 | 0 | auto (see above)
  bool f32_split_gemm = true;  // SPILLWAY_F32_SPLIT_GEMM: f32-product linears as a 3-plane bf16 GEMM
  bool attn_mma = true;        // SPILLWAY_ATTN_MMA: tensor-core sparse attention under SparseAttnPath::kAuto
  bool attn_vec4 = true;       // SPILLWAY_ATTN_VEC4: four channels per lane step when decoding stored KV rows
  bool attn_fused = true;      // SPILLWAY_ATTN_FUSED: the split attention path as one cooperative launch
  bool exl3_grouped = true;    // SPILLWAY_EXL3_GROUPED: EXL3 experts of host-dispatched steps in grouped launches
  Exl3DecodeKernel exl3_decode = Exl3DecodeKernel::kByRows;  // SPILLWAY_EXL3_DECODE: fused | grouped
  int dense_device_rows = 0;  // SPILLWAY_DENSE_DEVICE_ROWS: > 0 overrides the engine's device-dispatch limit
  bool kv_share_pages = true;  // SPILLWAY_KV_SHARE_PAGES: prefix-cache copies share full KV pages (GpuModelOptions)
};

struct Settings {
  GpuSettings gpu;
  int cpu_spin_us = 200;  // SPILLWAY_CPU_SPIN_US: how long an idle CPU worker polls before it sleeps
};

// Reads the environment now (for tests of the parsing; everything else uses settings()).
Settings settings_from_env();
// The process's settings, read from the environment once, on the first call.
const Settings& settings();

}  // namespace spw
