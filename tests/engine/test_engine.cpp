// Engine tests (threaded: submit/cancel from other threads) over the fake executor.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include "engine/engine.h"
#include "fake_executor.h"

namespace v4::engine {
namespace {

using testing::fake_greedy;
using testing::FakeConfig;
using testing::FakeExecutor;

SamplingParams greedy(int64_t max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

std::unique_ptr<Engine> make_engine(FakeConfig fc, EngineConfig ec, FakeExecutor** raw = nullptr) {
  auto exec = std::make_unique<FakeExecutor>(fc);
  if (raw) *raw = exec.get();
  auto e = Engine::create(std::move(exec), ec);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(e).value();
}

TEST(Engine, GenerateMatchesReference) {
  FakeConfig fc;
  auto e = make_engine(fc, {});
  Request r;
  r.prompt_tokens = {3, 1, 4, 1, 5, 9, 2, 6};
  r.sampling = greedy(17);
  FinishReason why = FinishReason::kNone;
  auto toks = e->generate(r, &why);
  ASSERT_TRUE(toks.ok()) << toks.status().to_string();
  EXPECT_EQ(*toks, fake_greedy(r.prompt_tokens, fc.vocab, 17));
  EXPECT_EQ(why, FinishReason::kLength);
  e->wait_idle();  // stats are published after the step's outputs
  EXPECT_EQ(e->stats().generation_tokens_total, 17);
}

// A temperature in (0, 1e-5) is greedy (vLLM's rule). Before, T = 1e-38 scaled the logits by
// 1e38: every logit above ~3.4 overflowed to +inf and the row's "argmax x" took the lowest such
// id — near-random tokens (the embedded model answered ")$$$" where greedy says " of modules").
TEST(Engine, TinyTemperatureIsGreedy) {
  FakeConfig fc;
  auto e = make_engine(fc, {});
  for (float t : {1e-38f, 1e-30f, 1e-6f}) {
    Request r;
    r.prompt_tokens = {3, 1, 4, 1, 5, 9, 2, 6};
    r.sampling = greedy(12);
    r.sampling.temperature = t;
    r.sampling.seed = 7;
    FinishReason why = FinishReason::kNone;
    auto toks = e->generate(r, &why);
    ASSERT_TRUE(toks.ok()) << toks.status().to_string();
    EXPECT_EQ(*toks, fake_greedy(r.prompt_tokens, fc.vocab, 12)) << "temperature " << t;
  }
}

TEST(Engine, SubmitRefusesImpossibleAtOnce) {
  FakeConfig fc;
  fc.max_context = 64;
  auto e = make_engine(fc, {});
  Request r;
  r.prompt_tokens.assign(60, 1);
  r.sampling = greedy(10);
  bool called = false;
  auto id = e->submit(r, [&](const StepOutput&) { called = true; });
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("maximum context length is 64"), std::string::npos);
  r.sampling.temperature = -2.0f;
  r.sampling.max_tokens = 1;
  EXPECT_FALSE(e->submit(r, nullptr).ok());
  e->wait_idle();
  EXPECT_FALSE(called);
  EXPECT_EQ(e->stats().requests_rejected_total, 2);
}

TEST(Engine, MaxTokensLimit) {
  FakeConfig fc;
  fc.max_context = 1000;
  fc.page_tokens = 16;
  fc.kv_pages = 20;  // 320 tokens
  auto e = make_engine(fc, {});
  EXPECT_EQ(e->max_tokens_limit(100), 220);
  EXPECT_EQ(e->max_tokens_limit(320), 0);
  EXPECT_EQ(e->max_tokens_limit(319), 1);
  Request r;
  r.prompt_tokens.assign(100, 3);
  r.sampling = greedy(220);
  EXPECT_TRUE(e->submit(r, nullptr).ok());
  r.sampling.max_tokens = 221;
  EXPECT_FALSE(e->submit(r, nullptr).ok());
  fc.kv_pages = 1000;
  auto e2 = make_engine(fc, {});
  EXPECT_EQ(e2->max_tokens_limit(100), 900);  // the context bounds it now
}

// Many concurrent clients (submitting from their own threads); half cancel midway. The rest get
// exactly their alone tokens; pool usage returns to idle.
TEST(Engine, ConcurrentClientsAndCancellation) {
  FakeConfig fc;
  fc.page_tokens = 8;
  fc.kv_pages = 4000;
  fc.step_delay_us = 200;  // cancelled clients run 1000 tokens: ~0.2 s to get the cancel in
  EngineConfig ec;
  ec.chunked_prefill_size = 128;
  ec.max_running_requests = 16;
  ec.stats_interval_s = 0;
  FakeExecutor* raw = nullptr;
  auto e = make_engine(fc, ec, &raw);
  const int n_clients = 32;
  struct Client {
    std::vector<int32_t> prompt, got;
    int64_t max_tokens = 0;
    bool finished = false;
    FinishReason reason = FinishReason::kNone;
    int n_final = 0;
    std::mutex mu;
    std::condition_variable cv;
  };
  std::vector<Client> clients(n_clients);
  std::mt19937 rng(42);
  for (auto& c : clients) {
    c.prompt.resize(1 + rng() % 90);
    for (auto& t : c.prompt) t = int32_t(rng() % uint32_t(fc.vocab));
    c.max_tokens = 20 + rng() % 40;
  }
  for (int i = 1; i < n_clients; i += 2) clients[size_t(i)].max_tokens = 1000;
  std::vector<std::thread> threads;
  for (int i = 0; i < n_clients; ++i) {
    threads.emplace_back([&, i] {
      Client& c = clients[size_t(i)];
      const bool cancel_me = i % 2 == 1;
      Request r;
      r.prompt_tokens = c.prompt;
      r.sampling = greedy(c.max_tokens);
      std::atomic<RequestId> my_id{0};
      auto id = e->submit(r, [&c](const StepOutput& o) {
        std::lock_guard<std::mutex> lk(c.mu);
        c.got.insert(c.got.end(), o.new_tokens.begin(), o.new_tokens.end());
        if (o.finished) {
          c.finished = true;
          c.reason = o.finish_reason;
          ++c.n_final;
        }
        c.cv.notify_all();
      });
      ASSERT_TRUE(id.ok());
      std::unique_lock<std::mutex> lk(c.mu);
      if (cancel_me) {
        c.cv.wait(lk, [&] { return c.got.size() >= 5 || c.finished; });
        lk.unlock();
        e->cancel(*id);
        lk.lock();
      }
      c.cv.wait(lk, [&] { return c.finished; });
    });
  }
  for (auto& t : threads) t.join();
  e->wait_idle();
  for (int i = 0; i < n_clients; ++i) {
    Client& c = clients[size_t(i)];
    EXPECT_EQ(c.n_final, 1);
    auto want = fake_greedy(c.prompt, fc.vocab, c.max_tokens);
    if (i % 2 == 0) {
      EXPECT_EQ(c.got, want) << "client " << i;
      EXPECT_EQ(c.reason, FinishReason::kLength);
    } else {
      EXPECT_EQ(c.reason, FinishReason::kAbort) << "client " << i;
      EXPECT_GE(c.got.size(), 5u);
      ASSERT_LT(c.got.size(), want.size());
      EXPECT_EQ(c.got, std::vector<int32_t>(want.begin(), want.begin() + c.got.size()));
    }
  }
  // The stats snapshot is refreshed after each scheduler iteration; wait for the last one.
  EngineStats st;
  for (int i = 0; i < 200; ++i) {
    st = e->stats();
    if (st.running == 0 && st.waiting == 0 && st.pools.size() == 2 && st.pools[0].used_pages == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  ASSERT_EQ(st.pools.size(), 2u);
  EXPECT_EQ(st.pools[0].name, "kv");
  EXPECT_EQ(st.pools[0].used_pages, 0);
  EXPECT_EQ(st.pools[1].used_pages, 0);
  EXPECT_EQ(st.requests_finished_total + st.requests_aborted_total, n_clients);
  EXPECT_GT(st.requests_aborted_total, 0);
  EXPECT_GT(st.steps_total, 0);
}

// EngineConfig::output_thread (the default): a slow callback does not hold up the next steps —
// the engine keeps stepping while the callback of an earlier step runs; the outputs still
// arrive in order, once each. With the option off the callback runs between steps, so no step
// runs during it.
void slow_first_callback(bool output_thread, int64_t* steps_during, std::vector<int32_t>* got,
                         int* finals) {
  FakeConfig fc;
  fc.step_delay_us = 1000;  // 64 steps take > 64 ms: most of them fall inside the 100 ms callback
  EngineConfig ec;
  ec.output_thread = output_thread;
  auto e = make_engine(fc, ec);
  Request r;
  r.prompt_tokens = {2, 7, 1, 8};
  r.sampling = greedy(64);
  Engine* eng = e.get();
  std::mutex mu;
  auto res = e->submit(r, [&](const StepOutput& o) {
    std::lock_guard<std::mutex> lk(mu);
    if (got->empty()) {
      const int64_t s0 = eng->stats().steps_total;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      *steps_during = eng->stats().steps_total - s0;
    }
    got->insert(got->end(), o.new_tokens.begin(), o.new_tokens.end());
    *finals += o.finished;
  });
  ASSERT_TRUE(res.ok());
  e->wait_idle();
  std::lock_guard<std::mutex> lk(mu);
  EXPECT_EQ(*got, fake_greedy(r.prompt_tokens, fc.vocab, 64));
  EXPECT_EQ(*finals, 1);
}

TEST(Engine, OutputThreadKeepsSteppingDuringASlowCallback) {
  int64_t during = -1;
  std::vector<int32_t> got;
  int finals = 0;
  slow_first_callback(true, &during, &got, &finals);
  EXPECT_GT(during, 8) << "the scheduler waited for the callback";
  during = -1;
  got.clear();
  finals = 0;
  slow_first_callback(false, &during, &got, &finals);
  EXPECT_EQ(during, 0) << "callbacks on the scheduler thread: no step runs during one";
}

// A callback that throws loses only its own request: the exception is caught (logged), that
// request is aborted and its callback is not called again, and every other request still gets
// all its tokens and exactly one final output — with the output thread and without. Before the
// fix the exception ended the process (std::terminate on the delivering thread).
TEST(Engine, ThrowingCallbackLosesOnlyItsRequest) {
  for (bool output_thread : {true, false}) {
    SCOPED_TRACE(output_thread ? "output thread" : "scheduler thread");
    FakeConfig fc;
    fc.step_delay_us = 200;
    EngineConfig ec;
    ec.output_thread = output_thread;
    auto e = make_engine(fc, ec);
    std::mutex mu;
    int bad_calls = 0, good_finals = 0;
    std::vector<int32_t> good_tokens;
    Request bad;
    bad.prompt_tokens = {5, 6, 7};
    bad.sampling = greedy(40);
    Request good;
    good.prompt_tokens = {2, 7, 1, 8};
    good.sampling = greedy(40);
    auto rb = e->submit(bad, [&](const StepOutput&) {
      {
        std::lock_guard<std::mutex> lk(mu);
        ++bad_calls;
      }
      throw std::runtime_error("client went away");
    });
    ASSERT_TRUE(rb.ok());
    auto rg = e->submit(good, [&](const StepOutput& o) {
      std::lock_guard<std::mutex> lk(mu);
      good_tokens.insert(good_tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      good_finals += o.finished;
    });
    ASSERT_TRUE(rg.ok());
    e->wait_idle();
    const EngineStats st = e->stats();
    std::lock_guard<std::mutex> lk(mu);
    EXPECT_EQ(bad_calls, 1) << "the throwing callback was called again";
    EXPECT_EQ(good_tokens, fake_greedy(good.prompt_tokens, fc.vocab, 40));
    EXPECT_EQ(good_finals, 1);
    EXPECT_EQ(st.callback_errors_total, 1);
    EXPECT_EQ(st.requests_aborted_total, 1) << "the throwing request was not aborted";
    EXPECT_EQ(st.pools[0].used_pages, 0);
  }
}

// The output queue is bounded: with max_pending_outputs = 1 the scheduler waits for each
// output's delivery before the next step, so at most one step runs during a slow callback.
TEST(Engine, PendingOutputsAreBounded) {
  FakeConfig fc;
  EngineConfig ec;
  ec.max_pending_outputs = 1;
  auto e = make_engine(fc, ec);
  Request r;
  r.prompt_tokens = {3, 3, 3};
  r.sampling = greedy(20);
  Engine* eng = e.get();
  std::mutex mu;
  std::vector<int64_t> during;
  std::vector<int32_t> got;
  auto res = e->submit(r, [&](const StepOutput& o) {
    std::lock_guard<std::mutex> lk(mu);
    if (got.size() < 3) {
      const int64_t s0 = eng->stats().steps_total;
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      during.push_back(eng->stats().steps_total - s0);
    }
    got.insert(got.end(), o.new_tokens.begin(), o.new_tokens.end());
  });
  ASSERT_TRUE(res.ok());
  e->wait_idle();
  std::lock_guard<std::mutex> lk(mu);
  EXPECT_EQ(got, fake_greedy(r.prompt_tokens, fc.vocab, 20));
  ASSERT_EQ(during.size(), 3u);
  for (int64_t d : during) EXPECT_LE(d, 1);
  auto bad = Engine::create(std::make_unique<FakeExecutor>(fc), [] {
    EngineConfig c;
    c.max_pending_outputs = 0;
    return c;
  }());
  EXPECT_FALSE(bad.ok());
}

// The server's stop-string path: cancel from inside the output callback.
TEST(Engine, CancelFromCallback) {
  FakeConfig fc;
  fc.step_delay_us = 100;
  FakeExecutor* raw = nullptr;
  auto e = make_engine(fc, {}, &raw);
  Request r;
  r.prompt_tokens = {4, 4, 4};
  r.sampling = greedy(500);
  std::atomic<RequestId> id{0};
  std::mutex mu;
  std::vector<int32_t> got;
  int finals = 0;
  FinishReason reason = FinishReason::kNone;
  Engine* eng = e.get();
  auto res = e->submit(r, [&](const StepOutput& o) {
    std::lock_guard<std::mutex> lk(mu);
    got.insert(got.end(), o.new_tokens.begin(), o.new_tokens.end());
    if (o.finished) {
      ++finals;
      reason = o.finish_reason;
    } else if (got.size() >= 3 && id.load() != 0) {
      eng->cancel(id.load());
    }
  });
  ASSERT_TRUE(res.ok());
  id = *res;
  e->wait_idle();
  std::lock_guard<std::mutex> lk(mu);
  EXPECT_EQ(finals, 1);
  EXPECT_EQ(reason, FinishReason::kAbort);
  EXPECT_GE(got.size(), 3u);
  EXPECT_LT(got.size(), 500u);
  EXPECT_EQ(raw->live_sequences(), 0);
}

// Cancels racing with submission (before, during and after the scheduler picked the request up):
// every request still gets exactly one final output and nothing leaks.
TEST(Engine, CancelRacesWithSubmit) {
  FakeConfig fc;
  FakeExecutor* raw = nullptr;
  auto e = make_engine(fc, {}, &raw);
  const int n = 200;
  std::vector<std::atomic<int>> finals(n);
  std::vector<std::atomic<int>> aborted(n);
  for (int i = 0; i < n; ++i) {
    Request r;
    r.prompt_tokens = {int32_t(1 + i % 90), 2, 3};
    r.sampling = greedy(50);
    auto id = e->submit(r, [&, i](const StepOutput& o) {
      if (o.finished) {
        ++finals[size_t(i)];
        aborted[size_t(i)] += o.finish_reason == FinishReason::kAbort;
      }
    });
    ASSERT_TRUE(id.ok());
    if (i % 3 != 2) e->cancel(*id);
    if (i % 3 == 0) e->cancel(*id);  // twice: ignored
  }
  e->wait_idle();
  int n_aborted = 0;
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(finals[size_t(i)].load(), 1) << i;
    n_aborted += aborted[size_t(i)].load();
    if (i % 3 == 2) {
      EXPECT_EQ(aborted[size_t(i)].load(), 0) << i;
    }
  }
  EXPECT_GE(n_aborted, 1);
  EXPECT_EQ(raw->live_sequences(), 0);
  EXPECT_EQ(e->stats().requests_aborted_total, n_aborted);
}

TEST(Engine, LogprobsStreamed) {
  FakeConfig fc;
  auto e = make_engine(fc, {});
  Request r;
  r.prompt_tokens = {1, 2, 3};
  r.sampling = greedy(4);
  r.sampling.logprobs = true;
  r.sampling.top_logprobs = 2;
  std::vector<TokenLogprobs> lps;
  auto toks = e->generate(r, nullptr, &lps);
  ASSERT_TRUE(toks.ok());
  ASSERT_EQ(lps.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(lps[i].token, (*toks)[i]);
    ASSERT_EQ(lps[i].top.size(), 2u);
    EXPECT_EQ(lps[i].top[0].token, (*toks)[i]);  // greedy picks the top raw token
    EXPECT_FLOAT_EQ(lps[i].top[0].logprob, lps[i].logprob);
    EXPECT_LT(lps[i].logprob, 0.0f);
    EXPECT_GE(lps[i].top[0].logprob, lps[i].top[1].logprob);
  }
}

TEST(Engine, StatsAreCurrentWhenARequestsFinalOutputArrives) {
  // /metrics read right after a response (the final callback) must not show the finished request
  // as running or its pages as used: the stats snapshot was published after the step's callbacks,
  // so a client that scraped /metrics at once saw running 1 and pages in use.
  FakeConfig fc;
  auto e = make_engine(fc, {});
  for (int k = 0; k < 3; ++k) {
    Request r;
    r.prompt_tokens.assign(40 + k, int32_t(k + 1));
    r.sampling = greedy(5);
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    EngineStats seen;
    ASSERT_TRUE(e->submit(r, [&](const StepOutput& o) {
                   if (!o.finished) return;
                   std::lock_guard<std::mutex> lk(mu);
                   seen = e->stats();
                   done = true;
                   cv.notify_all();
                 }).ok());
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return done; });
    EXPECT_EQ(seen.running, 0) << k;
    EXPECT_EQ(seen.waiting, 0) << k;
    EXPECT_EQ(seen.requests_finished_total, k + 1) << k;
    ASSERT_EQ(seen.pools.size(), 2u);
    for (const auto& p : seen.pools) EXPECT_EQ(p.used_pages, 0) << p.name << " request " << k;
  }
}

// The scheduler thread's phase times (EngineStats::step_*_s, /metrics
// v4serve_engine_step_host_seconds_total): a forward that sleeps 2 ms shows up as ≥ 2 ms a step
// of "forward" and nowhere else; every phase is counted, and together they fit in the wall time.
TEST(Engine, StepPhaseTimesSplitTheSchedulerThread) {
  FakeConfig fc;
  fc.step_delay_us = 2000;
  auto e = make_engine(fc, {});
  const auto t0 = Clock::now();
  Request r;
  r.prompt_tokens.assign(20, 3);
  r.sampling = greedy(12);
  ASSERT_TRUE(e->generate(r).ok());
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const EngineStats st = e->stats();
  ASSERT_GE(st.steps_total, 12);
  EXPECT_GE(st.step_forward_s, 0.002 * double(st.steps_total));
  EXPECT_GT(st.step_schedule_s, 0.0);
  EXPECT_GT(st.step_batch_s, 0.0);
  EXPECT_GT(st.step_post_s, 0.0);
  EXPECT_GT(st.step_between_s, 0.0);  // 12 steps back to back: 11 gaps
  EXPECT_LT(st.step_schedule_s + st.step_batch_s + st.step_post_s + st.step_between_s,
            st.step_forward_s);  // the sleeping forward dominates
  EXPECT_LE(st.step_schedule_s + st.step_batch_s + st.step_forward_s + st.step_post_s +
                st.step_between_s,
            wall);
  // An engine that drained and then waits for the next request counts no gap for that wait.
  const double between = st.step_between_s;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  r.sampling = greedy(2);
  ASSERT_TRUE(e->generate(r).ok());
  EXPECT_LT(e->stats().step_between_s - between, 0.025) << "the idle wait was counted";
}

TEST(Engine, ThroughputGaugesFallToZeroWhenIdle) {
  // The throughput of the last stats window used to stay in stats() (and /metrics) for as long as
  // the engine was idle: its loop slept without a timeout, so no window ever closed.
  FakeConfig fc;
  fc.step_delay_us = 20000;  // 50 steps: ~1 s of generation, so a 1 s window sees tokens
  EngineConfig ec;
  ec.stats_interval_s = 1;
  auto e = make_engine(fc, ec);
  Request r;
  r.prompt_tokens = {3, 1, 4};
  r.sampling = greedy(75);
  ASSERT_TRUE(e->generate(r).ok());
  e->wait_idle();
  EXPECT_GT(e->stats().generation_tokens_per_s, 0.0);            // a window closed while it ran
  std::this_thread::sleep_for(std::chrono::milliseconds(2600));  // two idle windows
  EXPECT_EQ(e->stats().generation_tokens_per_s, 0.0);
  EXPECT_EQ(e->stats().prompt_tokens_per_s, 0.0);
  EXPECT_EQ(e->stats().generation_tokens_total, 75);
}

TEST(Engine, ShutdownAbortsOutstanding) {
  FakeConfig fc;
  std::atomic<int> finals{0};
  {
    auto e = make_engine(fc, {});
    for (int i = 0; i < 4; ++i) {
      Request r;
      r.prompt_tokens = {int32_t(i + 1)};
      r.sampling = greedy(3000);
      ASSERT_TRUE(e->submit(r, [&](const StepOutput& o) { finals += o.finished; }).ok());
    }
  }
  EXPECT_EQ(finals.load(), 4);
}

}  // namespace
}  // namespace v4::engine
