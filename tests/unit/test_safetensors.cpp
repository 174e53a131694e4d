// Tests for formats/safetensors.h. Files are written byte by byte here (8-byte little-endian
// header length + JSON + data), then parsed/opened; every malformed case checks that the error
// names the file, the tensor where there is one, and the problem.
#include "formats/safetensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace spw {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> st_bytes(const std::string& json, const std::vector<uint8_t>& data = {}) {
  std::vector<uint8_t> out(8);
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), json.begin(), json.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "spw_safetensors_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Parses `json` as a header; expects an error containing every fragment.
void expect_header_error(const std::string& json, const std::vector<std::string>& fragments) {
  std::vector<uint8_t> bytes = st_bytes(json);
  Result<SafetensorsHeader> header = parse_safetensors_header(bytes.data(), bytes.size(), "bad.safetensors");
  ASSERT_FALSE(header.ok()) << json;
  EXPECT_NE(header.error().message.find("bad.safetensors: "), std::string::npos) << header.error().message;
  for (const std::string& f : fragments) {
    EXPECT_NE(header.error().message.find(f), std::string::npos) << "'" << f << "' not in: " << header.error().message;
  }
}

const std::string kTwoTensors =
    R"({"__metadata__":{"format":"pt"},)"
    R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
    R"("b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}})";

std::vector<uint8_t> two_tensor_data() {
  std::vector<uint8_t> data(16);
  float a[2] = {1.5f, -2.0f};
  std::memcpy(data.data(), a, 8);
  uint16_t b[4] = {0x3f80, 0x4000, 0x4040, 0x4080};  // bf16 1, 2, 3, 4
  std::memcpy(data.data() + 8, b, 8);
  return data;
}

TEST(Safetensors, ParsesValidHeader) {
  std::vector<uint8_t> bytes = st_bytes(kTwoTensors, two_tensor_data());
  Result<SafetensorsHeader> header = parse_safetensors_header(bytes.data(), bytes.size(), "ok.safetensors");
  ASSERT_TRUE(header.ok()) << header.error().message;
  EXPECT_EQ(header->entries.size(), 2u);
  EXPECT_EQ(header->metadata.at("format"), "pt");
  EXPECT_EQ(header->header_nbytes, kTwoTensors.size());
  EXPECT_EQ(header->data_nbytes, 16u);
  EXPECT_EQ(header->entries.at("b").dtype, DType::BF16);
  EXPECT_EQ(header->entries.at("b").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(header->entries.at("b").begin, 8u);
}

TEST(Safetensors, AcceptsScalarsZeroSizeTensorsAndPadding) {
  // A scalar (shape []) has one element; zero-size tensors hold no bytes and overlap nothing;
  // writers pad the header with spaces.
  expect_header_error(R"({"s":{"dtype":"I64","shape":[],"data_offsets":[0,4]}})", {"tensor 's'", "needs 8"});
  std::string json = R"({"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                     R"("z":{"dtype":"F32","shape":[0,5],"data_offsets":[4,4]}}    )";
  std::vector<uint8_t> bytes = st_bytes(json, std::vector<uint8_t>(8));
  Result<SafetensorsHeader> header = parse_safetensors_header(bytes.data(), bytes.size(), "ok.safetensors");
  ASSERT_TRUE(header.ok()) << header.error().message;
  EXPECT_EQ(header->entries.size(), 2u);
}

TEST(Safetensors, RejectsShortFileAndBadLengthPrefix) {
  std::vector<uint8_t> tiny = {1, 2, 3};
  auto r = parse_safetensors_header(tiny.data(), tiny.size(), "tiny.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("tiny.safetensors: file is 3 bytes"), std::string::npos) << r.error().message;

  std::vector<uint8_t> beyond = st_bytes("{}");
  beyond[0] = 200;  // claims 200 header bytes, 2 present
  r = parse_safetensors_header(beyond.data(), beyond.size(), "beyond.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("header length 200 extends beyond the end of the file (10 bytes"),
            std::string::npos)
      << r.error().message;

  std::vector<uint8_t> absurd = st_bytes("{}");
  absurd[7] = 0x7f;  // ~9e18
  r = parse_safetensors_header(absurd.data(), absurd.size(), "absurd.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("exceeds the 100000000-byte limit"), std::string::npos) << r.error().message;
}

TEST(Safetensors, RejectsInvalidJson) {
  expect_header_error(R"({"a":{"dtype":"F32",)", {"header is not valid JSON", "parse error"});
  expect_header_error("", {"header is not valid JSON"});
  expect_header_error(R"({"a":1} trailing)", {"header is not valid JSON"});
}

TEST(Safetensors, RejectsNonObjects) {
  expect_header_error(R"([1,2])", {"header is a JSON array, not an object"});
  expect_header_error(R"({"a":[1,2]})", {"tensor 'a'", "entry is array, not an object"});
  expect_header_error(R"({"a":"x"})", {"tensor 'a'", "entry is string, not an object"});
}

TEST(Safetensors, RejectsMissingUnknownAndMistypedFields) {
  expect_header_error(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", {"tensor 'a'", "'dtype'"});
  expect_header_error(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", {"tensor 'a'", "'shape'"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[1]}})", {"tensor 'a'", "'data_offsets'"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", {"tensor 'a'", "[begin, end]"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})",
                      {"tensor 'a'", "unknown field 'x'"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})",
                      {"tensor 'a'", "shape dimension 1.0 is not a non-negative 64-bit integer"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4.5]}})",
                      {"tensor 'a'", "not non-negative integers"});
}

TEST(Safetensors, RejectsUnknownDtype) {
  expect_header_error(R"({"w":{"dtype":"F8_E5M2","shape":[1],"data_offsets":[0,1]}})",
                      {"tensor 'w'", "unknown dtype 'F8_E5M2'"});
}

TEST(Safetensors, RejectsNegativeAndOverflowingShapes) {
  expect_header_error(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
                      {"tensor 'w'", "shape dimension -1 is not a non-negative 64-bit integer"});
  expect_header_error(R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})",
                      {"tensor 'w'", "not a non-negative 64-bit integer"});
  // numel = 2^62 fits, numel·4 does not.
  expect_header_error(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,4]}})",
                      {"tensor 'w'", "overflows 64-bit element or byte counts"});
  // numel itself overflows: 2^32 · 2^32.
  expect_header_error(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
                      {"tensor 'w'", "overflows"});
}

