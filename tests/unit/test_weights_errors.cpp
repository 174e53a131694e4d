// load_model on damaged checkpoints: the tiny fixture models are copied to a temp directory and
// broken in one way each (config that no longer matches, index entry removed, tensor removed,
// shard truncated or missing, dtype/shape changed in a header, out-of-range routing table,
// missing Engram token map). Each must come back as an Error that names the file and the tensor
// or field at fault — never a crash (docs/STYLE.md rule 7).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/model.h"

namespace spw {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* kShard1 = "model-00001-of-00002.safetensors";
const char* kShard2 = "model-00002-of-00002.safetensors";

fs::path fixture_model(const std::string& arch) {
  return fs::path(SPW_SOURCE_DIR) / "tests/golden/fixtures" / arch / "model";
}

// A private copy of a fixture model, removed at the end of the test.
class ModelCopy {
 public:
  explicit ModelCopy(const std::string& arch) {
    std::string tmpl = (fs::temp_directory_path() / "spw_weights_errors_XXXXXX").string();
    root_ = ::mkdtemp(tmpl.data());
    dir_ = root_ / "model";
    fs::copy(fixture_model(arch), dir_, fs::copy_options::recursive);
  }
  ~ModelCopy() { fs::remove_all(root_); }
  const fs::path& dir() const { return dir_; }
  fs::path file(const std::string& name) const { return dir_ / name; }

 private:
  fs::path root_, dir_;
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

json read_json(const fs::path& p) { return json::parse(read_text(p)); }
void write_json(const fs::path& p, const json& j) { write_text(p, j.dump(2)); }

// A safetensors file in memory: the JSON header and the data section.
struct Safetensors {
  json header;
  std::string data;

