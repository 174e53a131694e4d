#include "engine/device_weights.h"

#include <cstring>
#include <string>

#include "formats/dtypes.h"
#include "formats/exl3.h"

namespace spw::engine {
namespace {

class Uploader {
 public:
  Uploader(const ModelConfig& c, const ModelWeights& w, const Numerics& num, DeviceWeights& out)
      : c_(c), w_(w), num_(num), out_(out) {}

  const Status& status() const { return status_; }

  const void* bytes(const void* src, size_t n) {
    if (!status_.ok()) return nullptr;
    DeviceBuffer<uint8_t> buf;
    status_ = upload(static_cast<const uint8_t*>(src), n, buf);
    if (!status_.ok()) return nullptr;
    out_.nbytes += n;
    out_.owned.push_back(std::move(buf));
    return out_.owned.back().get();
  }
  // a then b in one device buffer.
  const void* bytes_cat(const void* a, size_t na, const void* b, size_t nb) {
    std::vector<uint8_t> cat(na + nb);
    std::memcpy(cat.data(), a, na);
    std::memcpy(cat.data() + na, b, nb);
    return bytes(cat.data(), cat.size());
  }
  const float* f32(const std::vector<float>& v) {
    return v.empty() ? nullptr : static_cast<const float*>(bytes(v.data(), v.size() * sizeof(float)));
  }
  const int32_t* i32(const std::vector<int32_t>& v) {
    return v.empty() ? nullptr : static_cast<const int32_t*>(bytes(v.data(), v.size() * sizeof(int32_t)));
  }
  const uint16_t* bf16(const std::vector<float>& v) {
    std::vector<uint16_t> bits(v.size());
    for (size_t i = 0; i < v.size(); ++i) bits[i] = f32_to_bf16(v[i]);
    return static_cast<const uint16_t*>(bytes(bits.data(), bits.size() * sizeof(uint16_t)));
  }
  DeviceHc hc(const HcWeights& h) { return DeviceHc{f32(h.fn), f32(h.base), f32(h.scale)}; }

  // The shape and numerics switches of a linear, without its bytes.
  DeviceLinear describe(const Linear& l) const {
    DeviceLinear d;
    d.n_out = l.n_out;
    d.n_in = l.n_in;
    const bool quantized = l.kind == LinearKind::Fp8 || l.kind == LinearKind::Fp4;
    d.act_block = quantized && num_.fake_quant ? c_.act_block : 0;
    // Without bf16 activations (Numerics::exact()) x is not bf16-representable: every product in f32.
    d.f32_product = l.kind == LinearKind::F32 || !num_.bf16_activations;
    return d;
  }

  // The linear stored under "<stem>.weight" (+ "<stem>.scale"), in the checkpoint's own bytes.
  DeviceLinear linear(const std::string& stem, const Linear& l) {
    if (l.n_out == 0 || !status_.ok()) return DeviceLinear{};
    DeviceLinear d = describe(l);
    const bool quantized = l.kind == LinearKind::Fp8 || l.kind == LinearKind::Fp4;
    const TensorInfo* t = find(stem + ".weight");
    const TensorInfo* s = find(stem + ".scale");
    const size_t n = size_t(l.n_out) * l.n_in;
    if (l.kind == LinearKind::Fp8 && t && s && t->dtype == DType::F8_E4M3 && t->nbytes == n) {
      d.format = DenseFormat::kFp8;
      d.weight_block = c_.weight_block;
      d.w = bytes(t->data, t->nbytes);
      d.scale = static_cast<const uint8_t*>(bytes(s->data, s->nbytes));
    } else if (l.kind == LinearKind::Fp4 && t && s && t->dtype == DType::I8 && t->nbytes == n / 2) {
      d.format = DenseFormat::kFp4;
      d.w = bytes(t->data, t->nbytes);
      d.scale = static_cast<const uint8_t*>(bytes(s->data, s->nbytes));
    } else if (!quantized && t && t->dtype == DType::BF16 && t->nbytes == 2 * n) {
      d.format = DenseFormat::kBf16;
      d.w = bytes(t->data, t->nbytes);
    } else if (!quantized && t && t->dtype == DType::F32 && t->nbytes == 4 * n) {
      d.format = DenseFormat::kF32;
      d.w = bytes(t->data, t->nbytes);
    } else {
      if (l.w.empty()) {  // a routed expert loaded without values (LoadOptions::routed_expert_values)
        status_ = make_error("upload_weights: ", stem, ": no dense or EXL3 form the GPU takes");
        return d;
      }
      // Not stored in a dense format: the exact f32 copy.
      d.format = DenseFormat::kF32;
      d.w = bytes(l.w.data(), n * sizeof(float));
    }
    if (status_.ok()) {
      if (Status st = linear_cuda_check(d); !st.ok())
        status_ = make_error("upload_weights: ", stem, ": ", st.error().message);
    }
    return d;
  }

