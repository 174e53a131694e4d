// The engine against golden tensors: DeepSeek-V4 from Hugging Face Transformers (float32) and
// DeepSeek-V4.1 from our PyTorch oracle (tools/golden/oracle_v41.py, both numerics modes).
// Every prompt position and every decode step must agree on the top-1 token, and logits must be
// within the tolerance stated at each check. Per-layer residual streams localise failures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "golden_fixture.h"
#include "model/model.h"

namespace spw {
namespace {

struct Tolerance {
  float logit;   // max |Δlogit|
  float stream;  // max |Δ| of the residual stream after a layer, relative to its max |value|
};

struct Report {
  float max_logit_diff = 0;
  int top1_mismatches = 0;
  int positions = 0;
};

// Compares [n, vocab] logits row by row: top-1 and max |Δ|.
void compare_logits(const std::vector<float>& got, const std::vector<float>& want, size_t vocab, Report& r,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t row = 0; row < got.size() / vocab; ++row) {
    const float* g = got.data() + row * vocab;
    const float* w = want.data() + row * vocab;
    for (size_t i = 0; i < vocab; ++i) r.max_logit_diff = std::max(r.max_logit_diff, std::fabs(g[i] - w[i]));
    if (golden::argmax(g, vocab) != golden::argmax(w, vocab)) {
      ++r.top1_mismatches;
      ADD_FAILURE() << what << " row " << row << ": top-1 " << golden::argmax(g, vocab) << " vs golden "
                    << golden::argmax(w, vocab);
    }
    ++r.positions;
  }
}

// Runs one case: prefill (all logits, streams per layer), then teacher-forced decode of the
// golden's own greedy tokens. `prefix` selects the reference-mode tensors ("ref.") in V4.1 files.
void run_case(const Model& model, const std::string& case_path, const std::string& prefix, const Tolerance& tol,
              bool check_streams, const std::vector<int>& prefill_split = {}) {
  auto file = SafetensorsFile::open(case_path);
  ASSERT_TRUE(file.ok()) << file.error().message;
  const auto prompt = golden::read_ids(**file, "prompt_ids");
  const auto decode_ids = golden::read_ids(**file, prefix + "decode_ids");
  const auto want_prefill = golden::read_floats(**file, prefix + "prefill_logits");
  const auto want_decode = golden::read_floats(**file, prefix + "decode_logits");
  ASSERT_FALSE(prompt.empty() || decode_ids.empty() || want_prefill.empty() || want_decode.empty())
      << case_path << ": missing golden tensors with prefix '" << prefix << "'";
  const size_t vocab = model.config().vocab_size;

  SequenceState seq = model.new_sequence();
  ForwardOptions opts;
  opts.all_logits = true;
  std::vector<std::vector<float>> streams(model.config().n_layers);
  opts.on_layer = [&](int layer, const std::vector<float>& x) {
    streams[layer].insert(streams[layer].end(), x.begin(), x.end());
  };
  // Prefill, in chunks if asked (the result must not depend on the split).
  std::vector<float> got_prefill;
  size_t begin = 0;
  std::vector<int> cuts = prefill_split;
  cuts.push_back(int(prompt.size()));
  for (int cut : cuts) {
    if (size_t(cut) <= begin || size_t(cut) > prompt.size()) continue;
    auto logits = model.forward(seq, std::span(prompt).subspan(begin, cut - begin), opts);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    got_prefill.insert(got_prefill.end(), logits->begin(), logits->end());
    begin = cut;
  }
  Report prefill_report;
  compare_logits(got_prefill, want_prefill, vocab, prefill_report, case_path + " prefill");

  if (check_streams) {
    // Long V4.1 cases store only the last rows of each stream, from `hidden_first_row`.
    size_t first_row = 0;
    if (auto it = (*file)->metadata().find("hidden_first_row"); it != (*file)->metadata().end())
      first_row = std::stoul(it->second);
    for (int l = 0; l < model.config().n_layers; ++l) {
      const auto want = golden::read_floats(**file, "hidden." + std::to_string(l));
      const size_t row = streams[l].size() / prompt.size();
      ASSERT_EQ(want.size() + first_row * row, streams[l].size()) << "layer " << l;
      float max_abs = 0, max_diff = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        max_abs = std::max(max_abs, std::fabs(want[i]));
        max_diff = std::max(max_diff, std::fabs(want[i] - streams[l][first_row * row + i]));
      }
      // The golden streams are stored in bf16: allow its half-ulp (2^-9 relative) on top.
      EXPECT_LE(max_diff, (tol.stream + 1.0f / 256) * max_abs) << case_path << ": residual stream after layer " << l;
    }
  }

