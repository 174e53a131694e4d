// The per-layer Hessian file: streamed writer, memory-mapped reader (hessian_file.h).
#include "quantize/hessian_file.h"

#include <cstring>

namespace spw::quant {

Result<std::unique_ptr<LayerHessianWriter>> LayerHessianWriter::create(const std::string& path, int d, int f,
                                                                        const std::vector<double>& tokens,
                                                                        double layer_tokens, bool shared) {
  const int E = int(tokens.size());
  std::vector<SafetensorsStreamWriter::Entry> entries{{"layer_tokens", DType::F64, {1}}, {"tokens", DType::F64, {E}}};
  for (int e = 0; e < E; ++e) {
    if (!shared) entries.push_back({"w13." + std::to_string(e), DType::F64, {d, d}});
    entries.push_back({"w2." + std::to_string(e), DType::F64, {f, f}});
  }
  if (shared) entries.push_back({"w13", DType::F64, {d, d}});
  auto out = SafetensorsStreamWriter::create(path, std::move(entries));
  if (!out.ok()) return out.error();
  std::unique_ptr<LayerHessianWriter> w(new LayerHessianWriter);
  w->out_ = std::move(out.value());
  w->d_ = d;
  w->f_ = f;
  w->n_experts_ = E;
  w->shared_ = shared;
  SPW_TRY(w->out_->append("layer_tokens", &layer_tokens, 8));
  SPW_TRY(w->out_->append("tokens", tokens.data(), tokens.size() * 8));
  return w;
}

Status LayerHessianWriter::add_expert(int e, const std::vector<double>& w13, const std::vector<double>& w2) {
  if (e != next_ || e >= n_experts_) return make_error("hessian file: expert ", e, " out of order (expected ", next_, ")");
  ++next_;
  if (!shared_) SPW_TRY(out_->append("w13." + std::to_string(e), w13.data(), w13.size() * 8));
  return out_->append("w2." + std::to_string(e), w2.data(), w2.size() * 8);
}

Status LayerHessianWriter::finish(const std::vector<double>& shared_w13) {
  if (shared_) SPW_TRY(out_->append("w13", shared_w13.data(), shared_w13.size() * 8));
  return out_->finish();
}

Result<LayerHessianFile> LayerHessianFile::open(const std::string& path, int d, int f, int n_experts) {
  auto file = SafetensorsFile::open(path);
  if (!file.ok()) return file.error();
  LayerHessianFile h;
  h.file_ = std::move(file.value());
  h.d_ = d;
  h.f_ = f;
  auto check = [&](const std::string& name, std::vector<int64_t> shape) -> Status {
    const TensorInfo* t = h.file_->find(name);
    if (!t || t->dtype != DType::F64 || t->shape != shape)
      return make_error(path, ": missing or misshaped F64 tensor '", name,
                        "' (a Hessian file from another model or an older build? delete it to recalibrate the layer)");
    return {};
  };
  SPW_TRY(check("layer_tokens", {1}));
  SPW_TRY(check("tokens", {n_experts}));
  h.shared_ = h.file_->find("w13") != nullptr;
  if (h.shared_) SPW_TRY(check("w13", {d, d}));
  for (int e = 0; e < n_experts; ++e) {
    if (!h.shared_) SPW_TRY(check("w13." + std::to_string(e), {d, d}));
    SPW_TRY(check("w2." + std::to_string(e), {f, f}));
  }
  std::memcpy(&h.layer_tokens_, h.file_->find("layer_tokens")->data, 8);
  h.tokens_.resize(size_t(n_experts));
  std::memcpy(h.tokens_.data(), h.file_->find("tokens")->data, size_t(n_experts) * 8);
  return h;
}

std::vector<double> LayerHessianFile::padded(int expert, bool down, int64_t k) const {
  const int n = down ? f_ : d_;
  const TensorInfo* t = file_->find(down ? "w2." + std::to_string(expert)
                                         : shared_ ? std::string("w13") : "w13." + std::to_string(expert));
  std::vector<double> out(size_t(k * k), 0.0);
  // Row by row: the mapped bytes need not be 8-aligned for double loads, memcpy does not care.
  for (int i = 0; i < n; ++i) std::memcpy(&out[size_t(i * k)], t->data + size_t(i) * n * 8, size_t(n) * 8);
  return out;
}

}  // namespace spw::quant
