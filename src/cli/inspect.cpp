// Printing for `spillway inspect`.
#include <cstdio>
#include <string>

#include "base/log.h"
#include "model/config.h"
#include "model/inventory.h"

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", b, units[u]);
  return buf;
}

std::string human_count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

}  // namespace

int spw_inspect_main(const std::string& dir, bool list_tensors) {
  using namespace spw;
  auto config = read_model_config(dir);
  if (!config.ok()) {
    SPW_LOG_ERROR("{}", config.error().message);
    return 1;
  }
  OpenOptions open;
  open.allow_missing_data = true;
  auto ckpt = Checkpoint::open(dir, open);
  if (!ckpt.ok()) {
    SPW_LOG_ERROR("{}", ckpt.error().message);
    return 1;
  }
  const ModelConfig& c = *config;
  Inventory inv = take_inventory(*ckpt, c);

  std::printf("model        %s, %d layers, d_model %d, %d heads x %d, vocab %lld\n", c.model_type.c_str(), c.n_layers,
              c.d_model, c.n_heads, c.d_head, (long long)c.vocab_size);
  std::printf("experts      %d routed (top %d, width %d) + 1 shared per layer\n", c.n_experts, c.top_k, c.d_expert);
  std::printf("files        %zu safetensors files, %lld tensors, %s\n", ckpt->files().size(),
              (long long)inv.total.n_tensors, human_bytes(double(inv.total.nbytes)).c_str());
  int64_t aside = 0;  // parameters outside the text backbone
  for (const char* role : {"engram tables", "draft (MTP/DSpark)", "vision"})
    if (inv.groups.count(role)) aside += inv.groups.at(role).n_params;
  std::printf("parameters   %s in all; %s without Engram tables, draft stages and vision\n\n",
              human_count(double(inv.total.n_params)).c_str(), human_count(double(inv.total.n_params - aside)).c_str());

  std::printf("layer  attention  ratio  routing  extras             experts found\n");
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerPlan& p = c.layers[l];
    std::string extras;
    if (p.kv_source) extras += "kv-source ";
    if (p.index_source) extras += "index ";
    if (p.candidate_source) extras += "candidates ";
    if (p.engram) extras += "engram ";
    std::printf("%5d  %-9s  %5d  %-7s  %-18s %d\n", l, attn_kind_name(p.attn), p.compress_ratio,
                p.hash_routed ? "hash" : "score", extras.c_str(), inv.experts_per_layer[l]);
  }
  std::printf("\n%-26s %9s %12s %12s  formats\n", "role", "tensors", "params", "bytes");
  for (const auto& [role, g] : inv.groups) {
    std::string formats;
    for (const auto& [dtype, nbytes] : g.nbytes_by_dtype) formats += dtype + " ";
    std::printf("%-26s %9lld %12s %12s  %s\n", role.c_str(), (long long)g.n_tensors, human_count(double(g.n_params)).c_str(),
                human_bytes(double(g.nbytes)).c_str(), formats.c_str());
  }
  std::printf("\none routed expert            %s\n", human_bytes(double(inv.expert_nbytes)).c_str());
  std::printf("decode weight bytes/token   %s (dense + shared + %d routed experts x %d layers + embedding and Engram rows)\n",
              human_bytes(double(inv.decode_nbytes_per_token)).c_str(), c.top_k, c.n_layers);
  if (list_tensors)
    for (const auto& [name, t] : ckpt->tensors()) {
      std::string shape;
      for (auto s : t->shape) shape += (shape.empty() ? "" : ",") + std::to_string(s);
      std::printf("%s  %s  [%s]\n", name.c_str(), std::string(dtype_name(t->dtype)).c_str(), shape.c_str());
    }
  return 0;
}
