// `spillway inspect DIR`: what a checkpoint holds — config summary, layer plan, tensor
// inventory by format, parameter counts and the bytes one decoded token must read.
#include "cli/commands.h"

int spw_inspect_main(const std::string& dir, bool list_tensors);

namespace spw::cli {

std::function<int()> add_inspect_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto list = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("inspect", "Show a checkpoint's layers, tensors, sizes and decode bytes per token");
  cmd->add_option("dir", *dir, "model directory (header-only checkpoints work)")->required();
  cmd->add_flag("--tensors", *list, "list every tensor");
  return [dir, list] { return spw_inspect_main(*dir, *list); };
}

}  // namespace spw::cli