  // Decode: feed the golden's greedy tokens one at a time.
  opts.on_layer = nullptr;
  std::vector<float> got_decode;
  for (int32_t id : decode_ids) {
    auto logits = model.forward(seq, std::span<const int32_t>(&id, 1), opts);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    got_decode.insert(got_decode.end(), logits->begin(), logits->end());
  }
  Report decode_report;
  compare_logits(got_decode, want_decode, vocab, decode_report, case_path + " decode");

  std::printf("  %-60s prefill max|dlogit| %.2e (%d pos)  decode %.2e (%d steps)\n", case_path.c_str(),
              prefill_report.max_logit_diff, prefill_report.positions, decode_report.max_logit_diff,
              decode_report.positions);
  EXPECT_LE(prefill_report.max_logit_diff, tol.logit) << case_path << " prefill";
  EXPECT_LE(decode_report.max_logit_diff, tol.logit) << case_path << " decode";
}

std::vector<std::string> case_files(const std::string& arch) {
  std::vector<std::string> out;
  for (int t : {1, 17, 130, 301}) out.push_back(golden::fixture_dir(arch) + "/cases/p" + std::to_string(t) + ".safetensors");
  return out;
}

std::unique_ptr<Model> load(const std::string& arch, Numerics numerics) {
  auto model = load_model(golden::fixture_dir(arch) + "/model", numerics);
  if (!model.ok()) ADD_FAILURE() << model.error().message;
  return model.ok() ? std::move(model.value()) : nullptr;
}

// Transformers runs V4 in float32 without the reference's low-precision steps, so the engine runs
// with Numerics::exact(). What remains is f32 summation order (different loop nests and GEMM
// blocking) amplified through 5 layers: measured max |Δlogit| ≈ 1e-4 for logits of magnitude ~10;
// 1e-3 leaves a 10× margin yet is far below any real bug (wrong rounding, mask or scale moves
// logits by 1e-2 or more).
constexpr Tolerance kExactTolerance{1e-3f, 1e-4f};

TEST(GoldenV4, TransformersFloat32) {
  auto model = load("v4", Numerics::exact());
  ASSERT_TRUE(model);
  for (const auto& path : case_files("v4")) run_case(*model, path, "", kExactTolerance, true);
}

TEST(GoldenV4, ChunkedPrefillMatchesGolden) {
  auto model = load("v4", Numerics::exact());
  ASSERT_TRUE(model);
  // Splits inside a compression group, at group ends and across the 128-token window.
  run_case(*model, case_files("v4")[3], "", kExactTolerance, false, {1, 7, 64, 128, 129, 200});
}

// V4.1 against our PyTorch oracle (Transformers on PyPI has no deepseek_v41). Exact mode: as for V4.
TEST(GoldenV41, OracleExact) {
  auto model = load("v41", Numerics::exact());
  ASSERT_TRUE(model);
  for (const auto& path : case_files("v41")) run_case(*model, path, "", kExactTolerance, true);
}

