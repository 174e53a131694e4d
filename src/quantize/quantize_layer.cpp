// One layer's experts quantized into its shard (quantize_layer.h).
#include "quantize/quantize_layer.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>

#include <nlohmann/json.hpp>

#include "formats/quant.h"
#include "quantize/exl3_quantize.h"
#include "quantize/safetensors_writer.h"
#if defined(SPW_HAVE_QUANTIZE_CUDA)
#include "quantize/cuda/exl3_quantize_cuda.h"
#endif

using ojson = nlohmann::ordered_json;

namespace spw::quant {

std::string format_seconds(double s) {
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), int(std::fmod(s, 3600) / 60));
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(std::fmod(s, 60)));
  else std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}

namespace {

// A routed expert projection of the source checkpoint (MXFP4, BF16 or F32 [n_out, n_in]) in the EXL3
// orientation [k = in (padded to 128)][n = out (padded)].
Result<std::vector<float>> load_source_weight(const Checkpoint& ck, const std::string& stem, int n_out, int n_in,
                                              int64_t k, int64_t n) {
  const TensorInfo* w = ck.find(stem + ".weight");
  if (!w) return make_error(ck.root(), ": missing tensor '", stem, ".weight'");
  std::vector<float> rows(size_t(n_out) * n_in);  // [n_out][n_in]
  if (w->dtype == DType::I8) {
    const TensorInfo* s = ck.find(stem + ".scale");
    if (!s || s->dtype != DType::F8_E8M0 || w->shape != std::vector<int64_t>{n_out, n_in / 2} ||
        s->shape != std::vector<int64_t>{n_out, n_in / 32})
      return make_error(w->file, ": expert '", stem, "' is not MXFP4 [", n_out, ", ", n_in / 2, "] I8 + [", n_out, ", ",
                        n_in / 32, "] F8_E8M0 scale as config.json implies");
    std::vector<uint16_t> bf(rows.size());
    dequant_mxfp4(w->data, s->data, size_t(n_out), size_t(n_in), bf.data());
    for (size_t i = 0; i < bf.size(); ++i) rows[i] = bf16_to_f32(bf[i]);
  } else if ((w->dtype == DType::BF16 || w->dtype == DType::F32) && w->shape == std::vector<int64_t>{n_out, n_in}) {
    for (size_t i = 0; i < rows.size(); ++i) {
      if (w->dtype == DType::F32) std::memcpy(&rows[i], w->data + 4 * i, 4);
      else {
        uint16_t b;
        std::memcpy(&b, w->data + 2 * i, 2);
        rows[i] = bf16_to_f32(b);
      }
    }
  } else {
    return make_error(w->file, ": expert tensor '", w->name, "' has dtype ", dtype_name(w->dtype),
                      ", expected I8 (MXFP4) or BF16/F32 [", n_out, ", ", n_in, "]");
  }
  std::vector<float> out(size_t(k * n), 0.f);
  for (int o = 0; o < n_out; ++o)
    for (int i = 0; i < n_in; ++i) out[size_t(i) * n + o] = rows[size_t(o) * n_in + i];
  return out;
}

class Progress {
 public:
  Progress(bool enabled, int total, std::string label)
      : enabled_(enabled), tty_(isatty(2)), total_(total), label_(std::move(label)), start_(clock::now()) {}
  void tick(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    if (!enabled_) return;
    const double el = std::chrono::duration<double>(clock::now() - start_).count();
    const double eta = done_ > 0 ? el / done_ * (total_ - done_) : 0;
    const int width = 30, fill = total_ > 0 ? done_ * width / total_ : width;
    std::string bar(size_t(fill), '#');
    bar.resize(size_t(width), '.');
    if (tty_) {
      std::fprintf(stderr, "\r%s [%s] %d/%d  %.2fs/tensor  ETA %s  %-40s", label_.c_str(), bar.c_str(), done_, total_,
                   el / std::max(1, done_), format_seconds(eta).c_str(), what.c_str());
      if (done_ == total_) std::fprintf(stderr, "\n");
    } else if (done_ == total_ || done_ % std::max(1, total_ / 4) == 0) {
      std::fprintf(stderr, "%s %d/%d tensors, %.2fs/tensor, ETA %s\n", label_.c_str(), done_, total_,
                   el / std::max(1, done_), format_seconds(eta).c_str());
    }
  }

