// data: URLs and base64 (contract in image_url.h). base64 is written here rather than taken from a
// library: it is a dozen lines, and the error has to say where the text goes wrong.
#include "vision/image_url.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace spw::vision {
namespace {

constexpr std::string_view kExample = "data:image/png;base64,<base64 data>";

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// The format a MIME type names; nullopt with `known` false for a type we do not take.
std::optional<ImageFormat> mime_format(const std::string& mime) {
  if (mime == "image/png") return ImageFormat::png;
  if (mime == "image/jpeg" || mime == "image/jpg" || mime == "image/pjpeg") return ImageFormat::jpeg;
  if (mime == "image/webp") return ImageFormat::webp;
  if (mime == "image/gif") return ImageFormat::gif;
  return std::nullopt;
}

}  // namespace

Result<std::vector<uint8_t>> base64_decode(std::string_view text, size_t max_nbytes) {
  std::vector<uint8_t> out;
  out.reserve(std::min(text.size() / 4 * 3 + 3, max_nbytes));
  uint32_t acc = 0;
  int n_bits = 0;
  size_t n_chars = 0, n_pad = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      ++n_pad;
      continue;
    }
    const int v = base64_value(c);
    if (v < 0 || n_pad > 0) {
      const std::string shown = std::isprint(static_cast<unsigned char>(c)) ? std::string("'") + c + "'" : "a control byte";
      return make_error("invalid base64 at offset ", i, " of the data (", n_pad > 0 ? "data after '=' padding" : shown,
                        "); base64-encode the image bytes with the standard alphabet (A-Z a-z 0-9 + /)");
    }
    ++n_chars;
    acc = acc << 6 | uint32_t(v);
    n_bits += 6;
    if (n_bits >= 8) {
      n_bits -= 8;
      if (out.size() == max_nbytes) {
        return make_error("the image is over the limit of ", max_nbytes, " bytes per image; compress or downscale it");
      }
      out.push_back(uint8_t(acc >> n_bits));
      acc &= (1u << n_bits) - 1;
    }
  }
  if (n_chars % 4 == 1 || n_pad > 2 || (n_pad > 0 && (n_chars + n_pad) % 4 != 0)) {
    return make_error("invalid base64: the data has ", n_chars, " base64 characters and ", n_pad,
                      " '=', which is not a whole number of 4-character groups; send the complete base64 text");
  }
  return out;
}

Result<std::vector<uint8_t>> image_url_bytes(std::string_view url_in, const ImageLimits& limits) {
  const std::string_view url = trim(url_in);
  const std::string head = lower(url.substr(0, 8));
  if (head.starts_with("http://") || head.starts_with("https://")) {
    return make_error("remote image URLs are not supported: this server fetches nothing from the network; send the "
                      "image inline as a data: URL (", kExample, ")");
  }
  if (!head.starts_with("data:")) {
    return make_error("unsupported image URL (", url.empty() ? std::string("empty") : "\"" + std::string(url.substr(0, 32)) + "...\"",
                      "); send the image inline as a data: URL (", kExample, ")");
  }
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos) {
    return make_error("malformed data URL: no ',' between the header and the data; expected ", kExample);
  }
  const std::string header = lower(url.substr(5, comma - 5));
  // header = [<mime>][;param]*; the last parameter must be base64.
  const size_t semi = header.find(';');
  const std::string mime(trim(std::string_view(header).substr(0, semi)));
  bool is_base64 = false;
  for (size_t at = semi; at != std::string::npos;) {
    const size_t next = header.find(';', at + 1);
    if (trim(std::string_view(header).substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1)) ==
        "base64") {
      is_base64 = true;
    }
    at = next;
  }
  if (!is_base64) {
    return make_error("the data URL is not base64-encoded (its header \"data:", header,
                      "\" lacks ;base64); base64-encode the image: ", kExample);
  }
  std::optional<ImageFormat> claimed;
  if (!mime.empty()) {
    claimed = mime_format(mime);
    if (!claimed) {
      return make_error("unsupported image MIME type \"", mime, "\" in the data URL; send image/png, image/jpeg, "
                        "image/webp or image/gif");
    }
  }
  auto bytes = base64_decode(url.substr(comma + 1), limits.max_encoded_bytes);
  if (!bytes.ok()) return bytes.error();
  if (bytes->empty()) return make_error("the data URL carries no data; put the base64-encoded image after the ','");
  const auto found = sniff_image_format(bytes.value());
  if (claimed && found && *claimed != *found) {
    return make_error("the data URL says ", mime, " but the bytes are a ", image_format_name(*found),
                      " image; set the MIME type to match (image/", lower(image_format_name(*found)), ")");
  }
  return bytes;
}

Result<RgbImage> load_image_url(std::string_view url, const ImageLimits& limits) {
  auto bytes = image_url_bytes(url, limits);
  if (!bytes.ok()) return bytes.error();
  return decode_image(bytes.value(), limits);
}

}  // namespace spw::vision
