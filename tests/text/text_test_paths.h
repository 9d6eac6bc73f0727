// Test data locations for the text tests: everything is in the repo (tests/data/text); the real
// DeepSeek V3 tokenizer is unpacked (once, to $TMPDIR/v4text_dsv3_tokenizer) from its committed
// .gz unless /work/shared or $V4_DSV3_TOKENIZER provides it.
#pragma once
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace v4test {

inline std::string text_data(const std::string& rel) {
  return std::string(V4_SOURCE_DIR) + "/tests/data/text/" + rel;
}

inline std::string ref_dir() { return text_data("dsv4-reference"); }

/// Directory holding the DeepSeek V3 tokenizer.json + tokenizer_config.json, or "" if unavailable.
inline std::string dsv3_tokenizer_dir() {
  namespace fs = std::filesystem;
  static const std::string dir = []() -> std::string {
    // $V4_DSV3_TOKENIZER: a tokenizer.json or its directory, or "bundled" to force the .gz copy.
    const char* env = std::getenv("V4_DSV3_TOKENIZER");
    if (env && std::string(env) != "bundled") {
      fs::path q(env);
      fs::path d = fs::is_directory(q) ? q : q.parent_path();
      return fs::exists(d / "tokenizer.json") ? d.string() : std::string();
    }
    const std::string shared = "/work/shared/data/tokenizers/deepseek-v3";
    if (!env && fs::exists(shared + "/tokenizer.json")) return shared;
    // Unpack once per machine (atomic rename: parallel test processes may race).
    fs::path tmp = fs::temp_directory_path() / "v4text_dsv3_tokenizer";
    fs::create_directories(tmp);
    std::error_code ec;
    if (!fs::exists(tmp / "tokenizer.json")) {
      std::string gz = text_data("deepseek-v3/tokenizer.json.gz");
      std::string part = (tmp / ("tokenizer.json.part" + std::to_string(::getpid()))).string();
      std::string cmd = "gzip -dc '" + gz + "' > '" + part + "'";
      if (!fs::exists(gz) || std::system(cmd.c_str()) != 0) return "";
      fs::rename(part, tmp / "tokenizer.json", ec);
      if (ec) return "";
    }
    if (!fs::exists(tmp / "tokenizer_config.json")) {
      std::string part = (tmp / ("tokenizer_config.json.part" + std::to_string(::getpid()))).string();
      fs::copy_file(text_data("deepseek-v3/tokenizer_config.json"), part, fs::copy_options::overwrite_existing, ec);
      fs::rename(part, tmp / "tokenizer_config.json", ec);
    }
    return tmp.string();
  }();
  return dir;
}

inline std::string dsv3_tokenizer_json() {
  std::string d = dsv3_tokenizer_dir();
  return d.empty() ? "" : d + "/tokenizer.json";
}

}  // namespace v4test
