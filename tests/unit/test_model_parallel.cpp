// Tensor and expert parallel of the CPU reference forward (model/parallel_model.h) on the loopback group: TP2, TP4,
// EP4 and TP2+EP2 of the tiny V4 and V4.1 fixtures against the single-device Model on the same tokens (a 37-token
// prefill with every position's logits, then greedy decode steps). Every rank returns the same bits; a group of one
// rank is the Model bit for bit; the shards hold what the plan gives them; plans and models that cannot be split
// are refused with the reason.
//
// How the two numerics are compared, and why differently:
// - Numerics::exact() (f32 throughout) is smooth: a rounding-order difference stays a rounding-order difference,
//   so the logits of the whole run are compared.
// - Numerics::reference() is not: its bf16 roundings, FP8 activation/KV quant and top-k picks turn one flipped
//   bf16 step into O(1) logit changes. Measured on these fixtures with the single-device Model alone: one bf16
//   step added to one residual value of a one-token forward moves the logits by up to 1.1 (V4, max |logit| ~16)
//   and 2.5 (V4.1, ~26); tests/golden/test_golden.cpp measured the same against the V4.1 oracle. Tensor
//   parallelism changes roundings by design (model/parallel_model.h), so end-to-end logits differ by O(1) and
//   bound nothing. Instead each layer is teacher-forced (given the single device's input streams) and each
//   sublayer's output is held to the size of the roundings the plan changes. End to end, EP4 (which changes no
//   rounding) must give the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/parallel_model.h"
#include "model_fixture.h"

