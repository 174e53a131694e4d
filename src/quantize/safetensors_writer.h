// A minimal safetensors writer for the packs `spillway quantize` produces. Tensors are written in
// name order with contiguous offsets and the header padded to 8 bytes, so equal inputs give
// byte-identical files (resume relies on it). The file appears atomically: written to
// "<path>.tmp", flushed, then renamed; every I/O failure (no space, no permission) is an Error
// naming the path and the system's reason.
// Tests: tests/unit/test_exl3_quantize_pack.cpp (round trip through formats/safetensors, /dev/full).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "formats/dtypes.h"

namespace spw::quant {

struct TensorBlob {
  DType dtype;
  std::vector<int64_t> shape;  // empty = 0-d scalar
  std::vector<uint8_t> bytes;
};

class SafetensorsWriter {
 public:
  void add(const std::string& name, TensorBlob blob) { tensors_[name] = std::move(blob); }
  void add_raw(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data, size_t nbytes);
  const std::map<std::string, TensorBlob>& tensors() const { return tensors_; }
  uint64_t data_nbytes() const;
  // Writes atomically (tmp + rename). With atomic=false writes `path` directly (used for /dev/full tests).
  Status write(const std::string& path, bool atomic = true) const;

 private:
  std::map<std::string, TensorBlob> tensors_;
};

// A safetensors file written tensor by tensor, for files larger than memory (calibration Hessians): the
// header is written first from the declared entries, then each tensor's bytes in declaration order. The file
// appears at `path` only after finish() (written to "<path>.tmp", then renamed); destroying an unfinished
// writer removes the .tmp. Errors as SafetensorsWriter's.
class SafetensorsStreamWriter {
 public:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  static Result<std::unique_ptr<SafetensorsStreamWriter>> create(const std::string& path, std::vector<Entry> entries);
  ~SafetensorsStreamWriter();
  // The next declared tensor; its name and byte count must match the declaration.
  Status append(const std::string& name, const void* data, size_t nbytes);
  Status finish();

 private:
  SafetensorsStreamWriter() = default;
  std::string path_, tmp_;
  std::vector<Entry> entries_;
  size_t next_ = 0;
  FILE* file_ = nullptr;
};

// Writes text to a file atomically (tmp + rename), with the same error reporting.
Status write_text_file(const std::string& path, const std::string& text);

}  // namespace spw::quant
