// GPU op tests: every ops::Ops method of the CUDA backend vs the CPU reference backend on fresh
// random inputs (odd sizes and V4-Flash shapes), outputs poisoned before each run.
// Tolerance (testing.md): fp32 ops ≤ 1e-5 relative to the largest output magnitude.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

#include "cuda_test_util.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"

namespace v4::ops {
namespace {

using cuda::testing::Dev;
using cuda::testing::rand_int;
using cuda::testing::randn;
using cuda::testing::rel_err;
using cuda::testing::rng;

constexpr double kTol = 1e-5;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

Ops* cpu() {
  static auto o = make_cpu_ops();
  return o.get();
}
Ops* gpu() {
  static std::unique_ptr<Ops> o = [] {
    auto r = make_cuda_ops();
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? std::move(r).value() : nullptr;
  }();
  return o.get();
}

#define V4_GPU_OPS()          \
  V4_REQUIRE_GPU();           \
  ASSERT_NE(gpu(), nullptr);

template <typename T>
std::vector<T> nan_vec(size_t n) {
  if constexpr (std::is_same_v<T, float>) return std::vector<float>(n, kNaN);
  else return std::vector<T>(n, T(-7));
}

// ---------------------------------------------------------------------------------------------

TEST(CudaOps, Linear) {
  V4_GPU_OPS();
  struct Shape { int64_t M, N, K, xpad, ypad; };
  const Shape shapes[] = {{1, 7, 5, 0, 0},     {3, 129, 67, 3, 5},  {17, 4096, 1024, 0, 0},
                          {64, 512, 4096, 0, 0}, {5, 1024, 4096, 0, 0}, {2, 333, 2048, 8, 1}};
  for (const auto& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K);
    const int64_t ldx = s.K + s.xpad, ldy = s.N + s.ypad;
    auto x = randn(size_t(s.M * ldx)), w = randn(size_t(s.N * s.K), 0.05f);
    std::vector<float> y_cpu = nan_vec<float>(size_t(s.M * ldy));
    cpu()->linear(x.data(), ldx, w.data(), s.M, s.N, s.K, y_cpu.data(), ldy);
    Dev<float> dx(x), dw(w), dy(size_t(s.M * ldy));
    dy.poison();
    gpu()->linear(dx.p, ldx, dw.p, s.M, s.N, s.K, dy.p, ldy);
    gpu()->synchronize();
    auto y = dy.host();
    double err = 0, den = 1e-30;
    for (int64_t i = 0; i < s.M; ++i)
      for (int64_t j = 0; j < s.N; ++j) {
        const float a = y[i * ldy + j], b = y_cpu[i * ldy + j];
        err = std::isnan(a) ? INFINITY : std::max(err, double(std::fabs(a - b)));
        den = std::max(den, double(std::fabs(b)));
      }
    EXPECT_LE(err / den, kTol);
  }
}

TEST(CudaOps, LinearIsBatchInvariant) {
  V4_GPU_OPS();
  const int64_t M = 37, N = 300, K = 1000;
  auto x = randn(size_t(M * K)), w = randn(size_t(N * K), 0.05f);
  Dev<float> dx(x), dw(w), dy(size_t(M * N)), dy1{size_t(N)};
  dy.poison();
  dy1.poison();
  gpu()->linear(dx.p, K, dw.p, M, N, K, dy.p, N);
  gpu()->linear(dx.p + 11 * K, K, dw.p, 1, N, K, dy1.p, N);
  gpu()->synchronize();
  auto all = dy.host(), one = dy1.host();
  for (int64_t j = 0; j < N; ++j) ASSERT_EQ(all[11 * N + j], one[j]) << "column " << j;
}

TEST(CudaOps, CopiesAndEmbed) {
  V4_GPU_OPS();
  const int64_t n = 37, width = 129, pool_rows = 50;
  auto src = randn(size_t(pool_rows * width));
  std::vector<int32_t> rows(n);
  for (auto& r : rows) r = rand_int(0, int(pool_rows) - 1);
  // gather
  std::vector<float> g_cpu(size_t(n * width), kNaN);
  cpu()->gather_rows(src.data(), rows.data(), n, width, g_cpu.data());
  Dev<float> dsrc(src), dg(size_t(n * width));
  Dev<int32_t> drows(rows);
  dg.poison();
  gpu()->gather_rows(dsrc.p, drows.p, n, width, dg.p);
  // store (distinct rows, some −1)
  std::vector<int32_t> dst(n);
  std::vector<int32_t> perm(pool_rows);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng());
  for (int64_t i = 0; i < n; ++i) dst[i] = i % 5 == 3 ? -1 : perm[i];
  auto vals = randn(size_t(n * width));
  std::vector<float> pool_cpu = randn(size_t(pool_rows * width));
  Dev<float> dpool(pool_cpu), dvals(vals);
  Dev<int32_t> ddst(dst);
  cpu()->store_rows(pool_cpu.data(), dst.data(), n, width, vals.data());
  gpu()->store_rows(dpool.p, ddst.p, n, width, dvals.p);
  // add
  auto ya = randn(1001), xa = randn(1001);
  Dev<float> dya(ya), dxa(xa);
  cpu()->add(ya.data(), xa.data(), 1001);
  gpu()->add(dya.p, dxa.p, 1001);
  // embed: V=40, D=67, n=4
  const int V = 40, D = 67, ns = 4;
  const int64_t S = 9;
  auto table = randn(size_t(V * D));
  std::vector<int32_t> ids(S);
  for (auto& i : ids) i = rand_int(0, V - 1);
  std::vector<float> e_cpu(size_t(S * ns * D), kNaN);
  cpu()->embed(table.data(), ids.data(), S, D, ns, e_cpu.data());
  Dev<float> dtable(table), de(size_t(S * ns * D));
  Dev<int32_t> dids(ids);
  de.poison();
  gpu()->embed(dtable.p, dids.p, S, D, ns, de.p);
  gpu()->synchronize();
  EXPECT_EQ(dg.host(), g_cpu);
  EXPECT_EQ(dpool.host(), pool_cpu);
  EXPECT_EQ(dya.host(), ya);
  EXPECT_EQ(de.host(), e_cpu);
}

