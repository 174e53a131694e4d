// `spillway run`: one-shot generation through a model runner (--device: the CPU reference or the GPU
// engine, chosen as `serve` chooses). The prompt is text, encoded with the model's tokenizer.json
// (after BOS), and the output streams as text; with --token-ids the prompt and the output are token
// ids (models without a tokenizer). The prompt is prefilled in the server's pieces
// (runtime/step_plan.h), so greedy output matches `serve`'s for the same prompt and runner.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <iostream>
#include <random>
#include <sstream>

#include "base/log.h"
#include "base/thread_pool.h"
#include "cli/commands.h"
#include "cli/default_model.h"
#include "cli/runner_choice.h"
#include "model/model.h"
#include "runtime/step_plan.h"
#include "tokenizer/tokenizer.h"

namespace spw::cli {
namespace {

struct RunOptions {
  std::string model_dir;
  std::string prompt;
  int max_tokens = 32;
  float temperature = 0.f;
  float top_p = 1.f;
  uint64_t seed = 0;
  std::string numerics = "reference";
  bool no_stale_index_k = false;
  bool token_ids = false;
  std::string device = "auto";
  int prefill_chunk = 256;
  int threads = 0;
};

Result<std::vector<int32_t>> parse_token_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string item;
  std::stringstream ss(text);
  while (ss >> item) {
    for (char& ch : item)
      if (ch == ',') ch = ' ';
    std::stringstream inner(item);
    std::string part;
    while (inner >> part) {
      try {
        size_t used = 0;
        long v = std::stol(part, &used);
        if (used != part.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(part);
        ids.push_back(int32_t(v));
      } catch (const std::exception&) {
        return make_error("prompt: '", part,
                          "' is not a token id; with --token-ids, -p takes ids like \"0 17 42\"");
      }
    }
  }
  if (ids.empty()) return make_error("prompt: no token ids given");
  return ids;
}

int32_t sample(const std::vector<float>& logits, float temperature, float top_p, std::mt19937_64& rng) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  if (temperature <= 0.f) return int32_t(best);
  std::vector<std::pair<float, int32_t>> probs;
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    float p = std::exp((logits[i] - logits[best]) / temperature);
    probs.emplace_back(p, int32_t(i));
    sum += p;
  }
  std::sort(probs.begin(), probs.end(), std::greater<>());
  double kept = 0;
  size_t n_keep = 0;
  while (n_keep < probs.size() && kept < top_p * sum) kept += probs[n_keep++].first;
  std::uniform_real_distribution<double> u(0.0, kept);
  double r = u(rng);
  for (size_t i = 0; i < n_keep; ++i) {
    r -= probs[i].first;
    if (r <= 0) return probs[i].second;
  }
  return probs[n_keep - 1].second;
}

// Prefill and decode speed on stderr, after the output (stdout stays the generated text alone).
void print_rates(size_t n_prompt, double prefill_s, int n_decoded, double decode_s) {
  auto rate = [](double n, double s) { return s > 0 ? n / s : 0.0; };
  std::fprintf(stderr, "prefill: %zu tokens in %.3f s, %.1f tokens/s\n", n_prompt, prefill_s,
               rate(double(n_prompt), prefill_s));
  std::fprintf(stderr, "decode: %d tokens in %.3f s, %.1f tokens/s\n", n_decoded, decode_s,
               rate(double(n_decoded), decode_s));
}

