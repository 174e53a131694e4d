#include "engine/device_weights.h"

#include <algorithm>
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
    if (to_host_) {  // a HostGpu expert's bytes: mapped pinned host memory
      auto p = out_.host_mapped.copy(src, n);
      if (!p.ok()) status_ = make_error("upload_weights: pinned host memory for an expert: ", p.error().message);
      return p.ok() ? p->device : nullptr;
    }
    auto p = out_.device.copy(src, n);
    if (!p.ok()) {
      status_ = p.error();
      return nullptr;
    }
    out_.nbytes += n;
    return *p;
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

  // The linear as the checkpoint stores it (Linear::stem: "<stem>.weight" + "<stem>.scale"), in its own bytes.
  DeviceLinear linear(const Linear& l) {
    if (l.n_out == 0 || !status_.ok()) return DeviceLinear{};
    const std::string& stem = l.stem;
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

  // One part of a stack: the host linear and where its device view goes.
  struct Part {
    const Linear* l;
    DeviceLinear* out;
  };

  // The linears of `parts` that the layer has (n_out > 0) as one DeviceStack (see device_weights.h): when there
  // are at least two, all stored FP8 (whole weight blocks of rows, except the last part) or all BF16, of one
  // LinearKind and n_in, and stack_keeps_rows holds. Otherwise each is uploaded alone and the stack is empty.
  DeviceStack stack(const std::vector<Part>& parts) {
    std::vector<Part> have;
    for (const Part& p : parts)
      if (p.l->n_out > 0) have.push_back(p);
      else *p.out = DeviceLinear{};
    auto alone = [&] {
      for (const Part& p : have) *p.out = linear(*p.l);
      return DeviceStack{};
    };
    if (!status_.ok() || have.size() < 2) return alone();
    const Linear& l0 = *have[0].l;
    const int B = c_.weight_block;
    const bool fp8 = l0.kind == LinearKind::Fp8;
    std::vector<int> rows;
    std::vector<const TensorInfo*> ws, scales;
    for (size_t i = 0; i < have.size(); ++i) {
      const Linear& l = *have[i].l;
      const TensorInfo* t = find(l.stem + ".weight");
      const TensorInfo* sc = fp8 ? find(l.stem + ".scale") : nullptr;
      const size_t n = size_t(l.n_out) * l.n_in;
      const bool last = i + 1 == have.size();
      const bool as_stored =
          fp8 ? t && sc && t->dtype == DType::F8_E4M3 && t->nbytes == n && (last || l.n_out % B == 0) &&
                    sc->nbytes == (size_t(l.n_out) + B - 1) / B * ((size_t(l.n_in) + B - 1) / B)
              : l.kind != LinearKind::Fp4 && t && t->dtype == DType::BF16 && t->nbytes == 2 * n;
      if (l.kind != l0.kind || l.n_in != l0.n_in || !as_stored) return alone();
      rows.push_back(l.n_out);
      ws.push_back(t);
      scales.push_back(sc);
    }
    DeviceLinear like = describe(l0);
    like.format = fp8 ? DenseFormat::kFp8 : DenseFormat::kBf16, like.weight_block = B;
    if (!stack_keeps_rows(like, rows)) return alone();
    auto cat = [&](const std::vector<const TensorInfo*>& ts) {
      std::vector<uint8_t> all;
      for (const TensorInfo* t : ts) all.insert(all.end(), t->data, t->data + t->nbytes);
      return static_cast<const uint8_t*>(bytes(all.data(), all.size()));
    };
    const uint8_t* w = cat(ws);
    const uint8_t* sc = fp8 ? cat(scales) : nullptr;
    if (!status_.ok()) return DeviceStack{};
    auto view = [&](const Linear& l, const uint8_t* wp, const uint8_t* sp) {
      DeviceLinear d = describe(l);
      d.format = fp8 ? DenseFormat::kFp8 : DenseFormat::kBf16, d.weight_block = B, d.w = wp, d.scale = sp;
      return d;
    };
    DeviceStack st;
    st.rows = rows;
    st.w = view(l0, w, sc);
    st.w.n_out = 0;
    for (size_t i = 0; i < have.size(); ++i) {
      *have[i].out = view(*have[i].l, w, sc);
      w += ws[i]->nbytes;
      if (fp8) sc += scales[i]->nbytes;
      st.w.n_out += rows[i];
    }
    for (const Part& p : have)
      if (Status e = linear_cuda_check(*p.out); !e.ok() && status_.ok())
        status_ = make_error("upload_weights: ", p.l->stem, " (stacked): ", e.error().message);
    if (Status e = linear_cuda_check(st.w); !e.ok() && status_.ok())
      status_ = make_error("upload_weights: the stack from ", have[0].l->stem, ": ", e.error().message);
    return st;
  }

  // A routed expert where its tier puts it.
  DeviceExpert expert(const Expert& e, ExpertTier tier) {
    if (tier == ExpertTier::HostCpu) return cpu_expert(e);
    to_host_ = tier == ExpertTier::HostGpu;
    const size_t before = out_.nbytes;
    DeviceExpert d = expert(e);
    out_.routed_gpu_nbytes += out_.nbytes - before;
    to_host_ = false;
    d.tier = tier;
    return d;
  }

  // An expert for the CPU worker: its stored EXL3 tensors copied once into mapped pinned host memory, viewed by the
  // host (HostCpuExpert) and by the device (DeviceExpert: the GPU reads them over PCIe in large steps).
  DeviceExpert cpu_expert(const Expert& e) {
    DeviceExpert d;
    d.tier = ExpertTier::HostCpu;
    HostCpuExpert& h = out_.host_cpu[layer_][expert_];
    const Exl3Lookup lookup = [this](const std::string& n) { return find(n); };
    const Linear* ls[3] = {&e.w1, &e.w2, &e.w3};
    Exl3Tensor* hs[3] = {&h.w1, &h.w2, &h.w3};
    for (int q = 0; q < 3 && status_.ok(); ++q) {
      if (!exl3_is_stored(lookup, ls[q]->stem)) {
        status_ = make_error("upload_weights: ", ls[q]->stem, " is placed on the CPU (host_cpu) but is not stored as EXL3; ",
                             "the CPU runtime computes EXL3 experts only: place it on host_gpu or gpu");
        break;
      }
      auto t = exl3_load(lookup, ls[q]->stem);
      if (!t.ok()) {
        status_ = make_error("upload_weights: ", t.error().message);
        break;
      }
      if (t->k != ls[q]->n_in || t->n != ls[q]->n_out || !t->bias.empty()) {
        status_ = make_error("upload_weights: ", ls[q]->stem, " is placed on the CPU (host_cpu) but is stored padded or ",
                             "with a bias, which the GPU's large steps cannot read: place it on gpu");
        break;
      }
      auto tr = out_.host_cpu_mapped.copy(t->trellis, t->trellis_nbytes());
      auto su = tr.ok() ? out_.host_cpu_mapped.copy(t->suh.data(), t->suh.size() * sizeof(uint16_t)) : tr;
      auto sv = su.ok() ? out_.host_cpu_mapped.copy(t->svh.data(), t->svh.size() * sizeof(uint16_t)) : su;
      if (!sv.ok()) {
        status_ = make_error("upload_weights: pinned host memory for an expert: ", sv.error().message);
        break;
      }
      *hs[q] = std::move(t.value());
      hs[q]->trellis = static_cast<const uint16_t*>(tr->host);
      Exl3CudaTensor& dt = d.exl3[q];
      dt.trellis = static_cast<const uint16_t*>(tr->device);
      dt.suh = static_cast<const uint16_t*>(su->device);
      dt.svh = static_cast<const uint16_t*>(sv->device);
      dt.k = hs[q]->k, dt.n = hs[q]->n, dt.bits = hs[q]->bits, dt.codebook = hs[q]->codebook;
      if (!exl3_cuda_supports(dt))
        status_ = make_error("upload_weights: ", ls[q]->stem, " (host_cpu): a shape the GPU kernels do not take");
    }
    return d;
  }

  void at_expert(int layer, int expert) { layer_ = layer, expert_ = expert; }

  DeviceExpert expert(const Expert& e) {
    DeviceExpert d;
    const Linear* ls[3] = {&e.w1, &e.w2, &e.w3};
    bool all_exl3 = true;
    for (int q = 0; q < 3 && all_exl3 && status_.ok(); ++q) all_exl3 = exl3(*ls[q], d.exl3[q]);
    if (all_exl3 && status_.ok()) return d;
    d = DeviceExpert{};
    d.w1 = linear(e.w1);
    d.w2 = linear(e.w2);
    d.w3 = linear(e.w3);
    return d;
  }

  // The shared expert: as expert(), with w1 and w3 stacked when they are FP8 (one GEMV launch in decode).
  DeviceExpert shared_expert(const Expert& e) {
    const Exl3Lookup lookup = [this](const std::string& n) { return find(n); };
    if (exl3_is_stored(lookup, e.w1.stem)) return expert(e);
    DeviceExpert d;
    if (e.w1.kind == LinearKind::Fp8) d.w13 = stack({{&e.w1, &d.w1}, {&e.w3, &d.w3}});
    else d.w1 = linear(e.w1), d.w3 = linear(e.w3);
    d.w2 = linear(e.w2);
    return d;
  }

  // The EXL3 tensor stored under l.stem (trellis, suh, svh) on the device, if there is one that the
  // CUDA kernels take as is: stored [k = n_in, n = n_out] with no padding, no bias.
  bool exl3(const Linear& l, Exl3CudaTensor& out) {
    const std::string& stem = l.stem;
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
  bool to_host_ = false;       // bytes() copies into mapped host memory
  int layer_ = 0, expert_ = 0;  // the routed expert being placed
};

}  // namespace

