// A shared-prefix workload for prefix-cache tests on any backend (tests/engine, tests/cuda): a
// common "system prompt" plus short distinct questions, greedy, served by the real Engine over a
// ModelExecutor in waves, so that later waves hit the cached system prompt:
//   wave 1: one request (cold; inserts S + q1 with a boundary at its end only);
//   wave 2: one request (matches S up to the branch point, saves a boundary there: its snapshot
//           point; not a hit yet);
//   wave 3: the rest, concurrently (each resumes at |S| and decodes after the hit).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <random>
#include <vector>

#include "cache/copy_list.h"
#include "engine/engine.h"
#include "engine/model_executor.h"

namespace v4::engine::testing {

struct PrefixWorkload {
  std::vector<int32_t> system;                // S
  std::vector<std::vector<int32_t>> prompts;  // S + question i
  int64_t max_tokens = 0;
};

/// `n` prompts = one random system prompt of `system_len` tokens + a question of
/// `question_len` random tokens whose first token differs between questions (so every request
/// branches exactly at |S|). Token ids in [2, vocab).
inline PrefixWorkload make_prefix_workload(int64_t vocab, int n, int64_t system_len,
                                           int64_t question_len, int64_t max_tokens,
                                           uint32_t seed = 11) {
  std::mt19937 rng(seed);
  auto tok = [&] { return int32_t(2 + rng() % uint32_t(vocab - 2)); };
  PrefixWorkload w;
  w.max_tokens = max_tokens;
  w.system.resize(size_t(system_len));
  for (auto& t : w.system) t = tok();
  std::vector<int32_t> firsts;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = w.system;
    int32_t first = tok();
    while (std::find(firsts.begin(), firsts.end(), first) != firsts.end()) first = tok();
    firsts.push_back(first);
    p.push_back(first);
    for (int64_t j = 1; j < question_len; ++j) p.push_back(tok());
    w.prompts.push_back(std::move(p));
  }
  return w;
}

struct PrefixRunResult {
  std::vector<std::vector<int32_t>> tokens;  // per prompt
  std::vector<int64_t> cached;               // usage.cached_tokens per prompt
  EngineStats stats;
  bool cache_on = false;
  cache::CopyCounters copies;  // the prefix cache's copies (zero when off)
  int64_t detached = 0;
  int64_t device_plan_steps = 0;  // decode steps on the plan-op path (model decode_stats)
  int64_t graph_replays = 0;      // decode steps replayed as graphs
};

/// Serves `w` on `exec` (owned from here) in the three waves above; greedy, ignore_eos.
/// `before_release` (optional) runs when all requests are done, before the engine (and with it
/// the executor and its backend) is destroyed.
inline PrefixRunResult run_prefix_workload(std::unique_ptr<ModelExecutor> exec,
                                           const PrefixWorkload& w, EngineConfig ec,
                                           const std::function<void()>& before_release = {}) {
  PrefixRunResult out;
  ModelExecutor* ex = exec.get();
  ec.stats_interval_s = 0;
  auto engine = Engine::create(std::move(exec), ec);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  if (!engine.ok()) return out;
  Engine& e = **engine;
  const size_t n = w.prompts.size();
  out.tokens.assign(n, {});
  out.cached.assign(n, -1);
  std::mutex mu;
  std::condition_variable cv;
  size_t finished = 0;
  auto submit = [&](size_t i) {
    Request r;
    r.prompt_tokens = w.prompts[i];
    r.sampling.temperature = 0.0f;
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = w.max_tokens;
    auto id = e.submit(r, [&, i](const StepOutput& o) {
      std::lock_guard<std::mutex> lk(mu);
      out.tokens[i].insert(out.tokens[i].end(), o.new_tokens.begin(), o.new_tokens.end());
      out.cached[i] = o.usage.cached_tokens;
      if (o.finished) {
        EXPECT_EQ(o.finish_reason, FinishReason::kLength) << "prompt " << i;
        ++finished;
        cv.notify_all();
      }
    });
    EXPECT_TRUE(id.ok()) << id.status().to_string();
  };
  auto wait_for = [&](size_t k) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return finished >= k; });
  };
  size_t next = 0;
  for (size_t wave : {size_t(1), size_t(1)}) {
    for (size_t j = 0; j < wave && next < n; ++j) submit(next++);
    wait_for(next);
  }
  while (next < n) submit(next++);
  wait_for(n);
  e.wait_idle();
  out.stats = e.stats();
  out.cache_on = ex->prefix_cache() != nullptr;
  if (out.cache_on) {
    out.copies = ex->prefix_cache()->copy_counters();
    out.detached = ex->prefix_cache()->detached_total();
  }
  out.device_plan_steps = ex->model().decode_stats().device_plan_steps;
  out.graph_replays = ex->model().decode_stats().graph_replays;
  if (before_release) before_release();
  return out;
}

}  // namespace v4::engine::testing
