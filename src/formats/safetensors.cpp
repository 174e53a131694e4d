// safetensors files and sharded checkpoints: read-only mmap, header validation, tensor lookup
// (contract in safetensors.h; header parsing lives in safetensors_header.cpp).
//
// Checkpoint directory rules (decided here, documented in safetensors.h):
// - with model.safetensors.index.json, the index is authoritative: exactly the shards it names are
//   opened (other *.safetensors files in the directory are ignored), each weight_map entry must be
//   in its named shard, and each named shard must hold no tensor the index does not name;
// - without an index, every *.safetensors file in the directory is opened (sorted by name);
// - a tensor name present in two files is an error either way.
// Shard names in the index must be plain file names: a path separator or ".." is refused.
#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/log.h"

namespace spw {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";

Error os_error(const std::string& path, const char* what) {
  return Error{path + ": " + what + ": " + std::strerror(errno)};
}

Result<nlohmann::json> read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return os_error(path, "cannot open");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Error{path + ": not valid JSON"};
  return j;
}

// The index's weight_map: tensor name -> shard file name.
Result<std::map<std::string, std::string>> read_weight_map(const std::string& index_path) {
  Result<nlohmann::json> index = read_json_file(index_path);
  if (!index.ok()) return index.error();
  if (!index->is_object()) return Error{index_path + ": not a JSON object"};
  auto it = index->find("weight_map");
  if (it == index->end() || !it->is_object()) return Error{index_path + ": missing or non-object 'weight_map'"};
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, shard] : it->items()) {
    if (!shard.is_string()) return Error{index_path + ": weight_map entry for '" + name + "' is not a string"};
    const std::string& shard_name = shard.get_ref<const std::string&>();
    if (shard_name.empty() || shard_name == "." || shard_name == ".." || shard_name.find('/') != std::string::npos) {
      return Error{index_path + ": weight_map entry for '" + name + "' names '" + shard_name +
                   "', which is not a plain file name"};
    }
    weight_map.emplace(name, shard_name);
  }
  return weight_map;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // fits: parse_safetensors_header checked numel·size < 2^64
  return n;
}

