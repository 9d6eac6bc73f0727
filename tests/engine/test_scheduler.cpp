// Scheduler tests over the deterministic fake executor, driven step by step (no thread).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "engine/scheduler.h"
#include "fake_executor.h"

namespace v4::engine {
namespace {

using testing::fake_greedy;
using testing::FakeConfig;
using testing::FakeExecutor;

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<int> steps_with_output;
  bool finished = false;
  int n_final = 0;
  FinishReason reason = FinishReason::kNone;
  Usage usage;
  int32_t n_preemptions = 0;
  std::vector<TokenLogprobs> prompt_lps;
  int n_with_prompt_lps = 0;  // outputs that carried prompt logprobs
};

struct Harness {
  explicit Harness(FakeConfig fc = {}, EngineConfig ec = {}) : exec(fc), sched(exec, ec) {}
  RequestId add(std::vector<int32_t> prompt, SamplingParams sp, uint64_t seed = 1) {
    Request r;
    r.prompt_tokens = std::move(prompt);
    r.sampling = sp;
    EXPECT_TRUE(Scheduler::check_request(exec, r).ok());
    RequestId id = next++;
    sched.add(
        id, std::move(r),
        [this, id](const StepOutput& o) {
          Collected& c = out[id];
          EXPECT_FALSE(c.finished) << "output after the final one";
          EXPECT_EQ(o.id, id);
          c.tokens.insert(c.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
          c.usage = o.usage;
          c.n_preemptions = o.n_preemptions;
          if (!o.prompt_logprobs.empty()) {
            ++c.n_with_prompt_lps;
            c.prompt_lps = o.prompt_logprobs;
          }
          if (o.finished) {
            c.finished = true;
            ++c.n_final;
            c.reason = o.finish_reason;
          }
        },
        Clock::now(), seed);
    return id;
  }
  int run(int max_steps = 100000) {
    int n = 0;
    while (!sched.idle() && n < max_steps) {
      EXPECT_TRUE(sched.step().ok());
      max_decode_skipped = std::max(max_decode_skipped, sched.last_step().n_decode_skipped);
      ++n;
    }
    return n;
  }
  FakeExecutor exec;
  Scheduler sched;
  std::map<RequestId, Collected> out;
  RequestId next = 1;
  int32_t max_decode_skipped = 0;
};

SamplingParams greedy(int64_t max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

std::vector<int32_t> make_prompt(std::mt19937& rng, int64_t n, int64_t vocab) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = int32_t(rng() % uint32_t(vocab));
  return p;
}

TEST(Scheduler, ManyRequestsEachGetTheirAloneTokens) {
  FakeConfig fc;
  EngineConfig ec;
  ec.chunked_prefill_size = 64;
  ec.max_running_requests = 8;
  Harness h(fc, ec);
  std::mt19937 rng(5);
  std::vector<std::pair<RequestId, std::vector<int32_t>>> expected;
  for (int i = 0; i < 24; ++i) {
    const int64_t len = 1 + int64_t(rng() % 150);
    const int64_t gen = 1 + int64_t(rng() % 40);
    auto prompt = make_prompt(rng, len, fc.vocab);
    RequestId id = h.add(prompt, greedy(gen));
    expected.push_back({id, fake_greedy(prompt, fc.vocab, gen)});
  }
  h.run();
  for (auto& [id, want] : expected) {
    const Collected& c = h.out[id];
    EXPECT_TRUE(c.finished);
    EXPECT_EQ(c.n_final, 1);
    EXPECT_EQ(c.reason, FinishReason::kLength);
    EXPECT_EQ(c.tokens, want) << "request " << id;
    EXPECT_EQ(c.usage.completion_tokens, int64_t(want.size()));
  }
  // Batching happened, and each step kept to the budget and the running limit.
  int max_slices = 0;
  for (const auto& s : h.exec.steps) {
    EXPECT_LE(s.n_tokens, ec.chunked_prefill_size);
    EXPECT_LE(s.n_slices, ec.max_running_requests);
    max_slices = std::max(max_slices, s.n_slices);
  }
  EXPECT_EQ(max_slices, ec.max_running_requests);
  EXPECT_EQ(h.max_decode_skipped, 0);  // decode rows always fit a budget >= running requests
  EXPECT_EQ(h.exec.live_sequences(), 0);
  for (int64_t r : h.sched.reserved_pages()) EXPECT_EQ(r, 0);
}

TEST(Scheduler, ChunkedPrefillEqualsOneShot) {
  std::mt19937 rng(11);
  FakeConfig fc;
  auto prompt = make_prompt(rng, 301, fc.vocab);
  auto want = fake_greedy(prompt, fc.vocab, 12);
  for (int64_t budget : {1, 3, 4, 127, 128, 129, 4096}) {
    EngineConfig ec;
    ec.chunked_prefill_size = budget;
    Harness h(fc, ec);
    RequestId id = h.add(prompt, greedy(12));
    int steps = h.run();
    EXPECT_EQ(h.out[id].tokens, want) << "budget " << budget;
    const int64_t prefill_steps = (301 + budget - 1) / budget;
    EXPECT_EQ(steps, prefill_steps + 11) << "budget " << budget;
    for (const auto& s : h.exec.steps) EXPECT_LE(s.n_tokens, budget);
  }
}

TEST(Scheduler, DecodeRowsMixWithPrefillChunks) {
  FakeConfig fc;
  EngineConfig ec;
  ec.chunked_prefill_size = 32;
  Harness h(fc, ec);
  std::mt19937 rng(3);
  auto p1 = make_prompt(rng, 10, fc.vocab);
  auto p2 = make_prompt(rng, 200, fc.vocab);
  RequestId a = h.add(p1, greedy(30));
  ASSERT_TRUE(h.sched.step().ok());  // a prefilled (10 tokens), first token out
  RequestId b = h.add(p2, greedy(5));
  ASSERT_TRUE(h.sched.step().ok());  // a decode row (1) + b's first chunk (31)
  EXPECT_EQ(h.sched.last_step().n_slices, 2);
  EXPECT_EQ(h.sched.last_step().n_decode_rows, 1);
  EXPECT_EQ(h.sched.last_step().n_tokens, 32);
  h.run();
  EXPECT_EQ(h.out[a].tokens, fake_greedy(p1, fc.vocab, 30));
  EXPECT_EQ(h.out[b].tokens, fake_greedy(p2, fc.vocab, 5));
}

// A short request that arrives while a long prompt is prefilling is admitted in the next step
// (reserve_for_waiting: the long prefill's chunks leave min(its prompt, half the budget) while
// someone waits) and finishes long before the long prompt; without the reserve it waited for the
// whole prefill. Outputs are the same either way; once the queue is empty the long prefill takes
// the whole budget again.
TEST(Scheduler, WaitingRequestIsAdmittedDuringALongPrefill) {
  FakeConfig fc;
  std::mt19937 rng(5);
  auto longp = make_prompt(rng, 2000, fc.vocab);
  auto shortp = make_prompt(rng, 6, fc.vocab);
  for (bool reserve : {true, false}) {
    SCOPED_TRACE(reserve ? "reserve on" : "reserve off");
    EngineConfig ec;
    ec.chunked_prefill_size = 64;
    ec.reserve_for_waiting = reserve;
    Harness h(fc, ec);
    RequestId a = h.add(longp, greedy(3));
    ASSERT_TRUE(h.sched.step().ok());  // the long prompt's first chunk: the whole budget
    EXPECT_EQ(h.sched.last_step().n_tokens, 64);
    RequestId b = h.add(shortp, greedy(2));
    ASSERT_TRUE(h.sched.step().ok());
    if (reserve) {
      EXPECT_EQ(h.sched.last_step().n_slices, 2);  // long chunk (58) + the short prompt (6)
      EXPECT_EQ(h.sched.last_step().n_tokens, 64);
    } else {
      EXPECT_EQ(h.sched.last_step().n_slices, 1);  // the long prompt only
    }
    int steps = 2;
    while (!h.out[b].finished && steps < 1000) {
      ASSERT_TRUE(h.sched.step().ok());
      ++steps;
    }
    if (reserve)
      EXPECT_LE(steps, 4);  // admitted at step 2, second token at step 3
    else
      EXPECT_GE(steps, 2000 / 64);  // behind the whole prefill
    if (reserve) {
      ASSERT_TRUE(h.sched.step().ok());  // queue empty again: full chunks
      EXPECT_EQ(h.sched.last_step().n_tokens, 64);
    }
    h.run();
    EXPECT_EQ(h.out[a].tokens, fake_greedy(longp, fc.vocab, 3));
    EXPECT_EQ(h.out[b].tokens, fake_greedy(shortp, fc.vocab, 2));
  }
}

// A queue head that cannot be admitted (a pool full, or no sequence slot) gets no room: after one
// step with the reserve the long prefill takes the whole budget again, until a running request
// ends.
TEST(Scheduler, NoRoomKeptForAHeadThatCannotBeAdmitted) {
  std::mt19937 rng(6);
  for (int why = 0; why < 2; ++why) {
    SCOPED_TRACE(why == 0 ? "state pool full" : "no sequence slot");
    FakeConfig fc;
    if (why == 0)
      fc.state_pages = 1;  // one live sequence
    else
      fc.max_sequences = 1;
    auto longp = make_prompt(rng, 1000, fc.vocab);
    EngineConfig ec;
    ec.chunked_prefill_size = 64;
    Harness h(fc, ec);
    RequestId a = h.add(longp, greedy(2));
    ASSERT_TRUE(h.sched.step().ok());
    RequestId b = h.add({1, 2, 3}, greedy(2));
    ASSERT_TRUE(h.sched.step().ok());  // room kept once (61 tokens), the head not admitted
    EXPECT_EQ(h.sched.last_step().n_tokens, 61);
    EXPECT_EQ(h.sched.n_waiting(), 1);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(h.sched.step().ok());
      EXPECT_EQ(h.sched.last_step().n_tokens, 64);  // blocked head: whole budget again
    }
    h.run();
    EXPECT_EQ(h.out[a].tokens, fake_greedy(longp, fc.vocab, 2));
    EXPECT_EQ(h.out[b].tokens, fake_greedy({1, 2, 3}, fc.vocab, 2));
  }
}

TEST(Scheduler, CancelMidwayFreesPages) {
  FakeConfig fc;
  EngineConfig ec;
  ec.chunked_prefill_size = 256;
  Harness h(fc, ec);
  std::mt19937 rng(8);
  std::vector<RequestId> ids;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(make_prompt(rng, 20 + 7 * i, fc.vocab));
    ids.push_back(h.add(prompts.back(), greedy(50)));
  }
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(h.sched.step().ok());
  auto busy = h.exec.pool_usage();
  EXPECT_GT(busy[0].used_pages, 0);
  for (int i = 0; i < 8; i += 2) h.sched.cancel(ids[size_t(i)]);
  for (int i = 0; i < 8; i += 2) {
    const Collected& c = h.out[ids[size_t(i)]];
    EXPECT_TRUE(c.finished);
    EXPECT_EQ(c.reason, FinishReason::kAbort);
    EXPECT_GT(c.tokens.size(), 0u);
    EXPECT_LT(c.tokens.size(), 50u);
  }
  EXPECT_EQ(h.exec.live_sequences(), 4);  // freed at once, before any further step
  h.run();
  for (int i = 1; i < 8; i += 2)
    EXPECT_EQ(h.out[ids[size_t(i)]].tokens, fake_greedy(prompts[size_t(i)], fc.vocab, 50));
  for (const auto& u : h.exec.pool_usage()) EXPECT_EQ(u.used_pages, 0) << u.name;
  for (int64_t r : h.sched.reserved_pages()) EXPECT_EQ(r, 0);
  h.sched.cancel(ids[1]);  // finished: ignored
  h.sched.cancel(12345);   // unknown: ignored
  EXPECT_EQ(h.out[ids[1]].n_final, 1);
}

