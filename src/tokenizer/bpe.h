// Byte-level BPE model (Hugging Face "BPE" with a ByteLevel pre-tokenizer). Works on raw bytes:
// vocab strings are mapped back through GPT-2's byte alphabet once at load, so encoding never
// builds the byte-level string. Merging is the rank-ordered, leftmost-first loop tokenizers runs
// (priority queue of candidate pairs), and results are cached per pre-token (bounded, sharded, direct-mapped).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace spw::tok {

struct BpeConfig {
  // Model vocab as raw bytes (tokens whose strings leave the byte alphabet are not included).
  std::vector<std::pair<std::string, int32_t>> vocab_bytes;
  // Merges as (left id, right id, merged id), in rank order.
  std::vector<std::array<int32_t, 3>> merges;
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;
  bool ignore_merges = false;
};

class BpeModel {
 public:
  explicit BpeModel(BpeConfig config);
  ~BpeModel();

  // Append the ids of one pre-token (raw bytes) to `out`.
  void encode(std::string_view word, std::vector<int32_t>& out) const;

 private:
  struct MergeTable;
  struct Cache;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  std::array<int32_t, 256> byte_id_{};
  std::unordered_map<std::string, int32_t> vocab_;  // only used with ignore_merges
  std::unique_ptr<MergeTable> merges_;
  std::unique_ptr<Cache> cache_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
};

}  // namespace spw::tok
