// The `v4serve generate` / `info` commands as a user runs them: --dump-logits against the golden
// fixtures (same row convention), and clear errors for bad input.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "model/checkpoint.h"
#include "model_test_util.h"
#include "../shell_run.h"

using v4::testing::run_command;

namespace v4::model {
namespace {

TEST(Cli, GenerateDumpLogitsMatchesGolden) {
  const auto dirs = testing::fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir);
    auto g = testing::load_golden(dir);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    std::string ids;
    for (auto t : g->prompt_ids) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    const std::string dump = (std::filesystem::temp_directory_path() /
                              ("v4dump-" + std::to_string(::getpid()) + ".safetensors"))
                                 .string();
    const auto [rc, out] =
        run_command(std::string(V4_BINARY) + " generate --model " + dir + " --prompt-ids " + ids +
            " --max-new-tokens " + std::to_string(g->tokens.size()) +
            " --temperature 0 --ignore-eos --threads 2 --kv-budget-mb 64 --dump-logits " + dump);
    ASSERT_EQ(rc, 0) << out;
    auto f = Checkpoint::open_file(dump);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    const int64_t V = g->vocab, T = int64_t(g->prompt_ids.size()), N = int64_t(g->tokens.size());
    auto pids = f->read_i32("prompt_ids", {T});
    auto toks = f->read_i32("tokens", {N});
    auto pre = f->read_f32("prefill_logits", {T, V});
    auto dec = f->read_f32("decode_logits", {N, V});
    ASSERT_TRUE(pids.ok() && toks.ok() && pre.ok() && dec.ok())
        << pids.status().to_string() << toks.status().to_string() << pre.status().to_string()
        << dec.status().to_string();
    EXPECT_EQ(*pids, g->prompt_ids);
    EXPECT_EQ(*toks, g->tokens);
    EXPECT_LE(testing::rel_err(pre->data(), g->prefill_logits.data(), pre->size()), 1e-4);
    EXPECT_LE(testing::rel_err(dec->data(), g->decode_logits.data(), dec->size()), 1e-4);
    std::filesystem::remove(dump);
  }
}

// A misspelt subcommand is named in the error; a --log-level spdlog does not know is refused
// (it used to turn every message off, errors included); level names ignore case.
TEST(Cli, UnknownSubcommandAndLogLevel) {
  const std::string bin = V4_BINARY;
  {
    const auto [rc, out] = run_command(bin + " frobnicate");
    EXPECT_NE(rc, 0);
    EXPECT_NE(out.find("unknown subcommand 'frobnicate'"), std::string::npos) << out;
  }
  {
    const auto [rc, out] = run_command(bin + " --log-level loud version");
    EXPECT_NE(rc, 0);
    EXPECT_NE(out.find("--log-level"), std::string::npos) << out;
    EXPECT_EQ(out.find("v4serve 0."), std::string::npos) << out;
  }
  {
    const auto [rc, out] = run_command(bin + " --log-level WARN version");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("v4serve "), std::string::npos) << out;
  }
  {
    const auto [rc, out] = run_command(bin + " --log-level=error info --model /nonexistent/model");
    EXPECT_NE(rc, 0);
    EXPECT_NE(out.find("/nonexistent/model"), std::string::npos) << out;  // errors still print
  }
}

// --help lists every option with its default: serve has --threads (the CPU op threads, as
// generate and bench), and generate's options show their defaults ("=16", "=cpu", "=all").
TEST(Cli, HelpListsThreadsAndDefaults) {
  const std::string bin = V4_BINARY;
  // The help line of `flag` (with the wrapped description line after it).
  const auto line_of = [](const std::string& out, const std::string& flag) {
    const size_t p = out.find("  " + flag + " ");
    if (p == std::string::npos) return std::string();
    const size_t e = out.find('\n', out.find('\n', p) + 1);
    return out.substr(p, e == std::string::npos ? std::string::npos : e - p);
  };
  {
    const auto [rc, out] = run_command(bin + " serve --help");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(line_of(out, "--threads").find("=0"), std::string::npos) << out;
    EXPECT_NE(line_of(out, "--port").find("=30000"), std::string::npos) << out;
    EXPECT_NE(line_of(out, "--shutdown-timeout").find("=30"), std::string::npos) << out;
  }
  {
    const auto [rc, out] = run_command(bin + " generate --help");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(line_of(out, "--max-new-tokens").find("=16"), std::string::npos) << out;
    EXPECT_NE(line_of(out, "--kv-budget-mb").find("=1024"), std::string::npos) << out;
    EXPECT_NE(line_of(out, "--device").find("=cpu"), std::string::npos) << out;
    EXPECT_NE(line_of(out, "--num-layers").find("=all"), std::string::npos) << out;
    EXPECT_NE(line_of(out, "--threads").find("=0"), std::string::npos) << out;
  }
  {  // serve --threads is accepted and range-checked like generate's
    const auto [rc, out] = run_command(bin + " serve --model /nonexistent --threads -1");
    EXPECT_NE(rc, 0);
    EXPECT_NE(out.find("--threads"), std::string::npos) << out;
  }
}

