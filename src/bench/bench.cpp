#include "bench/bench.h"

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <nlohmann/json.hpp>
#include <random>
#include <span>

#include "bench/device_rates.h"
#include "bench/host_rates.h"
#include "bench/model_costs.h"
#include "cuda/kernel_settings.h"
#include "cuda/launch.h"
#include "engine/gpu_model.h"
#include "engine/gpu_runner.h"
#include "model/config.h"
#include "runtime/routing_stats.h"

namespace spw::bench {
namespace {

using json = nlohmann::json;
using engine::GpuModel;
using engine::GpuSequence;
using Clock = std::chrono::steady_clock;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// GpuModel::decode (batched) when this build's engine has it.
template <class M>
concept HasBatchedDecode = requires(M& m, std::span<GpuSequence* const> s, std::span<const int32_t> t,
                                    std::span<int32_t> n, std::vector<float>* l) {
  { m.decode(s, t, n, l) };
};
constexpr bool kBatchedDecode = HasBatchedDecode<GpuModel>;

// A profiling window around a timed phase: cudaProfilerStart/Stop, which CUPTI tools see
// (tools/profile/kernel_trace.cpp summarises each window; scripts/bench_engine.sh PROFILE=1). The
// label is printed so a trace's window numbers can be matched to the phases.
class ProfileWindow {
 public:
  explicit ProfileWindow(const std::string& label) {
    std::printf("(profile window %d: %s)\n", next_++, label.c_str());
    cudaDeviceSynchronize();
    cudaProfilerStart();
  }
  ~ProfileWindow() {
    cudaDeviceSynchronize();
    cudaProfilerStop();
  }
  ProfileWindow(const ProfileWindow&) = delete;
  ProfileWindow& operator=(const ProfileWindow&) = delete;

