// The real scheduler over the real CPU model (tests/fixtures/*): several requests of different
// lengths, batched with chunked prefill, must each produce the greedy tokens of the model run
// alone (one-shot prefill, then one decode step at a time, straight through DeepseekV4).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <random>

#include "engine/engine.h"
#include "engine/model_executor.h"
#include "model/deepseek_v4.h"
#include "ops/ops.h"

namespace v4::engine {
namespace {

std::vector<std::string> fixtures() {
  std::vector<std::string> out;
  const auto root = std::filesystem::path(V4_SOURCE_DIR) / "tests" / "fixtures";
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(root, ec))
    if (e.is_directory() && std::filesystem::exists(e.path() / "config.json") &&
        std::filesystem::exists(e.path() / "golden.safetensors"))
      out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Greedy continuation of `prompt` with the model alone: its own cache, one sequence.
std::vector<int32_t> alone(model::DeepseekV4& m, const std::vector<int32_t>& prompt, int64_t n) {
  auto kv = m.make_cache(int64_t(256) << 20, 1);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  if (!kv.ok()) return {};
  auto seq = (*kv)->create_sequence();
  EXPECT_TRUE(seq.ok());
  std::vector<int32_t> out;
  model::ForwardBatch b;
  b.slices.push_back({*seq, 0, prompt, false});
  for (int64_t i = 0; i < n; ++i) {
    auto r = m.forward(b, **kv);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (!r.ok()) return out;
    const float* row = r->logits.data();
    int32_t best = int32_t(std::max_element(row, row + r->vocab) - row);
    out.push_back(best);
    b.slices[0].start_pos += int64_t(b.slices[0].tokens.size());
    b.slices[0].tokens = {best};
  }
  return out;
}

TEST(ModelEngine, FixturesExist) {
  ASSERT_FALSE(fixtures().empty());
}

TEST(ModelEngine, BatchedRequestsEqualAlone) {
  for (const auto& dir : fixtures()) {
    SCOPED_TRACE(dir);
    auto ref_ops = ops::make_cpu_ops();
    auto ref = model::DeepseekV4::load(dir, ref_ops.get());
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    const int64_t V = (*ref)->config().vocab_size;

    std::mt19937 rng(17);
    const std::vector<int64_t> lengths = {3, 29, 70, 133};
    const std::vector<int64_t> gens = {24, 9, 17, 12};
    std::vector<std::vector<int32_t>> prompts, want;
    for (size_t i = 0; i < lengths.size(); ++i) {
      std::vector<int32_t> p(static_cast<size_t>(lengths[i]));
      for (auto& t : p) t = int32_t(2 + rng() % uint32_t(V - 2));
      prompts.push_back(p);
      want.push_back(alone(**ref, p, gens[i]));
    }

    ModelExecutorOptions mo;
    mo.kv_budget_bytes = int64_t(256) << 20;
    mo.max_sequences = 8;
    mo.max_chunk_tokens = 48;
    auto exec = ModelExecutor::load_cpu(dir, mo);
    ASSERT_TRUE(exec.ok()) << exec.status().to_string();
    EngineConfig ec;
    ec.chunked_prefill_size = 48;  // forces chunked prefill mixed with decode rows
    ec.stats_interval_s = 0;
    auto engine = Engine::create(std::move(exec).value(), ec);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    Engine& e = **engine;

    struct Got {
      std::vector<int32_t> tokens;
      FinishReason reason = FinishReason::kNone;
    };
    std::vector<Got> got(prompts.size());
    std::mutex mu;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Request r;
      r.prompt_tokens = prompts[i];
      r.sampling.temperature = 0.0f;
      r.sampling.max_tokens = gens[i];
      r.sampling.ignore_eos = true;
      auto id = e.submit(r, [&, i](const StepOutput& o) {
        std::lock_guard<std::mutex> lk(mu);
        got[i].tokens.insert(got[i].tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
        if (o.finished) got[i].reason = o.finish_reason;
      });
      ASSERT_TRUE(id.ok()) << id.status().to_string();
    }
    e.wait_idle();
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got[i].reason, FinishReason::kLength) << "request " << i;
      EXPECT_EQ(got[i].tokens, want[i]) << "request " << i << " (prompt " << lengths[i] << ")";
    }
    const EngineStats st = e.stats();
    EXPECT_EQ(st.generation_tokens_total, 24 + 9 + 17 + 12);
  }
}

