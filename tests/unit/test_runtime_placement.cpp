// runtime/placement.h, routing_stats.h, placement_file.h: budgets, ordering, the bytes-per-token and
// tokens/s arithmetic against hand computations, and clear errors on bad inputs.
#include <gtest/gtest.h>

#include <algorithm>

#include "formats/safetensors.h"
#include "model/config.h"
#include "model/inventory.h"
#include "runtime/placement.h"
#include "runtime/placement_file.h"
#include "runtime/routing_stats.h"

namespace spw::runtime {
namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

// Two layers of four 1 GiB experts, top 2; 1 GiB of dense weights of which a token reads 0.5 GiB.
PlacementModel small_model() {
  PlacementModel m;
  m.model_type = "test";
  m.n_layers = 2;
  m.n_experts = 4;
  m.top_k = 2;
  m.dense_nbytes = kGiB;
  m.dense_decode_nbytes_per_token = kGiB / 2;
  m.host_table_nbytes = 3 * kGiB;
  m.host_decode_nbytes_per_token = 1000000;
  m.expert_nbytes.assign(2, std::vector<int64_t>(4, kGiB));
  return m;
}

// 1 GiB reserved (KV 0.5 + workspace 0.5) and 1 GiB of dense weights: room for `n_experts` experts.
PlacementRequest room_for(double n_experts) {
  PlacementRequest r;
  r.kv_gib = 0.5;
  r.workspace_gib = 0.5;
  r.gpu_memory_gib = 2 + n_experts;
  return r;
}

// Layer 0 mostly sends tokens to experts 1 and 3, layer 1 to expert 0; 50 tokens × top 2 = 100 per row.
RoutingStats skewed_stats() { return RoutingStats{"test", 50, {{1, 50, 3, 46}, {90, 5, 5, 0}}}; }

int count(const Placement& p, int layer, ExpertTier tier) {
  return int(std::count(p.tiers[layer].begin(), p.tiers[layer].end(), tier));
}

TEST(Placement, BudgetThatFitsEveryExpertPutsAllOnTheGpu) {
  auto plan = plan_placement(small_model(), room_for(8));
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(plan->total(ExpertTier::Gpu).n_experts, 8);
  EXPECT_EQ(plan->total(ExpertTier::HostGpu).n_experts + plan->total(ExpertTier::HostCpu).n_experts, 0);
  EXPECT_EQ(plan->total(ExpertTier::Gpu).resident_nbytes, 9 * kGiB);
  // Dense 0.5 GiB + 2 layers × top 2 × 1 GiB.
  EXPECT_DOUBLE_EQ(plan->total(ExpertTier::Gpu).nbytes_per_token, 4.5 * kGiB);
  EXPECT_FALSE(plan->from_stats);
}

TEST(Placement, BudgetBelowOneExpertPutsNoneOnTheGpu) {
  auto plan = plan_placement(small_model(), room_for(0.99));
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(plan->total(ExpertTier::Gpu).n_experts, 0);
  EXPECT_EQ(plan->total(ExpertTier::Gpu).resident_nbytes, kGiB);  // the dense weights only
  EXPECT_NEAR(double(plan->expert_budget_nbytes), 0.99 * kGiB, 1.0);
}

TEST(Placement, UniformFractionSpreadsOverLayers) {
  auto plan = plan_placement(small_model(), room_for(3));
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(plan->total(ExpertTier::Gpu).n_experts, 3);
  EXPECT_EQ(count(*plan, 0, ExpertTier::Gpu), 2);
  EXPECT_EQ(count(*plan, 1, ExpertTier::Gpu), 1);
  EXPECT_EQ(plan->tiers[0][0], ExpertTier::Gpu);
  EXPECT_EQ(plan->tiers[1][0], ExpertTier::Gpu);
  EXPECT_EQ(plan->tiers[0][1], ExpertTier::Gpu);
  // Uniform: each expert is used top_k / n_experts = 0.5 times per token.
  EXPECT_DOUBLE_EQ(plan->total(ExpertTier::Gpu).nbytes_per_token, 0.5 * kGiB + 3 * 0.5 * kGiB);
}

TEST(Placement, SkewedStatisticsPutTheHotExpertsOnTheGpu) {
  const RoutingStats stats = skewed_stats();
  auto plan = plan_placement(small_model(), room_for(3), &stats, "stats.json");
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_TRUE(plan->from_stats);
  // Activations per token: layer 1 expert 0 1.8, layer 0 expert 1 1.0, layer 0 expert 3 0.92.
  for (auto [l, e] : {std::pair{1, 0}, {0, 1}, {0, 3}}) EXPECT_EQ(plan->tiers[l][e], ExpertTier::Gpu) << l << "," << e;
  EXPECT_EQ(plan->total(ExpertTier::Gpu).n_experts, 3);
  // Uniform planning would have put layer 0 expert 0 (used 0.02 times per token) on the GPU.
  EXPECT_NE(plan->tiers[0][0], ExpertTier::Gpu);
}

TEST(Placement, BytesPerTokenAndTokensPerSecondMatchAHandComputation) {
  const RoutingStats stats = skewed_stats();
  PlacementRequest r = room_for(2);
  r.host_tier = HostTierPolicy::Cpu;
  r.bandwidths = {1000, 10, 100};
  auto plan = plan_placement(small_model(), r, &stats, "stats.json");
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  // GPU: (1,0) p 1.8 and (0,1) p 1.0; CPU: the other six, p 0.02 + 0.06 + 0.92 + 0.1 + 0.1 + 0 = 1.2.
  EXPECT_EQ(plan->tiers[1][0], ExpertTier::Gpu);
  EXPECT_EQ(plan->tiers[0][1], ExpertTier::Gpu);
  EXPECT_NEAR(plan->total(ExpertTier::Gpu).nbytes_per_token, 3543348019.2, 1e-3);  // (0.5 + 2.8) GiB
  EXPECT_NEAR(plan->total(ExpertTier::HostGpu).nbytes_per_token, 1e6, 1e-6);        // Engram rows only
  EXPECT_NEAR(plan->total(ExpertTier::HostCpu).nbytes_per_token, 1288490188.8, 1e-3);  // 1.2 GiB
  EXPECT_EQ(plan->total(ExpertTier::HostCpu).n_experts, 6);
  EXPECT_EQ(plan->total(ExpertTier::HostCpu).resident_nbytes, 6 * kGiB);
  EXPECT_EQ(plan->total(ExpertTier::HostGpu).resident_nbytes, 3 * kGiB);  // Engram tables
  // 3543348019.2 / 1e12 + 1e6 / 1e10 + 1288490188.8 / 1e11 s.
  EXPECT_NEAR(plan->seconds_per_token, 0.0165282499072, 1e-15);
  EXPECT_NEAR(plan->tokens_per_s, 1 / 0.0165282499072, 1e-9);
}

TEST(Placement, HostTierPolicy) {
  PlacementRequest r = room_for(0);
  auto tier_of_host_experts = [&](HostTierPolicy policy, double pcie, double cpu) {
    r.host_tier = policy;
    r.bandwidths.pcie_gbs = pcie;
    r.bandwidths.cpu_gbs = cpu;
    auto plan = plan_placement(small_model(), r);
    EXPECT_TRUE(plan.ok());
    EXPECT_EQ(count(*plan, 0, plan->tiers[0][0]), 4);
    return plan->tiers[0][0];
  };
  EXPECT_EQ(tier_of_host_experts(HostTierPolicy::Auto, 50, 70), ExpertTier::HostCpu);
  EXPECT_EQ(tier_of_host_experts(HostTierPolicy::Auto, 80, 70), ExpertTier::HostGpu);
  EXPECT_EQ(tier_of_host_experts(HostTierPolicy::Auto, 70, 70), ExpertTier::HostGpu);
  EXPECT_EQ(tier_of_host_experts(HostTierPolicy::Gpu, 10, 70), ExpertTier::HostGpu);
  EXPECT_EQ(tier_of_host_experts(HostTierPolicy::Cpu, 80, 10), ExpertTier::HostCpu);
}

TEST(Placement, ExpertsOfDifferentSizesAreChosenByUsePerByteAndSmallerOnesFillTheRest) {
  PlacementModel m = small_model();
  m.expert_nbytes[1][0] = 3 * kGiB;  // the hottest expert does not fit the 2 GiB budget
  m.expert_nbytes[0][3] = 2 * kGiB;  // fits, and has the most traffic of those that do, but the least use per byte
  // Uses per token: layer 0 0.7, 0.7, 0, 0.6 (traffic 0.7, 0.7, 0, 1.2 GiB); layer 1 2, 0, 0, 0.
  const RoutingStats stats{"test", 50, {{35, 35, 0, 30}, {100, 0, 0, 0}}};
  auto plan = plan_placement(m, room_for(2), &stats, "stats.json");
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  // By use per byte: (1,0) is skipped, (0,0) and (0,1) fill the budget: 1.4 GiB per token off the host. Ordering by
  // traffic would have taken (0,3) alone: 1.2 GiB.
  EXPECT_EQ(plan->tiers[0][0], ExpertTier::Gpu);
  EXPECT_EQ(plan->tiers[0][1], ExpertTier::Gpu);
  EXPECT_EQ(plan->total(ExpertTier::Gpu).n_experts, 2);
  EXPECT_NEAR(plan->total(ExpertTier::Gpu).nbytes_per_token, (0.5 + 1.4) * kGiB, 1e-3);
}

TEST(Placement, DenseWeightsAndReservationsThatDoNotFitNameTheFlags) {
  auto plan = plan_placement(small_model(), room_for(-0.5));
  ASSERT_FALSE(plan.ok());
  const std::string& msg = plan.error().message;
  EXPECT_NE(msg.find("--gpu-memory 1.5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--kv-gib"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--workspace-gib"), std::string::npos) << msg;
  EXPECT_EQ(msg,
            "the dense weights (1.00 GiB) + --kv-gib 0.5 + --workspace-gib 0.5 = 2.00 GiB do not fit --gpu-memory 1.5 GiB: "
            "raise --gpu-memory or lower the reservations");
}

TEST(Placement, NonPositiveSettingsNameTheFlag) {
  PlacementRequest r = room_for(1);
  r.bandwidths.pcie_gbs = 0;
  auto plan = plan_placement(small_model(), r);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.error().message, "--pcie-gbs must be a positive bandwidth in GB/s, got 0");
  r = room_for(1);
  r.kv_gib = -1;
  plan = plan_placement(small_model(), r);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.error().message, "--kv-gib must be ≥ 0, got -1");
}

std::string plan_error(const RoutingStats& stats) {
  auto plan = plan_placement(small_model(), room_for(1), &stats, "stats.json");
  EXPECT_FALSE(plan.ok());
  return plan.ok() ? "" : plan.error().message;
}

TEST(RoutingStats, ShapesThatDoNotMatchTheModelAreRejected) {
  EXPECT_EQ(plan_error({"m", 50, {{1, 50, 3, 46}}}),
            "stats.json: has 1 layers of counts, the model has 2 (statistics recorded on another model?)");
  EXPECT_EQ(plan_error({"m", 50, {{1, 50, 3, 46}, {90, 5, 5}}}),
            "stats.json: layer 1 has 3 expert counts, the model has 4 routed experts per layer");
  EXPECT_EQ(plan_error({"m", 50, {{1, 50, 3, 46}, {0, 0, 0, 0}}}), "stats.json: layer 1 routed no tokens (every count is 0)");
  EXPECT_EQ(plan_error({"m", 10, {{1, 50, 3, 46}, {90, 5, 5, 0}}}),
            "stats.json: layer 0 counts sum to 100, more than n_tokens × top_k = 10 × 2 = 20");
}

std::string parse_error(const std::string& text) {
  auto stats = parse_routing_stats(text, "stats.json");
  EXPECT_FALSE(stats.ok());
  return stats.ok() ? "" : stats.error().message;
}

TEST(RoutingStats, MalformedFilesGiveErrorsNamingTheField) {
  EXPECT_NE(parse_error("{\"model\": \"m\", \"n_tokens\": 5, \"layers\": [[1, 2]").find(
                "stats.json: routing statistics are not valid JSON"),
            std::string::npos);
  EXPECT_EQ(parse_error("[1, 2]"), "stats.json: routing statistics must be a JSON object with model, n_tokens, layers");
  EXPECT_EQ(parse_error(R"({"n_tokens": 5, "layers": []})"),
            "stats.json: \"model\" must be a string (the model the statistics were recorded on)");
  EXPECT_EQ(parse_error(R"({"model": "m", "n_tokens": 0, "layers": []})"),
            "stats.json: \"n_tokens\" must be a positive integer (tokens routed)");
  EXPECT_EQ(parse_error(R"({"model": "m", "n_tokens": 5, "layers": {}})"),
            "stats.json: \"layers\" must be an array with one array of expert counts per layer");
  EXPECT_EQ(parse_error(R"({"model": "m", "n_tokens": 5, "layers": [[1, -2]]})"),
            "stats.json: layers[0][1] must be a non-negative integer count, got -2");
  EXPECT_EQ(parse_error(R"({"model": "m", "n_tokens": 5, "layers": [[1, 2], 3]})"),
            "stats.json: layers[1] must be an array of expert counts");
  EXPECT_EQ(parse_error(R"({"model": "m", "n_tokens": 5, "layers": [[1, 2.5]]})"),
            "stats.json: layers[0][1] must be a non-negative integer count, got 2.5");
  auto missing = read_routing_stats("/nonexistent/stats.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message, "/nonexistent/stats.json: cannot open the routing statistics file");
}

TEST(RoutingStats, AWellFormedFileParses) {
  auto stats = parse_routing_stats(R"({"model": "m", "n_tokens": 50, "layers": [[1, 50, 3, 46], [90, 5, 5, 0]]})", "s");
  ASSERT_TRUE(stats.ok()) << stats.error().message;
  EXPECT_EQ(stats->model, "m");
  EXPECT_EQ(stats->n_tokens, 50);
  EXPECT_EQ(stats->counts, skewed_stats().counts);
}

TEST(PlacementFile, RoundTripsTheTiers) {
  const RoutingStats stats = skewed_stats();
  PlacementRequest r = room_for(3);
  r.host_tier = HostTierPolicy::Gpu;
  auto plan = plan_placement(small_model(), r, &stats, "stats.json");
  ASSERT_TRUE(plan.ok());
  auto file = parse_placement(placement_to_json(*plan), "placement.json");
  ASSERT_TRUE(file.ok()) << file.error().message;
  EXPECT_EQ(file->model_type, "test");
  EXPECT_EQ(file->n_layers, 2);
  EXPECT_EQ(file->n_experts, 4);
  EXPECT_EQ(file->tiers, plan->tiers);
}

std::string placement_error(const std::string& layers) {
  const std::string text = R"({"format": "spillway-placement", "version": 1, "model_type": "t", "n_layers": 1,
                               "n_experts": 3, "layers": )" + layers + "}";
  auto file = parse_placement(text, "p.json");
  EXPECT_FALSE(file.ok());
  return file.ok() ? "" : file.error().message;
}

