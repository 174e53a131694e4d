// Diagnostic: where does the GPU forward (engine/gpu_model.h) first depart from the CPU reference on
// the trained demo model (models/demo, V4.1 architecture)? bench/results/engine_h200.md: 95/98 top-1,
// max |Δlogit| 0.50, mean 0.0227 free running — is that f32 summation-order noise or a V4.1 bug?
//
// EngineDiag.DemoCpuNoiseFloor (CPU only, no GPU needed): what a last-bit difference does on this
//   model. The CPU reference is run twice, the second time with ±1 bf16 ulp added to a random 0.1 %
//   or 0.01 % of the residual-stream values before every layer, or to ONE value before layer 0 of
//   the prompt; the single-value change is repeated without fake quant and in the exact mode (f32
//   throughout) to show which reference step amplifies it. Prints top-1 agreement and max / mean
//   |Δlogit| over the same prompt + 8 greedy steps as EngineDemo.TrainedModelMatchesCpu. If these
//   numbers are far below the GPU's, the GPU gap is not noise.
// EngineDiag.DemoTeacherForced*, GoldenV41TeacherForced: prompt prefill (all rows) + 4 decode steps
//   (demo: the CPU's greedy picks; golden: the p17 case's ids, as test_engine_golden.cpp); every GPU
//   layer gets the CPU's input streams (ForwardOptions::before_layer), so each layer's output
//   difference is that layer's own (plus the KV state the GPU built from the same forced inputs in
//   earlier layers and calls). Per (call, layer): % of output stream values bit-identical to the
//   CPU's (a chance summation-order flip leaves most layers of most calls at 100 %; a systematic
//   difference — another rounding point, quant rule or row — keeps a layer kind below it in every
//   call), % within 2 bf16 ulps, max |Δ| with (row, copy, channel) and both values, how many token rows hold a value off by
//   more than 2 ulps and the first of them; per call the logits given the forced last layer. The first
//   (call, layer) below 99.9 % is printed as the first divergence. Variants, to bisect:
//   Numerics::stale_index_k off on both engines; Engram off (a copy of the model dir whose config
//   lists no Engram layers, on both). The GPU engine has no per-sublayer hook, so within a layer the
//   table localises by token row and by the layer's kind (window / source / reindex / reuse, Engram).
// EngineDiag.*CpuNoiseTeacherForced (CPU only): the same table with the CPU against itself, 0.01 % of
//   each forced layer input moved by ±1 bf16 ulp: the per-layer noise baseline for the GPU tables.
// These are diagnostics, not part of the default suite (every test is DISABLED_); run them with
//   spw_gpu_tests --gtest_also_run_disabled_tests --gtest_filter='EngineDiag.*'
// The 2026-12-03 H200 run (bench/results/raw/engine_2026-12-03_0650/gpu_tests.log) settled what they were for:
// the golden V4.1 and V4 models amplify last-bit noise on the CPU itself (CPU vs CPU with 0.01 % of each
// layer input moved by 1 ulp: down to 23 % of values within 2 ulps in V4.1 decode calls), so a per-layer
// bound in reference numerics cannot hold for any implementation there; the asserted per-layer test is
// EngineGoldenExact.*TeacherForced (exact numerics, ≤ 1e-4·max|x|, passing).
// Bounds (a diagnostic: it may fail, it must not crash): every layer of every call ≥ 99.0 % within 2
// bf16 ulps — on V4 every teacher-forced layer measured ≥ 99.99 % on the H200; a summation-order
// flip touches ~0.1 % of values, a real difference (a wrong row, a flipped top-k pick) far more. The
// CPU-noise tests are held to the same bound: where they fail too, the layer amplifies last-bit noise
// (a near-tie in a discrete choice) and the GPU cannot be asked to do better.
// The demo model is found at SPW_SOURCE_DIR/models/demo (as in test_engine_demo.cpp).
#if defined(SPW_HAVE_CUDA)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../golden/golden_fixture.h"
#include "engine/gpu_model.h"
#include "gpu_test_util.h"
#include "reference_noise.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace spw {
namespace {

namespace fs = std::filesystem;
using gpu_test::FreeRun;
using gpu_test::free_run;
using gpu_test::perturb;

const std::string kDemo = std::string(SPW_SOURCE_DIR) + "/models/demo";
constexpr double kMinWithin2Ulps = 0.99;
constexpr int kDecodeSteps = 4;

std::vector<int32_t> prompt_ids() {
  auto tok = Tokenizer::load(kDemo + "/tokenizer.json");
  EXPECT_TRUE(tok.ok()) << tok.error().message;
  if (!tok.ok()) return {};
  return (*tok)->encode(
      "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n"
      "        a, b = b, a + b\n    return a\n\nThe quick brown fox jumps over the lazy dog. In 1905, Einstein "
      "published four papers that changed physics.\n");
}

int argmax(const float* x, int n) { return int(std::max_element(x, x + n) - x); }

// The within-2-bf16-ulps test of test_engine_golden.cpp (|Δ| ≤ 2·|want|·2⁻⁸).
bool close_2ulp(float got, float want) {
  return std::fabs(got - want) <= 2.0f * std::ldexp(std::fabs(want), -8) + 1e-30f;
}

struct StreamDiff {
  double within = 1.0;  // share of values within 2 bf16 ulps
  double identical = 1.0;  // share of bit-identical values
  float max_abs = 0, got = 0, want = 0;
  size_t max_row = 0, max_copy = 0, max_ch = 0;
  int far_rows = 0;     // token rows holding a value off by more than 2 ulps
  long first_far_row = -1;
  bool size_mismatch = false;
};

// got / want: streams [n, hc, d].
StreamDiff diff_streams(const std::vector<float>& got, const std::vector<float>& want, int hc, int d) {
  StreamDiff r;
  if (got.size() != want.size() || want.empty()) {
    r.size_mismatch = true;
    r.within = r.identical = 0;
    return r;
  }
  const size_t row_len = size_t(hc) * d, n_rows = want.size() / row_len;
  size_t close = 0, same = 0;
  for (size_t row = 0; row < n_rows; ++row) {
    bool row_far = false;
    for (size_t k = 0; k < row_len; ++k) {
      const size_t i = row * row_len + k;
      const bool ok = close_2ulp(got[i], want[i]);
      close += ok;
      same += got[i] == want[i];
      row_far |= !ok;
      const float a = std::fabs(got[i] - want[i]);
      if (!(a <= r.max_abs)) {  // also catches NaN
        r.max_abs = std::isfinite(a) ? a : INFINITY;
        r.got = got[i], r.want = want[i];
        r.max_row = row, r.max_copy = k / d, r.max_ch = k % d;
      }
    }
    if (row_far) {
      ++r.far_rows;
      if (r.first_far_row < 0) r.first_far_row = long(row);
    }
  }
  r.within = double(close) / double(want.size());
  r.identical = double(same) / double(want.size());
  return r;
}

const char* layer_kind(const ModelConfig& c, int l) {
  const LayerPlan& p = c.layers[l];
  switch (p.attn) {
    case AttnKind::Window: return "window";
    case AttnKind::Source: return p.candidate_source ? "source+cand" : (p.compress_ratio == 1 ? "source r1" : "source r2");
    case AttnKind::Reindex: return "reindex";
    case AttnKind::Reuse: return p.compress_ratio == 1 ? "reuse r1" : "reuse r2";
    default: return attn_kind_name(p.attn);
  }
}

// A copy of the demo model whose config lists no Engram layers (both engines then skip Engram).
std::string demo_without_engram() {
  const fs::path dir = fs::path(testing::TempDir()) / "spw_demo_no_engram";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(kDemo))
    if (e.path().filename() != "config.json") fs::create_symlink(fs::absolute(e.path()), dir / e.path().filename());
  std::ifstream in(kDemo + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  nlohmann::json& t = j.contains("text_config") ? j["text_config"] : j;
  t["engram_layer_ids"] = nlohmann::json::array();
  t["engram_num_embeddings"] = nlohmann::json::array();
  std::ofstream(dir / "config.json") << j.dump(2);
  return dir.string();
}

// The engine compared with the CPU reference: one forward call of its own sequence.
using Candidate = std::function<Result<std::vector<float>>(std::span<const int32_t>, const ForwardOptions&)>;

// Calls: `prompt` (all rows), then `decode` ids, or kDecodeSteps greedy picks of the CPU when empty.
// Every candidate layer is fed the CPU's input streams (then `share` of them perturbed by ±1 bf16 ulp
// when share > 0: the CPU-noise baseline). Prints one table and the first (call, layer) below 99.9 %.
void teacher_forced(const Model& cpu, const Candidate& cand, const std::vector<int32_t>& prompt,
                    const std::vector<int32_t>& decode, double share, const std::string& label) {
  const ModelConfig& c = cpu.config();
  const int n_layers = c.n_layers, hc = c.hc_mult, d = c.d_model, vocab = int(c.vocab_size);
  const int n_calls = 1 + (decode.empty() ? kDecodeSteps : int(decode.size()));
  std::mt19937 rng(7);
  SequenceState cs = cpu.new_sequence();
  std::printf("[diag %s] prompt %zu tokens, then %d decode steps; layer plan:", label.c_str(), prompt.size(),
              n_calls - 1);
  for (int l = 0; l < n_layers; ++l) std::printf(" %d:%s%s", l, layer_kind(c, l), c.layers[l].engram ? "+engram" : "");
  std::printf("\n[diag %s] call   pos layer kind          identical within2ulp  max|d|     (row,copy, ch)  other      "
              "  cpu          far_rows first_far\n",
              label.c_str());

  std::vector<int32_t> step = prompt;
  long first_bad_call = -1, first_bad_layer = -1;
  double worst = 1.0;
  std::string below;  // (call, layer) pairs under the bound
  for (int call = 0; call < n_calls; ++call) {
    std::vector<std::vector<float>> cin(n_layers), cout(n_layers);
    ForwardOptions co;
    co.all_logits = true;
    co.before_layer = [&](int l, std::vector<float>& x) { cin[l] = x; };
    co.on_layer = [&](int l, const std::vector<float>& x) { cout[l] = x; };
    auto a = cpu.forward(cs, step, co);
    ASSERT_TRUE(a.ok()) << a.error().message;

    std::vector<StreamDiff> diffs(n_layers);
    ForwardOptions go;
    go.all_logits = true;
    go.before_layer = [&](int l, std::vector<float>& x) {
      if (x.size() != cin[l].size()) return;  // reported as a size mismatch by on_layer
      x = cin[l];
      if (share > 0) perturb(x, share, rng);
    };
    go.on_layer = [&](int l, const std::vector<float>& x) { diffs[l] = diff_streams(x, cout[l], hc, d); };
    auto b = cand(step, go);
    ASSERT_TRUE(b.ok()) << b.error().message;
    ASSERT_EQ(a->size(), b->size());

    const int64_t pos0 = cs.n_past - int64_t(step.size());
    for (int l = 0; l < n_layers; ++l) {
      const StreamDiff& r = diffs[l];
      std::printf("[diag %s] %4d %5lld %5d %-12s %8.3f%% %9.3f%%  %.3e  (%3zu,%zu,%4zu)  %+.5e %+.5e  %4d %6ld%s\n",
                  label.c_str(), call, (long long)pos0, l, layer_kind(c, l), 100.0 * r.identical, 100.0 * r.within,
                  r.max_abs, r.max_row,
                  r.max_copy, r.max_ch, r.got, r.want, r.far_rows, r.first_far_row,
                  r.size_mismatch ? "  SIZE MISMATCH" : "");
      worst = std::min(worst, r.within);
      if (r.within < 0.999 && first_bad_call < 0) first_bad_call = call, first_bad_layer = l;
      if (r.within < kMinWithin2Ulps || r.size_mismatch)
        below += " (" + std::to_string(call) + "," + std::to_string(l) + ")";
    }
    // Logits given the forced input of the last layer: only the last layer and the head differ.
    double max_dl = 0;
    int top1 = 0;
    const size_t rows = a->size() / size_t(vocab);
    for (size_t row = 0; row < rows; ++row) {
      const float* x = a->data() + row * vocab;
      const float* y = b->data() + row * vocab;
      top1 += argmax(x, vocab) == argmax(y, vocab);
      for (int v = 0; v < vocab; ++v) max_dl = std::max(max_dl, double(std::fabs(x[v] - y[v])));
    }
    std::printf("[diag %s] call %d logits (last layer forced): top-1 %d/%zu, max|dlogit| %.4f\n", label.c_str(), call,
                top1, rows, max_dl);
    step = {decode.empty() ? argmax(a->data() + (rows - 1) * vocab, vocab) : decode[call < int(decode.size()) ? call : 0]};
  }
  std::printf("[diag %s] worst layer %.3f%% within 2 bf16 ulps; first (call, layer) below 99.9%%: (%ld, %ld)\n",
              label.c_str(), 100.0 * worst, first_bad_call, first_bad_layer);
  EXPECT_TRUE(below.empty()) << label << ": (call, layer) below " << 100.0 * kMinWithin2Ulps
                             << "% within 2 bf16 ulps:" << below;
}

// GPU vs CPU on `dir`, both with `num`.
void gpu_teacher_forced(const std::string& dir, const Numerics& num, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& decode, const std::string& label) {
  SPW_REQUIRE_GPU();
  ASSERT_FALSE(prompt.empty());
  auto cpu = load_model(dir, num);
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  engine::GpuModelOptions opts;
  opts.budget.max_context = 1024;
  auto gpu = engine::load_gpu_model(dir, num, opts);
  ASSERT_TRUE(gpu.ok()) << gpu.error().message;
  auto gs = (*gpu)->new_sequence();
  ASSERT_TRUE(gs.ok()) << gs.error().message;
  std::printf("[diag %s] GPU vs CPU, %s\n", label.c_str(), dir.c_str());
  Candidate cand = [&](std::span<const int32_t> t, const ForwardOptions& o) { return (*gpu)->forward(*gs, t, o); };
  teacher_forced(**cpu, cand, prompt, decode, 0.0, label);
}

// The CPU against itself with 0.01 % of each layer's forced input perturbed by ±1 bf16 ulp: how far a
// last-bit difference alone moves each layer's output (compare with the GPU table).
void cpu_noise_teacher_forced(const std::string& dir, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& decode, const std::string& label) {
  ASSERT_FALSE(prompt.empty());
  auto cpu = load_model(dir, Numerics::reference());
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  SequenceState s2 = (*cpu)->new_sequence();
  std::printf("[diag %s] CPU vs CPU with 0.01%% of each layer's input ±1 bf16 ulp, %s\n", label.c_str(), dir.c_str());
  Candidate cand = [&](std::span<const int32_t> t, const ForwardOptions& o) { return (*cpu)->forward(s2, t, o); };
  teacher_forced(**cpu, cand, prompt, decode, 0.0001, label);
}

// The golden p17 case of `arch` (the one test_engine_golden.cpp's teacher-forced test uses): prompt
// and its first 4 decode ids.
void golden_p17(const std::string& arch, std::vector<int32_t>& prompt, std::vector<int32_t>& decode) {
  const std::string path = golden::fixture_dir(arch) + "/cases/p17.safetensors";
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << path << ": " << file.error().message;
  prompt = golden::read_ids(**file, "prompt_ids");
  decode = golden::read_ids(**file, arch == "v41" ? "ref.decode_ids" : "decode_ids");
  decode.resize(std::min<size_t>(decode.size(), 4));
  ASSERT_FALSE(prompt.empty() || decode.empty()) << path;
}

TEST(EngineDiag, DISABLED_DemoTeacherForced) { gpu_teacher_forced(kDemo, Numerics::reference(), prompt_ids(), {}, "demo"); }

TEST(EngineDiag, DISABLED_DemoTeacherForcedNoStaleIndexK) {
  Numerics num = Numerics::reference();
  num.stale_index_k = false;
  gpu_teacher_forced(kDemo, num, prompt_ids(), {}, "demo no-stale-k");
}

TEST(EngineDiag, DISABLED_DemoTeacherForcedNoEngram) {
  gpu_teacher_forced(demo_without_engram(), Numerics::reference(), prompt_ids(), {}, "demo no-engram");
}

TEST(EngineDiag, DISABLED_GoldenV41TeacherForced) {
  std::vector<int32_t> prompt, decode;
  golden_p17("v41", prompt, decode);
  gpu_teacher_forced(golden::fixture_dir("v41") + "/model", Numerics::reference(), prompt, decode, "golden-v41");
}

// CPU only (no GPU needed): the noise baselines for the two tables above.
TEST(EngineDiag, DISABLED_DemoCpuNoiseTeacherForced) { cpu_noise_teacher_forced(kDemo, prompt_ids(), {}, "demo cpu-noise"); }

TEST(EngineDiag, DISABLED_GoldenV41CpuNoiseTeacherForced) {
  std::vector<int32_t> prompt, decode;
  golden_p17("v41", prompt, decode);
  cpu_noise_teacher_forced(golden::fixture_dir("v41") + "/model", prompt, decode, "golden-v41 cpu-noise");
}

// V4 for scale: its GPU teacher-forced layers measured ≥ 99.99 % except layers 0 and 3 (94.1 %, 96.8 %).
TEST(EngineDiag, DISABLED_GoldenV4CpuNoiseTeacherForced) {
  std::vector<int32_t> prompt, decode;
  golden_p17("v4", prompt, decode);
  cpu_noise_teacher_forced(golden::fixture_dir("v4") + "/model", prompt, decode, "golden-v4 cpu-noise");
}

// Prints how far a perturbed CPU run lands from the unperturbed one (same numerics).
void noise_floor(const Numerics& num, const char* num_name, const std::vector<double>& shares) {
  auto cpu = load_model(kDemo, num);
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  const std::vector<int32_t> prompt = prompt_ids();
  ASSERT_GT(prompt.size(), 40u);
  const int vocab = int((*cpu)->config().vocab_size);
  const FreeRun base = free_run(**cpu, prompt, {}, 0.0, 0);
  ASSERT_FALSE(base.logits.empty());
  for (double share : shares) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      const FreeRun p = free_run(**cpu, prompt, base.picks, share, seed);
      ASSERT_EQ(p.logits.size(), base.logits.size());
      const size_t rows = base.logits.size() / size_t(vocab);
      int top1 = 0;
      double max_dl = 0, sum = 0;
      for (size_t row = 0; row < rows; ++row) {
        const float* x = base.logits.data() + row * vocab;
        const float* y = p.logits.data() + row * vocab;
        top1 += argmax(x, vocab) == argmax(y, vocab);
        for (int v = 0; v < vocab; ++v) {
          const double dl = std::fabs(double(x[v]) - y[v]);
          max_dl = std::max(max_dl, dl);
          sum += dl;
        }
      }
      char what[96];
      if (share > 0) std::snprintf(what, sizeof what, "±1 bf16 ulp on %.2f%% of the streams before every layer", 100 * share);
      else std::snprintf(what, sizeof what, "+1 bf16 ulp on one stream value before layer 0 of the prompt");
      std::printf("[diag cpu-noise %s] %s, seed %u: top-1 %d/%zu, max |dlogit| %.4f, mean %.5f\n", num_name, what,
                  seed, top1, rows, max_dl, sum / (double(rows) * vocab));
    }
  }
}

// The reference numerics, then the same single-ulp change without fake quant and in the exact mode
// (f32 throughout): which of the reference's steps amplifies a last-bit change.
TEST(EngineDiag, DISABLED_DemoCpuNoiseFloor) {
  noise_floor(Numerics::reference(), "reference", {0.001, 0.0001, -1.0});
  Numerics bf16_only = Numerics::reference();
  bf16_only.fake_quant = false;
  noise_floor(bf16_only, "no fake quant", {-1.0});
  noise_floor(Numerics::exact(), "exact", {-1.0});
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
