#include "quantize/safetensors_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

namespace spw::quant {
namespace {

Status write_bytes(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts, bool atomic) {
  const std::string target = atomic ? path + ".tmp" : path;
  FILE* f = std::fopen(target.c_str(), "wb");
  if (!f) return make_error(target, ": cannot open for writing: ", std::strerror(errno));
  for (const auto& [data, n] : parts) {
    if (n && std::fwrite(data, 1, n, f) != n) {
      const int err = errno;
      std::fclose(f);
      if (atomic) std::remove(target.c_str());
      return make_error(target, ": write failed: ", std::strerror(err), " (is the disk full?)");
    }
  }
  if (std::fflush(f) != 0 || std::ferror(f)) {
    const int err = errno;
    std::fclose(f);
    if (atomic) std::remove(target.c_str());
    return make_error(target, ": write failed: ", std::strerror(err), " (is the disk full?)");
  }
  if (std::fclose(f) != 0) {
    const int err = errno;
    if (atomic) std::remove(target.c_str());
    return make_error(target, ": close failed: ", std::strerror(err));
  }
  if (atomic) {
    std::error_code ec;
    std::filesystem::rename(target, path, ec);
    if (ec) return make_error(path, ": cannot move ", target, " into place: ", ec.message());
  }
  return {};
}

}  // namespace

void SafetensorsWriter::add_raw(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
                                size_t nbytes) {
  TensorBlob b{dtype, std::move(shape), std::vector<uint8_t>(nbytes)};
  if (nbytes) std::memcpy(b.bytes.data(), data, nbytes);
  tensors_[name] = std::move(b);
}

uint64_t SafetensorsWriter::data_nbytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.bytes.size();
  return n;
}

Status SafetensorsWriter::write(const std::string& path, bool atomic) const {
  // nlohmann::ordered_json keeps insertion order: __metadata__ first, then tensors by name.
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors_) {
    header[name] = {{"dtype", std::string(dtype_name(t.dtype))},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  const uint64_t header_len = text.size();
  uint8_t prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = uint8_t(header_len >> (8 * i));
  std::vector<std::pair<const void*, size_t>> parts{{prefix, 8}, {text.data(), text.size()}};
  for (const auto& [name, t] : tensors_) parts.emplace_back(t.bytes.data(), t.bytes.size());
  return write_bytes(path, parts, atomic);
}

Status write_text_file(const std::string& path, const std::string& text) {
  return write_bytes(path, {{text.data(), text.size()}}, true);
}

}  // namespace spw::quant
