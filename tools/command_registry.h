// tools/command_registry.h — each tools/cmd_*.cpp registers one subcommand of `kvattn`.
//
//   const bool plan_registered = kvattn::tools::register_command(
//       {"plan", "Plan the KV cache for a model", &setup_plan});
//
// (in the file's anonymous namespace, named after its command: the tool is compiled as a unity
// build, several cmd_*.cpp files to one translation unit).
//
// `setup` adds the subcommand's options to the CLI11 App and returns the function that runs
// it (returning the process exit code).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace kvattn::tools {

struct Command {
  std::string name;
  std::string description;
  // Called once with the subcommand's App; returns the action to run if it was selected.
  std::function<std::function<int()>(CLI::App&)> setup;
  int order = 100;  // position in --help
};

bool register_command(Command c);
std::vector<Command>& commands();

}  // namespace kvattn::tools
