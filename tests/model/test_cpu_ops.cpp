// CPU op properties the model relies on: GEMM rows independent of M and of their position in
// the batch (batch invariance), for both GEMM paths' shapes; top-k tie order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

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

// The composed defaults of the fused mHC ops (hc_pre_norm, hc_post_add, hc_head_norm) are the
// op sequences they replace, bit for bit, and the norm they add is an RMSNorm (checked in double).
TEST(CpuOps, FusedMhcDefaultsMatchTheOpSequence) {
  auto ops = make_cpu_ops();
  std::mt19937 g(std::random_device{}());
  std::normal_distribution<float> d;
  auto randv = [&](size_t n, float sc) {
    std::vector<float> v(n);
    for (auto& x : v) x = sc * d(g);
    return v;
  };
  for (auto [n, D, S] : {std::tuple<int, int, int64_t>{4, 64, 3}, {2, 37, 5}, {1, 9, 1}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " D=" << D << " S=" << S);
    const int nmix = (2 + n) * n;
    auto h = randv(size_t(S * n * D), 1.f), fn = randv(size_t(nmix) * n * D, 0.1f);
    auto base = randv(size_t(nmix), 0.5f), scale = randv(3, 0.7f), w = randv(size_t(D), 1.f);
    HcArgs a;
    a.h = h.data(); a.fn = fn.data(); a.base = base.data(); a.scale = scale.data();
    a.n_rows = S; a.n_streams = n; a.hidden = D; a.rms_eps = 1e-6f; a.hc_eps = 1e-6f;
    a.sinkhorn_iters = 5;
    std::vector<float> col1(size_t(S * D)), post1(size_t(S * n)), comb1(size_t(S * n * n)),
        x1(size_t(S * D)), col2 = col1, post2 = post1, comb2 = comb1, x2 = x1;
    HcArgs a1 = a, a2 = a;
    a1.collapsed = col1.data(); a1.post = post1.data(); a1.comb = comb1.data();
    a2.collapsed = col2.data(); a2.post = post2.data(); a2.comb = comb2.data();
    ops->hc_pre(a1);
    ops->rms_norm(col1.data(), w.data(), S, D, 1e-5f, x1.data());
    ops->hc_pre_norm(a2, w.data(), 1e-5f, x2.data());
    EXPECT_EQ(col1, col2);
    EXPECT_EQ(post1, post2);
    EXPECT_EQ(comb1, comb2);
    EXPECT_EQ(x1, x2);
    for (int64_t t = 0; t < S; ++t) {  // x is the weighted RMSNorm of collapsed
      double ss = 0;
      for (int i = 0; i < D; ++i) ss += double(col1[t * D + i]) * col1[t * D + i];
      const double inv = 1.0 / std::sqrt(ss / D + 1e-5);
      for (int i = 0; i < D; ++i)
        EXPECT_NEAR(x2[t * D + i], col1[t * D + i] * inv * w[i], 1e-4 * (1 + std::fabs(w[i])));
    }
    // hc_post_add = add + hc_post.
    auto f = randv(size_t(S * D), 1.f), fa = randv(size_t(S * D), 1.f);
    auto hp1 = h, hp2 = h, f1 = f, f2 = f;
    ops->add(f1.data(), fa.data(), S * D);
    ops->hc_post(hp1.data(), f1.data(), post1.data(), comb1.data(), S, n, D);
    ops->hc_post_add(hp2.data(), f2.data(), fa.data(), post1.data(), comb1.data(), S, n, D);
    EXPECT_EQ(hp1, hp2);
    // hc_head_norm = hc_head + rms_norm (in place).
    auto hfn = randv(size_t(n) * n * D, 0.1f), hbase = randv(size_t(n), 0.5f), hsc = randv(1, 0.7f);
    std::vector<float> y1(size_t(S * D)), y2(size_t(S * D));
    ops->hc_head(h.data(), hfn.data(), hbase.data(), hsc.data(), S, n, D, 1e-6f, 1e-6f, y1.data());
    ops->rms_norm(y1.data(), w.data(), S, D, 1e-5f, y1.data());
    ops->hc_head_norm(h.data(), hfn.data(), hbase.data(), hsc.data(), S, n, D, 1e-6f, 1e-6f,
                      w.data(), 1e-5f, y2.data());
    EXPECT_EQ(y1, y2);
  }
}

// rms_norm_rope's default is rms_norm over the head vectors then the forward rope, bit for bit.
TEST(CpuOps, RmsNormRopeDefaultMatchesTheOpSequence) {
  auto ops = make_cpu_ops();
  std::mt19937 g(std::random_device{}());
  std::normal_distribution<float> d;
  const int64_t rows = 3;
  for (auto [heads, hd, rd] : {std::tuple<int, int, int>{4, 64, 16}, {1, 34, 10}}) {
    std::vector<float> x(static_cast<size_t>(rows * heads * hd)), w(static_cast<size_t>(hd)),
        inv(static_cast<size_t>(rd / 2));
    for (auto& v : x) v = d(g);
    for (auto& v : w) v = d(g);
    for (int i = 0; i < rd / 2; ++i) inv[size_t(i)] = 1.f / std::pow(10000.f, 2.f * i / rd);
    const std::vector<int64_t> pos = {0, 17, 123456};
    const float* wps[2] = {nullptr, w.data()};
    for (const float* wp : wps) {
      auto a = x, b = x;
      ops->rms_norm(a.data(), wp, rows * heads, hd, 1e-6f, a.data());
      ops->rope(a.data(), rows, heads, hd, rd, pos.data(), inv.data(), 1.f, false);
      ops->rms_norm_rope(b.data(), wp, rows, heads, hd, 1e-6f, rd, pos.data(), inv.data(), 1.f);
      EXPECT_EQ(a, b);
      EXPECT_NE(a, x);
    }
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
  // Selection: higher score first, equal scores -> lower index first: 1, 3, 0, 4, then of the two
  // zeros (2, 5) index 2. Output in map position order: 0, 1, 2, 3, 4.
  EXPECT_EQ(out_count[0], 5);
  EXPECT_EQ(std::vector<int32_t>(out, out + 5), (std::vector<int32_t>{10, 11, 12, 13, 14}));
  // Top 3 of the same: 1, 3 (score 2), then 0 (0.5, lower index than 4) -> rows 10, 11, 13.
  a.topk = 3;
  int32_t out3[3];
  a.out_rows = out3;
  ops->indexer_topk(a);
  EXPECT_EQ(out_count[0], 3);
  EXPECT_EQ(std::vector<int32_t>(out3, out3 + 3), (std::vector<int32_t>{10, 11, 13}));
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
