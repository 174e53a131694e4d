// Routed experts placed off the GPU (GpuModelOptions::expert_tiers, model/expert_tier.h) against the same model
// with every expert in HBM, on a small synthetic V4.1 checkpoint with EXL3 experts (tools/synth, --width-divisor 4:
// 96 experts of 1280 → 640, two layers; made once per run under the test's temp dir).
//  - HostGpu (mapped pinned host memory, the same kernels): the same bits, through prefill (grouped EXL3
//    launches reading over PCIe), short forwards (the fused decode kernel, the grouped pairs path; their experts
//    staged into HBM slots first, engine/expert_staging.h, the 12-token forward with more distinct experts than
//    slots) and graph-captured decode steps.
//  - HostCpu (the CPU worker through the mailbox, engine/host_experts.h, in steps of ≤ kCpuExpertMaxRows rows;
//    larger ones read the same pinned bytes on the GPU, so the 40-token forward gives the all-GPU bits): every
//    layer's routed sum against the
//    all-GPU run's on the same input (the run is fed the reference's routed sums, so differences do not compound):
//    relative L2 error ≤ 1e-2. Why: the GPU rounds each expert's gate, up, SwiGLU and down outputs to bf16 and the
//    rotated activations to fp16 (reference_rounding, cuda/exl3_moe.h); the CPU keeps fp32. Four bf16 roundings
//    of relative RMS 2^-9/√3 each give ≈ 0.2 % on an expert's output; 1e-2 leaves 5× for their growth through
//    the SwiGLU. A lost or doubled CPU slot would move a layer's sum far more (by estimate: a third of the slots
//    carry about a third of the sum; not measured). Decode through CUDA graphs
//    with CPU experts, nothing fed: relative L2 of each step's logits ≤ 0.2. Why: on this random model the
//    per-layer ~3e-3 grows to 2–7e-2 in the logits (measured on an H100: 2.2–2.5e-2 typical, 7.4e-2 the worst of 8
//    steps), while losing a layer's CPU slots would move its routed sum by roughly a third of its norm (an estimate).
// Each placement: 0 %, a third (every third expert), all experts on the CPU, and a mix of all three tiers.
#if defined(SPW_HAVE_CUDA)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/gpu_model.h"
#include "gpu_test_util.h"