TEST(Scheduler, CancelWhileWaiting) {
  FakeConfig fc;
  EngineConfig ec;
  ec.max_running_requests = 1;
  Harness h(fc, ec);
  RequestId a = h.add({1, 2, 3}, greedy(5));
  RequestId b = h.add({4, 5, 6}, greedy(5));
  ASSERT_TRUE(h.sched.step().ok());
  EXPECT_EQ(h.sched.n_waiting(), 1);
  h.sched.cancel(b);
  EXPECT_EQ(h.sched.n_waiting(), 0);
  EXPECT_EQ(h.out[b].reason, FinishReason::kAbort);
  EXPECT_TRUE(h.out[b].tokens.empty());
  h.run();
  EXPECT_EQ(h.out[a].tokens.size(), 5u);
}

TEST(Scheduler, ImpossibleRequestsRefused) {
  FakeConfig fc;
  fc.max_context = 1000;
  fc.kv_pages = 10;  // 160 tokens
  FakeExecutor exec(fc);
  Request r;
  r.prompt_tokens.assign(100, 1);
  r.sampling = greedy(60);  // 160 tokens: fits exactly
  EXPECT_TRUE(Scheduler::check_request(exec, r).ok());
  r.sampling.max_tokens = 61;  // 161 tokens: 11 pages > 10
  Status st = Scheduler::check_request(exec, r);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("pool 'kv'"), std::string::npos) << st.message();
  r.sampling.max_tokens = 950;
  st = Scheduler::check_request(exec, r);
  EXPECT_NE(st.message().find("maximum context length is 1000"), std::string::npos) << st.message();
  r.prompt_tokens.clear();
  r.sampling.max_tokens = 5;
  EXPECT_FALSE(Scheduler::check_request(exec, r).ok());
  r.prompt_tokens = {1, 97};  // vocab is 97
  st = Scheduler::check_request(exec, r);
  EXPECT_NE(st.message().find("outside the vocabulary"), std::string::npos) << st.message();
}

