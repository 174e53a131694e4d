// Issue 7 acceptance: "a full-width single-layer test at real V4.1 dimensions (d=5120, 384 experts of
// 2304, 64 heads of 512) matches the CPU reference". The GPU forward (engine/gpu_model.h) against the
// CPU reference Model (model/model.h), both Numerics::reference(), on a synthetic checkpoint written by
// tools/synth/make_synthetic_model.py (real config, layout and formats; random weights).
//
// The model directory comes from the environment variable SPW_FULLWIDTH_MODEL; the test FAILS when it
// is unset (it is part of the acceptance, not optional). Device commands (scripts/gpu_test.sh stages the
// binary; the script needs only numpy):
//   python3 tools/synth/make_synthetic_model.py /tmp/fw14 --arch v41 --real-layers 14 --tokenizer none
//   SPW_FULLWIDTH_MODEL=/tmp/fw14 spw_gpu_tests --gtest_filter='EngineFullWidth.*'
// Real layer 14 is the most V4.1-specific single layer: window + its own gated ratio-2 compressor
// (KV source), its own indexer (index source, fp4 keys), Engram, 384 score-routed MXFP4 experts + the
// shared expert, mHC with hc 4. Real layer 20 (ratio 1, candidate source) is the other kind worth a run.
// Any number of layers works: every GPU layer is fed the CPU's input streams (teacher forced), so a
// difference cannot compound across layers.
//
// Memory: both engines dequantize every weight to f32 on the host at load (model/weights.h): one
// layer's 384 experts are 384·3·2304·5120·4 B = 54 GB. The CPU runs first, its results are kept
// (logits and streams, a few MB), and it is freed before the GPU model loads (which keeps its own
// host copy), so the peak is one copy (~62 GB with embedding and head), inside the 128 GiB machine.
// Time: loading is single-threaded dequantization (~1–2 min per engine per layer); the CPU forward of
// 16 tokens touches ≤ 96 experts and runs the 129,280×5,120 head on 16 rows (seconds to a minute).
//
// What runs: a 16-token prefill (all logits) and 4 decode steps fed the CPU's greedy picks; 16 tokens
// at ratio 2 give 8 compressed entries, so every entry is selected (index_topk 512): what is tested is
// the entries' values (compressor, fp4 keys and fp4/e4m3 entries), not top-k near-ties.
// Tolerances and why:
//  - per call and layer, ≥ 99 % of the output stream values within 2 bf16 ulps of the CPU's: the GPU
//    rounds at the same points but sums f32 products in other orders, which flips a bf16 (or e4m3 /
//    e2m1 fake-quant) rounding now and then; on V4 every teacher-forced layer measured ≥ 99.99 %.
//    A wrong op (a missing rounding, a wrong block, a wrong row) moves far more than 1 % of values;
//  - per logit row, max |Δlogit| ≤ 1e-2 · RMS of the CPU row: a 1-ulp flip in 1 % of the 5,120 head
//    inputs moves a logit by ~4e-4 RMS (√51 flips · 2⁻⁸ relative against √5120 terms), 25× margin;
//  - top-1 equal on every row whose CPU top-2 gap exceeds that bound (a closer pair is a near-tie).
// Noise floor: both bounds are widened to the CPU's own spread where that is wider. kNoiseRuns more CPU runs
// feed each layer the first run's inputs with every value moved by one f32 ulp (what a different f32
// summation order does to the first op); the GPU's share may fall at most kNoiseSlack below the worst
// of those runs' shares, and its |Δlogit| may reach kNoiseLogitFactor × their worst. Why: at full width a
// last-bit difference that flips one bf16 rounding before an e4m3 (6 % steps) or e2m1 (25–50 % steps)
// fake quant flips that code too, and the flips compound through the layer: the first H200 runs
// (2026-12-03) had 47.8 % of prefill values and ~20 % of decode values within 2 ulps in reference
// numerics, 80 % with the fake quants off, while the exact-numerics test held to 3e-6. The noise runs are
// printed beside the GPU's share, so a departure beyond the CPU's own spread still fails.
// Failures print the call, layer, share, worst element (row, copy, channel) and both values, and the
// token rows below 99 %.
// SingleLayerMatchesCpuExact runs the same in exact numerics (f32 throughout) with EngineGoldenExact's bounds:
// the structural check, with no noise allowance.
#if defined(SPW_HAVE_CUDA)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/gpu_model.h"
#include "gpu_test_util.h"
#include "model/model.h"

