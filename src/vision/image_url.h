// An OpenAI image part's URL → decoded image. Only `data:` URLs are taken
// (data:image/<png|jpeg|webp|gif>;base64,<data>); the server fetches nothing from the network, so
// http(s) URLs are refused with a message saying to send the image inline. The claimed MIME type
// must agree with the format found in the bytes. Every refusal is an Error saying what to change.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "vision/image_decode.h"

namespace spw::vision {

// Strict standard-alphabet base64 (RFC 4648 §4): ASCII whitespace is skipped, '=' padding may be
// left out but nothing may follow it. Decodes at most max_nbytes bytes; more is an Error.
Result<std::vector<uint8_t>> base64_decode(std::string_view text, size_t max_nbytes);

// The bytes a data: URL carries, after the checks above (not yet decoded as an image).
Result<std::vector<uint8_t>> image_url_bytes(std::string_view url, const ImageLimits& limits);

// image_url_bytes, then decode_image.
Result<RgbImage> load_image_url(std::string_view url, const ImageLimits& limits);

}  // namespace spw::vision
