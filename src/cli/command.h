// Subcommand registry for the one `v4serve` binary. Each subcommand lives in its own file
// (cmd_<name>.cpp) and registers itself with V4_REGISTER_COMMAND, so parts can add commands
// without editing main.cpp.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace v4::cli {

/// One subcommand: `setup` adds options to its CLI11 subcommand and returns the action that
/// runs after parsing (returning the process exit code).
struct Command {
  std::string name;
  std::string help;
  std::function<std::function<int()>(CLI::App&)> setup;
};

std::vector<Command>& registry();

struct Registrar {
  explicit Registrar(Command c) { registry().push_back(std::move(c)); }
};

}  // namespace v4::cli

#define V4_REGISTER_COMMAND(ident, ...) \
  static ::v4::cli::Registrar v4_cmd_registrar_##ident(::v4::cli::Command{__VA_ARGS__})
