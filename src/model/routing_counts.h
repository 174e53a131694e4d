// How often each layer's router picked each routed expert over a serving run (`serve --record-routing`): the
// counts `spillway plan --routing-stats` reads (runtime/routing_stats.h holds the file format). Every forward
// row counts once, prefill and decode alike, image positions included; hash-routed layers count their table's
// picks.
#pragma once

#include <cstdint>
#include <vector>

namespace spw {

struct RoutingCounts {
  int64_t n_tokens = 0;                      // rows routed (each through every layer)
  std::vector<std::vector<int64_t>> counts;  // [layer][expert]

  void reset(int n_layers, int n_experts) {
    n_tokens = 0;
    counts.assign(size_t(n_layers), std::vector<int64_t>(size_t(n_experts), 0));
  }
};

}  // namespace spw
