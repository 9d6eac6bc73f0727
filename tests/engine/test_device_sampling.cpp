// Device sampling (ops::Ops::sample, issue 6) through the engine, without a GPU:
// - the CPU sampler's rules the device follows (NaN / ±inf policy);
// - the scheduler with an executor that samples "on the backend" (slices with
//   model::DeviceSampling return a token and no logits row) gives exactly the tokens and logprobs
//   of host sampling, with chunked prefill, preemption and a mix of device and host rows;
// - the real model (DeepseekV4 head) on a test-only CPU Ops wrapper whose `sample` runs the CPU
//   sampler on the backend's logits rows: the engine's outputs equal those of the plain CPU
//   backend (which does not sample), so the head's row reordering, parameter upload, token and
//   logprob downloads and the scheduler's use of them are all exercised.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/model_executor.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "fake_executor.h"
#include "model/deepseek_v4.h"
#include "ops/ops.h"

namespace v4::engine {
namespace {

using testing::FakeConfig;
using testing::FakeExecutor;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

int32_t sample1(const std::vector<float>& l, const SamplingParams& p, uint64_t seed = 1,
                int64_t step = 0) {
  std::vector<float> s;
  std::vector<int32_t> si;
  return sample_token(l.data(), int64_t(l.size()), p, seed, step, {}, nullptr, &s, &si);
}

SamplingParams temp(float t) {
  SamplingParams p;
  p.temperature = t;
  return p;
}

// ---- CPU rules the device sampler mirrors -------------------------------------------------------

TEST(SamplerPolicy, GreedyIgnoresNaNAndAllNaNGivesZero) {
  std::vector<float> l(40, 0.5f);
  l[3] = kNaN;
  l[7] = 2.0f;
  l[21] = kNaN;
  EXPECT_EQ(sample1(l, temp(0)), 7);
  // A NaN right before the maximum in the same 16-wide block must not hide it (SSE max order).
  std::vector<float> m(64, -1.0f);
  m[16] = 5.0f;
  m[32] = kNaN;
  m[48] = 1.0f;
  EXPECT_EQ(sample1(m, temp(0)), 16);
  std::vector<float> m2(64, -1.0f);
  m2[20] = kNaN;
  m2[4] = 3.0f;
  EXPECT_EQ(sample1(m2, temp(0)), 4);
  EXPECT_EQ(sample1(std::vector<float>(37, kNaN), temp(0)), 0);
  std::vector<float> ninf(37, -kInf);
  ninf[0] = kNaN;
  EXPECT_EQ(sample1(ninf, temp(0)), 1);  // −inf beats NaN
  std::vector<float> z(20, -3.0f);
  z[5] = -0.0f;
  z[9] = 0.0f;
  EXPECT_EQ(sample1(z, temp(0)), 5);  // −0 == +0: lowest id
}

TEST(SamplerPolicy, SampledNeverDrawsNaNOrMinusInf) {
  std::vector<float> l(50, kNaN);
  l[10] = 1.0f;
  l[11] = -kInf;
  l[30] = 1.0f;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    SamplingParams p = temp(0.7f);
    p.top_k = int32_t(seed % 4);  // 0 (off), 1, 2, 3
    const int32_t t = sample1(l, p, seed);
    EXPECT_TRUE(t == 10 || t == 30) << "seed " << seed << " token " << t;
  }
  const auto d = sampling_distribution(l.data(), 50, temp(1.0f), {});
  EXPECT_NEAR(d[10], 0.5, 1e-6);
  EXPECT_NEAR(d[30], 0.5, 1e-6);
  EXPECT_EQ(d[0], 0.0f);
}

TEST(SamplerPolicy, NonFiniteMaxGivesArgmaxOfScaledLogits) {
  std::vector<float> l(30, 1.0f);
  l[12] = kInf;
  l[25] = kInf;
  EXPECT_EQ(sample1(l, temp(0.8f), 3), 12);
  EXPECT_EQ(sample1(std::vector<float>(30, -kInf), temp(0.8f), 3), 0);
  std::vector<float> big(30, 0.0f);
  big[4] = 3e38f;  // · (1/T) overflows to +inf
  big[9] = 3e38f;
  SamplingParams p = temp(0.01f);
  p.top_p = 0.5f;
  EXPECT_EQ(sample1(big, p, 5), 4);
  const auto d = sampling_distribution(big.data(), 30, p, {});
  EXPECT_EQ(d[4], 1.0f);
}

// ---- scheduler over an executor that samples on its "backend" -----------------------------------

SamplingParams params_of(const model::DeviceSampling& d) {
  SamplingParams p;
  p.temperature = d.temperature;
  p.top_k = d.top_k;
  p.top_p = d.top_p;
  p.min_p = d.min_p;
  p.logprobs = d.top_logprobs >= 0;
  p.top_logprobs = std::max(0, d.top_logprobs);
  return p;
}

/// The fake executor, but slices carrying `sample` get their token from the CPU sampler on their
/// logits row and return no logits rows (ForwardOutput::tokens), like ModelExecutor on the CUDA
/// backend; the other slices keep their rows.
class SamplingFake : public FakeExecutor {
 public:
  using FakeExecutor::FakeExecutor;
  Result<model::ForwardOutput> forward(const model::ForwardBatch& b) override {
    auto r = FakeExecutor::forward(b);
    if (!r.ok()) return r;
    const model::ForwardOutput& in = *r;
    const int64_t V = in.vocab;
    const size_t n = b.slices.size();
    model::ForwardOutput out;
    out.vocab = V;
    out.row_begin.push_back(0);
    int32_t top_n = 0;
    bool want_lp = false, any = false;
    for (const auto& sl : b.slices)
      if (sl.sample && !sl.logits_all) {
        any = true;
        want_lp |= sl.sample->top_logprobs >= 0;
        top_n = std::max(top_n, sl.sample->top_logprobs);
      }
    if (any) out.tokens.assign(n, -1);
    if (want_lp) {
      out.token_logprob.assign(n, kNaN);
      out.top_n = top_n;
      out.top_tokens.assign(n * size_t(top_n), -1);
      out.top_logprobs.assign(n * size_t(top_n), kNaN);
    }
    for (size_t i = 0; i < n; ++i) {
      const auto& sl = b.slices[i];
      if (sl.sample && !sl.logits_all) {
        const float* row = in.logits.data() + (in.row_begin[i + 1] - 1) * V;
        SamplingParams sp = params_of(*sl.sample);
        sp.top_logprobs = top_n;
        TokenLogprobs lp;
        std::vector<float> sc;
        std::vector<int32_t> si;
        out.tokens[i] =
            sample_token(row, V, sp, sl.sample->seed, sl.sample->step, {}, &lp, &sc, &si);
        if (sl.sample->top_logprobs >= 0) {
          out.token_logprob[i] = lp.logprob;
          for (size_t j = 0; j < lp.top.size(); ++j) {
            out.top_tokens[i * size_t(top_n) + j] = lp.top[j].token;
            out.top_logprobs[i * size_t(top_n) + j] = lp.top[j].logprob;
          }
        }
        ++device_rows;
      } else {
        out.logits.insert(out.logits.end(), in.logits.begin() + in.row_begin[i] * V,
                          in.logits.begin() + in.row_begin[i + 1] * V);
        logits_rows += in.row_begin[i + 1] - in.row_begin[i];
      }
      out.row_begin.push_back(int64_t(out.logits.size()) / V);
    }
    return out;
  }
  int64_t device_rows = 0, logits_rows = 0;
};

struct Got {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> lps;
  FinishReason reason = FinishReason::kNone;
};

template <typename Exec>
std::map<RequestId, Got> run_all(
    Exec& exec, EngineConfig ec,
    const std::vector<std::pair<std::vector<int32_t>, SamplingParams>>& reqs,
    int64_t* preemptions) {
  Scheduler sched(exec, ec);
  std::map<RequestId, Got> got;
  RequestId id = 1;
  for (const auto& [prompt, sp] : reqs) {
    Request r;
    r.prompt_tokens = prompt;
    r.sampling = sp;
    EXPECT_TRUE(Scheduler::check_request(exec, r).ok());
    const RequestId my = id++;
    sched.add(
        my, r,
        [&got, my](const StepOutput& o) {
          Got& g = got[my];
          g.tokens.insert(g.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
          g.lps.insert(g.lps.end(), o.logprobs.begin(), o.logprobs.end());
          if (o.finished) g.reason = o.finish_reason;
        },
        Clock::now(), 1000 + my * 7919);
  }
  for (int n = 0; !sched.idle() && n < 100000; ++n) EXPECT_TRUE(sched.step().ok());
  if (preemptions) *preemptions = sched.counters().preemptions_total;
  return got;
}

void expect_same(const std::map<RequestId, Got>& want, const std::map<RequestId, Got>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [id, w] : want) {
    const Got& g = got.at(id);
    EXPECT_EQ(g.reason, w.reason) << "request " << id;
    EXPECT_EQ(g.tokens, w.tokens) << "request " << id;
    ASSERT_EQ(g.lps.size(), w.lps.size()) << "request " << id;
    for (size_t k = 0; k < w.lps.size(); ++k) {
      EXPECT_EQ(g.lps[k].token, w.lps[k].token) << "request " << id << " token " << k;
      EXPECT_EQ(g.lps[k].logprob, w.lps[k].logprob) << "request " << id << " token " << k;
      ASSERT_EQ(g.lps[k].top.size(), w.lps[k].top.size()) << "request " << id << " token " << k;
      for (size_t j = 0; j < w.lps[k].top.size(); ++j) {
        EXPECT_EQ(g.lps[k].top[j].token, w.lps[k].top[j].token) << "request " << id;
        EXPECT_EQ(g.lps[k].top[j].logprob, w.lps[k].top[j].logprob) << "request " << id;
      }
    }
  }
}

/// A mix of requests: greedy, every truncation, logprobs, and penalties (host only).
std::vector<std::pair<std::vector<int32_t>, SamplingParams>> mixed_requests(int64_t vocab, int n,
                                                                            uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::pair<std::vector<int32_t>, SamplingParams>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt(size_t(3 + rng() % 60));
    for (auto& t : prompt) t = int32_t(rng() % uint32_t(vocab));
    SamplingParams p;
    p.max_tokens = 6 + int64_t(rng() % 14);
    p.ignore_eos = true;
    switch (i % 10) {
      case 0:
        p.temperature = 0.0f;
        break;
      case 1:
        p.temperature = 0.8f;
        p.top_p = 0.9f;
        break;
      case 2:
        p.temperature = 1.2f;
        p.top_k = 5;
        break;
      case 3:
        p.temperature = 0.7f;
        p.min_p = 0.1f;
        break;
      case 4:
        p.temperature = 1.0f;
        p.top_k = 20;
        p.top_p = 0.8f;
        p.min_p = 0.05f;
        p.logprobs = true;
        p.top_logprobs = 3;
        break;
      case 5:
        p.temperature = 0.0f;
        p.logprobs = true;
        p.top_logprobs = 5;
        break;
      case 6:
        p.temperature = 0.9f;
        p.presence_penalty = 0.5f;
        break;  // host
      case 7:
        p.temperature = 0.0f;
        p.repetition_penalty = 1.3f;
        break;  // host
      case 8:
        p.temperature = 1.0f;
        p.logprobs = true;
        break;  // id-order draw
      case 9:
        p.temperature = 1.5f;
        p.frequency_penalty = 0.3f;
        p.logprobs = true;
        break;  // host
    }
    out.emplace_back(std::move(prompt), p);
  }
  return out;
}

