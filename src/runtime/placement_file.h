// The placement file `spillway plan` writes and the GPU runtime reads (docs/placement.md "Placement
// file"): format "spillway-placement" version 1, a JSON object whose "layers" array holds, per layer,
// the expert indices of each tier ({"gpu": [...], "host_gpu": [...], "host_cpu": [...]}); every expert
// of every layer appears exactly once. The other fields record the inputs and the prediction for
// people; a reader needs only model_type, n_layers, n_experts and layers.
// Tests: tests/unit/test_runtime_placement.cpp (round trip, malformed files).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/placement.h"

namespace spw::runtime {

constexpr const char* kPlacementFormat = "spillway-placement";
constexpr int kPlacementVersion = 1;

// The JSON text of a placement (pretty-printed, one line per tier list).
std::string placement_to_json(const Placement& plan);

// What a runtime needs from a placement file.
struct PlacementFile {
  std::string model_type;
  int n_layers = 0, n_experts = 0;
  std::vector<std::vector<ExpertTier>> tiers;  // [layer][expert]
};

// Parses and validates a placement file; `source` names it in errors.
Result<PlacementFile> parse_placement(const std::string& json_text, const std::string& source);

}  // namespace spw::runtime