// The embedded default model (models/default): 8 requests alone (one at a time, one-shot
// prefill) and then all at once (continuous batching, 64-token chunks) give the same greedy
// tokens. Prints decode throughput of both runs.
TEST(ModelEngine, EmbeddedModelBatchedEqualsSequential) {
  const std::string dir = std::string(V4_SOURCE_DIR) + "/models/default";
  ASSERT_TRUE(std::filesystem::exists(dir + "/model.safetensors")) << dir;
  auto make = [&](int64_t chunk) {
    ModelExecutorOptions mo;
    mo.kv_budget_bytes = int64_t(256) << 20;
    mo.max_sequences = 16;
    mo.max_chunk_tokens = chunk;
    auto exec = ModelExecutor::load_cpu(dir, mo);
    EXPECT_TRUE(exec.ok()) << exec.status().to_string();
    EngineConfig ec;
    ec.chunked_prefill_size = chunk;
    ec.stats_interval_s = 0;
    auto e = Engine::create(std::move(exec).value(), ec);
    EXPECT_TRUE(e.ok());
    return std::move(e).value();
  };
  std::mt19937 rng(99);
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) {
    Request r;
    r.prompt_tokens.resize(5 + rng() % 200);
    for (auto& t : r.prompt_tokens) t = int32_t(10 + rng() % 4000);
    r.sampling.temperature = 0.0f;
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = 32;
    reqs.push_back(r);
  }
  std::vector<std::vector<int32_t>> alone_out;
  double alone_s = 0;
  {
    auto e = make(4096);
    auto t0 = std::chrono::steady_clock::now();
    for (const auto& r : reqs) {
      auto got = e->generate(r);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      alone_out.push_back(*got);
    }
    alone_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  auto e = make(64);
  std::vector<std::vector<int32_t>> got(reqs.size());
  std::mutex mu;
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto id = e->submit(reqs[i], [&, i](const StepOutput& o) {
      std::lock_guard<std::mutex> lk(mu);
      got[i].insert(got[i].end(), o.new_tokens.begin(), o.new_tokens.end());
    });
    ASSERT_TRUE(id.ok());
  }
  e->wait_idle();
  const double batched_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i], alone_out[i]) << "request " << i;
  const auto st = e->stats();
  std::printf(
      "[engine] embedded model, 8 requests x 32 tokens: one at a time %.2f s (%.1f tok/s), "
      "batched %.2f s (%.1f tok/s), %lld steps\n",
      alone_s, 256 / alone_s, batched_s, 256 / batched_s, (long long)st.steps_total);
  EXPECT_LT(st.steps_total, 8 * 32);  // batching happened
}

// Engine over the embedded model with a 256 MiB KV budget, 256-token chunks and the given prefix
// store (0 = off) and snapshot interval.
std::unique_ptr<Engine> make_prefix_engine(const std::string& dir, int64_t prefix_bytes,
                                           int64_t snapshot_interval) {
  ModelExecutorOptions mo;
  mo.kv_budget_bytes = int64_t(256) << 20;
  mo.max_sequences = 8;
  mo.max_chunk_tokens = 256;
  mo.prefix_cache_bytes = prefix_bytes;
  mo.prefix_snapshot_interval = snapshot_interval;
  auto exec = ModelExecutor::load_cpu(dir, mo);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  EngineConfig ec;
  ec.chunked_prefill_size = 256;
  ec.stats_interval_s = 0;
  auto e = Engine::create(std::move(exec).value(), ec);
  EXPECT_TRUE(e.ok());
  return std::move(e).value();
}

// Greedy tokens of one request (n new tokens, ignore_eos) and its usage.cached_tokens.
struct GreedyRun {
  std::vector<int32_t> tokens;
  int64_t cached = -1;
};
GreedyRun run_greedy(Engine& e, const std::vector<int32_t>& prompt, int64_t n) {
  GreedyRun out;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Request r;
  r.prompt_tokens = prompt;
  r.sampling.temperature = 0.0f;
  r.sampling.ignore_eos = true;
  r.sampling.max_tokens = n;
  auto id = e.submit(r, [&](const StepOutput& o) {
    std::lock_guard<std::mutex> lk(mu);
    out.tokens.insert(out.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
    out.cached = o.usage.cached_tokens;
    if (o.finished) {
      done = true;
      cv.notify_all();
    }
  });
  EXPECT_TRUE(id.ok());
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return done; });
  return out;
}

