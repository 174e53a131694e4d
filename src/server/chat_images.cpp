// Image parts of /v1/chat/completions. Each part's URL is read as the image processor would read it
// (a data: URL, base64, a PNG / JPEG / WebP / GIF whose bytes match the claimed MIME type, within
// the size limits), so a bad image gets a 400 that names the part and says what to change. Then a
// model without a vision tower refuses images; a model with one is refused too, for now: the ViT
// and aligner do not run in this server yet (src/vision holds the processor and the token layout
// they will consume).
#include "server/openai_api.h"
#include "vision/image_url.h"

namespace spw::server {

std::optional<ApiError> OpenAiApi::check_chat_images(const ChatRequest& chat) const {
  const vision::ImageLimits& limits = settings_.image_limits;
  int n_images = 0;
  for (size_t i = 0; i < chat.messages.size(); ++i) {
    const auto& parts = chat.messages[i].parts;
    if (!parts) continue;
    for (size_t j = 0; j < parts->size(); ++j) {
      if ((*parts)[j].kind != ContentPart::Kind::image) continue;
      const std::string where = "messages[" + std::to_string(i) + "].content[" + std::to_string(j) + "].image_url";
      if (++n_images > limits.max_images) {
        return bad_request("too many images: at most " + std::to_string(limits.max_images) +
                               " per request; send fewer images",
                           where);
      }
      auto image = vision::load_image_url((*parts)[j].image_url, limits);
      if (!image.ok()) return bad_request(where + ": " + image.error().message, where);
    }
  }
  if (n_images == 0) return std::nullopt;
  if (!model_.vision) {
    return bad_request("this model (" + model_.id + ") does not take images: its config.json has no vision tower "
                       "(vision_config); send text only, or serve a model with a vision tower",
                       "messages");
  }
  return bad_request("image inputs are not served yet: this server does not run the vision tower of " + model_.id +
                         "; send text only",
                     "messages");
}

}  // namespace spw::server
