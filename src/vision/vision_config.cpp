// config.json → VisionConfig (contract in vision_config.h).
#include "vision/vision_config.h"

#include <filesystem>
#include <cstdint>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace spw::vision {
namespace {

using json = nlohmann::json;

// One field under either name; the HF name wins when both are present.
struct Field {
  const char* nested;  // in vision_config
  const char* flat;    // top-level vision_* in the reference's config
};

class Reader {
 public:
  Reader(const json* nested, const json& top, std::string source) : nested_(nested), top_(top), source_(std::move(source)) {}

  const json* find(Field f) const {
    if (nested_ && nested_->contains(f.nested) && !(*nested_)[f.nested].is_null()) return &(*nested_)[f.nested];
    if (top_.contains(f.flat) && !top_[f.flat].is_null()) return &top_[f.flat];
    return nullptr;
  }
  std::string where(Field f) const {
    return nested_ && nested_->contains(f.nested) ? source_ + ": vision_config." + f.nested : source_ + ": " + f.flat;
  }
  // An integer in [lo, hi], or `fallback` when absent. The first failure is kept in error().
  int64_t get_int(Field f, int64_t lo, int64_t hi, int64_t fallback) {
    const json* v = find(f);
    if (!v) return fallback;
    if (!v->is_number_integer()) return fail(make_error(where(f), ": expected an integer, got ", v->dump()), fallback);
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) {
      return fail(make_error(where(f), ": ", x, " is outside the supported range [", lo, ", ", hi, "]"), fallback);
    }
    return x;
  }
  double get_number(Field f, double lo, double hi, double fallback) {
    const json* v = find(f);
    if (!v) return fallback;
    if (!v->is_number()) return fail(make_error(where(f), ": expected a number, got ", v->dump()), fallback);
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi)) return fail(make_error(where(f), ": ", v->dump(), " is outside the supported range"), fallback);
    return x;
  }
  const std::optional<Error>& error() const { return error_; }

 private:
  const json* nested_;
  const json& top_;
  std::string source_;
  std::optional<Error> error_;

  template <class T>
  T fail(Error e, T fallback) {
    if (!error_) error_ = std::move(e);
    return fallback;
  }
};

}  // namespace

Result<std::optional<VisionConfig>> parse_vision_config(const json& config, const std::string& source) {
  if (!config.is_object()) return make_error(source, ": expected a JSON object");
  const json* nested = nullptr;
  if (config.contains("vision_config") && !config["vision_config"].is_null()) {
    nested = &config["vision_config"];
    if (!nested->is_object()) return make_error(source, ": vision_config: expected an object, got ", nested->dump());
  }
  Reader r(nested, config, source);
  const Field layers{"num_hidden_layers", "vision_n_layers"};
  if (!r.find(layers)) return std::optional<VisionConfig>();
  VisionConfig c;
  c.n_layers = int(r.get_int(layers, 0, 1024, c.n_layers));
  if (r.error()) return *r.error();
  if (c.n_layers == 0) return std::optional<VisionConfig>();
  c.d_model = int(r.get_int({"hidden_size", "vision_dim"}, 1, 1 << 16, c.d_model));
  c.n_heads = int(r.get_int({"num_attention_heads", "vision_n_heads"}, 1, 1024, c.n_heads));
  c.d_inter = int(r.get_int({"intermediate_size", "vision_inter_dim"}, 1, 1 << 20, c.d_inter));
  c.patch_size = int(r.get_int({"patch_size", "vision_patch_size"}, 1, 64, c.patch_size));
  c.downsample_ratio = int(r.get_int({"downsample_ratio", "vision_downsample_ratio"}, 1, 8, c.downsample_ratio));
  // At least one image token besides START, NEW_LINE and END.
  c.max_image_tokens = int(r.get_int({"max_image_tokens", "vision_max_n_token"}, 4, 1 << 20, c.max_image_tokens));
  c.min_pixels = r.get_int({"min_pixels", "vision_min_pixels"}, 0, int64_t(1) << 28, c.min_pixels);
  c.rope_theta = r.get_number({"rope_theta", "vision_rope_theta"}, 1e-6, 1e12, c.rope_theta);
  const Field ratio{"max_wh_ratio", "vision_max_wh_ratio"};
  if (r.find(ratio)) c.max_wh_ratio = r.get_number(ratio, 1e-3, 1e6, 1.0);
  if (r.error()) return *r.error();
  if (config.contains("image_token_id") && !config["image_token_id"].is_null()) {
    const json& id = config["image_token_id"];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return make_error(source, ": image_token_id: expected a token id, got ", id.dump());
    }
    c.image_token_id = id.get<int64_t>();
  }
  return std::optional<VisionConfig>(c);
}

Result<std::optional<VisionConfig>> read_vision_config(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string file = fs::is_directory(path) ? (fs::path(path) / "config.json").string() : path;
  std::ifstream in(file, std::ios::binary);
  if (!in) return make_error(file, ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  const json config = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return make_error(file, ": not valid JSON");
  return parse_vision_config(config, file);
}

}  // namespace spw::vision
