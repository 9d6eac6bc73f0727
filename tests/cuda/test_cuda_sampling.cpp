// GPU tests of the device sampler (ops/cuda/sampling.h, Ops::sample) against the CPU sampler
// (engine/sampler.h, sample_token / sampling_distribution), the reference it must follow:
// - greedy = CPU argmax (ties → lowest id, NaN ignored, all-NaN → 0, −inf rows, ±0, misaligned
//   rows and odd vocabularies);
// - 2,000 random (logits, params, seed, step) with separated logits: device token == CPU token,
//   with the histogram cut and with full sorts;
// - general logits: the device token is always in the CPU's kept set (top-k/top-p/min-p) and
//   almost always equal to the CPU token;
// - the empirical distribution over 20,000 seeds matches sampling_distribution (chi-square);
// - batch invariance (a row alone vs inside a batch of 100), logprobs vs the CPU, CUDA-graph
//   capture and replay with new inputs, the CudaOps entry point;
// - the engine over the real model on the CUDA backend (decode graphs included): device
//   sampling on gives the tokens and logprobs of device sampling off (same GPU logits);
// timings are printed.
// Inputs are fresh each run (seed printed; V4_TEST_SEED reproduces). Outputs are poisoned.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "engine/model_executor.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/sampling.h"
#include "ops/ops.h"

namespace v4::cuda {
namespace {

using engine::SamplingParams;
using engine::TokenLogprobs;
using ops::SampleArgs;
using ops::SampleRowParams;
using testing::Dev;
using testing::rng;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int64_t kVocab = 129280;  // DeepSeek-V4

#define CHECK_OK(expr)                      \
  do {                                      \
    ::v4::Status _s = (expr);               \
    ASSERT_TRUE(_s.ok()) << _s.to_string(); \
  } while (0)

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() {
    if (s) cudaStreamDestroy(s);
  }
};

double uni(double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng());
}
int64_t rint64(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng());
}
bool coin(double p) {
  return uni(0, 1) < p;
}

SamplingParams to_sp(const SampleRowParams& p) {
  SamplingParams sp;
  sp.temperature = p.temperature;
  sp.top_k = p.top_k;
  sp.top_p = p.top_p;
  sp.min_p = p.min_p;
  return sp;
}

std::string describe(const SampleRowParams& p) {
  char b[200];
  std::snprintf(b, sizeof b, "T=%g top_k=%d top_p=%g min_p=%g seed=%llu step=%lld", p.temperature,
                p.top_k, p.top_p, p.min_p, (unsigned long long)p.seed, (long long)p.step);
  return b;
}

/// The CPU sampler's token for one row (and its raw logprobs when lp != nullptr).
int32_t cpu_token(const float* row, int64_t V, const SampleRowParams& p,
                  TokenLogprobs* lp = nullptr, int top_n = 0) {
  SamplingParams sp = to_sp(p);
  sp.logprobs = lp != nullptr;
  sp.top_logprobs = top_n;
  std::vector<float> sc;
  std::vector<int32_t> si;
  return engine::sample_token(row, V, sp, p.seed, p.step, {}, lp, &sc, &si);
}

SampleRowParams random_params(int64_t V, double p_greedy = 0.1) {
  SampleRowParams p;
  p.seed = rng()();
  p.step = rint64(0, 1000000);
  if (coin(p_greedy)) return p;  // temperature 0
  p.temperature = float(uni(0.3, 1.5));
  const int64_t ks[] = {0, 0, 0, 1, 3, 10, 50, 1000, V - 1, V + 3};
  p.top_k = int32_t(std::clamp<int64_t>(ks[rint64(0, 9)], 0, int64_t(1) << 30));
  p.top_p = coin(0.5) ? 1.0f : float(uni(0.3, 0.99));
  p.min_p = coin(0.6) ? 0.0f : float(uni(0.01, 0.3));
  return p;
}