namespace spw {
namespace {

using test::fixture_dir;
using test::random_tokens;

std::unique_ptr<Model> fixture(const std::string& arch, Numerics numerics, const LoadOptions& options = {}) {
  return test::load_fixture(arch, numerics, options);
}

size_t argmax(const float* v, size_t n) { return size_t(std::max_element(v, v + n) - v); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

// What each plan changes, and the bound on a teacher-forced sublayer output under Numerics::reference()
// (‖parallel − single‖ / ‖single‖ over all tokens of a layer):
// - EP4 changes no rounding (see ExpertParallelIsBitExact): 0.
// - TP2 and TP2+EP2 hold whole output groups, so the attention's rounded and quantized values are the single
//   device's and only wo_b's f32 sum is split before its bf16 rounding; the experts' width slices round their
//   own w2 outputs to bf16 (2^-9 relative per rounding), V4's shared slice (64 of a 128 block) takes its own FP8
//   scale. Measured: attention 0, FFN 1.2e-3 to 3.3e-3. Bound 1e-2, 2.5 bf16 steps.
// - TP4 splits each output group over two ranks (tp > o_groups): each rank rounds its part of z to bf16 and
//   fake-quantizes it to FP8 (e4m3 steps of 2^-3, so up to 2^-4 relative error per value, relatively larger
//   where the two parts cancel) before wo_b, and the expert slices (32 of 128, 16 of 32 channels) are narrower
//   than an activation block, each with its own FP8 scale. Measured: attention 3.7e-2 to 0.13, FFN 2.9e-2 to
//   6.0e-2. Bound 0.25.
// These bounds check that the roundings are where the single device has them, at the size the plan explains; a
// structural mistake is what the exact comparisons catch (each of dropping the attention all-reduce, adding the
// shared expert's slices twice and giving every rank the first heads' sinks fails them by orders of magnitude).
// Dropping the attention all-reduce also fails these bounds for every TP plan (attention 0.66 to 0.90).
struct PlanCase {
  const char* name;
  ParallelPlan plan;
  double reference_sublayer_tol;
};
const PlanCase kPlans[] = {{"TP2", {2, 1}, 1e-2}, {"TP4", {4, 1}, 0.25}, {"EP4", {1, 4}, 0.0}, {"TP2+EP2", {2, 2}, 1e-2}};

// Numerics::exact(), whole run: a rank's part of a product is an exact slice of the same f32 operations (the
// reference matmul sums each dot product sequentially, whatever the row count), so the only difference is the
// order of f32 additions where a sum is split over ranks (wo_a and wo_b over split heads, w2 over width slices,
// the MoE's sum of experts): a few f32 ulps (2^-24) per sum, carried through 5 (V4) or 10 (V4.1) layers, their
// hyper-connections and norms. Measured: max |Δlogit| / max |logit| ≤ 1.9e-6 (V4) and 2.7e-6 (V4.1), and no greedy
// token changes. 1e-4 leaves a 35× margin and is far below what a wrong slice or a lost part does (O(1)).
constexpr float kExactLogitRelTol = 1e-4f;
// Numerics::exact(), teacher-forced sublayers: the same f32 reordering inside one sublayer. Measured ≤ 8e-7.
constexpr double kExactSublayerTol = 1e-5;

constexpr size_t kPrompt = 37;
constexpr int kDecodeSteps = 6;

// The single-device run: the tokens of each forward (the prompt, then each step's greedy token) and its logits.
struct Trace {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logits;
};

Trace single_device(const Model& m) {
  const int64_t vocab = m.config().vocab_size;
  Trace t;
  t.tokens.push_back(random_tokens(kPrompt, vocab, 37));
  SequenceState seq = m.new_sequence();
  ForwardOptions all;
  all.all_logits = true;
  for (int step = 0; step <= kDecodeSteps; ++step) {
    auto r = m.forward(seq, t.tokens.back(), all);
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (!r.ok()) return t;
    t.logits.push_back(std::move(r.value()));
    const float* last = t.logits.back().data() + t.logits.back().size() - size_t(vocab);
    t.tokens.push_back({int32_t(argmax(last, size_t(vocab)))});
  }
  t.tokens.pop_back();
  return t;
}

struct Comparison {
  float max_abs_diff = 0.f;   // over every logit of every forward
  float max_abs_logit = 0.f;  // of the single-device logits
  int rows = 0;
  int argmax_flips = 0;      // rows whose argmax differs
  float max_flip_gap = 0.f;  // single-device logit gap between the two argmaxes of a flipped row
  bool bit_identical = true;
};

// Runs the plan on the trace's tokens, whole; every rank's logits must be the same bits.
Comparison run_parallel(const Model& full, const ParallelPlan& plan, const Trace& single, const std::string& label) {
  Comparison cmp;
  auto pm = ParallelModel::create(full, plan);
  EXPECT_TRUE(pm.ok()) << label << ": " << pm.error().message;
  if (!pm.ok()) return cmp;
  const size_t vocab = size_t(full.config().vocab_size);
  auto seq = (*pm)->new_sequence();
  for (size_t step = 0; step < single.tokens.size(); ++step) {
    std::vector<ForwardOptions> options(size_t((*pm)->n_ranks()));
    for (ForwardOptions& o : options) o.all_logits = true;
    auto r = (*pm)->forward_every_rank(seq, single.tokens[step], options);
    EXPECT_TRUE(r.ok()) << label << ": " << r.error().message;
    if (!r.ok()) return cmp;
    EXPECT_EQ(r.value().size(), size_t(plan.n_ranks()));
    const std::vector<float>& got = r.value()[0];
    const std::vector<float>& want = single.logits[step];
    EXPECT_EQ(got.size(), want.size()) << label << " step " << step;
    if (got.size() != want.size()) return cmp;
    for (size_t rank = 1; rank < r.value().size(); ++rank)
      EXPECT_TRUE(same_bits(r.value()[rank], got)) << label << " step " << step << ": rank " << rank
                                                   << "'s logits differ from rank 0's";
    cmp.bit_identical = cmp.bit_identical && same_bits(got, want);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(std::isfinite(got[i])) << label << " step " << step << " logit " << i;
      cmp.max_abs_diff = std::max(cmp.max_abs_diff, std::fabs(got[i] - want[i]));
      cmp.max_abs_logit = std::max(cmp.max_abs_logit, std::fabs(want[i]));
    }
    for (size_t row = 0; row < got.size() / vocab; ++row, ++cmp.rows) {
      const size_t a_got = argmax(got.data() + row * vocab, vocab), a_want = argmax(want.data() + row * vocab, vocab);
      if (a_got == a_want) continue;
      ++cmp.argmax_flips;
      cmp.max_flip_gap = std::max(cmp.max_flip_gap, want[row * vocab + a_want] - want[row * vocab + a_got]);
    }
  }
  std::printf("  %-14s max|dlogit| %.3g of max|logit| %.3g (%.2g)  greedy tokens changed %d of %d rows\n",
              label.c_str(), cmp.max_abs_diff, cmp.max_abs_logit, cmp.max_abs_diff / cmp.max_abs_logit,
              cmp.argmax_flips, cmp.rows);
  return cmp;
}

// Teacher-forced layers: every rank's layer l gets the single device's input streams of layer l, so a rounding
// difference cannot carry from one layer to the next, and each sublayer's output ("attn.out", "ffn.out": the full
// values, after the ranks' parts are summed) is compared with the single device's. The layer's state (window rows,
// compressed entries, index keys, V4.1's shared entries and top-k) comes from those same inputs, so it is the
// single device's too. Runs the trace's forwards in order (the prompt, then the decode tokens).
struct SublayerErrors {
  std::vector<double> attn, ffn;  // per layer: ‖parallel − single‖ / ‖single‖ over every forward's tokens
  double worst() const {
    double w = 0;
    for (double e : attn) w = std::max(w, e);
    for (double e : ffn) w = std::max(w, e);
    return w;
  }
};

SublayerErrors teacher_forced(const Model& full, const ParallelPlan& plan, const Trace& trace,
                              const std::string& label) {
  const size_t n_layers = size_t(full.config().n_layers);
  SublayerErrors out;
  auto pm = ParallelModel::create(full, plan);
  EXPECT_TRUE(pm.ok()) << label << ": " << pm.error().message;
  if (!pm.ok()) return out;
  // [layer][0: attention, 1: FFN] sums of squared differences and of squared single-device values.
  std::vector<std::array<double, 2>> err2(n_layers, {0, 0}), ref2(n_layers, {0, 0});
  SequenceState single = full.new_sequence();
  auto seq = (*pm)->new_sequence();
  for (const std::vector<int32_t>& tokens : trace.tokens) {
    std::vector<std::vector<float>> inputs(n_layers);
    std::vector<std::array<std::vector<float>, 2>> want(n_layers), got(n_layers);
    auto capture = [](std::vector<std::array<std::vector<float>, 2>>& to) {
      return [&to](const char* name, int layer, const float* data, size_t count) {
        const std::string n = name;
        if (n == "attn.out" || n == "ffn.out") to[size_t(layer)][n == "ffn.out"].assign(data, data + count);
      };
    };
    ForwardOptions record;
    record.before_layer = [&](int layer, std::vector<float>& streams) { inputs[size_t(layer)] = streams; };
    record.on_intermediate = capture(want);
    EXPECT_TRUE(full.forward(single, tokens, record).ok());
    std::vector<ForwardOptions> options(size_t((*pm)->n_ranks()));
    for (ForwardOptions& o : options)
      o.before_layer = [&](int layer, std::vector<float>& streams) { streams = inputs[size_t(layer)]; };
    options[0].on_intermediate = capture(got);
    auto r = (*pm)->forward_every_rank(seq, tokens, options);
    EXPECT_TRUE(r.ok()) << label << ": " << r.error().message;
    if (!r.ok()) return out;
    for (size_t l = 0; l < n_layers; ++l)
      for (size_t k = 0; k < 2; ++k) {
        const std::vector<float>& w = want[l][k];
        const std::vector<float>& g = got[l][k];
        EXPECT_EQ(g.size(), w.size()) << label << " layer " << l;
        if (g.size() != w.size()) return out;
        for (size_t i = 0; i < w.size(); ++i) {
          err2[l][k] += double(g[i] - w[i]) * double(g[i] - w[i]);
          ref2[l][k] += double(w[i]) * double(w[i]);
        }
      }
  }
  for (size_t l = 0; l < n_layers; ++l) {
    out.attn.push_back(std::sqrt(err2[l][0] / ref2[l][0]));
    out.ffn.push_back(std::sqrt(err2[l][1] / ref2[l][1]));
  }
  std::printf("  %-14s relative error per layer, attention:", label.c_str());
  for (double e : out.attn) std::printf(" %.1e", e);
  std::printf("\n  %-14s                                FFN:", "");
  for (double e : out.ffn) std::printf(" %.1e", e);
  std::printf("\n");
  return out;
}

void check_exact(const std::string& arch) {
  auto full = fixture(arch, Numerics::exact());
  ASSERT_TRUE(full);
  const Trace single = single_device(*full);
  ASSERT_EQ(single.logits.size(), size_t(kDecodeSteps + 1));
  std::printf("%s, exact numerics, %zu-token prefill + %d decode steps:\n", arch.c_str(), kPrompt, kDecodeSteps);
  for (const PlanCase& pc : kPlans) {
    const std::string label = arch + " " + pc.name;
    const Comparison cmp = run_parallel(*full, pc.plan, single, label);
    ASSERT_GT(cmp.max_abs_logit, 0.f) << label;
    const float tol = kExactLogitRelTol * cmp.max_abs_logit;
    EXPECT_LE(cmp.max_abs_diff, tol) << label << ": max |Δlogit| " << cmp.max_abs_diff << " > " << kExactLogitRelTol
                                     << " · max |logit| " << cmp.max_abs_logit;
    // Greedy decoding changes only where it must: both logits of a flipped pair move by at most tol, so a flip
    // needs a single-device gap of at most 2·tol between the two tokens.
    EXPECT_LE(cmp.max_flip_gap, 2 * tol) << label << ": " << cmp.argmax_flips << " greedy tokens changed";
  }
  for (const PlanCase& pc : kPlans) {
    const SublayerErrors e = teacher_forced(*full, pc.plan, single, arch + " " + pc.name);
    EXPECT_LE(e.worst(), kExactSublayerTol) << arch << " " << pc.name;
  }
}

void check_reference(const std::string& arch) {
  auto full = fixture(arch, Numerics::reference());
  ASSERT_TRUE(full);
  const Trace single = single_device(*full);
  ASSERT_EQ(single.logits.size(), size_t(kDecodeSteps + 1));
  std::printf("%s, reference numerics, teacher-forced layers:\n", arch.c_str());
  for (const PlanCase& pc : kPlans) {
    const SublayerErrors e = teacher_forced(*full, pc.plan, single, arch + " " + pc.name);
    ASSERT_EQ(e.attn.size(), size_t(full->config().n_layers));
    EXPECT_LE(e.worst(), pc.reference_sublayer_tol) << arch << " " << pc.name;
  }
  // Whole runs: every rank the same bits (checked inside), and the size of the end-to-end difference shown for
  // what it is (see the top of the file: no bound follows from it).
  std::printf("%s, reference numerics, whole run (%zu-token prefill + %d decode steps):\n", arch.c_str(), kPrompt,
              kDecodeSteps);
  for (const PlanCase& pc : kPlans) run_parallel(*full, pc.plan, single, arch + " " + pc.name);
}

TEST(ModelParallel, V4ExactMatchesSingleDevice) { check_exact("v4"); }
TEST(ModelParallel, V41ExactMatchesSingleDevice) { check_exact("v41"); }
TEST(ModelParallel, V4ReferenceMatchesSingleDevicePerLayer) { check_reference("v4"); }
TEST(ModelParallel, V41ReferenceMatchesSingleDevicePerLayer) { check_reference("v41"); }

// EP alone changes no rounding: attention, shared expert and head are whole on every rank, and a token's routed
// outputs (top_k = 2 in both fixtures) are added in f32 either on one rank, as on one device, or one per rank and
// then across ranks in rank order with exact zeros from the others; a sum of two values does not depend on their
// order. So the whole run, prefill and decode, gives the single device's bits in both numerics.
TEST(ModelParallel, ExpertParallelIsBitExact) {
  for (const char* arch : {"v4", "v41"}) {
    for (const Numerics numerics : {Numerics::exact(), Numerics::reference()}) {
      auto full = fixture(arch, numerics);
      ASSERT_TRUE(full);
      ASSERT_EQ(full->config().top_k, 2);
      const Trace single = single_device(*full);
      for (const ParallelPlan plan : {ParallelPlan{1, 2}, ParallelPlan{1, 4}, ParallelPlan{1, 8}}) {
        const std::string label = std::string(arch) + " EP" + std::to_string(plan.ep) +
                                  (numerics.fake_quant ? " ref" : " exact");
        EXPECT_TRUE(run_parallel(*full, plan, single, label).bit_identical) << label;
      }
    }
  }
}

// A group of one rank runs the same operations in the same order as the Model: the same bits.
TEST(ModelParallel, OneRankIsTheModelBitForBit) {
  for (const char* arch : {"v4", "v41"}) {
    auto full = fixture(arch, Numerics::reference());
    ASSERT_TRUE(full);
    const Trace single = single_device(*full);
    auto pm = ParallelModel::create(*full, {1, 1});
    ASSERT_TRUE(pm.ok()) << pm.error().message;
    auto seq = (*pm)->new_sequence();
    for (size_t step = 0; step < single.tokens.size(); ++step) {
      auto r = (*pm)->forward(seq, single.tokens[step], /*all_logits=*/true);
      ASSERT_TRUE(r.ok()) << r.error().message;
      EXPECT_TRUE(same_bits(r.value(), single.logits[step])) << arch << " step " << step;
    }
  }
}

// What each rank holds: its heads' q rows and sinks, its part of the output projection, its experts or slices,
// its vocabulary block; the ranks' expert blocks tile the experts.
TEST(ModelParallel, ShardsHoldTheirSlices) {
  auto full = fixture("v4", Numerics::exact());
  ASSERT_TRUE(full);
  const ModelConfig& c = full->config();
  const LayerWeights& fl = full->weights().layers[1];
  const int H = c.n_heads, D = c.d_head, E = c.n_experts, F = c.d_expert, R = c.o_lora_rank;
  const size_t V = size_t(c.vocab_size), d = size_t(c.d_model);
  ASSERT_EQ(H, 4);
  ASSERT_EQ(c.o_groups, 2);
  {  // TP4: one head per rank, half of a group's wo_a input columns, the group's wo_b columns.
    auto pm = ParallelModel::create(*full, {4, 1});
    ASSERT_TRUE(pm.ok()) << pm.error().message;
    for (int r = 0; r < 4; ++r) {
      const Model& m = (*pm)->rank_model(r);
      const LayerWeights& lw = m.weights().layers[1];
      EXPECT_EQ(m.config().n_heads, 1);
      EXPECT_EQ(m.config().o_groups, 1);
      ASSERT_EQ(lw.wq_b.n_out, D);
      EXPECT_TRUE(std::equal(lw.wq_b.w.begin(), lw.wq_b.w.end(), fl.wq_b.w.begin() + size_t(r) * D * fl.wq_b.n_in));
      ASSERT_EQ(lw.attn_sink.size(), 1u);
      EXPECT_EQ(lw.attn_sink[0], fl.attn_sink[size_t(r)]);
      ASSERT_EQ(lw.wo_a.n_out, R);
      ASSERT_EQ(lw.wo_a.n_in, D);
      const int g = r / 2, j = r % 2;
      for (int row = 0; row < R; ++row)
        for (int k = 0; k < D; ++k)
          ASSERT_EQ(lw.wo_a.w[size_t(row) * D + k], fl.wo_a.w[size_t(g * R + row) * fl.wo_a.n_in + j * D + k]);
      ASSERT_EQ(lw.wo_b.n_in, R);
      for (size_t row = 0; row < d; ++row)
        ASSERT_EQ(lw.wo_b.w[row * R + 5], fl.wo_b.w[row * fl.wo_b.n_in + g * R + 5]);
      EXPECT_EQ(lw.shared.w1.n_out, F / 4);
      ASSERT_EQ(lw.shared.w2.n_in, F / 4);
      EXPECT_EQ(lw.shared.w2.w[0], fl.shared.w2.w[size_t(r) * (F / 4)]);
      ASSERT_EQ(lw.experts.size(), size_t(E));
      for (const Expert& e : lw.experts) EXPECT_EQ(e.w3.n_out, F / 4);
      ASSERT_EQ(m.weights().head.n_out, int(V / 4));
      EXPECT_EQ(m.weights().head.w[0], full->weights().head.w[size_t(r) * (V / 4) * d]);
      EXPECT_EQ(m.weights().embed, full->weights().embed);
    }
  }
  {  // EP4: disjoint blocks of whole experts that cover them all; attention, shared expert and head whole.
    auto pm = ParallelModel::create(*full, {1, 4});
    ASSERT_TRUE(pm.ok()) << pm.error().message;
    std::vector<int> owners(size_t(E), 0);
    for (int r = 0; r < 4; ++r) {
      const Model& m = (*pm)->rank_model(r);
      const LayerWeights& lw = m.weights().layers[1];
      EXPECT_EQ(m.config().n_heads, H);
      EXPECT_EQ(lw.wq_b.w, fl.wq_b.w);
      EXPECT_EQ(lw.shared.w2.w, fl.shared.w2.w);
      EXPECT_EQ(m.weights().head.n_out, int(V));
      for (int e = 0; e < E; ++e) {
        const bool mine = e >= m.rank_role().expert_begin && e < m.rank_role().expert_end;
        EXPECT_EQ(lw.experts[size_t(e)].w1.empty(), !mine) << "rank " << r << " expert " << e;
        if (!mine) continue;
        ++owners[size_t(e)];
        EXPECT_EQ(lw.experts[size_t(e)].w2.w, fl.experts[size_t(e)].w2.w);
      }
    }
    for (int e = 0; e < E; ++e) EXPECT_EQ(owners[size_t(e)], 1) << "expert " << e;
  }
}

std::string plan_error(const ModelConfig& c, ParallelPlan plan) {
  const Status st = check_parallel_plan(c, plan);
  return st.ok() ? "accepted" : st.error().message;
}

#define EXPECT_REFUSED(config, plan, words) \
  EXPECT_NE(plan_error(config, plan).find(words), std::string::npos) << plan_error(config, plan)

TEST(ModelParallel, PlansTheConfigCannotSplitAreRefused) {
  auto cfg = read_model_config(fixture_dir("v4"));
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  const ModelConfig& c = cfg.value();  // 4 heads in 2 output groups, 8 experts of width 128, vocab 512, act block 128
  EXPECT_TRUE(check_parallel_plan(c, {2, 2}).ok());
  EXPECT_REFUSED(c, (ParallelPlan{0, 1}), "at least 1");
  EXPECT_REFUSED(c, (ParallelPlan{2, 4}), "each be 1 or the group size 4");
  EXPECT_REFUSED(c, (ParallelPlan{3, 1}), "tp must divide num_attention_heads = 4");
  EXPECT_REFUSED(c, (ParallelPlan{8, 1}), "tp must divide num_attention_heads = 4");
  EXPECT_REFUSED(c, (ParallelPlan{1, 3}), "ep must divide n_routed_experts = 8");
  EXPECT_REFUSED(c, (ParallelPlan{1, 16}), "ep must divide n_routed_experts = 8");
  {
    ModelConfig odd = c;  // 12 heads in 4 groups: 6 ranks would hold neither whole groups nor parts of one
    odd.n_heads = 12;
    odd.o_groups = 4;
    odd.vocab_size = 516;
    odd.d_expert = 96;
    EXPECT_REFUSED(odd, (ParallelPlan{6, 1}), "tp must divide o_groups = 4");
  }
  {
    ModelConfig odd = c;
    odd.vocab_size = 510;
    EXPECT_REFUSED(odd, (ParallelPlan{4, 1}), "tp must divide vocab_size = 510");
  }
  {
    ModelConfig odd = c;
    odd.d_expert = 130;
    EXPECT_REFUSED(odd, (ParallelPlan{4, 1}), "tp must divide the expert width moe_intermediate_size = 130");
  }
  {
    ModelConfig odd = c;  // 384 / 2 = 192 channels: one and a half activation blocks of 128
    odd.d_expert = 384;
    EXPECT_REFUSED(odd, (ParallelPlan{2, 1}), "straddle the activation quant blocks of 128");
    EXPECT_TRUE(check_parallel_plan(odd, {1, 4}).ok()) << "EP alone cuts no expert";
  }
  // ParallelModel::create runs the same checks.
  auto full = fixture("v4", Numerics::exact());
  ASSERT_TRUE(full);
  auto pm = ParallelModel::create(*full, {3, 1});
  ASSERT_FALSE(pm.ok());
  EXPECT_NE(pm.error().message.find("num_attention_heads"), std::string::npos) << pm.error().message;
}

TEST(ModelParallel, ModelWithoutWeightValuesIsRefused) {
  LoadOptions options;
  options.routed_expert_values = false;
  auto lazy_experts = fixture("v41", Numerics::exact(), options);
  ASSERT_TRUE(lazy_experts);
  auto pm = ParallelModel::create(*lazy_experts, {1, 2});
  ASSERT_FALSE(pm.ok());
  EXPECT_NE(pm.error().message.find("routed_expert_values = false"), std::string::npos) << pm.error().message;

  LoadOptions no_layers;
  no_layers.layer_weights = false;
  auto streamed = fixture("v4", Numerics::exact(), no_layers);
  ASSERT_TRUE(streamed);
  pm = ParallelModel::create(*streamed, {2, 1});
  ASSERT_FALSE(pm.ok());
  EXPECT_NE(pm.error().message.find("layer 0's weights are not loaded"), std::string::npos) << pm.error().message;
}

// Bad input is refused before any rank starts (no rank left waiting in a collective) and changes no rank's state;
// the sequence then goes on as if the bad call had not happened.
TEST(ModelParallel, BadInputLeavesEveryRankUnchanged) {
  auto full = fixture("v4", Numerics::exact());
  ASSERT_TRUE(full);
  auto pm = ParallelModel::create(*full, {2, 2});
  ASSERT_TRUE(pm.ok()) << pm.error().message;
  auto seq = (*pm)->new_sequence();
  const auto prompt = random_tokens(5, full->config().vocab_size, 5);
  ASSERT_TRUE((*pm)->forward(seq, prompt).ok());
  const std::vector<int32_t> bad = {1, int32_t(full->config().vocab_size)};
  auto r = (*pm)->forward(seq, bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("outside the vocabulary"), std::string::npos) << r.error().message;
  EXPECT_FALSE((*pm)->forward(seq, std::vector<int32_t>{}).ok());
  std::vector<ForwardOptions> mixed(2);
  mixed[1].all_logits = true;
  auto m = (*pm)->forward_every_rank(seq, prompt, mixed);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("all_logits differs"), std::string::npos) << m.error().message;
  EXPECT_FALSE((*pm)->forward_every_rank(seq, prompt, std::vector<ForwardOptions>(1)).ok());
  for (const SequenceState& s : seq.ranks) EXPECT_EQ(s.n_past, 5);
  auto foreign = (*pm)->new_sequence();
  foreign.ranks.pop_back();
  EXPECT_FALSE((*pm)->forward(foreign, prompt).ok());

  SequenceState single = full->new_sequence();
  ASSERT_TRUE(full->forward(single, prompt).ok());
  const std::vector<int32_t> next = {7};
  auto want = full->forward(single, next);
  auto got = (*pm)->forward(seq, next);
  ASSERT_TRUE(want.ok() && got.ok());
  ASSERT_EQ(got->size(), want->size());
  float diff = 0.f, scale = 0.f;
  for (size_t i = 0; i < want->size(); ++i) {
    diff = std::max(diff, std::fabs((*got)[i] - (*want)[i]));
    scale = std::max(scale, std::fabs((*want)[i]));
  }
  EXPECT_LE(diff, kExactLogitRelTol * scale);
}

}  // namespace
}  // namespace spw
