// `spillway quantize` end to end on the demo model (a few experts, few calibration tokens, so it
// stays fast): the pack loads and its EXL3 experts equal the reference decode, a resumed run
// writes byte-identical files, and user errors come back as clear messages.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "formats/exl3.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "quantize/calibration.h"
#include "quantize/quantize_model.h"
#include "quantize/safetensors_writer.h"

namespace fs = std::filesystem;

namespace spw::quant {
namespace {

const std::string kDemo = std::string(SPW_SOURCE_DIR) + "/models/demo";

std::string fresh_dir(const std::string& name) {
  const std::string d = testing::TempDir() + "/spw_quantize_" + name;
  fs::remove_all(d);
  return d;
}

std::string calibration_file() {
  const std::string path = testing::TempDir() + "/spw_quantize_calibration.txt";
  std::ofstream out(path);
  for (int i = 0; i < 12; ++i)
    out << "def f" << i << "(x, y=" << i << "):\n    \"\"\"Return the sum of x and y.\"\"\"\n    return x + y * " << i
        << "\n\nclass Point:\n    def __init__(self, a, b):\n        self.a = a\n        self.b = b\n\n";
  return path;
}

QuantizeModelOptions small_options(const std::string& out) {
  QuantizeModelOptions o;
  o.model_dir = kDemo;
  o.out_dir = out;
  o.bits = 2;
  o.calibration = calibration_file();
  o.calibration_tokens = 96;
  o.row_tokens = 48;
  o.prior_sample_tokens = 48;
  o.layers = {9};
  o.experts = {0};
  o.threads = 2;
  o.progress = false;
  return o;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every file of pack a (shards, index, configs, tokenizer; not quantize_report.json, which holds timings) is
// byte-identical to the same file of pack b, and there are enough of them to be a whole pack.
void expect_same_pack_files(const std::string& a, const std::string& b) {
  int compared = 0;
  for (const auto& e : fs::directory_iterator(a)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == "quantize_report.json") continue;
    EXPECT_EQ(read_file(e.path()), read_file(fs::path(b) / name)) << name;
    ++compared;
  }
  EXPECT_GE(compared, 8) << a;
}

TEST(Exl3QuantizePack, PackLoadsWithDecodedExperts) {
  const std::string out = fresh_dir("pack");
  auto r = quantize_model(small_options(out));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->complete);
  EXPECT_EQ(r->tensors, 3);
  for (const char* f : {"config.json", "quantization_config.json", "model.safetensors.index.json", "tokenizer.json",
                        "engram_token_map.safetensors", "quantize_report.json"})
    EXPECT_TRUE(fs::exists(out + "/" + f)) << f;
  auto cfg = nlohmann::json::parse(read_file(out + "/config.json"));
  auto qc = exl3_parse_quant_config(cfg["quantization_config"]);
  ASSERT_TRUE(qc.ok()) << qc.error().message;
  EXPECT_EQ(qc->codebook, Exl3Codebook::kMul1);
  EXPECT_EQ(cfg["quantization_config"]["original_quantization_config"]["quant_method"], "fp8");
  auto side = nlohmann::json::parse(read_file(out + "/quantization_config.json"));
  EXPECT_EQ(side["tensor_storage"]["model.layers.9.ffn.experts.0.w2"]["bits_per_weight"], 2);

  auto config = read_model_config(out);
  ASSERT_TRUE(config.ok()) << config.error().message;
  auto w = load_weights(out, *config);
  ASSERT_TRUE(w.ok()) << w.error().message;
  auto src = load_weights(kDemo, *config);
  ASSERT_TRUE(src.ok());
  auto ck = Checkpoint::open(out);
  ASSERT_TRUE(ck.ok());
  auto t = exl3_load(*ck, "model.layers.9.ffn.experts.0.w2");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->bits.k_x2, 4);
  const std::vector<float> ref = exl3_weight_ref(*t);  // [k = d_expert][n = d_model]
  const Linear& l = (*w)->layers[9].experts[0].w2;     // [d_model][d_expert]
  ASSERT_EQ(l.n_out, config->d_model);
  for (int o = 0; o < l.n_out; ++o)
    for (int i = 0; i < l.n_in; ++i) ASSERT_EQ(l.w[size_t(o) * l.n_in + i], ref[size_t(i) * t->n + o]);
  // Unselected experts and other layers are copied unchanged.
  EXPECT_EQ((*w)->layers[9].experts[1].w1.w, (*src)->layers[9].experts[1].w1.w);
  EXPECT_EQ((*w)->layers[8].experts[0].w3.w, (*src)->layers[8].experts[0].w3.w);
  // And the model runs.
  auto model = load_model(out, Numerics::reference());
  ASSERT_TRUE(model.ok()) << model.error().message;
  SequenceState seq = (*model)->new_sequence();
  std::vector<int32_t> toks{0, 17, 42, 99, 5};
  auto logits = (*model)->forward(seq, toks);
  ASSERT_TRUE(logits.ok());
  for (float v : *logits) ASSERT_TRUE(std::isfinite(v));
}