TEST(CudaOps, RmsNorm) {
  V4_GPU_OPS();
  for (int dim : {1, 37, 512, 4096, 7168}) {
    for (bool weighted : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "dim=" << dim << " weighted=" << weighted);
      const int64_t rows = 5;
      auto x = randn(size_t(rows * dim), 3.f), w = randn(size_t(dim));
      std::vector<float> y_cpu(x.size(), kNaN);
      cpu()->rms_norm(x.data(), weighted ? w.data() : nullptr, rows, dim, 1e-6f, y_cpu.data());
      Dev<float> dx(x), dw(w), dy(x.size());
      dy.poison();
      gpu()->rms_norm(dx.p, weighted ? dw.p : nullptr, rows, dim, 1e-6f, dy.p);
      // in place too
      gpu()->rms_norm(dx.p, weighted ? dw.p : nullptr, rows, dim, 1e-6f, dx.p);
      gpu()->synchronize();
      EXPECT_LE(rel_err(dy.host(), y_cpu), kTol);
      EXPECT_LE(rel_err(dx.host(), y_cpu), kTol);
    }
  }
}

TEST(CudaOps, Rope) {
  V4_GPU_OPS();
  struct Shape { int heads, hd, rd; };
  for (Shape s : {Shape{64, 512, 64}, Shape{1, 512, 64}, Shape{3, 24, 8}, Shape{2, 128, 64}}) {
    for (bool inverse : {false, true}) {
      for (float att : {1.f, 1.2772589f}) {
        SCOPED_TRACE(::testing::Message() << "heads=" << s.heads << " hd=" << s.hd << " rd=" << s.rd
                                          << " inverse=" << inverse << " att=" << att);
        const int64_t rows = 7;
        auto x = randn(size_t(rows * s.heads * s.hd));
        std::vector<int64_t> pos(rows);
        for (auto& p : pos) p = rand_int(0, 1 << 20);
        pos[0] = 0;
        std::vector<float> inv(s.rd / 2);
        for (int i = 0; i < s.rd / 2; ++i) inv[i] = 1.f / std::pow(160000.f, 2.f * i / s.rd);
        auto x_cpu = x;
        cpu()->rope(x_cpu.data(), rows, s.heads, s.hd, s.rd, pos.data(), inv.data(), att, inverse);
        Dev<float> dx(x), dinv(inv);
        Dev<int64_t> dpos(pos);
        gpu()->rope(dx.p, rows, s.heads, s.hd, s.rd, dpos.p, dinv.p, att, inverse);
        gpu()->synchronize();
        auto y = dx.host();
        EXPECT_LE(rel_err(y, x_cpu), kTol);
        // nope channels untouched (exactly)
        for (int64_t i = 0; i < int64_t(y.size()); ++i)
          if (i % s.hd < s.hd - s.rd) {
            ASSERT_EQ(y[i], x[i]);
          }
      }
    }
  }
}