 private:
  using clock = std::chrono::steady_clock;
  std::mutex mu_;
  bool enabled_, tty_;
  int total_, done_ = 0;
  std::string label_;
  clock::time_point start_;
};

struct TensorReport {
  std::string name;
  int layer, expert, w;
  int64_t k, n;
  double tokens, proxy_err, proxy_err_before_refit, global_scale, seconds;
  bool refit_kept, identity_fallback;
  double sigma_reg;
  int candidate, candidates;
  double scale_mult;
};

ojson report_json(const TensorReport& r) {
  return ojson{{"name", r.name},
               {"layer", r.layer},
               {"expert", r.expert},
               {"proj", "w" + std::to_string(r.w)},
               {"k", r.k},
               {"n", r.n},
               {"calibration_tokens", r.tokens},
               {"proxy_err", r.proxy_err},
               {"proxy_err_before_refit", r.proxy_err_before_refit},
               {"refit_kept", r.refit_kept},
               {"identity_fallback", r.identity_fallback},
               {"global_scale", r.global_scale},
               {"candidate", r.candidate},
               {"candidates", r.candidates},
               {"sigma_reg", r.sigma_reg},
               {"scale_mult", r.scale_mult},
               {"seconds", r.seconds}};
}

}  // namespace

Status quantize_layer(LayerQuantizer& lq, const LayerJob& job, ThreadPool& pool) {
  const QuantizeModelOptions& o = lq.options;
  const Checkpoint& ck = lq.source;
  const Exl3Codebook cb = lq.codebook;
  const int d = lq.d, f = lq.f, l = job.layer;
  const int64_t kd = (d + 127) / 128 * 128, kf = (f + 127) / 128 * 128;
  const bool on_cuda = o.device == "cuda";
  const std::vector<int>& experts = job.experts;
  const int threads = lq.threads;
  int& dumps_left = lq.dumps_left;
  const int n_tasks = int(experts.size()) * 3;
  std::vector<Result<QuantizedTensor>> results(size_t(n_tasks), Error{"not run"});
  std::vector<TensorReport> reports(static_cast<size_t>(n_tasks));
  Progress progress(o.progress, n_tasks, job.label);
  std::atomic<int> next{0};
  std::mutex dump_mu;
  Status dump_status;
  // --device cuda: two workers share the GPU (one loads and dequantizes while the other runs).
  const int workers = on_cuda ? std::min(threads, 2) : threads;
  pool.parallel_for(size_t(workers), [&](size_t, size_t) {
#if defined(SPW_HAVE_QUANTIZE_CUDA)
    auto gpu = on_cuda ? Exl3CudaQuantizer::create()
                       : Result<std::unique_ptr<Exl3CudaQuantizer>>(std::unique_ptr<Exl3CudaQuantizer>{});
#endif
    for (int task = next++; task < n_tasks; task = next++) {
      const int ei = task / 3, w = task % 3 + 1, e = experts[size_t(ei)];
      const std::string& stem = job.stems[size_t(task)];
      const int n_out = w == 2 ? d : f, n_in = w == 2 ? f : d;
      const int64_t k = w == 2 ? kf : kd, n = w == 2 ? kd : kf;
      auto wt = load_source_weight(ck, stem, n_out, n_in, k, n);
      if (!wt.ok()) {
        results[size_t(task)] = wt.error();
        continue;
      }
      std::vector<double> h;
      double tokens = 0;
      if (job.hessians) {
        h = job.hessians->padded(e, w == 2, k);
        tokens = job.hessians->tokens(e);
      }
      QuantizeParams qp;
      qp.bits = o.bits;
      qp.codebook = cb;
      qp.seed = tensor_seed(o.seed, l, e, w);
      qp.sigma_reg = o.sigma_reg;
      for (QuantizeCandidate& a : qp.alternatives) a.sigma_reg = o.sigma_reg;
      if (o.single_candidate) qp.alternatives.clear();
#if defined(SPW_HAVE_QUANTIZE_CUDA)
      if (on_cuda)
        results[size_t(task)] = gpu.ok() ? (*gpu)->quantize(wt->data(), k, n, h, qp) : Result<QuantizedTensor>(gpu.error());
      else
#endif
        results[size_t(task)] = exl3_quantize_tensor(wt->data(), k, n, h, qp);
      if (results[size_t(task)].ok()) {
        const QuantizedTensor& q = *results[size_t(task)];
        reports[size_t(task)] = TensorReport{stem, l, e, w, k, n, tokens, q.proxy_err, q.proxy_err_before_refit,
                                             q.global_scale, q.seconds, q.refit_kept, q.fell_back_to_identity,
                                             q.sigma_reg, q.candidate, q.candidates, q.scale_mult};
        std::lock_guard<std::mutex> lock(dump_mu);
        if (dumps_left > 0) {
          --dumps_left;
          SafetensorsWriter dw;
          dw.add_raw("W", DType::F32, {k, n}, wt->data(), wt->size() * 4);
          std::vector<float> hf(size_t(k * k));
          if (h.empty()) for (int64_t i = 0; i < k; ++i) hf[size_t(i * k + i)] = 1.f;
          else for (size_t i = 0; i < hf.size(); ++i) hf[i] = float(h[i]);
          dw.add_raw("H", DType::F32, {k, k}, hf.data(), hf.size() * 4);
          std::vector<float> wq = exl3_weight_ref(q.view(stem));
          dw.add_raw("W_spillway", DType::F32, {k, n}, wq.data(), wq.size() * 4);
          double pe[2] = {q.proxy_err, double(o.bits)};
          dw.add_raw("proxy_err_spillway", DType::F64, {1}, &pe[0], 8);
          auto st = dw.write(o.dump_wh_dir + "/" + stem + ".safetensors");
          if (!st.ok()) dump_status = st;
        }
      }
      progress.tick(stem);
    }
  });
  if (!dump_status.ok()) return dump_status.error();
  SafetensorsWriter shard;
  ojson layer_report = ojson::array();
  for (int task = 0; task < n_tasks; ++task) {
    if (!results[size_t(task)].ok())
      return make_error("layer ", l, ": ", job.stems[size_t(task)], ": ", results[size_t(task)].error().message);
    const QuantizedTensor& q = *results[size_t(task)];
    const std::string& stem = reports[size_t(task)].name;
    shard.add_raw(stem + ".trellis", DType::I16, {q.k / 16, q.n / 16, 16 * q.bits}, q.trellis.data(), q.trellis.size() * 2);
    shard.add_raw(stem + ".suh", DType::F16, {q.k}, q.suh.data(), q.suh.size() * 2);
    shard.add_raw(stem + ".svh", DType::F16, {q.n}, q.svh.data(), q.svh.size() * 2);
    if (cb != Exl3Codebook::k3Inst) {
      const uint32_t marker = cb == Exl3Codebook::kMul1 ? kExl3Mul1Mult : kExl3McgMult;
      shard.add_raw(stem + (cb == Exl3Codebook::kMul1 ? ".mul1" : ".mcg"), DType::I32, {}, &marker, 4);
    }
    layer_report.push_back(report_json(reports[size_t(task)]));
  }
  SPW_TRY(shard.write(job.shard_path));
  SPW_TRY(write_text_file(job.report_path, layer_report.dump(1) + "\n"));
  return {};
}

}  // namespace spw::quant