namespace spw {
namespace {

namespace fs = std::filesystem;

const std::string& spill_model() {
  static const std::string dir = [] {
    const std::string d = testing::TempDir() + "/spw_spill_v41_exl3";
    if (!fs::exists(d + "/config.json")) {
      const std::string cmd = "python3 " + std::string(SPW_SOURCE_DIR) + "/tools/synth/make_synthetic_model.py " + d +
                              " --arch v41 --experts exl3 --bits 3 --layers 2 --width-divisor 4 --tokenizer none"
                              " --engram-vocab 20000 > " + d + ".log 2>&1";
      EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    return d;
  }();
  return dir;
}

ExpertTiers tiers_where(const ModelConfig& c, ExpertTier (*tier_of)(int layer, int expert)) {
  ExpertTiers t(c.n_layers, std::vector<ExpertTier>(c.n_experts));
  for (int l = 0; l < c.n_layers; ++l)
    for (int e = 0; e < c.n_experts; ++e) t[l][e] = tier_of(l, e);
  return t;
}

std::unique_ptr<engine::GpuModel> load(const ExpertTiers& tiers,
                                       engine::EngramTablePlace engram = engine::EngramTablePlace::kAuto) {
  engine::GpuModelOptions o;
  o.engram_tables = engram;
  o.budget.max_context = 512;
  o.budget.max_seqs = 4;
  o.expert_tiers = tiers;
  o.host_expert_threads = 8;
  auto m = engine::load_gpu_model(spill_model(), Numerics::reference(), o);
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

std::vector<int32_t> tokens(int n, int salt) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = 1000 + (i * 7919 + salt * 104729) % 120000;
  return t;
}

// Forwards of 40 (grouped prefill), 5 (fused) and 12 (pairs) tokens; per forward and layer the routed sum, and
// the last logits. With `feed`, every routed sum is replaced by feed's before the layer goes on.
struct SpillRun {
  std::vector<std::map<int, std::vector<float>>> routed;  // [forward][layer]
  std::vector<std::vector<float>> logits;                 // [forward]
};
SpillRun run(engine::GpuModel& m, const SpillRun* feed) {
  SpillRun r;
  auto seq = m.new_sequence();
  EXPECT_TRUE(seq.ok()) << seq.error().message;
  if (!seq.ok()) return r;
  const int sizes[] = {40, 5, 12};
  for (int f = 0; f < 3; ++f) {
    r.routed.emplace_back();
    ForwardOptions o;
    o.on_intermediate = [&](const char* name, int layer, const float* v, size_t n) {
      if (std::string(name) == "moe.routed") r.routed[f][layer].assign(v, v + n);
    };
    if (feed)
      o.replace_intermediate = [&](const char* name, int layer, std::vector<float>& v) {
        if (std::string(name) == "moe.routed") v = feed->routed[f].at(layer);
      };
    auto out = m.forward(*seq, tokens(sizes[f], f), o);
    EXPECT_TRUE(out.ok()) << out.error().message;
    r.logits.push_back(out.ok() ? *out : std::vector<float>{});
  }
  return r;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : (num > 0 ? 1.0 : 0.0);
}

// Eight greedy decode steps of two sequences through GpuModel::decode (CUDA graphs), the logits of each step.
std::vector<std::vector<float>> decode_run(engine::GpuModel& m) {
  std::vector<std::vector<float>> out;
  auto a = m.new_sequence(), b = m.new_sequence();
  EXPECT_TRUE(a.ok() && b.ok());
  if (!a.ok() || !b.ok()) return out;
  auto pa = m.forward(*a, tokens(30, 5), {}), pb = m.forward(*b, tokens(21, 6), {});
  EXPECT_TRUE(pa.ok() && pb.ok());
  engine::GpuSequence* seqs[] = {&*a, &*b};
  std::vector<int32_t> cur = {11, 12}, next(2);
  for (int step = 0; step < 8; ++step) {
    std::vector<float> logits;
    auto st = m.decode(seqs, cur, next, &logits);
    EXPECT_TRUE(st.ok()) << st.error().message;
    if (!st.ok()) break;
    out.push_back(logits);
    cur = {int32_t(100 + step), int32_t(200 + step)};  // fixed inputs: both placements see the same tokens
  }
  return out;
}

TEST(EngineSpill, HostMappedExpertsGiveTheSameBits) {
  SPW_REQUIRE_GPU();
  auto gpu = load({});
  ASSERT_TRUE(gpu);
  const ExpertTiers mapped = tiers_where(gpu->config(), [](int, int) { return ExpertTier::HostGpu; });
  auto host = load(mapped);
  ASSERT_TRUE(host);
  const auto p = host->expert_placement();
  EXPECT_EQ(p.n_experts[int(ExpertTier::HostGpu)], int64_t(gpu->config().n_layers) * gpu->config().n_experts);
  EXPECT_GT(p.nbytes[int(ExpertTier::HostGpu)], 0u);
  EXPECT_EQ(p.nbytes[int(ExpertTier::Gpu)], 0u);
  EXPECT_LT(host->weight_nbytes() + p.nbytes[int(ExpertTier::HostGpu)] / 2, gpu->weight_nbytes() + 1);
  const SpillRun a = run(*gpu, nullptr), b = run(*host, nullptr);
  for (size_t f = 0; f < a.logits.size(); ++f) {
    ASSERT_EQ(a.logits[f].size(), b.logits[f].size());
    for (size_t i = 0; i < a.logits[f].size(); ++i) ASSERT_EQ(a.logits[f][i], b.logits[f][i]) << "forward " << f;
  }
  const auto da = decode_run(*gpu), db = decode_run(*host);
  ASSERT_EQ(da.size(), 8u);
  ASSERT_EQ(db.size(), 8u);
  for (size_t s = 0; s < da.size(); ++s) ASSERT_EQ(da[s], db[s]) << "decode step " << s;
}

void cpu_experts_match(ExpertTier (*tier_of)(int, int), const char* what) {
  auto gpu = load({});
  ASSERT_TRUE(gpu);
  const ModelConfig& c = gpu->config();
  const ExpertTiers tiers = tiers_where(c, tier_of);
  auto spill = load(tiers);
  ASSERT_TRUE(spill);
  const auto p = spill->expert_placement();
  std::printf("  [%s] experts gpu/host_gpu/host_cpu %lld/%lld/%lld, bytes %.1f/%.1f/%.1f MB\n", what,
              (long long)p.n_experts[0], (long long)p.n_experts[1], (long long)p.n_experts[2], p.nbytes[0] / 1e6,
              p.nbytes[1] / 1e6, p.nbytes[2] / 1e6);
  const SpillRun ref = run(*gpu, nullptr);
  const SpillRun got = run(*spill, &ref);
  ASSERT_EQ(got.routed.size(), ref.routed.size());
  for (size_t f = 0; f < ref.routed.size(); ++f)
    for (const auto& [layer, want] : ref.routed[f]) {
      ASSERT_TRUE(got.routed[f].count(layer)) << "forward " << f << " layer " << layer;
      const double e = rel_l2(got.routed[f].at(layer), want);
      std::printf("  [%s] forward %zu layer %d: routed sum relative L2 %.2e\n", what, f, layer, e);
      EXPECT_LE(e, 1e-2) << "forward " << f << " layer " << layer;
      // 40 rows: past kCpuExpertMaxRows, the GPU reads the CPU tier's experts itself: the all-GPU bits.
      if (f == 0) EXPECT_EQ(e, 0.0) << "a 40-token forward should not go to the CPU worker";
    }
  EXPECT_GT(spill->expert_placement().cpu_requests, 0u);
  const auto da = decode_run(*gpu), db = decode_run(*spill);
  ASSERT_EQ(da.size(), 8u);
  ASSERT_EQ(db.size(), 8u);
  for (size_t s = 0; s < da.size(); ++s) {
    const double e = rel_l2(db[s], da[s]);
    if (s == 0 || s + 1 == da.size()) std::printf("  [%s] decode step %zu: logits relative L2 %.2e\n", what, s, e);
    EXPECT_LE(e, 0.2) << "decode step " << s;
  }
  const auto after = spill->expert_placement();
  std::printf("  [%s] CPU worker: %llu requests, %.3f s busy\n", what, (unsigned long long)after.cpu_requests,
              after.cpu_busy_seconds);
}

TEST(EngineSpill, AThirdOfTheExpertsOnTheCpu) {
  SPW_REQUIRE_GPU();
  cpu_experts_match([](int, int e) { return e % 3 == 1 ? ExpertTier::HostCpu : ExpertTier::Gpu; }, "a third on the CPU");
}

TEST(EngineSpill, EveryExpertOnTheCpu) {
  SPW_REQUIRE_GPU();
  cpu_experts_match([](int, int) { return ExpertTier::HostCpu; }, "all on the CPU");
}

TEST(EngineSpill, EachTierAThird) {
  SPW_REQUIRE_GPU();
  cpu_experts_match([](int l, int e) { return ExpertTier((e + l) % 3); }, "a third per tier");
}

// V4.1's Engram tables left in the checkpoint's maps (the host gathers each step's rows) against pinned tables the GPU
// gathers from: the same rows, so the same bits (layer 1 of the model is an Engram layer).
TEST(EngineSpill, EngramTablesOnDiskGiveTheSameBits) {
  SPW_REQUIRE_GPU();
  auto pinned = load({}, engine::EngramTablePlace::kPinned);
  auto disk = load({}, engine::EngramTablePlace::kDisk);
  ASSERT_TRUE(pinned && disk);
  ASSERT_FALSE(pinned->config().engram_layers.empty());
  EXPECT_FALSE(pinned->engram_tables_on_disk());
  EXPECT_TRUE(disk->engram_tables_on_disk());
  const SpillRun a = run(*pinned, nullptr), b = run(*disk, nullptr);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  for (size_t f = 0; f < a.logits.size(); ++f) ASSERT_EQ(a.logits[f], b.logits[f]) << "forward " << f;
  const auto da = decode_run(*pinned), db = decode_run(*disk);
  ASSERT_EQ(da.size(), 8u);
  ASSERT_EQ(da, db);
}

TEST(EngineSpill, ACpuPlacementOfADenseExpertIsAClearError) {
  SPW_REQUIRE_GPU();
  const std::string tiny = std::string(SPW_SOURCE_DIR) + "/tests/golden/fixtures/v41/model";
  auto config = read_model_config(tiny);
  ASSERT_TRUE(config.ok());
  engine::GpuModelOptions o;
  o.budget.max_context = 256;
  o.expert_tiers = tiers_where(*config, [](int, int e) { return e == 0 ? ExpertTier::HostCpu : ExpertTier::Gpu; });
  auto m = engine::load_gpu_model(tiny, Numerics::reference(), o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("not stored as EXL3"), std::string::npos) << m.error().message;
  o.expert_tiers.pop_back();
  auto bad = engine::load_gpu_model(tiny, Numerics::reference(), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("layers"), std::string::npos) << bad.error().message;
}

}  // namespace
}  // namespace spw
#endif