TEST(Cli, GenerateErrors) {
  const auto dirs = testing::fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  const std::string bin = V4_BINARY;
  auto [rc, out] = run_command(bin + " generate --model /nonexistent --prompt-ids 1,2");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("/nonexistent/config.json: cannot open"), std::string::npos) << out;
  std::tie(rc, out) = run_command(bin + " generate --model " + dirs[0] + " --prompt-ids 1,x");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("'x' is not an integer"), std::string::npos) << out;
  std::tie(rc, out) = run_command(bin + " generate --model " + dirs[0] + " --prompt-ids 99999999");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("outside the vocabulary"), std::string::npos) << out;
  std::tie(rc, out) = run_command(bin + " generate --model " + dirs[0] + " --prompt hello");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("tokenizer.json"), std::string::npos) << out;
  // Requests that cannot fit are refused before any decoding: past the model's context, past
  // the KV budget; and a --dump-logits path whose directory is missing, before the model loads.
  std::tie(rc, out) = run_command(bin + " generate --model " + dirs[0] +
                                  " --prompt-ids 1,2 --max-new-tokens 2000000000");
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("exceed the model's context"), std::string::npos) << out;
  std::tie(rc, out) = run_command(bin + " generate --model " + dirs[0] +
                                  " --prompt-ids 1,2 --max-new-tokens 100000 --kv-budget-mb 1");
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("and the KV cache"), std::string::npos) << out;
  EXPECT_EQ(out.find("tokens: "), std::string::npos) << out;  // nothing was generated
  std::tie(rc, out) = run_command(bin + " generate --model " + dirs[0] +
                                  " --prompt-ids 1,2 --dump-logits /nonexistent-dir/x.safetensors");
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("/nonexistent-dir does not exist"), std::string::npos) << out;
  EXPECT_EQ(out.find("loaded"), std::string::npos) << out;  // refused before the model loads
}

// --prompt goes through the model directory's tokenizer.json (the embedded default model has one).
TEST(Cli, GeneratePromptTextWithTokenizer) {
  const std::string dir = std::string(V4_SOURCE_DIR) + "/models/default";
  ASSERT_TRUE(std::filesystem::exists(dir + "/tokenizer.json")) << dir;
  auto [rc, out] = run_command(
      std::string(V4_BINARY) + " generate --model " + dir +
      " --prompt 'Once upon a time' --max-new-tokens 4 --ignore-eos --threads 2 --kv-budget-mb 64");
  ASSERT_EQ(rc, 0) << out;
  const auto p = out.find("tokens: ");
  ASSERT_NE(p, std::string::npos) << out;
  const std::string ids = out.substr(p + 8, out.find('\n', p) - p - 8);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), ','), 3) << ids;
  EXPECT_NE(out.find("prefill: "), std::string::npos) << out;
}

TEST(Cli, InfoPrintsSummary) {
  const auto dirs = testing::fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  for (const auto& dir : dirs) {
    auto [rc, out] = run_command(std::string(V4_BINARY) + " info --model " + dir);
    ASSERT_EQ(rc, 0) << out;
    for (const char* s :
         {"model_type       deepseek_v4", "parameters", "routed experts", "c4_kv", "swa", "naming"})
      EXPECT_NE(out.find(s), std::string::npos) << dir << ": missing '" << s << "' in\n" << out;
  }
}

// `info --load-format dummy` reads config.json and counts shapes only: no weights are generated,
// so it logs no "generating dummy weights … done … 0.00s" lines (it did before).
TEST(Cli, InfoDummyLogsNoWeightGeneration) {
  auto [rc, out] = run_command(std::string(V4_BINARY) + " info --model " + V4_SOURCE_DIR +
                       "/tests/fixtures/tiny-kinds-fp32 --load-format dummy");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("dummy weights (--load-format dummy"), std::string::npos) << out;
  EXPECT_EQ(out.find("generating dummy weights"), std::string::npos) << out;
}

// A model whose shapes fp8 pools cannot hold (index_head_dim 24: fp8 indexer keys need a
// multiple of 16): info prints n/a in the fp8 column with the reason, and generate refuses
// --kv-cache-dtype fp8 with a one-line error before any weight is generated; bf16 still runs.
TEST(Cli, Fp8KvRefusedForUnsupportedShapes) {
  const std::string src = std::string(V4_SOURCE_DIR) + "/tests/fixtures/tiny-kinds-fp32/config.json";
  std::ifstream in(src);
  ASSERT_TRUE(in.good()) << src;
  auto j = nlohmann::json::parse(in);
  j["index_head_dim"] = 24;
  const auto dir = std::filesystem::temp_directory_path() / "v4-cli-idx24";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << j.dump();
  const std::string bin = V4_BINARY, d = dir.string();
  auto [rc, out] = run_command(bin + " info --model " + d + " --load-format dummy");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("fp8: n/a for this model (fp8 KV pools need index_head_dim % 16 == 0"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("n/a B/token"), std::string::npos) << out;
  std::tie(rc, out) = run_command(bin + " generate --model " + d +
                          " --load-format dummy --kv-cache-dtype fp8 --prompt-ids 1,2,3 "
                          "--max-new-tokens 1");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("--kv-cache-dtype fp8: fp8 KV pools need index_head_dim % 16 == 0"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("generating dummy weights"), std::string::npos) << "refused after loading:\n"
                                                                     << out;
  std::tie(rc, out) = run_command(bin + " generate --model " + d +
                          " --load-format dummy --kv-cache-dtype bf16 --prompt-ids 1,2,3 "
                          "--max-new-tokens 1");
  EXPECT_EQ(rc, 0) << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace v4::model