TEST(DeviceSampling, SchedulerUsesBackendTokensLikeHostSampling) {
  FakeConfig fc;
  fc.vocab = 301;
  fc.kv_pages = 14;  // 224 tokens for up to 12 running requests of ≤ 82: preemption
  fc.page_tokens = 16;
  EngineConfig ec;
  ec.chunked_prefill_size = 37;  // chunked prefill mixed with decode rows
  ec.max_running_requests = 12;
  const auto reqs = mixed_requests(fc.vocab, 24, 5);
  FakeExecutor host(fc);
  int64_t pre_host = 0, pre_dev = 0;
  const auto want = run_all(host, ec, reqs, &pre_host);
  SamplingFake dev(fc);
  const auto got = run_all(dev, ec, reqs, &pre_dev);
  expect_same(want, got);
  // Both paths were exercised: backend tokens (incl. non-final prefill chunks) and logits rows
  // for the requests with penalties; and preemption happened.
  EXPECT_GT(dev.device_rows, 100);
  EXPECT_GT(dev.logits_rows, 20);
  EXPECT_GT(pre_host, 0);
  EXPECT_EQ(pre_dev, pre_host);
  int64_t n_tokens = 0;
  for (const auto& [id, g] : want) n_tokens += int64_t(g.tokens.size());
  EXPECT_GT(n_tokens, 200);
}

