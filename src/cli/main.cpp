// v4serve: DeepSeek-V4 inference engine and OpenAI-compatible server.
#include <algorithm>
#include <cstdio>

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
  app.add_option("--log-level", log_level, "debug, info, warn, error");
  auto& cmds = v4::cli::registry();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::function<int()> action;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    auto run = c.setup(*sub);
    sub->callback([&action, run] { action = run; });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  v4::set_log_level(log_level);
  return action ? action() : 2;
}