TEST(Scheduler, PreemptionUnderTinyPoolKeepsGreedyOutputs) {
  FakeConfig fc;
  fc.page_tokens = 4;
  fc.kv_pages = 40;  // 160 tokens for everyone together
  EngineConfig ec;
  ec.chunked_prefill_size = 64;
  ec.admission_watermark = 0.0;
  Harness h(fc, ec);
  std::mt19937 rng(21);
  std::vector<std::pair<RequestId, std::vector<int32_t>>> expected;
  for (int i = 0; i < 10; ++i) {
    auto prompt = make_prompt(rng, 10 + int64_t(rng() % 30), fc.vocab);
    const int64_t gen = 40 + int64_t(rng() % 40);
    expected.push_back({h.add(prompt, greedy(gen)), fake_greedy(prompt, fc.vocab, gen)});
  }
  h.run();
  EXPECT_GT(h.sched.counters().preemptions_total, 0);
  int preempted_requests = 0;
  for (auto& [id, want] : expected) {
    EXPECT_EQ(h.out[id].tokens, want) << "request " << id;
    EXPECT_EQ(h.out[id].n_final, 1);
    preempted_requests += h.out[id].n_preemptions > 0;
  }
  EXPECT_GT(preempted_requests, 0);
  for (const auto& u : h.exec.pool_usage()) EXPECT_EQ(u.used_pages, 0);
}