TEST(DeviceSampling, MalformedOutputFailsTheStep) {
  // An executor that claims to sample but returns neither a token nor a logits row.
  class Broken : public FakeExecutor {
   public:
    using FakeExecutor::FakeExecutor;
    Result<model::ForwardOutput> forward(const model::ForwardBatch& b) override {
      auto r = FakeExecutor::forward(b);
      if (!r.ok()) return r;
      r->tokens.assign(b.slices.size(), -1);
      r->logits.clear();
      r->row_begin.assign(b.slices.size() + 1, 0);
      return r;
    }
  };
  Broken ex;
  Scheduler sched(ex, EngineConfig{});
  Request r;
  r.prompt_tokens = {1, 2, 3};
  r.sampling.temperature = 0.0f;
  FinishReason reason = FinishReason::kNone;
  Status err;
  sched.add(
      1, r,
      [&](const StepOutput& o) {
        if (o.finished) reason = o.finish_reason, err = o.error;
      },
      Clock::now(), 1);
  EXPECT_FALSE(sched.step().ok());
  EXPECT_EQ(reason, FinishReason::kError);
  EXPECT_NE(err.message().find("neither a token nor logits"), std::string::npos) << err.message();
}

// ---- the real model head on a CPU backend that "samples on the device" ------------------------