 private:
  static inline int next_ = 0;
};

int32_t argmax(std::span<const float> v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

int64_t count_non_finite(const std::vector<float>& v) {
  return std::count_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
}

// One decode step of every sequence: tokens[i] for seqs[i] → next[i]; logits [B, vocab] if asked.
template <class M>
Status decode_step(M& model, std::span<GpuSequence* const> seqs, std::span<const int32_t> tokens,
                   std::span<int32_t> next, std::vector<float>* logits) {
  if constexpr (HasBatchedDecode<M>) {
    return model.decode(seqs, tokens, next, logits);
  } else {
    if (logits) logits->clear();
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto r = model.forward(*seqs[i], tokens.subspan(i, 1));
      if (!r.ok()) return r.error();
      next[i] = argmax(*r);
      if (logits) logits->insert(logits->end(), r->begin(), r->end());
    }
    return {};
  }
}

// Device memory in use now (all processes), for the peak.
struct MemoryWatch {
  size_t total = 0, baseline_used = 0, peak_used = 0;
  void sample() {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return;
    total = total_b;
    peak_used = std::max(peak_used, total_b - free_b);
  }
  size_t used_now() const {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
    return total_b - free_b;
  }
};

struct Rng {
  std::mt19937_64 gen;
  int64_t vocab;
  std::vector<int32_t> tokens(int64_t n) {
    std::uniform_int_distribution<int32_t> u(0, int32_t(vocab - 1));
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = u(gen);
    return t;
  }
};

// Prefills `tokens` in chunks of at most `chunk`; returns the last logits and the chunk times. row_invariant: chunks
// shorter than GpuModel::kRowInvariantPieceTokens on the row-invariant prefill path (GpuModel::ChunkPath::
// kRowInvariant), as the batch-invariant server prefills short prompt pieces; every other chunk GpuModel::forward.
Result<std::vector<float>> prefill(GpuModel& m, GpuSequence& seq, const std::vector<int32_t>& tokens, int chunk,
                                   bool row_invariant, std::vector<double>* chunk_seconds = nullptr) {
  std::vector<float> logits;
  for (size_t at = 0; at < tokens.size(); at += size_t(chunk)) {
    const size_t n = std::min(tokens.size() - at, size_t(chunk));
    const std::span<const int32_t> piece(tokens.data() + at, n);
    const auto t0 = Clock::now();
    if (row_invariant && int(n) < GpuModel::kRowInvariantPieceTokens) {
      const GpuModel::ChunkInput in{&seq, piece};
      auto r = m.forward_chunks(std::span<const GpuModel::ChunkInput>(&in, 1), GpuModel::ChunkPath::kRowInvariant);
      if (!r.ok()) return r.error();
      logits = std::move(r.value()[0]);
    } else {
      auto r = m.forward(seq, piece);
      if (!r.ok()) return r.error();
      logits = std::move(r.value());
    }
    if (chunk_seconds) chunk_seconds->push_back(seconds_since(t0));
  }
  return logits;
}

void print_plan(const ModelConfig& c, const engine::MemoryPlan& p, const engine::KvBudget& b, json& out) {
  const engine::WeightBytes& w = p.weights;
  char experts_row[64];
  if (c.exl3_expert_bits > 0) std::snprintf(experts_row, sizeof experts_row, "weights: routed experts (EXL3, %g bits)", c.exl3_expert_bits);
  else std::snprintf(experts_row, sizeof experts_row, "weights: routed experts (MXFP4)");
  std::printf("\n## Memory plan (before loading): max_seqs %d, max_context %lld, max_step_tokens %d\n\n", b.max_seqs,
              (long long)b.max_context, b.max_step_tokens);
  std::printf("| component | GiB |\n|---|---|\n");
  const std::pair<const char*, size_t> rows[] = {
      {"weights: embedding (f32)", w.embed}, {"weights: head", w.head}, {"weights: attention", w.attention},
      {"weights: compressors, indexers", w.compressor}, {experts_row, w.routed_experts},
      {"weights: shared experts", w.shared_experts}, {"weights: router", w.router},
      {"weights: mHC", w.hyper_connections}, {"weights: Engram projections", w.engram_dense},
      {"KV pools", p.kv.pool_nbytes()}, {"sequence state", p.state_nbytes}, {"workspace", p.workspace_nbytes},
      {"device total", p.device_total()}, {"Engram tables (host)", p.engram_tables_host_nbytes}};
  for (const auto& [name, nb] : rows) {
    std::printf("| %s | %.3f |\n", name, double(nb) / kGiB);
    out[name] = nb;
  }
}

void print_decode_bytes(const DecodeBytes& db, const std::vector<int64_t>& kv, int64_t ctx, json& out) {
  std::printf("\n## Bytes one batch-1 decode token reads (storage formats; KV at context %lld)\n\n", (long long)ctx);
  std::printf("| layer | dense (incl. shared, router) MiB | shared MiB | top-k experts MiB | one expert MiB | KV MiB | "
              "Engram rows (host) KiB |\n|---|---|---|---|---|---|---|\n");
  json layers = json::array();
  int64_t kv_total = 0;
  for (size_t l = 0; l < db.layers.size(); ++l) {
    const LayerBytes& b = db.layers[l];
    std::printf("| %zu | %.2f | %.2f | %.2f | %.3f | %.3f | %.1f |\n", l, b.dense / kMiB, b.shared / kMiB,
                b.routed / kMiB, b.expert / kMiB, kv[l] / kMiB, b.engram_host / 1024.0);
    layers.push_back({{"dense", b.dense}, {"shared", b.shared}, {"routed", b.routed}, {"expert", b.expert},
                      {"kv", kv[l]}, {"engram_host", b.engram_host}});
    kv_total += kv[l];
  }
  std::printf("\nfixed per token: embedding row %.1f KiB, head %.2f MiB, final norm/head mHC %.1f KiB\n",
              db.embed_row / 1024.0, db.head / kMiB, db.final_other / 1024.0);
  std::printf("dense weights by role (all layers):");
  for (const auto& [role, nb] : db.dense_by_role) std::printf(" %s %.2f MiB;", role.c_str(), nb / kMiB);
  std::printf("\ntotal HBM bytes per token: weights %.2f MiB + KV %.3f MiB = %.2f MiB\n", db.weights_total() / kMiB,
              kv_total / kMiB, (db.weights_total() + kv_total) / kMiB);
  out = {{"layers", layers}, {"embed_row", db.embed_row}, {"head", db.head}, {"final_other", db.final_other},
         {"dense_by_role", db.dense_by_role}, {"weights_total", db.weights_total()}, {"kv_total", kv_total},
         {"context", ctx}};
}

}  // namespace

int run_engine_bench(const EngineBenchOptions& o) {
  // Line-buffered even into a pipe: a run cut short by a timeout keeps what it printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  json report;
  Result<ModelConfig> config = o.synthetic ? Result<ModelConfig>(o.synthetic->config) : read_model_config(o.model_dir);
  if (!config.ok()) {
    std::fprintf(stderr, "spillway bench: %s\n", config.error().message.c_str());
    return 1;
  }
  const ModelConfig& c = *config;
  OpenOptions open;
  open.allow_missing_data = true;
  auto opened = o.synthetic ? Result<Checkpoint>(make_error("in memory")) : Checkpoint::open(o.model_dir, open);
  if (!o.synthetic && !opened.ok()) {
    std::fprintf(stderr, "spillway bench: %s\n", opened.error().message.c_str());
    return 1;
  }
  const Checkpoint* ckpt = o.synthetic ? &o.synthetic->checkpoint : &opened.value();
  const std::string model_name = o.synthetic ? o.synthetic->checkpoint.root() : o.model_dir;
  const int n_proj = o.project_layers > 0 ? o.project_layers : (c.is_v41() ? 40 : 43);
  std::printf("# spillway bench: %s (%s, %d layers, d_model %d, %d experts of %d, top %d, vocab %lld)\n",
              model_name.c_str(), c.model_type.c_str(), c.n_layers, c.d_model, c.n_experts, c.d_expert, c.top_k,
              (long long)c.vocab_size);
  std::printf("inputs: random token ids (seed %llu); batched decode path: %s\n", (unsigned long long)o.seed,
              kBatchedDecode ? "GpuModel::decode" : "GpuModel::forward per sequence (no GpuModel::decode in this build)");
  report["model"] = {{"dir", model_name}, {"model_type", c.model_type}, {"n_layers", c.n_layers},
                     {"d_model", c.d_model}, {"n_experts", c.n_experts}, {"d_expert", c.d_expert}};
  report["decode_path"] = kBatchedDecode ? "decode" : "forward";
  report["batch_invariant"] = o.batch_invariant;
  if (o.batch_invariant)
    std::printf("batch-invariant (serve's default): decode linears on the GEMV, EXL3 experts of decodes %s; prompt "
                "chunks shorter than %d tokens on the row-invariant prefill path\n",
                o.gpu.exl3_decode == Exl3DecodeKernel::kFused ? "on the fused kernel" : "on the grouped kernel's one-token class",
                GpuModel::kRowInvariantPieceTokens);

  // Budget: enough sequences for the largest batch and context for the longest run.
  const int max_batch = o.batches.empty() ? 1 : *std::max_element(o.batches.begin(), o.batches.end());
  const int64_t max_prefill = o.prefill.empty() ? 0 : *std::max_element(o.prefill.begin(), o.prefill.end());
  engine::GpuModelOptions gopt;
  gopt.moe_paths = engine::moe_paths_from(o.gpu);
  gopt.budget.max_seqs = o.max_seqs > 0 ? o.max_seqs : std::max(1, max_batch);
  gopt.budget.max_context =
      o.max_context > 0 ? o.max_context
                        : std::max({max_prefill + 1, o.decode_context + o.decode_steps + 8,
                                    o.batch_prompt_max + o.batch_steps + 8});
  gopt.budget.max_step_tokens = o.chunk;
  gopt.expert_tiers = o.expert_tiers;
  gopt.host_expert_threads = o.host_expert_threads;
  gopt.host_expert_int16 = o.host_expert_int16;
  if (o.batch_invariant) engine::make_batch_invariant(gopt);
  const engine::MemoryPlan plan = engine::plan_memory(c, gopt.budget, true, o.expert_tiers);
  print_plan(c, plan, gopt.budget, report["plan"]);

  const DecodeBytes db = decode_bytes(*ckpt, c);
  const int64_t ctx_mid = o.decode_context + o.decode_steps / 2;
  const std::vector<int64_t> kv = kv_read_nbytes(c, ctx_mid);
  print_decode_bytes(db, kv, ctx_mid, report["decode_bytes"]);
  int64_t kv_total = 0;
  for (int64_t b : kv) kv_total += b;
  const double token_bytes = double(db.weights_total() + kv_total);
  // The routed experts' expected bytes per token by tier (uniform routing: top_k of the layer's experts, each tier
  // its share of them); off_gpu_bytes[t] for t = HostGpu, HostCpu, the rest of token_bytes from HBM.
  double off_gpu_bytes[kNumExpertTiers] = {};
  for (size_t l = 0; l < o.expert_tiers.size() && l < db.layers.size(); ++l) {
    int64_t n[kNumExpertTiers] = {};
    for (ExpertTier t : o.expert_tiers[l]) ++n[int(t)];
    for (int t = 1; t < kNumExpertTiers; ++t)
      off_gpu_bytes[t] += double(db.layers[l].routed) * double(n[t]) / double(std::max<size_t>(1, o.expert_tiers[l].size()));
  }
  const bool spilled = off_gpu_bytes[1] + off_gpu_bytes[2] > 0;
  double routed_token_bytes = 0;
  for (const auto& lb : db.layers) routed_token_bytes += double(lb.routed);

  std::printf("\n## FLOPs per prefill token (mean over the prompt; head left out)\n\n");
  std::printf("| prompt | linears GFLOP | routed experts GFLOP | attention GFLOP | indexer GFLOP | total GFLOP |\n"
              "|---|---|---|---|---|---|\n");
  std::vector<PrefillFlops> flops;
  for (int64_t P : o.prefill) {
    flops.push_back(prefill_flops(*ckpt, c, P));
    const PrefillFlops& f = flops.back();
    std::printf("| %lld | %.3f | %.3f | %.3f | %.3f | %.3f |\n", (long long)P, f.linear / 1e9, f.routed / 1e9,
                f.attention / 1e9, f.indexer / 1e9, f.total() / 1e9);
    report["prefill_flops"].push_back({{"prompt", P}, {"linear", f.linear}, {"routed", f.routed},
                                       {"attention", f.attention}, {"indexer", f.indexer}});
  }
  auto write_json = [&] {
    if (o.json_path.empty()) return;
    std::ofstream f(o.json_path);
    f << report.dump(1) << "\n";
  };
  if (o.plan_only) {
    write_json();
    return 0;
  }

  // ---- the GPU ----
  int n_dev = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n_dev); e != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "spillway bench: no CUDA GPU (%s); --plan-only prints the plan and costs without one\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 2;
  }
  cuda::apply_kernel_settings(o.gpu, o.batch_invariant);  // before any weights are uploaded (dense_linear.h: set_gemv_mma)
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("\n## Device: %s, %d SMs, %.1f GiB\n\n", prop.name, prop.multiProcessorCount,
              double(prop.totalGlobalMem) / kGiB);
  auto bw = measure_copy_bandwidth(size_t(o.copy_mib) << 20, 10);
  auto tc = measure_bf16_gemm_rate(8192, 10);
  if (!bw.ok() || !tc.ok()) {
    std::fprintf(stderr, "spillway bench: %s\n", (!bw.ok() ? bw.error() : tc.error()).message.c_str());
    return 1;
  }
  std::printf("HBM copy bandwidth (device-to-device %d MiB, read + write bytes, best of 10): %.0f GB/s\n", o.copy_mib,
              *bw / 1e9);
  std::printf("bf16 tensor-core rate (cuBLAS GEMM 8192^3, fp32 compute, best of 10): %.1f TFLOP/s\n", *tc / 1e12);
  std::printf("FP8 decode GEMV: %s\n", gemv_mma_enabled() ? "tensor cores (SPILLWAY_GEMV_MMA=1, or auto with --batch-invariant)"
                                                           : "scalar weight streaming (SPILLWAY_GEMV_MMA=1: tensor cores)");
  report["device"] = {{"name", prop.name}, {"copy_bandwidth", *bw}, {"bf16_gemm_flops", *tc}};
  // The host tiers' media, measured only when some experts are off the GPU.
  double pcie_bw = 0, cpu_bw = 0;
  if (spilled) {
    auto mapped = measure_mapped_read_bandwidth(size_t(1) << 30, 5);
    if (!mapped.ok()) {
      std::fprintf(stderr, "spillway bench: %s\n", mapped.error().message.c_str());
      return 1;
    }
    pcie_bw = mapped->kernel;
    cpu_bw = measure_host_read_bandwidth(size_t(4) << 30, o.host_expert_threads, 3);
    std::printf("pinned host memory read by a kernel (mapped, 1 GiB, best of 5): %.1f GB/s; cudaMemcpy host-to-device "
                "of the same: %.1f GB/s\n", mapped->kernel / 1e9, mapped->copy / 1e9);
    std::printf("host DRAM read by the CPU (%d threads, 4 GiB, best of 3): %.1f GB/s\n",
                o.host_expert_threads > 0 ? o.host_expert_threads : int(std::thread::hardware_concurrency()),
                cpu_bw / 1e9);
    report["host"] = {{"mapped_read_bandwidth", mapped->kernel}, {"h2d_copy_bandwidth", mapped->copy},
                      {"cpu_read_bandwidth", cpu_bw}};
  }

  MemoryWatch mem;
  const size_t used_before = mem.used_now();
  mem.peak_used = used_before;
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  if (plan.device_total() > free_b) {
    std::fprintf(stderr, "spillway bench: the plan needs %.2f GiB of device memory, %.2f GiB are free; lower --chunk, "
                 "--max-seqs or the prefill lengths\n", plan.device_total() / kGiB, free_b / kGiB);
    write_json();
    return 1;
  }
  std::printf("loading %s ...\n", model_name.c_str());
  const auto t_load = Clock::now();
  auto loaded = o.synthetic ? engine::load_gpu_model(c, std::move(o.synthetic->checkpoint), Numerics::reference(), gopt)
                            : engine::load_gpu_model(o.model_dir, Numerics::reference(), gopt);
  if (!loaded.ok()) {
    std::fprintf(stderr, "spillway bench: loading: %s\n", loaded.error().message.c_str());
    write_json();
    return 1;
  }
  GpuModel& m = **loaded;
  if (o.batch_invariant) engine::make_batch_invariant(m);
  mem.sample();
  const size_t used_loaded = mem.used_now();
  std::printf("loaded in %.1f s: weights on the device %.3f GiB (plan %.3f), device memory in use %.3f GiB "
              "(+%.3f for the model)\n", seconds_since(t_load), m.weight_nbytes() / kGiB,
              plan.weights.total() / kGiB, used_loaded / kGiB, (used_loaded - used_before) / kGiB);
  if (spilled) {
    const auto p = m.expert_placement();
    std::printf("routed experts: %lld on the GPU (%.3f GiB), %lld in pinned host memory (%.3f GiB), %lld on the CPU "
                "(%.3f GiB pinned host memory); host memory pinned for both host tiers %.3f GiB, the mailbox %.1f MiB\n",
                (long long)p.n_experts[0], p.nbytes[0] / kGiB, (long long)p.n_experts[1], p.nbytes[1] / kGiB,
                (long long)p.n_experts[2], p.nbytes[2] / kGiB, p.host_mapped_pinned_nbytes / kGiB,
                p.mailbox_nbytes / kMiB);
    report["placement"] = {{"n_experts", {p.n_experts[0], p.n_experts[1], p.n_experts[2]}},
                           {"nbytes", {p.nbytes[0], p.nbytes[1], p.nbytes[2]}}};
  }
  report["load"] = {{"seconds", seconds_since(t_load)}, {"weight_nbytes", m.weight_nbytes()},
                    {"used_before", used_before}, {"used_after_load", used_loaded}};
  Rng rng{std::mt19937_64(o.seed), c.vocab_size};
  bool all_finite = true;
  auto check = [&](const char* phase, const std::vector<float>& logits) {
    const int64_t bad = count_non_finite(logits);
    if (bad) {
      all_finite = false;
      std::printf("WARNING: %s: %lld of %zu logits are not finite\n", phase, (long long)bad, logits.size());
    }
  };

  // ---- batch-1 decode ----
  std::printf("\n## Batch-1 decode: prompt of %lld random tokens, 4 warm-up steps, %d timed steps\n\n",
              (long long)o.decode_context, o.decode_steps);
  double ms_per_token = 0;
  // One run: a new sequence, its prompt, 4 warm-up and decode_steps timed steps; the step times in ms.
  auto decode_b1 = [&](const std::string& label) -> Result<std::vector<double>> {
    auto seq = m.new_sequence();
    if (!seq.ok()) return seq.error();
    auto last = prefill(m, *seq, rng.tokens(o.decode_context), o.chunk, o.batch_invariant);
    if (!last.ok()) return make_error("decode prompt: ", last.error().message);
    check("decode prompt", *last);
    GpuSequence* seqs[1] = {&*seq};
    int32_t tok[1] = {argmax(*last)}, next[1] = {0};
    std::vector<float> logits;
    std::vector<double> step_ms;
    std::optional<ProfileWindow> window;
    for (int s = 0; s < 4 + o.decode_steps; ++s) {
      if (s == 4) window.emplace(label + ", timed steps");
      const bool timed = s >= 4;
      const bool want_logits = s == 4 || s == 3 + o.decode_steps;
      cudaDeviceSynchronize();
      const auto t0 = Clock::now();
      Status st = decode_step(m, std::span<GpuSequence* const>(seqs), tok, next, want_logits ? &logits : nullptr);
      cudaDeviceSynchronize();
      if (!st.ok()) return make_error("decode step ", s, ": ", st.error().message);
      if (timed) step_ms.push_back(seconds_since(t0) * 1e3);
      if (want_logits) check(label.c_str(), logits);
      tok[0] = next[0];
    }
    return step_ms;
  };
  {
    const engine::StepGraphStats g0 = m.graph_stats();
    // The routes of this phase (its prompt and steps), for the placement's roofline at the measured routing and for
    // --record-routing: one small counting kernel per layer in each step.
    const bool count_routes = spilled || !o.record_routing.empty();
    if (count_routes) {
      if (Status st = m.set_routing_record(true); !st.ok()) {
        std::fprintf(stderr, "spillway bench: routing record: %s\n", st.error().message.c_str());
        return 1;
      }
    }
    auto step_ms = decode_b1("batch-1 decode");
    Result<RoutingCounts> routes = count_routes ? m.routing_counts() : Result<RoutingCounts>(make_error("off"));
    if (count_routes) m.set_routing_record(false);
    if (count_routes && !routes.ok()) {
      std::fprintf(stderr, "spillway bench: routing record: %s\n", routes.error().message.c_str());
      return 1;
    }
    if (!o.record_routing.empty()) {
      runtime::RoutingStats stats{c.model_type, routes->n_tokens, routes->counts};
      if (Status st = runtime::write_routing_stats(stats, o.record_routing); !st.ok()) {
        std::fprintf(stderr, "spillway bench: --record-routing: %s\n", st.error().message.c_str());
        return 1;
      }
      std::printf("routing of the batch-1 phase (%lld tokens) written to %s (spillway plan / --gpu-memory "
                  "--routing-stats)\n", (long long)stats.n_tokens, o.record_routing.c_str());
    }
    if (!step_ms.ok()) {
      std::fprintf(stderr, "spillway bench: batch-1 decode: %s\n", step_ms.error().message.c_str());
      return 1;
    }
    const engine::StepGraphStats g1 = m.graph_stats();
    mem.sample();
    std::vector<double> sorted = *step_ms;
    std::sort(sorted.begin(), sorted.end());
    double sum = 0;
    for (double x : *step_ms) sum += x;
    ms_per_token = sum / double(step_ms->size());
    const double roofline_ms = token_bytes / *bw * 1e3;
    std::printf("ms/token: mean %.3f, median %.3f, min %.3f, max %.3f (%.1f tokens/s)\n", ms_per_token,
                sorted[sorted.size() / 2], sorted.front(), sorted.back(), 1e3 / ms_per_token);
    std::printf("roofline: %.2f MiB / %.0f GB/s = %.3f ms  ->  %.1f%% of roofline (target 75%%, goal 87%%)%s\n",
                token_bytes / kMiB, *bw / 1e9, roofline_ms, 100.0 * roofline_ms / ms_per_token,
                spilled ? " [as if every expert were in HBM]" : "");
    if (spilled) {
      // The bytes per token from each tier at the routes this phase measured (a skewed router sends more or fewer
      // tokens to the host than the tiers' shares of experts).
      double tier_bytes[kNumExpertTiers] = {};
      for (size_t l = 0; l < o.expert_tiers.size() && l < db.layers.size(); ++l) {
        int64_t n[kNumExpertTiers] = {}, all = 0;
        for (size_t e = 0; e < o.expert_tiers[l].size(); ++e) {
          n[int(o.expert_tiers[l][e])] += routes->counts[l][e];
          all += routes->counts[l][e];
        }
        for (int t = 1; t < kNumExpertTiers; ++t)
          tier_bytes[t] += all ? double(db.layers[l].routed) * double(n[t]) / double(all) : 0.0;
      }
      std::printf("routes to the host tiers in this phase: %.1f%% pinned host, %.1f%% CPU of the routed bytes "
                  "(the tiers hold %.1f%% and %.1f%% of the experts)\n",
                  100.0 * tier_bytes[1] / routed_token_bytes, 100.0 * tier_bytes[2] / routed_token_bytes,
                  100.0 * off_gpu_bytes[1] / routed_token_bytes, 100.0 * off_gpu_bytes[2] / routed_token_bytes);
      const double hbm_at_routes = token_bytes - tier_bytes[1] - tier_bytes[2];
      // The placement's own bound: the GPU reads HBM and the mapped experts one after the other; the CPU's experts
      // overlap with both (the stream waits for them once per layer), so the bound is the larger of the two.
      const double hbm_ms = hbm_at_routes / *bw * 1e3, pcie_ms = tier_bytes[1] / pcie_bw * 1e3,
                   cpu_ms = tier_bytes[2] / cpu_bw * 1e3;
      const double overlapped = std::max(hbm_ms + pcie_ms, cpu_ms), serial = hbm_ms + pcie_ms + cpu_ms;
      std::printf("placement roofline: HBM %.2f MiB / %.0f GB/s = %.3f ms, pinned host %.2f MiB / %.1f GB/s = %.3f ms, "
                  "CPU %.2f MiB / %.1f GB/s = %.3f ms; overlapped %.3f ms  ->  %.1f%% (serial %.3f ms: %.1f%%)\n",
                  hbm_at_routes / kMiB, *bw / 1e9, hbm_ms, tier_bytes[1] / kMiB, pcie_bw / 1e9, pcie_ms,
                  tier_bytes[2] / kMiB, cpu_bw / 1e9, cpu_ms, overlapped, 100.0 * overlapped / ms_per_token, serial,
                  100.0 * serial / ms_per_token);
      const auto p = m.expert_placement();
      std::printf("CPU expert worker so far: %llu requests, %.3f s busy\n", (unsigned long long)p.cpu_requests,
                  p.cpu_busy_seconds);
      report["decode_b1_placement"] = {{"hbm_bytes", hbm_at_routes}, {"host_gpu_bytes", tier_bytes[1]},
                                       {"host_cpu_bytes", tier_bytes[2]}, {"uniform_host_gpu_bytes", off_gpu_bytes[1]},
                                       {"uniform_host_cpu_bytes", off_gpu_bytes[2]}, {"overlapped_ms", overlapped},
                                       {"serial_ms", serial}, {"overlapped_pct", 100.0 * overlapped / ms_per_token}};
    }
    const int64_t n_steps = 4 + o.decode_steps, segs = g1.segments - g0.segments;
    std::printf("CUDA graphs: %lld segments in %lld steps (%lld updated in place, %lld instantiated), host %.1f µs per "
                "step recording + updating + launching\n", (long long)segs, (long long)n_steps,
                (long long)(g1.updates - g0.updates), (long long)(g1.instantiations - g0.instantiations),
                (g1.record_us - g0.record_us) / double(n_steps));
    report["decode_b1"] = {{"ms_mean", ms_per_token}, {"ms_median", sorted[sorted.size() / 2]},
                           {"ms_min", sorted.front()}, {"bytes", token_bytes}, {"roofline_ms", roofline_ms},
                           {"roofline_pct", 100.0 * roofline_ms / ms_per_token}, {"step_ms", *step_ms},
                           {"graph_segments", segs}};
    // The same run with every kernel launched directly, for the graphs' effect (same call, same model).
    if (segs > 0) {
      m.set_cuda_graphs(false);
      auto direct = decode_b1("batch-1 decode, CUDA graphs off");
      m.set_cuda_graphs(true);
      if (direct.ok()) {
        double dsum = 0;
        for (double x : *direct) dsum += x;
        const double dms = dsum / double(direct->size());
        std::printf("without CUDA graphs: mean %.3f ms/token (%.1f tokens/s); graphs: %.2fx\n", dms, 1e3 / dms,
                    dms / ms_per_token);
        report["decode_b1"]["ms_mean_no_graphs"] = dms;
      } else {
        std::printf("without CUDA graphs: failed: %s\n", direct.error().message.c_str());
      }
    }
    // The same run with plain stream-ordered launches, for programmatic dependent launch's effect (cuda/launch.h).
    if (cuda::pdl_enabled()) {
      cuda::set_pdl(false);
      auto plain = decode_b1("batch-1 decode, PDL off");
      cuda::set_pdl(true);
      if (plain.ok()) {
        double psum = 0;
        for (double x : *plain) psum += x;
        const double pms = psum / double(plain->size());
        std::printf("without programmatic dependent launch: mean %.3f ms/token (%.1f tokens/s); PDL: %.2fx\n", pms,
                    1e3 / pms, pms / ms_per_token);
        report["decode_b1"]["ms_mean_no_pdl"] = pms;
      } else {
        std::printf("without programmatic dependent launch: failed: %s\n", plain.error().message.c_str());
      }
    } else {
      std::printf("programmatic dependent launch: off (SPILLWAY_PDL=0 or a GPU before sm_90)\n");
    }
  }

  // ---- aggregate decode ----
  std::printf("\n## Aggregate decode: B sequences, prompts of %lld..%lld random tokens, 2 warm-up + %d timed steps\n\n",
              (long long)(o.batch_prompt_max / 4), (long long)o.batch_prompt_max, o.batch_steps);
  std::printf("| batch | ms/step | tokens/s | tokens/s per sequence |\n|---|---|---|---|\n");
  for (int B : o.batches) {
    if (B > gopt.budget.max_seqs) {
      std::printf("| %d | skipped: above max_seqs %d | | |\n", B, gopt.budget.max_seqs);
      continue;
    }
    std::vector<GpuSequence> owned;
    std::vector<GpuSequence*> seqs;
    std::vector<int32_t> tok, next(static_cast<size_t>(B));
    owned.reserve(size_t(B));
    Status st;
    for (int i = 0; i < B && st.ok(); ++i) {
      auto s = m.new_sequence();
      if (!s.ok()) {
        st = s.error();
        break;
      }
      owned.push_back(std::move(s.value()));
      const int64_t lo = std::max<int64_t>(1, o.batch_prompt_max / 4);
      const int64_t len = lo + (int64_t(i) * 7919) % (o.batch_prompt_max - lo + 1);
      auto last = prefill(m, owned.back(), rng.tokens(len), o.chunk, o.batch_invariant);
      if (!last.ok()) st = last.error();
      else tok.push_back(argmax(*last));
    }
    for (auto& s : owned) seqs.push_back(&s);
    double t = 0;
    std::vector<float> logits;
    std::optional<ProfileWindow> window;
    for (int s = 0; s < 2 + o.batch_steps && st.ok(); ++s) {
      if (s == 2) window.emplace("decode batch " + std::to_string(B) + ", timed steps");
      cudaDeviceSynchronize();
      const auto t0 = Clock::now();
      st = decode_step(m, std::span<GpuSequence* const>(seqs), tok, next, s == 2 ? &logits : nullptr);
      cudaDeviceSynchronize();
      if (s >= 2) t += seconds_since(t0);
      if (s == 2 && st.ok()) check("aggregate decode", logits);
      tok.assign(next.begin(), next.end());
    }
    window.reset();
    mem.sample();
    if (!st.ok()) {
      std::printf("| %d | failed: %s | | |\n", B, st.error().message.c_str());
      report["decode_batches"].push_back({{"batch", B}, {"error", st.error().message}});
      continue;
    }
    const double tps = double(B) * o.batch_steps / t;
    std::printf("| %d | %.3f | %.1f | %.1f |\n", B, t * 1e3 / o.batch_steps, tps, tps / B);
    report["decode_batches"].push_back({{"batch", B}, {"ms_per_step", t * 1e3 / o.batch_steps}, {"tokens_per_s", tps}});
  }

  // ---- prefill ----
  // One warm-up chunk on a throwaway sequence first (the decode phases ran chunks of at most ~1024 rows: the
  // first 4096-row step pays cuBLASLt's heuristics, lazy module loads and the arena's growth), then
  // prefill_runs timed runs per length, each on a fresh sequence; the median run is reported. (A single
  // cold run per length is not repeatable: V4.1 at 4096 tokens gave 25668 then 18673 tokens/s on two machines.)
  std::printf("\n## Prefill: one sequence, random tokens, chunks of %d; median of %d runs after a warm-up chunk\n\n",
              o.chunk, o.prefill_runs);
  std::printf("| prompt | s (median) | min / max s | tokens/s | first / last chunk s | GFLOP/token | TFLOP/s | "
              "%% of tensor-core rate |\n|---|---|---|---|---|---|---|---|\n");
  std::vector<double> prefill_tps(o.prefill.size(), 0);
  bool warmed = false;
  for (size_t i = 0; i < o.prefill.size(); ++i) {
    const int64_t P = o.prefill[i];
    if (P + 1 > gopt.budget.max_context) {
      std::printf("| %lld | skipped: above max_context %lld |\n", (long long)P, (long long)gopt.budget.max_context);
      continue;
    }
    if (!warmed) {
      auto warm = m.new_sequence();
      if (warm.ok()) (void)prefill(m, *warm, rng.tokens(std::min<int64_t>(P, o.chunk)), o.chunk, o.batch_invariant);
      cudaDeviceSynchronize();
      warmed = true;
    }
    struct Run {
      double s;
      std::vector<double> chunks;
    };
    std::vector<Run> runs;
    std::string error;
    for (int r = 0; r < o.prefill_runs && error.empty(); ++r) {
      auto seq = m.new_sequence();
      if (!seq.ok()) {
        error = seq.error().message;
        break;
      }
      Run run;
      const auto tokens = rng.tokens(P);
      std::optional<ProfileWindow> window;
      if (r == 0) window.emplace("prefill " + std::to_string(P));
      const auto t0 = Clock::now();
      auto last = prefill(m, *seq, tokens, o.chunk, o.batch_invariant, &run.chunks);
      cudaDeviceSynchronize();
      run.s = seconds_since(t0);
      window.reset();
      mem.sample();
      if (!last.ok()) {
        error = last.error().message;
        break;
      }
      check("prefill", *last);
      runs.push_back(std::move(run));
    }
    if (!error.empty()) {
      std::printf("| %lld | failed: %s |\n", (long long)P, error.c_str());
      report["prefill"].push_back({{"prompt", P}, {"error", error}});
      continue;
    }
    std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.s < b.s; });
    const Run& med = runs[runs.size() / 2];
    prefill_tps[i] = double(P) / med.s;
    const double achieved = prefill_tps[i] * flops[i].total();
    std::printf("| %lld | %.3f | %.3f / %.3f | %.0f | %.3f / %.3f | %.3f | %.1f | %.1f%% |\n", (long long)P, med.s,
                runs.front().s, runs.back().s, prefill_tps[i], med.chunks.front(), med.chunks.back(),
                flops[i].total() / 1e9, achieved / 1e12, 100.0 * achieved / *tc);
    std::vector<double> all_s;
    for (const Run& r : runs) all_s.push_back(r.s);
    report["prefill"].push_back({{"prompt", P}, {"seconds", med.s}, {"run_seconds", all_s},
                                 {"tokens_per_s", prefill_tps[i]}, {"chunk_seconds", med.chunks},
                                 {"flops_per_token", flops[i].total()}, {"tc_pct", 100.0 * achieved / *tc}});
  }

  // ---- memory ----
  std::printf("\n## Device memory\n\n");
  std::printf("weights uploaded %.3f GiB (plan %.3f); KV pools %.3f GiB, sequence state %.3f GiB, workspace %.3f GiB "
              "(plan); Engram tables in host memory %.3f GiB\n", m.weight_nbytes() / kGiB, plan.weights.total() / kGiB,
              plan.kv.pool_nbytes() / kGiB, plan.state_nbytes / kGiB, plan.workspace_nbytes / kGiB,
              plan.engram_tables_host_nbytes / kGiB);
  std::printf("cudaMemGetInfo: in use before loading %.3f GiB, after loading %.3f GiB, peak %.3f GiB (model's peak "
              "%.3f GiB; plan's device total %.3f GiB)\n", used_before / kGiB, used_loaded / kGiB, mem.peak_used / kGiB,
              (mem.peak_used - used_before) / kGiB, plan.device_total() / kGiB);
  report["memory"] = {{"peak_used", mem.peak_used}, {"model_peak", mem.peak_used - used_before}};

  // ---- projection ----
  // Decode: the fixed part (embedding row, final norm, head) is counted at the roofline (its bytes ÷ the
  // measured bandwidth), a lower bound on its time: the rest of the measured time is the layers', an upper
  // bound per layer, so the projection errs slow. (Splitting the time in proportion to bytes, as the first
  // version did, gave the head ~53 % of the token while it ran near the roofline and the layers at ~15 %:
  // 14.1 ms projected where a kernel trace puts 40 layers near 23 ms.)
  const double fixed_b = double(db.fixed_total()), layers_b = token_bytes - fixed_b;
  const double t_fixed = std::min(ms_per_token, fixed_b / *bw * 1e3), t_layer = (ms_per_token - t_fixed) / c.n_layers;
  const double proj_ms = t_fixed + n_proj * t_layer;
  const double proj_bytes = fixed_b + layers_b * n_proj / c.n_layers;
  std::printf("\n## Projection to %d layers\n\n", n_proj);
  std::printf("decode: fixed part %.3f ms = %.2f MiB / %.0f GB/s (at the roofline: a lower bound); per layer "
              "(%.3f - %.3f) / %d = %.4f ms (an upper bound)\n", t_fixed, fixed_b / kMiB, *bw / 1e9, ms_per_token, t_fixed,
              c.n_layers, t_layer);
  std::printf("decode: %d layers: %.3f + %d x %.4f = %.3f ms/token (%.1f tokens/s); roofline %.2f MiB / %.0f GB/s = "
              "%.3f ms (%.1f%%)\n", n_proj, t_fixed, n_proj, t_layer, proj_ms, 1e3 / proj_ms, proj_bytes / kMiB,
              *bw / 1e9, proj_bytes / *bw * 1e3, 100.0 * proj_bytes / *bw * 1e3 / proj_ms);
  report["projection"] = {{"layers", n_proj}, {"decode_ms", proj_ms}, {"decode_bytes", proj_bytes},
                          {"fixed_ms", t_fixed}, {"layer_ms", t_layer}};
  for (size_t i = 0; i < o.prefill.size(); ++i) {
    if (prefill_tps[i] <= 0) continue;
    // Prefill has no fixed part worth counting (the head runs once per prompt): time scales with layers.
    const double tps = prefill_tps[i] * c.n_layers / n_proj;
    std::printf("prefill %lld: %.0f tokens/s x %d / %d = %.0f tokens/s\n", (long long)o.prefill[i], prefill_tps[i],
                c.n_layers, n_proj, tps);
    report["projection"]["prefill"].push_back({{"prompt", o.prefill[i]}, {"tokens_per_s", tps}});
  }
  std::printf("\nlogits finite in every phase: %s\n", all_finite ? "yes" : "NO (timings above are not meaningful)");
  report["all_logits_finite"] = all_finite;
  write_json();
  return all_finite ? 0 : 3;
}

}  // namespace spw::bench