  static Safetensors read(const fs::path& p) {
    std::string bytes = read_text(p);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[i])) << (8 * i);
    return {json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
  }
  void write(const fs::path& p) const {
    const std::string h = header.dump();
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = char((uint64_t(h.size()) >> (8 * i)) & 0xff);
    write_text(p, out + h + data);
  }
  // Removes a tensor and its bytes, repacking the others contiguously.
  void remove(const std::string& name) {
    ASSERT_TRUE(header.contains(name)) << name;
    header.erase(name);
    std::string packed;
    for (auto& [key, entry] : header.items()) {
      if (key == "__metadata__") continue;
      const uint64_t b = entry["data_offsets"][0], e = entry["data_offsets"][1];
      const uint64_t nb = packed.size();
      packed += data.substr(b, e - b);
      entry["data_offsets"] = {nb, nb + (e - b)};
    }
    data = std::move(packed);
  }
  // The bytes of one tensor, writable.
  char* bytes_of(const std::string& name) {
    const uint64_t b = header.at(name)["data_offsets"][0];
    return data.data() + b;
  }
};

// load_model must fail; its message must contain every fragment.
void expect_load_error(const fs::path& dir, const std::vector<std::string>& fragments) {
  auto r = load_model(dir.string(), Numerics::exact());
  ASSERT_FALSE(r.ok()) << "loaded a damaged checkpoint: " << dir;
  const std::string& msg = r.error().message;
  for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
}

TEST(WeightsErrors, UndamagedCopiesLoad) {
  for (const char* arch : {"v4", "v41"}) {
    ModelCopy m(arch);
    auto r = load_model(m.dir().string(), Numerics::exact());
    ASSERT_TRUE(r.ok()) << arch << ": " << r.error().message;  // so the failures below are the damage's
  }
}

TEST(WeightsErrors, ConfigNoLongerMatchesShapes) {
  ModelCopy m("v4");
  json c = read_json(m.file("config.json"));
  c["hidden_size"] = 512;
  write_json(m.file("config.json"), c);
  // The first tensor checked is the embedding [vocab, hidden].
  expect_load_error(m.dir(), {kShard1, "'embed.weight'", "shape [512, 256]", "expected [512, 512]", "config.json"});
}

TEST(WeightsErrors, ConfigAsksForMoreExperts) {
  ModelCopy m("v4");
  json c = read_json(m.file("config.json"));
  c["n_routed_experts"] = 9;  // the checkpoint has experts 0..7 and a router of 8 rows
  write_json(m.file("config.json"), c);
  expect_load_error(m.dir(), {"'layers.0.ffn.gate.weight'", "shape [8, 256]", "expected [9, 256]"});
}

TEST(WeightsErrors, EntryRemovedFromIndex) {
  ModelCopy m("v4");
  json idx = read_json(m.file("model.safetensors.index.json"));
  idx["weight_map"].erase("layers.3.attn.attn_sink");
  write_json(m.file("model.safetensors.index.json"), idx);
  // The shard still holds a tensor the authoritative index does not name.
  expect_load_error(m.dir(), {kShard2, "layers.3.attn.attn_sink"});
}

TEST(WeightsErrors, TensorRemovedFromShardAndIndex) {
  ModelCopy m("v4");
  auto st = Safetensors::read(m.file(kShard2));
  st.remove("layers.3.attn.attn_sink");
  st.write(m.file(kShard2));
  json idx = read_json(m.file("model.safetensors.index.json"));
  idx["weight_map"].erase("layers.3.attn.attn_sink");
  write_json(m.file("model.safetensors.index.json"), idx);
  expect_load_error(m.dir(), {"missing tensor 'layers.3.attn.attn_sink'", "expected [4]"});
}

TEST(WeightsErrors, TensorRemovedFromShardOnly) {
  ModelCopy m("v4");
  auto st = Safetensors::read(m.file(kShard1));
  st.remove("layers.0.attn.attn_sink");
  st.write(m.file(kShard1));
  // The index still names it: the index promises a tensor the shard lacks.
  expect_load_error(m.dir(), {kShard1, "layers.0.attn.attn_sink"});
}

TEST(WeightsErrors, TruncatedShard) {
  ModelCopy m("v4");
  const auto size = fs::file_size(m.file(kShard2));
  fs::resize_file(m.file(kShard2), size - 1000);
  expect_load_error(m.dir(), {kShard2});
  fs::resize_file(m.file(kShard2), 5);  // shorter than the 8-byte header length
  expect_load_error(m.dir(), {kShard2});
}

TEST(WeightsErrors, MissingShard) {
  ModelCopy m("v4");
  fs::remove(m.file(kShard1));
  expect_load_error(m.dir(), {kShard1});
}

TEST(WeightsErrors, MissingConfig) {
  ModelCopy m("v4");
  fs::remove(m.file("config.json"));
  expect_load_error(m.dir(), {"config.json"});
}

TEST(WeightsErrors, DtypeChangedInHeader) {
  ModelCopy m("v4");
  auto st = Safetensors::read(m.file(kShard2));
  // F32 → I32: same byte size, so the header stays self-consistent; only the dtype is wrong.
  st.header["layers.3.attn.attn_sink"]["dtype"] = "I32";
  st.write(m.file(kShard2));
  expect_load_error(m.dir(), {kShard2, "'layers.3.attn.attn_sink'", "dtype I32", "expected F32"});
}

TEST(WeightsErrors, Fp8WeightStoredAsBf16) {
  ModelCopy m("v4");
  auto st = Safetensors::read(m.file(kShard1));
  // An fp8 weight declared BF16 with a halved row count (same bytes): wrong dtype for an FP8 linear.
  auto& e = st.header["layers.0.attn.wq_a.weight"];
  ASSERT_EQ(e["dtype"], "F8_E4M3");
  const int64_t rows = e["shape"][0], cols = e["shape"][1];
  e["dtype"] = "BF16";
  e["shape"] = {rows / 2, cols};
  st.write(m.file(kShard1));
  expect_load_error(m.dir(), {kShard1, "'layers.0.attn.wq_a.weight'", "dtype BF16", "F8_E4M3"});
}

TEST(WeightsErrors, ShapeChangedInHeader) {
  ModelCopy m("v4");
  auto st = Safetensors::read(m.file(kShard1));
  auto& e = st.header["layers.0.attn_norm.weight"];
  ASSERT_EQ(e["shape"], json({256}));
  e["shape"] = {16, 16};  // same element count
  st.write(m.file(kShard1));
  expect_load_error(m.dir(), {kShard1, "'layers.0.attn_norm.weight'", "shape [16, 16]", "expected [256]"});
}

TEST(WeightsErrors, HashRouteToMissingExpert) {
  ModelCopy m("v4");
  auto st = Safetensors::read(m.file(kShard1));
  ASSERT_EQ(st.header["layers.0.ffn.gate.tid2eid"]["dtype"], "I64");
  const int64_t bad = 99;  // only experts 0..7 exist
  std::memcpy(st.bytes_of("layers.0.ffn.gate.tid2eid") + 8 * 5, &bad, 8);
  st.write(m.file(kShard1));
  expect_load_error(m.dir(), {kShard1, "'layers.0.ffn.gate.tid2eid'", "expert 99", "0..7"});
}

TEST(WeightsErrors, V41MissingEngramTokenMap) {
  ModelCopy m("v41");
  fs::remove(m.file("engram_token_map.safetensors"));
  expect_load_error(m.dir(), {"engram_token_map.safetensors", "missing"});
}

TEST(WeightsErrors, V41EngramTokenMapOutOfRange) {
  ModelCopy m("v41");
  auto st = Safetensors::read(m.file("engram_token_map.safetensors"));
  const int32_t bad = 522;  // engram_compressed_vocab_size = 522 → valid classes 0..521
  std::memcpy(st.bytes_of("engram_token_map") + 4 * 17, &bad, 4);
  st.write(m.file("engram_token_map.safetensors"));
  expect_load_error(m.dir(), {"engram_token_map.safetensors", "522", "engram_compressed_vocab_size"});
}

TEST(WeightsErrors, V41EngramRowsDisagreeWithHashPrimes) {
  ModelCopy m("v41");
  json c = read_json(m.file("config.json"));
  c["text_config"]["engram_num_embeddings"] = {6127, 6332};
  write_json(m.file("config.json"), c);
  // The table's declared rows no longer match the config: caught at the tensor.
  expect_load_error(m.dir(), {"model.safetensors", "layers.1.engram.embed.weight", "expected [6127, 64]"});
}

TEST(WeightsErrors, V41PrefixedTensorMissing) {
  ModelCopy m("v41");
  auto st = Safetensors::read(m.file("model.safetensors"));
  st.remove("model.layers.8.attn.indexer.weights_proj.weight");
  st.write(m.file("model.safetensors"));
  // Names are looked up with and without the "model." prefix; the error uses the released name.
  expect_load_error(m.dir(), {"missing tensor 'layers.8.attn.indexer.weights_proj.weight'"});
}

}  // namespace
}  // namespace spw
