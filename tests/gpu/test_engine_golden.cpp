// The GPU forward (engine/gpu_model.h) against the CPU reference Model (Numerics::reference(), the
// oracle) on the golden tiny configs (tests/golden/fixtures/{v41,v4}), every case: prompt prefill
// with all logits, then teacher-forced decode of the case's own decode ids. Plus: the same per
// layer with the CPU's input streams fed to every GPU layer, chunked prefill then decode against
// one-shot prefill, and two interleaved sequences against each alone.
//
// Tolerances and why. The GPU computes the reference's operations with the same bf16 roundings and
// fake quants but sums f32 products in other orders (tensor-core GEMMs, tree reductions) and uses
// CUDA's expf; a last-bit difference flips a bf16 rounding now and then, and on these random-weight
// models a flip grows chaotically. Measured on the CPU reference (this fixture, prefill + decode ids):
// one bf16 ulp added to one residual value before layer 0 leaves 18/33, 33/49, 123/162, 311/333
// top-1s equal (V4.1 p1, p17, p130, p301; max |dlogit| 19–25) and 22/33, 35/49, 142/162, 315/333 (V4;
// 9–13); one such ulp before every layer, 452/577 (V4.1). The PyTorch oracle in the same numerics
// agrees with the CPU engine on ~70% of top-1s (tests/golden/test_golden.cpp). 100% top-1 over whole
// free-running cases is therefore not a meaningful target; what is asserted:
//  - free running: no NaN/Inf; the first row of the 1-token prompt within kFirstRowTol (no earlier
//    position can carry a flip: the oracle vs CPU measured < 1e-3); top-1 agreement over all rows
//    of an arch ≥ kMinTop1Share (the oracle's 0.6 bound: a missing rounding or a wrong quant block
//    scores far lower, the exact mode 48.5% against the oracle);
//  - teacher forced (each GPU layer gets the CPU's input streams, so flips cannot compound across
//    layers): ≥ 90% of each layer's output stream values within 2 bf16 ulps of the CPU's, the bound
//    the oracle-vs-CPU per-layer test uses (it measured 94.7–100%);
//  - chunking with the GEMV forced for every linear, and interleaving sequences, change nothing the
//    kernels compute per token: bit-identical logits. Chunking on the default paths (GEMM for a
//    17-token prefill, GEMV for 3-token chunks) only changes summation order: reported, and the
//    first prompt row (identical inputs up to summation order) within kFirstRowTol.
// V4.1 also reports the third side of the triangle: GPU and CPU each against the oracle's stored
// reference-mode logits (ref.prefill_logits, ref.decode_logits; tools/golden/oracle_v41.py, which
// sums in torch's f32 order). Issue 7 found that the H200 run's V4.1 gaps vs the CPU are such flips,
// not a GPU bug: on p17 the CPU's row 0 (token 817) differs from the stored oracle by the same 14.24
// as the GPU's (the layer-3 router's 2nd and 3rd experts are 1.0e-4 apart; the oracle itself lands on
// either side for 1- vs 2-token prefixes), the CPU-vs-oracle first-mismatch and max-|dlogit| rows of
// p130/p301 are the GPU-vs-CPU ones, and teacher-forced layer 0 (94.66%) is a 1-ulp ffn.in flip at
// row 10 that the CPU-vs-oracle teacher-forced run shows with exactly the same 94.66%.
// Failures print the case, the top-1 share, the first mismatching row and where the max |dlogit| is.
// Built into spw_gpu_tests; scripts/gpu_test.sh runs it on the GPU machine.
#if defined(SPW_HAVE_CUDA)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "../golden/golden_fixture.h"
#include "engine/gpu_model.h"
#include "model/model.h"

