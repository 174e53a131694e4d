#include "server/grammar_constraint.h"

#include <algorithm>
#include <utility>

namespace spw::server {

// Breadth-first layout over the tokens sorted by bytes: the tokens under one node form a run of
// that order, tokens ending at the node come first, and each child is the sub-run sharing one
// more byte.
TokenTrie::TokenTrie(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) {
  std::vector<int32_t> order;
  for (size_t id = 0; id < bytes_.size(); ++id)
    if (!bytes_[id].empty()) order.push_back(int32_t(id));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] < bytes_[size_t(b)] || (bytes_[size_t(a)] == bytes_[size_t(b)] && a < b);
  });
  struct Pending {
    uint32_t node;
    size_t lo, hi, depth;
  };
  nodes_.push_back({});
  edge_.push_back(0);
  std::vector<Pending> queue{{0, 0, order.size(), 0}};
  for (size_t q = 0; q < queue.size(); ++q) {
    const Pending p = queue[q];
    size_t i = p.lo;
    nodes_[p.node].first_token = uint32_t(token_ids_.size());
    while (i < p.hi && bytes_[size_t(order[i])].size() == p.depth) token_ids_.push_back(order[i++]);
    nodes_[p.node].n_tokens = uint32_t(token_ids_.size()) - nodes_[p.node].first_token;
    nodes_[p.node].first_child = uint32_t(nodes_.size());
    while (i < p.hi) {
      const char b = bytes_[size_t(order[i])][p.depth];
      size_t j = i;
      while (j < p.hi && bytes_[size_t(order[j])][p.depth] == b) ++j;
      queue.push_back({uint32_t(nodes_.size()), i, j, p.depth + 1});
      nodes_.push_back({});
      edge_.push_back(static_cast<uint8_t>(b));
      i = j;
    }
    nodes_[p.node].n_children = uint32_t(nodes_.size()) - nodes_[p.node].first_child;
  }
}

}  // namespace spw::server