// Reference numerics (bf16 activations, fp8/fp4 fake quant, the stale index_k quirk) against the
// oracle's reference mode. Both round at the same points (tools/golden/ORACLE_V41.md), but f32
// details inside an op (the summation order of a norm's mean, of a GEMM, of the Engram gate's dot)
// decide which way a value next to a bf16 tie rounds, and this random tiny model amplifies one bf16
// ulp into O(1) logit changes within a layer or two (measured with on_intermediate: one flipped ulp
// in layer 0's residual → 2.1 at that layer's FFN output; the oracle against itself with f64 GEMMs
// agrees on only 88–93% of top-1s at p130/p301). Bit-level agreement is therefore not a meaningful
// target. What is asserted, calibrated on this fixture:
//  - the 1-token prompt (no earlier token to carry a flipped rounding): logits match (4.8e-6
//    measured; the exact mode is 3.2 away);
//  - top-1 agreement over all 577 prefill and decode rows: 69.7% measured, while the engine in exact
//    mode scores 48.5% against the same tensors, so a mode missing the reference's roundings fails.
TEST(GoldenV41, OracleReferenceNumerics) {
  auto model = load("v41", Numerics::reference());
  ASSERT_TRUE(model);
  const size_t vocab = model->config().vocab_size;
  size_t total_agree = 0, total_rows = 0;
  for (const auto& path : case_files("v41")) {
    auto file = SafetensorsFile::open(path);
    ASSERT_TRUE(file.ok());
    const auto prompt = golden::read_ids(**file, "prompt_ids");
    const auto decode_ids = golden::read_ids(**file, "ref.decode_ids");
    std::vector<float> want = golden::read_floats(**file, "ref.prefill_logits");
    const auto want_decode = golden::read_floats(**file, "ref.decode_logits");
    want.insert(want.end(), want_decode.begin(), want_decode.end());
    SequenceState seq = model->new_sequence();
    ForwardOptions opts;
    opts.all_logits = true;
    auto prefill = model->forward(seq, prompt, opts);
    ASSERT_TRUE(prefill.ok()) << prefill.error().message;
    std::vector<float> got = *prefill;
    for (int32_t id : decode_ids) {
      auto step = model->forward(seq, std::span<const int32_t>(&id, 1), opts);
      ASSERT_TRUE(step.ok());
      got.insert(got.end(), step->begin(), step->end());
    }
    ASSERT_EQ(got.size(), want.size());
    const size_t rows = got.size() / vocab;
    size_t agree = 0;
    for (size_t r = 0; r < rows; ++r)
      agree += golden::argmax(got.data() + r * vocab, vocab) == golden::argmax(want.data() + r * vocab, vocab);
    float first_row_diff = 0;
    for (size_t i = 0; i < vocab; ++i) first_row_diff = std::max(first_row_diff, std::fabs(got[i] - want[i]));
    std::printf("  %-60s reference mode: top-1 agreement %zu/%zu, first position max|dlogit| %.2e\n", path.c_str(),
                agree, rows, first_row_diff);
    if (prompt.size() == 1) { EXPECT_LE(first_row_diff, 1e-3f) << path; }
    total_agree += agree;
    total_rows += rows;
  }
  EXPECT_GE(double(total_agree) / double(total_rows), 0.6) << total_agree << "/" << total_rows;
}

