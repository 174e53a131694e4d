#include "cli/runner_choice.h"

#include <chrono>

#include <fstream>
#include <string>

#include "base/log.h"
#include "base/settings.h"
#include "cli/default_model.h"
#include "cli/load_progress.h"
#include "model/cpu_runner.h"
#if defined(SPW_HAVE_GPU_RUNNER)
#include "engine/gpu_model.h"
#include "engine/gpu_runner.h"
#endif

namespace spw::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

#if defined(SPW_HAVE_GPU_RUNNER)
// This process's resident host memory in GiB (VmRSS), or -1 where /proc says nothing.
double resident_gib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) * 1024.0 / kGiB;
  return -1;
}
#endif

Result<LoadedRunner> load_cpu(const RunnerOptions& o) {
  LoadOptions load;
  load.on_progress = layer_progress("loading weights (CPU)");
  auto model = load_model(o.model_dir, o.numerics, load);
  if (!model.ok()) return model.error();
  LoadedRunner out;
  out.cpu_model = std::move(model.value());
  out.runner = std::make_unique<CpuRunner>(*out.cpu_model, o.kv_tokens);
  return out;
}

#if defined(SPW_HAVE_GPU_RUNNER)
Result<LoadedRunner> load_cuda(const RunnerOptions& o) {
  auto config = read_model_config(o.model_dir);
  if (!config.ok()) return config.error();
  engine::KvBudget budget;
  budget.max_seqs = o.max_num_seqs + o.prefix_cache_slots;  // the runner keeps the extra slots for cached copies
  budget.max_context = o.max_model_len;
  budget.max_step_tokens = o.prefill_chunk;
  budget.max_step_rows = o.step_rows;
  budget.pool_tokens = o.kv_tokens;
  budget.max_rollback_tokens = o.max_rollback_tokens;
  auto tiers = resolve_expert_tiers(o.model_dir, *config, o.placement);
  if (!tiers.ok()) return tiers.error();
  const engine::MemoryPlan plan = engine::plan_memory(*config, budget, o.numerics.fake_quant, *tiers);
  auto mem = engine::device_memory();
  if (!mem.ok()) return mem.error();
  SPW_LOG_INFO("GPU memory plan ({} sequence slots, {} of them for the prefix cache, of up to {} positions, {} "
               "positions in all; prefill pieces of {} tokens): weights {:.2f} GiB, "
               "KV pools {:.2f} GiB, sequence state {:.2f} GiB, rollback logs {:.2f} GiB, workspace {:.2f} GiB; total {:.2f} GiB of {:.2f} GiB "
               "free ({:.2f} GiB on the device); Engram tables {:.2f} GiB and staging {:.2f} GiB in host memory",
               budget.max_seqs, o.prefix_cache_slots, budget.max_context,
               budget.pool_tokens > 0 ? budget.pool_tokens : budget.max_seqs * budget.max_context, budget.max_step_tokens,
               plan.weights.total() / kGiB,
               plan.kv.pool_nbytes() / kGiB, plan.state_nbytes / kGiB, plan.rollback_nbytes / kGiB,
               plan.workspace_nbytes / kGiB,
               plan.device_total() / kGiB, mem->free / kGiB, mem->total / kGiB, plan.engram_tables_host_nbytes / kGiB,
               plan.staging_host_nbytes / kGiB);
  if (plan.host_gpu_experts_nbytes + plan.host_cpu_experts_nbytes > 0)
    SPW_LOG_INFO("routed experts off the GPU: {:.2f} GiB in pinned host memory (read by the GPU over PCIe), {:.2f} GiB "
                 "in pinned host memory for the CPU worker, {:.2f} GiB pinned for its mailbox",
                 plan.host_gpu_experts_nbytes / kGiB, plan.host_cpu_experts_nbytes / kGiB,
                 plan.host_mailbox_nbytes / kGiB);
  if (plan.device_total() > mem->free) {
    if (plan.weights.total() > mem->free)
      return make_error("the model's weights alone need ", plan.weights.total() / kGiB, " GiB of device memory and ",
                        mem->free / kGiB, " GiB are free; this model does not fit this GPU (use --device cpu, or a "
                        "GPU with more memory)");
    return make_error("the GPU plan needs ", plan.device_total() / kGiB, " GiB of device memory and ",
                      mem->free / kGiB, " GiB are free; the KV pools (", plan.kv.pool_nbytes() / kGiB,
                      " GiB) hold --kv-tokens ", o.kv_tokens, " positions over --max-num-seqs ", o.max_num_seqs,
                      " plus --prefix-cache-slots ", o.prefix_cache_slots, " sequences of up to --max-model-len ",
                      budget.max_context, ": lower any of them (the workspace grows with --prefill-chunk ",
                      budget.max_step_tokens, ")");
  }
  engine::GpuRunnerSettings settings;
  settings.budget = budget;
  settings.budget.max_seqs = o.max_num_seqs;
  settings.prefix_cache_slots = o.prefix_cache_slots;
  settings.numerics = o.numerics;
  settings.gpu = spw::settings().gpu;
  settings.batch_invariant = o.batch_invariant;
  settings.expert_tiers = std::move(tiers.value());
  settings.host_expert_threads = o.placement.cpu_expert_threads;
  settings.host_expert_int16 = o.placement.cpu_expert_activations == "int16";
  settings.engram_tables = o.engram_tables == "pinned" ? engine::EngramTablePlace::kPinned
                           : o.engram_tables == "disk" ? engine::EngramTablePlace::kDisk
                                                       : engine::EngramTablePlace::kAuto;
  settings.on_progress = layer_progress("loading weights (GPU)");
  auto runner = engine::load_gpu_runner(o.model_dir, settings);
  if (!runner.ok()) return runner.error();
  if (o.warm_up) {
    const auto warm_start = std::chrono::steady_clock::now();
    if (Status st = (*runner)->warm_up(); !st.ok()) return make_error("warming up the GPU runner: ", st.error().message);
    SPW_LOG_INFO("warmed up in {:.2f} s (a short prefill and two decode steps: kernels loaded, batch-1 decode graphs "
                 "captured)", std::chrono::duration<double>(std::chrono::steady_clock::now() - warm_start).count());
  }
  if (config->is_v41() && !config->engram_layers.empty())
    SPW_LOG_INFO("Engram tables: {} (--engram-tables {})",
                 (*runner)->model().engram_tables_on_disk()
                     ? "left in the checkpoint's memory maps; the host gathers each step's rows"
                     : "in pinned host memory; the GPU gathers each step's rows over PCIe",
                 o.engram_tables);
  const auto used = (*runner)->usage();
  SPW_LOG_INFO("loaded on the GPU: device memory in use {:.2f} of {:.2f} GiB, {} KV pages; host memory (VmRSS) {:.2f} "
               "GiB", used.device_bytes_used / kGiB, used.device_bytes_total / kGiB, used.kv_blocks_total, resident_gib());
  LoadedRunner out;
  out.runner = std::move(runner.value());
  return out;
}
#endif

}  // namespace