namespace spw {
namespace {

using gpu_test::have_gpu;

constexpr int kPromptTokens = 16;
constexpr int kDecodeSteps = 4;
constexpr double kMinWithin2Ulps = 0.99;
constexpr double kLogitTolRms = 1e-2;
// The CPU's own spread (see "Noise floor" at the top): kNoiseRuns perturbed CPU runs; the GPU's share may fall
// at most kNoiseSlack below the worst of them, and its |Δlogit| may reach kNoiseLogitFactor × their worst.
constexpr int kNoiseRuns = 4;
constexpr double kNoiseSlack = 0.02;
constexpr double kNoiseLogitFactor = 2.0;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What one engine produced: per call the logits [n, vocab] and per layer the output streams.
struct Recorded {
  std::vector<std::vector<float>> logits;               // [call]
  std::vector<std::vector<std::vector<float>>> in, out;  // [call][layer] streams [n, hc, d]
};

// Deterministic ids spread over the vocabulary, past the special tokens.
std::vector<int32_t> prompt_ids(int64_t vocab) {
  std::vector<int32_t> ids(kPromptTokens);
  for (int i = 0; i < kPromptTokens; ++i) ids[i] = int32_t(11 + (int64_t(i) * 7919 + 104729) % (vocab - 11));
  return ids;
}

int argmax(const float* x, int64_t n) { return int(std::max_element(x, x + n) - x); }

using Dumps = std::vector<std::map<std::string, std::vector<float>>>;  // [call] name@layer → values

std::string dump_key(const char* name, int layer) { return std::string(name) + "@" + std::to_string(layer); }

// Every value moved by one f32 ulp, up or down at random (zeros and non-finite values kept).
void perturb_f32_ulp(std::vector<float>& x, std::mt19937& rng) {
  for (float& v : x) {
    if (v == 0.f || !std::isfinite(v)) continue;
    const uint32_t bits = std::bit_cast<uint32_t>(v);
    v = std::bit_cast<float>(rng() & 1u ? bits + 1u : bits - 1u);  // one ulp up or down in magnitude
  }
}

// CPU: prefill then greedy decode; `calls` receives the token list of every call. Then, on the same loaded
// model, `noise->size()` more runs of those calls, each layer fed the first run's input streams with every
// value moved by one f32 ulp (seeds 1, 2, ...): the CPU's own spread under last-bit noise.
void run_cpu(const std::string& dir, const Numerics& num, Recorded& rec, std::vector<std::vector<int32_t>>& calls,
             std::vector<Recorded>* noise = nullptr, Dumps* dumps = nullptr) {
  auto t0 = std::chrono::steady_clock::now();
  auto cpu = load_model(dir, num);
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  const ModelConfig& c = (*cpu)->config();
  std::printf("  [fullwidth] CPU load %.1f s: d %d, %d layers, %d experts of %d, %d heads of %d, vocab %lld\n",
              seconds_since(t0), c.d_model, c.n_layers, c.n_experts, c.d_expert, c.n_heads, c.d_head,
              (long long)c.vocab_size);
  SequenceState s = (*cpu)->new_sequence();
  calls = {prompt_ids(c.vocab_size)};
  for (int call = 0; call <= kDecodeSteps; ++call) {
    rec.in.emplace_back(c.n_layers);
    rec.out.emplace_back(c.n_layers);
    ForwardOptions o;
    o.all_logits = true;
    o.before_layer = [&](int l, std::vector<float>& x) { rec.in.back()[l] = x; };
    o.on_layer = [&](int l, const std::vector<float>& x) { rec.out.back()[l] = x; };
    if (dumps) {
      dumps->emplace_back();
      o.on_intermediate = [dumps](const char* name, int layer, const float* data, size_t count) {
        dumps->back()[dump_key(name, layer)] = std::vector<float>(data, data + count);
      };
    }
    t0 = std::chrono::steady_clock::now();
    auto r = (*cpu)->forward(s, calls[call], o);
    ASSERT_TRUE(r.ok()) << r.error().message;
    std::printf("  [fullwidth] CPU call %d (%zu tokens) %.1f s\n", call, calls[call].size(), seconds_since(t0));
    rec.logits.push_back(std::move(r.value()));
    if (call < kDecodeSteps)
      calls.push_back({argmax(rec.logits.back().data() + rec.logits.back().size() - c.vocab_size, c.vocab_size)});
  }
  if (!noise) return;
  for (size_t run = 0; run < noise->size(); ++run) {
    std::mt19937 rng(uint32_t(run + 1));
    Recorded& nr = (*noise)[run];
    SequenceState ns = (*cpu)->new_sequence();
    for (size_t call = 0; call < calls.size(); ++call) {
      nr.out.emplace_back(c.n_layers);
      ForwardOptions o;
      o.all_logits = true;
      o.before_layer = [&](int l, std::vector<float>& x) {
        x = rec.in[call][l];
        perturb_f32_ulp(x, rng);
      };
      o.on_layer = [&](int l, const std::vector<float>& x) { nr.out.back()[l] = x; };
      auto r = (*cpu)->forward(ns, calls[call], o);
      ASSERT_TRUE(r.ok()) << r.error().message;
      nr.logits.push_back(std::move(r.value()));
    }
  }
}

// GPU: the same calls, every layer fed the CPU's input streams.
void run_gpu(const std::string& dir, const Numerics& num, engine::GpuModelOptions opts, const Recorded& cpu,
             const std::vector<std::vector<int32_t>>& calls, Recorded& rec) {
  auto t0 = std::chrono::steady_clock::now();
  opts.budget.max_context = 1024;
  opts.budget.max_seqs = 1;
  auto gpu = engine::load_gpu_model(dir, num, opts);
  ASSERT_TRUE(gpu.ok()) << gpu.error().message;
  std::printf("  [fullwidth] GPU load %.1f s, device weights %.2f GiB\n", seconds_since(t0),
              double((*gpu)->weight_nbytes()) / double(1u << 30));
  auto seq = (*gpu)->new_sequence();
  ASSERT_TRUE(seq.ok()) << seq.error().message;
  const int n_layers = (*gpu)->config().n_layers;
  for (size_t call = 0; call < calls.size(); ++call) {
    rec.out.emplace_back(n_layers);
    ForwardOptions o;
    o.all_logits = true;
    o.before_layer = [&](int l, std::vector<float>& x) {
      if (x.size() == cpu.in[call][l].size()) x = cpu.in[call][l];  // else reported as a size mismatch
    };
    o.on_layer = [&](int l, const std::vector<float>& x) { rec.out.back()[l] = x; };
    t0 = std::chrono::steady_clock::now();
    auto r = (*gpu)->forward(*seq, calls[call], o);
    ASSERT_TRUE(r.ok()) << "GPU call " << call << ": " << r.error().message;
    std::printf("  [fullwidth] GPU call %zu %.2f s\n", call, seconds_since(t0));
    rec.logits.push_back(std::move(r.value()));
  }
}

// Loads SPW_FULLWIDTH_MODEL, checks its dimensions and runs both engines in `num`.
void run_both(const Numerics& num, const engine::GpuModelOptions& gpu_opts, ModelConfig& c, Recorded& want,
              Recorded& got, std::vector<std::vector<int32_t>>& calls, std::vector<Recorded>* noise = nullptr) {
  ASSERT_TRUE(have_gpu()) << "no CUDA device: run this binary on the GPU machine (scripts/gpu_test.sh)";
  const char* env = std::getenv("SPW_FULLWIDTH_MODEL");
  ASSERT_TRUE(env && *env) << "SPW_FULLWIDTH_MODEL is not set: generate a model with "
                              "`python3 tools/synth/make_synthetic_model.py /tmp/fw14 --arch v41 --real-layers 14 "
                              "--tokenizer none` and run with SPW_FULLWIDTH_MODEL=/tmp/fw14";
  const std::string dir = env;
  auto config = read_model_config(dir);
  ASSERT_TRUE(config.ok()) << config.error().message;
  c = *config;
  ASSERT_TRUE(c.is_v41()) << dir << ": not a V4.1 config";
  // The issue's dimensions: a width-divided synthetic model would not be this test.
  EXPECT_EQ(c.d_model, 5120);
  EXPECT_EQ(c.n_experts, 384);
  EXPECT_EQ(c.d_expert, 2304);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.d_head, 512);

