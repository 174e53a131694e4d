// The `spillway quantize` driver: plan, checks, calibration, per-layer quantization with resume,
// and the pack files. See quantize_model.h for the layout and docs/quantize.md for the policy.
#include "quantize/quantize_model.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/thread_pool.h"
#include "formats/exl3.h"
#include "formats/quant.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "quantize/calibration.h"
#include "quantize/exl3_quantize.h"
#include "quantize/hessian_file.h"
#include "quantize/quantize_layer.h"
#include "quantize/safetensors_writer.h"
#include "quantize/trellis_encode.h"
#if defined(SPW_HAVE_QUANTIZE_CUDA)
#include "quantize/cuda/exl3_quantize_cuda.h"
#endif

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace spw::quant {
namespace {

const char* kWorkDir = ".quantize-work";

std::string shard_name(int i, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i, n);
  return buf;
}

std::string fmt_bytes(double b) {
  char buf[32];
  if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6) std::snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
  else std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
  return buf;
}

uint64_t fnv1a_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t h = 1469598103934665603ull;
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof buf);
    for (std::streamsize i = 0; i < in.gcount(); ++i) h = (h ^ uint8_t(buf[i])) * 1099511628211ull;
  }
  return h;
}

const TensorInfo* find_any(const Checkpoint& ck, const std::string& name) {
  if (auto* t = ck.find(name)) return t;
  return ck.find("model." + name);
}

Result<ojson> read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(path, ": cannot read");
  ojson j = ojson::parse(in, nullptr, false);
  if (j.is_discarded()) return make_error(path, ": not valid JSON");
  return j;
}

Status check_writable(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    return make_error("output ", dir, ": exists and is not a directory");
  fs::create_directories(dir, ec);
  if (ec) return make_error("output directory ", dir, ": cannot create: ", ec.message());
  const std::string probe = dir + "/.spillway-write-test";
  FILE* f = std::fopen(probe.c_str(), "wb");
  if (!f) return make_error("output directory ", dir, ": not writable: ", std::strerror(errno));
  const bool ok = std::fputs("ok", f) >= 0 && std::fflush(f) == 0;
  std::fclose(f);
  std::remove(probe.c_str());
  if (!ok) return make_error("output directory ", dir, ": write failed (disk full?)");
  return {};
}