struct HcCase { int n, D, iters; };

TEST(CudaOps, HyperConnections) {
  V4_GPU_OPS();
  for (HcCase c : {HcCase{4, 4096, 20}, HcCase{4, 37, 20}, HcCase{2, 64, 3}, HcCase{1, 9, 1}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << c.n << " D=" << c.D << " iters=" << c.iters);
    const int64_t S = 5;
    const int n = c.n, D = c.D, nmix = (2 + n) * n;
    auto h = randn(size_t(S * n * D));
    auto fn = randn(size_t(nmix) * n * D, 1.f / std::sqrt(float(n * D)));
    auto base = randn(size_t(nmix), 0.5f), scale = randn(3, 0.7f);
    HcArgs a;
    a.n_rows = S;
    a.n_streams = n;
    a.hidden = D;
    a.rms_eps = 1e-6f;
    a.hc_eps = 1e-6f;
    a.sinkhorn_iters = c.iters;
    std::vector<float> col(size_t(S * D), kNaN), post(size_t(S * n), kNaN), comb(size_t(S * n * n), kNaN);
    HcArgs ac = a;
    ac.h = h.data(); ac.fn = fn.data(); ac.base = base.data(); ac.scale = scale.data();
    ac.collapsed = col.data(); ac.post = post.data(); ac.comb = comb.data();
    cpu()->hc_pre(ac);
    Dev<float> dh(h), dfn(fn), dbase(base), dscale(scale), dcol(col.size()), dpost(post.size()),
        dcomb(comb.size());
    dcol.poison(); dpost.poison(); dcomb.poison();
    HcArgs ag = a;
    ag.h = dh.p; ag.fn = dfn.p; ag.base = dbase.p; ag.scale = dscale.p;
    ag.collapsed = dcol.p; ag.post = dpost.p; ag.comb = dcomb.p;
    gpu()->hc_pre(ag);
    // post: h' = post·f + combᵀ·h (in place), on both backends from the CPU coefficients
    auto f = randn(size_t(S * D));
    auto h_cpu = h;
    cpu()->hc_post(h_cpu.data(), f.data(), post.data(), comb.data(), S, n, D);
    Dev<float> dh2(h), df(f), dpost_c(post), dcomb_c(comb);
    gpu()->hc_post(dh2.p, df.p, dpost_c.p, dcomb_c.p, S, n, D);
    // HyperHead
    auto hfn = randn(size_t(n) * n * D, 1.f / std::sqrt(float(n * D)));
    auto hbase = randn(size_t(n), 0.5f), hscale = randn(1, 0.7f);
    std::vector<float> y_cpu(size_t(S * D), kNaN);
    cpu()->hc_head(h.data(), hfn.data(), hbase.data(), hscale.data(), S, n, D, 1e-6f, 1e-6f, y_cpu.data());
    Dev<float> dhfn(hfn), dhbase(hbase), dhscale(hscale), dy(size_t(S * D));
    dy.poison();
    gpu()->hc_head(dh.p, dhfn.p, dhbase.p, dhscale.p, S, n, D, 1e-6f, 1e-6f, dy.p);
    gpu()->synchronize();
    EXPECT_LE(rel_err(dcol.host(), col), kTol);
    EXPECT_LE(rel_err(dpost.host(), post), kTol);
    EXPECT_LE(rel_err(dcomb.host(), comb), kTol);
    EXPECT_LE(rel_err(dh2.host(), h_cpu), kTol);
    EXPECT_LE(rel_err(dy.host(), y_cpu), kTol);
    // Sinkhorn sanity on the GPU result: columns sum to ~1.
    auto cb = dcomb.host();
    for (int64_t t = 0; t < S && c.iters >= 3; ++t)
      for (int k = 0; k < n; ++k) {
        float s = 0;
        for (int j = 0; j < n; ++j) s += cb[(t * n + j) * n + k];
        EXPECT_NEAR(s, 1.f, 1e-3f);
      }
  }
}

