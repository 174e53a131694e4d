// A synthetic DeepSeek-V4.1-Flash built in memory, for `spillway bench --synthetic`: the released config and
// tensor layout with random weights in the released formats, so that the whole 40-layer model (127 GiB of routed
// experts at 2 bits, 190 GiB at 3) can be benchmarked on a machine whose disk cannot hold it.
//
// It is the in-memory twin of tools/synth/make_synthetic_model.py (same config rules, names, dtypes, shapes and
// value scales; tests/python/test_synth_model.py checks that both give the same memory plan and costs):
//   - config: models/configs/deepseek-v4.1-flash.json (embedded at build time) cut to layers 0..N-1, with the
//     layer-role ids kept below N, no draft layers or vision tower, a smaller Engram vocabulary
//     (engram_vocab_size; the real 16M gives 98 GB tables) and, for EXL3 experts, the quantization_config a
//     `spillway quantize` pack carries;
//   - weights: FP8 e4m3 codes ~N(0, 16²) under ue8m0 block scales chosen so a linear's weights have std
//     ~1/sqrt(fan_in); random trellis words (every word is a valid EXL3 code) with suh = ±1, svh = ±1/sqrt(k); or
//     random MXFP4 nibbles with a matching scale; BF16/F32 ~N(0, σ²) by role; norms ~1; a random Engram token map.
// To keep host memory to one copy of what the engine uploads, the large random tensors (routed experts, FP8
// weight codes, Engram tables) are windows at pseudo-random offsets into a few shared pools of random bytes:
// every expert has its own bytes in HBM or pinned memory once uploaded, but their values repeat shifted windows
// of one pool. Timing does not depend on the values beyond routing, which the router's random weights (and the
// routing skew) decide. Norms, biases, routers, mHC and the embedding are generated per tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "base/status.h"
#include "formats/safetensors.h"
#include "model/config.h"

namespace spw {

struct SyntheticSpec {
  std::string name = "v41-flash";  // the released model it copies; only "v41-flash" is built in memory
  int layers = 40;                 // the real model's layers 0..layers-1
  int expert_bits = 3;             // routed experts as EXL3 with this many bits per weight (1..8); 0: MXFP4
  int width_divisor = 1;           // > 1 shrinks the widths (tests); 1 is the real model
  int64_t engram_vocab = 100000;   // engram_vocab_size (the released 16,000,000 gives 98 GB tables)
  double routing_skew = 0;         // > 0: router bias −skew·ln(1 + rank) over a random ranking of each layer's experts
  uint64_t seed = 0;
};

struct SyntheticModel {
  std::string config_json;  // what its config.json would say
  ModelConfig config;
  Checkpoint checkpoint;    // every tensor, in memory (Checkpoint::in_memory)
};

// Builds the model; errors name the bad spec field, or say how much host memory the build needs when more than is
// available (the Engram tables grow with engram_vocab). `on_progress(done, total)` reports layers built.
Result<SyntheticModel> make_synthetic_model(const SyntheticSpec& spec,
                                            const std::function<void(int, int)>& on_progress = {});

// "synthetic v41-flash, 40 layers, EXL3 3-bit experts" — what logs and reports call it.
std::string synthetic_model_name(const SyntheticSpec& spec);

}  // namespace spw