  // Two FP8 linears that read the same input, uploaded as one stacked weight (a's rows, then b's: weights and
  // block scales each contiguous) that da and db view; returned for stacked_linear_cuda. Only when the stack
  // keeps every row's GEMV summation order (stack_keeps_rows) and a's rows end on a weight block; otherwise
  // da and db are uploaded alone and the result is empty (n_out 0).
  DeviceLinear stacked(const std::string& stem_a, const Linear& a, const std::string& stem_b, const Linear& b,
                       DeviceLinear& da, DeviceLinear& db) {
    const int B = c_.weight_block;
    const TensorInfo *ta = find(stem_a + ".weight"), *sa = find(stem_a + ".scale");
    const TensorInfo *tb = find(stem_b + ".weight"), *sb = find(stem_b + ".scale");
    auto fp8_as_stored = [&](const Linear& l, const TensorInfo* t, const TensorInfo* sc) {
      const size_t scale_rows = size_t(l.n_out) / B, scale_cols = (size_t(l.n_in) + B - 1) / B;
      return l.kind == LinearKind::Fp8 && l.n_out > 0 && l.n_out % B == 0 && t && sc && t->dtype == DType::F8_E4M3 &&
             t->nbytes == size_t(l.n_out) * l.n_in && sc->nbytes == scale_rows * scale_cols;
    };
    if (!status_.ok() || a.n_in != b.n_in || !fp8_as_stored(a, ta, sa) || !fp8_as_stored(b, tb, sb) ||
        !stack_keeps_rows(a.n_out, b.n_out, a.n_in)) {
      da = linear(stem_a, a);
      db = linear(stem_b, b);
      return DeviceLinear{};
    }
    const auto* w = static_cast<const uint8_t*>(bytes_cat(ta->data, ta->nbytes, tb->data, tb->nbytes));
    const auto* sc = static_cast<const uint8_t*>(bytes_cat(sa->data, sa->nbytes, sb->data, sb->nbytes));
    if (!status_.ok()) return DeviceLinear{};
    auto view = [&](const Linear& l, const uint8_t* wp, const uint8_t* sp) {
      DeviceLinear d = describe(l);
      d.format = DenseFormat::kFp8, d.weight_block = B, d.w = wp, d.scale = sp;
      return d;
    };
    da = view(a, w, sc);
    db = view(b, w + ta->nbytes, sc + sa->nbytes);
    DeviceLinear st = view(a, w, sc);
    st.n_out = a.n_out + b.n_out;
    for (const DeviceLinear* d : {&da, &db, &st})
      if (Status e = linear_cuda_check(*d); !e.ok() && status_.ok())
        status_ = make_error("upload_weights: ", stem_a, " + ", stem_b, ": ", e.error().message);
    return st;
  }

  DeviceExpert expert(const std::string& stem, const Expert& e) {
    DeviceExpert d;
    const Linear* ls[3] = {&e.w1, &e.w2, &e.w3};
    const char* names[3] = {"w1", "w2", "w3"};
    bool all_exl3 = true;
    for (int q = 0; q < 3 && all_exl3 && status_.ok(); ++q) all_exl3 = exl3(stem + names[q], *ls[q], d.exl3[q]);
    if (all_exl3 && status_.ok()) return d;
    d = DeviceExpert{};
    d.w1 = linear(stem + "w1", e.w1);
    d.w2 = linear(stem + "w2", e.w2);
    d.w3 = linear(stem + "w3", e.w3);
    return d;
  }

  // The shared expert: as expert(), with w1 and w3 stacked when they are FP8 (one GEMV launch in decode).
  DeviceExpert shared_expert(const std::string& stem, const Expert& e) {
    const Exl3Lookup lookup = [this](const std::string& n) { return find(n); };
    if (exl3_is_stored(lookup, stem + "w1")) return expert(stem, e);
    DeviceExpert d;
    d.w13 = stacked(stem + "w1", e.w1, stem + "w3", e.w3, d.w1, d.w3);
    d.w2 = linear(stem + "w2", e.w2);
    return d;
  }

