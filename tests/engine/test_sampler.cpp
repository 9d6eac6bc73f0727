#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "engine/sampler.h"

namespace v4::engine {
namespace {

// logits = log(p) for a hand-made distribution, so softmax gives p back.
std::vector<float> log_of(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back(float(std::log(x)));
  return l;
}

SamplingParams sampled(float t = 1.0f) {
  SamplingParams p;
  p.temperature = t;
  return p;
}

void expect_dist(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << "token " << i;
}

const std::vector<double> kP = {0.05, 0.40, 0.10, 0.25, 0.15, 0.05};  // sorted: 1,3,4,2,0,5

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  SamplingParams p = sampled(0.0f);
  PenaltyState st;
  std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f};
  std::vector<float> s;
  std::vector<int32_t> si;
  EXPECT_EQ(sample_token(l.data(), 4, p, 1, 0, st, nullptr, &s, &si), 1);
  l[3] = 3.5f;
  EXPECT_EQ(sample_token(l.data(), 4, p, 1, 0, st, nullptr, &s, &si), 3);
}

TEST(Sampler, TemperaturesBelowEpsilonAreGreedy) {
  for (float t : {1e-38f, 1e-20f, 9.9e-6f}) {
    SamplingParams p = sampled(t);
    normalize_sampling(&p);
    EXPECT_EQ(p.temperature, 0.0f) << t;
  }
  for (float t : {0.0f, 1e-5f, 0.5f, 2.0f}) {
    SamplingParams p = sampled(t);
    normalize_sampling(&p);
    EXPECT_EQ(p.temperature, t);
  }
}

TEST(Sampler, TemperatureOneKeepsDistribution) {
  auto l = log_of(kP);
  expect_dist(sampling_distribution(l.data(), 6, sampled(), {}), kP);
}

TEST(Sampler, TemperatureSharpens) {
  auto l = log_of(kP);
  // T = 0.5 squares the probabilities (then renormalizes).
  std::vector<double> want;
  double z = 0;
  for (double x : kP) z += x * x;
  for (double x : kP) want.push_back(x * x / z);
  expect_dist(sampling_distribution(l.data(), 6, sampled(0.5f), {}), want);
}

TEST(Sampler, TopK) {
  auto l = log_of(kP);
  SamplingParams p = sampled();
  p.top_k = 2;  // tokens 1 (0.40) and 3 (0.25)
  expect_dist(sampling_distribution(l.data(), 6, p, {}), {0, 0.40 / 0.65, 0, 0.25 / 0.65, 0, 0});
}

TEST(Sampler, TopP) {
  auto l = log_of(kP);
  SamplingParams p = sampled();
  p.top_p = 0.7f;  // 0.40 + 0.25 = 0.65 < 0.7, + 0.15 = 0.80 >= 0.7: keep 1, 3, 4
  expect_dist(sampling_distribution(l.data(), 6, p, {}), {0, 0.5, 0, 0.3125, 0.1875, 0});
  p.top_p = 0.3f;  // the top token alone reaches 0.3
  expect_dist(sampling_distribution(l.data(), 6, p, {}), {0, 1, 0, 0, 0, 0});
}

TEST(Sampler, MinP) {
  auto l = log_of(kP);
  SamplingParams p = sampled();
  p.min_p = 0.3f;  // threshold 0.12: keep 0.40, 0.25, 0.15
  expect_dist(sampling_distribution(l.data(), 6, p, {}), {0, 0.5, 0, 0.3125, 0.1875, 0});
  p.min_p = 0.5f;  // threshold 0.20: keep 0.40, 0.25
  expect_dist(sampling_distribution(l.data(), 6, p, {}), {0, 0.40 / 0.65, 0, 0.25 / 0.65, 0, 0});
}

TEST(Sampler, TopKThenTopP) {
  auto l = log_of(kP);
  SamplingParams p = sampled();
  p.top_k = 3;     // 1, 3, 4 renormalized: 0.5, 0.3125, 0.1875
  p.top_p = 0.8f;  // 0.5 + 0.3125 = 0.8125 >= 0.8: keep 1, 3
  expect_dist(sampling_distribution(l.data(), 6, p, {}), {0, 0.40 / 0.65, 0, 0.25 / 0.65, 0, 0});
}