TEST(Safetensors, RejectsBadOffsets) {
  expect_header_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})",
                      {"tensor 'w'", "data offsets out of order: begin 8 > end 4"});
  expect_header_error(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})",
                      {"tensor 'w'", "data offsets [0, 4) hold 4 bytes but F32 [2] needs 8"});
  expect_header_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})",
                      {"tensor 'w'", "not non-negative integers"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                      {"tensor 'b'", "overlap tensor 'a' at [0, 8)"});
}

TEST(Safetensors, RejectsBadMetadata) {
  expect_header_error(R"({"__metadata__":{"format":1}})", {"'__metadata__' value for 'format' is number, not a string"});
  expect_header_error(R"({"__metadata__":["x"]})", {"'__metadata__' is array, not an object"});
}

TEST(Safetensors, OpensSingleFile) {
  TempDir dir;
  fs::path path = dir.path() / "model.safetensors";
  write_file(path, st_bytes(kTwoTensors, two_tensor_data()));
  auto file = SafetensorsFile::open(path.string());
  ASSERT_TRUE(file.ok()) << file.error().message;
  const TensorInfo* a = (*file)->find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->numel(), 2);
  EXPECT_EQ(a->nbytes, 8u);
  float av[2];
  std::memcpy(av, a->data, 8);
  EXPECT_EQ(av[0], 1.5f);
  EXPECT_EQ(av[1], -2.0f);
  const TensorInfo* b = (*file)->find("b");
  ASSERT_NE(b, nullptr);
  uint16_t b3;
  std::memcpy(&b3, b->data + 6, 2);
  EXPECT_EQ(b3, 0x4080);
  EXPECT_EQ(b->file, path.string());
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_EQ((*file)->find("c"), nullptr);

  auto ckpt = Checkpoint::open(path.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
  EXPECT_EQ(ckpt->tensors().size(), 2u);
  EXPECT_EQ(ckpt->find("a")->data, ckpt->files()[0]->find("a")->data);
}