TEST(CudaOps, CompressPool) {
  V4_GPU_OPS();
  struct Case { int m, overlap, d; };
  for (Case c : {Case{4, 2, 512}, Case{128, 1, 512}, Case{4, 2, 128}, Case{3, 2, 7}, Case{5, 1, 9}}) {
    SCOPED_TRACE(::testing::Message() << "m=" << c.m << " overlap=" << c.overlap << " d=" << c.d);
    const int width = c.overlap * c.d, n_slots = c.overlap * c.m;
    const int64_t n_fresh = 300, n_state = 40, n_out = 6;
    auto fkv = randn(size_t(n_fresh * width)), fg = randn(size_t(n_fresh * width));
    auto skv = randn(size_t(n_state * width)), sg = randn(size_t(n_state * width));
    auto bias = randn(size_t(c.m) * width, 0.5f);
    std::vector<int32_t> src(size_t(n_out * n_slots));
    for (int64_t r = 0; r < n_out; ++r)
      for (int j = 0; j < n_slots; ++j) {
        const int u = rand_int(0, 9);
        int32_t v = u < 6 ? rand_int(0, int(n_fresh) - 1) : u < 9 ? -2 - rand_int(0, int(n_state) - 1) : -1;
        if (j == n_slots - 1) v = rand_int(0, int(n_fresh) - 1);  // never an all-empty row
        if (r == 0 && c.overlap == 2 && j < c.m) v = -1;           // row 0: no series a
        src[r * n_slots + j] = v;
      }
    CompressArgs a;
    a.n_out = n_out; a.ratio = c.m; a.overlap = c.overlap; a.dim = c.d;
    std::vector<float> out_cpu(size_t(n_out * c.d), kNaN);
    CompressArgs ac = a;
    ac.fresh_kv = fkv.data(); ac.fresh_gate = fg.data(); ac.state_kv = skv.data();
    ac.state_gate = sg.data(); ac.bias = bias.data(); ac.src = src.data(); ac.out = out_cpu.data();
    cpu()->compress_pool(ac);
    Dev<float> dfkv(fkv), dfg(fg), dskv(skv), dsg(sg), dbias(bias), dout(out_cpu.size());
    Dev<int32_t> dsrc(src);
    dout.poison();
    CompressArgs ag = a;
    ag.fresh_kv = dfkv.p; ag.fresh_gate = dfg.p; ag.state_kv = dskv.p; ag.state_gate = dsg.p;
    ag.bias = dbias.p; ag.src = dsrc.p; ag.out = dout.p;
    gpu()->compress_pool(ag);
    gpu()->synchronize();
    EXPECT_LE(rel_err(dout.host(), out_cpu), kTol);
  }
}

// Scores as the CPU op computes them (double here), for the tie-aware selection check.
std::vector<double> ref_scores(const std::vector<float>& q, const std::vector<float>& w,
                               const std::vector<float>& pool, const int32_t* rows, int n,
                               int64_t t, int nI, int dI) {
  std::vector<double> s(n);
  for (int j = 0; j < n; ++j) {
    const float* key = pool.data() + int64_t(rows[j]) * dI;
    double acc = 0;
    for (int h = 0; h < nI; ++h) {
      double d = 0;
      for (int c = 0; c < dI; ++c) d += double(q[(t * nI + h) * dI + c]) * key[c];
      acc += std::max(0.0, d) / std::sqrt(double(dI)) * w[t * nI + h] / std::sqrt(double(nI));
    }
    s[j] = acc;
  }
  return s;
}

struct IdxCase { int nI, dI, k; std::vector<int32_t> counts; };

