// The prefix cache on a device-like backend, without a GPU (docs/cache.md §6):
// - OpaqueOps (tests/engine/opaque_ops.h) runs the CPU ops but keeps every byte of backend memory
//   inaccessible to the host outside Ops calls and is not named "cpu". Served through the real
//   Engine + ModelExecutor, a shared-prefix workload keeps the prefix cache on, hits the system
//   prompt, and gives exactly the greedy tokens of the same backend with the cache off (and of
//   the plain CPU backend). Every prefix copy went through Ops::copy_batch (a host memcpy on the
//   store or a pool would fault), batched: one call per phase, rows merged into segments.
//   Decode runs on the plan-op path (DecodeOptions::device_plan), whose device page tables are
//   cached per sequence handle; requests after a hit reuse handles of finished ones.
// - The decode stager re-sends the page-table row of a handle that PrefixCache::admit reuses.
#include <gtest/gtest.h>

#include <filesystem>

#include "cache/radix_kv.h"
#include "engine/model_executor.h"
#include "model/deepseek_v4.h"
#include "model/step_plan.h"
#include "opaque_ops.h"
#include "ops/ops.h"
#include "prefix_workload.h"

namespace v4::engine {
namespace {

using testing::make_prefix_workload;
using testing::PrefixRunResult;
using testing::run_prefix_workload;

std::string fixture(const std::string& name) {
  return (std::filesystem::path(V4_SOURCE_DIR) / "tests" / "fixtures" / name).string();
}

struct Backend {
  bool opaque = false;
  bool device_plan = false;
  KvDtype kv_dtype = KvDtype::kF32;
};

// Serves `w` on a fresh executor (tiny fixture) on the given backend; counts of the opaque
// backend are returned through `counts` (read before the executor is destroyed).
PrefixRunResult serve(const std::string& dir, const testing::PrefixWorkload& w, Backend b,
                      int64_t prefix_bytes, v4::testing::OpaqueOps::Counts* counts = nullptr) {
  std::unique_ptr<ops::Ops> ops = ops::make_cpu_ops();
  v4::testing::OpaqueOps* opaque = nullptr;
  if (b.opaque) {
    auto o = std::make_unique<v4::testing::OpaqueOps>(std::move(ops));
    opaque = o.get();
    ops = std::move(o);
  }
  auto model = model::DeepseekV4::load(dir, ops.get());
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return {};
  auto dopt = (*model)->decode_options();
  dopt.device_plan = b.device_plan;
  (*model)->set_decode_options(dopt);
  ModelExecutorOptions mo;
  mo.kv_budget_bytes = int64_t(64) << 20;
  mo.max_sequences = 8;
  mo.max_chunk_tokens = 96;
  mo.prefix_cache_bytes = prefix_bytes;
  mo.kv_dtype = b.kv_dtype;
  auto exec = ModelExecutor::create(std::move(ops), std::move(model).value(), mo);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  if (!exec.ok()) return {};
  EngineConfig ec;
  ec.chunked_prefill_size = 96;  // the 300-token system prompt takes several chunks
  ec.max_running_requests = 6;
  // The engine owns the executor (and the backend); read the counters before it goes.
  auto got = run_prefix_workload(std::move(exec).value(), w, ec, [&] {
    if (opaque && counts) *counts = opaque->counts();
  });
  return got;
}

TEST(PrefixOnDevice, OpaqueBackendServesSharedPrefixWithTheCacheOn) {
  for (const char* name : {"tiny-real-rates", "tiny-kinds-fp32"}) {
    SCOPED_TRACE(name);
    const std::string dir = fixture(name);
    ASSERT_TRUE(std::filesystem::exists(dir + "/config.json")) << dir;
    auto cfg = model::ModelConfig::load(dir);
    ASSERT_TRUE(cfg.ok());
    const int64_t S = 300;
    const auto w = make_prefix_workload(cfg->vocab_size, 7, S, 9, 10);
    const int64_t budget = int64_t(16) << 20;

    const PrefixRunResult cpu_off = serve(dir, w, {false, false}, 0);
    v4::testing::OpaqueOps::Counts on_counts, off_counts;
    const PrefixRunResult on = serve(dir, w, {true, true}, budget, &on_counts);
    const PrefixRunResult off = serve(dir, w, {true, true}, 0, &off_counts);

    ASSERT_TRUE(on.cache_on) << "prefix cache switched off on a non-CPU backend";
    EXPECT_FALSE(off.cache_on);
    ASSERT_EQ(on.tokens.size(), w.prompts.size());
    for (size_t i = 0; i < w.prompts.size(); ++i) {
      EXPECT_EQ(on.tokens[i].size(), size_t(w.max_tokens)) << "prompt " << i;
      EXPECT_EQ(on.tokens[i], off.tokens[i]) << "prompt " << i << ": cache on != cache off";
      EXPECT_EQ(off.tokens[i], cpu_off.tokens[i]) << "prompt " << i << ": opaque != cpu";
    }
    // Waves 1 and 2 are cold; wave 3 resumes every request at the system prompt.
    EXPECT_EQ(on.cached[0], 0);
    EXPECT_EQ(on.cached[1], 0);
    for (size_t i = 2; i < w.prompts.size(); ++i) EXPECT_EQ(on.cached[i], S) << "prompt " << i;
    EXPECT_EQ(on.stats.prefix_hit_tokens_total, S * int64_t(w.prompts.size() - 2));
    EXPECT_EQ(on.detached, 0);
    for (int64_t c : off.cached) EXPECT_EQ(c, 0);
    EXPECT_GT(on.device_plan_steps, 5) << "decode did not take the plan-op path";

    // Every prefix copy went through the backend, batched: the prefix cache's calls are the
    // backend's calls (nothing else copies here), one per phase, rows merged into segments.
    EXPECT_EQ(on_counts.copy_batch_calls, on.copies.calls);
    EXPECT_EQ(on_counts.copy_batch_bytes, on.copies.bytes);
    EXPECT_GT(on.copies.calls, 0);
    EXPECT_GT(on.copies.rows, 4 * on.copies.segments) << "rows were not merged into segments";
    EXPECT_LE(on.copies.calls, on.stats.steps_total + 3 * int64_t(w.prompts.size()))
        << "more than one copy call per step / admission / finish";
    EXPECT_EQ(on_counts.copy_calls, 0) << "per-segment Ops::copy instead of copy_batch";
    EXPECT_EQ(off_counts.copy_batch_calls, 0);
    std::printf(
        "[prefix on device] %s: %lld hit tokens, %lld copy calls, %lld rows in %lld "
        "segments, %.1f KiB; %lld steps\n",
        name, (long long)on.stats.prefix_hit_tokens_total, (long long)on.copies.calls,
        (long long)on.copies.rows, (long long)on.copies.segments, double(on.copies.bytes) / 1024,
        (long long)on.stats.steps_total);
  }
}

// bf16 KV pools (--kv-cache-dtype bf16) through the engine on the opaque backend: the prefix
// store holds bf16 rows (half the bytes of f32 per copied row), hits are exact (cache on = cache
// off, token for token, and = the plain CPU backend with bf16 pools).
TEST(PrefixOnDevice, Bf16PoolsServeSharedPrefixLikeCacheOff) {
  const std::string dir = fixture("tiny-real-rates");
  auto cfg = model::ModelConfig::load(dir);
  ASSERT_TRUE(cfg.ok());
  const int64_t S = 300;
  const auto w = make_prefix_workload(cfg->vocab_size, 7, S, 9, 10);
  const int64_t budget = int64_t(16) << 20;
  const KvDtype bf = KvDtype::kBf16;
  const PrefixRunResult cpu_off = serve(dir, w, {false, false, bf}, 0);
  const PrefixRunResult on = serve(dir, w, {true, true, bf}, budget);
  const PrefixRunResult off = serve(dir, w, {true, true, bf}, 0);
  const PrefixRunResult on_f32 = serve(dir, w, {true, true, KvDtype::kF32}, budget);
  ASSERT_TRUE(on.cache_on);
  ASSERT_EQ(on.tokens.size(), w.prompts.size());
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    EXPECT_EQ(on.tokens[i].size(), size_t(w.max_tokens)) << "prompt " << i;
    EXPECT_EQ(on.tokens[i], off.tokens[i]) << "prompt " << i << ": cache on != cache off";
    EXPECT_EQ(off.tokens[i], cpu_off.tokens[i]) << "prompt " << i << ": opaque != cpu";
  }
  for (size_t i = 2; i < w.prompts.size(); ++i) EXPECT_EQ(on.cached[i], S) << "prompt " << i;
  // Same hits as f32 pools; the copied KV rows are half as large (the f32 compressor snapshots
  // keep their size).
  EXPECT_EQ(on.cached, on_f32.cached);
  EXPECT_LT(on.copies.bytes, on_f32.copies.bytes);
}

// The decode fast path keeps device page tables per KvCache sequence handle and re-sends a row
// when KvCache::addressing_version changes. PrefixCache::admit hands out handles of finished
// sequences with other pages (and copies the hit's rows into them): the stager must see a new
// version and stage the new row.
TEST(PrefixOnDevice, AdmissionOnAReusedHandleRestagesItsPageTable) {
  auto ops = ops::make_cpu_ops();
  auto m = model::DeepseekV4::load(fixture("tiny-real-rates"), ops.get());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  model::DeepseekV4& model = **m;
  auto kvr = model.make_cache(int64_t(64) << 20, 4);
  ASSERT_TRUE(kvr.ok());
  cache::KvCache& kv = **kvr;
  auto cfg = cache::PrefixCache::config_for_budget(kv, int64_t(16) << 20);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto pcr = cache::PrefixCache::create(kv, *cfg);
  ASSERT_TRUE(pcr.ok());
  cache::PrefixCache& pc = **pcr;
  const int64_t P = model::decode_table_pages(kv, model.config().max_position_embeddings);
  model::DecodeStager stager(kv.options().max_seqs, P);

  std::mt19937 rng(3);
  std::vector<int32_t> a(700);
  for (auto& t : a) t = int32_t(2 + rng() % uint32_t(model.config().vocab_size - 2));
  auto run_prompt = [&](const std::vector<int32_t>& prompt, cache::PrefixSeq* h) {
    auto r = pc.admit(kv, prompt);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    *h = *r;
    model::ForwardBatch b;
    b.slices.push_back({h->kv_seq, h->cached_tokens,
                        std::vector<int32_t>(prompt.begin() + h->cached_tokens, prompt.end()),
                        false});
    auto out = model.forward(b, kv);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_TRUE(pc.on_step(kv, h->kv_seq, b.slices[0].tokens).ok());
  };
  auto stage_decode = [&](int32_t seq, int64_t pos) {
    model::ForwardBatch d;
    d.slices.push_back({seq, pos, {5}, false});
    stager.stage(d, kv, 1);
    return stager.last_deltas();
  };
  cache::PrefixSeq ha;
  run_prompt(a, &ha);
  EXPECT_EQ(stage_decode(ha.kv_seq, int64_t(a.size())), 1);
  EXPECT_EQ(stage_decode(ha.kv_seq, int64_t(a.size())), 0);  // unchanged: not re-sent
  const std::vector<int32_t> pages_a = kv.pages(ha.kv_seq);
  ASSERT_TRUE(pc.finish(kv, ha.kv_seq, true).ok());

  std::vector<int32_t> b = a;
  for (int i = 0; i < 40; ++i) b.push_back(int32_t(2 + rng() % 100));
  cache::PrefixSeq hb;
  run_prompt(b, &hb);
  ASSERT_EQ(hb.kv_seq, ha.kv_seq) << "the test needs the handle to be reused";
  EXPECT_EQ(hb.cached_tokens, int64_t(a.size()));  // resumed at A's end
  ASSERT_NE(kv.pages(hb.kv_seq), pages_a) << "the test needs other pages under the same handle";
  EXPECT_EQ(stage_decode(hb.kv_seq, int64_t(b.size())), 1);
  // The staged row is the new page table.
  const int32_t* row = stager.host() + model::DecodeStager::kDeltaRows;
  const auto& pages_b = kv.pages(hb.kv_seq);
  EXPECT_EQ(std::vector<int32_t>(row, row + pages_b.size()), pages_b);
  EXPECT_EQ(stager.host()[model::DecodeStager::kDeltaSeq], hb.kv_seq);
  ASSERT_TRUE(pc.finish(kv, hb.kv_seq, true).ok());
}

// A store budget too small for the model's boundary state: an error, or (serve's default budget,
// prefix_cache_optional) serving without the cache.
TEST(PrefixOnDevice, TooSmallBudgetFailsOrTurnsTheCacheOff) {
  for (bool optional : {false, true}) {
    auto ops = ops::make_cpu_ops();
    auto model = model::DeepseekV4::load(fixture("tiny-real-rates"), ops.get());
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    ModelExecutorOptions mo;
    mo.kv_budget_bytes = int64_t(32) << 20;
    mo.max_sequences = 4;
    mo.prefix_cache_bytes = int64_t(1) << 16;
    mo.prefix_cache_optional = optional;
    auto exec = ModelExecutor::create(std::move(ops), std::move(model).value(), mo);
    if (optional) {
      ASSERT_TRUE(exec.ok()) << exec.status().to_string();
      EXPECT_EQ((*exec)->prefix_cache(), nullptr);
    } else {
      ASSERT_FALSE(exec.ok());
      EXPECT_NE(exec.status().message().find("too small"), std::string::npos)
          << exec.status().to_string();
    }
  }
}

}  // namespace
}  // namespace v4::engine
