// CPU op properties the model relies on: GEMM rows independent of M and of their position in
// the batch (batch invariance), for both GEMM paths' shapes; top-k tie order.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "ops/ops.h"

namespace v4::ops {
namespace {

TEST(CpuOps, LinearRowsIndependentOfBatch) {
  auto ops = make_cpu_ops();
  std::mt19937 g(std::random_device{}());
  std::normal_distribution<float> d;
  for (auto [N, K] : {std::pair<int64_t, int64_t>{333, 1000}, {7, 13}, {96, 64}, {129, 257}}) {
    const int64_t Mmax = 41;
    std::vector<float> x(Mmax * K), w(N * K);
    for (auto& v : x) v = d(g);
    for (auto& v : w) v = d(g);
    // Reference: every row alone (M = 1).
    std::vector<float> ref(Mmax * N);
    for (int64_t r = 0; r < Mmax; ++r) ops->linear(&x[r * K], K, w.data(), 1, N, K, &ref[r * N], N);
    for (int64_t M : {2, 3, 4, 5, 16, 17, 33, 41}) {
      for (int64_t off : {0, 1, 7}) {
        if (off + M > Mmax) continue;
        std::vector<float> y(M * N, -1.f);
        ops->linear(&x[off * K], K, w.data(), M, N, K, y.data(), N);
        ASSERT_EQ(std::memcmp(y.data(), &ref[off * N], sizeof(float) * M * N), 0)
            << "N=" << N << " K=" << K << " M=" << M << " offset=" << off;
      }
    }
    // Sanity: the product is right (not just self-consistent).
    double maxerr = 0;
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(x[k]) * w[j * K + k];
      maxerr = std::max(maxerr, std::fabs(s - ref[j]));
    }
    EXPECT_LT(maxerr, 1e-3 * std::sqrt(double(K)));
  }
}

TEST(CpuOps, IndexerTopkTieOrder) {
  auto ops = make_cpu_ops();
  // One query, one head, dim 1: scores = relu(q·k)·1·w; keys 0..5 with values giving ties.
  const float q[1] = {1.f}, w[1] = {1.f};
  const float keys[6] = {0.5f, 2.f, -1.f, 2.f, 0.5f, -3.f};  // scores .5 2 0 2 .5 0
  const int32_t rows[6] = {10, 11, 12, 13, 14, 15};  // physical rows = key index (pool below)
  std::vector<float> pool(16, 0.f);
  for (int i = 0; i < 6; ++i) pool[10 + i] = keys[i];
  const int64_t off[1] = {0};
  const int32_t cnt[1] = {6};
  int32_t out[5], out_count[1];
  IndexerArgs a;
  a.q = q;
  a.weights = w;
  a.key_pool = pool.data();
  a.cand = {rows, off, cnt};
  a.n_rows = 1;
  a.n_heads = 1;
  a.head_dim = 1;
  a.topk = 5;
  a.out_rows = out;
  a.out_count = out_count;
  ops->indexer_topk(a);
  // Higher score first; equal scores -> lower index first: 1, 3, 0, 4, 2.
  EXPECT_EQ(out_count[0], 5);
  EXPECT_EQ(std::vector<int32_t>(out, out + 5), (std::vector<int32_t>{11, 13, 10, 14, 12}));
  a.topk = 8;
  int32_t out8[8];
  a.out_rows = out8;
  ops->indexer_topk(a);
  EXPECT_EQ(out_count[0], 6);
  EXPECT_EQ(out8[6], -1);
  EXPECT_EQ(out8[7], -1);
}

}  // namespace
}  // namespace v4::ops
