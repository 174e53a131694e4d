// spillway: one program, several subcommands (docs/ARCHITECTURE.md "The program").
#include <CLI/CLI.hpp>

#include "base/log.h"
#include "base/settings.h"
#include "cli/commands.h"
#include "spw_version.h"  // generated at build time (src/cli/write_version.cmake)

int main(int argc, char** argv) {
  CLI::App app{"Spillway: inference engine for DeepSeek-V4.1-Flash and V4-Flash"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("spillway ") + SPW_VERSION);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->envname("SPILLWAY_LOG_LEVEL")
      ->capture_default_str();
  auto run = spw::cli::add_run_command(app);
  auto inspect = spw::cli::add_inspect_command(app);
  auto serve = spw::cli::add_serve_command(app);
  auto quantize = spw::cli::add_quantize_command(app);
  auto kl = spw::cli::add_kl_command(app);
  auto bench = spw::cli::add_bench_command(app);
  auto plan = spw::cli::add_plan_command(app);
  CLI11_PARSE(app, argc, argv);
  spw::log_init(log_level);
  spw::settings();  // the SPILLWAY_* variables without a flag, read once here (base/settings.h)
  if (app.got_subcommand("run")) return run();
  if (app.got_subcommand("inspect")) return inspect();
  if (app.got_subcommand("serve")) return serve();
  if (app.got_subcommand("quantize")) return quantize();
  if (app.got_subcommand("kl")) return kl();
  if (app.got_subcommand("bench")) return bench();
  if (app.got_subcommand("plan")) return plan();
  return 1;
}
