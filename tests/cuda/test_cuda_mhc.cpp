// The fused mHC kernels (ops/cuda/mhc.h mhc_fused, mhc_post_add) through the CUDA Ops methods
// hc_pre, hc_pre_norm, hc_head, hc_head_norm, hc_post, hc_post_add (and rms_norm_rope,
// norm_rope.h): against the CPU op
// sequences (hc_pre + rms_norm, hc_head + rms_norm, add + hc_post) at batch 1, 7, 33, 64 in both
// precision modes; batch invariance (a row alone vs inside a batch, bit for bit); repeated calls
// (the finishing counters reset themselves); in-place forms. Tolerance (testing.md): fp32 ops
// ≤ 1e-5 relative to the largest output magnitude. Outputs are NaN-poisoned before every run.
#include <gtest/gtest.h>

#include <cstdlib>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <vector>

#include "cuda_test_util.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/norm_rope.h"
#include "ops/ops.h"

namespace v4::ops {
namespace {

using cuda::testing::Dev;
using cuda::testing::randn;
using cuda::testing::rel_err;
using cuda::testing::ScopedEnv;

constexpr double kTol = 1e-5;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

Ops* cpu() {
  static auto o = make_cpu_ops();
  return o.get();
}
// One backend per precision mode (the mHC kernels are the same in both; the modes differ in
// their scratch reservations and in which GEMM paths run around them).
Ops* gpu(Precision p) {
  static std::unique_ptr<Ops> o[2];
  const int i = p == Precision::kBf16 ? 1 : 0;
  if (!o[i]) {
    CudaOptions opts;
    opts.precision = p;
    auto r = make_cuda_ops(opts);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) o[i] = std::move(r).value();
  }
  return o[i].get();
}

struct Case {
  int n, D, iters;
};

bool same_bits(const std::vector<float>& a, const float* b, size_t count) {
  return a.size() >= count && std::memcmp(a.data(), b, count * sizeof(float)) == 0;
}

// Inputs of one mHC pre site, host and device.
struct PreSite {
  Case c;
  int64_t S;
  std::vector<float> h, fn, base, scale, w;
  PreSite(Case cs, int64_t rows) : c(cs), S(rows) {
    const int n = c.n, D = c.D, nmix = (2 + n) * n;
    h = randn(size_t(S * n * D));
    fn = randn(size_t(nmix) * n * D, 1.f / std::sqrt(float(n * D)));
    base = randn(size_t(nmix), 0.5f);
    scale = randn(3, 0.7f);
    w = randn(size_t(D), 1.f);
  }
  HcArgs args(const float* hp, const float* fnp, const float* bp, const float* sp, int64_t rows) const {
    HcArgs a;
    a.h = hp;
    a.fn = fnp;
    a.base = bp;
    a.scale = sp;
    a.n_rows = rows;
    a.n_streams = c.n;
    a.hidden = c.D;
    a.rms_eps = 1e-6f;
    a.hc_eps = 1e-6f;
    a.sinkhorn_iters = c.iters;
    return a;
  }
};

struct PreOut {
  std::vector<float> col, post, comb, x;
};

PreOut cpu_pre_norm(const PreSite& s) {
  const int64_t S = s.S;
  const int n = s.c.n, D = s.c.D;
  PreOut o{std::vector<float>(size_t(S * D), kNaN), std::vector<float>(size_t(S * n), kNaN),
           std::vector<float>(size_t(S * n * n), kNaN), std::vector<float>(size_t(S * D), kNaN)};
  HcArgs a = s.args(s.h.data(), s.fn.data(), s.base.data(), s.scale.data(), S);
  a.collapsed = o.col.data();
  a.post = o.post.data();
  a.comb = o.comb.data();
  cpu()->hc_pre(a);
  cpu()->rms_norm(o.col.data(), s.w.data(), S, D, 1e-5f, o.x.data());
  return o;
}

// hc_pre_norm on the GPU for rows [r0, r0 + rows) of the site (rows = S: the whole batch);
// norm = false runs plain hc_pre (x stays poisoned, not returned).
PreOut gpu_pre(Ops* g, const PreSite& s, int64_t r0, int64_t rows, bool norm) {
  const int n = s.c.n, D = s.c.D;
  Dev<float> dh(s.h), dfn(s.fn), dbase(s.base), dscale(s.scale), dw(s.w);
  Dev<float> dcol(size_t(rows * D)), dpost(size_t(rows * n)), dcomb(size_t(rows * n * n)),
      dx(size_t(rows * D));
  dcol.poison();
  dpost.poison();
  dcomb.poison();
  dx.poison();
  HcArgs a = s.args(dh.p + r0 * n * D, dfn.p, dbase.p, dscale.p, rows);
  a.collapsed = dcol.p;
  a.post = dpost.p;
  a.comb = dcomb.p;
  if (norm) g->hc_pre_norm(a, dw.p, 1e-5f, dx.p);
  else g->hc_pre(a);
  g->synchronize();
  return {dcol.host(), dpost.host(), dcomb.host(), norm ? dx.host() : std::vector<float>{}};
}

const Case kCases[] = {{4, 4096, 20}, {4, 37, 20}, {2, 64, 3}, {1, 9, 1}, {3, 100, 7}};

// Rows [r0, r0 + rows) of `site` computed on their own (gpu_pre over just them) equal, bit for
// bit, the same rows of `all` (the whole site in one call): collapsed, post, comb and x.
struct SubRows {
  int64_t r0, rows;
};
void expect_rows_as_in(Ops* g, const PreSite& site, const PreOut& all,
                       std::initializer_list<SubRows> subs) {
  const int n = site.c.n, D = site.c.D;
  for (SubRows sub : subs) {
    SCOPED_TRACE(::testing::Message() << "rows " << sub.r0 << "+" << sub.rows);
    const PreOut part = gpu_pre(g, site, sub.r0, sub.rows, true);
    EXPECT_TRUE(same_bits(part.col, all.col.data() + sub.r0 * D, size_t(sub.rows * D)));
    EXPECT_TRUE(same_bits(part.post, all.post.data() + sub.r0 * n, size_t(sub.rows * n)));
    EXPECT_TRUE(same_bits(part.comb, all.comb.data() + sub.r0 * n * n, size_t(sub.rows * n * n)));
    EXPECT_TRUE(same_bits(part.x, all.x.data() + sub.r0 * D, size_t(sub.rows * D)));
  }
}

TEST(CudaMhc, PreNormMatchesCpu) {
  V4_REQUIRE_GPU();
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    Ops* g = gpu(p);
    ASSERT_NE(g, nullptr);
    for (Case c : kCases)
      for (int64_t S : {1, 7, 33, 64}) {
        SCOPED_TRACE(::testing::Message() << precision_name(p) << " n=" << c.n << " D=" << c.D
                                          << " iters=" << c.iters << " S=" << S);
        PreSite site(c, S);
        const PreOut ref = cpu_pre_norm(site);
        const PreOut got = gpu_pre(g, site, 0, S, true);
        EXPECT_LE(rel_err(got.col, ref.col), kTol);
        EXPECT_LE(rel_err(got.post, ref.post), kTol);
        EXPECT_LE(rel_err(got.comb, ref.comb), kTol);
        EXPECT_LE(rel_err(got.x, ref.x), kTol);
        // Plain hc_pre is the same kernel without the norm: the same bits.
        const PreOut plain = gpu_pre(g, site, 0, S, false);
        EXPECT_TRUE(same_bits(plain.col, got.col.data(), got.col.size()));
        EXPECT_TRUE(same_bits(plain.post, got.post.data(), got.post.size()));
        EXPECT_TRUE(same_bits(plain.comb, got.comb.data(), got.comb.size()));
        // Sinkhorn sanity: columns sum to ~1.
        for (int64_t t = 0; t < S && c.iters >= 3; ++t)
          for (int k = 0; k < c.n; ++k) {
            float sum = 0;
            for (int j = 0; j < c.n; ++j) sum += got.comb[(t * c.n + j) * c.n + k];
            EXPECT_NEAR(sum, 1.f, 1e-3f);
          }
      }
  }
}

