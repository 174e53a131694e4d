#include "runtime/placement_file.h"

#include <nlohmann/json.hpp>

namespace spw::runtime {
namespace {

using nlohmann::ordered_json;

const char* host_tier_policy_name(HostTierPolicy p) {
  switch (p) {
    case HostTierPolicy::Gpu: return "gpu";
    case HostTierPolicy::Cpu: return "cpu";
    case HostTierPolicy::Auto: return "auto";
  }
  return "?";
}

ordered_json tier_totals_json(const TierTotals& t) {
  return {{"n_experts", t.n_experts},
          {"resident_nbytes", t.resident_nbytes},
          {"nbytes_per_token", t.nbytes_per_token},
          {"seconds_per_token", t.seconds_per_token}};
}

}  // namespace

std::string placement_to_json(const Placement& plan) {
  ordered_json doc;
  doc["format"] = kPlacementFormat;
  doc["version"] = kPlacementVersion;
  doc["model_type"] = plan.model_type;
  doc["n_layers"] = plan.n_layers;
  doc["n_experts"] = plan.n_experts;
  doc["top_k"] = plan.top_k;
  ordered_json routing = {{"source", plan.from_stats ? "statistics" : "uniform"}};
  if (plan.from_stats) {
    routing["model"] = plan.stats_model;
    routing["n_tokens"] = plan.stats_n_tokens;
  }
  doc["routing"] = routing;
  const PlacementRequest& r = plan.request;
  doc["budget"] = {{"gpu_memory_gib", r.gpu_memory_gib},
                   {"kv_gib", r.kv_gib},
                   {"workspace_gib", r.workspace_gib},
                   {"dense_nbytes", plan.dense_nbytes},
                   {"expert_budget_nbytes", plan.expert_budget_nbytes}};
  doc["host_tier_policy"] = host_tier_policy_name(r.host_tier);
  doc["bandwidths_gbs"] = {{"hbm", r.bandwidths.hbm_gbs}, {"pcie", r.bandwidths.pcie_gbs}, {"cpu", r.bandwidths.cpu_gbs}};
  ordered_json tiers;
  for (int t = 0; t < kNumExpertTiers; ++t) tiers[expert_tier_name(ExpertTier(t))] = tier_totals_json(plan.totals[t]);
  doc["tiers"] = tiers;
  doc["predicted_tokens_per_s"] = plan.tokens_per_s;
  doc["prediction"] =
      "batch-1 decode bandwidth bound: 1 / sum over tiers of bytes per token / bandwidth, tiers not overlapped; "
      "not a measurement";
  ordered_json layers = ordered_json::array();
  for (int l = 0; l < plan.n_layers; ++l) {
    ordered_json row;
    for (int t = 0; t < kNumExpertTiers; ++t) {
      ordered_json ids = ordered_json::array();
      for (int e = 0; e < plan.n_experts; ++e)
        if (int(plan.tiers[l][e]) == t) ids.push_back(e);
      row[expert_tier_name(ExpertTier(t))] = ids;
    }
    layers.push_back(row);
  }
  doc["layers"] = layers;
  return doc.dump(1) + "\n";
}

Result<PlacementFile> parse_placement(const std::string& json_text, const std::string& source) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    return make_error(source, ": placement is not valid JSON (", e.what(), ")");
  }
  if (!doc.is_object() || doc.value("format", "") != std::string(kPlacementFormat))
    return make_error(source, ": not a placement file (\"format\" must be \"", kPlacementFormat, "\")");
  if (doc.value("version", 0) != kPlacementVersion)
    return make_error(source, ": placement version ", doc.value("version", 0), " is not supported (this build reads ",
                      kPlacementVersion, ")");
  PlacementFile file;
  if (!doc.contains("model_type") || !doc["model_type"].is_string())
    return make_error(source, ": \"model_type\" must be a string");
  file.model_type = doc["model_type"].get<std::string>();
  for (const char* field : {"n_layers", "n_experts"})
    if (!doc.contains(field) || !doc[field].is_number_integer() || doc[field].get<int64_t>() <= 0)
      return make_error(source, ": \"", field, "\" must be a positive integer");
  file.n_layers = doc["n_layers"].get<int>();
  file.n_experts = doc["n_experts"].get<int>();
  const auto& layers = doc.contains("layers") ? doc["layers"] : nlohmann::json();
  if (!layers.is_array() || int(layers.size()) != file.n_layers)
    return make_error(source, ": \"layers\" must be an array of n_layers = ", file.n_layers, " objects");
  for (int l = 0; l < file.n_layers; ++l) {
    if (!layers[l].is_object()) return make_error(source, ": layers[", l, "] must be an object of tier lists");
    std::vector<int> tier_of(file.n_experts, -1);
    for (int t = 0; t < kNumExpertTiers; ++t) {
      const char* name = expert_tier_name(ExpertTier(t));
      if (!layers[l].contains(name)) continue;
      const auto& ids = layers[l][name];
      if (!ids.is_array()) return make_error(source, ": layers[", l, "].", name, " must be an array of expert indices");
      for (const auto& id : ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= file.n_experts)
          return make_error(source, ": layers[", l, "].", name, " holds ", id.dump(), ", not an expert index in [0, ",
                            file.n_experts, ")");
        int& slot = tier_of[id.get<int>()];
        if (slot >= 0) return make_error(source, ": layer ", l, " places expert ", id.get<int>(), " twice");
        slot = t;
      }
    }
    std::vector<ExpertTier> row(file.n_experts);
    for (int e = 0; e < file.n_experts; ++e) {
      if (tier_of[e] < 0) return make_error(source, ": layer ", l, " does not place expert ", e);
      row[e] = ExpertTier(tier_of[e]);
    }
    file.tiers.push_back(std::move(row));
  }
  return file;
}

}  // namespace spw::runtime