TEST(Scheduler, EveryPoolBoundsAdmission) {
  FakeConfig fc;
  fc.state_pages = 3;  // at most 3 live sequences, though kv has room for many
  EngineConfig ec;
  Harness h(fc, ec);
  for (int i = 0; i < 6; ++i) h.add({int32_t(i + 1), 2, 3}, greedy(20));
  ASSERT_TRUE(h.sched.step().ok());
  EXPECT_EQ(h.sched.n_running(), 3);
  EXPECT_EQ(h.sched.n_waiting(), 3);
  h.run();
  for (auto& [id, c] : h.out) EXPECT_EQ(c.tokens.size(), 20u);
  for (const auto& s : h.exec.steps) EXPECT_LE(s.n_slices, 3);
}

TEST(Scheduler, FcfsOrder) {
  FakeConfig fc;
  EngineConfig ec;
  ec.max_running_requests = 1;
  Harness h(fc, ec);
  std::vector<RequestId> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(h.add({int32_t(i + 1)}, greedy(3)));
  std::vector<RequestId> finish_order;
  while (!h.sched.idle()) {
    ASSERT_TRUE(h.sched.step().ok());
    for (RequestId id : ids)
      if (h.out[id].finished &&
          std::find(finish_order.begin(), finish_order.end(), id) == finish_order.end())
        finish_order.push_back(id);
  }
  EXPECT_EQ(finish_order, ids);
}