  run_cpu(dir, num, want, calls, noise);  // the CPU model is freed on return
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  run_gpu(dir, num, gpu_opts, want, calls, got);
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  ASSERT_EQ(got.logits.size(), want.logits.size());
}

bool within_2_ulps(float got, float want) { return std::fabs(got - want) <= 2.0f * std::ldexp(std::fabs(want), -8) + 1e-30f; }

// Share of values [i0, i1) within 2 bf16 ulps.
double share_within(const std::vector<float>& g, const std::vector<float>& w, size_t i0, size_t i1) {
  size_t ok = 0;
  for (size_t i = i0; i < i1; ++i) ok += within_2_ulps(g[i], w[i]);
  return i1 > i0 ? double(ok) / double(i1 - i0) : 1.0;
}

// Max |Δlogit| of one row.
double max_logit_diff(const float* g, const float* w, int64_t vocab, int64_t* at = nullptr) {
  double max_d = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    const double a = std::fabs(double(g[v]) - w[v]);
    if (!(a <= max_d)) {
      max_d = std::isfinite(a) ? a : INFINITY;
      if (at) *at = v;
    }
  }
  return max_d;
}

// The bounds of the top of the file, for numerics with bf16 roundings, widened to the CPU's own spread
// (`noise`: CPU runs with last-bit-perturbed inputs) where that spread is wider.
void expect_within_bf16_bounds(const ModelConfig& c, const Recorded& want, const Recorded& got,
                               const std::vector<std::vector<int32_t>>& calls, const std::vector<Recorded>& noise) {
  const int hc = c.hc_mult, d = c.d_model;
  const int64_t vocab = c.vocab_size;
  for (size_t call = 0; call < calls.size(); ++call) {
    for (int l = 0; l < c.n_layers; ++l) {
      const std::vector<float>& g = got.out[call][l];
      const std::vector<float>& w = want.out[call][l];
      ASSERT_EQ(g.size(), w.size()) << "call " << call << " layer " << l << ": streams of the wrong size";
      size_t worst = 0, non_finite = 0;
      float worst_abs = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        const float a = std::fabs(g[i] - w[i]);
        non_finite += !std::isfinite(g[i]);
        if (!(a <= worst_abs)) worst_abs = std::isfinite(a) ? a : INFINITY, worst = i;
      }
      const double share = share_within(g, w, 0, w.size());
      double noise_min = 1.0;
      std::string noise_shares;
      for (const Recorded& n : noise) {
        const double ns = share_within(n.out[call][l], w, 0, w.size());
        noise_min = std::min(noise_min, ns);
        noise_shares += " " + std::to_string(100.0 * ns).substr(0, 5) + "%";
      }
      const double bound = std::min(kMinWithin2Ulps, noise_min - kNoiseSlack);
      std::string rows;  // token rows below the bound: where a departure starts
      const size_t row_len = size_t(hc) * d;
      for (size_t r = 0; r * row_len < w.size(); ++r) {
        const double rs = share_within(g, w, r * row_len, (r + 1) * row_len);
        if (rs < kMinWithin2Ulps) rows += " " + std::to_string(r) + ":" + std::to_string(int(100.0 * rs)) + "%";
      }
      if (!rows.empty()) std::printf("  [fullwidth] call %zu layer %d rows below 99%%:%s\n", call, l, rows.c_str());
      const size_t row = worst / (size_t(hc) * d), copy = worst / d % hc, ch = worst % d;
      std::printf("  [fullwidth] call %zu layer %d: %.3f%% within 2 bf16 ulps (CPU noise runs:%s; bound %.2f%%), "
                  "max |d| %.3e at (row %zu, copy %zu, ch %zu): GPU %+.6e CPU %+.6e\n",
                  call, l, 100.0 * share, noise_shares.c_str(), 100.0 * bound, worst_abs, row, copy, ch, g[worst],
                  w[worst]);
      EXPECT_EQ(non_finite, 0u) << "call " << call << " layer " << l;
      EXPECT_GE(share, bound) << "call " << call << " layer " << l << ": worst at row " << row << " copy " << copy
                              << " ch " << ch << ": GPU " << g[worst] << " CPU " << w[worst];
    }
    const std::vector<float>& g = got.logits[call];
    const std::vector<float>& w = want.logits[call];
    ASSERT_EQ(g.size(), w.size()) << "call " << call << ": logits of the wrong size";
    for (size_t row = 0; row * vocab < w.size(); ++row) {
      const float* gr = g.data() + row * vocab;
      const float* wr = w.data() + row * vocab;
      double ss = 0;
      for (int64_t v = 0; v < vocab; ++v) ss += double(wr[v]) * wr[v];
      int64_t max_v = 0;
      const double max_d = max_logit_diff(gr, wr, vocab, &max_v);
      double noise_d = 0;
      for (const Recorded& n : noise) noise_d = std::max(noise_d, max_logit_diff(n.logits[call].data() + row * vocab, wr, vocab));
      const double tol = std::max(kLogitTolRms * std::sqrt(ss / double(vocab)), kNoiseLogitFactor * noise_d);
      const int top_w = argmax(wr, vocab), top_g = argmax(gr, vocab);
      float second = -INFINITY;
      for (int64_t v = 0; v < vocab; ++v)
        if (v != top_w) second = std::max(second, wr[v]);
      const double gap = double(wr[top_w]) - second;
      std::printf("  [fullwidth] call %zu row %zu: max |dlogit| %.3e at id %lld (CPU noise runs %.3e; tol %.3e), top-1 "
                  "GPU %d CPU %d (CPU top-2 gap %.3e)\n",
                  call, row, max_d, (long long)max_v, noise_d, tol, top_g, top_w, gap);
      EXPECT_LE(max_d, tol) << "call " << call << " row " << row << " id " << max_v << ": GPU " << gr[max_v]
                            << " CPU " << wr[max_v];
      if (gap > tol) {
        EXPECT_EQ(top_g, top_w) << "call " << call << " row " << row << " (CPU top-2 gap " << gap << ")";
      }
    }
  }
}