std::vector<float> tensor_floats(const TensorInfo& t) {
  std::vector<float> out(size_t(t.numel()));
  if (t.dtype == DType::F32) {
    std::memcpy(out.data(), t.data, out.size() * sizeof(float));
  } else {
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t b;
      std::memcpy(&b, t.data + 2 * i, 2);
      out[i] = bf16_to_f32(b);
    }
  }
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path, OpenOptions options) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return os_error(path, "cannot open");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Error e = os_error(path, "cannot stat");
    ::close(fd);
    return e;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error{path + ": not a regular file"};
  }
  const size_t file_nbytes = static_cast<size_t>(st.st_size);
  if (file_nbytes < 8) {
    ::close(fd);
    return Error{path + ": file is " + std::to_string(file_nbytes) +
                 " bytes, shorter than the 8-byte header length prefix"};
  }
  void* map = ::mmap(nullptr, file_nbytes, PROT_READ, MAP_PRIVATE, fd, 0);
  Error map_error = map == MAP_FAILED ? os_error(path, "mmap failed") : Error{};
  ::close(fd);
  if (map == MAP_FAILED) return map_error;

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = map;
  file->map_nbytes_ = file_nbytes;

  const auto* bytes = static_cast<const uint8_t*>(map);
  Result<SafetensorsHeader> header = parse_safetensors_header(bytes, file_nbytes, path);
  if (!header.ok()) return header.error();

  const uint64_t data_offset = 8 + header->header_nbytes;
  const uint64_t data_nbytes = file_nbytes - data_offset;
  const bool header_only = options.allow_missing_data && header->data_nbytes > data_nbytes;
  for (auto& [name, entry] : header->entries) {
    if (!header_only && entry.end > data_nbytes) {
      return Error{path + ": tensor '" + name + "': data offsets [" + std::to_string(entry.begin) + ", " +
                   std::to_string(entry.end) + ") exceed data section of " + std::to_string(data_nbytes) + " bytes"};
    }
    TensorInfo info;
    info.name = name;
    info.dtype = entry.dtype;
    info.shape = std::move(entry.shape);
    info.nbytes = entry.end - entry.begin;
    info.data = header_only ? nullptr : bytes + data_offset + entry.begin;
    info.file = path;
    file->tensors_.emplace(name, std::move(info));
  }
  file->metadata_ = std::move(header->metadata);
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_nbytes_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Result<Checkpoint> Checkpoint::open(const std::string& path, OpenOptions options) {
  Checkpoint ckpt;
  ckpt.root_ = path;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) return Error{path + ": no such file or directory"};

  std::vector<std::string> file_paths;
  std::map<std::string, std::string> weight_map;
  const fs::path index_path = fs::path(path) / kIndexName;
  const bool indexed = fs::is_directory(status) && fs::exists(index_path, ec);
  if (!fs::is_directory(status)) {
    file_paths.push_back(path);
  } else if (indexed) {
    Result<std::map<std::string, std::string>> map = read_weight_map(index_path.string());
    if (!map.ok()) return map.error();
    weight_map = std::move(map.value());
    std::set<std::string> shards;
    for (const auto& [name, shard] : weight_map) shards.insert(shard);
    for (const std::string& shard : shards) file_paths.push_back((fs::path(path) / shard).string());
  } else {
    for (const fs::directory_entry& entry : fs::directory_iterator(path, ec)) {
      if (entry.path().extension() == ".safetensors") file_paths.push_back(entry.path().string());
    }
    if (ec) return Error{path + ": cannot list directory: " + ec.message()};
    std::sort(file_paths.begin(), file_paths.end());
  }
  if (file_paths.empty()) return Error{path + ": no " + std::string(kIndexName) + " and no *.safetensors files"};

  for (const std::string& file_path : file_paths) {
    if (indexed && !fs::exists(file_path, ec)) {
      return Error{index_path.string() + ": names shard '" + fs::path(file_path).filename().string() +
                   "', which does not exist"};
    }
    Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::open(file_path, options);
    if (!file.ok()) return file.error();
    for (const auto& [name, info] : (*file)->tensors()) {
      auto [it, inserted] = ckpt.index_.emplace(name, &info);
      if (!inserted) {
        return Error{file_path + ": tensor '" + name + "' is also in " + it->second->file};
      }
      if (indexed) {
        auto wm = weight_map.find(name);
        if (wm == weight_map.end()) {
          return Error{file_path + ": tensor '" + name + "' is not named by " + index_path.string()};
        }
      }
    }
    ckpt.files_.push_back(std::move(file.value()));
  }
  for (const auto& [name, shard] : weight_map) {
    auto it = ckpt.index_.find(name);
    if (it == ckpt.index_.end() || fs::path(it->second->file).filename() != shard) {
      return Error{index_path.string() + ": tensor '" + name + "' is mapped to shard '" + shard +
                   "', which does not contain it"};
    }
  }
  SPW_LOG_DEBUG("opened checkpoint {}: {} files, {} tensors", path, ckpt.files_.size(), ckpt.index_.size());
  return ckpt;
}

Result<Checkpoint> Checkpoint::in_memory(std::string root, std::vector<TensorInfo> tensors,
                                         std::shared_ptr<const void> owner) {
  Checkpoint ckpt;
  ckpt.root_ = std::move(root);
  ckpt.memory_owner_ = std::move(owner);
  for (TensorInfo& t : tensors) {
    if (t.nbytes != size_t(t.numel()) * dtype_nbytes(t.dtype))
      return Error{ckpt.root_ + ": tensor '" + t.name + "' has " + std::to_string(t.nbytes) + " bytes, its dtype and shape " +
                   shape_text(t.shape) + " need " + std::to_string(size_t(t.numel()) * dtype_nbytes(t.dtype))};
    t.file = ckpt.root_;
    auto info = std::make_unique<TensorInfo>(std::move(t));
    if (!ckpt.index_.emplace(info->name, info.get()).second)
      return Error{ckpt.root_ + ": tensor '" + info->name + "' is given twice"};
    ckpt.memory_tensors_.push_back(std::move(info));
  }
  return ckpt;
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

}  // namespace spw