Result<LoadedRunner> load_runner(const RunnerOptions& o) {
  std::string device = o.device;
#if defined(SPW_HAVE_GPU_RUNNER)
  const int n_gpus = engine::cuda_device_count();
  if (device == "auto") {
    const bool demo = is_default_model(o.model_dir);
    device = n_gpus > 0 && !demo ? "cuda" : "cpu";
    SPW_LOG_INFO("--device auto: {} ({})", device,
                 n_gpus == 0 ? "no CUDA device is visible"
                 : demo      ? "the bundled demo model runs on the CPU; --device cuda puts it on the GPU"
                             : "a CUDA device is visible");
  }
  if (device == "cuda") {
    if (n_gpus == 0) return make_error("--device cuda: no CUDA device is visible to this process");
    return load_cuda(o);
  }
#else
  if (device == "auto") {
    device = "cpu";
    SPW_LOG_INFO("--device auto: cpu (this build has no CUDA)");
  }
  if (device == "cuda")
    return make_error("--device cuda: this spillway was built without CUDA (-DSPILLWAY_CUDA=OFF); rebuild with nvcc "
                      "available, or use --device cpu");
#endif
  if (device != "cpu") return make_error("--device ", device, ": expected auto, cpu or cuda");
  if (!o.placement.placement_file.empty() || o.placement.request.gpu_memory_gib > 0)
    return make_error("--placement and --gpu-memory place experts for the GPU runner; the CPU runner holds every expert "
                      "in host memory already (drop the flag, or use --device cuda)");
  return load_cpu(o);
}

}  // namespace spw::cli
