// Grammar-constrained decoding: a runtime::LogitsConstraint that allows a token iff its bytes keep
// a byte-level grammar alive, and end-of-sequence iff the grammar accepts. One implementation for
// every grammar of src/chat: tool calls (ToolCallGrammar) and response_format (JsonSchemaGrammar).
// A Grammar provides State (plain data), StateHash, step(State&, byte), feed(State&, bytes) and
// accepting(State).
//
// TokenTrie holds every token's bytes (exactly what the incremental decoder concatenates) in a
// byte trie, built once per tokenizer. A mask walks the trie depth-first from the current grammar
// state and prunes a whole subtree at the first dead byte, so structural states (one or two bytes
// allowed) cost a handful of steps and free-text states about one step per trie node. Masks are
// cached per grammar state: whitespace, tag and value-start states repeat on every call, and
// free-text states carry no length (unless the schema sets maxLength), so they repeat too.
// Measured on DeepSeek-V4's tokenizer (129,280 tokens; trie built in ~0.4 s, once): a structural
// state masks in ~0.3-2 ms, a free-text state (~129k tokens allowed) in ~30-40 ms the first time,
// ~0.3 ms from the cache (2 shared cores, -O2; /tmp benchmark, not checked in). The cache is per
// sequence: n choices of one request do not share it.
// Tests: tests/unit/test_tool_call_grammar.cpp, tests/unit/test_json_schema_grammar.cpp (grammars),
// tests/unit/test_tool_call_constraint.cpp, tests/python/server/test_tools.py and
// test_response_format.py (end to end).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <algorithm>
#include <limits>
#include <span>
#include <utility>

#include "chat/json_schema_grammar.h"
#include "chat/tool_call_grammar.h"
#include "runtime/logits_constraint.h"

namespace spw::server {

class TokenTrie {
 public:
  // token_bytes[id]: the bytes token id decodes to; empty for ids without a token.
  explicit TokenTrie(std::vector<std::string> token_bytes);

  size_t n_tokens() const { return bytes_.size(); }
  std::string_view bytes(int32_t id) const { return bytes_[size_t(id)]; }
  // Sets bit id of `allowed` (sized to n_tokens() bits) for every non-empty token whose bytes the
  // grammar takes from `state`.
  template <class Grammar>
  void collect(const Grammar& grammar, const typename Grammar::State& state, std::vector<uint64_t>& allowed) const {
    std::vector<std::pair<uint32_t, typename Grammar::State>> stack{{0, state}};
    while (!stack.empty()) {
      auto [node, s] = stack.back();
      stack.pop_back();
      const Node& n = nodes_[node];
      for (uint32_t t = n.first_token; t < n.first_token + n.n_tokens; ++t) {
        const auto id = size_t(token_ids_[t]);
        allowed[id / 64] |= uint64_t(1) << (id % 64);
      }
      for (uint32_t c = n.first_child; c < n.first_child + n.n_children; ++c) {
        typename Grammar::State next = s;
        if (grammar.step(next, edge_[c])) stack.emplace_back(c, next);
      }
    }
  }

 private:
  struct Node {
    uint32_t first_child = 0, n_children = 0;  // children are contiguous in nodes_
    uint32_t first_token = 0, n_tokens = 0;    // ids in token_ids_ whose bytes end here
  };
  std::vector<std::string> bytes_;
  std::vector<Node> nodes_;
  std::vector<uint8_t> edge_;  // edge_[i]: the byte leading into nodes_[i]
  std::vector<int32_t> token_ids_;
};

template <class Grammar>
class GrammarConstraint final : public runtime::LogitsConstraint {
 public:
  using State = typename Grammar::State;
  GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie, int32_t eos_id,
                    State start)
      : grammar_(std::move(grammar)), trie_(std::move(trie)), eos_id_(eos_id), state_(start) {}
  GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie, int32_t eos_id)
      : GrammarConstraint(grammar, trie, eos_id, grammar->start()) {}

  // The grammar's tokens from the current state; EOS only where the grammar accepts, or when
  // nothing else is left (a broken sequence, or a vocabulary lacking a byte the grammar needs).
  void allowed(std::span<uint64_t> bits) override {
    const size_t n_bits = bits.size() * 64;
    bool any = false;
    if (!broken_) {
      const std::vector<uint64_t>& from = allowed_from_state();
      const size_t n = std::min(from.size(), bits.size());
      for (size_t w = 0; w < n; ++w) {
        uint64_t word = from[w];
        if (eos_id_ >= 0 && size_t(eos_id_) / 64 == w) word &= ~(uint64_t(1) << (size_t(eos_id_) % 64));
        bits[w] |= word;
        any = any || word != 0;
      }
    }
    const bool eos_ok = !broken_ && grammar_->accepting(state_);
    if (eos_id_ >= 0 && size_t(eos_id_) < n_bits && (eos_ok || !any))
      bits[size_t(eos_id_) / 64] |= uint64_t(1) << (size_t(eos_id_) % 64);
  }

  void accept(int32_t id) override {
    if (broken_ || id == eos_id_) return;
    if (id < 0 || size_t(id) >= trie_->n_tokens() || !grammar_->feed(state_, trie_->bytes(id))) broken_ = true;
  }

 private:
  static constexpr size_t kMaxCachedStates = 256;

  const std::vector<uint64_t>& allowed_from_state() {
    auto it = cache_.find(state_);
    if (it != cache_.end()) return it->second;
    if (cache_.size() >= kMaxCachedStates) cache_.clear();
    std::vector<uint64_t> bits((trie_->n_tokens() + 63) / 64, 0);
    trie_->collect(*grammar_, state_, bits);
    return cache_.emplace(state_, std::move(bits)).first->second;
  }

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenTrie> trie_;
  int32_t eos_id_;
  State state_;
  bool broken_ = false;  // a token the mask did not allow was accepted: only EOS from now on
  std::unordered_map<State, std::vector<uint64_t>, typename Grammar::StateHash> cache_;
};

using ToolCallConstraint = GrammarConstraint<ToolCallGrammar>;
using JsonSchemaConstraint = GrammarConstraint<JsonSchemaGrammar>;

}  // namespace spw::server
