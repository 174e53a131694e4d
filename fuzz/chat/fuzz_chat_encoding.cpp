// libFuzzer target for parse_chat_request + encode_chat (src/chat/chat_encoding.h). Input: byte 0 =
// flags (bit 0: V4.1 instead of V4), the rest = a JSON request body. Checks that nothing crashes or
// hangs and that every accepted request yields a prompt starting with BOS; rejections must carry a
// message. Build and run: fuzz/chat/run.sh SECONDS with SPW_FUZZ_CHAT_TARGET=fuzz_chat_encoding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "chat/chat_encoding.h"
#include "chat/dsml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const spw::ChatFamily family = (data[0] & 1) ? spw::ChatFamily::v41 : spw::ChatFamily::v4;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const nlohmann::ordered_json body = nlohmann::ordered_json::parse(text, nullptr, false);
  if (body.is_discarded()) return 0;
  auto req = spw::parse_chat_request(body, family);
  if (!req.ok()) {
    if (req.error().message.empty()) std::abort();
    return 0;
  }
  auto prompt = spw::encode_chat(*req);
  if (!prompt.ok()) {
    if (prompt.error().message.empty()) std::abort();
    return 0;
  }
  if (prompt->rfind(spw::chat_tokens::bos, 0) != 0) {
    std::fprintf(stderr, "prompt without BOS\n");
    std::abort();
  }
  return 0;
}
