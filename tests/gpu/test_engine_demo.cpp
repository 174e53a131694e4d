// GpuModel (engine/gpu_model.h) on the trained demo model (models/demo, V4.1 architecture, MXFP4
// experts) and on an EXL3 pack of it made by `spillway quantize` (quantize/quantize_model.h, CUDA
// quantizer), against the CPU reference Model on the same checkpoint with the same numerics.
// Bounds in the reference numerics (bf16 activations, FP8 fake quant): the GPU may differ from the CPU no
// more than the CPU differs from itself when ±1 bf16 ulp is added to 0.01 % of its stream values before
// every layer (reference_noise.h), measured in the same test on the same prompt and tokens: worst of three
// seeds, plus a margin for the noise of that estimate (one top-1 disagreement, 25 % on max and mean
// |Δlogit|). Why not a fixed bound: a one-ulp change flips a bf16 rounding or an FP8 quant step now and
// then, and the flip grows through the layers: on this model the CPU against itself so lands at 94–96/98
// top-1, max |Δlogit| 0.69–0.76, mean 0.030–0.034 (measured here, 2026-12-04); the GPU, which adds in
// another order everywhere, at 95–97/98, max 0.67, mean 0.024–0.028 (H200). The earlier fixed bounds
// (100 %, 0.25) sat below that floor and failed for every implementation. A real departure (a wrong
// row, rounding point or quant rule) moves the mean |Δlogit| by far more. Exact numerics (f32 throughout)
// leave nothing to flip: there, 100 % top-1 and max |Δlogit| ≤ 1e-3.
// EXL3 experts: the GPU rounds the rotated activation to fp16 once per linear (the CPU keeps f32); the
// noise floor is the pack's own, measured the same way.
#if defined(SPW_HAVE_CUDA)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/gpu_model.h"
#include "model/model.h"
#include "quantize/quantize_model.h"
#include "tokenizer/tokenizer.h"
#include "gpu_test_util.h"
#include "reference_noise.h"