int run(RunOptions o) {
  if (o.threads > 0) set_global_pool_threads(o.threads);
  if (o.model_dir.empty()) {
    o.model_dir = default_model_dir();
    if (o.model_dir.empty()) {
      SPW_LOG_ERROR("no --model given and the bundled demo model (models/demo) was not found");
      return 2;
    }
  }
  std::unique_ptr<Tokenizer> tokenizer;
  Result<std::vector<int32_t>> prompt = make_error("no prompt");
  if (o.token_ids) {
    prompt = parse_token_ids(o.prompt);
  } else {
    auto tok = Tokenizer::load(o.model_dir + "/tokenizer.json");
    if (!tok.ok()) {
      SPW_LOG_ERROR("{} (use --token-ids for a model without a tokenizer)", tok.error().message);
      return 2;
    }
    tokenizer = std::move(tok.value());
    prompt = tokenizer->encode(o.prompt);
  }
  if (!prompt.ok()) {
    SPW_LOG_ERROR("{}", prompt.error().message);
    return 2;
  }
  Numerics numerics = o.numerics == "exact" ? Numerics::exact() : Numerics::reference();
  numerics.stale_index_k = !o.no_stale_index_k;
  if (o.prefill_chunk % 16 != 0) {
    SPW_LOG_ERROR("--prefill-chunk {} must be a multiple of 16", o.prefill_chunk);
    return 2;
  }
  auto config = read_model_config(o.model_dir);
  if (!config.ok()) {
    SPW_LOG_ERROR("{}", config.error().message);
    return 1;
  }
  if (tokenizer) prompt->insert(prompt->begin(), int32_t(config->bos_id));
  RunnerOptions ro;
  ro.device = o.device;
  ro.model_dir = o.model_dir;
  ro.numerics = numerics;
  ro.max_num_seqs = 1;
  ro.max_model_len = int64_t(prompt->size()) + o.max_tokens + 1;
  ro.prefill_chunk = o.prefill_chunk;
  ro.prefix_cache_slots = 0;
  auto loaded = load_runner(ro);
  if (!loaded.ok()) {
    SPW_LOG_ERROR("{}", loaded.error().message);
    return 1;
  }
  ModelRunner& runner = *loaded->runner;
  auto made = runner.new_sequence();
  if (!made.ok()) {
    SPW_LOG_ERROR("{}", made.error().message);
    return 1;
  }
  RunnerSequence& seq = **made;
  auto forward = [&](std::span<const int32_t> tokens) -> Result<std::vector<float>> {
    const RunnerInput in{&seq, tokens, false};
    auto r = runner.forward(std::span<const RunnerInput>(&in, 1));
    if (!r.ok()) return r.error();
    return std::move((*r)[0]);
  };
  std::optional<IncrementalDecoder> detok;
  if (tokenizer) detok.emplace(*tokenizer);
  std::mt19937_64 rng(o.seed);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t_prefill = Clock::now();
  Result<std::vector<float>> logits = make_error("the prompt is empty");
  const int64_t n_prompt = int64_t(prompt->size());
  for (int64_t done = 0; done < n_prompt;) {
    const int64_t end = runtime::next_prefill_end(done, n_prompt, o.prefill_chunk, 16);
    logits = forward(std::span<const int32_t>(*prompt).subspan(size_t(done), size_t(end - done)));
    if (!logits.ok()) break;
    done = end;
  }
  const double prefill_s = std::chrono::duration<double>(Clock::now() - t_prefill).count();
  double decode_s = 0;
  int n_decoded = 0;  // single-token forwards
  for (int step = 0; step < o.max_tokens; ++step) {
    if (!logits.ok()) {
      SPW_LOG_ERROR("{}", logits.error().message);
      return 1;
    }
    int32_t next = sample(*logits, o.temperature, o.top_p, rng);
    if (next == config->eos_id) break;
    if (detok) std::cout << detok->push(next) << std::flush;
    else std::cout << next << " " << std::flush;
    const Clock::time_point t_step = Clock::now();
    logits = forward(std::span<const int32_t>(&next, 1));
    decode_s += std::chrono::duration<double>(Clock::now() - t_step).count();
    ++n_decoded;
  }
  if (detok) std::cout << detok->flush();
  std::cout << "\n" << std::flush;
  print_rates(prompt->size(), prefill_s, n_decoded, decode_s);
  return 0;
}

}  // namespace

std::function<int()> add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate from a prompt (on the GPU engine or the CPU reference: --device)");
  cmd->add_option("--model,-m", o->model_dir,
                  "model directory (config.json + safetensors [+ tokenizer.json]); default: the bundled demo model")
      ->envname("SPILLWAY_MODEL");
  cmd->add_option("--prompt,-p", o->prompt, "prompt text (or token ids with --token-ids)")->required();
  cmd->add_flag("--token-ids", o->token_ids, "the prompt and output are token ids, e.g. -p \"0 17 42\"");
  cmd->add_option("--max-tokens,-n", o->max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "nucleus sampling mass")->capture_default_str();
  cmd->add_option("--seed", o->seed, "sampling seed")->capture_default_str();
  cmd->add_option("--numerics", o->numerics,
                  "reference: reproduce the reference's bf16/fp8/fp4 roundings; exact: f32 throughout")
      ->check(CLI::IsMember({"reference", "exact"}))
      ->envname("SPILLWAY_NUMERICS")
      ->capture_default_str();
  cmd->add_flag("--no-stale-index-k", o->no_stale_index_k,
                "V4.1: ratio-2 index owners always use their own keys in decode (the reference does not)");
  cmd->add_option("--device", o->device,
                  "where the model runs: cuda, cpu, or auto (cuda when a CUDA device is visible and the model is not the "
                  "bundled demo model)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->envname("SPILLWAY_DEVICE")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "prefill piece size in tokens (multiple of 16), as serve's")
      ->check(CLI::Range(16, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads of the CPU reference runner (0 = all cores)")
      ->envname("SPILLWAY_THREADS");
  return [o] { return run(*o); };
}

}  // namespace spw::cli