TEST(Safetensors, TruncatedFileNamesTensorAndDataSection) {
  TempDir dir;
  fs::path path = dir.path() / "model-00002-of-00002.safetensors";
  std::vector<uint8_t> data = two_tensor_data();
  data.resize(12);  // b needs [8, 16)
  write_file(path, st_bytes(kTwoTensors, data));
  auto file = SafetensorsFile::open(path.string());
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.error().message.find("model-00002-of-00002.safetensors: tensor 'b': data offsets [8, 16) exceed "
                                      "data section of 12 bytes"),
            std::string::npos)
      << file.error().message;

  fs::path cut = dir.path() / "cut.safetensors";
  std::vector<uint8_t> bytes = st_bytes(kTwoTensors);
  bytes.resize(40);  // inside the JSON header
  write_file(cut, bytes);
  file = SafetensorsFile::open(cut.string());
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.error().message.find("cut.safetensors: header length"), std::string::npos) << file.error().message;

  fs::path empty = dir.path() / "empty.safetensors";
  write_file(empty, {});
  file = SafetensorsFile::open(empty.string());
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.error().message.find("file is 0 bytes"), std::string::npos) << file.error().message;
}

TEST(Safetensors, HeaderOnlyFileNeedsAllowMissingData) {
  TempDir dir;
  fs::path path = dir.path() / "header_only.safetensors";
  write_file(path, st_bytes(kTwoTensors));
  auto strict = SafetensorsFile::open(path.string());
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.error().message.find("exceed data section of 0 bytes"), std::string::npos);
  auto lenient = SafetensorsFile::open(path.string(), OpenOptions{.allow_missing_data = true});
  ASSERT_TRUE(lenient.ok()) << lenient.error().message;
  EXPECT_EQ((*lenient)->find("a")->data, nullptr);
  EXPECT_EQ((*lenient)->find("b")->nbytes, 8u);
}

TEST(Safetensors, MissingPathAndEmptyDirectory) {
  TempDir dir;
  auto missing = Checkpoint::open((dir.path() / "nope").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("no such file"), std::string::npos);
  auto empty = Checkpoint::open(dir.path().string());
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message.find("no model.safetensors.index.json and no *.safetensors"), std::string::npos);
}

// Two shards: s1 holds x (F32 [1]) and y (U8 [3]); s2 holds z (I16 [2]).
void write_two_shards(const fs::path& dir) {
  write_file(dir / "s1.safetensors", st_bytes(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                              R"("y":{"dtype":"U8","shape":[3],"data_offsets":[4,7]}})",
                                              {0, 0, 128, 63, 7, 8, 9}));
  write_file(dir / "s2.safetensors",
             st_bytes(R"({"z":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}})", {1, 0, 2, 0}));
}

