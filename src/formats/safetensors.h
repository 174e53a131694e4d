// safetensors reader: memory-maps single files and sharded checkpoints
// (`model.safetensors.index.json`). Tensor data is never copied here.
// A header-only file (data section absent) can be opened for inspection with
// OpenOptions::allow_missing_data; its tensors then have data == nullptr.
// Every malformed input yields an Error naming the file (and tensor); nothing aborts.
// Tests: tests/unit/test_safetensors.cpp; fuzz target: fuzz/fuzz_safetensors_header.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "formats/dtypes.h"

namespace spw {

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // nullptr when the file is header-only
  size_t nbytes = 0;
  std::string file;  // the file it lives in, for error messages

  int64_t numel() const;
};

// The values of a BF16 or F32 tensor with data, widened to f32 (the caller has checked dtype and data).
std::vector<float> tensor_floats(const TensorInfo& t);
// A shape as error messages print it: "[2, 3]".
std::string shape_text(const std::vector<int64_t>& shape);

// The parsed JSON header of one file: tensors with offsets relative to the data section.
struct SafetensorsHeader {
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;
  };
  std::map<std::string, Entry> entries;
  std::map<std::string, std::string> metadata;
  uint64_t header_nbytes = 0;  // the JSON length (after the 8-byte prefix)
  uint64_t data_nbytes = 0;    // the largest end offset
};

// Headers longer than this are refused as corrupt (real V4.1 shards have headers under 1 MB).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Parses the 8-byte length prefix and JSON header from the first `size` bytes of a file.
// Validates: length within the buffer and under kSafetensorsMaxHeaderBytes, JSON syntax, a root
// object, entries that are objects with known dtypes, non-negative shapes whose numel·dtype size
// fits 64 bits, begin <= end, end - begin == numel·dtype size, no overlapping tensors, and a
// `__metadata__` of string → string. Offsets against the file's data section are checked by
// SafetensorsFile::open (the header alone does not know it).
Result<SafetensorsHeader> parse_safetensors_header(const uint8_t* bytes, size_t size, const std::string& file);

struct OpenOptions {
  bool allow_missing_data = false;
};

class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path, OpenOptions options = {});
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_nbytes_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A whole checkpoint: a directory holding model.safetensors.index.json and its shards, a
// directory of *.safetensors files without an index (all are opened), or a single .safetensors file.
// With an index, the index is authoritative: only the shards it names are opened (other files are
// ignored), every tensor it names must exist in its shard, and a named shard may hold no tensor the
// index does not name. Duplicate names across files are errors.
class Checkpoint {
 public:
  static Result<Checkpoint> open(const std::string& path, OpenOptions options = {});
  // A checkpoint whose tensors live in memory that `owner` keeps alive (a synthetic model built without disk:
  // model/synthetic_model.h). `root` names it in messages. Errors on a duplicate name or a tensor whose nbytes
  // does not match its dtype and shape.
  static Result<Checkpoint> in_memory(std::string root, std::vector<TensorInfo> tensors,
                                      std::shared_ptr<const void> owner);

  const TensorInfo* find(const std::string& name) const;
  // All tensors, by name.
  const std::map<std::string, const TensorInfo*>& tensors() const { return index_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::unique_ptr<TensorInfo>> memory_tensors_;  // in_memory's tensors
  std::shared_ptr<const void> memory_owner_;                 // and the bytes they point at
  std::map<std::string, const TensorInfo*> index_;
};

}  // namespace spw
