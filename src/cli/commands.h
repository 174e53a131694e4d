// The `spillway` subcommands. Each registers its flags on the CLI11 app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace spw::cli {

// Returns the action to run if the subcommand was selected (exit code).
std::function<int()> add_run_command(CLI::App& app);
std::function<int()> add_inspect_command(CLI::App& app);
std::function<int()> add_serve_command(CLI::App& app);
std::function<int()> add_quantize_command(CLI::App& app);
std::function<int()> add_kl_command(CLI::App& app);
std::function<int()> add_bench_command(CLI::App& app);
std::function<int()> add_plan_command(CLI::App& app);

}  // namespace spw::cli
