// `spillway serve`: the OpenAI-compatible HTTP server (docs/server.md). Reads every setting once
// (flags, then SPILLWAY_* environment variables), loads the model, starts the scheduler thread and
// the HTTP listener, and shuts down gracefully on SIGINT/SIGTERM (exit 0).
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <pthread.h>
#include <thread>

#include "base/log.h"
#include "base/thread_pool.h"
#include "cli/commands.h"
#include "cli/default_model.h"
#include "cli/runner_choice.h"
#include "model/model.h"
#include "runtime/routing_stats.h"
#include "server/http_server.h"
#include "server/openai_api.h"
#include "server/settings.h"
#include "server/text.h"
#include "vision/vision_config.h"
#include "vision/image_encoder.h"
#include "vision/vision_weights.h"
#if defined(SPW_HAVE_VISION_CUDA)
#include "vision/vision_tower_cuda.h"
#endif

namespace spw::cli {
namespace {

struct ServeOptions {
  server::ServerSettings s;
  size_t prefix_cache_mb = 1024;
  std::string numerics = "reference";
  std::string device = "auto";
  std::string vision_device = "auto";
  bool batch_invariant = true;
  int prefix_cache_slots = 8;
  int threads = 0;
  std::string speculative = "off";
  bool no_stale_index_k = false;
  PlacementFlags placement;
  std::string record_routing;  // --record-routing FILE
  std::string engram_tables = "auto";
};

// --record-routing: the file must be writable before serving starts (a typo would otherwise lose a whole run).
Status check_writable(const std::string& path) {
  const bool existed = std::filesystem::exists(path);
  {
    std::ofstream probe(path, std::ios::app);
    if (!probe) return make_error("--record-routing ", path, ": cannot write the file");
  }
  if (!existed) std::filesystem::remove(path);
  return {};
}

// Writes what the runner recorded (runtime/routing_stats.h's format), for `spillway plan --routing-stats`.
void save_recorded_routing(ModelRunner& runner, const std::string& path) {
  auto counts = runner.routing_counts();
  if (!counts.ok()) {
    SPW_LOG_ERROR("--record-routing: {}", counts.error().message);
    return;
  }
  if (counts->n_tokens == 0) {
    SPW_LOG_WARN("--record-routing: no token was routed while serving; {} not written", path);
    return;
  }
  runtime::RoutingStats stats{runner.config().model_type, counts->n_tokens, std::move(counts->counts)};
  if (Status st = runtime::write_routing_stats(stats, path); !st.ok())
    SPW_LOG_ERROR("--record-routing: {}", st.error().message);
  else
    SPW_LOG_INFO("routing statistics of {} tokens written to {} (spillway plan --routing-stats)", stats.n_tokens, path);
}

// The image encoder --vision-device asks for: cuda (the GPU tower), cpu (the reference), or auto (cuda
// beside the GPU runner, falling back to the CPU when the tower does not fit, with a warning).
Result<std::shared_ptr<vision::ImageEncoder>> make_image_encoder(vision::VisionWeights w, const std::string& choice,
                                                                 std::string_view runner_device) {
  const bool want_cuda = choice == "cuda" || (choice == "auto" && runner_device == "cuda");
  if (want_cuda) {
#if defined(SPW_HAVE_VISION_CUDA)
    auto tower = vision::VisionTowerCuda::create(w);
    if (tower.ok()) return std::shared_ptr<vision::ImageEncoder>(std::move(tower.value()));
    if (choice == "cuda")
      return make_error("--vision-device cuda: the GPU tower could not be loaded (", tower.error().message,
                        "); use --vision-device cpu");
    SPW_LOG_WARN("the GPU vision tower could not be loaded ({}); images are encoded on the CPU", tower.error().message);
#else
    if (choice == "cuda") return make_error("--vision-device cuda: this build has no CUDA; use --vision-device cpu");
#endif
  }
  return std::shared_ptr<vision::ImageEncoder>(vision::make_cpu_image_encoder(std::move(w)));
}

Status validate(const ServeOptions& o) {
  const auto& sched = o.s.scheduler;
  if (o.s.port < 0 || o.s.port > 65535) return make_error("--port ", o.s.port, " is not a TCP port");
  if (sched.max_num_seqs < 1) return make_error("--max-num-seqs must be at least 1");
  if (sched.max_batch < 1) return make_error("--max-batch must be at least 1");
  if (sched.kv_tokens < 2) return make_error("--kv-tokens must be at least 2");
  if (sched.max_queue < 0) return make_error("--max-queue must not be negative");
  if (sched.prefill_chunk < sched.prefix_block || sched.prefill_chunk % sched.prefix_block != 0)
    return make_error("--prefill-chunk ", sched.prefill_chunk, " must be a positive multiple of ", sched.prefix_block,
                      " (the prefix-cache block)");
  if (sched.step_token_budget < sched.prefill_chunk)
    return make_error("--step-token-budget ", sched.step_token_budget, " must be at least --prefill-chunk ",
                      sched.prefill_chunk);
  if (o.s.max_model_len < 2) return make_error("--max-model-len must be at least 2");
  if (o.s.max_tokens_limit < 1) return make_error("--max-tokens-limit must be at least 1");
  if (o.s.max_body_bytes < 1) return make_error("--max-body-bytes must be at least 1");
  return {};
}

int serve(ServeOptions o) {
  // Signals go to one thread (sigwait) only: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not a dead server

  if (o.s.model_dir.empty()) {
    o.s.model_dir = default_model_dir();
    if (o.s.model_dir.empty()) {
      SPW_LOG_ERROR("no --model given and the bundled demo model (models/demo) was not found");
      return 2;
    }
    SPW_LOG_INFO("no --model given: serving the bundled demo model {}", o.s.model_dir);
  }
  if (auto st = validate(o); !st.ok()) {
    SPW_LOG_ERROR("{}", st.error().message);
    return 2;
  }
  o.s.scheduler.prefix_cache_nbytes = o.prefix_cache_mb << 20;
  o.s.scheduler.speculative.mode = *runtime::parse_speculative_mode(o.speculative);  // the flag's check allows only these
  if (o.s.served_model_name.empty())
    o.s.served_model_name = std::filesystem::path(o.s.model_dir).lexically_normal().filename().string();
  if (o.s.served_model_name.empty()) o.s.served_model_name = "spillway";
  if (o.threads > 0) set_global_pool_threads(size_t(o.threads));

  RunnerOptions runner_options;
  runner_options.device = o.device;
  runner_options.model_dir = o.s.model_dir;
  runner_options.numerics = o.numerics == "exact" ? Numerics::exact() : Numerics::reference();
  runner_options.numerics.stale_index_k = !o.no_stale_index_k;
  runner_options.max_num_seqs = o.s.scheduler.max_num_seqs;
  runner_options.max_model_len = o.s.max_model_len;
  runner_options.kv_tokens = o.s.scheduler.kv_tokens;
  runner_options.prefill_chunk = o.s.scheduler.prefill_chunk;
  runner_options.step_rows = o.s.scheduler.step_token_budget;
  runner_options.batch_invariant = o.batch_invariant;
  runner_options.prefix_cache_slots = o.prefix_cache_mb > 0 ? o.prefix_cache_slots : 0;
  runner_options.placement = o.placement;
  runner_options.engram_tables = o.engram_tables;
  runner_options.warm_up = true;
  if (o.s.scheduler.speculative.mode != runtime::SpeculativeMode::off)  // a verified step: the last token and the drafts
    runner_options.max_rollback_tokens = o.s.scheduler.speculative.draft_tokens + 1;
  auto loaded = load_runner(runner_options);
  if (!loaded.ok()) {
    SPW_LOG_ERROR("{}", loaded.error().message);
    return 1;
  }
  ModelRunner& runner = *loaded->runner;
  auto text = server::Text::load(o.s.model_dir);
  if (!text.ok()) {
    SPW_LOG_ERROR("{}", text.error().message);
    return 1;
  }
  if (!(*text)->has_tokenizer())
    SPW_LOG_WARN("{} has no tokenizer.json: serving token-id prompts only", o.s.model_dir);

  if (auto st = runtime::Scheduler::check_speculative(runner, o.s.scheduler.speculative); !st.ok()) {
    SPW_LOG_ERROR("{}", st.error().message);
    return 2;
  }
  if (o.s.scheduler.speculative.mode != runtime::SpeculativeMode::off) {
    SPW_LOG_INFO("speculative decoding: {} drafts of up to {} tokens (n-gram matches of {} to {} tokens)",
                 o.speculative, o.s.scheduler.speculative.draft_tokens, o.s.scheduler.speculative.ngram.min_ngram,
                 o.s.scheduler.speculative.ngram.max_ngram);
    if (runner.config().is_v41() && runner_options.numerics.stale_index_k)
      SPW_LOG_INFO("V4.1: verified drafts compute as a multi-token forward, which reads each index owner's own keys; plain "
                   "decode steps reproduce the reference's stale-key quirk, so outputs can differ from --speculative off "
                   "where the quirk matters (docs/speculative.md)");
  }
  if (!o.record_routing.empty()) {
    Status st = check_writable(o.record_routing);
    if (st.ok()) st = runner.set_routing_record(true);
    if (!st.ok()) {
      SPW_LOG_ERROR("{}", st.error().message);
      return 2;
    }
    SPW_LOG_INFO("recording routing statistics; written to {} when the server shuts down", o.record_routing);
  }
  const ModelConfig& cfg = runner.config();
  auto vision = vision::read_vision_config(o.s.model_dir);
  if (!vision.ok()) {
    SPW_LOG_ERROR("{}", vision.error().message);
    return 1;
  }
  std::ifstream config_file(o.s.model_dir + "/config.json", std::ios::binary);
  const std::string config_text((std::istreambuf_iterator<char>(config_file)), std::istreambuf_iterator<char>());
  server::ModelInfo info{o.s.served_model_name, cfg.is_v41() ? ChatFamily::v41 : ChatFamily::v4, int32_t(cfg.eos_id),
                         server::make_system_fingerprint(config_text, o.numerics + "@" + std::string(runner.device())),
                         vision.value()};
  if (info.vision && runner.takes_images()) {
    auto weights = vision::load_vision_weights(o.s.model_dir, *info.vision, cfg.d_model);
    if (!weights.ok()) {
      SPW_LOG_ERROR("{}", weights.error().message);
      return 1;
    }
    if (*weights) {
      auto encoder = make_image_encoder(std::move(**weights), o.vision_device, runner.device());
      if (!encoder.ok()) {
        SPW_LOG_ERROR("{}", encoder.error().message);
        return 1;
      }
      info.image_encoder = std::move(encoder.value());
      SPW_LOG_INFO("vision tower: {} layers of width {}, up to {} positions per image, encoded on the {}",
                   info.vision->n_layers, info.vision->d_model, info.vision->max_image_tokens,
                   info.image_encoder->device() == "cuda" ? "GPU" : "CPU (reference)");
    } else {
      SPW_LOG_WARN("{}/config.json describes a vision tower but the checkpoint holds none of its tensors: images are refused",
                   o.s.model_dir);
    }
  } else if (info.vision) {
    SPW_LOG_INFO("vision tower: the {} runner does not take image positions; image inputs are refused", runner.device());
  }
  runtime::Scheduler scheduler(runner, o.s.scheduler);
  server::OpenAiApi api(scheduler, **text, o.s, info);
  server::HttpServer http(api, scheduler, o.s);
  if (auto st = http.bind(); !st.ok()) {
    SPW_LOG_ERROR("{}", st.error().message);
    scheduler.stop();
    return 1;
  }
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    SPW_LOG_INFO("signal {}: shutting down (grace {} s)", sig, o.s.shutdown_grace_s);
    http.shutdown(o.s.shutdown_grace_s);
  });
  SPW_LOG_INFO("serving {} on http://{}:{} (model id \"{}\", {} runner)", o.s.model_dir, o.s.host, http.port(),
               o.s.served_model_name, runner.device());
  const Status served = http.serve();
  if (!served.ok()) {
    SPW_LOG_ERROR("{}", served.error().message);
    pthread_kill(signal_thread.native_handle(), SIGTERM);
  }
  signal_thread.join();
  scheduler.stop();
  if (!o.record_routing.empty()) save_recorded_routing(runner, o.record_routing);
  SPW_LOG_INFO("shut down");
  return served.ok() ? 0 : 1;
}

}  // namespace

