// quantize_candidates: what the per-tensor candidate search (QuantizeParams::alternatives: regularisation
// strengths, sign draws, global-scale multipliers) and the polish of its winner buy, on the CPU quantizer, for
// W/H dumps written by `spillway quantize --dump-wh DIR` (W [k][n] f32, H [k][k] f32).
// It runs the search of quantize_search step by step, with the sign seed the pack gives the tensor (tensor_seed
// from the stem model.layers.L.ffn.experts.E.wP, --seed 0): each candidate alone (candidate_params), without the
// polish when there are several (columns #c), then the winner again with the polish ("polished winner"); "best"
// is what the default (`spillway quantize`) writes: the lower of the two (lowest proxy error
// tr(ΔWᵀHΔW)/tr(WᵀHW) on the undamped H, ties to the earlier). With one candidate (--cands of one) column #0 is
// that candidate with the polish, what `--single-candidate` writes. Reference errors for the same W/H (e.g.
// exllamav3's, bench/results/raw/compare_wide_*.md) can be given as "stem=value" arguments.
// --cands σ:signs:mult,... replaces the default candidate list (experiments; the first is #0, its signs
// offset is taken as 0).
// --device cuda (CUDA builds): the CUDA quantizer, one Exl3CudaQuantizer per thread (its LDL is cuSOLVER's,
// so its errors match the CPU's to ~1e-3 relative, not bit for bit; tests/gpu/test_quantize_cuda.cpp).
// --scale-tiles N sets QuantizeParams::scale_sample_tiles; --polish N sets QuantizeParams::polish_passes
// (0: no polish, the search as before 2026-12-03).
// --json FILE writes {stem: {"err": [per candidate], "polished": value or -1, "best": value}} for
// tools/quantize/compare_wide.py.
// Usage: quantize_candidates --bits K [--threads T] [--device cpu|cuda] [--cands ...] [--scale-tiles N]
//        [--polish N] [--json FILE] FILE.safetensors... [stem=err...]
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "formats/safetensors.h"
#include "quantize/exl3_quantize.h"
#if defined(SPW_HAVE_QUANTIZE_CUDA)
#include "quantize/cuda/exl3_quantize_cuda.h"
#endif

