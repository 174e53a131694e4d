// libFuzzer target: parse_safetensors_header on arbitrary bytes (the first bytes of an untrusted
// model file). Any crash, sanitizer report, hang or exception escaping is a bug; an Error is fine.
// Also checks the parser's promises on success: offsets ordered, sizes consistent.
// Each input is parsed twice: as given (exercising the length prefix), and with the prefix
// rewritten to the input's real length (size − 8), so that mutations of the JSON body that change
// its length still reach the JSON and entry validation instead of stopping at the prefix check.
// Build and run: scripts/fuzz.sh SECONDS (see fuzz/README.md).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "formats/safetensors.h"

namespace {

void check_one(const uint8_t* data, size_t size) {
  spw::Result<spw::SafetensorsHeader> header = spw::parse_safetensors_header(data, size, "fuzz.safetensors");
  if (!header.ok()) {
    if (header.error().message.rfind("fuzz.safetensors: ", 0) != 0) std::abort();  // errors name the file
    return;
  }
  uint64_t max_end = 0;
  for (const auto& [name, entry] : header->entries) {
    if (entry.begin > entry.end) std::abort();
    uint64_t numel = 1;
    for (int64_t d : entry.shape) {
      if (d < 0) std::abort();
      numel *= static_cast<uint64_t>(d);  // no overflow: the parser checked numel·size
    }
    if (entry.end - entry.begin != numel * spw::dtype_nbytes(entry.dtype)) std::abort();
    if (entry.end > max_end) max_end = entry.end;
  }
  if (max_end != header->data_nbytes || 8 + header->header_nbytes > size) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  check_one(data, size);
  if (size >= 8) {
    std::vector<uint8_t> fixed(data, data + size);
    uint64_t n = size - 8;
    for (int i = 0; i < 8; ++i) fixed[i] = static_cast<uint8_t>(n >> (8 * i));
    check_one(fixed.data(), fixed.size());
  }
  return 0;
}