/// The CPU backend with `sample` implemented by the CPU sampler on the backend's (host) logits
/// rows: lets the model's device-sampling head run without a GPU. Everything else forwards.
class HostSamplingOps : public ops::Ops {
 public:
  explicit HostSamplingOps(std::unique_ptr<ops::Ops> in) : in_(std::move(in)) {}
  std::string name() const override { return in_->name(); }
  void* alloc(size_t b) override { return in_->alloc(b); }
  void free(void* p) override { in_->free(p); }
  void upload(void* d, const void* s, size_t b) override { in_->upload(d, s, b); }
  void download(void* d, const void* s, size_t b) override { in_->download(d, s, b); }
  void synchronize() override { in_->synchronize(); }
  void linear(const float* x, int64_t ldx, const float* w, int64_t M, int64_t N, int64_t K,
              float* y, int64_t ldy) override {
    in_->linear(x, ldx, w, M, N, K, y, ldy);
  }
  bool supports(ops::WFormat f) const override { return in_->supports(f); }
  void linear_w(const float* x, int64_t ldx, const ops::WeightView& w, int64_t M, float* y,
                int64_t ldy) override {
    in_->linear_w(x, ldx, w, M, y, ldy);
  }
  void add(float* y, const float* x, int64_t n) override { in_->add(y, x, n); }
  void gather_rows(const float* s, const int32_t* r, int64_t n, int64_t w, float* d) override {
    in_->gather_rows(s, r, n, w, d);
  }
  void store_rows(float* p, const int32_t* r, int64_t n, int64_t w, const float* s) override {
    in_->store_rows(p, r, n, w, s);
  }
  void embed(const float* t, const int32_t* ids, int64_t S, int D, int n, float* o) override {
    in_->embed(t, ids, S, D, n, o);
  }
  void rms_norm(const float* x, const float* w, int64_t rows, int dim, float eps,
                float* y) override {
    in_->rms_norm(x, w, rows, dim, eps, y);
  }
  void rope(float* x, int64_t rows, int nh, int hd, int rd, const int64_t* pos, const float* f,
            float s, bool inv) override {
    in_->rope(x, rows, nh, hd, rd, pos, f, s, inv);
  }
  void hc_pre(const ops::HcArgs& a) override { in_->hc_pre(a); }
  void hc_post(float* h, const float* f, const float* post, const float* comb, int64_t S, int n,
               int D) override {
    in_->hc_post(h, f, post, comb, S, n, D);
  }
  void hc_head(const float* h, const float* fn, const float* base, const float* scale, int64_t S,
               int n, int D, float re, float he, float* y) override {
    in_->hc_head(h, fn, base, scale, S, n, D, re, he, y);
  }
  void compress_pool(const ops::CompressArgs& a) override { in_->compress_pool(a); }
  void indexer_topk(const ops::IndexerArgs& a) override { in_->indexer_topk(a); }
  void sparse_attention(const ops::AttentionArgs& a) override { in_->sparse_attention(a); }
  void route(const ops::RouteArgs& a) override { in_->route(a); }
  void moe_experts(const ops::MoeArgs& a) override { in_->moe_experts(a); }
  void build_decode_plan(const ops::DecodePlanArgs& a) override { in_->build_decode_plan(a); }
  bool supports_graphs() const override { return in_->supports_graphs(); }
  std::unique_ptr<ops::Graph> capture(const std::function<void()>& body) override {
    return in_->capture(body);
  }

