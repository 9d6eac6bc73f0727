// The prefix cache on the GPU (docs/cache.md §6):
// - Ops::copy_batch of the CUDA backend equals host memcpy's of the same segments, byte for
//   byte: sizes 1 B .. 300 KiB (pieces split across blocks), 16-byte, 4-byte and odd alignments,
//   zero-byte segments, many segments, a one-segment list, back-to-back calls where the second
//   reads what the first wrote (stream order, staging reuse); untouched bytes keep their poison.
// - Tiny golden fixtures served through Engine + ModelExecutor on CUDA (fp32 mode, decode graphs
//   as configured by default): a shared-prefix workload with the prefix cache on gives exactly the
//   greedy tokens of the cache off, hits the system prompt (nonzero hit tokens, every wave-3
//   request resumes at |S|), and all its copies are batched (one copy_batch per phase).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "../engine/prefix_workload.h"
#include "../model/model_test_util.h"
#include "cuda_test_util.h"
#include "engine/model_executor.h"
#include "model/deepseek_v4.h"
#include "ops/cuda/cuda_ops.h"

namespace v4 {
namespace {

std::unique_ptr<ops::Ops> cuda_fp32() {
  ops::CudaOptions o;
  o.precision = ops::Precision::kFp32;
  auto r = ops::make_cuda_ops(o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(CudaCopyBatch, EqualsHostMemcpy) {
  V4_REQUIRE_GPU();
  auto ops = cuda_fp32();
  ASSERT_TRUE(ops);
  auto& rng = cuda::testing::rng();
  const size_t N = size_t(8) << 20;
  std::vector<uint8_t> src_h(N), dst_h(N, 0xAB);
  for (auto& b : src_h) b = uint8_t(rng());
  char* src = static_cast<char*>(ops->alloc(N));
  char* dst = static_cast<char*>(ops->alloc(N));
  ops->upload(src, src_h.data(), N);
  ops->upload(dst, dst_h.data(), N);

  // Segments with disjoint destinations (laid out one after the other with gaps), sources
  // anywhere in src (sources may overlap each other: only destinations must be disjoint).
  auto make_list = [&](int n, size_t* cursor) {
    std::vector<CopySegment> segs;
    const size_t sizes[] = {0, 1, 3, 4, 12, 16, 64, 100, 512, 2048, 4096, 65536, 65537, 300000};
    for (int i = 0; i < n; ++i) {
      size_t bytes = sizes[rng() % (sizeof(sizes) / sizeof(sizes[0]))];
      if (rng() % 4 == 0) bytes = size_t(rng() % 3000);
      const int kind = int(rng() % 3);  // 0: 16-aligned, 1: 4-aligned, 2: any
      auto align = [&](size_t off) {
        return kind == 0 ? off / 16 * 16 : kind == 1 ? off / 4 * 4 : off;
      };
      if (kind == 0) bytes = bytes / 16 * 16;
      if (kind == 1) bytes = bytes / 4 * 4;
      size_t d = align(*cursor + 16 + rng() % 64);
      if (d + bytes > N) break;
      const size_t s = align(size_t(rng()) % (N - bytes));
      segs.push_back({dst + d, src + s, bytes});
      *cursor = d + bytes;
    }
    return segs;
  };
  auto apply_host = [&](const std::vector<CopySegment>& segs, const uint8_t* src_host) {
    for (const auto& sg : segs)
      if (sg.bytes)
        std::memcpy(dst_h.data() + (static_cast<char*>(sg.dst) - dst),
                    src_host + (static_cast<const char*>(sg.src) - src), sg.bytes);
  };
  auto check = [&](const char* what) {
    std::vector<uint8_t> got(N);
    ops->download(got.data(), dst, N);
    size_t bad = 0, first = N;
    for (size_t i = 0; i < N; ++i)
      if (got[i] != dst_h[i]) {
        ++bad;
        first = std::min(first, i);
      }
    EXPECT_EQ(bad, 0u) << what << ": first differing byte at offset " << first;
  };

  size_t cursor = 0;
  auto big = make_list(400, &cursor);
  ops->copy_batch(big.data(), int64_t(big.size()));
  apply_host(big, src_h.data());
  check("400 mixed segments");

  auto one = make_list(1, &cursor);
  ops->copy_batch(one.data(), int64_t(one.size()));
  apply_host(one, src_h.data());
  ops->copy_batch(nullptr, 0);
  check("one segment");

  // Two calls back to back: the second copies (dst region A) -> (dst region B), reading what the
  // first wrote; the host list of the first call is overwritten right after the call returns.
  std::vector<CopySegment> first, second;
  for (int i = 0; i < 50; ++i) {
    const size_t bytes = 16 + 16 * (rng() % 200);
    const size_t a = cursor + 32, b = a + bytes + 32;
    if (b + bytes > N) break;
    first.push_back({dst + a, src + (rng() % (N - bytes)) / 16 * 16, bytes});
    second.push_back({dst + b, dst + a, bytes});
    cursor = b + bytes;
  }
  ops->copy_batch(first.data(), int64_t(first.size()));
  apply_host(first, src_h.data());
  std::vector<CopySegment> reuse = first;
  std::fill(first.begin(), first.end(), CopySegment{});  // the call must not read it later
  for (const auto& sg : second)
    std::memcpy(dst_h.data() + (static_cast<char*>(sg.dst) - dst),
                dst_h.data() + (static_cast<const char*>(sg.src) - dst), sg.bytes);
  ops->copy_batch(second.data(), int64_t(second.size()));
  check("dependent calls");
  (void)reuse;
  ops->free(src);
  ops->free(dst);
}

engine::testing::PrefixRunResult serve_cuda(const std::string& dir,
                                            const engine::testing::PrefixWorkload& w,
                                            int64_t prefix_bytes) {
  auto ops = cuda_fp32();
  if (!ops) return {};
  auto model = model::DeepseekV4::load(dir, ops.get());
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return {};
  engine::ModelExecutorOptions mo;
  mo.kv_budget_bytes = int64_t(128) << 20;
  mo.max_sequences = 8;
  mo.max_chunk_tokens = 96;
  mo.prefix_cache_bytes = prefix_bytes;
  auto exec = engine::ModelExecutor::create(std::move(ops), std::move(model).value(), mo);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  if (!exec.ok()) return {};
  engine::EngineConfig ec;
  ec.chunked_prefill_size = 96;
  ec.max_running_requests = 6;
  return engine::testing::run_prefix_workload(std::move(exec).value(), w, ec);
}

TEST(CudaPrefix, GoldenFixturesCacheOnEqualsOff) {
  V4_REQUIRE_GPU();
  const auto dirs = model::testing::fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir);
    auto cfg = model::ModelConfig::load(dir);
    ASSERT_TRUE(cfg.ok());
    const int64_t S = 300;
    const auto w = engine::testing::make_prefix_workload(cfg->vocab_size, 7, S, 9, 12);
    const auto on = serve_cuda(dir, w, int64_t(16) << 20);
    const auto off = serve_cuda(dir, w, 0);
    ASSERT_TRUE(on.cache_on) << "prefix cache off on the CUDA backend";
    ASSERT_EQ(on.tokens.size(), w.prompts.size());
    ASSERT_EQ(off.tokens.size(), w.prompts.size());
    for (size_t i = 0; i < w.prompts.size(); ++i) {
      EXPECT_EQ(on.tokens[i].size(), size_t(w.max_tokens)) << "prompt " << i;
      EXPECT_EQ(on.tokens[i], off.tokens[i]) << "prompt " << i << ": cache on != cache off";
    }
    EXPECT_GT(on.stats.prefix_hit_tokens_total, 0);
    for (size_t i = 2; i < w.prompts.size(); ++i) EXPECT_EQ(on.cached[i], S) << "prompt " << i;
    EXPECT_EQ(off.stats.prefix_hit_tokens_total, 0);
    EXPECT_EQ(on.detached, 0);
    EXPECT_GT(on.copies.calls, 0);
    EXPECT_LE(on.copies.calls, on.stats.steps_total + 3 * int64_t(w.prompts.size()));
    std::printf(
        "[cuda prefix] %s: %lld hit tokens, %lld copy calls (%lld rows in %lld segments, "
        "%.1f KiB), %lld steps\n",
        dir.c_str(), (long long)on.stats.prefix_hit_tokens_total, (long long)on.copies.calls,
        (long long)on.copies.rows, (long long)on.copies.segments, double(on.copies.bytes) / 1024,
        (long long)on.stats.steps_total);
  }
}

}  // namespace
}  // namespace v4