namespace {

struct Dump {
  std::string stem;
  int64_t k = 0, n = 0;
  uint64_t seed = 0;
  std::vector<float> w;
  std::vector<double> h;
};

spw::Result<Dump> load_dump(const std::string& path) {
  auto f = spw::SafetensorsFile::open(path);
  if (!f.ok()) return f.error();
  const spw::TensorInfo* w = (*f)->find("W");
  const spw::TensorInfo* h = (*f)->find("H");
  if (!w || !h || w->dtype != spw::DType::F32 || h->dtype != spw::DType::F32 || w->shape.size() != 2 ||
      h->shape.size() != 2 || h->shape[0] != w->shape[0] || h->shape[1] != w->shape[0])
    return spw::make_error(path, ": expected W [k][n] f32 and H [k][k] f32 (a --dump-wh file)");
  Dump d;
  const std::string base = path.substr(path.find_last_of('/') + 1);
  d.stem = base.substr(0, base.rfind(".safetensors"));
  int layer = 0, expert = 0, proj = 0;
  if (std::sscanf(d.stem.c_str(), "model.layers.%d.ffn.experts.%d.w%d", &layer, &expert, &proj) != 3)
    return spw::make_error(path, ": name is not model.layers.L.ffn.experts.E.wP.safetensors");
  d.seed = spw::quant::tensor_seed(0, layer, expert, proj);
  d.k = w->shape[0];
  d.n = w->shape[1];
  d.w.resize(size_t(d.k * d.n));
  std::memcpy(d.w.data(), w->data, d.w.size() * 4);
  std::vector<float> hf(size_t(d.k * d.k));
  std::memcpy(hf.data(), h->data, hf.size() * 4);
  d.h.assign(hf.begin(), hf.end());
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  int bits = 3, threads = 2;
  std::vector<std::string> files;
  std::map<std::string, double> ref;
  std::vector<spw::quant::QuantizeCandidate> custom;
  std::string json_path;
  int scale_tiles = 0;  // 0: QuantizeParams' default
  int polish = -1;      // -1: QuantizeParams' default
  std::string device = "cpu";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--bits" && i + 1 < argc) bits = std::atoi(argv[++i]);
    else if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--scale-tiles" && i + 1 < argc) scale_tiles = std::atoi(argv[++i]);
    else if (a == "--polish" && i + 1 < argc) polish = std::atoi(argv[++i]);
    else if (a == "--device" && i + 1 < argc) device = argv[++i];
    else if (a == "--cands" && i + 1 < argc) {
      const std::string list = argv[++i];
      for (size_t p = 0; p < list.size();) {
        size_t e = list.find(',', p);
        if (e == std::string::npos) e = list.size();
        double sg = 0, mult = 1;
        unsigned long long so = 0;
        if (std::sscanf(list.substr(p, e - p).c_str(), "%lf:%llu:%lf", &sg, &so, &mult) < 2) {
          std::fprintf(stderr, "quantize_candidates: --cands wants σ:signs[:mult],...\n");
          return 2;
        }
        custom.push_back({sg, so, mult});
        p = e + 1;
      }
    }
    else if (a == "--threads" && i + 1 < argc) threads = std::max(1, std::atoi(argv[++i]));
    else if (a.find('=') != std::string::npos) ref[a.substr(0, a.find('='))] = std::atof(a.substr(a.find('=') + 1).c_str());
    else files.push_back(a);
  }
#if !defined(SPW_HAVE_QUANTIZE_CUDA)
  if (device != "cpu") {
    std::fprintf(stderr, "quantize_candidates: --device %s: this build has no CUDA quantizer\n", device.c_str());
    return 2;
  }
#endif
  if (files.empty()) {
    std::fprintf(stderr, "usage: quantize_candidates --bits K [--threads T] FILE... [stem=err...]\n");
    return 2;
  }
  std::vector<Dump> dumps;
  for (const auto& f : files) {
    auto d = load_dump(f);
    if (!d.ok()) {
      std::fprintf(stderr, "quantize_candidates: %s\n", d.error().message.c_str());
      return 1;
    }
    dumps.push_back(std::move(*d));
  }
  spw::quant::QuantizeParams base;
  base.bits = bits;
  if (scale_tiles > 0) base.scale_sample_tiles = scale_tiles;
  if (polish >= 0) base.polish_passes = polish;
  if (!custom.empty()) {
    base.sigma_reg = custom[0].sigma_reg;
    base.scale_mult = custom[0].scale_mult;
    base.alternatives.assign(custom.begin() + 1, custom.end());
  }
  const std::vector<spw::quant::QuantizeCandidate> cands = spw::quant::quantize_candidates(base, true);
  const size_t nc = cands.size();
  // Phase 1, err[t][c]: dump t quantized as candidate c alone, without the polish when there are several
  // (quantize_search compares them so); phase 2, polished[t]: the winner again with the polish. "best" is then
  // what exl3_quantize_tensor returns for the whole list (min of the two; one candidate: the polished run).
  std::vector<std::vector<double>> err(dumps.size(), std::vector<double>(nc, 0));
  std::vector<double> polished(dumps.size(), NAN);
  std::vector<size_t> winner(dumps.size(), 0);
  std::atomic<bool> failed{false};
  // Runs job i → (dump, params) on `threads` workers; store(i, proxy error).
  auto run_jobs = [&](size_t n_jobs, const std::function<std::pair<size_t, spw::quant::QuantizeParams>(size_t)>& job_of,
                      const std::function<void(size_t, double)>& store) {
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&] {
#if defined(SPW_HAVE_QUANTIZE_CUDA)
        auto gpu = device == "cuda" ? spw::quant::Exl3CudaQuantizer::create()
                                    : spw::Result<std::unique_ptr<spw::quant::Exl3CudaQuantizer>>(
                                          std::unique_ptr<spw::quant::Exl3CudaQuantizer>{});
        if (!gpu.ok()) {
          std::fprintf(stderr, "quantize_candidates: %s\n", gpu.error().message.c_str());
          failed = true;
          return;
        }
#endif
        for (size_t job; (job = next++) < n_jobs;) {
          const auto [di, cp] = job_of(job);
          const Dump& d = dumps[di];
#if defined(SPW_HAVE_QUANTIZE_CUDA)
          auto q = *gpu ? (*gpu)->quantize(d.w.data(), d.k, d.n, d.h, cp)
                        : spw::quant::exl3_quantize_tensor(d.w.data(), d.k, d.n, d.h, cp);
#else
          auto q = spw::quant::exl3_quantize_tensor(d.w.data(), d.k, d.n, d.h, cp);
#endif
          if (!q.ok()) {
            std::fprintf(stderr, "quantize_candidates: %s: %s\n", d.stem.c_str(), q.error().message.c_str());
            failed = true;
            continue;
          }
          store(job, q->proxy_err);
        }
      });
    for (auto& th : pool) th.join();
  };
  auto params_of = [&](size_t di, size_t c, bool polish_it) {
    spw::quant::QuantizeParams p = base;
    p.seed = dumps[di].seed;
    p = spw::quant::candidate_params(p, cands[c]);
    if (!polish_it) p.polish_passes = 0;
    return p;
  };
  run_jobs(
      dumps.size() * nc, [&](size_t j) { return std::make_pair(j / nc, params_of(j / nc, j % nc, nc == 1)); },
      [&](size_t j, double e) { err[j / nc][j % nc] = e; });
  if (failed) return 1;
  const bool phase2 = nc > 1 && base.polish_passes > 0;
  for (size_t t = 0; t < dumps.size(); ++t)
    winner[t] = size_t(std::min_element(err[t].begin(), err[t].end()) - err[t].begin());
  if (phase2)
    run_jobs(
        dumps.size(), [&](size_t t) { return std::make_pair(t, params_of(t, winner[t], true)); },
        [&](size_t t, double e) { polished[t] = e; });
  if (failed) return 1;
  auto best_of = [&](size_t t) { return phase2 ? std::min(err[t][winner[t]], polished[t]) : err[t][winner[t]]; };
  std::printf("| tensor | K |");
  for (size_t c = 0; c < nc; ++c) std::printf(" #%zu σ=%g signs+%llu ×%g |", c, cands[c].sigma_reg, (unsigned long long)cands[c].seed_offset, cands[c].scale_mult);
  std::printf(" polished winner | best | kept | best/#0 |%s\n|---|---|", ref.empty() ? "" : " reference | best/reference |");
  for (size_t c = 0; c < nc + 4 + (ref.empty() ? 0 : 2); ++c) std::printf("---|");
  std::printf("\n");
  double sum_first = 0, sum_best = 0, sum_ref = 0, sum_best_ref = 0;
  int wins_ref = 0, wins_ref_first = 0, n_ref = 0;
  std::vector<int> kept(nc, 0);
  for (size_t t = 0; t < dumps.size(); ++t) {
    const size_t b = winner[t];
    const double best = best_of(t);
    ++kept[b];
    std::printf("| %s | %d |", dumps[t].stem.c_str(), bits);
    for (double e : err[t]) std::printf(" %.6f |", e);
    if (phase2) std::printf(" %.6f |", polished[t]);
    else std::printf(" - |");
    std::printf(" %.6f | #%zu | %.4f |", best, b, best / err[t][0]);
    sum_first += err[t][0];
    sum_best += best;
    if (auto it = ref.find(dumps[t].stem); it != ref.end()) {
      std::printf(" %.6f | %.4f |", it->second, best / it->second);
      sum_ref += it->second;
      sum_best_ref += best;
      ++n_ref;
      wins_ref += best <= it->second;
      wins_ref_first += err[t][0] <= it->second;
    }
    std::printf("\n");
  }
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "quantize_candidates: cannot write %s\n", json_path.c_str());
      return 1;
    }
    std::fprintf(f, "{\"bits\": %d, \"device\": \"%s\", \"tensors\": {", bits, device.c_str());
    for (size_t t = 0; t < dumps.size(); ++t) {
      std::fprintf(f, "%s\n \"%s\": {\"err\": [", t ? "," : "", dumps[t].stem.c_str());
      for (size_t c = 0; c < nc; ++c) std::fprintf(f, "%s%.9g", c ? ", " : "", err[t][c]);
      std::fprintf(f, "], \"polished\": %.9g, \"best\": %.9g}", phase2 ? polished[t] : -1.0, best_of(t));
    }
    std::fprintf(f, "}}\n");
    std::fclose(f);
  }
  const double nd = double(dumps.size());
  std::printf("\nK=%d mean proxy error: candidate #0%s %.6f, default (best of %zu%s) %.6f (%.2f%% lower); kept:", bits,
              phase2 ? " unpolished" : "", sum_first / nd, nc, phase2 ? ", winner polished" : "", sum_best / nd,
              100.0 * (1 - sum_best / sum_first));
  for (size_t c = 0; c < nc; ++c) std::printf(" #%zu %d", c, kept[c]);
  std::printf("\n");
  if (n_ref > 0)
    std::printf("K=%d vs reference (%d tensors): reference mean %.6f, best mean %.6f; best <= reference on %d/%d "
                "(candidate #0%s: %d/%d)\n",
                bits, n_ref, sum_ref / n_ref, sum_best_ref / n_ref, wins_ref, n_ref, phase2 ? " unpolished" : "",
                wins_ref_first, n_ref);
  return 0;
}