TEST(PlacementFile, EveryExpertMustBePlacedExactlyOnce) {
  EXPECT_EQ(placement_error(R"([{"gpu": [0, 1], "host_cpu": [1, 2]}])"), "p.json: layer 0 places expert 1 twice");
  EXPECT_EQ(placement_error(R"([{"gpu": [0], "host_cpu": [2]}])"), "p.json: layer 0 does not place expert 1");
  EXPECT_EQ(placement_error(R"([{"gpu": [0, 1, 3]}])"),
            "p.json: layers[0].gpu holds 3, not an expert index in [0, 3)");
  EXPECT_EQ(placement_error(R"([])"), "p.json: \"layers\" must be an array of n_layers = 1 objects");
  EXPECT_EQ(parse_placement(R"({"format": "other"})", "p.json").error().message,
            "p.json: not a placement file (\"format\" must be \"spillway-placement\")");
}

TEST(PlacementModelFromInventory, AMissingExpertIsAnError) {
  ModelConfig c;
  c.model_type = "t";
  c.n_layers = 2;
  c.n_experts = 3;
  c.top_k = 1;
  Inventory inv;
  inv.expert_nbytes_by_layer = {{5, 5, 5}, {5, 0, 5}};
  auto m = placement_model_from_inventory(c, inv);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().message,
            "the checkpoint has no tensors for routed expert 1 of layer 1 (layers.1.ffn.experts.1.*): a placement needs "
            "every expert");
  inv.expert_nbytes_by_layer[1][1] = 5;
  EXPECT_TRUE(placement_model_from_inventory(c, inv).ok());
}

