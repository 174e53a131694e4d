// parse_safetensors_header: the 8-byte little-endian length prefix and the JSON header of a
// safetensors file, validated completely before any offset is trusted (contract in safetensors.h).
// This is the code the fuzz target (fuzz/fuzz_safetensors_header.cpp) drives; it must return an
// Error, never throw, abort or read outside [bytes, bytes + size) for any input.
//
// Decisions beyond the header comment:
// - header lengths above kSafetensorsMaxHeaderBytes are refused before anything is allocated;
// - entry objects may hold only "dtype", "shape" and "data_offsets" (a typo is an error);
// - shape dims and offsets must be JSON integers (1.0 or 1e3 are refused);
// - gaps between tensors are allowed (zero-size tensors may sit anywhere, they hold no bytes);
// - whether offsets fit the file's data section is checked by SafetensorsFile::open, which knows it.
#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"

namespace spw {

namespace {

using nlohmann::json;

Error file_error(const std::string& file, const std::string& what) { return Error{file + ": " + what}; }

Error tensor_error(const std::string& file, const std::string& name, const std::string& what) {
  return Error{file + ": tensor '" + name + "': " + what};
}

// A non-negative JSON integer as uint64, or nullopt (negative, fractional, not a number).
std::optional<uint64_t> json_u64(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i >= 0) return static_cast<uint64_t>(i);
  }
  return std::nullopt;
}

Result<SafetensorsHeader::Entry> parse_entry(const json& j, const std::string& file, const std::string& name) {
  if (!j.is_object()) return tensor_error(file, name, "entry is " + std::string(j.type_name()) + ", not an object");
  for (const auto& [key, value] : j.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return tensor_error(file, name, "unknown field '" + key + "'");
    }
  }
  SafetensorsHeader::Entry entry;

  auto dtype_it = j.find("dtype");
  if (dtype_it == j.end() || !dtype_it->is_string()) return tensor_error(file, name, "missing or non-string 'dtype'");
  const std::string& dtype_text = dtype_it->get_ref<const std::string&>();
  std::optional<DType> dtype = dtype_from_name(dtype_text);
  if (!dtype) return tensor_error(file, name, "unknown dtype '" + dtype_text + "'");
  entry.dtype = *dtype;

  auto shape_it = j.find("shape");
  if (shape_it == j.end() || !shape_it->is_array()) return tensor_error(file, name, "missing or non-array 'shape'");
  uint64_t numel = 1;
  bool numel_overflow = false;
  for (const json& dim : *shape_it) {
    std::optional<uint64_t> d = json_u64(dim);
    if (!d || *d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return tensor_error(file, name, "shape dimension " + dim.dump() + " is not a non-negative 64-bit integer");
    }
    entry.shape.push_back(static_cast<int64_t>(*d));
    numel_overflow |= __builtin_mul_overflow(numel, *d, &numel);
  }
  uint64_t nbytes = 0;
  if (numel_overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      __builtin_mul_overflow(numel, dtype_nbytes(entry.dtype), &nbytes)) {
    return tensor_error(file, name, "shape " + shape_it->dump() + " overflows 64-bit element or byte counts");
  }

  auto offsets_it = j.find("data_offsets");
  if (offsets_it == j.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    return tensor_error(file, name, "'data_offsets' must be an array [begin, end]");
  }
  std::optional<uint64_t> begin = json_u64((*offsets_it)[0]);
  std::optional<uint64_t> end = json_u64((*offsets_it)[1]);
  if (!begin || !end) return tensor_error(file, name, "data offsets " + offsets_it->dump() + " are not non-negative integers");
  if (*begin > *end) {
    return tensor_error(file, name, "data offsets out of order: begin " + std::to_string(*begin) + " > end " +
                                        std::to_string(*end));
  }
  if (*end - *begin != nbytes) {
    return tensor_error(file, name, "data offsets [" + std::to_string(*begin) + ", " + std::to_string(*end) + ") hold " +
                                        std::to_string(*end - *begin) + " bytes but " + dtype_text + " " +
                                        shape_it->dump() + " needs " + std::to_string(nbytes));
  }
  entry.begin = *begin;
  entry.end = *end;
  return entry;
}

Status parse_metadata(const json& j, const std::string& file, std::map<std::string, std::string>& out) {
  if (!j.is_object()) return file_error(file, "'__metadata__' is " + std::string(j.type_name()) + ", not an object");
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string()) {
      return file_error(file, "'__metadata__' value for '" + key + "' is " + value.type_name() + ", not a string");
    }
    out.emplace(key, value.get<std::string>());
  }
  return {};
}

// No two tensors share a byte. Zero-size tensors hold no bytes and cannot overlap anything.
Status check_overlaps(const SafetensorsHeader& header, const std::string& file) {
  std::vector<std::pair<const std::string*, const SafetensorsHeader::Entry*>> by_offset;
  by_offset.reserve(header.entries.size());
  for (const auto& [name, entry] : header.entries) {
    if (entry.end > entry.begin) by_offset.emplace_back(&name, &entry);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.second->begin, a.second->end) < std::make_pair(b.second->begin, b.second->end);
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto& [prev_name, prev] = by_offset[i - 1];
    const auto& [name, cur] = by_offset[i];
    if (cur->begin < prev->end) {
      return tensor_error(file, *name,
                          "data offsets [" + std::to_string(cur->begin) + ", " + std::to_string(cur->end) +
                              ") overlap tensor '" + *prev_name + "' at [" + std::to_string(prev->begin) + ", " +
                              std::to_string(prev->end) + ")");
    }
  }
  return {};
}

}  // namespace

Result<SafetensorsHeader> parse_safetensors_header(const uint8_t* bytes, size_t size, const std::string& file) {
  if (size < 8) {
    return file_error(file, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length prefix");
  }
  uint64_t header_nbytes = 0;
  for (int i = 7; i >= 0; --i) header_nbytes = (header_nbytes << 8) | bytes[i];
  if (header_nbytes > kSafetensorsMaxHeaderBytes) {
    return file_error(file, "header length " + std::to_string(header_nbytes) + " exceeds the " +
                                std::to_string(kSafetensorsMaxHeaderBytes) + "-byte limit (corrupt length prefix?)");
  }
  if (header_nbytes > size - 8) {
    return file_error(file, "header length " + std::to_string(header_nbytes) + " extends beyond the end of the file (" +
                                std::to_string(size) + " bytes; truncated?)");
  }

  const char* text = reinterpret_cast<const char*>(bytes + 8);
  json root = json::parse(text, text + header_nbytes, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    // Parse again with exceptions only to obtain the position of the syntax error for the message.
    std::string why = "syntax error";
    try {
      [[maybe_unused]] json again = json::parse(text, text + header_nbytes);
    } catch (const json::exception& e) {
      why = e.what();
    }
    return file_error(file, "header is not valid JSON: " + why);
  }
  if (!root.is_object()) return file_error(file, "header is a JSON " + std::string(root.type_name()) + ", not an object");

  SafetensorsHeader header;
  header.header_nbytes = header_nbytes;
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      SPW_TRY(parse_metadata(value, file, header.metadata));
      continue;
    }
    Result<SafetensorsHeader::Entry> entry = parse_entry(value, file, name);
    if (!entry.ok()) return entry.error();
    header.data_nbytes = std::max(header.data_nbytes, entry->end);
    header.entries.emplace(name, std::move(entry.value()));
  }
  SPW_TRY(check_overlaps(header, file));
  return header;
}

}  // namespace spw