TEST(CudaOps, IndexerTopk) {
  V4_GPU_OPS();
  const IdxCase cases[] = {
      {64, 128, 512, {5, 3000, 700, 512, 513}},  // V4-Flash indexer: short rows, long rows, k ± 1
      {2, 16, 3, {1, 40, 300}},                  // tiny CI: few heads → many exact-zero ties (P19)
      {16, 24, 7, {0, 7, 91}},                   // odd dims, an empty row
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "nI=" << c.nI << " dI=" << c.dI << " k=" << c.k);
    const int64_t S = int64_t(c.counts.size());
    const int64_t pool_rows = 4000;
    auto q = randn(size_t(S * c.nI * c.dI)), w = randn(size_t(S * c.nI));
    auto pool = randn(size_t(pool_rows * c.dI));
    std::vector<int32_t> rows, count = c.counts;
    std::vector<int64_t> offset;
    for (int64_t t = 0; t < S; ++t) {
      offset.push_back(int64_t(rows.size()));
      std::vector<int32_t> perm(pool_rows);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng());
      rows.insert(rows.end(), perm.begin(), perm.begin() + count[t]);
    }
    if (rows.empty()) rows.push_back(0);
    IndexerArgs a;
    a.n_rows = S; a.n_heads = c.nI; a.head_dim = c.dI; a.topk = c.k;
    std::vector<int32_t> out_cpu(size_t(S * c.k), -7), cnt_cpu(S, -7);
    IndexerArgs ac = a;
    ac.q = q.data(); ac.weights = w.data(); ac.key_pool = pool.data();
    ac.cand = {rows.data(), offset.data(), count.data()};
    ac.out_rows = out_cpu.data(); ac.out_count = cnt_cpu.data();
    cpu()->indexer_topk(ac);
    Dev<float> dq(q), dw(w), dpool(pool);
    Dev<int32_t> drows(rows), dcount(count), dout(out_cpu.size()), dcnt{size_t(S)};
    Dev<int64_t> doff(offset);
    dout.poison(); dcnt.poison();
    IndexerArgs ag = a;
    ag.q = dq.p; ag.weights = dw.p; ag.key_pool = dpool.p;
    ag.cand = {drows.p, doff.p, dcount.p};
    ag.out_rows = dout.p; ag.out_count = dcnt.p;
    gpu()->indexer_topk(ag);
    gpu()->synchronize();
    auto out = dout.host(), cnt = dcnt.host();
    EXPECT_EQ(cnt, cnt_cpu);
    int exact_rows = 0;
    for (int64_t t = 0; t < S; ++t) {
      const int n = count[t], n_sel = std::min(n, c.k);
      const int32_t* rw = rows.data() + offset[t];
      auto sc = ref_scores(q, w, pool, rw, n, t, c.nI, c.dI);
      std::vector<double> sorted = sc;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      const double thr = n_sel ? sorted[n_sel - 1] : 0, tol = 1e-5 * (std::fabs(sorted.empty() ? 0 : sorted[0]) + 1e-6);
      std::vector<int> pos_of(pool_rows, -1);
      for (int j = 0; j < n; ++j) pos_of[rw[j]] = j;
      std::vector<char> chosen(n, 0);
      int prev_j = -1;
      for (int i = 0; i < c.k; ++i) {
        const int32_t r = out[t * c.k + i];
        if (i >= n_sel) { EXPECT_EQ(r, -1) << "row " << t << " pad " << i; continue; }
        ASSERT_GE(r, 0) << "row " << t << " entry " << i;
        const int j = pos_of[r];
        ASSERT_GE(j, 0) << "not a candidate";
        EXPECT_FALSE(chosen[j]) << "duplicate";
        chosen[j] = 1;
        EXPECT_GE(sc[j], thr - tol) << "row " << t << " selected below the k-th score";
        EXPECT_GT(j, prev_j) << "row " << t << " not in ascending map position order";
        prev_j = j;
      }
      for (int j = 0; j < n; ++j)
        if (sc[j] > thr + tol) {
          EXPECT_TRUE(chosen[j]) << "row " << t << " missed a clear winner";
        }
      exact_rows += std::equal(out.begin() + t * c.k, out.begin() + (t + 1) * c.k,
                               out_cpu.begin() + t * c.k);
    }
    std::printf("[indexer] nI=%d dI=%d k=%d: %d/%lld rows identical to the CPU op\n", c.nI, c.dI,
                c.k, exact_rows, (long long)S);
  }
}

