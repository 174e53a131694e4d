// Image parts of /v1/chat/completions (and /v1/messages). Each part's URL is read as the image processor
// would read it (a data: URL, base64, a PNG / JPEG / WebP / GIF whose bytes match the claimed MIME type,
// within the size limits), so a bad image gets a 400 that names the part and says what to change. A model
// without a vision tower refuses images, as does a server that loaded none. Otherwise each
// image is processed (vision/image_processor.h), its placeholder expanded into its span
// (vision/image_tokens.h) and the span's embeddings computed by the model's image encoder (the GPU tower
// beside the GPU runner, else the CPU reference), on the request's own thread: other requests keep
// streaming while an image encodes.
#include <chrono>

#include "base/log.h"
#include "server/openai_api.h"
#include "vision/image_tokens.h"
#include "vision/image_url.h"

namespace spw::server {

ApiResult<std::vector<vision::RgbImage>> OpenAiApi::chat_images(const ChatRequest& chat) const {
  const vision::ImageLimits& limits = settings_.image_limits;
  std::vector<vision::RgbImage> images;
  for (size_t i = 0; i < chat.messages.size(); ++i) {
    const auto& parts = chat.messages[i].parts;
    if (!parts) continue;
    for (size_t j = 0; j < parts->size(); ++j) {
      if ((*parts)[j].kind != ContentPart::Kind::image) continue;
      const std::string where = "messages[" + std::to_string(i) + "].content[" + std::to_string(j) + "].image_url";
      if (int(images.size()) >= limits.max_images) {
        return bad_request("too many images: at most " + std::to_string(limits.max_images) +
                               " per request; send fewer images",
                           where);
      }
      auto image = vision::load_image_url((*parts)[j].image_url, limits);
      if (!image.ok()) return bad_request(where + ": " + image.error().message, where);
      images.push_back(std::move(image.value()));
    }
  }
  if (images.empty()) return images;
  if (!model_.vision) {
    return bad_request("this model (" + model_.id + ") does not take images: its config.json has no vision tower "
                       "(vision_config); send text only, or serve a model with a vision tower",
                       "messages");
  }
  if (!model_.image_encoder) {
    return bad_request("this server did not load a vision tower for " + model_.id +
                           " (its start-up log says why); send text only",
                       "messages");
  }
  return images;
}

ApiResult<std::shared_ptr<const runtime::PromptImages>> OpenAiApi::prompt_images(
    std::vector<int32_t>& ids, const std::vector<vision::RgbImage>& images) const {
  vision::ImageEncoder& encoder = *model_.image_encoder;
  const vision::VisionConfig& config = encoder.config();
  std::vector<vision::ProcessedImage> processed;
  std::vector<vision::ImageGrid> grids;
  for (size_t i = 0; i < images.size(); ++i) {
    auto p = vision::process_image(images[i], config);
    if (!p.ok()) return bad_request("image " + std::to_string(i) + ": " + p.error().message, "messages");
    grids.push_back(p->grid);
    processed.push_back(std::move(p.value()));
  }
  const auto image_token = int32_t(config.image_token_id);
  auto expanded = vision::expand_image_placeholders(ids, image_token, grids);
  if (!expanded.ok()) {
    // The chat encoder writes one placeholder per image; a count that differs means the tokenizer does
    // not encode the placeholder as the config's image token.
    return ApiError{500,
                    "this model's tokenizer does not encode the image placeholder as image_token_id " +
                        std::to_string(image_token) + " (" + expanded.error().message + ")",
                    "server_error", "messages", ""};
  }
  auto out = std::make_shared<runtime::PromptImages>();
  out->d_model = encoder.d_llm();
  for (vision::TokenType t : expanded->types) out->is_image.push_back(t != vision::TokenType::text);
  std::vector<std::pair<size_t, size_t>> spans;
  std::vector<uint64_t> hashes;
  for (size_t i = 0; i < processed.size(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto rows = encoder.span_embeddings(processed[i]);
    if (!rows.ok()) return ApiError{500, "image " + std::to_string(i) + ": " + rows.error().message, "server_error", "messages", ""};
    const vision::ImageGrid& g = processed[i].grid;
    SPW_LOG_INFO("image {}: {}x{} → {}x{} patches, {} positions, encoded in {:.0f} ms ({})", i, images[i].width,
                 images[i].height, g.n_vit_h, g.n_vit_w, g.n_tokens,
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                 encoder.device());
    out->rows.insert(out->rows.end(), rows->begin(), rows->end());
    spans.emplace_back(expanded->images[i].start, size_t(g.n_tokens));
    const auto& patches = processed[i].patches;
    hashes.push_back(runtime::hash_bytes(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(patches.data()), patches.size() * sizeof(uint16_t))));
  }
  out->cache_key = runtime::image_cache_key(expanded->ids, spans, hashes);
  ids = std::move(expanded->ids);
  return std::shared_ptr<const runtime::PromptImages>(std::move(out));
}

}  // namespace spw::server
