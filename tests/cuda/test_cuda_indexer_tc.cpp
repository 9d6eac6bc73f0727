// Tensor-core indexer scores (src/ops/cuda/indexer.h) vs a host reference computed in double from
// the same bf16-rounded q and keys (so only the summation order differs): decode-shaped groups
// (every row its own candidate list) and prefill-shaped groups (rows of one sequence sharing a list
// with causal counts, groups crossing a sequence boundary). Untouched entries must stay poisoned.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "base/dtype.h"
#include "cuda_test_util.h"
#include "ops/cuda/indexer.h"
#include "ops/ops.h"

namespace v4::ops {
namespace {

using cuda::testing::Dev;
using cuda::testing::rand_int;
using cuda::testing::randn;

TEST(CudaIndexerTc, ScoresMatchBf16Reference) {
  V4_REQUIRE_GPU();
  struct Case { int nI, dI; bool prefill; int64_t S; int max_count; };
  for (Case c : {Case{64, 128, false, 3, 5000}, Case{64, 128, true, 11, 700},
                 Case{16, 32, false, 5, 130}, Case{32, 64, true, 6, 65}}) {
    SCOPED_TRACE(::testing::Message() << "nI=" << c.nI << " dI=" << c.dI << " prefill=" << c.prefill);
    const int64_t S = c.S, pool_rows = 9000;
    auto q = randn(size_t(S * c.nI * c.dI), 1.f), w = randn(size_t(S * c.nI), 1.f);
    auto pool = randn(size_t(pool_rows * c.dI), 1.f);
    std::vector<int32_t> rows, count(S);
    std::vector<int64_t> offset(S);
    if (c.prefill) {
      // Two sequences: rows [0, 7) share list A, rows [7, S) list B (a group straddles them).
      std::vector<int32_t> la, lb;
      for (int i = 0; i < c.max_count; ++i) la.push_back(rand_int(0, int(pool_rows) - 1));
      for (int i = 0; i < c.max_count; ++i) lb.push_back(rand_int(0, int(pool_rows) - 1));
      rows = la;
      rows.insert(rows.end(), lb.begin(), lb.end());
      for (int64_t t = 0; t < S; ++t) {
        offset[t] = t < 7 ? 0 : c.max_count;
        count[t] = std::max(1, c.max_count - int(S - t) * 3);
      }
    } else {
      for (int64_t t = 0; t < S; ++t) {
        offset[t] = int64_t(rows.size());
        count[t] = t == 0 ? c.max_count : rand_int(1, c.max_count);
        for (int i = 0; i < count[t]; ++i) rows.push_back(rand_int(0, int(pool_rows) - 1));
      }
    }
    // Host reference on bf16-rounded inputs.
    const int64_t ld = (c.max_count + 3) / 4 * 4;
    std::vector<float> ref(size_t(S * ld), NAN);
    const double wscale = 1.0 / std::sqrt(double(c.nI)) / std::sqrt(double(c.dI));
    for (int64_t t = 0; t < S; ++t)
      for (int s = 0; s < count[t]; ++s) {
        const float* key = &pool[size_t(rows[offset[t] + s]) * c.dI];
        double acc = 0;
        for (int h = 0; h < c.nI; ++h) {
          double d = 0;
          for (int k = 0; k < c.dI; ++k)
            d += double(round_bf16(q[(t * c.nI + h) * c.dI + k])) * double(round_bf16(key[k]));
          acc += std::max(0.0, d) * double(w[t * c.nI + h]) * wscale;
        }
        ref[t * ld + s] = float(acc);
      }
    Dev<float> dq(q), dw(w), dpool(pool), dscores(size_t(S * ld));
    Dev<int32_t> drows(rows), dcount(count);
    Dev<int64_t> doff(offset);
    dscores.poison();
    IndexerArgs a;
    a.q = dq.p;
    a.weights = dw.p;
    a.key_pool = dpool.p;
    a.cand = {drows.p, doff.p, dcount.p};
    a.n_rows = S;
    a.n_heads = c.nI;
    a.head_dim = c.dI;
    ASSERT_TRUE(cuda::indexer_tc_supported(c.nI, c.dI));
    ASSERT_TRUE(cuda::indexer_scores_tc(a, c.max_count, dscores.p, ld, 132, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto got = dscores.host();
    double worst = 0;
    int64_t bad_untouched = 0;
    for (int64_t t = 0; t < S; ++t)
      for (int64_t s = 0; s < ld; ++s) {
        const float g = got[t * ld + s], r = ref[t * ld + s];
        if (s >= count[t]) {
          bad_untouched += !std::isnan(g);
          continue;
        }
        worst = std::max(worst, std::fabs(double(g) - r) / (1e-3 + std::fabs(double(r))));
      }
    std::printf("[indexer tc] nI=%d dI=%d S=%lld worst rel err %.2e\n", c.nI, c.dI, (long long)S, worst);
    EXPECT_LE(worst, 2e-4);
    EXPECT_EQ(bad_untouched, 0) << "entries beyond count[t] were written";
  }
  EXPECT_FALSE(cuda::indexer_tc_supported(60, 128));
}

TEST(CudaIndexerTc, DecodeTiming262K) {
  V4_REQUIRE_GPU();
  const int nI = 64, dI = 128;
  for (int64_t S : {int64_t(1), int64_t(64)}) {
    const int n = 262144;
    Dev<float> q(static_cast<size_t>(S * nI * dI)), w(static_cast<size_t>(S * nI)),
        pool(static_cast<size_t>(n) * dI), scores(static_cast<size_t>(S * n));
    cudaMemset(q.p, 0, S * nI * dI * 4);
    cudaMemset(w.p, 0, S * nI * 4);
    cudaMemset(pool.p, 0, size_t(n) * dI * 4);
    std::vector<int32_t> rows(n), count(S, n);
    for (int i = 0; i < n; ++i) rows[i] = i;
    std::vector<int64_t> off(S, 0);
    Dev<int32_t> drows(rows), dcount(count);
    Dev<int64_t> doff(off);
    IndexerArgs a;
    a.q = q.p; a.weights = w.p; a.key_pool = pool.p; a.cand = {drows.p, doff.p, dcount.p};
    a.n_rows = S; a.n_heads = nI; a.head_dim = dI;
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(cuda::indexer_scores_tc(a, n, scores.p, n, 132, nullptr).ok());
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0);
    const int reps = 10;
    for (int i = 0; i < reps; ++i) (void)cuda::indexer_scores_tc(a, n, scores.p, n, 132, nullptr);
    cudaEventRecord(e1);
    ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const double us = ms * 1000 / reps;
    std::printf("[indexer tc] S=%lld 262144 keys (rows shared by all queries: same offset): %.1f us, key bytes %.0f GB/s\n",
                (long long)S, us, double(n) * dI * 4 / (us * 1e3));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
}

}  // namespace
}  // namespace v4::ops
