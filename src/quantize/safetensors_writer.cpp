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

// The 8-byte little-endian header length and the JSON header (insertion order: __metadata__, then the tensors as
// listed, with contiguous data offsets), space-padded so the data starts 8-byte aligned. Error: a name listed twice.
struct HeaderEntry {
  const std::string& name;
  DType dtype;
  const std::vector<int64_t>& shape;
  uint64_t nbytes;
};

Result<std::string> header_block(const std::vector<HeaderEntry>& entries) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const HeaderEntry& e : entries) {
    if (header.contains(e.name)) return make_error("tensor '", e.name, "' listed twice");
    header[e.name] = {{"dtype", std::string(dtype_name(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.nbytes}}};
    offset += e.nbytes;
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  const uint64_t header_len = text.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char(uint8_t(header_len >> (8 * i)));
  return out + text;
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
  std::vector<HeaderEntry> entries;
  for (const auto& [name, t] : tensors_) entries.push_back({name, t.dtype, t.shape, t.bytes.size()});
  auto header = header_block(entries);  // tensors by name (std::map order)
  if (!header.ok()) return make_error(path, ": ", header.error().message);
  std::vector<std::pair<const void*, size_t>> parts{{header->data(), header->size()}};
  for (const auto& [name, t] : tensors_) parts.emplace_back(t.bytes.data(), t.bytes.size());
  return write_bytes(path, parts, atomic);
}

namespace {

uint64_t entry_bytes(const SafetensorsStreamWriter::Entry& e) {
  uint64_t n = dtype_nbytes(e.dtype);
  for (int64_t d : e.shape) n *= uint64_t(d);
  return n;
}

}  // namespace

Result<std::unique_ptr<SafetensorsStreamWriter>> SafetensorsStreamWriter::create(const std::string& path,
                                                                                  std::vector<Entry> entries) {
  std::vector<HeaderEntry> listed;
  for (const Entry& e : entries) listed.push_back({e.name, e.dtype, e.shape, entry_bytes(e)});
  auto header = header_block(listed);
  if (!header.ok()) return make_error(path, ": ", header.error().message);

  std::unique_ptr<SafetensorsStreamWriter> w(new SafetensorsStreamWriter);
  w->path_ = path;
  w->tmp_ = path + ".tmp";
  w->entries_ = std::move(entries);
  w->file_ = std::fopen(w->tmp_.c_str(), "wb");
  if (!w->file_) return make_error(w->tmp_, ": cannot open for writing: ", std::strerror(errno));
  if (std::fwrite(header->data(), 1, header->size(), w->file_) != header->size())
    return make_error(w->tmp_, ": write failed: ", std::strerror(errno), " (is the disk full?)");
  return w;
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (file_) {
    std::fclose(file_);
    std::remove(tmp_.c_str());
  }
}

Status SafetensorsStreamWriter::append(const std::string& name, const void* data, size_t nbytes) {
  if (!file_) return make_error(tmp_, ": append after finish or a failed write");
  if (next_ >= entries_.size() || entries_[next_].name != name || entry_bytes(entries_[next_]) != nbytes)
    return make_error(tmp_, ": tensor '", name, "' (", nbytes, " bytes) is not the next declared one");
  ++next_;
  if (nbytes && std::fwrite(data, 1, nbytes, file_) != nbytes) {
    const int err = errno;
    std::fclose(file_);
    file_ = nullptr;
    std::remove(tmp_.c_str());
    return make_error(tmp_, ": write failed: ", std::strerror(err), " (is the disk full?)");
  }
  return {};
}

Status SafetensorsStreamWriter::finish() {
  if (!file_) return make_error(tmp_, ": finish after a failed write");
  if (next_ != entries_.size())
    return make_error(tmp_, ": finished after ", next_, " of ", entries_.size(), " declared tensors");
  FILE* f = file_;
  file_ = nullptr;
  const bool flushed = std::fflush(f) == 0 && !std::ferror(f);
  const int err = errno;
  if (std::fclose(f) != 0 || !flushed) {
    std::remove(tmp_.c_str());
    return make_error(tmp_, ": write failed: ", std::strerror(flushed ? errno : err), " (is the disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) return make_error(path_, ": cannot move ", tmp_, " into place: ", ec.message());
  return {};
}

Status write_text_file(const std::string& path, const std::string& text) {
  return write_bytes(path, {{text.data(), text.size()}}, true);
}

}  // namespace spw::quant