// fp32 mode: a row's results do not depend on the batch around it (the chunking and the order of
// every sum are fixed by n and D; the grouping of tokens per CTA changes with S).
TEST(CudaMhc, PreNormIsBatchInvariant) {
  V4_REQUIRE_GPU();
  Ops* g = gpu(Precision::kFp32);
  ASSERT_NE(g, nullptr);
  for (Case c : {Case{4, 4096, 20}, Case{4, 37, 20}, Case{3, 100, 7}}) {
    const int64_t S = 64;
    SCOPED_TRACE(::testing::Message() << "n=" << c.n << " D=" << c.D);
    PreSite site(c, S);
    const PreOut all = gpu_pre(g, site, 0, S, true);
    expect_rows_as_in(g, site, all, {{0, 1}, {5, 1}, {63, 1}, {9, 7}, {20, 33}, {3, 4}});
  }
}

// Prefill-sized calls (S > 256) take the two-launch form — chunk sums by
// mhc_partials_dfs_kernel, then the finishing phase — (or, with V4_MHC_DFS=0, the one-launch
// form with G = S / 128 tokens per CTA): every row's results equal, bit for bit, those of the same
// row computed alone or in a small batch (≤ 256 rows: the one-launch shuffle form), in both modes;
// odd n·D (partly empty chunks and warp slices) included.
TEST(CudaMhc, PreNormPrefillGroupsAreBatchInvariant) {
  V4_REQUIRE_GPU();
  Ops* g = gpu(Precision::kFp32);
  ASSERT_NE(g, nullptr);
  for (const char* dfs : {"1", "0"})
    for (Case c : {Case{4, 4096, 20}, Case{3, 100, 7}, Case{4, 37, 20}})
      for (int64_t S : {int64_t(700), int64_t(2100)}) {  // G = 5 and 16
        if (c.D != 4096 && S != 700) continue;
        SCOPED_TRACE(::testing::Message() << "V4_MHC_DFS=" << dfs << " n=" << c.n << " D=" << c.D
                                          << " S=" << S);
        setenv("V4_MHC_DFS", dfs, 1);
        PreSite site(c, S);
        const PreOut all = gpu_pre(g, site, 0, S, true);
        expect_rows_as_in(g, site, all, {{0, 1}, {S - 1, 1}, {S / 2, 7}, {3, 64}, {17, 300}});
        unsetenv("V4_MHC_DFS");
      }
}

