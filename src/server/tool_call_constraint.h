// Constrained decoding of tool calls: a runtime::LogitsConstraint that allows a token iff its
// bytes keep src/chat's ToolCallGrammar alive (end-of-sequence iff the grammar accepts).
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
// Tests: tests/unit/test_tool_call_grammar.cpp (grammar), tests/unit/test_tool_call_constraint.cpp,
// tests/python/server/test_tools.py (end to end).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

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
  void collect(const ToolCallGrammar& grammar, const ToolCallGrammar::State& state, std::vector<uint64_t>& allowed) const;

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

class ToolCallConstraint final : public runtime::LogitsConstraint {
 public:
  ToolCallConstraint(std::shared_ptr<const ToolCallGrammar> grammar, std::shared_ptr<const TokenTrie> trie,
                     int32_t eos_id);
  void mask(std::span<float> logits) override;
  void accept(int32_t id) override;

 private:
  const std::vector<uint64_t>& allowed();

  std::shared_ptr<const ToolCallGrammar> grammar_;
  std::shared_ptr<const TokenTrie> trie_;
  int32_t eos_id_;
  ToolCallGrammar::State state_;
  bool broken_ = false;  // a token the mask did not allow was accepted: only EOS from now on
  std::unordered_map<ToolCallGrammar::State, std::vector<uint64_t>, ToolCallGrammar::StateHash> cache_;
};

}  // namespace spw::server