namespace spw {
namespace {


namespace fs = std::filesystem;

const std::string kDemo = std::string(SPW_SOURCE_DIR) + "/models/demo";

std::vector<int32_t> prompt_ids() {
  auto tok = Tokenizer::load(kDemo + "/tokenizer.json");
  EXPECT_TRUE(tok.ok()) << tok.error().message;
  if (!tok.ok()) return {};
  return (*tok)->encode(
      "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n"
      "        a, b = b, a + b\n    return a\n\nThe quick brown fox jumps over the lazy dog. In 1905, Einstein "
      "published four papers that changed physics.\n");
}

struct Compared {
  int n_rows = 0, top1_equal = 0;
  double max_abs = 0, mean_abs = 0;
};

// The GPU's gap against the CPU's own noise floor on the same model, prompt and tokens (see the top).
void expect_within_noise_floor(const std::string& dir, const std::vector<int32_t>& prompt, const Compared& gpu) {
  auto cpu = load_model(dir, Numerics::reference());
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  const gpu_test::FreeRun base = gpu_test::free_run(**cpu, prompt, {}, 0.0, 0);
  const gpu_test::LogitGap floor = gpu_test::noise_floor(**cpu, prompt, base, 1e-4, {1u, 2u, 3u});
  std::printf("  %s: CPU noise floor (±1 bf16 ulp on 0.01%% of the streams, worst of 3): top-1 %d/%d, max |Δlogit| "
              "%.4f, mean %.5f\n", dir.c_str(), floor.top1_equal, floor.n_rows, floor.max_abs, floor.mean_abs);
  ASSERT_EQ(floor.n_rows, gpu.n_rows);
  EXPECT_GE(gpu.top1_equal, floor.top1_equal - 1);
  EXPECT_LE(gpu.max_abs, 1.25 * floor.max_abs);
  EXPECT_LE(gpu.mean_abs, 1.25 * floor.mean_abs);
  // The floor itself is not wild: most top-1s survive the noise (a broken reference would not).
  EXPECT_GE(floor.top1_equal, floor.n_rows * 9 / 10);
}

// Prefill of the whole prompt on both engines, all logits, then 8 greedy decode steps (the CPU's
// choice fed to both).
Compared compare(const std::string& dir, const std::vector<int32_t>& prompt, Numerics num = Numerics::reference()) {
  Compared r;
  auto cpu = load_model(dir, num);
  EXPECT_TRUE(cpu.ok()) << cpu.error().message;
  engine::GpuModelOptions opts;
  opts.budget.max_context = 1024;
  auto gpu = engine::load_gpu_model(dir, num, opts);
  EXPECT_TRUE(gpu.ok()) << gpu.error().message;
  if (!cpu.ok() || !gpu.ok()) return r;
  SequenceState cs = (*cpu)->new_sequence();
  auto gs = (*gpu)->new_sequence();
  EXPECT_TRUE(gs.ok()) << gs.error().message;
  if (!gs.ok()) return r;
  ForwardOptions all;
  all.all_logits = true;
  const int vocab = (*cpu)->config().vocab_size;
  std::vector<int32_t> step(prompt);
  for (int it = 0; it < 9; ++it) {
    auto a = (*cpu)->forward(cs, step, all);
    auto b = (*gpu)->forward(*gs, step, all);
    EXPECT_TRUE(a.ok() && b.ok());
    if (!a.ok() || !b.ok()) return r;
    EXPECT_EQ(a->size(), b->size());
    for (size_t row = 0; row * vocab < a->size(); ++row) {
      const float* x = a->data() + row * vocab;
      const float* y = b->data() + row * vocab;
      const int ax = int(std::max_element(x, x + vocab) - x), ay = int(std::max_element(y, y + vocab) - y);
      r.top1_equal += ax == ay;
      ++r.n_rows;
      for (int v = 0; v < vocab; ++v) {
        EXPECT_TRUE(std::isfinite(y[v])) << "row " << row << " id " << v;
        const double d = std::fabs(double(x[v]) - y[v]);
        r.max_abs = std::max(r.max_abs, d);
        r.mean_abs += d;
      }
      if (row * vocab + vocab == a->size()) step = {ax};  // next decode token: the CPU's greedy pick
    }
  }
  r.mean_abs /= double(r.n_rows) * vocab;
  std::printf("  %s: top-1 %d/%d, max |Δlogit| %.4f, mean %.5f\n", dir.c_str(), r.top1_equal, r.n_rows, r.max_abs,
              r.mean_abs);
  return r;
}

TEST(EngineDemo, TrainedModelMatchesCpu) {
  SPW_REQUIRE_GPU();
  const std::vector<int32_t> prompt = prompt_ids();
  ASSERT_GT(prompt.size(), 40u);
  const Compared r = compare(kDemo, prompt);
  expect_within_noise_floor(kDemo, prompt, r);
}

// Exact numerics on both engines (no bf16 rounding, no fake quant: f32 KV rows and products): nothing
// is left to flip but f32 summation order, so every top-1 must agree and the logits must match to
// 1e-3 (the golden suite's exact tolerance; the CPU and Transformers agree to ~1e-4 there).
TEST(EngineDemo, TrainedModelMatchesCpuExact) {
  SPW_REQUIRE_GPU();
  const std::vector<int32_t> prompt = prompt_ids();
  ASSERT_GT(prompt.size(), 40u);
  const Compared r = compare(kDemo, prompt, Numerics::exact());
  EXPECT_EQ(r.top1_equal, r.n_rows);
  EXPECT_LE(r.max_abs, 1e-3);
}

TEST(EngineDemo, Exl3PackMatchesCpuAndIsSmaller) {
  SPW_REQUIRE_GPU();
  const std::string out = testing::TempDir() + "/spw_engine_exl3_pack";
  fs::remove_all(out);
  const std::string calib = testing::TempDir() + "/spw_engine_exl3_calib.txt";
  {
    std::ofstream f(calib);
    for (int i = 0; i < 16; ++i) f << "def f" << i << "(x):\n    return x * " << i << " + 1\n\nprint(f" << i << "(3))\n";
  }
  quant::QuantizeModelOptions o;
  o.model_dir = kDemo;
  o.out_dir = out;
  o.bits = 3;
  o.calibration = calib;
  o.calibration_tokens = 256;
  o.row_tokens = 128;  // calibration rows: tokens ≥ row length ≥ 2
  o.layers = {2, 9};  // every expert of two layers: a compressed-KV layer and the last one
  o.device = "cuda";
  o.progress = false;
  auto q = quant::quantize_model(o);
  ASSERT_TRUE(q.ok()) << q.error().message;
  ASSERT_TRUE(q->complete);

  const Compared r = compare(out, prompt_ids());
  expect_within_noise_floor(out, prompt_ids(), r);

  // The experts went up as EXL3 trellis (3 bits), not as f32 copies: the pack's device weights are
  // smaller than the MXFP4 original's (4.25 bits).
  engine::GpuModelOptions opts;
  auto a = engine::load_gpu_model(kDemo, Numerics::reference(), opts);
  auto b = engine::load_gpu_model(out, Numerics::reference(), opts);
  ASSERT_TRUE(a.ok() && b.ok());
  std::printf("  device weight bytes: demo %zu, EXL3 pack %zu\n", (*a)->weight_nbytes(), (*b)->weight_nbytes());
  EXPECT_LT((*b)->weight_nbytes(), (*a)->weight_nbytes());
}

}  // namespace
}  // namespace spw
#endif
