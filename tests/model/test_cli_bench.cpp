// `v4serve bench` and `info --load-format dummy` as a user runs them on the CPU with a tiny config:
// the Markdown report has every decode and prefill cell with a time, a floor and the header
// lines (device, commit, command, weights by format, KV pools, bandwidth, the routing note).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../shell_run.h"

using v4::testing::run_command;

namespace {

std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> out;
  std::stringstream ss(row.substr(1));
  std::string c;
  while (std::getline(ss, c, '|')) {
    const size_t a = c.find_first_not_of(' '), b = c.find_last_not_of(' ');
    out.push_back(a == std::string::npos ? "" : c.substr(a, b - a + 1));
  }
  return out;
}

// --kv-cache-dtype bf16: the report names the dtype, and the "does not fit" arithmetic follows
// it: batch 64 × 4K tokens of tiny-kinds-fp32 needs ~0.04 GiB of f32 pools (measured), ~0.02 GiB
// of bf16 pools; a 32 MiB budget runs the cell only with bf16.
TEST(CliBench, KvCacheDtypeBf16HalvesPoolBytes) {
  auto report = [](const std::string& dtype) {
    const auto r = v4::testing::run_bench_report(
        V4_BINARY,
        std::string("--model ") + V4_SOURCE_DIR +
            "/tests/fixtures/tiny-kinds-fp32 --load-format dummy --batch 64 --context 4096 "
            "--steps 1 --warmup 0 --prefill-steps 1 --prefill-warmup 0 --prefill-chunk 64 "
            "--threads 2 --kv-cache-bytes 33554432 --kv-cache-dtype " +
            dtype,
        "kv-" + dtype);
    EXPECT_EQ(r.rc, 0) << r.out;
    return r.report;
  };
  auto decode_row = [](const std::string& text) {
    const size_t at = text.find("\n| decode |");
    return at == std::string::npos ? std::string() : text.substr(at + 1, text.find('\n', at + 1) - at - 1);
  };
  const std::string f32 = report("f32"), bf16 = report("bf16");
  EXPECT_NE(f32.find("KV cache f32"), std::string::npos) << f32;
  EXPECT_NE(bf16.find("KV cache bf16"), std::string::npos) << bf16;
  EXPECT_NE(decode_row(f32).find("does not fit"), std::string::npos) << f32;
  const std::string row = decode_row(bf16);
  ASSERT_FALSE(row.empty()) << bf16;
  EXPECT_EQ(row.find("does not fit"), std::string::npos) << bf16;
  EXPECT_GT(std::atof(cells(row)[4].c_str()), 0) << row;
  // fp8 rows (608 bytes of 2048 at hd 512; 64 of 128 at the fixture's 32 = 24 + 8) fit too: the
  // pools are filled with e4m3 bytes and decode reads them through the fp8 attention path.
  const std::string fp8 = report("fp8");
  EXPECT_NE(fp8.find("KV cache fp8"), std::string::npos) << fp8;
  const std::string row8 = decode_row(fp8);
  ASSERT_FALSE(row8.empty()) << fp8;
  EXPECT_EQ(row8.find("does not fit"), std::string::npos) << fp8;
  EXPECT_GT(std::atof(cells(row8)[4].c_str()), 0) << row8;
}

TEST(CliBench, TinyDummyWritesEveryCell) {
  const std::string md =
      (std::filesystem::temp_directory_path() / ("v4bench-" + std::to_string(::getpid()) + ".md"))
          .string();
  const auto [rc, out] =
      run_command(std::string(V4_BINARY) + " bench --model " + V4_SOURCE_DIR +
          "/tests/fixtures/tiny-kinds-fp32 --load-format dummy --batch 1,2 --context 64,256 "
          "--steps 2 --threads 2 --out " +
          md);
  ASSERT_EQ(rc, 0) << out;
  std::ifstream in(md);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  for (const char* s :
       {"- device: CPU", "- commit: ", "- command: `",
        "- date: ", "- weights (--load-format dummy): matrices f32", "- KV budget", "- KV pools",
        "- measured copy bandwidth: ", "expert routing is roughly uniform"})
    EXPECT_NE(text.find(s), std::string::npos) << "missing '" << s << "' in\n" << text;
  int decode = 0, prefill = 0;
  std::stringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const bool d = line.rfind("| decode |", 0) == 0, p = line.rfind("| prefill |", 0) == 0;
    if (!d && !p) continue;
    (d ? decode : prefill)++;
    const auto c = cells(line);
    ASSERT_EQ(c.size(), 11u) << line;
    EXPECT_EQ(c[10], "host plan") << "the CPU backend plans on the host: " << line;
    const double ms = std::atof(c[4].c_str());
    EXPECT_GT(ms, 0) << line;
    EXPECT_GT(std::atof(c[6].c_str()), 0) << "tok/s: " << line;
    if (d) {
      EXPECT_GT(std::atof(c[8].c_str()), 0) << "byte floor: " << line;
      EXPECT_NE(c[9].find("×"), std::string::npos) << line;
      // tok/s = batch / step time
      EXPECT_NEAR(std::atof(c[6].c_str()), std::atof(c[2].c_str()) / (ms / 1e3),
                  0.01 * std::atof(c[6].c_str()) + 1)
          << line;
    } else {
      EXPECT_EQ(c[3], c[1]) << "a chunk larger than the context is cut to the context: " << line;
    }
  }
  EXPECT_EQ(decode, 4) << text;
  EXPECT_EQ(prefill, 2) << text;
  std::filesystem::remove(md);
}