std::function<int()> add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto& s = o->s;
  auto& sched = s.scheduler;
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (docs/server.md)");
  cmd->add_option("--model,-m", s.model_dir,
                  "model directory (config.json, safetensors, tokenizer.json); default: the bundled demo model")
      ->envname("SPILLWAY_MODEL");
  cmd->add_option("--served-model-name", s.served_model_name, "model id in /v1/models (default: the directory name)")
      ->envname("SPILLWAY_SERVED_MODEL_NAME");
  cmd->add_option("--host", s.host, "address to listen on")->envname("SPILLWAY_HOST")->capture_default_str();
  cmd->add_option("--port", s.port, "TCP port (0 = any free port, printed at start)")
      ->envname("SPILLWAY_PORT")
      ->capture_default_str();
  cmd->add_option("--api-key", s.api_key, "require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize")
      ->envname("SPILLWAY_API_KEY");
  cmd->add_option("--max-num-seqs", sched.max_num_seqs, "sequences running at once")
      ->envname("SPILLWAY_MAX_NUM_SEQS")
      ->capture_default_str();
  cmd->add_option("--max-batch", sched.max_batch, "sequences in one scheduler step")
      ->envname("SPILLWAY_MAX_BATCH")
      ->capture_default_str();
  cmd->add_option("--kv-tokens", sched.kv_tokens,
                  "KV capacity in positions, over all running sequences and prefix-cache copies (GPU: sizes the KV "
                  "pools); admission and preemption keep within it")
      ->envname("SPILLWAY_KV_TOKENS")
      ->capture_default_str();
  cmd->add_option("--max-queue", sched.max_queue, "requests waiting for admission before new ones get 503")
      ->envname("SPILLWAY_MAX_QUEUE")
      ->capture_default_str();
  cmd->add_option("--max-model-len", s.max_model_len, "prompt + completion tokens of one request")
      ->envname("SPILLWAY_MAX_MODEL_LEN")
      ->capture_default_str();
  cmd->add_option("--max-tokens-limit", s.max_tokens_limit, "largest max_tokens accepted; the default when none is sent")
      ->envname("SPILLWAY_MAX_TOKENS_LIMIT")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", sched.prefill_chunk, "prefill piece size in tokens (multiple of 16)")
      ->envname("SPILLWAY_PREFILL_CHUNK")
      ->capture_default_str();
  cmd->add_option("--step-token-budget", sched.step_token_budget,
                  "tokens per scheduler step (decodes + prefill pieces); GPU without --batch-invariant: also the "
                  "rows of one batched prefill step")
      ->envname("SPILLWAY_STEP_TOKEN_BUDGET")
      ->capture_default_str();
  cmd->add_option("--prefix-cache-mb", o->prefix_cache_mb, "prefix-cache memory budget in MiB (0 = off)")
      ->envname("SPILLWAY_PREFIX_CACHE_MB")
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", s.max_body_bytes, "largest request body")
      ->envname("SPILLWAY_MAX_BODY_BYTES")
      ->capture_default_str();
  cmd->add_option("--max-images", s.image_limits.max_images, "images in one request (image_url content parts)")
      ->check(CLI::Range(0, 1024))
      ->envname("SPILLWAY_MAX_IMAGES")
      ->capture_default_str();
  cmd->add_option("--max-image-bytes", s.image_limits.max_encoded_bytes,
                  "encoded bytes of one image after base64 decoding (the body limit, --max-body-bytes, applies first)")
      ->check(CLI::Range(size_t(1), size_t(1) << 32))
      ->envname("SPILLWAY_MAX_IMAGE_BYTES")
      ->capture_default_str();
  cmd->add_option("--max-image-pixels", s.image_limits.max_pixels,
                  "width x height an image may declare; checked before any pixel is decoded")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 34))
      ->envname("SPILLWAY_MAX_IMAGE_PIXELS")
      ->capture_default_str();
  cmd->add_option("--http-threads", s.http_threads, "requests served at once (a streaming request holds one thread)")
      ->envname("SPILLWAY_HTTP_THREADS")
      ->capture_default_str();
  cmd->add_option("--http-max-connections", s.max_connections,
                  "open connections at once; more get 503 and are closed before anything is read")
      ->check(CLI::Range(1, 1 << 20))
      ->envname("SPILLWAY_HTTP_MAX_CONNECTIONS")
      ->capture_default_str();
  cmd->add_option("--http-header-timeout", s.header_timeout_s,
                  "seconds a request line and headers may take to arrive whole (then 408)")
      ->check(CLI::Range(0.1, 3600.0))
      ->envname("SPILLWAY_HTTP_HEADER_TIMEOUT")
      ->capture_default_str();
  cmd->add_option("--http-keep-alive-timeout", s.keep_alive_timeout_s,
                  "seconds an idle kept-alive connection stays open")
      ->check(CLI::Range(0.1, 3600.0))
      ->envname("SPILLWAY_HTTP_KEEP_ALIVE_TIMEOUT")
      ->capture_default_str();
  cmd->add_option("--http-read-timeout", s.read_timeout_s, "seconds to wait for the next bytes of a request body")
      ->check(CLI::Range(0.1, 3600.0))
      ->envname("SPILLWAY_HTTP_READ_TIMEOUT")
      ->capture_default_str();
  cmd->add_option("--http-min-body-rate", s.min_body_rate,
                  "bytes/s a request body must average once --http-read-timeout has passed (a client that "
                  "drips its body slower is dropped, freeing its thread); 0: no minimum")
      ->check(CLI::Range(0.0, 1e12))
      ->envname("SPILLWAY_HTTP_MIN_BODY_RATE")
      ->capture_default_str();
  cmd->add_option("--http-write-timeout", s.write_timeout_s,
                  "seconds to wait for a client to take more of a response before dropping it")
      ->check(CLI::Range(0.1, 3600.0))
      ->envname("SPILLWAY_HTTP_WRITE_TIMEOUT")
      ->capture_default_str();
  cmd->add_option("--listen-backlog", s.listen_backlog,
                  "new connections the kernel queues before they are accepted (capped by net.core.somaxconn)")
      ->check(CLI::Range(1, 65535))
      ->envname("SPILLWAY_LISTEN_BACKLOG")
      ->capture_default_str();
  cmd->add_option("--shutdown-grace", s.shutdown_grace_s, "seconds in-flight requests get on SIGINT/SIGTERM")
      ->envname("SPILLWAY_SHUTDOWN_GRACE")
      ->capture_default_str();
  cmd->add_option("--numerics", o->numerics, "reference or exact (docs/numerics.md)")
      ->check(CLI::IsMember({"reference", "exact"}))
      ->envname("SPILLWAY_NUMERICS")
      ->capture_default_str();
  cmd->add_flag("--no-stale-index-k", o->no_stale_index_k,
               "V4.1: index owners always read their own keys, instead of reproducing the reference decode's quirk "
               "(docs/numerics.md); makes decode steps agree with multi-token forwards, such as verified drafts")
      ->envname("SPILLWAY_NO_STALE_INDEX_K");
  cmd->add_option("--vision-device", o->vision_device,
                  "where images are encoded (models with a vision tower): cuda (the GPU tower), cpu (the CPU "
                  "reference), or auto (cuda beside the GPU runner, else cpu)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->envname("SPILLWAY_VISION_DEVICE")
      ->capture_default_str();
  cmd->add_option("--device", o->device,
                  "where the model runs: cuda (the GPU engine), cpu (the CPU reference), or auto (cuda when a CUDA "
                  "device is visible and the model is not the bundled demo model)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->envname("SPILLWAY_DEVICE")
      ->capture_default_str();
  cmd->add_option("--batch-invariant", o->batch_invariant,
                  "GPU: a sequence's greedy output does not depend on what else is batched with it (decode linears on "
                  "the GEMV, on tensor cores unless SPILLWAY_GEMV_MMA=0, which costs one stream ~10 %; EXL3 experts "
                  "of decodes on the grouped kernel's one-token class; short prompt pieces together on row-invariant "
                  "paths, long ones alone); false takes the fastest path per step's row count (GEMMs past 16 rows), faster at large "
                  "batches")
      ->envname("SPILLWAY_BATCH_INVARIANT")
      ->capture_default_str();
  cmd->add_option("--prefix-cache-slots", o->prefix_cache_slots,
                  "GPU: sequences the prefix cache keeps on the device, each a copy of a prompt prefix's KV with "
                  "pool room for --max-model-len positions (0 or --prefix-cache-mb 0: no prefix cache)")
      ->check(CLI::Range(0, 4096))
      ->envname("SPILLWAY_PREFIX_CACHE_SLOTS")
      ->capture_default_str();
  cmd->add_option("--speculative", o->speculative,
                  "speculative decoding: ngram drafts the tokens that followed the latest earlier occurrence of the "
                  "context's last tokens (prompt lookup, no weights) and verifies them in one forward; off decodes "
                  "one token per step (docs/speculative.md)")
      ->check(CLI::IsMember({"off", "ngram"}))
      ->envname("SPILLWAY_SPECULATIVE")
      ->capture_default_str();
  cmd->add_option("--draft-tokens", sched.speculative.draft_tokens,
                  "most tokens one sequence drafts per step (each sequence adapts its own length below this)")
      ->envname("SPILLWAY_DRAFT_TOKENS")
      ->capture_default_str();
  cmd->add_option("--ngram-min", sched.speculative.ngram.min_ngram,
                  "ngram drafter: shortest match of the context's last tokens that may propose a draft")
      ->envname("SPILLWAY_NGRAM_MIN")
      ->capture_default_str();
  cmd->add_option("--ngram-max", sched.speculative.ngram.max_ngram,
                  "ngram drafter: longer matches (up to this many tokens) are preferred")
      ->envname("SPILLWAY_NGRAM_MAX")
      ->capture_default_str();
  add_placement_flags(cmd, o->placement);
  cmd->add_option("--engram-tables", o->engram_tables,
                  "GPU runner, V4.1: where the Engram tables live: pinned (host memory the GPU reads), disk (the "
                  "checkpoint's memory maps; the host gathers each step's rows), auto (pinned when they take at most "
                  "half of the available host memory)")
      ->check(CLI::IsMember({"auto", "pinned", "disk"}))
      ->capture_default_str();
  cmd->add_option("--record-routing", o->record_routing,
                  "record how often each layer routes to each expert; written to this file at shutdown, for "
                  "`spillway plan --routing-stats` (docs/placement.md)");
  cmd->add_option("--threads", o->threads, "CPU threads of the CPU reference runner (0 = all cores)")
      ->envname("SPILLWAY_THREADS");
  return [o] { return serve(*o); };
}

}  // namespace spw::cli