// The three phase-1 forms of mhc_fused_kernel (V4_MHC_ONE_TRIP: the strided loop "0", the
// one-round-trip form sized for 16-token groups "16", the default's 2-token instance at decode
// sizes) give the same bits for the pre site (S = 1, 2, 64, 200: G = 1 and 2) and the head
// (there S = 700 too: G = 5, the 16-token instance against the loop), at V4-Flash's n·D (one
// element per thread) and at an odd D (partly empty chunks).
TEST(CudaMhc, PhaseOneFormsSameBits) {
  V4_REQUIRE_GPU();
  Ops* g = gpu(Precision::kFp32);
  ASSERT_NE(g, nullptr);
  for (Case c : {Case{4, 4096, 20}, Case{3, 100, 7}})
    for (int64_t S : {int64_t(1), int64_t(2), int64_t(64), int64_t(200), int64_t(700)}) {
      SCOPED_TRACE(::testing::Message() << "n=" << c.n << " D=" << c.D << " S=" << S);
      const int n = c.n, D = c.D;
      PreSite site(c, S);
      Dev<float> dh(site.h), dfn(site.fn), dbase(site.base), dscale(site.scale), dw(site.w);
      auto head = [&]() {  // hc_head_norm of the same h with the first n rows of fn
        Dev<float> dx(size_t(S * D));
        dx.poison();
        g->hc_head_norm(dh.p, dfn.p, dbase.p, dscale.p, S, n, D, 1e-6f, 1e-6f, dw.p, 1e-5f, dx.p);
        g->synchronize();
        return dx.host();
      };
      PreOut ref;
      std::vector<float> ref_head;
      {
        ScopedEnv def("V4_MHC_ONE_TRIP", nullptr);
        ref = gpu_pre(g, site, 0, S, true);
        ref_head = head();
      }
      for (const char* form : {"0", "16"}) {
        SCOPED_TRACE(::testing::Message() << "V4_MHC_ONE_TRIP=" << form);
        ScopedEnv env("V4_MHC_ONE_TRIP", form);
        const PreOut got = gpu_pre(g, site, 0, S, true);
        const std::vector<float> got_head = head();
        EXPECT_TRUE(same_bits(got.col, ref.col.data(), ref.col.size()));
        EXPECT_TRUE(same_bits(got.post, ref.post.data(), ref.post.size()));
        EXPECT_TRUE(same_bits(got.comb, ref.comb.data(), ref.comb.size()));
        EXPECT_TRUE(same_bits(got.x, ref.x.data(), ref.x.size()));
        EXPECT_TRUE(same_bits(got_head, ref_head.data(), ref_head.size()));
      }
    }
}

