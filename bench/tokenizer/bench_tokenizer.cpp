// Tokenizer encode throughput (single thread), cold (empty BPE cache) and warm, plus detokenize.
// Usage: bench_tokenizer [--tokenizer PATH] [--out bench/results/tokenizer.md] [FILE...]
// Default corpus: Debian license texts (English prose), libstdc++ headers (code), the project's
// design docs (Markdown with CJK) - whatever of these exists on the machine.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <time.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// CPU time of the calling thread in seconds: "per core" throughput that does not count time the
// thread spent waiting for a CPU on a shared machine.
static double thread_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

static std::string collect(const std::vector<std::string>& roots, const std::string& ext, size_t max_bytes) {
  std::vector<fs::path> files;
  for (auto& r : roots) {
    std::error_code ec;
    if (fs::is_regular_file(r, ec)) {
      files.push_back(r);
      continue;
    }
    if (!fs::is_directory(r, ec)) continue;
    for (auto it = fs::recursive_directory_iterator(r, fs::directory_options::skip_permission_denied, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      if (it->is_regular_file(ec) && (ext.empty() || it->path().extension() == ext)) files.push_back(it->path());
    }
  }
  std::sort(files.begin(), files.end());
  std::string out;
  for (auto& f : files) {
    if (out.size() >= max_bytes) break;
    out += slurp(f);
    out += "\n";
  }
  return out;
}

static std::string cmd_out(const char* cmd) {
  std::string r;
  if (FILE* p = popen(cmd, "r")) {
    char b[256];
    while (fgets(b, sizeof(b), p)) r += b;
    pclose(p);
  }
  while (!r.empty() && (r.back() == '\n' || r.back() == ' ')) r.pop_back();
  return r;
}

int main(int argc, char** argv) {
  std::string tok_path = "/work/shared/data/tokenizers/deepseek-v3/tokenizer.json";
  std::string out_path = std::string(V4_SOURCE_DIR) + "/bench/results/tokenizer.md";
  std::vector<std::string> extra;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) tok_path = argv[++i];
    else if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else extra.push_back(a);
  }
  struct Corpus {
    std::string name, source, text;
  };
  if (!fs::exists(tok_path)) {  // clean clone: unpack the copy bundled with the tests
    fs::path tmp = fs::temp_directory_path() / "v4text_bench_tokenizer.json";
    std::string cmd = "gzip -dc '" + std::string(V4_SOURCE_DIR) + "/tests/data/text/deepseek-v3/tokenizer.json.gz' > '" +
                      tmp.string() + "'";
    if (std::system(cmd.c_str()) == 0) tok_path = tmp.string();
  }
  std::vector<Corpus> corpora;
  if (!extra.empty()) {
    corpora.push_back({"files", "command line", collect(extra, "", 64 << 20)});
  } else {
    corpora.push_back({"english", "/usr/share/common-licenses/*", collect({"/usr/share/common-licenses"}, "", 8 << 20)});
    corpora.push_back({"code", "/usr/include/c++/12/bits/*.h", collect({"/usr/include/c++/12/bits"}, ".h", 8 << 20)});
    corpora.push_back({"docs_md_cjk", "/work/shared/design/*.md + chat-goldens.jsonl",
                       collect({"/work/shared/design", "/work/shared/data/dsv4-reference/chat-goldens.jsonl"}, "", 8 << 20)});
  }
  std::string table =
      "| corpus | source | MB | tokens | cold MB/s | warm MB/s | cold MB/s (wall) | bytes/token | detokenize MB/s |\n|---|---|---|---|---|---|---|---|---|\n";
  double worst = 1e9;
  for (auto& c : corpora) {
    if (c.text.empty()) continue;
    auto t = v4::text::Tokenizer::from_file(tok_path);  // fresh: empty BPE cache
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.status().to_string().c_str());
      return 1;
    }
    auto w0 = Clock::now();
    double t0 = thread_cpu_s();
    auto ids = t->encode(c.text);
    double cold = thread_cpu_s() - t0;
    double cold_wall = std::chrono::duration<double>(Clock::now() - w0).count();
    double warm = 1e9;
    for (int r = 0; r < 3; ++r) {
      double t1 = thread_cpu_s();
      auto ids2 = t->encode(c.text);
      warm = std::min(warm, thread_cpu_s() - t1);
      if (ids2 != ids) std::fprintf(stderr, "non-deterministic encode!\n");
    }
    double t2 = thread_cpu_s();
    v4::text::Detokenizer d(*t);
    size_t out_bytes = 0;
    for (auto id : ids) out_bytes += d.push(id).size();
    out_bytes += d.finish().size();
    double det = thread_cpu_s() - t2;
    double mb = c.text.size() / 1e6;
    worst = std::min(worst, mb / cold);
    char line[512];
    std::snprintf(line, sizeof(line), "| %s | %s | %.2f | %zu | %.1f | %.1f | %.1f | %.2f | %.1f |\n", c.name.c_str(),
                  c.source.c_str(), mb, ids.size(), mb / cold, mb / warm, mb / cold_wall,
                  c.text.size() / double(ids.size()), out_bytes / 1e6 / det);
    std::fputs(line, stdout);
    table += line;
  }
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::string cpu = cmd_out("lscpu | sed -n 's/^Model name: *//p' | head -1");
  std::string commit = cmd_out("git -C " V4_SOURCE_DIR " rev-parse --short HEAD 2>/dev/null");
  std::string md = "# Tokenizer benchmark\n\nSingle-thread `Tokenizer::encode` (DeepSeek V3/V4 tokenizer.json, added-token "
                   "matching on) and streaming `Detokenizer`. *cold* = fresh tokenizer, empty BPE cache (first pass); "
                   "*warm* = best of 3 further passes. MB/s are per core: bytes / CPU time of the encoding thread "
                   "(`CLOCK_THREAD_CPUTIME_ID`); the wall-clock column also counts time spent waiting for a CPU.\n\n";
  md += "- CPU: " + cpu + " (" + std::to_string(std::thread::hardware_concurrency()) + " threads visible; load average " +
        cmd_out("cut -d' ' -f1-3 /proc/loadavg") + " while measuring: a shared build machine)\n";
  md += "- commit: " + commit + "\n- date: " + std::string(date) + "\n- command: `build-text/bench/bench_tokenizer`\n";
  md += "- tokenizer: " + tok_path + "\n\n" + table;
  char w[128];
  std::snprintf(w, sizeof(w), "\nWorst cold throughput: **%.1f MB/s per core** (target: >= 5 MB/s).\n", worst);
  md += w;
  std::ofstream(out_path) << md;
  std::printf("%s", w);
  return worst >= 5.0 ? 0 : 2;
}