// Both engines in `num` (the GPU with `opts`), held to the bf16 bounds widened to the CPU's own spread.
void matches_within_bf16_bounds(const Numerics& num, const engine::GpuModelOptions& opts) {
  ModelConfig c;
  Recorded want, got;
  std::vector<std::vector<int32_t>> calls;
  std::vector<Recorded> noise(kNoiseRuns);
  run_both(num, opts, c, want, got, calls, &noise);
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  expect_within_bf16_bounds(c, want, got, calls, noise);
}

TEST(EngineFullWidth, SingleLayerMatchesCpu) { matches_within_bf16_bounds(Numerics::reference(), {}); }

// Bisection of a reference-numerics departure that the exact mode does not show (first H200 runs: see the
// top of the file). Each variant keeps the bounds and changes one thing:
//  - HostDispatch: the GPU's routed experts per expert through linear() (the dense library's activation
//    prep and GEMV), not the grouped expert GEMV with cuda::fake_quant_fp8 of the device dispatch;
//  - NoFakeQuant: bf16 roundings kept, every fake quant off (KV rows, activations), on both engines;
//  - FakeQuantOnly: the converse, every fake quant kept and activations in f32 (no bf16 rounding).
TEST(EngineFullWidth, SingleLayerMatchesCpuHostDispatch) {
  engine::GpuModelOptions opts;
  opts.moe_dispatch = engine::MoeDispatch::kHost;
  matches_within_bf16_bounds(Numerics::reference(), opts);
}