// --sampling: decode steps end as `serve` does (greedy on the backend, default) or download every
// logits row; the report says which; a bad value is refused naming the flag.
TEST(CliBench, SamplingModeIsReportedAndValidated) {
  const std::string base = std::string(V4_BINARY) + " bench --model " + V4_SOURCE_DIR +
                           "/tests/fixtures/tiny-kinds-fp32 --load-format dummy --batch 1 "
                           "--context 64 --steps 1 --warmup 1 --prefill-steps 1 "
                           "--prefill-warmup 0 --threads 2";
  {
    const auto [rc, out] = run_command(base);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("greedy sampling on the backend"), std::string::npos) << out;
    EXPECT_EQ(out.find("(--sampling logits)"), std::string::npos) << out;
  }
  {
    const auto [rc, out] = run_command(base + " --sampling logits");
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("logits download of B × "), std::string::npos) << out;
    EXPECT_NE(out.find("(--sampling logits)"), std::string::npos) << out;
  }
  {
    const auto [rc, out] = run_command(base + " --sampling best");
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find("--sampling"), std::string::npos) << out;
  }
}

// Decode "at 1M" on a model whose last position is 1M − 1 runs with the cache at 1M − (warm-up +
// steps) tokens and says so; prefill at 1M ends exactly at the last position.
TEST(CliBench, DecodeAtTheLastPositionsIsClamped) {
  const auto [rc, out] =
      run_command(std::string(V4_BINARY) + " bench --model " + V4_SOURCE_DIR +
          "/tests/fixtures/tiny-kinds-fp32 --load-format dummy --batch 1 --context 1M "
          "--steps 2 --warmup 1 --prefill-chunk 16 --prefill-steps 1 --prefill-warmup 0 "
          "--threads 2");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("| decode | 1048573 | 1 | 1 | "), std::string::npos) << out;
  EXPECT_NE(out.find("| prefill | 1048576 | 1 | 16 | "), std::string::npos) << out;
  EXPECT_NE(out.find("start at 1048576 − 3 tokens"), std::string::npos) << out;
  EXPECT_EQ(out.find("exceeds"), std::string::npos) << out;
  EXPECT_EQ(out.find("does not fit"), std::string::npos) << out;
}

TEST(CliBench, InfoDummyOnAShapeOnlyConfig) {
  const auto [rc, out] = run_command(std::string(V4_BINARY) + " info --model " + V4_SOURCE_DIR +
                             "/models/configs/v4-flash --load-format dummy --num-layers 20");
  ASSERT_EQ(rc, 0) << out;
  for (const char* s :
       {"cut to the first 20 layers", "layers           20 (sliding 2, CSA 9, HCA 9", "mxfp4",
        "fp8-block", "bf16", "routed experts", "c4_kv"})
    EXPECT_NE(out.find(s), std::string::npos) << "missing '" << s << "' in\n" << out;
  const auto [rc2, out2] =
      run_command(std::string(V4_BINARY) + " info --model " + V4_SOURCE_DIR + "/models/configs/v4-flash");
  EXPECT_NE(rc2, 0);
  EXPECT_NE(out2.find("--load-format dummy"), std::string::npos) << out2;
}

}  // namespace

namespace {

// A cell whose step runs out of memory (V4_BENCH_FAIL_CELL=1: the first cell, decode batch 2,
// throws std::bad_alloc from its first step) reports "does not fit" and frees its sequences: the
// next cells (decode batch 1, prefill) of the same run find the state slots (2 in all, the largest
// batch) free and run. Before the sequences were freed on every exit, both reported "does not fit".
TEST(CliBench, FailedCellFreesItsSequences) {
  const auto [rc, out] =
      run_command("V4_BENCH_FAIL_CELL=1 " + std::string(V4_BINARY) + " bench --model " + V4_SOURCE_DIR +
          "/tests/fixtures/tiny-kinds-fp32 --load-format dummy --batch 2,1 --context 256 "
          "--steps 1 --warmup 0 --prefill-steps 1 --prefill-warmup 0 --prefill-chunk 64 "
          "--threads 2 --kv-cache-bytes 33554432");
  ASSERT_EQ(rc, 0) << out;
  auto row = [&](const std::string& prefix) {
    const size_t at = out.find(prefix);
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  const std::string failed = row("| decode | 256 | 2 |"), next = row("| decode | 256 | 1 |"),
                    prefill = row("| prefill | 256 | 1 |");
  EXPECT_NE(failed.find("does not fit (device memory ran out during the step)"),
            std::string::npos)
      << out;
  ASSERT_FALSE(next.empty()) << out;
  EXPECT_EQ(next.find("does not fit"), std::string::npos) << out;
  EXPECT_GT(std::atof(cells(next)[4].c_str()), 0) << next;
  ASSERT_FALSE(prefill.empty()) << out;
  EXPECT_EQ(prefill.find("does not fit"), std::string::npos) << out;
  EXPECT_GT(std::atof(cells(prefill)[4].c_str()), 0) << prefill;
}

}  // namespace
