#include "server/tool_call_constraint.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace spw::server {
namespace {

constexpr size_t kMaxCachedStates = 256;

}  // namespace

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

void TokenTrie::collect(const ToolCallGrammar& grammar, const ToolCallGrammar::State& state,
                        std::vector<uint64_t>& allowed) const {
  std::vector<std::pair<uint32_t, ToolCallGrammar::State>> stack{{0, state}};
  while (!stack.empty()) {
    auto [node, s] = stack.back();
    stack.pop_back();
    const Node& n = nodes_[node];
    for (uint32_t t = n.first_token; t < n.first_token + n.n_tokens; ++t) {
      const auto id = size_t(token_ids_[t]);
      allowed[id / 64] |= uint64_t(1) << (id % 64);
    }
    for (uint32_t c = n.first_child; c < n.first_child + n.n_children; ++c) {
      ToolCallGrammar::State next = s;
      if (grammar.step(next, edge_[c])) stack.emplace_back(c, next);
    }
  }
}

ToolCallConstraint::ToolCallConstraint(std::shared_ptr<const ToolCallGrammar> grammar,
                                       std::shared_ptr<const TokenTrie> trie, int32_t eos_id)
    : grammar_(std::move(grammar)), trie_(std::move(trie)), eos_id_(eos_id), state_(grammar_->start()) {}

const std::vector<uint64_t>& ToolCallConstraint::allowed() {
  auto it = cache_.find(state_);
  if (it != cache_.end()) return it->second;
  if (cache_.size() >= kMaxCachedStates) cache_.clear();
  std::vector<uint64_t> bits((trie_->n_tokens() + 63) / 64, 0);
  trie_->collect(*grammar_, state_, bits);
  return cache_.emplace(state_, std::move(bits)).first->second;
}

void ToolCallConstraint::mask(std::span<float> logits) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  if (!broken_ && !grammar_->accepting(state_)) {
    const std::vector<uint64_t>& bits = allowed();
    bool any = false;
    for (size_t i = 0; i < logits.size(); ++i) {
      const bool ok = i < trie_->n_tokens() && int32_t(i) != eos_id_ && ((bits[i / 64] >> (i % 64)) & 1);
      if (!ok) logits[i] = kMasked;
      any = any || ok;
    }
    if (any) return;
  } else {
    std::fill(logits.begin(), logits.end(), kMasked);
  }
  // The block is complete (or, should the vocabulary lack a byte the grammar needs, stuck): only
  // end-of-sequence remains, with probability 1.
  if (eos_id_ >= 0 && size_t(eos_id_) < logits.size()) logits[size_t(eos_id_)] = 0.f;
}

void ToolCallConstraint::accept(int32_t id) {
  if (broken_ || id == eos_id_) return;
  if (id < 0 || size_t(id) >= trie_->n_tokens() || !grammar_->feed(state_, trie_->bytes(id))) broken_ = true;
}

}  // namespace spw::server