  bool sample(const ops::SampleArgs& a) override {
    if (a.n_rows == 0) return true;
    ++calls;
    std::vector<float> sc;
    std::vector<int32_t> si;
    for (int64_t r = 0; r < a.n_rows; ++r) {
      SamplingParams sp;
      sp.temperature = 0.0f;
      uint64_t seed = 0;
      int64_t step = 0;
      bool lp_row = a.out_logprob != nullptr;
      if (a.params) {
        const ops::SampleRowParams& p = a.params[r];
        if (!a.all_greedy) {
          sp.temperature = p.temperature;
          sp.top_k = p.top_k;
          sp.top_p = p.top_p;
          sp.min_p = p.min_p;
        }
        seed = p.seed;
        step = p.step;
        lp_row = lp_row && p.logprobs != 0;
      }
      sp.logprobs = lp_row;
      sp.top_logprobs = a.top_n;
      all_greedy_rows += a.all_greedy ? 1 : 0;
      TokenLogprobs lp;
      a.out_tokens[r] =
          sample_token(a.logits + r * a.vocab, a.vocab, sp, seed, step, {}, &lp, &sc, &si);
      ++rows;
      if (!lp_row) continue;
      a.out_logprob[r] = lp.logprob;
      for (int32_t j = 0; j < a.top_n; ++j) {
        const bool have = size_t(j) < lp.top.size();
        a.out_top_tokens[r * a.top_n + j] = have ? lp.top[size_t(j)].token : -1;
        a.out_top_logprobs[r * a.top_n + j] = have ? lp.top[size_t(j)].logprob : kNaN;
      }
    }
    return true;
  }
  int64_t calls = 0, rows = 0, all_greedy_rows = 0;

