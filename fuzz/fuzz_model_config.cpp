// libFuzzer target: parse_model_config on arbitrary bytes as a checkpoint's config.json (a model directory is
// untrusted input: `spillway serve -m DIR` reads it first). Any crash, sanitizer report, hang or exception escaping
// is a bug; an Error is fine, and must name the file. On success, the promises the loaders rely on: one layer plan
// per layer, positive shapes, engram slots matching their tables, an EXL3 pack's bits in (0, 16].
// Build and run: scripts/fuzz.sh SECONDS model_config (see fuzz/README.md).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  spw::Result<spw::ModelConfig> r = spw::parse_model_config(text, "fuzz/config.json");
  if (!r.ok()) {
    if (r.error().message.find("fuzz/config.json") == std::string::npos) std::abort();  // errors name the file
    return 0;
  }
  const spw::ModelConfig& c = *r;
  if (c.n_layers <= 0 || int(c.layers.size()) != c.n_layers) std::abort();
  if (c.d_model <= 0 || c.vocab_size <= 0 || c.n_experts <= 0 || c.top_k <= 0 || c.top_k > c.n_experts) std::abort();
  if (c.weight_block <= 0 || c.d_model % c.weight_block != 0) std::abort();
  if (c.engram_num_embeddings.size() != c.engram_layers.size()) std::abort();
  for (int l : c.engram_layers)
    if (l < 0 || l >= c.n_layers || !c.layers[size_t(l)].engram) std::abort();
  if (c.exl3_expert_bits < 0 || c.exl3_expert_bits > 16) std::abort();
  return 0;
}