/// Mass on H "head" tokens whose logits sit on a 0.37-spaced grid (some exactly tied), every other
/// logit ≥ 40 below (a few −inf): weights and cumulative sums are far apart relative to f32/f64
/// rounding, so the device must give the CPU's token exactly.
std::vector<float> separated_row(int64_t V) {
  const int64_t H = rint64(1, std::min<int64_t>(64, V));
  const float base = float(uni(-5, 20));
  std::vector<int> levels(60);
  for (int i = 0; i < 60; ++i) levels[size_t(i)] = i;
  std::shuffle(levels.begin(), levels.end(), rng());
  std::vector<float> head;
  float head_min = base;
  for (int64_t h = 0; h < H; ++h) {
    float v = base - 0.37f * float(levels[size_t(h % 60)]);
    if (h > 0 && coin(0.2)) v = head[size_t(rint64(0, h - 1))];  // exact tie
    head.push_back(v);
    head_min = std::min(head_min, v);
  }
  std::vector<float> row(static_cast<size_t>(V));
  for (auto& x : row) x = coin(0.01) ? -kInf : head_min - 40.0f - float(uni(0, 10));
  std::vector<int64_t> pos(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) pos[size_t(i)] = i;
  for (int64_t h = 0; h < H; ++h) {  // partial Fisher-Yates: H distinct positions
    std::swap(pos[size_t(h)], pos[size_t(rint64(h, V - 1))]);
    row[size_t(pos[size_t(h)])] = head[size_t(h)];
  }
  return row;
}

struct DevOut {
  std::vector<int32_t> tokens, top_tokens;
  std::vector<float> logprob, top_logprobs;
};

