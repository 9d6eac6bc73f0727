// Host-side cost of the engine per step (scheduler bookkeeping and the CPU sampler), measured
// with an executor whose forward only writes logits. Prints the numbers; the bounds are loose
// (they catch quadratic blow-ups, not regressions of a few percent on a shared machine).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>

#include "engine/sampler.h"
#include "engine/scheduler.h"

namespace v4::engine {
namespace {

using Ms = std::chrono::duration<double, std::milli>;

// A "model" with fixed logits per row; costs only the logits fill.
class NullExecutor : public Executor {
 public:
  explicit NullExecutor(int64_t vocab) : vocab_(vocab) {}
  int64_t vocab_size() const override { return vocab_; }
  int64_t max_context() const override { return 1 << 20; }
  std::vector<PoolSpec> pools() const override { return {{"kv", 1 << 20, 256}}; }
  std::vector<int64_t> pages_for(int64_t n) const override { return {(n + 255) / 256}; }
  std::vector<PoolUsage> pool_usage() const override { return {{"kv", 0, 1 << 20}}; }
  Result<int32_t> create_sequence() override { return next_++; }
  void free_sequence(int32_t) override {}
  Result<model::ForwardOutput> forward(const model::ForwardBatch& b) override {
    auto t0 = std::chrono::steady_clock::now();
    model::ForwardOutput o;
    o.vocab = vocab_;
    o.logits.resize(b.slices.size() * size_t(vocab_));
    for (size_t i = 0; i < b.slices.size(); ++i)
      o.logits[i * size_t(vocab_) + size_t((b.slices[i].start_pos * 7 + 3) % vocab_)] = 1.0f;
    o.row_begin.resize(b.slices.size() + 1);
    for (size_t i = 0; i <= b.slices.size(); ++i) o.row_begin[i] = int64_t(i);
    forward_ms += Ms(std::chrono::steady_clock::now() - t0).count();
    return o;
  }
  double forward_ms = 0;

 private:
  int64_t vocab_;
  int32_t next_ = 0;
};

double decode_step_us(int64_t vocab, int n_running, int n_steps) {
  NullExecutor ex(vocab);
  EngineConfig ec;
  ec.chunked_prefill_size = 8192;
  ec.max_running_requests = n_running;
  Scheduler s(ex, ec);
  for (int i = 0; i < n_running; ++i) {
    Request r;
    r.prompt_tokens.assign(16, 1 + i % 50);
    r.sampling.temperature = 0.0f;
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = n_steps + 10;
    s.add(
        RequestId(i + 1), std::move(r), [](const StepOutput&) {}, Clock::now(), 1);
  }
  EXPECT_TRUE(s.step().ok());  // prefill of everyone
  EXPECT_EQ(s.last_step().n_slices, n_running);
  ex.forward_ms = 0;
  auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  for (int i = 0; i < n_steps; ++i) EXPECT_TRUE(s.step().ok());
  const double cpu_ms = double(std::clock() - c0) * 1000.0 / CLOCKS_PER_SEC;
  const double total_ms = Ms(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.last_step().n_decode_rows, n_running);
  std::printf(
      "[overhead] %d decode rows, vocab %lld: wall %.1f us/step (forward excluded), "
      "process CPU %.1f us/step (forward included)\n",
      n_running, (long long)vocab, (total_ms - ex.forward_ms) * 1000.0 / n_steps,
      cpu_ms * 1000.0 / n_steps);
  return (total_ms - ex.forward_ms) * 1000.0 / n_steps;
}

TEST(Overhead, SchedulerStepAt256Running) {
  // Speed is measured, not asserted (timings vary with machine load and sanitizers): the
  // helper checks the batch shape of every step; the time is printed for docs/engine.md.
  const double us = decode_step_us(64, 256, 500);
  std::printf("[overhead] scheduler + greedy step at 256 running, vocab 64: %.1f us\n", us);
}

TEST(Overhead, GreedyStepAt256RunningFullVocab) {
  const double us = decode_step_us(129280, 256, 10);
  std::printf("[overhead] scheduler + greedy step at 256 running, vocab 129280: %.1f us\n", us);
}

TEST(Overhead, SamplerPerRowFullVocab) {
  const int64_t V = 129280;
  std::vector<float> l(static_cast<size_t>(V));
  std::mt19937 rng(1);
  for (float spread : {2.0f, 5.0f}) {
    // spread 2: a flat distribution (top_p 0.95 keeps ~half the vocabulary, the worst case);
    // spread 5: peaked, closer to a trained model's next-token distribution.
    std::normal_distribution<float> nd(0.0f, spread);
    for (auto& x : l) x = nd(rng);
    PenaltyState st;
    st.output_counts[5] = 2;
    std::vector<float> w;
    std::vector<int32_t> idx;
    auto time_us = [&](const SamplingParams& p) {
      const int n = 30;
      auto t0 = std::chrono::steady_clock::now();
      int64_t acc = 0;
      TokenLogprobs lp;
      for (int i = 0; i < n; ++i) acc += sample_token(l.data(), V, p, 9, i, st, &lp, &w, &idx);
      EXPECT_GE(acc, 0);
      return Ms(std::chrono::steady_clock::now() - t0).count() * 1000.0 / n;
    };
    SamplingParams g;
    g.temperature = 0.0f;
    SamplingParams tp;
    tp.temperature = 0.8f;
    tp.top_p = 0.95f;
    SamplingParams tk = tp;
    tk.top_k = 50;
    tk.presence_penalty = 0.5f;
    SamplingParams lp = g;
    lp.logprobs = true;
    lp.top_logprobs = 5;
    const double ug = time_us(g), up = time_us(tp), uk = time_us(tk), ul = time_us(lp);
    std::printf(
        "[overhead] sampler per row, vocab %lld, logits N(0, %.0f^2): greedy %.0f us, "
        "T=0.8 top_p=0.95 %.0f us, +top_k=50 +presence %.0f us, greedy+top5 logprobs %.0f us\n",
        (long long)V, spread, ug, up, uk, ul);
  }
}

}  // namespace
}  // namespace v4::engine
