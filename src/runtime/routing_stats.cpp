#include "runtime/routing_stats.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace spw::runtime {

Result<RoutingStats> parse_routing_stats(const std::string& json_text, const std::string& source) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    return make_error(source, ": routing statistics are not valid JSON (", e.what(), ")");
  }
  if (!doc.is_object()) return make_error(source, ": routing statistics must be a JSON object with model, n_tokens, layers");
  RoutingStats stats;
  if (!doc.contains("model") || !doc["model"].is_string())
    return make_error(source, ": \"model\" must be a string (the model the statistics were recorded on)");
  stats.model = doc["model"].get<std::string>();
  if (!doc.contains("n_tokens") || !doc["n_tokens"].is_number_integer() || doc["n_tokens"].get<int64_t>() <= 0)
    return make_error(source, ": \"n_tokens\" must be a positive integer (tokens routed)");
  stats.n_tokens = doc["n_tokens"].get<int64_t>();
  if (!doc.contains("layers") || !doc["layers"].is_array())
    return make_error(source, ": \"layers\" must be an array with one array of expert counts per layer");
  const auto& layers = doc["layers"];
  for (size_t l = 0; l < layers.size(); ++l) {
    if (!layers[l].is_array()) return make_error(source, ": layers[", l, "] must be an array of expert counts");
    std::vector<int64_t> row;
    row.reserve(layers[l].size());
    for (size_t e = 0; e < layers[l].size(); ++e) {
      const auto& v = layers[l][e];
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        return make_error(source, ": layers[", l, "][", e, "] must be a non-negative integer count, got ", v.dump());
      row.push_back(v.get<int64_t>());
    }
    stats.counts.push_back(std::move(row));
  }
  return stats;
}

Result<RoutingStats> read_routing_stats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(path, ": cannot open the routing statistics file");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_routing_stats(text.str(), path);
}

Status write_routing_stats(const RoutingStats& stats, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << routing_stats_to_json(stats);
  out.close();
  if (!out) return make_error(path, ": cannot write the routing statistics file");
  return {};
}

std::string routing_stats_to_json(const RoutingStats& stats) {
  std::string out = "{\"model\": " + nlohmann::json(stats.model).dump() + ", \"n_tokens\": " +
                    std::to_string(stats.n_tokens) + ", \"layers\": [";
  for (size_t l = 0; l < stats.counts.size(); ++l) out += (l ? ",\n  " : "\n  ") + nlohmann::json(stats.counts[l]).dump();
  return out + "\n]}\n";
}

Status check_routing_stats(const RoutingStats& stats, int n_layers, int n_experts, int top_k,
                           const std::string& source) {
  if (int(stats.counts.size()) != n_layers)
    return make_error(source, ": has ", stats.counts.size(), " layers of counts, the model has ", n_layers,
                      " (statistics recorded on another model?)");
  const int64_t max_row_sum = stats.n_tokens * top_k;
  for (int l = 0; l < n_layers; ++l) {
    const auto& row = stats.counts[l];
    if (int(row.size()) != n_experts)
      return make_error(source, ": layer ", l, " has ", row.size(), " expert counts, the model has ", n_experts,
                        " routed experts per layer");
    int64_t sum = 0;
    for (int64_t c : row) sum += c;
    if (sum == 0) return make_error(source, ": layer ", l, " routed no tokens (every count is 0)");
    if (sum > max_row_sum)
      return make_error(source, ": layer ", l, " counts sum to ", sum, ", more than n_tokens × top_k = ", stats.n_tokens,
                        " × ", top_k, " = ", max_row_sum);
  }
  return {};
}

}  // namespace spw::runtime