// Large vocabularies: the incremental top-p selection must keep exactly the set a full sort
// keeps, also when the nucleus holds thousands of tokens.
TEST(Sampler, TopPLargeVocabMatchesFullSort) {
  std::mt19937 rng(3);
  for (float spread : {0.5f, 3.0f, 12.0f}) {
    const int64_t V = 20000;
    std::vector<float> l(static_cast<size_t>(V));
    std::normal_distribution<float> nd(0.0f, spread);
    for (auto& x : l) x = nd(rng);
    for (float top_p : {0.5f, 0.9f, 0.99f}) {
      SamplingParams p = sampled();
      p.top_p = top_p;
      auto got = sampling_distribution(l.data(), V, p, {});
      // Reference: full sort by probability (ties by id), smallest prefix reaching top_p.
      std::vector<int32_t> idx(static_cast<size_t>(V));
      std::iota(idx.begin(), idx.end(), 0);
      std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
        return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b);
      });
      const float mx = l[size_t(idx[0])];
      double z = 0;
      for (float x : l) z += std::exp(double(x - mx));
      double cum = 0;
      size_t keep = 0;
      while (keep < idx.size()) {
        cum += std::exp(double(l[size_t(idx[keep])] - mx)) / z;
        ++keep;
        if (cum >= top_p) break;
      }
      size_t nonzero = 0;
      for (float g : got) nonzero += g > 0.0f;
      EXPECT_NEAR(double(nonzero), double(keep), 1.0) << "spread " << spread << " top_p " << top_p;
      for (size_t k = 0; k + 1 < keep; ++k)  // (the boundary token may differ by rounding)
        EXPECT_GT(got[size_t(idx[k])], 0.0f) << k;
      if (spread == 0.5f && top_p >= 0.9f) {
        EXPECT_GT(keep, 1000u);  // exercises m > 256
      }
    }
  }
}

TEST(Sampler, PresenceAndFrequencyPenalties) {
  std::vector<float> l = {0.0f, 0.0f, 0.0f};
  SamplingParams p = sampled();
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  PenaltyState st;
  st.output_counts[1] = 2;  // logit 0 - 0.5 - 0.5 = -1
  auto d = sampling_distribution(l.data(), 3, p, st);
  const double z = 2.0 + std::exp(-1.0);
  expect_dist(d, {1 / z, std::exp(-1.0) / z, 1 / z});
}

TEST(Sampler, RepetitionPenalty) {
  std::vector<float> l = {2.0f, -1.0f, 0.0f};
  SamplingParams p = sampled(0.0f);
  p.repetition_penalty = 4.0f;
  PenaltyState st;
  st.prompt_tokens_unique = {0};  // 2.0 -> 0.5; token 2 (0.0) still below, token 0 still wins
  std::vector<float> s;
  std::vector<int32_t> si;
  EXPECT_EQ(sample_token(l.data(), 3, p, 1, 0, st, nullptr, &s, &si), 0);
  l[2] = 0.75f;  // now above the penalized 0.5
  EXPECT_EQ(sample_token(l.data(), 3, p, 1, 0, st, nullptr, &s, &si), 2);
}

// logit_bias is added to the raw logits before the penalties and the temperature: it moves the
// greedy choice and reshapes the sampled distribution; ids outside the vocabulary and values
// outside [-100, 100] are refused.
TEST(Sampler, LogitBias) {
  std::vector<float> l = {2.0f, -1.0f, 0.0f};
  SamplingParams p = sampled(0.0f);
  PenaltyState st;
  std::vector<float> s;
  std::vector<int32_t> si;
  EXPECT_EQ(sample_token(l.data(), 3, p, 1, 0, st, nullptr, &s, &si), 0);
  p.logit_bias = {{2, 2.5f}};  // 0.0 + 2.5 > 2.0
  EXPECT_EQ(sample_token(l.data(), 3, p, 1, 0, st, nullptr, &s, &si), 2);
  p.logit_bias = {{0, -100.0f}};  // bans the argmax: token 2 (0.0) beats token 1 (-1.0)
  EXPECT_EQ(sample_token(l.data(), 3, p, 1, 0, st, nullptr, &s, &si), 2);
  // Sampled: softmax of the biased logits; logprobs stay those of the raw logits.
  std::vector<float> flat = {0.0f, 0.0f, 0.0f};
  SamplingParams q = sampled(1.0f);
  q.logit_bias = {{1, float(std::log(2.0))}};
  expect_dist(sampling_distribution(flat.data(), 3, q, st), {0.25, 0.5, 0.25});
  q.logprobs = true;
  TokenLogprobs lp;
  const int32_t tok = sample_token(flat.data(), 3, q, 7, 0, st, &lp, &s, &si);
  EXPECT_NEAR(lp.logprob, std::log(1.0 / 3.0), 1e-5) << tok;
  // Validation.
  SamplingParams v;
  v.logit_bias = {{10, 1.0f}};
  EXPECT_FALSE(validate_sampling(v, 10).ok());
  v.logit_bias = {{9, 100.5f}};
  EXPECT_FALSE(validate_sampling(v, 10).ok());
  v.logit_bias = {{9, -100.0f}};
  EXPECT_TRUE(validate_sampling(v, 10).ok());
  v.logit_bias = {{9, 1.0f}, {3, 1.0f}, {9, -1.0f}};  // one id twice
  EXPECT_FALSE(validate_sampling(v, 10).ok());
}