TEST(Scheduler, StopTokenAndEos) {
  FakeConfig fc;
  std::vector<int32_t> prompt = {5, 6, 7};
  auto free_run = fake_greedy(prompt, fc.vocab, 20);
  // Stop at the 4th generated token (first occurrence of its id).
  const int32_t stop = free_run[3];
  size_t first = size_t(std::find(free_run.begin(), free_run.end(), stop) - free_run.begin());
  {
    Harness h(fc);
    SamplingParams sp = greedy(20);
    sp.stop_token_ids = {stop};
    RequestId id = h.add(prompt, sp);
    h.run();
    EXPECT_EQ(h.out[id].reason, FinishReason::kStop);
    EXPECT_EQ(h.out[id].tokens,
              std::vector<int32_t>(free_run.begin(), free_run.begin() + first + 1));
  }
  {
    EngineConfig ec;
    ec.eos_token_ids = {stop};
    Harness h(fc, ec);
    SamplingParams sp = greedy(20);
    sp.ignore_eos = false;
    RequestId a = h.add(prompt, sp);
    sp.ignore_eos = true;
    RequestId b = h.add(prompt, sp);
    h.run();
    EXPECT_EQ(h.out[a].reason, FinishReason::kStop);
    EXPECT_EQ(h.out[a].tokens.size(), first + 1);
    EXPECT_EQ(h.out[b].reason, FinishReason::kLength);
    EXPECT_EQ(h.out[b].tokens, free_run);
  }
}

TEST(Scheduler, SeededSamplingIndependentOfBatchAndPreemption) {
  FakeConfig fc;
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_p = 0.9f;
  sp.max_tokens = 30;
  sp.ignore_eos = true;
  std::vector<int32_t> prompt = {9, 8, 7, 6};
  std::vector<int32_t> alone;
  {
    Harness h(fc);
    RequestId id = h.add(prompt, sp, 777);
    h.run();
    alone = h.out[id].tokens;
  }
  ASSERT_EQ(alone.size(), 30u);
  FakeConfig tiny = fc;
  tiny.page_tokens = 4;
  tiny.kv_pages = 30;
  EngineConfig ec;
  ec.chunked_prefill_size = 7;
  ec.admission_watermark = 0.0;
  Harness h(tiny, ec);
  std::mt19937 rng(2);
  for (int i = 0; i < 5; ++i) h.add(make_prompt(rng, 15, fc.vocab), sp, 100 + i);
  RequestId id = h.add(prompt, sp, 777);
  for (int i = 0; i < 3; ++i) h.add(make_prompt(rng, 9, fc.vocab), sp, 200 + i);
  h.run();
  EXPECT_EQ(h.out[id].tokens, alone);
  EXPECT_GT(h.sched.counters().preemptions_total, 0);
  // A different seed gives a different continuation.
  Harness h2(fc);
  RequestId id2 = h2.add(prompt, sp, 778);
  h2.run();
  EXPECT_NE(h2.out[id2].tokens, alone);
}