// --sigma-reg reaches every candidate of every tensor (the search keeps one of them, so each tensor reports it),
// is recorded in the pack's config, and changes the quantization (a different damping, a different LDL).
TEST(Exl3QuantizePack, SigmaRegReachesEveryCandidate) {
  const std::string a = fresh_dir("sigma_default"), b = fresh_dir("sigma_exllamav3");
  auto ra = quantize_model(small_options(a));
  ASSERT_TRUE(ra.ok()) << ra.error().message;
  QuantizeModelOptions ob = small_options(b);
  ob.sigma_reg = 0.025;
  auto rb = quantize_model(ob);
  ASSERT_TRUE(rb.ok()) << rb.error().message;
  for (const auto& [dir, sigma] : {std::pair{a, 1.0}, std::pair{b, 0.025}}) {
    auto report = nlohmann::json::parse(read_file(dir + "/quantize_report.json"));
    ASSERT_EQ(report["tensors"].size(), 3u) << dir;
    for (const auto& t : report["tensors"]) {
      EXPECT_FALSE(t["identity_fallback"].get<bool>()) << t["name"];
      EXPECT_EQ(t["sigma_reg"].get<double>(), sigma) << t["name"];
    }
    auto cfg = nlohmann::json::parse(read_file(dir + "/config.json"));
    EXPECT_EQ(cfg["quantization_config"]["spillway"]["sigma_reg"].get<double>(), sigma) << dir;
  }
  const std::string shard = "/model-00002-of-00002.safetensors";
  EXPECT_NE(read_file(a + shard), read_file(b + shard));
}

// --calibration-memory bounds the Hessian accumulators held at once: with room for 3 experts instead of all 32 the
// layer's Hessians are collected in 11 groups, and the Hessian file and the pack are byte-identical (an expert's
// accumulation does not depend on which others are collected with it); a budget below one expert is refused before
// any work with a message that names the ways out.
TEST(Exl3QuantizePack, CalibrationInExpertGroupsIsIdentical) {
  auto config = read_model_config(kDemo);
  ASSERT_TRUE(config.ok()) << config.error().message;
  auto ck = Checkpoint::open(kDemo);
  ASSERT_TRUE(ck.ok()) << ck.error().message;
  const CalibrationMemory mem = calibration_memory(*config, *ck, 96, 48, false, 2);
  EXPECT_LT(calibration_memory(*config, *ck, 96, 48, true, 2).per_expert, mem.per_expert);  // no per-expert gate/up
  const double gib = double(1ull << 30);
  const std::string all = fresh_dir("groups_all"), three = fresh_dir("groups_three");
  QuantizeModelOptions oa = small_options(all);
  oa.experts = {0, 17};
  oa.keep_hessians = true;
  oa.calibration_memory_gib = 1.0;  // every expert at once
  auto ra = quantize_model(oa);
  ASSERT_TRUE(ra.ok()) << ra.error().message;
  QuantizeModelOptions ob = small_options(three);
  ob.experts = {0, 17};
  ob.keep_hessians = true;
  ob.calibration_memory_gib = 3.5 * double(mem.per_expert) / gib;
  auto rb = quantize_model(ob);
  ASSERT_TRUE(rb.ok()) << rb.error().message;
  expect_same_pack_files(three, all);
  const std::string hessians = "/.quantize-work/hessians/layer-9.safetensors";
  ASSERT_TRUE(fs::exists(all + hessians));
  EXPECT_EQ(read_file(three + hessians), read_file(all + hessians));
  QuantizeModelOptions oc = small_options(fresh_dir("groups_none"));
  oc.calibration_memory_gib = 0.5 * double(mem.per_expert) / gib;
  auto rc = quantize_model(oc);
  ASSERT_FALSE(rc.ok());
  EXPECT_NE(rc.error().message.find("does not fit in memory"), std::string::npos) << rc.error().message;
  EXPECT_NE(rc.error().message.find("--gate-up-shared"), std::string::npos) << rc.error().message;
}