TEST(Sampler, SeedDeterminismAndVariety) {
  std::vector<double> flat(50, 1.0 / 50);
  auto l = log_of(flat);
  SamplingParams p = sampled();
  std::vector<float> s;
  std::vector<int32_t> si;
  std::vector<int32_t> a, b, c;
  for (int step = 0; step < 64; ++step) {
    a.push_back(sample_token(l.data(), 50, p, 1234, step, {}, nullptr, &s, &si));
    b.push_back(sample_token(l.data(), 50, p, 1234, step, {}, nullptr, &s, &si));
    c.push_back(sample_token(l.data(), 50, p, 99, step, {}, nullptr, &s, &si));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::map<int32_t, int> distinct;
  for (int32_t t : a) ++distinct[t];
  EXPECT_GT(distinct.size(), 20u);  // a uniform draw over 50 tokens, 64 times
}

TEST(Sampler, EmpiricalFrequenciesMatchDistribution) {
  auto l = log_of(kP);
  SamplingParams p = sampled();
  p.top_k = 4;  // 1, 3, 4, 2 -> 0.40, 0.25, 0.15, 0.10 over 0.90
  auto want = sampling_distribution(l.data(), 6, p, {});
  std::vector<float> s;
  std::vector<int32_t> si;
  std::vector<int> count(6, 0);
  const int n = 40000;
  for (int i = 0; i < n; ++i)
    ++count[size_t(sample_token(l.data(), 6, p, 7, i, {}, nullptr, &s, &si))];
  for (int t = 0; t < 6; ++t) EXPECT_NEAR(double(count[size_t(t)]) / n, want[size_t(t)], 0.01) << t;
  EXPECT_EQ(count[0], 0);
  EXPECT_EQ(count[5], 0);
}

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  auto l = log_of(kP);
  SamplingParams p = sampled(0.0f);  // greedy: token 1
  p.logprobs = true;
  p.top_logprobs = 3;
  p.presence_penalty = 2.0f;  // must not change the reported logprobs
  PenaltyState st;
  st.output_counts[1] = 1;
  std::vector<float> s;
  std::vector<int32_t> si;
  TokenLogprobs lp;
  int32_t tok = sample_token(l.data(), 6, p, 1, 0, st, &lp, &s, &si);
  EXPECT_EQ(tok, 3);  // 1 penalized by 2 nats falls below 3
  EXPECT_EQ(lp.token, 3);
  EXPECT_NEAR(lp.logprob, std::log(0.25), 1e-5);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].token, 1);
  EXPECT_NEAR(lp.top[0].logprob, std::log(0.40), 1e-5);
  EXPECT_EQ(lp.top[1].token, 3);
  EXPECT_EQ(lp.top[2].token, 4);
  EXPECT_NEAR(lp.top[2].logprob, std::log(0.15), 1e-5);
}

TEST(Sampler, ValidateRejectsBadValues) {
  SamplingParams p;
  EXPECT_TRUE(validate_sampling(p, 10).ok());
  p.top_p = 0.0f;
  EXPECT_FALSE(validate_sampling(p, 10).ok());
  p = {};
  p.temperature = -1.0f;
  EXPECT_FALSE(validate_sampling(p, 10).ok());
  p = {};
  p.max_tokens = 0;
  EXPECT_FALSE(validate_sampling(p, 10).ok());
  p = {};
  p.stop_token_ids = {10};
  Status st = validate_sampling(p, 10);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("stop_token_ids"), std::string::npos);
  p = {};
  p.top_logprobs = 21;
  EXPECT_FALSE(validate_sampling(p, 10).ok());
}

}  // namespace
}  // namespace v4::engine
