// Image decoders (src/vision/image_decode.h) against Pillow's Image.open(...).convert("RGB") on the
// fixtures tools/vision/make_processor_goldens.py wrote (PNG: RGB, RGBA, grey, grey+alpha, palette
// with tRNS, 1-bit, 16-bit grey, 16-bit RGB; JPEG: 4:2:0, 4:4:4, grey, progressive; WebP: lossy,
// lossless with alpha, animated; GIF: palette, transparent, animated, interlaced), and every error.
//
// Tolerance: lossless formats exact (alpha dropped, not composited, as Pillow's convert("RGB")).
// JPEG and lossy WebP: allowed 2 levels per channel, because Pillow's wheels bundle newer
// libjpeg-turbo / libwebp than Debian 12 ships and their IDCT / YUV→RGB code could round
// differently; measured with Pillow 13.0.0 against Debian 12's libraries: 0 (printed per file).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "vision/image_decode.h"
#include "vision_synth.h"

namespace spw::vision {
namespace {

using nlohmann::json;

std::vector<uint8_t> fixture(const std::string& name) { return test::read_bytes(test::kVisionData + "decode/" + name); }

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = uint8_t(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

bool lossy(const std::string& name) { return name.ends_with(".jpg") || name == "lossy.webp"; }

TEST(VisionDecode, MatchesPillowOnEveryFixture) {
  const json goldens = json::parse(test::read_file(test::kVisionData + "decode_goldens.json"));
  ASSERT_GE(goldens["files"].size(), 19u);
  for (const auto& [name, want] : goldens["files"].items()) {
    SCOPED_TRACE(name);
    auto image = decode_image(fixture(name));
    ASSERT_TRUE(image.ok()) << image.error().message;
    ASSERT_EQ(image->width, want["width"].get<int>());
    ASSERT_EQ(image->height, want["height"].get<int>());
    const std::vector<uint8_t> pillow = from_hex(want["rgb_hex"]);
    ASSERT_EQ(image->rgb.size(), pillow.size());
    int max_diff = 0;
    for (size_t i = 0; i < pillow.size(); ++i) max_diff = std::max(max_diff, std::abs(int(image->rgb[i]) - pillow[i]));
    if (lossy(name)) {
      std::printf("%-20s max |ours - Pillow| = %d\n", name.c_str(), max_diff);
      EXPECT_LE(max_diff, 2);
    } else {
      EXPECT_EQ(max_diff, 0) << "Pillow mode " << want["mode"];
    }
  }
}

TEST(VisionDecode, SniffsFormatFromBytesNotNames) {
  EXPECT_EQ(sniff_image_format(fixture("rgb.png")), ImageFormat::png);
  EXPECT_EQ(sniff_image_format(fixture("gray.jpg")), ImageFormat::jpeg);
  EXPECT_EQ(sniff_image_format(fixture("lossy.webp")), ImageFormat::webp);
  EXPECT_EQ(sniff_image_format(fixture("palette.gif")), ImageFormat::gif);
  const std::vector<uint8_t> bmp = {'B', 'M', 0, 0, 0, 0};
  EXPECT_FALSE(sniff_image_format(bmp));
  EXPECT_EQ(guess_other_format(bmp), "BMP");
}

void expect_error(const std::vector<uint8_t>& bytes, const std::string& says, const ImageLimits& limits = {}) {
  auto r = decode_image(bytes, limits);
  ASSERT_FALSE(r.ok()) << "decoded a " << r->width << "x" << r->height << " image; expected: " << says;
  EXPECT_NE(r.error().message.find(says), std::string::npos) << r.error().message;
}

TEST(VisionDecode, TruncatedDataOfEveryFormatIsAnError) {
  for (const char* name : {"rgb.png", "gray16.png", "q90_420.jpg", "progressive.jpg", "lossy.webp",
                           "lossless_alpha.webp", "animated.webp", "palette.gif", "interlaced.gif"}) {
    SCOPED_TRACE(name);
    std::vector<uint8_t> b = fixture(name);
    for (size_t keep : {b.size() / 2, b.size() * 3 / 4, size_t(20)}) {
      expect_error(std::vector<uint8_t>(b.begin(), b.begin() + long(keep)), "corrupt or truncated");
    }
  }
}

TEST(VisionDecode, CorruptDataIsAnError) {
  std::vector<uint8_t> png = fixture("rgb.png");
  for (size_t i = 40; i < png.size() - 20; ++i) png[i] ^= 0x5a;  // IDAT contents and CRC
  expect_error(png, "corrupt or truncated PNG");
  std::vector<uint8_t> jpeg = fixture("q90_420.jpg");
  std::fill(jpeg.begin() + 4, jpeg.begin() + 200, uint8_t(0x11));  // past the SOI marker: tables gone
  expect_error(jpeg, "corrupt or truncated JPEG");
  std::vector<uint8_t> webp = fixture("lossy.webp");
  std::fill(webp.begin() + 20, webp.end(), uint8_t(0));
  expect_error(webp, "corrupt or truncated WebP");
  std::vector<uint8_t> gif = fixture("palette.gif");
  gif.resize(13);  // header and screen only
  expect_error(gif, "GIF");
}

TEST(VisionDecode, UnsupportedAndEmptyInputsAreErrors) {
  expect_error({}, "empty");
  expect_error({'B', 'M', 1, 2, 3, 4, 5, 6}, "unsupported image format (the bytes look like BMP)");
  expect_error({'<', 's', 'v', 'g', ' '}, "send PNG, JPEG, WebP or GIF");
  expect_error({1, 2, 3}, "unsupported image format");
}

uint32_t crc32(const uint8_t* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

void put_be32(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 24), p[1] = uint8_t(v >> 16), p[2] = uint8_t(v >> 8), p[3] = uint8_t(v);
}

// Headers that declare huge images over tiny payloads (decompression bombs): refused from the
// declared size, before any pixel is decoded or allocated.
TEST(VisionDecode, DeclaredSizeOverThePixelLimitIsRefusedBeforeDecoding) {
  std::vector<uint8_t> png = fixture("rgb.png");  // IHDR data at 16..28, its CRC at 29..32
  put_be32(&png[16], 60000);
  put_be32(&png[20], 60000);
  put_be32(&png[29], crc32(&png[12], 17));
  expect_error(png, "PNG image is 60000x60000 pixels, over the limit");

  std::vector<uint8_t> jpeg = fixture("q90_420.jpg");
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xff && jpeg[i + 1] == 0xc0) {  // SOF0: length, precision, height, width
      jpeg[i + 5] = 0xea, jpeg[i + 6] = 0x60, jpeg[i + 7] = 0xea, jpeg[i + 8] = 0x60;
      break;
    }
  }
  expect_error(jpeg, "JPEG image is 60000x60000 pixels, over the limit");

