// v4serve: DeepSeek-V4 inference engine and OpenAI-compatible server.
#include <algorithm>
#include <cstdio>
#include <string>

#include "base/log.h"
#include "cli/command.h"

namespace v4::cli {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
}  // namespace v4::cli

int main(int argc, char** argv) {
  v4::set_log_level("info");
  CLI::App app{"v4serve: DeepSeek-V4 inference engine and OpenAI-compatible server"};
  app.require_subcommand(1);
  std::string log_level = "info";
  // An unknown name would make spdlog turn every message off, errors included.
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"},
                            CLI::ignore_case));
  // Every subcommand's --help shows each option's default value ([...]), taken from the value
  // the option's variable holds when it is added (subcommands inherit option_defaults).
  app.option_defaults()->always_capture_default();
  auto& cmds = v4::cli::registry();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  // The first word that is not an option (or --log-level's value) names the subcommand; CLI11
  // would only say "A subcommand is required" for a misspelt one.
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--log-level") {
      ++i;
      continue;
    }
    if (!arg.empty() && arg[0] == '-') continue;
    const bool known = std::any_of(cmds.begin(), cmds.end(), [&](auto& c) { return c.name == arg; });
    if (!known) {
      std::string names;
      for (auto& c : cmds) names += (names.empty() ? "" : ", ") + c.name;
      std::fprintf(stderr, "error: unknown subcommand '%s' (one of: %s; see v4serve --help)\n",
                   arg.c_str(), names.c_str());
      return 2;
    }
    break;
  }
  std::function<int()> action;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    auto run = c.setup(*sub);
    sub->callback([&action, run] { action = run; });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help / --version print and exit 0; every usage error (unknown flag, bad or out-of-range
    // value, missing argument) exits 2 like the other command-line and config errors (CLI11's own
    // codes are 101–120).
    return app.exit(e) == 0 ? 0 : 2;
  }
  v4::set_log_level(log_level);
  return action ? action() : 2;
}
