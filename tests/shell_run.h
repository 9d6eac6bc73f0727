// Runs a shell command for the CLI tests (tests/model, tests/integration).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <utility>

namespace v4::testing {

/// Runs `cmd` through popen with stderr folded into stdout. Returns (exit status, output); the
/// status is -1 when popen fails.
inline std::pair<int, std::string> run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  return {WEXITSTATUS(rc), out};
}

}  // namespace v4::testing