Result<std::unique_ptr<DeviceWeights>> upload_weights(const ModelConfig& c, const ModelWeights& w,
                                                      const Numerics& numerics, const ExpertTiers& tiers) {
  if (!tiers.empty()) {
    if (int(tiers.size()) != c.n_layers)
      return make_error("upload_weights: the placement has ", tiers.size(), " layers, the model ", c.n_layers);
    for (int l = 0; l < c.n_layers; ++l)
      if (int(tiers[l].size()) != int(w.layers[l].experts.size()))
        return make_error("upload_weights: the placement has ", tiers[l].size(), " experts in layer ", l,
                          ", the model ", w.layers[l].experts.size());
  }
  auto out = std::make_unique<DeviceWeights>();
  out->host_cpu.resize(c.n_layers);
  Uploader up(c, w, numerics, *out);
  out->embed = up.f32(w.embed);
  out->head = up.linear(w.head);
  out->norm = up.f32(w.norm);
  if (!c.is_v41()) out->hc_head = up.hc(w.hc_head);
  out->layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    DeviceLayer& dl = out->layers[l];
    dl.attn_norm = up.f32(lw.attn_norm);
    dl.ffn_norm = up.f32(lw.ffn_norm);
    dl.hc_attn = up.hc(lw.hc_attn);
    dl.hc_ffn = up.hc(lw.hc_ffn);
    dl.wq_a_wkv = up.stack({{&lw.wq_a, &dl.wq_a}, {&lw.wkv, &dl.wkv}});
    dl.wq_b_idx = up.stack({{&lw.wq_b, &dl.wq_b}, {&lw.idx_wq_b, &dl.idx_wq_b}});
    dl.wo_a = up.bf16(lw.wo_a.w);
    dl.wo_b = up.linear(lw.wo_b);
    dl.q_norm = up.f32(lw.q_norm);
    dl.kv_norm = up.f32(lw.kv_norm);
    dl.attn_sink = up.f32(lw.attn_sink);
    dl.compressors = up.stack({{&lw.comp_wkv, &dl.comp_wkv},
                               {&lw.comp_wgate, &dl.comp_wgate},
                               {&lw.idx_comp_wkv, &dl.idx_comp_wkv},
                               {&lw.idx_comp_wgate, &dl.idx_comp_wgate}});
    dl.comp_ape = up.f32(lw.comp_ape);
    dl.comp_norm = up.f32(lw.comp_norm);
    dl.idx_weights_proj = up.linear(lw.idx_weights_proj);
    dl.idx_comp_ape = up.f32(lw.idx_comp_ape);
    dl.idx_comp_norm = up.f32(lw.idx_comp_norm);
    dl.idx_wk = up.linear(lw.idx_wk);
    dl.idx_k_norm = up.f32(lw.idx_k_norm);
    dl.gate = up.linear(lw.gate);
    dl.gate_bias = up.f32(lw.gate_bias);
    dl.gate_bias_vl = up.f32(lw.gate_bias_vl);
    dl.tid2eid = up.i32(lw.tid2eid);
    dl.experts.resize(lw.experts.size());
    const bool on_cpu = !tiers.empty() && std::count(tiers[l].begin(), tiers[l].end(), ExpertTier::HostCpu) > 0;
    if (on_cpu) out->host_cpu[l].resize(lw.experts.size());
    for (size_t e = 0; e < lw.experts.size(); ++e) {
      const ExpertTier tier = tiers.empty() ? ExpertTier::Gpu : tiers[l][e];
      up.at_expert(l, int(e));
      dl.experts[e] = up.expert(lw.experts[e], tier);
      ++out->n_experts_in[int(tier)];
    }
    dl.shared = up.shared_expert(lw.shared);
    dl.engram_wkv = up.linear(lw.engram.wkv);
    SPW_TRY(up.status());
  }
  SPW_TRY(up.status());
  return out;
}

}  // namespace spw::engine
