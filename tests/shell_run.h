// Runs a shell command for the CLI tests (tests/model, tests/integration).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
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

/// One `v4serve bench` run: exit status, console output (stdout + stderr), the --out report.
struct BenchRun {
  int rc = -1;
  std::string out, report;
};

/// Runs `bin bench ARGS --out F` with F a temporary Markdown file named after `tag` and this
/// process, reads the report back and removes F (report empty when the run wrote none).
inline BenchRun run_bench_report(const std::string& bin, const std::string& args,
                                 const std::string& tag) {
  const std::string md = (std::filesystem::temp_directory_path() /
                          ("v4bench-" + tag + "-" + std::to_string(::getpid()) + ".md"))
                             .string();
  BenchRun r;
  std::tie(r.rc, r.out) = run_command(bin + " bench " + args + " --out " + md);
  std::ifstream in(md);
  std::stringstream ss;
  ss << in.rdbuf();
  r.report = ss.str();
  std::filesystem::remove(md);
  return r;
}

}  // namespace v4::testing