TEST(CudaOps, SparseAttention) {
  V4_GPU_OPS();
  struct Case { int H, hd, swa, comp; };
  for (Case c : {Case{64, 512, 128, 512}, Case{4, 32, 8, 3}, Case{3, 40, 5, 0}, Case{16, 512, 1, 70}}) {
    SCOPED_TRACE(::testing::Message() << "H=" << c.H << " hd=" << c.hd);
    const int64_t S = 3, swa_rows = 300, comp_rows = 700;
    auto q = randn(size_t(S * c.H * c.hd), 0.3f), sinks = randn(size_t(c.H));
    auto swa_pool = randn(size_t(swa_rows * c.hd), 0.3f), comp_pool = randn(size_t(comp_rows * c.hd), 0.3f);
    std::vector<int32_t> swa_r, comp_r, swa_c(S), comp_c(S);
    std::vector<int64_t> swa_o(S), comp_o(S);
    for (int64_t t = 0; t < S; ++t) {
      swa_o[t] = int64_t(swa_r.size());
      swa_c[t] = std::max(1, c.swa - int(t));
      for (int j = 0; j < swa_c[t]; ++j) swa_r.push_back(j == 2 ? -1 : rand_int(0, int(swa_rows) - 1));
      comp_o[t] = int64_t(comp_r.size());
      comp_c[t] = c.comp;
      for (int j = 0; j < c.comp; ++j) comp_r.push_back(j % 17 == 5 ? -1 : rand_int(0, int(comp_rows) - 1));
    }
    swa_r.push_back(0);
    comp_r.push_back(0);
    AttentionArgs a;
    a.n_rows = S; a.n_heads = c.H; a.head_dim = c.hd; a.scale = 1.f / std::sqrt(float(c.hd));
    std::vector<float> out_cpu(size_t(S * c.H * c.hd), kNaN);
    AttentionArgs ac = a;
    ac.q = q.data(); ac.sinks = sinks.data(); ac.swa_pool = swa_pool.data();
    ac.swa = {swa_r.data(), swa_o.data(), swa_c.data()};
    ac.comp_pool = c.comp ? comp_pool.data() : nullptr;
    ac.comp = {comp_r.data(), comp_o.data(), comp_c.data()};
    ac.out = out_cpu.data();
    cpu()->sparse_attention(ac);
    Dev<float> dq(q), dsinks(sinks), dswa(swa_pool), dcomp(comp_pool), dout(out_cpu.size());
    Dev<int32_t> dswa_r(swa_r), dswa_c(swa_c), dcomp_r(comp_r), dcomp_c(comp_c);
    Dev<int64_t> dswa_o(swa_o), dcomp_o(comp_o);
    dout.poison();
    AttentionArgs ag = a;
    ag.q = dq.p; ag.sinks = dsinks.p; ag.swa_pool = dswa.p;
    ag.swa = {dswa_r.p, dswa_o.p, dswa_c.p};
    ag.comp_pool = c.comp ? dcomp.p : nullptr;
    ag.comp = {dcomp_r.p, dcomp_o.p, dcomp_c.p};
    ag.out = dout.p;
    gpu()->sparse_attention(ag);
    gpu()->synchronize();
    EXPECT_LE(rel_err(dout.host(), out_cpu), kTol);
  }
}

TEST(CudaOps, Route) {
  V4_GPU_OPS();
  struct Case { int E, k; ScoringFunc f; bool bias, hash; };
  for (Case c : {Case{256, 6, ScoringFunc::kSqrtSoftplus, true, false},
                 Case{384, 6, ScoringFunc::kSqrtSoftplus, true, true},
                 Case{7, 2, ScoringFunc::kSoftmax, false, false},
                 Case{9, 3, ScoringFunc::kSigmoid, true, false}}) {
    SCOPED_TRACE(::testing::Message() << "E=" << c.E << " k=" << c.k << " hash=" << c.hash);
    const int64_t S = 11, V = 50;
    auto logits = randn(size_t(S * c.E), 3.f), bias = randn(size_t(c.E), 0.1f);
    logits[3] = 25.f;  // the softplus linear branch
    std::vector<int32_t> tid2eid(size_t(V * c.k)), ids(S);
    for (auto& e : tid2eid) e = rand_int(0, c.E - 1);
    for (auto& i : ids) i = rand_int(0, int(V) - 1);
    RouteArgs a;
    a.n_rows = S; a.n_experts = c.E; a.topk = c.k; a.scoring = c.f; a.routed_scaling_factor = 1.5f;
    std::vector<int32_t> idx_cpu(size_t(S * c.k), -7);
    std::vector<float> w_cpu(size_t(S * c.k), kNaN);
    RouteArgs ac = a;
    ac.logits = logits.data(); ac.bias = c.bias ? bias.data() : nullptr;
    ac.tid2eid = c.hash ? tid2eid.data() : nullptr; ac.token_ids = ids.data();
    ac.out_idx = idx_cpu.data(); ac.out_weight = w_cpu.data();
    cpu()->route(ac);
    Dev<float> dl(logits), db(bias), dw(w_cpu.size());
    Dev<int32_t> dt(tid2eid), di(ids), didx(idx_cpu.size());
    dw.poison(); didx.poison();
    RouteArgs ag = a;
    ag.logits = dl.p; ag.bias = c.bias ? db.p : nullptr;
    ag.tid2eid = c.hash ? dt.p : nullptr; ag.token_ids = di.p;
    ag.out_idx = didx.p; ag.out_weight = dw.p;
    gpu()->route(ag);
    gpu()->synchronize();
    EXPECT_EQ(didx.host(), idx_cpu);
    EXPECT_LE(rel_err(dw.host(), w_cpu), kTol);
  }
}