TEST(PlacementModelFromInventory, TheDemoModelsBytesAddUp) {
  const std::string dir = std::string(SPW_SOURCE_DIR) + "/models/demo";
  auto config = read_model_config(dir);
  ASSERT_TRUE(config.ok()) << config.error().message;
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
  const Inventory inv = take_inventory(*ckpt, *config);
  int64_t experts = 0;
  for (const auto& layer : inv.expert_nbytes_by_layer)
    for (int64_t b : layer) {
      EXPECT_GT(b, 0);
      experts += b;
    }
  ASSERT_TRUE(inv.groups.count("routed experts"));
  EXPECT_EQ(experts, inv.groups.at("routed experts").nbytes);
  int64_t aside = 0;
  for (const char* role : {"draft (MTP/DSpark)", "vision", "engram token map"})  // not device weights
    if (inv.groups.count(role)) aside += inv.groups.at(role).nbytes;
  EXPECT_EQ(inv.dense_nbytes + inv.engram_table_nbytes + experts + aside, inv.total.nbytes);
  // Decode reads the dense weights per token, top_k experts per layer and the Engram rows.
  EXPECT_GT(inv.dense_decode_nbytes_per_token, 0);
  EXPECT_LE(inv.dense_decode_nbytes_per_token, inv.dense_nbytes);
  const int64_t mean_expert = experts / (config->n_layers * config->n_experts);
  EXPECT_EQ(inv.dense_decode_nbytes_per_token + config->n_layers * config->top_k * mean_expert +
                inv.engram_decode_nbytes_per_token,
            inv.decode_nbytes_per_token);
  auto m = placement_model_from_inventory(*config, inv);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->n_experts, config->n_experts);
}

}  // namespace
}  // namespace spw::runtime