  std::vector<uint8_t> webp = fixture("lossless_alpha.webp");  // VP8L: 0x2f, then 14-bit width-1, height-1
  ASSERT_EQ(webp[20], 0x2f);
  uint32_t bits = uint32_t(webp[21]) | uint32_t(webp[22]) << 8 | uint32_t(webp[23]) << 16 | uint32_t(webp[24]) << 24;
  bits = (bits & 0xf0000000u) | 16383u | 16383u << 14;
  for (int k = 0; k < 4; ++k) webp[21 + k] = uint8_t(bits >> (8 * k));
  expect_error(webp, "WebP image is 16384x16384 pixels, over the limit");

  std::vector<uint8_t> gif = fixture("palette.gif");
  gif[6] = gif[7] = gif[8] = gif[9] = 0xff;
  expect_error(gif, "GIF image is 65535x65535 pixels, over the limit");

  ImageLimits small;
  small.max_pixels = 100;  // the fixtures are 16 x 12
  for (const char* name : {"rgb.png", "gray.jpg", "lossy.webp", "animated.webp", "palette.gif"}) {
    SCOPED_TRACE(name);
    expect_error(fixture(name), "over the limit of 100 pixels", small);
  }
}

TEST(VisionDecode, EncodedSizeOverTheLimitIsAnError) {
  ImageLimits small;
  small.max_encoded_bytes = 100;
  expect_error(fixture("rgb.png"), "over the limit of 100 bytes", small);
}

}  // namespace
}  // namespace spw::vision