/// Runs the device sampler on host inputs (rows start `misalign` floats past a 256-byte boundary).
DevOut run_device(DeviceSampler& ds, cudaStream_t st, const std::vector<float>& logits, int64_t V,
                  const std::vector<SampleRowParams>* params, bool all_greedy,
                  bool logprobs = false, int top_n = 0, size_t misalign = 0) {
  const int64_t R = int64_t(logits.size()) / V;
  Dev<float> dl(logits.size() + misalign);
  EXPECT_EQ(cudaMemcpy(dl.p + misalign, logits.data(), logits.size() * sizeof(float),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the sampler's non-blocking stream
  Dev<SampleRowParams> dp(params ? *params : std::vector<SampleRowParams>{});
  Dev<int32_t> dt(static_cast<size_t>(R)), dtt(size_t(R * top_n));
  Dev<float> dlp(static_cast<size_t>(R)), dtlp(size_t(R * top_n));
  dt.poison();
  dtt.poison();
  dlp.poison();
  dtlp.poison();
  SampleArgs a;
  a.logits = dl.p + misalign;
  a.params = params ? dp.p : nullptr;
  a.n_rows = R;
  a.vocab = V;
  a.all_greedy = all_greedy;
  a.out_tokens = dt.p;
  if (logprobs) {
    a.out_logprob = dlp.p;
    a.top_n = top_n;
    a.out_top_tokens = top_n ? dtt.p : nullptr;
    a.out_top_logprobs = top_n ? dtlp.p : nullptr;
  }
  const Status s = ds.run(a, st);
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return {dt.host(), dtt.host(), dlp.host(), dtlp.host()};
}

// ---- greedy
// ---------------------------------------------------------------------------------------

// R = 37 rows of 12 cases, then one row per case (R = 1; and R = 3): the few-row calls of a
// large vocabulary take the chunked greedy kernel (V = 129,280: 31 chunks at R = 1, 7 at R =
// 37; 8,192 + 3: 2 chunks), the others one block per row; both must give the CPU argmax.
TEST(CudaSampling, GreedyEqualsCpuArgmax) {
  V4_REQUIRE_GPU();
  Stream st;
  DeviceSampler ds;
  for (int64_t V : {int64_t(1), int64_t(7), int64_t(1001), int64_t(4099), int64_t(8195), kVocab})
  for (int64_t R : {int64_t(37), int64_t(3), int64_t(1)})
  for (int first : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}) {
    if (R == 37 && first > 0) continue;  // 37 rows already hold every case
    for (size_t misalign : {size_t(0), size_t(1), size_t(3)}) {
      std::vector<float> l = testing::randn(size_t(R * V), 3.0f);
      for (int64_t r = 0; r < R; ++r) {
        float* row = l.data() + r * V;
        const int64_t amax = std::max_element(row, row + V) - row;
        switch ((r + first) % 12) {
          case 1:  // tie with a lower and a higher id
            row[rint64(0, V - 1)] = row[amax];
            row[rint64(0, V - 1)] = row[amax];
            break;
          case 2:
            std::fill(row, row + V, -kInf);
            break;
          case 3:
            std::fill(row, row + V, kNaN);
            break;
          case 4:  // NaNs everywhere but a few values
            for (int64_t i = 0; i < V; ++i)
              if (coin(0.7)) row[i] = kNaN;
            break;
          case 5:  // a NaN right before the maximum
            if (amax > 0) row[amax - 1] = kNaN;
            break;
          case 6:
            row[rint64(0, V - 1)] = kInf;
            row[rint64(0, V - 1)] = kInf;
            break;
          case 7:  // ±0 tie as the maximum
            for (int64_t i = 0; i < V; ++i) row[i] = -std::fabs(row[i]) - 1.0f;
            row[rint64(0, V - 1)] = -0.0f;
            row[rint64(0, V - 1)] = 0.0f;
            break;
          case 8:
            std::fill(row, row + V, 1.25f);
            break;
          case 9:
            std::fill(row, row + V, kNaN);
            row[rint64(0, V - 1)] = -kInf;
            break;
          default:
            break;
        }
      }
      std::vector<SampleRowParams> prm(static_cast<size_t>(R));  // temperature 0
      for (auto& p : prm) p.seed = rng()();
      for (bool all_greedy : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "V=" << V << " R=" << R << " first case " << first
                                          << " misalign=" << misalign
                                          << " all_greedy=" << all_greedy);
        DevOut d =
            run_device(ds, st.s, l, V, all_greedy ? nullptr : &prm, all_greedy, false, 0, misalign);
        int bad = 0;
        for (int64_t r = 0; r < R; ++r) {
          const int32_t want = cpu_token(l.data() + r * V, V, prm[size_t(r)]);
          if (d.tokens[size_t(r)] != want && ++bad <= 5)
            ADD_FAILURE() << "row " << r << " (case " << (r + first) % 12 << "): device "
                          << d.tokens[size_t(r)] << " cpu " << want;
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

// ---- sampled rows vs the CPU sampler
// -------------------------------------------------------------

TEST(CudaSampling, SampledEqualsCpuOnSeparatedLogits) {
  V4_REQUIRE_GPU();
  Stream st;
  DeviceSampler ds;
  int cases = 0, mismatches = 0;
  int64_t by_mode[4] = {};  // greedy, id-order, top-k, top-p only
  for (int call = 0; call < 20; ++call) {
    const int64_t V = call < 2 ? kVocab : rint64(100, 20000);
    const int64_t R = 100;
    std::vector<float> l;
    l.reserve(size_t(R * V));
    std::vector<SampleRowParams> prm;
    for (int64_t r = 0; r < R; ++r) {
      const auto row = separated_row(V);
      l.insert(l.end(), row.begin(), row.end());
      prm.push_back(random_params(V));
      const auto& p = prm.back();
      const bool k = p.top_k > 0 && p.top_k < V, tp = p.top_p < 1.f;
      ++by_mode[p.temperature == 0.f ? 0 : k ? 2 : tp ? 3 : 1];
    }
    std::vector<int32_t> want(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r)
      want[size_t(r)] = cpu_token(l.data() + r * V, V, prm[size_t(r)]);
    for (bool prefilter : {true, false}) {
      ds.set_prefilter(prefilter);
      DevOut d = run_device(ds, st.s, l, V, &prm, false);
      for (int64_t r = 0; r < R; ++r) {
        ++cases;
        const int32_t got = d.tokens[size_t(r)], w = want[size_t(r)];
        if (got == w) continue;
        ++mismatches;
        if (mismatches <= 10) {
          const auto dist =
              engine::sampling_distribution(l.data() + r * V, V, to_sp(prm[size_t(r)]), {});
          ADD_FAILURE() << "V=" << V << " row " << r << " prefilter=" << prefilter << " "
                        << describe(prm[size_t(r)]) << ": device " << got
                        << " (p=" << (got >= 0 && got < V ? dist[size_t(got)] : -1.f) << ") cpu "
                        << w << " (p=" << dist[size_t(w)] << ")";
        }
      }
    }
  }
  ds.set_prefilter(true);
  std::printf(
      "[sampling] %d cases (x2 prefilter on/off), %d mismatches; rows: %lld greedy, %lld "
      "id-order, %lld top-k, %lld top-p only\n",
      cases / 2, mismatches, (long long)by_mode[0], (long long)by_mode[1], (long long)by_mode[2],
      (long long)by_mode[3]);
  EXPECT_EQ(mismatches, 0);
}

TEST(CudaSampling, TokenInCpuKeptSetOnGeneralLogits) {
  V4_REQUIRE_GPU();
  Stream st;
  DeviceSampler ds;
  int total = 0, equal = 0, outside = 0;
  for (int call = 0; call < 3; ++call) {
    const int64_t V = kVocab, R = 100;
    std::vector<float> l;
    std::vector<SampleRowParams> prm;
    for (int64_t r = 0; r < R; ++r) {
      const auto row = testing::randn(size_t(V), float(uni(0.5, 5.0)));
      l.insert(l.end(), row.begin(), row.end());
      SampleRowParams p = random_params(V, 0.0);
      if (r % 4 == 0) p.top_p = float(uni(0.5, 0.99));  // more top-p rows, some flat
      prm.push_back(p);
    }
    DevOut d = run_device(ds, st.s, l, V, &prm, false);
    for (int64_t r = 0; r < R; ++r) {
      const float* row = l.data() + r * V;
      const int32_t got = d.tokens[size_t(r)];
      ++total;
      equal += got == cpu_token(row, V, prm[size_t(r)]);
      const auto dist = engine::sampling_distribution(row, V, to_sp(prm[size_t(r)]), {});
      if (got < 0 || got >= V || dist[size_t(got)] <= 0.f) {
        ++outside;
        if (outside <= 10)
          ADD_FAILURE() << "row " << r << " " << describe(prm[size_t(r)]) << ": device token "
                        << got << " is outside the CPU's kept set";
      }
    }
  }
  std::printf(
      "[sampling] general logits: %d rows, %d equal to the CPU token, %d outside the kept "
      "set\n",
      total, equal, outside);
  EXPECT_EQ(outside, 0);
  EXPECT_GE(equal, total * 9 / 10) << "systematic difference in the draw";
}

TEST(CudaSampling, EmpiricalDistributionMatches) {
  V4_REQUIRE_GPU();
  Stream st;
  DeviceSampler ds;
  const int64_t V = 1000, N = 20000;
  const std::vector<float> row = testing::randn(size_t(V), 1.5f);
  struct Cfg {
    float t, top_p, min_p;
    int32_t top_k;
  };
  const Cfg cfgs[] = {{1.0f, 1.0f, 0.0f, 0},
                      {0.7f, 1.0f, 0.0f, 20},
                      {1.2f, 0.8f, 0.0f, 0},
                      {1.0f, 1.0f, 0.05f, 0},
                      {0.9f, 0.9f, 0.02f, 50}};
  std::vector<float> l(size_t(N * V));
  for (int64_t r = 0; r < N; ++r) std::copy(row.begin(), row.end(), l.begin() + r * V);
  for (const Cfg& c : cfgs) {
    SampleRowParams p;
    p.temperature = c.t;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.top_k = c.top_k;
    p.step = 3;
    const uint64_t base = rng()();
    std::vector<SampleRowParams> prm(size_t(N), p);
    for (int64_t r = 0; r < N; ++r) prm[size_t(r)].seed = base + uint64_t(r);
    SCOPED_TRACE(describe(p));
    DevOut d = run_device(ds, st.s, l, V, &prm, false);
    const auto dist = engine::sampling_distribution(row.data(), V, to_sp(p), {});
    std::vector<int64_t> count(size_t(V), 0);
    for (int32_t t : d.tokens) {
      ASSERT_TRUE(t >= 0 && t < V) << t;
      ++count[size_t(t)];
    }
    double chi2 = 0, rest_e = 0;
    int64_t rest_o = 0, df = -1, zero_hits = 0;
    for (int64_t i = 0; i < V; ++i) {
      const double e = double(N) * dist[size_t(i)];
      if (dist[size_t(i)] == 0.f) zero_hits += count[size_t(i)];
      if (e >= 5) {
        chi2 += (count[size_t(i)] - e) * (count[size_t(i)] - e) / e;
        ++df;
      } else {
        rest_e += e;
        rest_o += count[size_t(i)];
      }
    }
    if (rest_e >= 5) {
      chi2 += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
      ++df;
    }
    const double bound = df + 5.0 * std::sqrt(2.0 * std::max<int64_t>(df, 1)) + 10;
    std::printf("[sampling] %s: chi2 = %.1f over %lld dof (bound %.1f)\n", describe(p).c_str(),
                chi2, (long long)df, bound);
    EXPECT_EQ(zero_hits, 0) << "tokens outside the kept set were drawn";
    EXPECT_LT(chi2, bound);
  }
}

TEST(CudaSampling, RowAloneEqualsRowInABatch) {
  V4_REQUIRE_GPU();
  Stream st;
  DeviceSampler ds;
  const int64_t V = kVocab, B = 100;
  std::vector<float> batch;
  std::vector<SampleRowParams> prm;
  for (int64_t r = 0; r < B; ++r) {
    const auto row = testing::randn(size_t(V), float(uni(0.5, 4.0)));
    batch.insert(batch.end(), row.begin(), row.end());
    prm.push_back(random_params(V, 0.2));
    prm.back().logprobs = coin(0.5);
  }
  DevOut all = run_device(ds, st.s, batch, V, &prm, false, true, 5);
  for (int k = 0; k < 20; ++k) {
    const int64_t r = rint64(0, B - 1);
    std::vector<float> one(batch.begin() + r * V, batch.begin() + (r + 1) * V);
    std::vector<SampleRowParams> p1 = {prm[size_t(r)]};
    DevOut alone = run_device(ds, st.s, one, V, &p1, false, true, 5);
    EXPECT_EQ(alone.tokens[0], all.tokens[size_t(r)]) << "row " << r << " " << describe(p1[0]);
    if (p1[0].logprobs) {
      EXPECT_EQ(alone.logprob[0], all.logprob[size_t(r)]) << "row " << r;
      for (int j = 0; j < 5; ++j)
        EXPECT_EQ(alone.top_tokens[size_t(j)], all.top_tokens[size_t(r * 5 + j)]) << "row " << r;
    }
  }
}

TEST(CudaSampling, LogprobsEqualCpu) {
  V4_REQUIRE_GPU();
  Stream st;
  DeviceSampler ds;
  for (int64_t V : {int64_t(5003), kVocab}) {
    for (int top_n : {0, 5, 20}) {
      const int64_t R = 30;
      std::vector<float> l;  // separated rows: the sampled tokens must be the CPU's
      std::vector<SampleRowParams> prm;
      for (int64_t r = 0; r < R; ++r) {
        const auto row = separated_row(V);
        l.insert(l.end(), row.begin(), row.end());
        prm.push_back(random_params(V, 0.4));
        prm.back().logprobs = r % 5 != 0;
      }
      SCOPED_TRACE(::testing::Message() << "V=" << V << " top_n=" << top_n);
      DevOut d = run_device(ds, st.s, l, V, &prm, false, true, top_n);
      for (int64_t r = 0; r < R; ++r) {
        TokenLogprobs lp;
        const int32_t want = cpu_token(l.data() + r * V, V, prm[size_t(r)], &lp, top_n);
        EXPECT_EQ(d.tokens[size_t(r)], want) << "row " << r << " " << describe(prm[size_t(r)]);
        if (!prm[size_t(r)].logprobs) {  // untouched (poisoned) outputs
          EXPECT_TRUE(std::isnan(d.logprob[size_t(r)])) << "row " << r;
          continue;
        }
        if (d.tokens[size_t(r)] != want) continue;
        EXPECT_NEAR(d.logprob[size_t(r)], lp.logprob, 1e-5) << "row " << r;
        ASSERT_EQ(int(lp.top.size()), top_n);
        for (int j = 0; j < top_n; ++j) {
          EXPECT_EQ(d.top_tokens[size_t(r * top_n + j)], lp.top[size_t(j)].token)
              << "row " << r << " rank " << j;
          EXPECT_NEAR(d.top_logprobs[size_t(r * top_n + j)], lp.top[size_t(j)].logprob, 1e-5)
              << "row " << r << " rank " << j;
        }
      }
    }
  }
}

TEST(CudaSampling, GraphCaptureReplaysWithNewInputs) {
  V4_REQUIRE_GPU();
  Stream st;
  DeviceSampler ds;
  const int64_t V = kVocab, R = 64;
  Dev<float> dl(size_t(R * V));
  Dev<SampleRowParams> dp(static_cast<size_t>(R));
  Dev<int32_t> dt(static_cast<size_t>(R));
  SampleArgs a;
  a.logits = dl.p;
  a.params = dp.p;
  a.n_rows = R;
  a.vocab = V;
  a.out_tokens = dt.p;
  auto fill = [&](std::vector<float>* l, std::vector<SampleRowParams>* prm) {
    l->clear();
    prm->clear();
    for (int64_t r = 0; r < R; ++r) {
      const auto row = r % 2 ? separated_row(V) : testing::randn(size_t(V), 2.0f);
      l->insert(l->end(), row.begin(), row.end());
      prm->push_back(random_params(V, 0.2));
    }
    EXPECT_EQ(cudaMemcpy(dl.p, l->data(), l->size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(dp.p, prm->data(), prm->size() * sizeof(SampleRowParams),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the sampler's non-blocking stream
  };
  std::vector<float> l;
  std::vector<SampleRowParams> prm;
  fill(&l, &prm);
  CHECK_OK(ds.run(a, st.s));  // first call of the shape: allocates
  ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);
  const size_t scratch = ds.scratch_bytes();

  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status cap = ds.run(a, st.s);
  ASSERT_EQ(cudaStreamEndCapture(st.s, &graph), cudaSuccess);
  ASSERT_TRUE(cap.ok()) << cap.to_string();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 3; ++rep) {
    fill(&l, &prm);
    dt.poison();
    ASSERT_EQ(cudaGraphLaunch(exec, st.s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);
    const auto got = dt.host();
    int equal = 0;
    for (int64_t r = 0; r < R; ++r) {
      const float* row = l.data() + r * V;
      const int32_t want = cpu_token(row, V, prm[size_t(r)]);
      equal += got[size_t(r)] == want;
      if (r % 2 == 1 || prm[size_t(r)].temperature == 0.f) {  // separated or greedy: exact
        EXPECT_EQ(got[size_t(r)], want)
            << "replay " << rep << " row " << r << " " << describe(prm[size_t(r)]);
      }
      const auto dist = engine::sampling_distribution(row, V, to_sp(prm[size_t(r)]), {});
      EXPECT_TRUE(got[size_t(r)] >= 0 && got[size_t(r)] < V && dist[size_t(got[size_t(r)])] > 0)
          << "replay " << rep << " row " << r;
    }
    EXPECT_GE(equal, R * 9 / 10);
  }
  EXPECT_EQ(ds.scratch_bytes(), scratch) << "scratch grew after the first call";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(CudaSampling, GrowingDuringCaptureIsAnError) {
  V4_REQUIRE_GPU();
  Stream st;
  DeviceSampler ds;
  const int64_t V = 5000, R = 4;
  Dev<float> dl(testing::randn(size_t(R * V)));
  std::vector<SampleRowParams> prm(static_cast<size_t>(R));
  for (auto& p : prm) p.temperature = 1.0f, p.top_p = 0.9f;
  Dev<SampleRowParams> dp(prm);
  Dev<int32_t> dt(static_cast<size_t>(R));
  SampleArgs a;
  a.logits = dl.p;
  a.params = dp.p;
  a.n_rows = R;
  a.vocab = V;
  a.out_tokens = dt.p;
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status s = ds.run(a, st.s);
  cudaStreamEndCapture(st.s, &graph);
  if (graph) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("capture"), std::string::npos) << s.to_string();
}

TEST(CudaSampling, CudaOpsEntryPoint) {
  V4_REQUIRE_GPU();
  auto ops = ops::make_cuda_ops();
  ASSERT_TRUE(ops.ok()) << ops.status().to_string();
  ops::Ops& o = **ops;
  EXPECT_TRUE(o.sample(SampleArgs{}));  // capability query
  EXPECT_FALSE(ops::make_cpu_ops()->sample(SampleArgs{}));
  const int64_t V = 3001, R = 9;
  std::vector<float> l;
  std::vector<SampleRowParams> prm;
  for (int64_t r = 0; r < R; ++r) {
    const auto row = separated_row(V);
    l.insert(l.end(), row.begin(), row.end());
    prm.push_back(random_params(V, 0.3));
  }
  float* dl = static_cast<float*>(o.alloc(l.size() * 4));
  auto* dp = static_cast<SampleRowParams*>(o.alloc(prm.size() * sizeof(SampleRowParams)));
  auto* dt = static_cast<int32_t*>(o.alloc(size_t(R) * 4));
  o.upload(dl, l.data(), l.size() * 4);
  o.upload(dp, prm.data(), prm.size() * sizeof(SampleRowParams));
  SampleArgs a;
  a.logits = dl;
  a.params = dp;
  a.n_rows = R;
  a.vocab = V;
  a.out_tokens = dt;
  ASSERT_TRUE(o.sample(a));
  std::vector<int32_t> got(static_cast<size_t>(R));
  o.download(got.data(), dt, got.size() * 4);
  for (int64_t r = 0; r < R; ++r)
    EXPECT_EQ(got[size_t(r)], cpu_token(l.data() + r * V, V, prm[size_t(r)])) << "row " << r;
  o.free(dl);
  o.free(dp);
  o.free(dt);
}

// ---- the engine on the CUDA backend: device sampling on == off
// ------------------------------------

// Tokens (and logprobs) of mixed requests through the scheduler over the real model on the CUDA
// backend, with device sampling on and off: the logits are the same GPU logits either way, so
// the tokens must be identical (greedy, seeded top-k/top-p/min-p, penalties on the host path)
// and the logprobs equal to f32 rounding.
std::map<engine::RequestId, std::pair<std::vector<int32_t>, std::vector<TokenLogprobs>>> run_engine(
    const std::string& dir, bool device_sampling) {
  engine::ModelExecutorOptions mo;
  mo.kv_budget_bytes = int64_t(64) << 20;
  mo.max_sequences = 16;
  mo.max_chunk_tokens = 29;
  mo.device_sampling = device_sampling;
  auto exec = engine::ModelExecutor::load(dir, mo, "cuda");
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  std::map<engine::RequestId, std::pair<std::vector<int32_t>, std::vector<TokenLogprobs>>> got;
  if (!exec.ok()) return got;
  engine::EngineConfig ec;
  ec.chunked_prefill_size = 29;
  ec.max_running_requests = 10;
  engine::Scheduler sched(**exec, ec);
  std::mt19937 g(7);
  const int64_t V = (*exec)->vocab_size();
  for (engine::RequestId id = 1; id <= 12; ++id) {
    engine::Request r;
    r.prompt_tokens.resize(size_t(3 + g() % 50));
    for (auto& t : r.prompt_tokens) t = int32_t(g() % uint32_t(V));
    SamplingParams& p = r.sampling;
    p.max_tokens = 8 + int64_t(g() % 10);
    p.ignore_eos = true;
    switch (id % 6) {
      case 0:
        p.temperature = 0.0f;
        break;
      case 1:
        p.temperature = 0.8f;
        p.top_p = 0.9f;
        break;
      case 2:
        p.temperature = 1.1f;
        p.top_k = 7;
        p.logprobs = true;
        p.top_logprobs = 4;
        break;
      case 3:
        p.temperature = 0.9f;
        p.min_p = 0.05f;
        break;
      case 4:
        p.temperature = 0.0f;
        p.logprobs = true;
        p.top_logprobs = 2;
        break;
      case 5:
        p.temperature = 1.0f;
        p.presence_penalty = 0.4f;
        break;  // host path
    }
    sched.add(
        id, r,
        [&got, id](const engine::StepOutput& o) {
          auto& e = got[id];
          e.first.insert(e.first.end(), o.new_tokens.begin(), o.new_tokens.end());
          e.second.insert(e.second.end(), o.logprobs.begin(), o.logprobs.end());
        },
        engine::Clock::now(), 1000 + id);
  }
  for (int n = 0; !sched.idle() && n < 10000; ++n) EXPECT_TRUE(sched.step().ok());
  return got;
}

TEST(CudaSampling, EngineDeviceSamplingEqualsHostSampling) {
  V4_REQUIRE_GPU();
  const std::string dir = std::string(V4_SOURCE_DIR) + "/tests/fixtures/tiny-kinds-fp32";
  const auto host = run_engine(dir, false);
  const auto dev = run_engine(dir, true);
  ASSERT_EQ(host.size(), 12u);
  ASSERT_EQ(dev.size(), host.size());
  for (const auto& [id, h] : host) {
    const auto& d = dev.at(id);
    EXPECT_EQ(d.first, h.first) << "request " << id;
    ASSERT_EQ(d.second.size(), h.second.size()) << "request " << id;
    for (size_t k = 0; k < h.second.size(); ++k) {
      EXPECT_EQ(d.second[k].token, h.second[k].token) << "request " << id;
      EXPECT_NEAR(d.second[k].logprob, h.second[k].logprob, 1e-5) << "request " << id;
      ASSERT_EQ(d.second[k].top.size(), h.second[k].top.size()) << "request " << id;
      for (size_t j = 0; j < h.second[k].top.size(); ++j) {
        EXPECT_EQ(d.second[k].top[j].token, h.second[k].top[j].token) << "request " << id;
        EXPECT_NEAR(d.second[k].top[j].logprob, h.second[k].top[j].logprob, 1e-5);
      }
    }
  }
}

// ---- timings (printed; the numbers for docs/engine.md)
// --------------------------------------------

TEST(CudaSampling, Timing) {
  V4_REQUIRE_GPU();
  Stream st;
  DeviceSampler ds;
  const int64_t V = kVocab, R = 256;
  Dev<int32_t> dt(static_cast<size_t>(R));
  Dev<float> dlp(static_cast<size_t>(R)), dtlp(size_t(R * 20));
  Dev<int32_t> dtt(size_t(R * 20));
  auto time_us = [&](const SampleArgs& a, int iters) {
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(ds.run(a, st.s).ok());  // warm-up, allocation
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0, st.s);
    for (int i = 0; i < iters; ++i) (void)ds.run(a, st.s);
    cudaEventRecord(e1, st.s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 1000.0 * ms / iters;
  };
  struct Case {
    const char* name;
    float sigma;  // logits N(0, sigma²)
    SampleRowParams p;
    bool all_greedy, logprobs;
    int top_n;
  };
  auto P = [](float t, int32_t k, float tp, float mp) {
    SampleRowParams p;
    p.temperature = t;
    p.top_k = k;
    p.top_p = tp;
    p.min_p = mp;
    p.logprobs = 1;
    return p;
  };
  const Case cases[] = {
      {"greedy (all_greedy)", 2.0f, P(0, 0, 1, 0), true, false, 0},
      {"greedy (params)", 2.0f, P(0, 0, 1, 0), false, false, 0},
      {"greedy + logprobs top-5", 2.0f, P(0, 0, 1, 0), true, true, 5},
      {"greedy + logprobs top-20", 2.0f, P(0, 0, 1, 0), true, true, 20},
      {"T=1 only (id-order walk)", 2.0f, P(1, 0, 1, 0), false, false, 0},
      {"T=0.8 top-k 50", 2.0f, P(0.8f, 50, 1, 0), false, false, 0},
      {"T=0.8 top-p 0.95, peaked N(0,5^2)", 5.0f, P(0.8f, 0, 0.95f, 0), false, false, 0},
      {"T=0.8 top-p 0.95, flat N(0,2^2)", 2.0f, P(0.8f, 0, 0.95f, 0), false, false, 0},
      {"T=0.6 top-k 20 top-p 0.95 min-p 0.05", 3.0f, P(0.6f, 20, 0.95f, 0.05f), false, false, 0},
  };
  for (const Case& c : cases) {
    Dev<float> dl(testing::randn(size_t(R * V), c.sigma));
    std::vector<SampleRowParams> prm(size_t(R), c.p);
    for (int64_t r = 0; r < R; ++r) prm[size_t(r)].seed = uint64_t(r);
    Dev<SampleRowParams> dp(prm);
    SampleArgs a;
    a.logits = dl.p;
    a.params = dp.p;
    a.n_rows = R;
    a.vocab = V;
    a.all_greedy = c.all_greedy;
    a.out_tokens = dt.p;
    if (c.logprobs) {
      a.out_logprob = dlp.p;
      a.top_n = c.top_n;
      a.out_top_tokens = dtt.p;
      a.out_top_logprobs = dtlp.p;
    }
    ds.set_prefilter(true);
    const double us = time_us(a, 10);
    double us_full = -1;
    if (!c.all_greedy && (c.p.top_k > 0 || c.p.top_p < 1)) {
      ds.set_prefilter(false);
      us_full = time_us(a, 3);
      ds.set_prefilter(true);
    }
    std::printf("[sampling] R=%lld V=%lld %-40s %9.1f us/step", (long long)R, (long long)V, c.name,
                us);
    if (us_full >= 0) std::printf("  (full sort: %.1f us)", us_full);
    std::printf("\n");
  }
  std::printf("[sampling] scratch held: %.1f MB\n", ds.scratch_bytes() / 1048576.0);
}

}  // namespace
}  // namespace v4::cuda