TEST(Scheduler, FailedStepFinishesItsBatchWithErrorAndCarriesOn) {
  FakeConfig fc;
  fc.fail_at_forward = 3;
  EngineConfig ec;
  ec.max_running_requests = 2;
  Harness h(fc, ec);
  RequestId a = h.add({1, 2, 3}, greedy(10));
  RequestId b = h.add({4, 5}, greedy(10));
  RequestId c = h.add({6, 7, 8, 9}, greedy(4));  // waits: 2 running at most
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(h.sched.step().ok());
  Status st = h.sched.step();  // the 4th forward fails
  EXPECT_EQ(st.code(), ErrorCode::kInternal);
  EXPECT_EQ(h.out[a].reason, FinishReason::kError);
  EXPECT_EQ(h.out[b].reason, FinishReason::kError);
  EXPECT_EQ(h.out[a].tokens.size(), 3u);
  EXPECT_FALSE(h.out[c].finished);
  h.run();
  EXPECT_EQ(h.out[c].reason, FinishReason::kLength);
  EXPECT_EQ(h.out[c].tokens, fake_greedy({6, 7, 8, 9}, fc.vocab, 4));
  for (const auto& u : h.exec.pool_usage()) EXPECT_EQ(u.used_pages, 0);
  for (int64_t r : h.sched.reserved_pages()) EXPECT_EQ(r, 0);
}

TEST(Scheduler, PrefixHitsSkipCachedTokensAndRespectSnapshotPoints) {
  FakeConfig fc;
  fc.prefix_cache = true;
  fc.snapshot_every = 10;
  EngineConfig ec;
  ec.chunked_prefill_size = 64;
  Harness h(fc, ec);
  std::mt19937 rng(4);
  auto prompt = make_prompt(rng, 57, fc.vocab);
  RequestId a = h.add(prompt, greedy(6));
  h.run();
  EXPECT_EQ(h.out[a].usage.cached_tokens, 0);
  const int64_t computed_a = h.sched.counters().prompt_tokens_total;
  EXPECT_EQ(computed_a, 57);
  // Same prompt + a follow-up turn: hits the first request's 57 + 6 - 1 = 62 computed tokens.
  auto turn2 = prompt;
  auto gen_a = h.out[a].tokens;
  turn2.insert(turn2.end(), gen_a.begin(), gen_a.end());
  auto extra = make_prompt(rng, 25, fc.vocab);
  turn2.insert(turn2.end(), extra.begin(), extra.end());
  RequestId b = h.add(turn2, greedy(8));
  h.run();
  EXPECT_EQ(h.out[b].usage.cached_tokens, 62);
  EXPECT_EQ(h.out[b].tokens, fake_greedy(turn2, fc.vocab, 8));
  EXPECT_EQ(h.sched.counters().prompt_tokens_total - computed_a, int64_t(turn2.size()) - 62);
  EXPECT_EQ(h.sched.counters().prefix_hit_tokens_total, 62);
  EXPECT_EQ(h.sched.counters().prefix_query_tokens_total, 57 + int64_t(turn2.size()));
  // Identical prompt: at most prompt - 1 tokens come from the cache.
  RequestId c = h.add(prompt, greedy(3));
  h.run();
  EXPECT_EQ(h.out[c].usage.cached_tokens, 56);
  EXPECT_EQ(h.out[c].tokens, fake_greedy(prompt, fc.vocab, 3));
  // No chunk crossed a snapshot point.
  for (const auto& sl : h.exec.slices)
    for (int64_t p = 10; p < sl.start_pos + sl.n_tokens; p += 10)
      EXPECT_FALSE(sl.start_pos < p && p < sl.start_pos + sl.n_tokens)
          << "slice [" << sl.start_pos << ", " << sl.start_pos + sl.n_tokens << ") crosses " << p;
  for (const auto& u : h.exec.pool_usage()) EXPECT_EQ(u.used_pages, 0);
}

