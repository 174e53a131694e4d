// libFuzzer target: an EXL3 linear read from arbitrary safetensors bytes (an EXL3 pack's shards are untrusted
// input: `spillway serve -m DIR` loads every expert through exl3_load). The input is a whole safetensors file
// (header and data); every prefix P with a P.trellis entry is loaded. Any crash, sanitizer report, hang or
// exception escaping is a bug; an Error is fine and must name the tensor. On success, the promises the kernels
// rely on: k and n multiples of 128, suh/svh of k/n values, bias absent or n, a supported bitrate, the trellis
// inside the file and 2-byte aligned, and the first and last tiles decode (state extraction and codebook).
// Each input is tried twice, like fuzz_safetensors_header: as given, and with the length prefix rewritten to
// the real length. Build and run: FUZZ_TARGET=exl3_tensor scripts/fuzz.sh SECONDS (see fuzz/README.md).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "formats/exl3.h"
#include "formats/safetensors.h"

namespace {

void check_one(const uint8_t* data, size_t size) {
  spw::Result<spw::SafetensorsHeader> header = spw::parse_safetensors_header(data, size, "fuzz.safetensors");
  if (!header.ok()) return;  // fuzz_safetensors_header covers the header itself
  // The file's tensors as the checkpoint reader exposes them; a data section cut short reads as header-only.
  const size_t data_begin = 8 + header->header_nbytes;
  const bool have_data = data_begin + header->data_nbytes <= size;
  std::map<std::string, spw::TensorInfo> tensors;
  for (const auto& [name, e] : header->entries) {
    spw::TensorInfo& t = tensors[name];
    t.name = name;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.nbytes = e.end - e.begin;
    t.data = have_data ? data + data_begin + e.begin : nullptr;
    t.file = "fuzz.safetensors";
  }
  const spw::Exl3Lookup lookup = [&](const std::string& n) -> const spw::TensorInfo* {
    auto it = tensors.find(n);
    return it == tensors.end() ? nullptr : &it->second;
  };
  for (const auto& [name, info] : tensors) {
    if (name.size() < 8 || name.compare(name.size() - 8, 8, ".trellis") != 0) continue;
    const std::string prefix = name.substr(0, name.size() - 8);
    spw::Result<spw::Exl3Tensor> r = spw::exl3_load(lookup, prefix);
    if (!r.ok()) {
      if (r.error().message.find(prefix) == std::string::npos) std::abort();  // errors name the tensor
      continue;
    }
    const spw::Exl3Tensor& t = *r;
    if (t.k <= 0 || t.n <= 0 || t.k % 128 != 0 || t.n % 128 != 0) std::abort();
    if (int64_t(t.suh.size()) != t.k || int64_t(t.svh.size()) != t.n) std::abort();
    if (!t.bias.empty() && int64_t(t.bias.size()) != t.n) std::abort();
    if (t.bits.k_x2 < 2 || t.bits.k_x2 > 16 || (t.bits.half() && t.codebook != spw::Exl3Codebook::kMul1)) std::abort();
    const auto* begin = reinterpret_cast<const uint8_t*>(t.trellis);
    if (begin < data || begin + t.trellis_nbytes() > data + size || (reinterpret_cast<uintptr_t>(begin) & 1)) std::abort();
    uint16_t out[256];
    spw::exl3_decode_tile(t.tile(0, 0), t.bits, t.codebook, out);
    spw::exl3_decode_tile(t.tile(t.k / 16 - 1, t.n / 16 - 1), t.bits, t.codebook, out);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  check_one(data, size);
  if (size >= 8) {  // the same bytes with the length prefix set to everything after it
    std::vector<uint8_t> copy(data, data + size);
    const uint64_t n = size - 8;
    std::memcpy(copy.data(), &n, 8);
    check_one(copy.data(), copy.size());
  }
  return 0;
}