Result<std::vector<int>> resolve_selection(const std::vector<int>& sel, int n, const char* what) {
  std::vector<int> out;
  if (sel.empty()) {
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (int v : sel) {
    if (v < 0 || v >= n) return make_error("--", what, " ", v, ": outside 0..", n - 1);
    out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

Result<QuantizeModelResult> quantize_model(const QuantizeModelOptions& o) {
  using clock = std::chrono::steady_clock;
  // ---- settings and source checks ----
  if (o.bits < 1 || o.bits > 8)
    return make_error("--bits ", o.bits, ": must be an integer 1..8 (EXL3 trellis bits per weight; 2–4 are useful)");
  Exl3Codebook cb;
  if (o.codebook == "mul1") cb = Exl3Codebook::kMul1;
  else if (o.codebook == "mcg") cb = Exl3Codebook::kMcg;
  else if (o.codebook == "3inst") cb = Exl3Codebook::k3Inst;
  else return make_error("--codebook ", o.codebook, ": expected mul1, mcg or 3inst");
  const bool on_cuda = o.device == "cuda";
  if (!on_cuda && o.device != "cpu") return make_error("--device ", o.device, ": expected cpu or cuda");
#if !defined(SPW_HAVE_QUANTIZE_CUDA)
  if (on_cuda) return make_error("--device cuda: this build has no CUDA quantizer (configure with -DSPILLWAY_CUDA=ON)");
#endif
  if (o.out_dir.empty()) return make_error("--out: required");
  std::error_code ec;
  if (fs::exists(o.out_dir) && fs::equivalent(o.out_dir, o.model_dir, ec))
    return make_error("--out ", o.out_dir, ": is the source model directory; choose a new directory");
  auto config = read_model_config(o.model_dir);
  if (!config.ok()) return config.error();
  const ModelConfig& c = *config;
  // --dry-run also plans from a header-only checkpoint (tools/make_header_only_checkpoint.py): shapes suffice.
  auto ck_r = Checkpoint::open(o.model_dir, OpenOptions{o.dry_run});
  if (!ck_r.ok()) return ck_r.error();
  const Checkpoint& ck = *ck_r;
  if (!o.identity_hessian) {
    if (o.calibration.empty())
      return make_error("--calibration FILE is required (or --identity-hessian for uncalibrated quantization)");
    if (!fs::is_regular_file(o.calibration))
      return make_error("calibration file ", o.calibration, ": not found");
  }
  auto layers_r = resolve_selection(o.layers, c.n_layers, "layers");
  if (!layers_r.ok()) return layers_r.error();
  auto experts_r = resolve_selection(o.experts, c.n_experts, "experts");
  if (!experts_r.ok()) return experts_r.error();
  const std::vector<int> layers = *layers_r, experts = *experts_r;
  const int d = c.d_model, f = c.d_expert;
  const int64_t kd = (d + 127) / 128 * 128, kf = (f + 127) / 128 * 128;

  // Every selected expert tensor must exist (named like the checkpoint names it).
  std::vector<std::string> stems;  // [layer slot][expert slot][w] flattened
  for (int l : layers)
    for (int e : experts)
      for (int w = 1; w <= 3; ++w) {
        const std::string base = "layers." + std::to_string(l) + ".ffn.experts." + std::to_string(e) + ".w" + std::to_string(w);
        const TensorInfo* t = find_any(ck, base + ".weight");
        if (!t) {
          if (find_any(ck, base + ".trellis"))
            return make_error(ck.root(), ": '", base, "' is already EXL3; quantize from the original checkpoint");
          return make_error(ck.root(), ": missing routed expert tensor '", base,
                            ".weight' (layer ", l, ", expert ", e, "); is the checkpoint complete?");
        }
        if (!t->data && !o.dry_run)
          return make_error(t->file, ": tensor '", t->name, "' has no data (header-only checkpoint?)");
        stems.push_back(t->name.substr(0, t->name.size() - 7));
      }

  // Source files: model shards (tensors we re-shard) and everything else (copied verbatim).
  std::set<std::string> shard_files;
  for (const auto& file : ck.files()) shard_files.insert(fs::path(file->path()).filename().string());
  std::set<std::string> verbatim_tensor_files;  // safetensors side files, e.g. engram_token_map
  for (const auto& name : shard_files)
    if (name.rfind("model", 0) != 0) verbatim_tensor_files.insert(name);
  std::set<std::string> expert_tensor_names;
  for (const auto& s : stems) {
    expert_tensor_names.insert(s + ".weight");
    expert_tensor_names.insert(s + ".scale");
  }
  uint64_t base_nbytes = 0, copied_nbytes = 0;
  for (const auto& [name, t] : ck.tensors()) {
    if (verbatim_tensor_files.count(fs::path(t->file).filename().string())) continue;
    if (!expert_tensor_names.count(name)) base_nbytes += t->nbytes;
  }
  std::vector<fs::path> copy_files;
  for (const auto& entry : fs::directory_iterator(o.model_dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    if (name == "config.json" || name == "quantization_config.json" || name == "model.safetensors.index.json") continue;
    if (shard_files.count(name) && !verbatim_tensor_files.count(name)) continue;
    if (name.size() > 12 && name.substr(name.size() - 12) == ".safetensors" && !shard_files.count(name)) continue;
    copy_files.push_back(entry.path());
    copied_nbytes += entry.file_size();
  }
  std::sort(copy_files.begin(), copy_files.end());
  const int n_tensors = int(stems.size());
  auto expert_nbytes = [&](int64_t k, int64_t n) { return uint64_t(k / 16 * (n / 16) * 16 * o.bits * 2 + (k + n) * 2 + 4); };
  const uint64_t quant_nbytes = uint64_t(layers.size() * experts.size()) * (2 * expert_nbytes(kd, kf) + expert_nbytes(kf, kd));
  const uint64_t total_nbytes = base_nbytes + quant_nbytes + copied_nbytes;

  // Time estimate: one tile encode, times tiles (with the scale search's extra tiles), per thread.
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  double tile_seconds;
  {
    TrellisEncoder enc(o.bits, cb);
    float tile[256], dec[256];
    std::vector<uint16_t> words(size_t(16 * o.bits));
    for (int i = 0; i < 256; ++i) tile[i] = float(std::sin(i * 0.37) * 1.2);
    enc.encode_tile_rowmajor(tile, words.data(), dec);  // warm-up: tables, page faults
    const auto t0 = clock::now();
    for (int i = 0; i < 2; ++i) enc.encode_tile_rowmajor(tile, words.data(), dec);
    tile_seconds = std::chrono::duration<double>(clock::now() - t0).count() / 2;
  }
  QuantizeParams default_params;
  if (o.single_candidate) default_params.alternatives.clear();
  const double n_candidates = double(quantize_candidates(default_params, !o.identity_hessian).size());
  // + global-scale search (5 scales × 4 tiles), once per candidate; the polish (calibrated only) re-encodes every
  // tile once per pass, and with several candidates runs on the winner quantized again (quantize_search).
  const double tiles = double(kd / 16 * (kf / 16));
  const double passes = o.identity_hessian ? 0.0 : double(default_params.polish_passes);
  const double tiles_per_tensor = (tiles + 20) * n_candidates +
                                  (passes == 0 ? 0.0 : n_candidates > 1 ? tiles * (1 + passes) + 20 : tiles * passes);
  const double est_seconds = tile_seconds * tiles_per_tensor * n_tensors / threads;

  // Calibration memory (calibration.h): the streamed forward holds the model-wide weights, one layer and every
  // row's state; the Hessian accumulators are collected for as many experts at a time as the budget allows.
  const CalibrationMemory mem = calibration_memory(c, ck, o.calibration_tokens, o.row_tokens, o.gate_up_shared,
                                                  int(global_pool().size()));
  const uint64_t ram_bytes = uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
  const double budget_d = o.calibration_memory_gib > 0 ? o.calibration_memory_gib * double(1ull << 30)
                                                        : 0.8 * double(ram_bytes) - double(mem.fixed());
  const uint64_t hessian_budget = budget_d > 0 ? uint64_t(budget_d) : 0;
  const int expert_group = int(std::min<uint64_t>(uint64_t(c.n_experts), hessian_budget / std::max<uint64_t>(1, mem.per_expert)));
  const uint64_t calibration_peak = mem.fixed() + uint64_t(expert_group) * mem.per_expert;

  auto plan_text = [&] {
    std::ostringstream s;
    s << "plan: " << o.model_dir << " → " << o.out_dir << "\n"
      << "  quantize " << n_tensors << " routed-expert tensors (" << layers.size() << " layers × " << experts.size()
      << " experts × w1/w2/w3) to EXL3 K=" << o.bits << " " << o.codebook << "\n"
      << "    w1, w3: [k=" << kd << ", n=" << kf << "]   w2: [k=" << kf << ", n=" << kd << "]\n"
      << "  hessians: "
      << (o.identity_hessian ? std::string("identity (uncalibrated)")
                             : "calibrated on " + o.calibration + ", up to " + std::to_string(o.calibration_tokens) +
                                   " tokens in rows of " + std::to_string(o.row_tokens) +
                                   (o.routing_weighted ? ", routing-weighted" : "") +
                                   (o.gate_up_shared ? ", gate/up shared per layer" : ", gate/up per expert"))
      << (o.identity_hessian
              ? std::string()
              : "\n  calibration memory: " + fmt_bytes(double(calibration_peak)) + " = " + fmt_bytes(double(mem.model_wide)) +
                    " model-wide weights + " + fmt_bytes(double(mem.largest_layer)) +
                    " for one layer without its routed experts + " + fmt_bytes(double(mem.expert_values)) +
                    " for the routed experts in use (one per thread, dequantized when used) + " +
                    fmt_bytes(double(mem.row_state + mem.layer_inputs)) + " for the rows' state and one layer's inputs + " +
                    fmt_bytes(double(mem.layer_hessian)) + " layer Hessian + Hessians of " + std::to_string(expert_group) +
                    " of " + std::to_string(c.n_experts) + " experts at a time (" + fmt_bytes(double(mem.per_expert)) +
                    " each; budget " + fmt_bytes(double(hessian_budget)) + ")")
      << "\n  estimated time: "
      << (on_cuda ? std::string("on the GPU (--device cuda); bench_quantize measures seconds per tensor\n")
                  : format_seconds(est_seconds) + " on " + std::to_string(threads) + " threads (" +
                        format_seconds(tile_seconds * tiles_per_tensor) + " per tensor per thread, excluding calibration)\n")
      << "  output: " << fmt_bytes(double(total_nbytes)) << " (" << fmt_bytes(double(base_nbytes))
      << " copied tensors, " << fmt_bytes(double(quant_nbytes)) << " EXL3 experts, " << fmt_bytes(double(copied_nbytes))
      << " other files) in " << (1 + layers.size()) << " shards\n";
    return s.str();
  };
  if (o.dry_run) {
    std::fputs(plan_text().c_str(), stdout);
    std::printf("  tensors:\n");
    for (const auto& s : stems) std::printf("    %s\n", s.c_str());
    QuantizeModelResult r;
    r.tensors = n_tensors;
    return r;
  }
  std::fputs(plan_text().c_str(), stderr);
  if (!o.identity_hessian && expert_group == 0)
    return make_error("calibration does not fit in memory: ", fmt_bytes(double(mem.fixed())),
                      " for the model-wide weights, one layer, the rows' state and the layer Hessian, and one expert's ",
                      "Hessians take ", fmt_bytes(double(mem.per_expert)), " but the budget is ",
                      fmt_bytes(double(hessian_budget)), " (", fmt_bytes(double(ram_bytes)), " of RAM). ",
                      "Use --gate-up-shared (one gate/up Hessian per layer), fewer --calibration-tokens, raise "
                      "--calibration-memory if the machine has the room, or --identity-hessian (uncalibrated)");

  // ---- output directory, space, resume state ----
  SPW_TRY(check_writable(o.out_dir));
  const fs::space_info space = fs::space(o.out_dir, ec);
  if (!ec && space.available < total_nbytes + total_nbytes / 20)
    return make_error("output directory ", o.out_dir, ": not enough space: the pack needs about ",
                      fmt_bytes(double(total_nbytes)), ", ", fmt_bytes(double(space.available)), " available");
  const std::string work = o.out_dir + "/" + kWorkDir;
  fs::create_directories(work + "/hessians", ec);
  if (ec) return make_error(work, ": cannot create: ", ec.message());
  ojson fingerprint{{"bits", o.bits},
                    {"codebook", o.codebook},
                    {"device", o.device},
                    {"seed", o.seed},
                    {"identity_hessian", o.identity_hessian},
                    {"single_candidate", o.single_candidate},
                    {"routing_weighted", o.routing_weighted},
                    {"gate_up_shared", o.gate_up_shared},
                    {"prior_tokens", o.prior_tokens},
                    {"prior_sample_tokens", o.prior_sample_tokens},
                    {"sigma_reg", o.sigma_reg},
                    {"calibration_fnv1a", o.identity_hessian ? std::string() : std::to_string(fnv1a_file(o.calibration))},
                    {"calibration_tokens", o.identity_hessian ? 0 : o.calibration_tokens},
                    {"row_tokens", o.identity_hessian ? 0 : o.row_tokens},
                    {"layers", layers},
                    {"experts", experts},
                    {"source_config_fnv1a", std::to_string(fnv1a_file(o.model_dir + "/config.json"))}};
  const std::string fp_path = work + "/settings.json";
  if (fs::exists(fp_path)) {
    auto old = read_json(fp_path);
    if (!old.ok()) return old.error();
    if (*old != fingerprint)
      return make_error(o.out_dir, ": holds a partial or finished pack made with other settings (", fp_path,
                        "); use a new --out directory or delete it");
  } else {
    SPW_TRY(write_text_file(fp_path, fingerprint.dump(2) + "\n"));
  }
  const int n_shards = 1 + int(layers.size());
  auto layer_report_path = [&](int l) { return work + "/layer-" + std::to_string(l) + ".json"; };
  auto hessian_path = [&](int l) { return work + "/hessians/layer-" + std::to_string(l) + ".safetensors"; };
  std::vector<int> pending;
  QuantizeModelResult result;
  for (size_t i = 0; i < layers.size(); ++i) {
    const bool done = fs::exists(layer_report_path(layers[i])) &&
                      fs::exists(o.out_dir + "/" + shard_name(int(i) + 2, n_shards));
    if (done) ++result.layers_skipped;
    else pending.push_back(int(i));
  }
  if (result.layers_skipped)
    std::fprintf(stderr, "resume: %d of %zu layers already quantized, skipped\n", result.layers_skipped, layers.size());

  // ---- quantization, layer by layer; calibration streamed in between ----
  // Pending layers whose Hessians are on disk (kept from an earlier run) or that need none are quantized first.
  // The others are calibrated in one layer-major forward, and each is quantized as soon as its Hessians are
  // written, before the forward goes on (calibration.h). A quantized layer's Hessian file is deleted unless
  // --keep-hessians. With --max-layers, the calibration still saves the other pending layers' Hessians.
  ThreadPool pool(static_cast<size_t>(threads));
  LayerQuantizer lq{o, ck, cb, d, f, threads, o.dump_wh_dir.empty() ? 0 : o.dump_wh_count};
  if (lq.dumps_left > 0) {
    fs::create_directories(o.dump_wh_dir, ec);
    if (ec) return make_error("--dump-wh ", o.dump_wh_dir, ": cannot create: ", ec.message());
  }
  std::vector<int> slot_of(size_t(c.n_layers), -1);
  for (size_t i = 0; i < layers.size(); ++i) slot_of[size_t(layers[i])] = int(i);
  auto quantize_pending = [&](int l) -> Status {
    if (o.max_layers >= 0 && result.layers_quantized >= o.max_layers) return {};
    const int slot = slot_of[size_t(l)];
    LayerJob job;
    job.layer = l;
    job.experts = experts;
    job.stems.assign(stems.begin() + long(size_t(slot) * experts.size() * 3),
                     stems.begin() + long(size_t(slot + 1) * experts.size() * 3));
    job.shard_path = o.out_dir + "/" + shard_name(slot + 2, n_shards);
    job.report_path = layer_report_path(l);
    job.label = "layer " + std::to_string(l) + " (" +
                std::to_string(result.layers_quantized + result.layers_skipped + 1) + "/" + std::to_string(layers.size()) + ")";
    std::optional<LayerHessianFile> hessians;
    if (!o.identity_hessian) {
      auto h = LayerHessianFile::open(hessian_path(l), d, f, c.n_experts);
      if (!h.ok()) return h.error();
      hessians = std::move(h.value());
      job.hessians = &*hessians;
    }
    SPW_TRY(quantize_layer(lq, job, pool));
    ++result.layers_quantized;
    if (!o.keep_hessians && !o.identity_hessian) fs::remove(hessian_path(l), ec);
    return {};
  };
  std::vector<int> need;  // pending layers still to calibrate
  for (int i : pending) {
    const int l = layers[size_t(i)];
    if (!o.identity_hessian && !fs::exists(hessian_path(l))) need.push_back(l);
    else SPW_TRY(quantize_pending(l));
  }
  if (!need.empty()) {
    auto rows = load_calibration_rows(o.model_dir, o.calibration, o.calibration_tokens, o.row_tokens);
    if (!rows.ok()) return rows.error();
    std::fprintf(stderr, "calibration: %zu rows × %d tokens from %s (%lld tokens, %d documents, %d chat); "
                 "the forward runs layer by layer through layer %d\n",
                 rows->rows.size(), o.row_tokens, o.calibration.c_str(), (long long)rows->stream_tokens,
                 rows->n_documents, rows->n_chat, need.back());
    HessianOptions ho;
    ho.routing_weighted = o.routing_weighted;
    ho.gate_up_shared = o.gate_up_shared;
    ho.prior_tokens = o.prior_tokens;
    ho.prior_sample_tokens = o.prior_sample_tokens;
    ho.layers = need;
    ho.expert_group = expert_group;
    const auto t0 = clock::now();
    ho.on_progress = [&](int64_t done, int64_t total) {
      if (!o.progress) return;
      const double el = std::chrono::duration<double>(clock::now() - t0).count();
      std::fprintf(stderr, "%scalibration forward: %lld/%lld token-layers, ETA %s (excluding quantization)%s",
                   isatty(2) ? "\r" : "", (long long)done, (long long)total,
                   format_seconds(el / double(done) * double(total - done)).c_str(),
                   isatty(2) && done < total ? "   " : "\n");
    };
    SPW_TRY(collect_hessians(o.model_dir, *rows, ho, hessian_path, quantize_pending));
  }
  const int n_done = result.layers_quantized + result.layers_skipped;
  if (n_done < int(layers.size())) {
    std::fprintf(stderr, "stopped after %d of %zu layers; rerun the same command to resume\n", n_done, layers.size());
    return result;
  }

  // ---- the rest of the pack: copied tensors, index, configs, side files, report ----
  ojson weight_map = ojson::object();
  uint64_t total_size = 0;
  {
    SafetensorsWriter base;
    for (const auto& [name, t] : ck.tensors()) {
      if (verbatim_tensor_files.count(fs::path(t->file).filename().string())) continue;
      if (expert_tensor_names.count(name)) continue;
      if (!t->data) return make_error(t->file, ": tensor '", name, "' has no data (header-only checkpoint?)");
      base.add_raw(name, t->dtype, t->shape, t->data, t->nbytes);
    }
    const std::string base_name = shard_name(1, n_shards);
    const std::string base_path = o.out_dir + "/" + base_name;
    SPW_TRY(base.write(base_path));
    for (const auto& [name, t] : base.tensors()) weight_map[name] = base_name, total_size += t.bytes.size();
  }
  ojson tensor_storage = ojson::object();
  std::vector<ojson> all_reports;
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string sname = shard_name(int(i) + 2, n_shards);
    auto f = SafetensorsFile::open(o.out_dir + "/" + sname);
    if (!f.ok()) return f.error();
    for (const auto& [name, t] : (*f)->tensors()) {
      weight_map[name] = sname;
      total_size += t.nbytes;
      const std::string module = name.substr(0, name.rfind('.'));
      ojson& m = tensor_storage[module];
      if (m.empty()) {
        m["stored_tensors"] = ojson::object();
        m["quant_format"] = "exl3";
        m["bits_per_weight"] = o.bits;
        if (cb == Exl3Codebook::kMul1) m["mul1_multiplier"] = int32_t(kExl3Mul1Mult);
        if (cb == Exl3Codebook::kMcg) m["mcg_multiplier"] = int32_t(kExl3McgMult);
      }
      const char* dt = t.dtype == DType::I16 ? "int16" : t.dtype == DType::F16 ? "float16" : "int32";
      m["stored_tensors"][name] = ojson{{"shape", t.shape}, {"dtype", dt}};
    }
    auto rep = read_json(layer_report_path(layers[i]));
    if (!rep.ok()) return rep.error();
    for (auto& r : *rep) all_reports.push_back(r);
  }
  // Sort the weight map by name for a stable file.
  ojson sorted_map = ojson::object();
  {
    std::vector<std::string> names;
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) names.push_back(it.key());
    std::sort(names.begin(), names.end());
    for (const auto& n : names) sorted_map[n] = weight_map[n];
  }
  ojson index{{"metadata", {{"total_size", total_size}}}, {"weight_map", sorted_map}};
  SPW_TRY(write_text_file(o.out_dir + "/model.safetensors.index.json", index.dump(2) + "\n"));

  auto src_config = read_json(o.model_dir + "/config.json");
  if (!src_config.ok()) return src_config.error();
  ojson qc{{"quant_method", "exl3"},
           {"version", "spillway-quantize-1"},
           {"bits", double(o.bits)},
           {"calibration", {{"rows", o.identity_hessian ? 0 : int(o.calibration_tokens / o.row_tokens)},
                            {"cols", o.identity_hessian ? 0 : o.row_tokens}}},
           {"out_scales", "always"},
           {"codebook", o.codebook},
           {"quantized_modules", "routed_experts"},
           {"spillway", {{"hessian", o.identity_hessian ? "identity" : "calibrated"},
                         {"routing_weighted", o.routing_weighted},
                         {"gate_up_hessian", o.gate_up_shared ? "layer" : "expert"},
                         {"prior_tokens", o.prior_tokens},
                         {"sigma_reg", o.sigma_reg},
                         {"seed", o.seed}}}};
  if (src_config->contains("quantization_config")) qc["original_quantization_config"] = (*src_config)["quantization_config"];
  ojson out_config = *src_config;
  out_config["quantization_config"] = qc;
  SPW_TRY(write_text_file(o.out_dir + "/config.json", out_config.dump(2) + "\n"));
  ojson sidecar = qc;
  sidecar["tensor_storage"] = tensor_storage;
  SPW_TRY(write_text_file(o.out_dir + "/quantization_config.json", sidecar.dump(2) + "\n"));
  for (const auto& p : copy_files) {
    fs::copy_file(p, fs::path(o.out_dir) / p.filename(), fs::copy_options::overwrite_existing, ec);
    if (ec) return make_error(p.string(), ": cannot copy into ", o.out_dir, ": ", ec.message());
  }

  // Report: JSON and a summary table.
  double sum_err = 0;
  std::map<std::string, std::vector<double>> by_proj;
  for (const auto& r : all_reports) {
    sum_err += r["proxy_err"].get<double>();
    by_proj[r["proj"].get<std::string>()].push_back(r["proxy_err"].get<double>());
  }
  result.tensors = int(all_reports.size());
  result.mean_proxy_err = all_reports.empty() ? 0 : sum_err / double(all_reports.size());
  ojson report{{"settings", fingerprint}, {"mean_proxy_err", result.mean_proxy_err}, {"tensors", all_reports}};
  SPW_TRY(write_text_file(o.out_dir + "/quantize_report.json", report.dump(1) + "\n"));
  std::printf("proxy error tr(ΔW H ΔWᵀ)/tr(W H Wᵀ)%s, K=%d %s:\n", o.identity_hessian ? " (H = I)" : "", o.bits,
              o.codebook.c_str());
  std::printf("  %-5s %8s %10s %10s %10s\n", "proj", "tensors", "mean", "median", "max");
  for (auto& [proj, v] : by_proj) {
    std::sort(v.begin(), v.end());
    double mean = 0;
    for (double x : v) mean += x;
    mean /= double(v.size());
    std::printf("  %-5s %8zu %10.5f %10.5f %10.5f\n", proj.c_str(), v.size(), mean, v[v.size() / 2], v.back());
  }
  std::printf("  all   %8d %10.5f\n", result.tensors, result.mean_proxy_err);
  if (!o.keep_hessians) fs::remove_all(work + "/hessians", ec);
  result.complete = true;
  return result;
}

}  // namespace spw::quant
