// Routing statistics from a calibration text (`spillway plan --calibration FILE`): the text is tokenized with the
// model's tokenizer, cut into sequences, and prefilled through a model runner (the CPU reference or the GPU engine,
// as `spillway run` picks them) that counts every layer's expert picks. What serve --record-routing records on live
// traffic, from a file instead (docs/placement.md "Routing statistics").
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "runtime/routing_stats.h"

namespace spw::cli {

struct CalibrationOptions {
  std::string model_dir;
  std::string text_file;
  int64_t max_tokens = 65536;  // tokens of the text routed (the text's start)
  int64_t seq_len = 2048;      // tokens per sequence (each starts with BOS, which is routed and counted too)
  std::string device = "auto";  // auto, cpu or cuda (cli/runner_choice.h)
};

// Errors: an unreadable or empty text, a model without a tokenizer, runner load failures.
Result<runtime::RoutingStats> record_routing_on_text(const CalibrationOptions& options);

}  // namespace spw::cli