TEST(EngineFullWidth, SingleLayerMatchesCpuNoFakeQuant) {
  Numerics num = Numerics::reference();
  num.fake_quant = false;
  matches_within_bf16_bounds(num, {});
}

TEST(EngineFullWidth, SingleLayerMatchesCpuFakeQuantOnly) {
  Numerics num = Numerics::reference();
  num.bf16_activations = false;
  matches_within_bf16_bounds(num, {});
}

// Step by step: every intermediate the engines report (ForwardOptions::on_intermediate; names in model/model.h)
// compared with the CPU's, the GPU fed the CPU's value of each float intermediate before its next step
// (ForwardOptions::replace_intermediate) and the CPU's layer input: each step then starts from the same
// values, and a difference cannot compound through the fake quants. Why this test exists: the layer-level
// comparison above is dominated by that compounding. With f32 activations and the fake quants on (H200,
// 2026-12-03, no forcing), every intermediate before a quantize-then-project step matched to ≤ 1.4e-6 of its
// row's largest value, the selected entries and routed experts were the same sets, and yet rows departed by
// 1e-2 right after one: a ~1e-6 summation-order difference flips an e4m3 code (6 % steps) here and there
// (at full width ~8,000 quantized values a row), the flips move the product by ~1e-3 of its row, and the
// next quantize-then-project step flips many more. Bounds, per row: the selected entries and routed experts
// are the same sets; ≥ kStepShare of a float intermediate's values within max(1e-3 of the row's largest
// |CPU value|, 2 bf16 ulps of the value) (a step's own summation order can still flip a code now and then).
// Every intermediate's worst row is printed.
constexpr double kStepShare = 0.95;

