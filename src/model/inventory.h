// A checkpoint's inventory for `spillway inspect`: tensors grouped by role and format,
// parameter counts, and the weight bytes one decoded token reads (specs §2, §6).
// Works on header-only checkpoints (no tensor data needed).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "model/config.h"

namespace spw {

struct InventoryGroup {
  int64_t n_tensors = 0;
  int64_t n_params = 0;  // logical weights (an I8 MXFP4 byte holds two)
  int64_t nbytes = 0;
  std::map<std::string, int64_t> nbytes_by_dtype;
};

struct Inventory {
  std::map<std::string, InventoryGroup> groups;  // by role: "attention", "routed experts", ...
  InventoryGroup total;
  int n_layers_found = 0;
  std::vector<int> experts_per_layer;  // distinct routed experts found per backbone layer
  int64_t decode_nbytes_per_token = 0;  // weights read to decode one token (top_k experts per layer)
  int64_t expert_nbytes = 0;            // one routed expert (w1+w2+w3 with scales), layer 0
};

// The role of a tensor from its released name ("model." prefix already stripped).
std::string tensor_role(const std::string& name);

Inventory take_inventory(const Checkpoint& ckpt, const ModelConfig& config);

}  // namespace spw