// Teacher-forced reference numerics: each layer gets the oracle's own input streams, so a flipped
// rounding cannot compound across layers; inside one layer it still can (a flipped ulp can move an
// FP8 activation scale or a top-k pick). Measured per layer, share of stream values within 2 bf16
// ulps of the oracle's: 94.7% at layer 0 (one of 17 tokens flips inside the layer), 99.6–100% at
// the others. The same check with Numerics::exact() scores 8–40% per layer, so a missing or
// misplaced rounding, quant block or scale fails the 90% bound.
TEST(GoldenV41, ReferenceNumericsPerLayer) {
  auto model = load("v41", Numerics::reference());
  ASSERT_TRUE(model);
  auto file = SafetensorsFile::open(golden::fixture_dir("v41") + "/cases/p17_ref_hidden.safetensors");
  ASSERT_TRUE(file.ok()) << file.error().message;
  const auto prompt = golden::read_ids(**file, "prompt_ids");
  const int n_layers = model->config().n_layers;
  std::vector<std::vector<float>> want(n_layers);
  for (int l = 0; l < n_layers; ++l) want[l] = golden::read_floats(**file, "ref.hidden." + std::to_string(l));
  SequenceState seq = model->new_sequence();
  ForwardOptions opts;
  opts.before_layer = [&](int layer, std::vector<float>& streams) {
    if (layer > 0) streams = want[layer - 1];
  };
  opts.on_layer = [&](int layer, const std::vector<float>& got) {
    ASSERT_EQ(got.size(), want[layer].size());
    size_t close = 0;
    for (size_t i = 0; i < got.size(); ++i)
      close += std::fabs(got[i] - want[layer][i]) <= 2.0f * std::ldexp(std::fabs(want[layer][i]), -8) + 1e-30f;
    const double fraction = double(close) / double(got.size());
    std::printf("  layer %d: %.2f%% of stream values within 2 bf16 ulps\n", layer, 100.0 * fraction);
    EXPECT_GE(fraction, 0.90) << "layer " << layer;
  };
  ASSERT_TRUE(model->forward(seq, prompt, opts).ok());
}

TEST(GoldenV41, ChunkedPrefillMatchesGolden) {
  auto model = load("v41", Numerics::exact());
  ASSERT_TRUE(model);
  // Chunks of at least two tokens: a one-token chunk at an even position completes no ratio-2
  // group, and the reference's stale index_k quirk (on here, as in the golden) then legitimately
  // changes the result. tests/unit/test_model_state.cpp covers every split with the quirk off.
  run_case(*model, case_files("v41")[3], "", kExactTolerance, false, {2, 7, 64, 128, 130, 200});
}

// Prompts with image spans (tools/golden/gen_v41_images.py): image rows in place of the embeddings, bias_vl
// routing and Engram's DEAD positions against the oracle's exact mode, with the tolerance of any exact case.
// The case's metadata records how far the oracle's logits move without each piece (tens of logits), so a
// piece the engine dropped would fail by four orders of magnitude; the engine itself ignoring the image rows
// is checked here too.
class GoldenV41Images : public ::testing::Test {
 protected:
  void SetUp() override {
    model = load("v41", Numerics::exact());
    ASSERT_TRUE(model);
    auto f = SafetensorsFile::open(golden::fixture_dir("v41") + "/cases/images.safetensors");
    ASSERT_TRUE(f.ok()) << f.error().message;
    file = std::move(f.value());
    prompt = golden::read_ids(*file, "prompt_ids");
    const TensorInfo* mask = file->find("is_image");
    ASSERT_TRUE(mask && mask->dtype == DType::U8 && size_t(mask->numel()) == prompt.size());
    is_image.assign(mask->data, mask->data + mask->numel());
    rows = golden::read_floats(*file, "image_rows");
    decode_ids = golden::read_ids(*file, "decode_ids");
    want_prefill = golden::read_floats(*file, "prefill_logits");
    want_decode = golden::read_floats(*file, "decode_logits");
    ASSERT_FALSE(rows.empty() || decode_ids.empty() || want_prefill.empty() || want_decode.empty());
  }

  // Image positions of prompt[begin, end).
  ImagePositions slice(size_t begin, size_t end) const {
    const size_t d = size_t(model->config().d_model);
    const size_t first_row = size_t(std::count(is_image.begin(), is_image.begin() + begin, 1));
    const size_t n_rows = size_t(std::count(is_image.begin() + begin, is_image.begin() + end, 1));
    return {std::span<const uint8_t>(is_image).subspan(begin, end - begin),
            std::span<const float>(rows).subspan(first_row * d, n_rows * d)};
  }

