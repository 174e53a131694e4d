// The streamed calibration (quantize/calibration.h) against a plain one: the demo model fully loaded, each row run
// through forward() once, and the Hessians computed here in the most obvious way from what the forward itself
// reports (its "ffn.in" inputs and its own routing, "moe.experts" / "moe.weights"), expert by expert with simple
// loops. The streamed path loads one layer at a time, runs the rows layer-major, recomputes the routing, collects
// the experts in groups and writes the file expert by expert; none of that may change a value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "formats/safetensors.h"
#include "model/model.h"
#include "ops/ref/linalg.h"
#include "ops/ref/moe.h"
#include "quantize/calibration.h"
#include "quantize/hessian_file.h"

namespace fs = std::filesystem;

namespace spw::quant {
namespace {

const std::string kDemo = std::string(SPW_SOURCE_DIR) + "/models/demo";

std::string calibration_text() {
  const std::string path = testing::TempDir() + "/spw_calibration_rows.txt";
  std::ofstream out(path);
  for (int i = 0; i < 16; ++i)
    out << "for (int i = 0; i < n; ++i) total += values[i] * " << i << ";\nThe river rose " << i
        << " feet overnight, and the bridge held.\n";
  return path;
}

// What the plain forward reports at one layer, for every row.
struct LayerCapture {
  std::vector<std::vector<float>> x;        // [row] → [n, d]
  std::vector<std::vector<float>> experts;  // [row] → [n, top_k] ids
  std::vector<std::vector<float>> weights;  // [row] → [n, top_k]
};

// Σ ω vvᵀ over the given rows, in order: the obvious fp64 accumulation.
void add_outer(std::vector<double>& h, const float* v, double w, int n) {
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) h[size_t(a) * n + b] += w * double(v[a]) * double(v[b]);
}

// The expert's SwiGLU output for one token, as the reference forward computes it: bf16 gate and up, bf16 hidden.
std::vector<float> hidden(const Expert& e, const float* x, float limit) {
  const int f = e.w1.n_out, d = e.w1.n_in;
  std::vector<float> g(static_cast<size_t>(f)), u(static_cast<size_t>(f)), h(static_cast<size_t>(f));
  for (int o = 0; o < f; ++o) {
    float sg = 0, su = 0;
    for (int i = 0; i < d; ++i) sg += x[i] * e.w1.w[size_t(o) * d + i];
    for (int i = 0; i < d; ++i) su += x[i] * e.w3.w[size_t(o) * d + i];
    g[size_t(o)] = sg;
    u[size_t(o)] = su;
  }
  ref::round_bf16_inplace(g.data(), g.size());
  ref::round_bf16_inplace(u.data(), u.size());
  ref::swiglu(g.data(), u.data(), h.data(), size_t(f), limit, 1.0f);
  ref::round_bf16_inplace(h.data(), h.size());
  return h;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

void run_case(bool gate_up_shared, int expert_group) {
  auto rows = load_calibration_rows(kDemo, calibration_text(), 96, 48);
  ASSERT_TRUE(rows.ok()) << rows.error().message;
  ASSERT_EQ(rows->rows.size(), 2u);
  const std::vector<int> layers = {2, 6};
  HessianOptions opt;
  opt.routing_weighted = true;
  opt.gate_up_shared = gate_up_shared;
  opt.prior_tokens = 16;
  opt.prior_sample_tokens = 60;  // the first row and part of the second
  opt.layers = layers;
  opt.expert_group = expert_group;
  const std::string dir = testing::TempDir() + "/spw_calibration_" + std::to_string(gate_up_shared) + "_" +
                          std::to_string(expert_group);
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto path = [&](int l) { return dir + "/layer-" + std::to_string(l) + ".safetensors"; };
  std::vector<int> seen;
  auto st = collect_hessians(kDemo, *rows, opt, path, [&](int l) -> Status {
    EXPECT_TRUE(fs::exists(path(l))) << "on_layer before the layer's file";
    seen.push_back(l);
    return {};
  });
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(seen, layers);

  // The plain path.
  auto model = load_model(kDemo, Numerics::reference());
  ASSERT_TRUE(model.ok()) << model.error().message;
  const ModelConfig& c = (*model)->config();
  const int d = c.d_model, f = c.d_expert, E = c.n_experts, K = c.top_k;
  std::map<int, LayerCapture> cap;
  for (const auto& row : rows->rows) {
    for (int l : layers) {
      cap[l].x.emplace_back();
      cap[l].experts.emplace_back();
      cap[l].weights.emplace_back();
    }
    ForwardOptions fo;
    fo.on_intermediate = [&](const char* name, int layer, const float* data, size_t count) {
      if (!cap.count(layer)) return;
      LayerCapture& lc = cap[layer];
      std::vector<float> v(data, data + count);
      if (!std::strcmp(name, "ffn.in")) lc.x.back() = v;
      if (!std::strcmp(name, "moe.experts")) lc.experts.back() = v;
      if (!std::strcmp(name, "moe.weights")) lc.weights.back() = v;
    };
    SequenceState seq = (*model)->new_sequence();
    ASSERT_TRUE((*model)->forward(seq, row, fo).ok());
  }

  for (int l : layers) {
    const LayerCapture& lc = cap[l];
    const LayerWeights& lw = (*model)->weights().layers[size_t(l)];
    auto file = LayerHessianFile::open(path(l), d, f, E);
    ASSERT_TRUE(file.ok()) << file.error().message;
    std::vector<double> h_layer(size_t(d) * d, 0.0);
    double n_layer = 0;
    std::vector<const float*> prior;
    for (size_t r = 0; r < lc.x.size(); ++r)
      for (size_t t = 0; t < lc.x[r].size() / size_t(d); ++t) {
        add_outer(h_layer, &lc.x[r][t * d], 1.0, d);
        n_layer += 1;
        if (int(prior.size()) < opt.prior_sample_tokens) prior.push_back(&lc.x[r][t * d]);
      }
    EXPECT_EQ(file->layer_tokens(), n_layer);
    int calibrated_experts = 0;
    for (int e = 0; e < E; ++e) {
      std::vector<double> h13(size_t(d) * d, 0.0), h2(size_t(f) * f, 0.0), prior2(size_t(f) * f, 0.0);
      double n = 0;
      for (size_t r = 0; r < lc.x.size(); ++r)
        for (size_t t = 0; t < lc.x[r].size() / size_t(d); ++t)
          for (int k = 0; k < K; ++k) {
            if (int(lc.experts[r][t * K + k]) != e) continue;
            const double w = lc.weights[r][t * K + k];
            const float* x = &lc.x[r][t * d];
            add_outer(h13, x, w, d);
            const auto h = hidden(lw.experts[size_t(e)], x, c.swiglu_limit);
            add_outer(h2, h.data(), w, f);
            n += w;
          }
      for (const float* x : prior) {
        const auto h = hidden(lw.experts[size_t(e)], x, c.swiglu_limit);
        add_outer(prior2, h.data(), 1.0, f);
      }
      calibrated_experts += n > 0;
      const double n0 = opt.prior_tokens, np = double(prior.size());
      for (size_t i = 0; i < h13.size(); ++i)
        h13[i] = gate_up_shared ? h_layer[i] / n_layer : (h13[i] + n0 * h_layer[i] / n_layer) / (n + n0);
      for (size_t i = 0; i < h2.size(); ++i) h2[i] = (h2[i] + n0 * prior2[i] / np) / (n + n0);

      // The same products summed in the same order, so equal but for the last bits of the blend's divisions;
      // 1e-12 of the largest entry. A routing or gathering bug moves entries by O(1) of that scale.
      EXPECT_NEAR(file->tokens(e), n, 1e-9 * std::max(1.0, n)) << "layer " << l << " expert " << e;
      const std::vector<double> got13 = file->padded(e, false, d), got2 = file->padded(e, true, f);
      const double tol13 = 1e-12 * max_abs(h13), tol2 = 1e-12 * max_abs(h2);
      double worst13 = 0, worst2 = 0;
      for (size_t i = 0; i < h13.size(); ++i) worst13 = std::max(worst13, std::fabs(got13[i] - h13[i]));
      for (size_t i = 0; i < h2.size(); ++i) worst2 = std::max(worst2, std::fabs(got2[i] - h2[i]));
      EXPECT_LE(worst13, tol13) << "layer " << l << " expert " << e << " w13";
      EXPECT_LE(worst2, tol2) << "layer " << l << " expert " << e << " w2";
    }
    EXPECT_GT(calibrated_experts, E / 2) << "layer " << l << ": the rows should reach most experts";
  }
}

TEST(Calibration, StreamedHessiansEqualPlainForwardPerExpert) { run_case(false, 5); }

TEST(Calibration, StreamedHessiansEqualPlainForwardSharedGateUp) { run_case(true, 0); }

// What the plan counts: the model-wide fp32 embedding and head, final norm and Engram token map (from the checkpoint's
// inventory, not the MTP or Engram tables); one layer without its routed experts — more than its shared expert, less
// than its routed experts as fp32; one routed expert per thread; and how those scale.
TEST(Calibration, MemoryPlanCountsWhatTheStreamedForwardHolds) {
  auto config = read_model_config(kDemo);
  ASSERT_TRUE(config.ok());
  auto ck = Checkpoint::open(kDemo);
  ASSERT_TRUE(ck.ok());
  const CalibrationMemory m = calibration_memory(*config, *ck, 1024, 512, false, 3);
  const uint64_t vocab = uint64_t(config->vocab_size), d = uint64_t(config->d_model), f = uint64_t(config->d_expert);
  EXPECT_EQ(m.model_wide, 4 * (2 * vocab * d + d + vocab));
  EXPECT_GT(m.largest_layer, 4 * 3 * d * f);                                     // the shared expert and more
  EXPECT_LT(m.largest_layer, 4 * uint64_t(config->n_experts) * 3 * d * f);       // not the routed experts
  // One whole fp32 expert (w1, w2, w3) per thread; the inputs grow with the calibration tokens; sharing gate/up drops
  // exactly one d×d fp64 accumulator per expert.
  EXPECT_EQ(calibration_memory(*config, *ck, 1024, 512, false, 6).expert_values, 2 * m.expert_values);
  EXPECT_EQ(m.expert_values, 3 * uint64_t(sizeof(float)) * 3 * d * f);
  EXPECT_EQ(calibration_memory(*config, *ck, 2048, 512, false, 3).layer_inputs, 2 * m.layer_inputs);
  EXPECT_EQ(m.per_expert - calibration_memory(*config, *ck, 1024, 512, true, 3).per_expert, uint64_t(sizeof(double)) * d * d);
}

// The Hessian file round-trips expert by expert (shared gate/up written once), a file for another model's shapes is
// refused with what to do, and the streamed writer refuses tensors out of order and leaves nothing behind unfinished.
TEST(HessianFile, RoundTripAndClearErrors) {
  const std::string dir = testing::TempDir() + "/spw_hessian_file";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const int d = 4, f = 2;
  const std::vector<double> tokens = {3, 0, 7};
  auto matrix = [](int n, double base) {
    std::vector<double> m(size_t(n) * n);
    for (size_t i = 0; i < m.size(); ++i) m[i] = base + double(i);
    return m;
  };
  for (bool shared : {false, true}) {
    const std::string path = dir + (shared ? "/shared.safetensors" : "/per_expert.safetensors");
    auto w = LayerHessianWriter::create(path, d, f, tokens, 10.0, shared);
    ASSERT_TRUE(w.ok()) << w.error().message;
    for (int e = 0; e < 3; ++e) ASSERT_TRUE((*w)->add_expert(e, matrix(d, 100.0 * e), matrix(f, -10.0 * e)).ok());
    ASSERT_TRUE((*w)->finish(matrix(d, 7.0)).ok());
    auto h = LayerHessianFile::open(path, d, f, 3);
    ASSERT_TRUE(h.ok()) << h.error().message;
    EXPECT_EQ(h->layer_tokens(), 10.0);
    EXPECT_EQ(h->tokens(2), 7.0);
    for (int e = 0; e < 3; ++e) {
      const std::vector<double> g13 = h->padded(e, false, 6), g2 = h->padded(e, true, 2);
      const std::vector<double> want13 = shared ? matrix(d, 7.0) : matrix(d, 100.0 * e);
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < 6; ++j) EXPECT_EQ(g13[size_t(i) * 6 + j], j < d ? want13[size_t(i) * d + j] : 0.0);
      for (int j = d * 6; j < 36; ++j) EXPECT_EQ(g13[size_t(j)], 0.0) << "padding rows";
      EXPECT_EQ(g2, matrix(f, -10.0 * e));
    }
    auto wrong = LayerHessianFile::open(path, d + 1, f, 3);
    ASSERT_FALSE(wrong.ok());
    EXPECT_NE(wrong.error().message.find("recalibrate"), std::string::npos) << wrong.error().message;
  }
  {
    const std::string path = dir + "/unfinished.safetensors";
    auto w = LayerHessianWriter::create(path, d, f, tokens, 10.0, false);
    ASSERT_TRUE(w.ok());
    EXPECT_FALSE((*w)->add_expert(1, matrix(d, 0), matrix(f, 0)).ok()) << "expert 1 before expert 0";
  }
  EXPECT_FALSE(fs::exists(dir + "/unfinished.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/unfinished.safetensors.tmp")) << "an unfinished writer removes its temporary file";
}

}  // namespace
}  // namespace spw::quant