// Prefix caching through the real executor: a second turn that extends the first one resumes
// from the cache (usage.cached_tokens > 0) and still gives the tokens of a cold run.
TEST(ModelEngine, PrefixCacheMultiTurnEqualsCold) {
  const std::string dir = std::string(V4_SOURCE_DIR) + "/models/default";
  ASSERT_TRUE(std::filesystem::exists(dir + "/model.safetensors")) << dir;
  auto make = [&](int64_t prefix_bytes) { return make_prefix_engine(dir, prefix_bytes, 0); };
  auto run = run_greedy;
  std::mt19937 rng(5);
  std::vector<int32_t> turn1(300);
  for (auto& t : turn1) t = int32_t(10 + rng() % 4000);
  auto warm = make(int64_t(256) << 20);
  auto cold = make(0);
  GreedyRun a = run(*warm, turn1, 20);
  EXPECT_EQ(a.cached, 0);
  EXPECT_EQ(a.tokens, run(*cold, turn1, 20).tokens);
  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), a.tokens.begin(), a.tokens.end());
  for (int i = 0; i < 150; ++i) turn2.push_back(int32_t(10 + rng() % 4000));
  GreedyRun b = run(*warm, turn2, 20);
  GreedyRun b_cold = run(*cold, turn2, 20);
  EXPECT_GT(b.cached, 0);
  EXPECT_LT(b.cached, int64_t(turn2.size()));
  EXPECT_EQ(b_cold.cached, 0);
  EXPECT_EQ(b.tokens, b_cold.tokens);
  warm->wait_idle();
  const EngineStats st = warm->stats();
  EXPECT_EQ(st.prefix_hit_tokens_total, b.cached);
  EXPECT_EQ(st.prefix_query_tokens_total, int64_t(turn1.size() + turn2.size()));
  std::printf("[engine] prefix cache: turn 2 of %zu prompt tokens resumed at %lld cached tokens\n",
              turn2.size(), (long long)b.cached);
}

// Two requests that share only a system prompt: without periodic boundaries the second one
// recomputes it (the first request left a boundary only at its prompt end); with
// prefix_snapshot_interval = 128 it resumes at the last multiple of 128 inside the shared part,
// with the tokens of a cold run.
TEST(ModelEngine, PrefixSnapshotIntervalLetsTheSecondRequestResume) {
  const std::string dir = std::string(V4_SOURCE_DIR) + "/models/default";
  ASSERT_TRUE(std::filesystem::exists(dir + "/model.safetensors")) << dir;
  auto make = [&](int64_t prefix_bytes, int64_t interval) {
    return make_prefix_engine(dir, prefix_bytes, interval);
  };
  auto run = [](Engine& e, const std::vector<int32_t>& prompt) {
    const GreedyRun g = run_greedy(e, prompt, 8);
    return std::make_pair(g.tokens, g.cached);
  };
  std::mt19937 rng(9);
  std::vector<int32_t> system(300), a, b;
  for (auto& t : system) t = int32_t(10 + rng() % 4000);
  a = b = system;
  for (int i = 0; i < 50; ++i) a.push_back(int32_t(10 + rng() % 4000));
  for (int i = 0; i < 40; ++i) b.push_back(int32_t(10 + rng() % 4000));
  auto cold = make(0, 0);
  const auto b_cold = run(*cold, b);
  for (int64_t interval : {int64_t(0), int64_t(128)}) {
    SCOPED_TRACE("interval " + std::to_string(interval));
    auto warm = make(int64_t(256) << 20, interval);
    EXPECT_EQ(run(*warm, a).second, 0);
    const auto got = run(*warm, b);
    EXPECT_EQ(got.second, interval == 0 ? 0 : 256) << "cached tokens of the second request";
    EXPECT_EQ(got.first, b_cold.first) << "tokens vs a cold run";
    // The same prompt again resumes one token before its end (the boundary admit keeps at
    // n − 1: the last token must be computed for its logits).
    const auto again = run(*warm, b);
    EXPECT_EQ(again.second, int64_t(b.size()) - 1) << "cached tokens of an exact repeat";
    EXPECT_EQ(again.first, b_cold.first) << "tokens of the repeat vs a cold run";
  }
}