  // The EXL3 tensor stored under `stem` (trellis, suh, svh) on the device, if there is one that the
  // CUDA kernels take as is: stored [k = n_in, n = n_out] with no padding, no bias.
  bool exl3(const std::string& stem, const Linear& l, Exl3CudaTensor& out) {
    const Exl3Lookup lookup = [this](const std::string& n) { return find(n); };
    if (!exl3_is_stored(lookup, stem)) return false;
    auto t = exl3_load(lookup, stem);
    if (!t.ok()) {
      status_ = make_error("upload_weights: ", t.error().message);
      return false;
    }
    if (t->k != l.n_in || t->n != l.n_out || !t->bias.empty()) return false;
    out.trellis = static_cast<const uint16_t*>(bytes(t->trellis, t->trellis_nbytes()));
    out.suh = static_cast<const uint16_t*>(bytes(t->suh.data(), t->suh.size() * sizeof(uint16_t)));
    out.svh = static_cast<const uint16_t*>(bytes(t->svh.data(), t->svh.size() * sizeof(uint16_t)));
    out.k = t->k, out.n = t->n, out.bits = t->bits, out.codebook = t->codebook;
    return status_.ok() && exl3_cuda_supports(out);
  }

 private:
  const TensorInfo* find(const std::string& name) const {
    if (const TensorInfo* t = w_.checkpoint.find(name)) return t;
    return w_.checkpoint.find("model." + name);
  }

  const ModelConfig& c_;
  const ModelWeights& w_;
  const Numerics& num_;
  DeviceWeights& out_;
  Status status_;
};

}  // namespace

Result<std::unique_ptr<DeviceWeights>> upload_weights(const ModelConfig& c, const ModelWeights& w,
                                                      const Numerics& numerics) {
  auto out = std::make_unique<DeviceWeights>();
  Uploader up(c, w, numerics, *out);
  out->embed = up.f32(w.embed);
  out->head = up.linear("head", w.head);
  out->norm = up.f32(w.norm);
  if (!c.is_v41()) out->hc_head = up.hc(w.hc_head);
  out->layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    DeviceLayer& dl = out->layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    dl.attn_norm = up.f32(lw.attn_norm);
    dl.ffn_norm = up.f32(lw.ffn_norm);
    dl.hc_attn = up.hc(lw.hc_attn);
    dl.hc_ffn = up.hc(lw.hc_ffn);
    dl.wq_a_wkv = up.stacked(p + "attn.wq_a", lw.wq_a, p + "attn.wkv", lw.wkv, dl.wq_a, dl.wkv);
    dl.wq_b = up.linear(p + "attn.wq_b", lw.wq_b);
    dl.wo_a = up.bf16(lw.wo_a.w);
    dl.wo_b = up.linear(p + "attn.wo_b", lw.wo_b);
    dl.q_norm = up.f32(lw.q_norm);
    dl.kv_norm = up.f32(lw.kv_norm);
    dl.attn_sink = up.f32(lw.attn_sink);
    dl.comp_wkv = up.linear(p + "attn.compressor.wkv", lw.comp_wkv);
    dl.comp_wgate = up.linear(p + "attn.compressor.wgate", lw.comp_wgate);
    dl.comp_ape = up.f32(lw.comp_ape);
    dl.comp_norm = up.f32(lw.comp_norm);
    dl.idx_wq_b = up.linear(p + "attn.indexer.wq_b", lw.idx_wq_b);
    dl.idx_weights_proj = up.linear(p + "attn.indexer.weights_proj", lw.idx_weights_proj);
    dl.idx_comp_wkv = up.linear(p + "attn.indexer.compressor.wkv", lw.idx_comp_wkv);
    dl.idx_comp_wgate = up.linear(p + "attn.indexer.compressor.wgate", lw.idx_comp_wgate);
    dl.idx_comp_ape = up.f32(lw.idx_comp_ape);
    dl.idx_comp_norm = up.f32(lw.idx_comp_norm);
    dl.idx_wk = up.linear(p + "attn.indexer.wk", lw.idx_wk);
    dl.idx_k_norm = up.f32(lw.idx_k_norm);
    dl.gate = up.linear(p + "ffn.gate", lw.gate);
    dl.gate_bias = up.f32(lw.gate_bias);
    dl.tid2eid = up.i32(lw.tid2eid);
    dl.experts.resize(lw.experts.size());
    for (size_t e = 0; e < lw.experts.size(); ++e)
      dl.experts[e] = up.expert(p + "ffn.experts." + std::to_string(e) + ".", lw.experts[e]);
    dl.shared = up.shared_expert(p + "ffn.shared_experts.", lw.shared);
    dl.engram_wkv = up.linear(p + "engram.wkv", lw.engram.wkv);
    SPW_TRY(up.status());
  }
  SPW_TRY(up.status());
  return out;
}

}  // namespace spw::engine