// Many calls in a row on the same backend (the finishing counters must be back at zero after
// each), different S between them, and the in-place form x == collapsed.
TEST(CudaMhc, PreNormRepeatedAndInPlace) {
  V4_REQUIRE_GPU();
  Ops* g = gpu(Precision::kFp32);
  ASSERT_NE(g, nullptr);
  const Case c{4, 4096, 20};
  PreSite site(c, 64);
  const PreOut ref = cpu_pre_norm(site);
  const PreOut first = gpu_pre(g, site, 0, 64, true);
  EXPECT_LE(rel_err(first.x, ref.x), kTol);
  for (int64_t S : {1, 64, 7, 64, 2, 64}) {
    const PreOut again = gpu_pre(g, site, 0, S, true);
    EXPECT_TRUE(same_bits(again.x, first.x.data(), size_t(S * c.D))) << "S=" << S;
  }
  // x == collapsed: the buffer ends up holding x.
  const int n = c.n, D = c.D;
  const int64_t S = 64;
  Dev<float> dh(site.h), dfn(site.fn), dbase(site.base), dscale(site.scale), dw(site.w);
  Dev<float> dcx(size_t(S * D)), dpost(size_t(S * n)), dcomb(size_t(S * n * n));
  dcx.poison();
  HcArgs a = site.args(dh.p, dfn.p, dbase.p, dscale.p, S);
  a.collapsed = dcx.p;
  a.post = dpost.p;
  a.comb = dcomb.p;
  g->hc_pre_norm(a, dw.p, 1e-5f, dcx.p);
  g->synchronize();
  EXPECT_TRUE(same_bits(dcx.host(), first.x.data(), first.x.size()));
  // Unweighted norm.
  std::vector<float> x_ref(size_t(S * D), kNaN);
  cpu()->rms_norm(ref.col.data(), nullptr, S, D, 1e-5f, x_ref.data());
  Dev<float> dcol(size_t(S * D)), dx(size_t(S * D));
  dx.poison();
  a.collapsed = dcol.p;
  g->hc_pre_norm(a, nullptr, 1e-5f, dx.p);
  g->synchronize();
  EXPECT_LE(rel_err(dx.host(), x_ref), kTol);
}

TEST(CudaMhc, HeadNormMatchesCpu) {
  V4_REQUIRE_GPU();
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    Ops* g = gpu(p);
    ASSERT_NE(g, nullptr);
    for (Case c : kCases)
      for (int64_t S : {1, 7, 64}) {
        SCOPED_TRACE(::testing::Message() << precision_name(p) << " n=" << c.n << " D=" << c.D
                                          << " S=" << S);
        const int n = c.n, D = c.D;
        auto h = randn(size_t(S * n * D));
        auto fn = randn(size_t(n) * n * D, 1.f / std::sqrt(float(n * D)));
        auto base = randn(size_t(n), 0.5f), scale = randn(1, 0.7f), w = randn(size_t(D), 1.f);
        std::vector<float> y_ref(size_t(S * D), kNaN), x_ref(size_t(S * D), kNaN);
        cpu()->hc_head(h.data(), fn.data(), base.data(), scale.data(), S, n, D, 1e-6f, 1e-6f,
                       y_ref.data());
        cpu()->rms_norm(y_ref.data(), w.data(), S, D, 1e-5f, x_ref.data());
        Dev<float> dh(h), dfn(fn), dbase(base), dscale(scale), dw(w), dy(size_t(S * D)),
            dx(size_t(S * D));
        dy.poison();
        dx.poison();
        g->hc_head(dh.p, dfn.p, dbase.p, dscale.p, S, n, D, 1e-6f, 1e-6f, dy.p);
        g->hc_head_norm(dh.p, dfn.p, dbase.p, dscale.p, S, n, D, 1e-6f, 1e-6f, dw.p, 1e-5f, dx.p);
        g->synchronize();
        EXPECT_LE(rel_err(dy.host(), y_ref), kTol);
        EXPECT_LE(rel_err(dx.host(), x_ref), kTol);
        if (p == Precision::kFp32 && S == 64) {  // batch invariance of the head
          Dev<float> dx1(static_cast<size_t>(D));
          dx1.poison();
          g->hc_head_norm(dh.p + 17 * n * D, dfn.p, dbase.p, dscale.p, 1, n, D, 1e-6f, 1e-6f, dw.p,
                          1e-5f, dx1.p);
          g->synchronize();
          EXPECT_TRUE(same_bits(dx1.host(), dx.host().data() + 17 * D, size_t(D)));
        }
      }
  }
}