namespace spw {
namespace {

constexpr float kFirstRowTol = 1e-2f;
constexpr double kMinTop1Share = 0.6;

struct Case {
  std::vector<int32_t> prompt, decode_ids;
  std::vector<float> oracle;  // V4.1: the oracle's reference-mode logits, prefill rows then decode rows
};

Case read_case(const std::string& arch, int prompt_len) {
  const std::string path = golden::fixture_dir(arch) + "/cases/p" + std::to_string(prompt_len) + ".safetensors";
  auto file = SafetensorsFile::open(path);
  Case c;
  if (!file.ok()) {
    ADD_FAILURE() << path << ": " << file.error().message;
    return c;
  }
  c.prompt = golden::read_ids(**file, "prompt_ids");
  c.decode_ids = golden::read_ids(**file, arch == "v41" ? "ref.decode_ids" : "decode_ids");
  if (c.prompt.empty() || c.decode_ids.empty()) ADD_FAILURE() << path << ": missing prompt_ids / decode ids";
  if (arch == "v41") {
    c.oracle = golden::read_floats(**file, "ref.prefill_logits");
    const auto decode = golden::read_floats(**file, "ref.decode_logits");
    c.oracle.insert(c.oracle.end(), decode.begin(), decode.end());
  }
  return c;
}

std::unique_ptr<Model> load_cpu(const std::string& arch) {
  auto m = load_model(golden::fixture_dir(arch) + "/model", Numerics::reference());
  if (!m.ok()) ADD_FAILURE() << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

std::unique_ptr<engine::GpuModel> load_gpu(const std::string& arch, engine::GpuModelOptions opts = {}) {
  opts.budget.max_context = 1024;  // p301 and its decode steps
  opts.budget.max_seqs = 2;         // the interleaving test
  auto m = engine::load_gpu_model(golden::fixture_dir(arch) + "/model", Numerics::reference(), opts);
  if (!m.ok()) ADD_FAILURE() << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

// Prefill in chunks of `chunk` tokens (0: one shot), all logits, then one decode step per id.
std::vector<float> run_cpu(const Model& m, const Case& c, int chunk) {
  SequenceState seq = m.new_sequence();
  ForwardOptions opts;
  opts.all_logits = true;
  std::vector<float> out;
  const size_t step = chunk > 0 ? size_t(chunk) : c.prompt.size();
  for (size_t b = 0; b < c.prompt.size(); b += step) {
    auto r = m.forward(seq, std::span(c.prompt).subspan(b, std::min(step, c.prompt.size() - b)), opts);
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (!r.ok()) return {};
    out.insert(out.end(), r->begin(), r->end());
  }
  for (int32_t id : c.decode_ids) {
    auto r = m.forward(seq, std::span<const int32_t>(&id, 1), opts);
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (!r.ok()) return {};
    out.insert(out.end(), r->begin(), r->end());
  }
  return out;
}

// The same on the GPU, as a resumable list of calls so that two sequences can be interleaved.
struct GpuRun {
  engine::GpuSequence seq;
  std::vector<std::vector<int32_t>> calls;
  size_t next = 0;
  std::vector<float> out;
  bool failed = false;
};

GpuRun make_run(engine::GpuModel& m, const Case& c, int chunk) {
  GpuRun run;
  auto seq = m.new_sequence();
  if (!seq.ok()) {
    ADD_FAILURE() << seq.error().message;
    run.failed = true;
    return run;
  }
  run.seq = std::move(seq.value());
  const size_t step = chunk > 0 ? size_t(chunk) : c.prompt.size();
  for (size_t b = 0; b < c.prompt.size(); b += step)
    run.calls.emplace_back(c.prompt.begin() + b, c.prompt.begin() + std::min(b + step, c.prompt.size()));
  for (int32_t id : c.decode_ids) run.calls.push_back({id});
  return run;
}

// Runs the next call of `run`; false when done or failed.
bool step(engine::GpuModel& m, GpuRun& run) {
  if (run.failed || run.next >= run.calls.size()) return false;
  ForwardOptions opts;
  opts.all_logits = true;
  auto r = m.forward(run.seq, run.calls[run.next++], opts);
  if (!r.ok()) {
    ADD_FAILURE() << "GPU forward: " << r.error().message;
    run.failed = true;
    return false;
  }
  run.out.insert(run.out.end(), r->begin(), r->end());
  return true;
}

std::vector<float> run_gpu(engine::GpuModel& m, const Case& c, int chunk) {
  GpuRun run = make_run(m, c, chunk);
  while (step(m, run)) {
  }
  return run.out;
}

struct Diff {
  size_t rows = 0, top1_mismatches = 0;
  long first_mismatch_row = -1;
  float max_diff = 0, first_row_diff = 0;
  size_t max_row = 0, max_index = 0;
  size_t non_finite = 0;
};

Diff compare(const std::vector<float>& got, const std::vector<float>& want, size_t vocab) {
  Diff d;
  if (got.size() != want.size() || want.empty()) return d;
  d.rows = want.size() / vocab;
  for (size_t r = 0; r < d.rows; ++r) {
    const float* g = got.data() + r * vocab;
    const float* w = want.data() + r * vocab;
    for (size_t i = 0; i < vocab; ++i) {
      if (!std::isfinite(g[i])) ++d.non_finite;
      const float diff = std::fabs(g[i] - w[i]);
      if (!(diff <= d.max_diff)) d.max_diff = std::isfinite(diff) ? diff : INFINITY, d.max_row = r, d.max_index = i;
      if (r == 0) d.first_row_diff = std::max(d.first_row_diff, diff);
    }
    if (golden::argmax(g, vocab) != golden::argmax(w, vocab)) {
      ++d.top1_mismatches;
      if (d.first_mismatch_row < 0) d.first_mismatch_row = long(r);
    }
  }
  return d;
}

std::string describe(const Diff& d) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "top-1 %zu/%zu equal (first mismatch row %ld), max|dlogit| %.3e at row %zu index %zu, first row "
                "%.3e, non-finite %zu",
                d.rows - d.top1_mismatches, d.rows, d.first_mismatch_row, d.max_diff, d.max_row, d.max_index,
                d.first_row_diff, d.non_finite);
  return buf;
}

void gpu_vs_cpu(const std::string& arch) {
  SPW_REQUIRE_GPU();
  auto cpu = load_cpu(arch);
  auto gpu = load_gpu(arch);
  ASSERT_TRUE(cpu && gpu);
  const size_t vocab = size_t(cpu->config().vocab_size);
  size_t rows = 0, agree = 0, oracle_rows = 0, gpu_oracle_agree = 0, cpu_oracle_agree = 0;
  for (int len : {1, 17, 130, 301}) {
    SCOPED_TRACE(arch + " p" + std::to_string(len));
    const Case c = read_case(arch, len);
    const auto want = run_cpu(*cpu, c, 0);
    const auto got = run_gpu(*gpu, c, 0);
    ASSERT_EQ(got.size(), want.size()) << "GPU logits of the wrong size";
    const Diff d = compare(got, want, vocab);
    std::printf("  [engine %s p%d] GPU vs CPU reference: %s\n", arch.c_str(), len, describe(d).c_str());
    EXPECT_EQ(d.non_finite, 0u) << describe(d);
    if (len == 1) { EXPECT_LE(d.first_row_diff, kFirstRowTol) << describe(d); }
    rows += d.rows;
    agree += d.rows - d.top1_mismatches;
    if (c.oracle.size() == want.size()) {
      const Diff go = compare(got, c.oracle, vocab), co = compare(want, c.oracle, vocab);
      std::printf("  [engine %s p%d] GPU vs oracle: %s\n  [engine %s p%d] CPU vs oracle: %s\n", arch.c_str(), len,
                  describe(go).c_str(), arch.c_str(), len, describe(co).c_str());
      oracle_rows += go.rows;
      gpu_oracle_agree += go.rows - go.top1_mismatches;
      cpu_oracle_agree += co.rows - co.top1_mismatches;
    } else if (!c.oracle.empty()) {
      ADD_FAILURE() << "oracle logits of p" << len << ": " << c.oracle.size() << " values, expected " << want.size();
    }
  }
  std::printf("  [engine %s] top-1 agreement with the CPU over all cases: %zu/%zu\n", arch.c_str(), agree, rows);
  EXPECT_GE(double(agree), kMinTop1Share * double(rows)) << agree << "/" << rows;
  if (oracle_rows > 0) {
    std::printf("  [engine %s] top-1 agreement with the oracle over all cases: GPU %zu/%zu, CPU %zu/%zu\n",
                arch.c_str(), gpu_oracle_agree, oracle_rows, cpu_oracle_agree, oracle_rows);
    EXPECT_GE(double(gpu_oracle_agree), kMinTop1Share * double(oracle_rows)) << gpu_oracle_agree << "/" << oracle_rows;
  }
}

TEST(EngineGolden, V41MatchesCpuReference) { gpu_vs_cpu("v41"); }
TEST(EngineGolden, V4MatchesCpuReference) { gpu_vs_cpu("v4"); }

// Teacher forced: the CPU runs the p17 case freely (prefill, then its decode ids) and records every
// layer's output streams; the GPU runs the same calls with each layer's input replaced by the CPU's
// (the previous layer's output), and each layer's output is compared with the CPU's.
void teacher_forced_layers(const std::string& arch) {
  SPW_REQUIRE_GPU();
  auto cpu = load_cpu(arch);
  auto gpu = load_gpu(arch);
  ASSERT_TRUE(cpu && gpu);
  const int n_layers = cpu->config().n_layers;
  Case c = read_case(arch, 17);
  c.decode_ids.resize(std::min<size_t>(c.decode_ids.size(), 4));
  std::vector<std::vector<int32_t>> calls{c.prompt};
  for (int32_t id : c.decode_ids) calls.push_back({id});

  SequenceState cseq = cpu->new_sequence();
  auto gseq = gpu->new_sequence();
  ASSERT_TRUE(gseq.ok()) << gseq.error().message;
  std::vector<double> worst(n_layers, 1.0);
  for (size_t k = 0; k < calls.size(); ++k) {
    std::vector<std::vector<float>> want(n_layers);
    ForwardOptions copts;
    copts.on_layer = [&](int l, const std::vector<float>& x) { want[l] = x; };
    ASSERT_TRUE(cpu->forward(cseq, calls[k], copts).ok());
    ForwardOptions gopts;
    gopts.before_layer = [&](int l, std::vector<float>& x) {
      if (l > 0) x = want[l - 1];
    };
    gopts.on_layer = [&](int l, const std::vector<float>& got) {
      ASSERT_EQ(got.size(), want[l].size());
      size_t close = 0, first_far = got.size();
      for (size_t i = 0; i < got.size(); ++i) {
        const bool ok = std::fabs(got[i] - want[l][i]) <= 2.0f * std::ldexp(std::fabs(want[l][i]), -8) + 1e-30f;
        close += ok;
        if (!ok && first_far == got.size()) first_far = i;
      }
      const double fraction = double(close) / double(got.size());
      worst[l] = std::min(worst[l], fraction);
      EXPECT_GE(fraction, 0.90) << arch << " call " << k << " layer " << l << ": " << 100.0 * fraction
                                << "% within 2 bf16 ulps; first far value at flat index " << first_far << ": GPU "
                                << (first_far < got.size() ? got[first_far] : 0.f) << " vs CPU "
                                << (first_far < got.size() ? want[l][first_far] : 0.f);
    };
    auto r = gpu->forward(*gseq, calls[k], gopts);
    ASSERT_TRUE(r.ok()) << r.error().message;
  }
  for (int l = 0; l < n_layers; ++l)
    std::printf("  [engine %s] teacher forced layer %d: worst call %.2f%% within 2 bf16 ulps\n", arch.c_str(), l,
                100.0 * worst[l]);
}

// V4 only. On the golden V4.1 model the reference numerics are chaotic in the decode calls: the CPU against
// itself with 0.01 % of each layer's input moved by one bf16 ulp keeps only 23–90 % of a layer's values
// within 2 ulps (EngineDiag.DISABLED_GoldenV41CpuNoiseTeacherForced, H200 run of 2026-12-03:
// bench/results/raw/engine_2026-12-03_0650/gpu_tests.log), and the GPU's summation order does the same
// (19.7–68.8 % in calls 3 and 4; calls 0–2 ≥ 99.9 %). No bound in these numerics separates a bug from that
// noise there; V4.1's per-layer test is EngineGoldenExact.V41TeacherForcedLayers (exact numerics, f32
// throughout, every layer within 1e-4·max|x| of the CPU), which exercises the same kernels.
TEST(EngineGolden, V4TeacherForcedLayers) { teacher_forced_layers("v4"); }

// Chunks of 3 then decode vs one-shot prefill then decode, with every linear on the GEMV (the same
// per-token summation order whatever the chunking): bit-identical. With the default paths (GEMM for
// the 17-token one-shot prefill) only summation order differs: see the top of the file.
void chunked_vs_one_shot(const std::string& arch) {
  SPW_REQUIRE_GPU();
  Case c = read_case(arch, 17);
  ASSERT_GE(c.prompt.size(), 16u);
  {
    Case c16 = c;
    c16.prompt.resize(16);
    engine::GpuModelOptions opts;
    opts.linear_path = LinearPath::kGemv;
    opts.budget.max_step_tokens = 16;
    auto gpu = load_gpu(arch, opts);
    ASSERT_TRUE(gpu);
    const size_t vocab = size_t(gpu->config().vocab_size);
    const auto one_shot = run_gpu(*gpu, c16, 0);
    const auto chunked = run_gpu(*gpu, c16, 3);
    ASSERT_EQ(one_shot.size(), chunked.size());
    const Diff d = compare(chunked, one_shot, vocab);
    std::printf("  [engine %s] chunks of 3 vs one shot, GEMV forced: %s\n", arch.c_str(), describe(d).c_str());
    EXPECT_EQ(d.max_diff, 0.f) << "expected bit-identical: " << describe(d);
    EXPECT_EQ(d.top1_mismatches, 0u) << describe(d);
  }
  {
    auto gpu = load_gpu(arch);
    ASSERT_TRUE(gpu);
    const size_t vocab = size_t(gpu->config().vocab_size);
    const auto one_shot = run_gpu(*gpu, c, 0);
    const auto chunked = run_gpu(*gpu, c, 3);
    ASSERT_EQ(one_shot.size(), chunked.size());
    const Diff d = compare(chunked, one_shot, vocab);
    std::printf("  [engine %s] chunks of 3 vs one shot, default paths: %s\n", arch.c_str(), describe(d).c_str());
    EXPECT_EQ(d.non_finite, 0u) << describe(d);
    EXPECT_LE(d.first_row_diff, kFirstRowTol) << describe(d);
  }
}

TEST(EngineGolden, V41ChunkedPrefillMatchesOneShot) { chunked_vs_one_shot("v41"); }
TEST(EngineGolden, V4ChunkedPrefillMatchesOneShot) { chunked_vs_one_shot("v4"); }

// Two sequences stepped alternately (their pages interleave in the shared pools) give exactly what
// each gives alone: the kernels see the same values per sequence, only the page ids differ.
// The third run reuses a freed slot and freed pages.
void interleaved_vs_alone(const std::string& arch) {
  SPW_REQUIRE_GPU();
  auto gpu = load_gpu(arch);
  ASSERT_TRUE(gpu);
  const size_t vocab = size_t(gpu->config().vocab_size);
  const Case a = read_case(arch, 17), b = read_case(arch, 130);
  const auto alone_a = run_gpu(*gpu, a, 5);
  const auto alone_b = run_gpu(*gpu, b, 64);
  GpuRun ra = make_run(*gpu, a, 5), rb = make_run(*gpu, b, 64);
  bool more = true;
  while (more) {
    const bool sa = step(*gpu, ra);
    const bool sb = step(*gpu, rb);
    more = sa || sb;
  }
  ASSERT_FALSE(ra.failed || rb.failed);
  const Diff da = compare(ra.out, alone_a, vocab), db = compare(rb.out, alone_b, vocab);
  std::printf("  [engine %s] interleaved vs alone: A %s\n  B %s\n", arch.c_str(), describe(da).c_str(),
              describe(db).c_str());
  ASSERT_EQ(ra.out.size(), alone_a.size());
  ASSERT_EQ(rb.out.size(), alone_b.size());
  EXPECT_EQ(da.max_diff, 0.f) << "sequence A: " << describe(da);
  EXPECT_EQ(db.max_diff, 0.f) << "sequence B: " << describe(db);
  EXPECT_EQ(da.non_finite + db.non_finite, 0u);
}

TEST(EngineGolden, V41InterleavedSequencesMatchAlone) { interleaved_vs_alone("v41"); }
TEST(EngineGolden, V4InterleavedSequencesMatchAlone) { interleaved_vs_alone("v4"); }

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