// Per row: the non-negative ids of an [n, width] id table, sorted.
std::vector<std::vector<int>> id_sets(const std::vector<float>& v, size_t n) {
  std::vector<std::vector<int>> sets(n);
  const size_t width = n ? v.size() / n : 0;
  for (size_t r = 0; r < n; ++r) {
    for (size_t k = 0; k < width; ++k)
      if (v[r * width + k] >= 0) sets[r].push_back(int(v[r * width + k]));
    std::sort(sets[r].begin(), sets[r].end());
  }
  return sets;
}

void intermediates_match_cpu(const Numerics& num) {
  ASSERT_TRUE(have_gpu()) << "no CUDA device: run this binary on the GPU machine (scripts/gpu_test.sh)";
  const char* env = std::getenv("SPW_FULLWIDTH_MODEL");
  ASSERT_TRUE(env && *env) << "SPW_FULLWIDTH_MODEL is not set (see the top of this file)";
  Recorded want;
  std::vector<std::vector<int32_t>> calls;
  Dumps cpu_dumps, gpu_dumps;
  run_cpu(env, num, want, calls, nullptr, &cpu_dumps);  // its own inputs: the intermediates of a forced run
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  engine::GpuModelOptions opts;
  opts.budget.max_context = 1024;
  opts.budget.max_seqs = 1;
  auto gpu = engine::load_gpu_model(env, num, opts);
  ASSERT_TRUE(gpu.ok()) << gpu.error().message;
  auto seq = (*gpu)->new_sequence();
  ASSERT_TRUE(seq.ok()) << seq.error().message;
  for (size_t call = 0; call < calls.size(); ++call) {
    gpu_dumps.emplace_back();
    ForwardOptions o;
    o.all_logits = true;
    o.before_layer = [&](int l, std::vector<float>& x) { x = want.in[call][l]; };
    o.on_intermediate = [&](const char* name, int layer, const float* data, size_t count) {
      gpu_dumps.back()[dump_key(name, layer)] = std::vector<float>(data, data + count);
    };
    o.replace_intermediate = [&](const char* name, int layer, std::vector<float>& values) {
      const std::string key = dump_key(name, layer);
      if (key.rfind("attn.sel", 0) == 0 || key.rfind("moe.experts", 0) == 0) return;  // ids: the engine's order
      auto it = cpu_dumps[call].find(key);
      if (it != cpu_dumps[call].end() && it->second.size() == values.size()) values = it->second;
    };
    auto r = (*gpu)->forward(*seq, calls[call], o);
    ASSERT_TRUE(r.ok()) << "GPU call " << call << ": " << r.error().message;
  }

  for (size_t call = 0; call < calls.size(); ++call) {
    const size_t n = calls[call].size();
    for (const auto& [name, w] : cpu_dumps[call]) {
      auto it = gpu_dumps[call].find(name);
      if (it == gpu_dumps[call].end()) {
        ADD_FAILURE() << "call " << call << ": the GPU reported no " << name;
        continue;
      }
      const std::vector<float>& g = it->second;
      if (name.rfind("attn.sel", 0) == 0 || name.rfind("moe.experts", 0) == 0) {
        const auto ws = id_sets(w, n), gs = id_sets(g, n);
        std::string differ;
        for (size_t r = 0; r < n; ++r)
          if (ws[r] != gs[r])
            differ += " row " + std::to_string(r) + " (CPU " + std::to_string(ws[r].size()) + " ids, GPU " +
                      std::to_string(gs[r].size()) + ")";
        std::printf("  [steps] call %zu %-16s %s\n", call, name.c_str(), differ.empty() ? "same sets" : differ.c_str());
        EXPECT_TRUE(differ.empty()) << "call " << call << " " << name << ":" << differ;
        continue;
      }
      if (name.rfind("moe.weights", 0) == 0) continue;  // slot order is the engine's own; the sets are checked
      if (g.size() != w.size()) {
        ADD_FAILURE() << "call " << call << " " << name << ": " << g.size() << " GPU values, " << w.size() << " CPU";
        continue;
      }
      const size_t row_len = w.size() / n;
      double worst_share = 1.0, worst_rel = 0.0;
      size_t worst_row = 0;
      std::string bad_rows;
      for (size_t r = 0; r < n; ++r) {
        float row_max = 0.f, max_d = 0.f;
        for (size_t i = r * row_len; i < (r + 1) * row_len; ++i) row_max = std::max(row_max, std::fabs(w[i]));
        size_t ok = 0;
        for (size_t i = r * row_len; i < (r + 1) * row_len; ++i) {
          const float dlt = std::fabs(g[i] - w[i]);
          ok += dlt <= std::max(1e-3f * row_max, 2.0f * std::ldexp(std::fabs(w[i]), -8));
          if (!(dlt <= max_d)) max_d = std::isfinite(dlt) ? dlt : INFINITY;
        }
        const double share = double(ok) / double(row_len), rel = row_max > 0 ? max_d / row_max : max_d;
        if (share < kStepShare) bad_rows += " " + std::to_string(r) + ":" + std::to_string(int(100 * share)) + "%";
        if (share < worst_share || (share == worst_share && rel > worst_rel)) worst_share = share, worst_rel = rel, worst_row = r;
      }
      std::printf("  [steps] call %zu %-16s worst row %zu: %.2f%% within bounds, max |d| %.2e of row max%s%s\n", call,
                  name.c_str(), worst_row, 100 * worst_share, worst_rel, bad_rows.empty() ? "" : "; rows below:",
                  bad_rows.c_str());
      EXPECT_TRUE(bad_rows.empty()) << "call " << call << " " << name << ": rows below " << kStepShare << ":" << bad_rows;
    }
  }
}