TEST(CudaMhc, PostAddMatchesCpu) {
  V4_REQUIRE_GPU();
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    Ops* g = gpu(p);
    ASSERT_NE(g, nullptr);
    for (Case c : kCases)
      for (int64_t S : {1, 7, 64}) {
        SCOPED_TRACE(::testing::Message() << precision_name(p) << " n=" << c.n << " D=" << c.D
                                          << " S=" << S);
        const int n = c.n, D = c.D;
        auto h = randn(size_t(S * n * D)), f = randn(size_t(S * D)), fa = randn(size_t(S * D));
        auto post = randn(size_t(S * n), 0.7f), comb = randn(size_t(S * n * n), 0.5f);
        // CPU: add + hc_post, and hc_post alone.
        auto h_add = h, h_plain = h, f_sum = f;
        cpu()->add(f_sum.data(), fa.data(), S * D);
        cpu()->hc_post(h_add.data(), f_sum.data(), post.data(), comb.data(), S, n, D);
        cpu()->hc_post(h_plain.data(), f.data(), post.data(), comb.data(), S, n, D);
        Dev<float> dh1(h), dh2(h), df(f), dfa(fa), dpost(post), dcomb(comb);
        g->hc_post_add(dh1.p, df.p, dfa.p, dpost.p, dcomb.p, S, n, D);
        g->hc_post(dh2.p, df.p, dpost.p, dcomb.p, S, n, D);  // f unchanged by hc_post_add
        g->synchronize();
        EXPECT_LE(rel_err(dh1.host(), h_add), kTol);
        EXPECT_LE(rel_err(dh2.host(), h_plain), kTol);
      }
  }
}

