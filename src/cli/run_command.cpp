// `spillway run`: one-shot generation on the CPU reference engine. Until the tokenizer lands,
// the prompt is a list of token ids and the output is token ids.
#include <cmath>
#include <iostream>
#include <random>
#include <sstream>

#include "base/log.h"
#include "base/thread_pool.h"
#include "cli/commands.h"
#include "model/model.h"

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
                          "' is not a token id; until the tokenizer lands, -p takes token ids like \"0 17 42\"");
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

int run(const RunOptions& o) {
  if (o.threads > 0) set_global_pool_threads(o.threads);
  auto prompt = parse_token_ids(o.prompt);
  if (!prompt.ok()) {
    SPW_LOG_ERROR("{}", prompt.error().message);
    return 2;
  }
  Numerics numerics = o.numerics == "exact" ? Numerics::exact() : Numerics::reference();
  numerics.stale_index_k = !o.no_stale_index_k;
  LoadOptions load;
  load.on_progress = [](int done, int total) { SPW_LOG_INFO("loading layers: {}/{}", done, total); };
  auto model = load_model(o.model_dir, numerics, load);
  if (!model.ok()) {
    SPW_LOG_ERROR("{}", model.error().message);
    return 1;
  }
  SequenceState seq = (*model)->new_sequence();
  std::mt19937_64 rng(o.seed);
  auto logits = (*model)->forward(seq, *prompt);
  for (int step = 0; step < o.max_tokens; ++step) {
    if (!logits.ok()) {
      SPW_LOG_ERROR("{}", logits.error().message);
      return 1;
    }
    int32_t next = sample(*logits, o.temperature, o.top_p, rng);
    std::cout << next << (step + 1 < o.max_tokens ? " " : "\n") << std::flush;
    if (next == (*model)->config().eos_id) {
      std::cout << "\n";
      break;
    }
    logits = (*model)->forward(seq, std::span<const int32_t>(&next, 1));
  }
  return 0;
}

}  // namespace

std::function<int()> add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate from a prompt on the CPU reference engine");
  cmd->add_option("--model,-m", o->model_dir, "model directory (config.json + safetensors)")
      ->required()
      ->envname("SPILLWAY_MODEL");
  cmd->add_option("--prompt,-p", o->prompt, "prompt as token ids, e.g. \"0 17 42\"")->required();
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
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all cores)")->envname("SPILLWAY_THREADS");
  return [o] { return run(*o); };
}

}  // namespace spw::cli