  // Prefill in pieces ending at `ends` (the last = the prompt's length), then the teacher-forced decode.
  void check(const std::vector<size_t>& ends, const std::string& what) {
    const size_t vocab = model->config().vocab_size;
    SequenceState seq = model->new_sequence();
    ForwardOptions opts;
    opts.all_logits = true;
    std::vector<float> got;
    size_t begin = 0;
    for (size_t end : ends) {
      auto piece = model->forward(seq, std::span<const int32_t>(prompt).subspan(begin, end - begin), opts,
                                  slice(begin, end));
      ASSERT_TRUE(piece.ok()) << piece.error().message;
      got.insert(got.end(), piece->begin(), piece->end());
      begin = end;
    }
    Report prefill, decode;
    compare_logits(got, want_prefill, vocab, prefill, what + " prefill");
    got.clear();
    for (int32_t id : decode_ids) {
      auto step = model->forward(seq, std::span<const int32_t>(&id, 1), opts);
      ASSERT_TRUE(step.ok()) << step.error().message;
      got.insert(got.end(), step->begin(), step->end());
    }
    compare_logits(got, want_decode, vocab, decode, what + " decode");
    std::printf("  images %-24s prefill max|dlogit| %.2e, decode %.2e\n", what.c_str(), prefill.max_logit_diff,
                decode.max_logit_diff);
    EXPECT_LE(prefill.max_logit_diff, kExactTolerance.logit) << what;
    EXPECT_LE(decode.max_logit_diff, kExactTolerance.logit) << what;
  }

  std::unique_ptr<Model> model;
  std::unique_ptr<SafetensorsFile> file;
  std::vector<int32_t> prompt, decode_ids;
  std::vector<uint8_t> is_image;
  std::vector<float> rows, want_prefill, want_decode;
};

TEST_F(GoldenV41Images, OneForward) { check({prompt.size()}, "one forward"); }

// Pieces that cut the first image span (positions 10..19) and end right after the second one.
TEST_F(GoldenV41Images, PiecesAcrossAnImageSpan) { check({14, 36, prompt.size()}, "in pieces"); }

TEST_F(GoldenV41Images, EachPieceOfTheImageHandlingMatters) {
  for (const char* piece : {"bias_vl", "engram_mask", "image_rows"}) {
    const auto it = file->metadata().find(std::string("ablation_max_dlogit_") + piece);
    ASSERT_NE(it, file->metadata().end()) << piece;
    EXPECT_GT(std::stof(it->second), 100 * kExactTolerance.logit) << "the oracle without " << piece;
  }
  // The engine without the image positions (their token ids' embeddings, text routing) is far off too.
  SequenceState seq = model->new_sequence();
  ForwardOptions opts;
  opts.all_logits = true;
  auto text_only = model->forward(seq, prompt, opts);
  ASSERT_TRUE(text_only.ok());
  float diff = 0;
  for (size_t i = 0; i < want_prefill.size(); ++i) diff = std::max(diff, std::fabs((*text_only)[i] - want_prefill[i]));
  EXPECT_GT(diff, 100 * kExactTolerance.logit);
}

TEST_F(GoldenV41Images, BadImagePositionsAreRefused) {
  SequenceState seq = model->new_sequence();
  const std::span<const int32_t> toks(prompt);
  ImagePositions short_mask = slice(0, prompt.size());
  short_mask.is_image = short_mask.is_image.first(3);
  auto r = model->forward(seq, toks, {}, short_mask);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("a mask of 3 for 42 tokens"), std::string::npos) << r.error().message;
  ImagePositions few_rows = slice(0, prompt.size());
  few_rows.rows = few_rows.rows.first(few_rows.rows.size() - 1);
  r = model->forward(seq, toks, {}, few_rows);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("row values for 14 image positions"), std::string::npos) << r.error().message;
  seq.keep_rollback = true;
  r = model->forward(seq, toks.first(20), {}, slice(0, 20));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("text only"), std::string::npos) << r.error().message;
  EXPECT_EQ(seq.n_past, 0);  // nothing ran
}

}  // namespace
}  // namespace spw