TEST(EngineFullWidth, IntermediatesMatchCpu) { intermediates_match_cpu(Numerics::reference()); }

TEST(EngineFullWidth, IntermediatesMatchCpuFakeQuantOnly) {
  Numerics num = Numerics::reference();
  num.bf16_activations = false;
  intermediates_match_cpu(num);
}

// Exact numerics on both sides (f32 throughout, no fake quant: what Transformers computes in float32):
// each call's layer output within 1e-4 of its largest |value| and every logit within 1e-3 of the CPU's, the
// bounds of EngineGoldenExact (f32 summation order only). Passing here while the reference-numerics test
// fails puts a departure in a rounding or quantization step; failing here puts it in the structure.
TEST(EngineFullWidth, SingleLayerMatchesCpuExact) {
  ModelConfig c;
  Recorded want, got;
  std::vector<std::vector<int32_t>> calls;
  run_both(Numerics::exact(), {}, c, want, got, calls);
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  const size_t row_len = size_t(c.hc_mult) * c.d_model;
  for (size_t call = 0; call < calls.size(); ++call) {
    for (int l = 0; l < c.n_layers; ++l) {
      const std::vector<float>& g = got.out[call][l];
      const std::vector<float>& w = want.out[call][l];
      ASSERT_EQ(g.size(), w.size()) << "call " << call << " layer " << l;
      float max_abs = 0, max_diff = 0;
      size_t at = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        max_abs = std::max(max_abs, std::fabs(w[i]));
        const float diff = std::fabs(g[i] - w[i]);
        if (!(diff <= max_diff)) max_diff = diff, at = i;
      }
      std::printf("  [fullwidth exact] call %zu layer %d: max|d| %.2e of max|x| %.2e at (row %zu, copy %zu, ch %zu)\n",
                  call, l, max_diff, max_abs, at / row_len, at / c.d_model % c.hc_mult, at % c.d_model);
      EXPECT_LE(max_diff, 1e-4f * max_abs) << "call " << call << " layer " << l << ": GPU " << g[at] << " CPU " << w[at];
    }
    const std::vector<float>& g = got.logits[call];
    const std::vector<float>& w = want.logits[call];
    ASSERT_EQ(g.size(), w.size());
    float max_diff = 0;
    size_t at = 0;
    size_t top1_differ = 0;
    for (size_t row = 0; row * c.vocab_size < w.size(); ++row) {
      const float* gr = g.data() + row * c.vocab_size;
      const float* wr = w.data() + row * c.vocab_size;
      top1_differ += argmax(gr, c.vocab_size) != argmax(wr, c.vocab_size);
      for (int64_t v = 0; v < c.vocab_size; ++v) {
        const float diff = std::fabs(gr[v] - wr[v]);
        if (!(diff <= max_diff)) max_diff = diff, at = row * c.vocab_size + v;
      }
    }
    std::printf("  [fullwidth exact] call %zu logits: max|d| %.2e, top-1 differs on %zu rows\n", call, max_diff,
                top1_differ);
    EXPECT_LE(max_diff, 1e-3f) << "call " << call << " flat index " << at << ": GPU " << g[at] << " CPU " << w[at];
    EXPECT_EQ(top1_differ, 0u) << "call " << call;
  }
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