// A snapshot interval so small that one prompt asks for more boundaries than the prefix store
// keeps (here 2 tokens: ~170 points against 80 snapshot slots) must never cache less than
// interval 0: the exact repeat still resumes at n − 1, and the second request still resumes
// inside the shared part (the periodic points of a long prompt are thinned to multiples of a
// power-of-two multiple of the interval, ShadowRadixConfig::max_interval_points).
TEST(ModelEngine, TinySnapshotIntervalNeverCachesLessThanNone) {
  const std::string dir = std::string(V4_SOURCE_DIR) + "/models/default";
  ASSERT_TRUE(std::filesystem::exists(dir + "/model.safetensors")) << dir;
  std::mt19937 rng(21);
  std::vector<int32_t> system(300), a, b;
  for (auto& t : system) t = int32_t(10 + rng() % 4000);
  a = b = system;
  for (int i = 0; i < 50; ++i) a.push_back(int32_t(10 + rng() % 4000));
  for (int i = 0; i < 40; ++i) b.push_back(int32_t(10 + rng() % 4000));
  auto cold = make_prefix_engine(dir, 0, 0);
  const GreedyRun b_cold = run_greedy(*cold, b, 4);
  for (int64_t interval : {int64_t(2), int64_t(1)}) {
    SCOPED_TRACE("interval " + std::to_string(interval));
    auto warm = make_prefix_engine(dir, int64_t(256) << 20, interval);
    EXPECT_EQ(run_greedy(*warm, a, 4).cached, 0);
    const GreedyRun second = run_greedy(*warm, b, 4);
    EXPECT_GT(second.cached, 0) << "the second request resumes inside the shared 300 tokens";
    EXPECT_LE(second.cached, 300);
    EXPECT_EQ(second.tokens, b_cold.tokens);
    const GreedyRun again = run_greedy(*warm, b, 4);
    EXPECT_EQ(again.cached, int64_t(b.size()) - 1) << "an exact repeat resumes at n - 1";
    EXPECT_EQ(again.tokens, b_cold.tokens);
  }
}

// A fixed KV budget (no --mem-fraction: serve's default --kv-cache-bytes, generate) sizes the SWA
// pool for the live windows only, max_sequences × (ceil((chunk + W − 1) / P) + 1) pages, and gives
// the rest to virtual pages — as --mem-fraction does. (It used to give both pools equal page
// counts: ~7/8 of a V4 budget on SWA pages.) A budget too small for that split keeps equal counts.
TEST(ModelEngine, FixedBudgetSizesSwaPoolForLiveWindows) {
  const auto dirs = fixtures();
  ASSERT_FALSE(dirs.empty());
  auto pool_pages = [](const ModelExecutor& e, const std::string& name) {
    for (const auto& p : e.pool_usage())
      if (p.name == name) return p.capacity_pages;
    return int64_t(-1);
  };
  ModelExecutorOptions mo;
  mo.kv_budget_bytes = int64_t(64) << 20;
  mo.max_sequences = 4;
  mo.max_chunk_tokens = 256;
  auto exec = ModelExecutor::load_cpu(dirs[0], mo);
  ASSERT_TRUE(exec.ok()) << exec.status().to_string();
  const auto& kv = (*exec)->cache();
  const int64_t P = kv.options().page_size, W = kv.spec().sliding_window;
  const int64_t live = mo.max_sequences * ((mo.max_chunk_tokens + W - 1 + P - 1) / P + 1);
  EXPECT_EQ(kv.options().n_swa_pages, live);
  EXPECT_EQ(pool_pages(**exec, "swa_pages"), live);
  const int64_t vpage = cache::KvCache::virtual_page_bytes(kv.spec(), int(P));
  const int64_t swa_page = cache::KvCache::swa_page_bytes(kv.spec(), int(P));
  const int64_t state = cache::KvCache::state_slot_bytes(kv.spec()) * mo.max_sequences;
  EXPECT_EQ(kv.options().n_pages, (mo.kv_budget_bytes - state - live * swa_page) / vpage);
  EXPECT_GT(kv.options().n_pages, live);
  // The executor's per-sequence SWA bound (pages_for) fits max_sequences times into the pool.
  const auto need = (*exec)->pages_for(int64_t(1) << 20);
  const auto pools = (*exec)->pools();
  for (size_t i = 0; i < pools.size(); ++i)
    if (pools[i].name == "swa_pages") {
      EXPECT_EQ(need[i] * mo.max_sequences, live) << "pages_for(1M) swa " << need[i];
    }
}

}  // namespace
}  // namespace v4::engine
