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

  // What a placement needs (runtime/placement.h). Routed experts are excluded from every
  // "dense" figure below; draft stages and the vision tower are excluded from all of them.
  // [layer][expert]: bytes of routed expert `expert` of backbone layer `layer` (0 where the
  // checkpoint has none; indices past config.n_experts are not counted here).
  std::vector<std::vector<int64_t>> expert_nbytes_by_layer;
  int64_t dense_nbytes = 0;                  // device-resident weights: all but routed experts and Engram tables
  int64_t dense_decode_nbytes_per_token = 0;  // of those, read per decoded token (every dense weight, one embedding row)
  int64_t engram_table_nbytes = 0;            // Engram tables, kept in host RAM
  int64_t engram_decode_nbytes_per_token = 0;  // Engram rows gathered per decoded token
};

// The role of a tensor from its released name ("model." prefix already stripped).
std::string tensor_role(const std::string& name);

Inventory take_inventory(const Checkpoint& ckpt, const ModelConfig& config);

}  // namespace spw
