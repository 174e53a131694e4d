// Issue 7 acceptance: "a full-width single-layer test at real V4.1 dimensions (d=5120, 384 experts of
// 2304, 64 heads of 512) matches the CPU reference". The GPU forward (engine/gpu_model.h) against the
// CPU reference Model (model/model.h) on a synthetic checkpoint written by tools/synth/make_synthetic_model.py
// (real config, layout and formats; random weights). Two tests:
//  - SingleLayerMatchesCpuExact: exact numerics (f32 throughout, no fake quant) on both engines, the layer
//    output within 1e-4 of its largest |value| and every logit within 1e-3 (EngineGoldenExact's bounds):
//    the structure, end to end (H200, 2026-12-03: 3e-6 relative, logits 2e-5, top-1 equal).
//  - IntermediatesMatchCpu: reference numerics (bf16 roundings, every fake quant), step by step (below).
//
// Why not the layer output in reference numerics: at full width it cannot match, and the CPU does not
// match itself either. A ~1e-6 summation-order difference flips an e4m3 code (6 % steps) of an activation
// now and then (~8,000 quantized values per row and projection at this width, against a few dozen in the
// golden models); the flipped product moves by ~1e-3 of its row; the next quantize-then-project step flips
// many more. Measured on the H200 (2026-12-03, bench/results/engine_h200.md, the full-width departure), comparing layer
// outputs: 47.8 % of prefill values within 2 bf16 ulps (20–25 % in decode); 80 % with the fake quants off;
// with f32 activations and the fake quants on, every intermediate before a quantize-then-project step within
// 1.4e-6 of its row's largest value, the same selected entries and routed experts, and rows 3 and 9 then
// off by 1e-2 right after one. The step-by-step test below removes the compounding and holds each step to
// tight bounds; it passed at full width in reference numerics.
//
// The model directory comes from the environment variable SPW_FULLWIDTH_MODEL; the tests FAIL when it is
// unset (they are part of the acceptance, not optional). scripts/gpu_fullwidth.sh generates the model and
// runs both on the H200 machine:
//   python3 tools/synth/make_synthetic_model.py /tmp/fw14 --arch v41 --real-layers 14 --tokenizer none
//   SPW_FULLWIDTH_MODEL=/tmp/fw14 spw_gpu_tests --gtest_filter='EngineFullWidth.*'
// Real layer 14 is the most V4.1-specific single layer: window + its own gated ratio-2 compressor (KV
// source), its own indexer (index source, fp4 keys), Engram, 384 score-routed MXFP4 experts + the shared
// expert, mHC with hc 4. Real layer 20 (ratio 1, candidate source) is the other kind worth a run. Any number
// of layers works: every GPU layer is fed the CPU's input streams (teacher forced).
//
// Memory: both engines dequantize every weight to f32 on the host at load (model/weights.h): one layer's
// 384 experts are 384·3·2304·5120·4 B = 54 GB. The CPU runs first, its results are kept (logits, streams
// and intermediates, a few hundred MB), and it is freed before the GPU model loads, so the peak is one copy
// (~62 GB with embedding and head), inside the 128 GiB machine. Time: ~35 s per load (dequantization on
// every core), seconds for the forwards; ~60 s per test.
//
// What runs: a 16-token prefill (all logits) and 4 decode steps fed the CPU's greedy picks; 16 tokens at
// ratio 2 give 8 compressed entries, so every entry is selected (index_topk 512): what is tested is the
// entries' values (compressor, fp4 keys and fp4/e4m3 entries), not top-k near-ties.
#if defined(SPW_HAVE_CUDA)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "engine/gpu_model.h"
#include "gpu_test_util.h"
#include "model/model.h"

namespace spw {
namespace {


constexpr int kPromptTokens = 16;
constexpr int kDecodeSteps = 4;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What one engine produced: per call the logits [n, vocab] and per layer the input and output streams.
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

// CPU: prefill then greedy decode; `calls` receives the token list of every call, `dumps` (if given) the
// intermediates of every call.
void run_cpu(const std::string& dir, const Numerics& num, Recorded& rec, std::vector<std::vector<int32_t>>& calls,
             Dumps* dumps = nullptr) {
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

// SPW_FULLWIDTH_MODEL, or "" after a failure that says how to make one.
std::string model_dir() {
  const char* env = std::getenv("SPW_FULLWIDTH_MODEL");
  EXPECT_TRUE(env && *env) << "SPW_FULLWIDTH_MODEL is not set: generate a model with "
                              "`python3 tools/synth/make_synthetic_model.py /tmp/fw14 --arch v41 --real-layers 14 "
                              "--tokenizer none` and run with SPW_FULLWIDTH_MODEL=/tmp/fw14";
  return env ? env : "";
}

// The issue's dimensions: a width-divided synthetic model would not be this test.
void check_dimensions(const std::string& dir, ModelConfig& c) {
  SPW_REQUIRE_GPU();
  auto config = read_model_config(dir);
  ASSERT_TRUE(config.ok()) << config.error().message;
  c = *config;
  ASSERT_TRUE(c.is_v41()) << dir << ": not a V4.1 config";
  EXPECT_EQ(c.d_model, 5120);
  EXPECT_EQ(c.n_experts, 384);
  EXPECT_EQ(c.d_expert, 2304);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.d_head, 512);
}

// Runs both engines in `num` on SPW_FULLWIDTH_MODEL, each GPU layer fed the CPU's input streams.
void run_both(const Numerics& num, const engine::GpuModelOptions& gpu_opts, ModelConfig& c, Recorded& want,
              Recorded& got, std::vector<std::vector<int32_t>>& calls) {
  const std::string dir = model_dir();
  ASSERT_FALSE(dir.empty());
  check_dimensions(dir, c);
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  run_cpu(dir, num, want, calls);  // the CPU model is freed on return
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  run_gpu(dir, num, gpu_opts, want, calls, got);
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  ASSERT_EQ(got.logits.size(), want.logits.size());
}

// Step by step: every intermediate the engines report (ForwardOptions::on_intermediate; names in model/model.h)
// compared with the CPU's, the GPU fed the CPU's value of each float intermediate before its next step
// (ForwardOptions::replace_intermediate) and the CPU's layer input: each step starts from the same values,
// so a fake-quant flip cannot compound (top of the file). Bounds, per row: the selected entries and routed experts
// are the same sets; ≥ kStepShare of a float intermediate's values within max(1e-3 of the row's largest
// |CPU value|, 2 bf16 ulps of the value) (a step's own summation order can still flip a code now and then).
// Every intermediate's worst row is printed. H200, 2026-12-03, reference numerics: every row of every step
// ≥ 99.4 % within (most 100 %, decode steps mostly bit-equal), same sets throughout.
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
  SPW_REQUIRE_GPU();
  const std::string env = model_dir();
  ASSERT_FALSE(env.empty());
  ModelConfig c;
  check_dimensions(env, c);
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  Recorded want;
  std::vector<std::vector<int32_t>> calls;
  Dumps cpu_dumps, gpu_dumps;
  run_cpu(env, num, want, calls, &cpu_dumps);  // its own inputs: the intermediates of a forced run
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