// SamplingParams::prompt_logprobs: every prompt token after the first is scored by the logits
// at the position before it (raw log-softmax, top-n descending), delivered once with the first
// generated token, across prefill chunks, and with the whole prompt computed even when the
// prefix cache holds it (cached_tokens 0); the generated tokens are unchanged.
TEST(Scheduler, PromptLogprobsScoreEveryPromptTokenAcrossChunks) {
  FakeConfig fc;
  fc.prefix_cache = true;
  EngineConfig ec;
  ec.chunked_prefill_size = 7;
  Harness h(fc, ec);
  std::mt19937 rng(9);
  const auto prompt = make_prompt(rng, 30, fc.vocab);
  // Reference: log-softmax of the fake logits of prompt[0..i] at prompt[i + 1].
  std::vector<TokenLogprobs> want;
  {
    uint64_t hsh = 0;
    std::vector<float> row(size_t(fc.vocab));
    for (size_t i = 0; i + 1 < prompt.size(); ++i) {
      hsh = testing::fake_extend(hsh, prompt[i]);
      testing::fake_logits(hsh, fc.vocab, row.data());
      double mx = *std::max_element(row.begin(), row.end()), s = 0;
      for (float v : row) s += std::exp(double(v) - mx);
      const double lse = mx + std::log(s);
      TokenLogprobs lp;
      lp.token = prompt[i + 1];
      lp.logprob = float(double(row[size_t(prompt[i + 1])]) - lse);
      std::vector<int32_t> idx(row.size());
      for (size_t v = 0; v < idx.size(); ++v) idx[v] = int32_t(v);
      std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return row[size_t(a)] > row[size_t(b)]; });
      for (int k = 0; k < 3; ++k) lp.top.push_back({idx[size_t(k)], float(double(row[size_t(idx[size_t(k)])]) - lse)});
      want.push_back(lp);
    }
  }
  RequestId warm = h.add(prompt, greedy(2));  // puts the prompt into the prefix cache
  h.run();
  EXPECT_EQ(h.out[warm].n_with_prompt_lps, 0);
  auto sp = greedy(4);
  sp.prompt_logprobs = 3;
  auto sp1 = greedy(1);  // finishes with its first token
  sp1.prompt_logprobs = 3;
  RequestId a = h.add(prompt, sp);
  RequestId b = h.add(prompt, sp1);
  RequestId c = h.add(prompt, greedy(4));
  h.run();
  for (RequestId id : {a, b}) {
    SCOPED_TRACE(id);
    const Collected& o = h.out[id];
    EXPECT_EQ(o.n_with_prompt_lps, 1);
    EXPECT_EQ(o.usage.cached_tokens, 0);
    ASSERT_EQ(o.prompt_lps.size(), prompt.size() - 1);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(o.prompt_lps[i].token, want[i].token) << i;
      EXPECT_NEAR(o.prompt_lps[i].logprob, want[i].logprob, 1e-5) << i;
      ASSERT_EQ(o.prompt_lps[i].top.size(), 3u) << i;
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(o.prompt_lps[i].top[k].token, want[i].top[k].token) << i << "," << k;
        EXPECT_NEAR(o.prompt_lps[i].top[k].logprob, want[i].top[k].logprob, 1e-5);
      }
    }
  }
  EXPECT_EQ(h.out[a].tokens, fake_greedy(prompt, fc.vocab, 4));
  EXPECT_EQ(h.out[b].tokens, fake_greedy(prompt, fc.vocab, 1));
  EXPECT_EQ(h.out[c].n_with_prompt_lps, 0);
  EXPECT_EQ(h.out[c].usage.cached_tokens, int64_t(prompt.size()) - 1);  // the cache still serves
  EXPECT_EQ(h.out[c].tokens, fake_greedy(prompt, fc.vocab, 4));
  SamplingParams bad = greedy(1);
  bad.prompt_logprobs = 21;
  EXPECT_FALSE(validate_sampling(bad, fc.vocab).ok());
  for (const auto& u : h.exec.pool_usage()) EXPECT_EQ(u.used_pages, 0);
}

}  // namespace
}  // namespace v4::engine