TEST(CudaOps, MoeExperts) {
  V4_GPU_OPS();
  struct Case { int D, I, E, k; float limit; int64_t S; };
  for (Case c : {Case{256, 128, 8, 3, 10.f, 5}, Case{67, 33, 3, 2, 0.f, 4}, Case{1024, 512, 4, 6, 10.f, 3},
                 Case{512, 256, 1, 1, 10.f, 9}}) {
    SCOPED_TRACE(::testing::Message() << "D=" << c.D << " I=" << c.I << " E=" << c.E << " k=" << c.k);
    auto x = randn(size_t(c.S * c.D), 2.f);
    auto w13 = randn(size_t(c.E) * 2 * c.I * c.D, 0.5f / std::sqrt(float(c.D)));
    auto w2 = randn(size_t(c.E) * c.D * c.I, 1.f / std::sqrt(float(c.I)));
    std::vector<int32_t> idx(size_t(c.S * c.k));
    for (auto& e : idx) e = rand_int(0, c.E - 1);  // duplicates allowed (hash layers)
    auto wt = randn(idx.size());
    MoeArgs a;
    a.n_rows = c.S; a.hidden = c.D; a.inter = c.I; a.n_experts = c.E; a.topk = c.k;
    a.swiglu_limit = c.limit;
    std::vector<float> out_cpu(size_t(c.S * c.D), kNaN);
    MoeArgs ac = a;
    ac.x = x.data(); ac.w13 = ops::WeightView::f32(w13.data(), 2 * c.I, c.D); ac.w13.experts = c.E; ac.w2 = ops::WeightView::f32(w2.data(), c.D, c.I); ac.w2.experts = c.E; ac.idx = idx.data();
    ac.weight = wt.data(); ac.out = out_cpu.data();
    cpu()->moe_experts(ac);
    Dev<float> dx(x), dw13(w13), dw2(w2), dwt(wt), dout(out_cpu.size());
    Dev<int32_t> didx(idx);
    dout.poison();
    MoeArgs ag = a;
    ag.x = dx.p; ag.w13 = ops::WeightView::f32(dw13.p, 2 * c.I, c.D); ag.w13.experts = c.E; ag.w2 = ops::WeightView::f32(dw2.p, c.D, c.I); ag.w2.experts = c.E; ag.idx = didx.p; ag.weight = dwt.p; ag.out = dout.p;
    gpu()->moe_experts(ag);
    gpu()->synchronize();
    EXPECT_LE(rel_err(dout.host(), out_cpu), kTol);
  }
}

TEST(CudaOps, AllocIsZeroedAndReusable) {
  V4_GPU_OPS();
  for (int round = 0; round < 3; ++round) {
    float* p = static_cast<float*>(gpu()->alloc(1000 * sizeof(float)));
    std::vector<float> h(1000, 1.f);
    gpu()->download(h.data(), p, h.size() * sizeof(float));
    for (float v : h) ASSERT_EQ(v, 0.f);
    std::vector<float> ones(1000, 3.f);
    gpu()->upload(p, ones.data(), ones.size() * sizeof(float));
    gpu()->free(p);  // next round may get the same block back: it must be zeroed again
  }
}

}  // namespace
}  // namespace v4::ops
