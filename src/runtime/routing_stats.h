// Routing statistics: how often the router chose each routed expert of each layer on a workload.
// `spillway plan` reads them to put the hottest experts in HBM; a recorder in the server writes them.
// File format (docs/placement.md "Routing statistics"):
//   {"model": "deepseek_v41", "n_tokens": N, "layers": [[count per expert], ... one row per layer]}
// count[l][e] is how many of the N tokens layer l sent to expert e (each token picks top_k experts,
// so a row sums to at most N × top_k). Every malformed input yields an Error naming the file and the
// offending field; nothing throws. Tests: tests/unit/test_runtime_placement.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace spw::runtime {

struct RoutingStats {
  std::string model;                         // what the statistics were recorded on (informational)
  int64_t n_tokens = 0;                      // tokens routed (> 0)
  std::vector<std::vector<int64_t>> counts;  // [layer][expert], each ≥ 0
};

// Parses the JSON text; `source` names the file in errors. Checks the shape of the document only;
// check_routing_stats checks it against a model.
Result<RoutingStats> parse_routing_stats(const std::string& json_text, const std::string& source);
Result<RoutingStats> read_routing_stats(const std::string& path);
// The file's JSON text (one line per layer).
std::string routing_stats_to_json(const RoutingStats& stats);
// Writes that text to `path` (replacing it); the error names the path.
Status write_routing_stats(const RoutingStats& stats, const std::string& path);

// The statistics fit a model of n_layers layers of n_experts experts choosing top_k each: one row per
// layer, one count per expert, a row sum in (0, n_tokens × top_k].
Status check_routing_stats(const RoutingStats& stats, int n_layers, int n_experts, int top_k,
                           const std::string& source);

}  // namespace spw::runtime
