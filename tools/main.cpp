// kvattn — the command-line tool.  Subcommands live in tools/cmd_*.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "command_registry.h"
#include "kvattn/core/error.h"

namespace kvattn::tools {

std::vector<Command>& commands() {
  static std::vector<Command> list;
  return list;
}

bool register_command(Command c) {
  commands().push_back(std::move(c));
  return true;
}

}  // namespace kvattn::tools

namespace {

// The one table of exit codes (also in README.md, "Exit codes").
constexpr const char* kExitCodes =
    "Exit codes:\n"
    "  0  success\n"
    "  1  run: served, but some trace lines were skipped (each reported with its line number)\n"
    "  2  bad input: an unknown subcommand or option, a value out of range, an unsupported combination, "
    "or a request that does not fit the memory budget\n"
    "  3  internal error: a kvattn bug (please report it with the command line)\n"
    "  4  run: the native backend's output differs from the reference (a correctness failure)\n";

constexpr int kExitBadInput = 2;
constexpr int kExitInternal = 3;

std::string subcommand_names(const std::vector<kvattn::tools::Command>& cmds) {
  std::string out;
  for (const auto& c : cmds) out += (out.empty() ? "" : ", ") + c.name;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvattn::tools;
  // Load every CUDA kernel when the context is created rather than at its first launch (the
  // driver's default is lazy): a serving engine pays that once at start-up, not inside its first
  // steps.  Measured on the H200: with lazy loading the default `kvattn run`'s first
  // step took 152 ms of attention time (every other step <= 2.3 ms) and its tokens/s sum fell from
  // 724k to 109k.  Set before any CUDA call; a value the user exported wins.
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  CLI::App app{"kvattn — the attention layer of an LLM serving engine: paged KV cache, batch "
               "preparation and attention kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kvattn " KVATTN_VERSION_STRING);
  app.footer(kExitCodes);
  auto& cmds = commands();
  std::stable_sort(cmds.begin(), cmds.end(), [](const Command& a, const Command& b) { return a.order < b.order; });
  std::map<CLI::App*, std::function<int()>> actions;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.description);
    sub->footer("Exit codes: 0 ok, 1 run served with trace lines skipped, 2 bad input, 3 internal error, "
                "4 run's output check failed (kvattn --help explains them).");
    actions[sub] = c.setup(*sub);
  }
  // The first word that is not an option names the subcommand: say which ones exist when it
  // is unknown (the parser would only say that a subcommand is required).
  if (argc < 2) {
    fmt::print(stderr, "kvattn: a subcommand is required; valid: {}\nRun 'kvattn --help' for more information.\n",
               subcommand_names(cmds));
    return kExitBadInput;
  }
  if (argv[1][0] != '-') {
    const std::string word = argv[1];
    const bool known = std::any_of(cmds.begin(), cmds.end(), [&](const Command& c) { return c.name == word; });
    if (!known) {
      fmt::print(stderr, "kvattn: unknown subcommand '{}'; valid: {}\nRun 'kvattn --help' for more information.\n",
                 word, subcommand_names(cmds));
      return kExitBadInput;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0 to the parser; every other parse error
    // is bad input.
    const int parser_code = app.exit(e);
    return parser_code == 0 ? 0 : kExitBadInput;
  }
  try {
    for (auto& [sub, action] : actions)
      if (sub->parsed()) return action();
  } catch (const kvattn::InternalError& e) {
    fmt::print(stderr, "kvattn: {}\n", e.what());
    return kExitInternal;
  } catch (const kvattn::Error& e) {
    fmt::print(stderr, "kvattn: {}\n", e.what());
    return kExitBadInput;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kvattn: unexpected error: {}\n", e.what());
    return kExitInternal;
  }
  return 0;
}