// Layers 8 and 9 of `o`, stopped after one (--max-layers 1): one layer quantized, the pack incomplete. Leaves
// o.layers = {8, 9} and o.max_layers = 1 for the caller to change.
void quantize_first_of_two_layers(QuantizeModelOptions& o) {
  o.layers = {8, 9};
  o.max_layers = 1;
  auto r = quantize_model(o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FALSE(r->complete);
  EXPECT_EQ(r->layers_quantized, 1);
}

// The streamed calibration interleaves calibration and quantization: stopped after one of two layers, a calibrated
// run leaves the quantized layer's shard (its Hessian file deleted) and the other layer's Hessians on disk; the resumed
// run quantizes that layer from them, and the pack equals an uninterrupted run's.
TEST(Exl3QuantizePack, CalibratedResumeUsesTheSavedHessians) {
  const std::string a = fresh_dir("cal_resume_a"), b = fresh_dir("cal_resume_b");
  QuantizeModelOptions oa = small_options(a);
  ASSERT_NO_FATAL_FAILURE(quantize_first_of_two_layers(oa));
  EXPECT_FALSE(fs::exists(a + "/.quantize-work/hessians/layer-8.safetensors")) << "quantized: its Hessians are deleted";
  ASSERT_TRUE(fs::exists(a + "/.quantize-work/hessians/layer-9.safetensors")) << "not quantized: kept for the resume";
  oa.max_layers = -1;
  auto r2 = quantize_model(oa);
  ASSERT_TRUE(r2.ok()) << r2.error().message;
  EXPECT_TRUE(r2->complete);
  EXPECT_EQ(r2->layers_skipped, 1);
  EXPECT_EQ(r2->layers_quantized, 1);
  EXPECT_FALSE(fs::exists(a + "/.quantize-work/hessians")) << "a complete pack keeps no Hessians without --keep-hessians";
  QuantizeModelOptions ob = small_options(b);
  ob.layers = {8, 9};
  auto r3 = quantize_model(ob);
  ASSERT_TRUE(r3.ok()) << r3.error().message;
  expect_same_pack_files(b, a);
}

TEST(Exl3QuantizePack, ResumedRunIsByteIdentical) {
  const std::string a = fresh_dir("resume_a"), b = fresh_dir("resume_b");
  // Uncalibrated to keep the test fast; calibrated runs resume from the same per-layer files
  // plus the cached Hessians (.quantize-work/hessians).
  QuantizeModelOptions oa = small_options(a);
  oa.identity_hessian = true;
  ASSERT_NO_FATAL_FAILURE(quantize_first_of_two_layers(oa));
  oa.max_layers = -1;
  oa.threads = 1;  // a different thread count must not change the bytes
  auto r2 = quantize_model(oa);
  ASSERT_TRUE(r2.ok()) << r2.error().message;
  EXPECT_TRUE(r2->complete);
  EXPECT_EQ(r2->layers_skipped, 1);
  EXPECT_EQ(r2->layers_quantized, 1);
  QuantizeModelOptions ob = small_options(b);
  ob.identity_hessian = true;
  ob.layers = {8, 9};
  auto r3 = quantize_model(ob);
  ASSERT_TRUE(r3.ok()) << r3.error().message;
  expect_same_pack_files(b, a);
  // Other settings into the same directory are refused.
  oa.bits = 3;
  auto r4 = quantize_model(oa);
  ASSERT_FALSE(r4.ok());
  EXPECT_NE(r4.error().message.find("other settings"), std::string::npos) << r4.error().message;
}

TEST(Exl3QuantizePack, ClearErrors) {
  const std::string out = fresh_dir("errors");
  QuantizeModelOptions o = small_options(out);
  for (int bad : {0, 9}) {
    o.bits = bad;
    auto r = quantize_model(o);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("--bits"), std::string::npos) << r.error().message;
  }
  o = small_options(out);
  o.calibration = out + "/no-such-file.txt";
  auto r = quantize_model(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("not found"), std::string::npos) << r.error().message;

  o = small_options(out);
  const std::string file_out = testing::TempDir() + "/spw_quantize_a_file";
  std::ofstream(file_out) << "x";
  o.out_dir = file_out;
  r = quantize_model(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("not a directory"), std::string::npos) << r.error().message;

  // A source checkpoint without one routed expert tensor.
  const std::string broken = fresh_dir("broken_src");
  fs::create_directories(broken);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json", "engram_token_map.safetensors"})
    fs::copy_file(kDemo + "/" + f, broken + "/" + f);
  auto src = SafetensorsFile::open(kDemo + "/model.safetensors");
  ASSERT_TRUE(src.ok());
  SafetensorsWriter wr;
  for (const auto& [name, t] : (*src)->tensors())
    if (name != "model.layers.9.ffn.experts.0.w2.weight") wr.add_raw(name, t.dtype, t.shape, t.data, t.nbytes);
  ASSERT_TRUE(wr.write(broken + "/model.safetensors").ok());
  o = small_options(out);
  o.model_dir = broken;
  r = quantize_model(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("layers.9.ffn.experts.0.w2"), std::string::npos) << r.error().message;
}

TEST(Exl3QuantizePack, WriterReportsAFullDisk) {
  SafetensorsWriter wr;
  std::vector<uint8_t> bytes(1 << 16, 1);
  wr.add_raw("x", DType::U8, {int64_t(bytes.size())}, bytes.data(), bytes.size());
  auto st = wr.write("/dev/full", false);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("No space left"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace spw::quant