 private:
  std::unique_ptr<ops::Ops> in_;
};

TEST(DeviceSampling, ModelHeadSamplesOnTheBackendLikeHostSampling) {
  const std::string dir = std::string(V4_SOURCE_DIR) + "/tests/fixtures/tiny-kinds-fp32";
  ASSERT_TRUE(std::filesystem::exists(dir + "/config.json")) << dir;
  ModelExecutorOptions mo;
  mo.kv_budget_bytes = int64_t(64) << 20;
  mo.max_sequences = 16;
  mo.max_chunk_tokens = 29;
  EngineConfig ec;
  ec.chunked_prefill_size = 29;
  ec.max_running_requests = 10;

  // device_plan: decode-only steps take the model's decode fast path (plan op, eager on the
  // CPU), whose output stage is separate from the host-planned path's head.
  // ops_counts (calls, rows) is read before the executor (which owns the wrapper) is destroyed.
  auto run = [&](bool wrap, bool device_plan, std::pair<int64_t, int64_t>* ops_counts,
                 int64_t* decode_steps) {
    HostSamplingOps* wrapper = nullptr;
    std::unique_ptr<ops::Ops> ops = ops::make_cpu_ops();
    if (wrap) {
      auto w = std::make_unique<HostSamplingOps>(std::move(ops));
      wrapper = w.get();
      ops = std::move(w);
    }
    auto model = model::DeepseekV4::load(dir, ops.get());
    EXPECT_TRUE(model.ok()) << model.status().to_string();
    const int64_t V = (*model)->config().vocab_size;
    auto opt = (*model)->decode_options();
    opt.device_plan = device_plan;
    (*model)->set_decode_options(opt);
    auto exec = ModelExecutor::create(std::move(ops), std::move(model).value(), mo);
    EXPECT_TRUE(exec.ok()) << exec.status().to_string();
    const auto reqs = mixed_requests(V, 14, 11);
    auto got = run_all(**exec, ec, reqs, nullptr);
    if (decode_steps) *decode_steps = (*exec)->model().decode_stats().device_plan_steps;
    if (ops_counts && wrapper) *ops_counts = {int64_t(wrapper->calls), int64_t(wrapper->rows)};
    return got;
  };
  const auto want = run(false, false, nullptr, nullptr);
  for (bool device_plan : {false, true}) {
    SCOPED_TRACE(device_plan ? "decode fast path" : "host-planned steps");
    std::pair<int64_t, int64_t> counts{-1, -1};
    int64_t decode_steps = 0;
    const auto got = run(true, device_plan, &counts, &decode_steps);
    expect_same(want, got);
    EXPECT_GT(counts.first, 10);   // sample() calls
    EXPECT_GT(counts.second, 60);  // rows sampled on the "device"
    if (device_plan) {
      EXPECT_GT(decode_steps, 5);
    }
  }
}

TEST(DeviceSampling, OptionOffKeepsLogitsPath) {
  const std::string dir = std::string(V4_SOURCE_DIR) + "/tests/fixtures/tiny-kinds-fp32";
  auto w = std::make_unique<HostSamplingOps>(ops::make_cpu_ops());
  HostSamplingOps* dev_ops = w.get();
  auto model = model::DeepseekV4::load(dir, w.get());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  ModelExecutorOptions mo;
  mo.kv_budget_bytes = int64_t(32) << 20;
  mo.max_sequences = 4;
  mo.device_sampling = false;
  auto exec = ModelExecutor::create(std::move(w), std::move(model).value(), mo);
  ASSERT_TRUE(exec.ok()) << exec.status().to_string();
  const auto got = run_all(**exec, EngineConfig{}, mixed_requests(256, 4, 3), nullptr);
  EXPECT_EQ(got.size(), 4u);
  EXPECT_EQ(dev_ops->calls, 0);
}

}  // namespace
}  // namespace v4::engine