TEST(Safetensors, OpensShardedCheckpointWithIndex) {
  TempDir dir;
  write_two_shards(dir.path());
  write_text(dir.path() / "model.safetensors.index.json",
             R"({"metadata":{"total_size":11},"weight_map":{"x":"s1.safetensors","y":"s1.safetensors",)"
             R"("z":"s2.safetensors"}})");
  // A stray file the index does not name is ignored, even though it would collide.
  write_file(dir.path() / "stray.safetensors", st_bytes(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", {0}));
  auto ckpt = Checkpoint::open(dir.path().string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
  EXPECT_EQ(ckpt->files().size(), 2u);
  EXPECT_EQ(ckpt->tensors().size(), 3u);
  float x;
  std::memcpy(&x, ckpt->find("x")->data, 4);
  EXPECT_EQ(x, 1.0f);
  EXPECT_EQ(ckpt->find("y")->data[2], 9);
  EXPECT_EQ(fs::path(ckpt->find("z")->file).filename(), "s2.safetensors");
  EXPECT_EQ(ckpt->find("w"), nullptr);
}

TEST(Safetensors, OpensDirectoryWithoutIndex) {
  TempDir dir;
  write_two_shards(dir.path());
  auto ckpt = Checkpoint::open(dir.path().string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
  EXPECT_EQ(ckpt->files().size(), 2u);
  EXPECT_EQ(ckpt->tensors().size(), 3u);

  write_file(dir.path() / "s3.safetensors", st_bytes(R"({"z":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", {0}));
  auto dup = Checkpoint::open(dir.path().string());
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.error().message.find("s3.safetensors: tensor 'z' is also in"), std::string::npos)
      << dup.error().message;
}

TEST(Safetensors, IndexNamingMissingShard) {
  TempDir dir;
  write_two_shards(dir.path());
  write_text(dir.path() / "model.safetensors.index.json",
             R"({"weight_map":{"x":"s1.safetensors","y":"s1.safetensors","z":"s9.safetensors"}})");
  auto ckpt = Checkpoint::open(dir.path().string());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.error().message.find("model.safetensors.index.json: names shard 's9.safetensors', which does not exist"),
            std::string::npos)
      << ckpt.error().message;
}

TEST(Safetensors, IndexNamingTensorAbsentFromShard) {
  TempDir dir;
  write_two_shards(dir.path());
  write_text(dir.path() / "model.safetensors.index.json",
             R"({"weight_map":{"x":"s1.safetensors","y":"s1.safetensors","z":"s2.safetensors",)"
             R"("layers.3.attn.wkv.weight":"s2.safetensors"}})");
  auto ckpt = Checkpoint::open(dir.path().string());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.error().message.find("tensor 'layers.3.attn.wkv.weight' is mapped to shard 's2.safetensors', which "
                                      "does not contain it"),
            std::string::npos)
      << ckpt.error().message;

  // The same tensor mapped to the wrong shard.
  write_text(dir.path() / "model.safetensors.index.json",
             R"({"weight_map":{"x":"s1.safetensors","y":"s2.safetensors","z":"s2.safetensors"}})");
  ckpt = Checkpoint::open(dir.path().string());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.error().message.find("tensor 'y' is mapped to shard 's2.safetensors'"), std::string::npos)
      << ckpt.error().message;
}

TEST(Safetensors, ShardTensorMissingFromIndex) {
  TempDir dir;
  write_two_shards(dir.path());
  write_text(dir.path() / "model.safetensors.index.json", R"({"weight_map":{"x":"s1.safetensors","z":"s2.safetensors"}})");
  auto ckpt = Checkpoint::open(dir.path().string());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.error().message.find("s1.safetensors: tensor 'y' is not named by"), std::string::npos)
      << ckpt.error().message;
}

TEST(Safetensors, BadIndexFiles) {
  TempDir dir;
  write_two_shards(dir.path());
  fs::path index = dir.path() / "model.safetensors.index.json";
  write_text(index, "{not json");
  auto ckpt = Checkpoint::open(dir.path().string());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.error().message.find("model.safetensors.index.json: not valid JSON"), std::string::npos);

  write_text(index, R"({"metadata":{}})");
  ckpt = Checkpoint::open(dir.path().string());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.error().message.find("missing or non-object 'weight_map'"), std::string::npos);

  write_text(index, R"({"weight_map":{"x":"../s1.safetensors"}})");
  ckpt = Checkpoint::open(dir.path().string());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.error().message.find("names '../s1.safetensors', which is not a plain file name"), std::string::npos)
      << ckpt.error().message;
}

TEST(Safetensors, CheckpointOpenPropagatesShardErrors) {
  TempDir dir;
  write_file(dir.path() / "bad.safetensors", st_bytes(R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", {0}));
  auto ckpt = Checkpoint::open(dir.path().string());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.error().message.find("bad.safetensors: tensor 'w': unknown dtype 'Q4'"), std::string::npos)
      << ckpt.error().message;
}

TEST(Safetensors, HeaderOnlyShardedCheckpoint) {
  TempDir dir;
  write_file(dir.path() / "a.safetensors", st_bytes(R"({"big":{"dtype":"F8_E4M3","shape":[384006168,256],)"
                                                    R"("data_offsets":[0,98305579008]}})"));
  write_text(dir.path() / "model.safetensors.index.json", R"({"weight_map":{"big":"a.safetensors"}})");
  EXPECT_FALSE(Checkpoint::open(dir.path().string()).ok());
  auto ckpt = Checkpoint::open(dir.path().string(), OpenOptions{.allow_missing_data = true});
  ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
  EXPECT_EQ(ckpt->find("big")->nbytes, 98305579008u);
  EXPECT_EQ(ckpt->find("big")->numel(), 98305579008);
  EXPECT_EQ(ckpt->find("big")->data, nullptr);
}

}  // namespace
}  // namespace spw
