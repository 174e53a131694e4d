// One layer of `spillway quantize`: its selected routed experts quantized to EXL3 (on the CPU or the GPU), its pack
// shard and its per-tensor report. quantize_model.cpp plans, calibrates and calls this once per pending layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "formats/exl3.h"
#include "formats/safetensors.h"
#include "quantize/hessian_file.h"
#include "quantize/quantize_model.h"

namespace spw::quant {

struct LayerJob {
  int layer = 0;
  std::vector<int> experts;        // expert ids, in order
  std::vector<std::string> stems;  // [expert slot][w1, w2, w3], the checkpoint's own names
  const LayerHessianFile* hessians = nullptr;  // null: identity Hessian (uncalibrated)
  std::string shard_path, report_path;         // written atomically when every tensor is done
  std::string label;                           // progress bar label
};

// Settings shared by every layer of one run.
struct LayerQuantizer {
  const QuantizeModelOptions& options;
  const Checkpoint& source;
  Exl3Codebook codebook;
  int d = 0, f = 0;  // d_model, d_expert
  int threads = 1;
  int dumps_left = 0;  // --dump-wh tensors still to write (decremented across layers)
};

Status quantize_layer(LayerQuantizer& q, const LayerJob& job, ThreadPool& pool);

// "1h05m", "3m20s", "4.2s" (progress and plan).
std::string format_seconds(double seconds);

}  // namespace spw::quant
