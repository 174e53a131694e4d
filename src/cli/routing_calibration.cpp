#include "cli/routing_calibration.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "base/log.h"
#include "cli/load_progress.h"
#include "cli/runner_choice.h"
#include "model/config.h"
#include "runtime/step_plan.h"
#include "tokenizer/tokenizer.h"

namespace spw::cli {

Result<runtime::RoutingStats> record_routing_on_text(const CalibrationOptions& o) {
  if (o.max_tokens < 1 || o.seq_len < 2)
    return make_error("--calibration-tokens and the sequence length must be positive");
  std::ifstream in(o.text_file, std::ios::binary);
  if (!in) return make_error("--calibration ", o.text_file, ": cannot read the file");
  std::stringstream text;
  text << in.rdbuf();
  auto config = read_model_config(o.model_dir);
  if (!config.ok()) return config.error();
  auto tok = Tokenizer::load(o.model_dir + "/tokenizer.json");
  if (!tok.ok()) return make_error("--calibration needs the model's tokenizer: ", tok.error().message);
  // Plain text: special-token spellings in it are text, not control tokens.
  std::vector<int32_t> ids = (*tok)->encode(text.str(), false);
  if (ids.empty()) return make_error("--calibration ", o.text_file, ": no tokens in the file");
  if (int64_t(ids.size()) > o.max_tokens) ids.resize(size_t(o.max_tokens));

  RunnerOptions ro;
  ro.device = o.device;
  ro.model_dir = o.model_dir;
  ro.max_num_seqs = 1;
  ro.max_model_len = o.seq_len + 1;
  ro.prefix_cache_slots = 0;
  auto loaded = load_runner(ro);
  if (!loaded.ok()) return loaded.error();
  ModelRunner& runner = *loaded->runner;
  SPW_TRY(runner.set_routing_record(true));
  const int64_t body = o.seq_len - 1;  // each sequence: BOS + up to seq_len − 1 tokens of the text
  const int n_seqs = int((int64_t(ids.size()) + body - 1) / body);
  SPW_LOG_INFO("calibration: routing {} tokens of {} in {} sequences of up to {} tokens", ids.size(), o.text_file,
               n_seqs, o.seq_len);
  auto report = progress("calibration", "sequences");
  for (int s = 0; s < n_seqs; ++s) {
    const int64_t begin = int64_t(s) * body, end = std::min<int64_t>(begin + body, int64_t(ids.size()));
    std::vector<int32_t> seq_ids{int32_t(config->bos_id)};
    seq_ids.insert(seq_ids.end(), ids.begin() + begin, ids.begin() + end);
    auto made = runner.new_sequence();
    if (!made.ok()) return made.error();
    const int64_t n = int64_t(seq_ids.size());
    for (int64_t done = 0; done < n;) {
      const int64_t next = runtime::next_prefill_end(done, n, ro.prefill_chunk, 16);
      const RunnerInput input{made->get(), std::span<const int32_t>(seq_ids).subspan(size_t(done), size_t(next - done)),
                              false};
      auto r = runner.forward(std::span<const RunnerInput>(&input, 1));
      if (!r.ok()) return make_error("calibration sequence ", s, ": ", r.error().message);
      done = next;
    }
    report(s + 1, n_seqs);
  }
  auto counts = runner.routing_counts();
  if (!counts.ok()) return counts.error();
  return runtime::RoutingStats{config->model_type, counts->n_tokens, std::move(counts->counts)};
}

}  // namespace spw::cli