// rms_norm_rope (q heads: unweighted, 64 × 512; kv: weighted, 1 × 512; odd shapes) vs the CPU
// rms_norm + rope, both precision modes, batch 1/7/64; batch invariance in fp32 mode.
TEST(CudaNormRope, MatchesCpu) {
  V4_REQUIRE_GPU();
  struct Shape { int heads, hd, rd; bool weighted; };
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    Ops* g = gpu(p);
    ASSERT_NE(g, nullptr);
    for (Shape s : {Shape{64, 512, 64, false}, Shape{1, 512, 64, true}, Shape{3, 34, 10, true},
                    Shape{2, 40, 40, false}, Shape{5, 7 * 2, 2, true}})
      for (int64_t rows : {1, 7, 64})
        for (float att : {1.f, 1.2772589f}) {
          SCOPED_TRACE(::testing::Message() << precision_name(p) << " heads=" << s.heads << " hd="
                                            << s.hd << " rd=" << s.rd << " rows=" << rows
                                            << " att=" << att);
          auto x = randn(size_t(rows * s.heads * s.hd), 3.f);
          auto w = randn(size_t(s.hd), 1.f);
          std::vector<int64_t> pos(static_cast<size_t>(rows));
          for (auto& q : pos) q = cuda::testing::rand_int(0, 1 << 20);
          pos[0] = 0;
          std::vector<float> inv(size_t(s.rd / 2));
          for (int i = 0; i < s.rd / 2; ++i) inv[size_t(i)] = 1.f / std::pow(160000.f, 2.f * i / s.rd);
          const float* wp = s.weighted ? w.data() : nullptr;
          auto ref = x;
          cpu()->rms_norm(ref.data(), wp, rows * s.heads, s.hd, 1e-6f, ref.data());
          cpu()->rope(ref.data(), rows, s.heads, s.hd, s.rd, pos.data(), inv.data(), att, false);
          Dev<float> dx(x), dw(w), dinv(inv);
          Dev<int64_t> dpos(pos);
          g->rms_norm_rope(dx.p, s.weighted ? dw.p : nullptr, rows, s.heads, s.hd, 1e-6f, s.rd,
                           dpos.p, dinv.p, att);
          g->synchronize();
          const auto y = dx.host();
          EXPECT_LE(rel_err(y, ref), kTol);
          if (p == Precision::kFp32 && rows == 64) {  // row 9 alone: the same bits
            Dev<float> d1(std::vector<float>(x.begin() + 9 * s.heads * s.hd,
                                             x.begin() + 10 * s.heads * s.hd));
            g->rms_norm_rope(d1.p, s.weighted ? dw.p : nullptr, 1, s.heads, s.hd, 1e-6f, s.rd,
                             dpos.p + 9, dinv.p, att);
            g->synchronize();
            EXPECT_TRUE(same_bits(d1.host(), y.data() + 9 * s.heads * s.hd, size_t(s.heads * s.hd)));
          }
        }
  }
}

// The register kernel of rmsnorm_rope (variant 2, V4_NORM_ROPE_REGS=1) against the default one
// (variant 1): the same bits for V4's shapes (q heads 64 × 512 unweighted, kv 1 × 512 weighted,
// indexer 64 × 128), odd shapes and 900K-sized positions; head_dim > 512 is refused.
TEST(CudaNormRope, RegisterKernelSameBits) {
  V4_REQUIRE_GPU();
  struct Shape { int heads, hd, rd; bool weighted; };
  for (Shape s : {Shape{64, 512, 64, false}, Shape{1, 512, 64, true}, Shape{64, 128, 64, false},
                  Shape{3, 34, 10, true}, Shape{5, 7 * 2, 2, true}, Shape{2, 500, 36, true}})
    for (int64_t rows : {1, 9}) {
      SCOPED_TRACE(::testing::Message() << "heads=" << s.heads << " hd=" << s.hd << " rd=" << s.rd
                                        << " rows=" << rows);
      auto x = randn(size_t(rows * s.heads * s.hd), 3.f);
      auto w = randn(size_t(s.hd), 1.f);
      std::vector<int64_t> pos(static_cast<size_t>(rows));
      for (auto& q : pos) q = cuda::testing::rand_int(0, 1 << 20);
      std::vector<float> inv(size_t(s.rd / 2));
      for (int i = 0; i < s.rd / 2; ++i) inv[size_t(i)] = 1.f / std::pow(160000.f, 2.f * i / s.rd);
      Dev<float> dw(w), dinv(inv);
      Dev<int64_t> dpos(pos);
      std::vector<float> y[2];
      for (int variant : {1, 2}) {
        Dev<float> dx(x);
        const Status st = cuda::rmsnorm_rope_variant(dx.p, s.weighted ? dw.p : nullptr, dpos.p,
                                                     dinv.p, rows, s.heads, s.hd, s.rd, 1e-6f, 1.f,
                                                     variant, nullptr);
        ASSERT_TRUE(st.ok()) << st.to_string();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        y[variant - 1] = dx.host();
      }
      EXPECT_TRUE(same_bits(y[0], y[1].data(), y[0].size()));
      EXPECT_NE(y[0], x) << "the kernel did not run";
    }
  Dev<float> dx(std::vector<float>(520, 1.f));
  EXPECT_FALSE(cuda::rmsnorm_rope_variant(dx.p, nullptr, nullptr, nullptr, 1, 1, 520, 64, 1e-6f,
                                          1.f, 2, nullptr)
                   .ok());
}

}  // namespace
}  // namespace v4::ops
