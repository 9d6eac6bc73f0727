// The warpgroup-MMA decode indexer kernel (indexer_scores_tc variants 8 / 9, heads on M, and 10 / 11 / 12, keys on M: wgmma.m64n64k16 over
// 64-key tiles gathered by cp.async into a shared-memory ring, src/ops/cuda/indexer.cu) on bf16
// key pools:
//  - per key against a double-precision reference of the same math on bf16-rounded q and keys
//    (|got − ref| ≤ 1e-3 × the row's largest |ref|), and the checker itself is shown to reject
//    the output against references of plausible layout mistakes (dims swapped between the two
//    8-dim core matrices of a k-step, keys swapped in pairs, heads g ↔ g + 8 swapped);
//  - per key against the mma.sync decode kernel (variant 3), same tolerance (the summation order
//    differs, so not bit for bit), PDL off and on;
//  - the top-512 sets of both kernels (and of Ops::indexer_topk with the variant forced) equal
//    on N(0, 1) data whose 512th and 513th scores are well separated;
//  - batch 1 at 1K / 64K / 230,400 keys, short rows 0 / 1 / 15 / 63 / 64 / 65 / 1000, batch 64
//    of mixed lengths (≤ 3,000 with the reference, ≤ 230,400 against variant 3), −1 candidates,
//    a 3-SM grid (every CTA wraps its ring many times); outputs poisoned (NaN) first: entries at
//    or beyond count[t] must stay poisoned, entries below must be written;
//  - fp8 / f32 key pools under variants 8 / 9 run the default decode kernel (bit for bit).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "base/dtype.h"
#include "base/kv_fp8.h"
#include "cuda_test_util.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/indexer.h"
#include "ops/ops.h"

namespace v4::ops {
namespace {

using cuda::testing::Dev;
using cuda::testing::rand_int;
using cuda::testing::randn;
using cuda::testing::rng;

constexpr int kNI = 64, kDI = 128;
constexpr double kTol = 1e-3;  // × the row's largest |reference score|


// bf16 key pool of `rows` rows: N(0, 1) rounded to bf16; `values` = the same as f32.
struct Bf16Pool {
  std::vector<uint16_t> bits;
  std::vector<float> values;  // [rows, dI]
  explicit Bf16Pool(int64_t rows) : bits(size_t(rows) * kDI), values(size_t(rows) * kDI) {
    auto x = randn(bits.size(), 1.f);
    for (size_t i = 0; i < x.size(); ++i) {
      bits[i] = f32_to_bf16(x[i]);
      values[i] = bf16_to_f32(bits[i]);
    }
  }
};

// Candidate lists: runs of 64 consecutive pool rows from a random page order (distinct rows within
// a list), about `invalid_per_mille` / 1000 of the entries replaced by −1.
struct Lists {
  std::vector<int32_t> rows, count;
  std::vector<int64_t> offset;
  void add(const std::vector<int32_t>& list) {
    offset.push_back(int64_t(rows.size()));
    count.push_back(int32_t(list.size()));
    rows.insert(rows.end(), list.begin(), list.end());
  }
  const int32_t* list(int64_t t) const { return rows.data() + offset[size_t(t)]; }
};
std::vector<int32_t> make_list(int c, int64_t pool_rows, int invalid_per_mille) {
  std::vector<int32_t> pages(size_t(pool_rows / 64)), l;
  EXPECT_LE(int64_t(c), int64_t(pages.size()) * 64);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng());
  for (int s = 0; s < c; ++s)
    l.push_back(invalid_per_mille && rand_int(0, 999) < invalid_per_mille
                    ? -1
                    : pages[size_t(s / 64)] * 64 + s % 64);
  return l;
}
Lists make_lists(const std::vector<int>& counts, int64_t pool_rows, int invalid_per_mille) {
  Lists l;
  for (int c : counts) l.add(make_list(c, pool_rows, invalid_per_mille));
  if (l.rows.empty()) l.rows.push_back(0);  // a valid pointer for all-empty batches
  return l;
}

// Layout mistakes the checker must reject (references of the wrong math).
enum class Wrong { kNone, kDimHalves, kKeyPairs, kHeadHalves };

// Reference scores of row t (double): Σ_h ReLU(q_h · k) · w_h · nI^-1/2 · dI^-1/2 with q rounded
// to bf16; −1 candidates score 0.
std::vector<double> ref_row(const std::vector<float>& q, const std::vector<float>& w,
                            const Bf16Pool& pool, const int32_t* list, int count, int64_t t,
                            Wrong wrong = Wrong::kNone) {
  std::vector<double> qd(size_t(kNI) * kDI), wd(kNI);
  const double wscale = 1.0 / std::sqrt(double(kNI)) / std::sqrt(double(kDI));
  for (int h = 0; h < kNI; ++h) {
    const int hw = wrong == Wrong::kHeadHalves ? (h ^ 8) : h;
    wd[size_t(h)] = double(w[size_t(t * kNI + hw)]) * wscale;
    for (int k = 0; k < kDI; ++k)
      qd[size_t(h * kDI + k)] = double(round_bf16(q[size_t((t * kNI + h) * kDI + k)]));
  }
  std::vector<double> out(static_cast<size_t>(count));
  for (int s = 0; s < count; ++s) {
    const int sk = wrong == Wrong::kKeyPairs ? std::min(s ^ 1, count - 1) : s;
    const int32_t r = list[sk];
    if (r < 0) continue;
    const float* key = &pool.values[size_t(r) * kDI];
    double kd[kDI];
    for (int k = 0; k < kDI; ++k) kd[k] = key[wrong == Wrong::kDimHalves ? (k ^ 8) : k];
    double acc = 0;
    for (int h = 0; h < kNI; ++h) {
      const double* qh = &qd[size_t(h * kDI)];
      double dot = 0;
      for (int k = 0; k < kDI; ++k) dot += qh[k] * kd[k];
      acc += std::max(0.0, dot) * wd[size_t(h)];
    }
    out[size_t(s)] = acc;
  }
  return out;
}

// max_s |got[s] − ref[s]| / max_s |ref[s]| over s < ref.size() (NaN → +inf).
double row_err(const float* got, const std::vector<double>& ref) {
  double num = 0, den = 1e-30;
  for (size_t s = 0; s < ref.size(); ++s) {
    if (std::isnan(got[s])) return INFINITY;
    num = std::max(num, std::fabs(double(got[s]) - ref[s]));
    den = std::max(den, std::fabs(ref[s]));
  }
  return num / den;
}
std::vector<double> as_double(const float* p, int count) { return {p, p + count}; }

// Entries below count[t] written (not NaN), at or beyond it untouched (still NaN).
void expect_well_formed(const std::vector<float>& out, const Lists& l, int64_t S, int64_t ld,
                        const char* what) {
  int64_t unwritten = 0, overwritten = 0;
  for (int64_t t = 0; t < S; ++t)
    for (int64_t s = 0; s < ld; ++s) {
      const bool nan = std::isnan(out[size_t(t * ld + s)]);
      if (s < l.count[size_t(t)]) unwritten += nan;
      else overwritten += !nan;
    }
  EXPECT_EQ(unwritten, 0) << what;
  EXPECT_EQ(overwritten, 0) << what;
}

struct Problem {
  int64_t S = 0, ld = 0;
  int maxc = 1;
  Lists l;
  std::vector<float> q, w;
  std::unique_ptr<Dev<float>> dq, dw;
  std::unique_ptr<Dev<int32_t>> drows, dcount;
  std::unique_ptr<Dev<int64_t>> doff;
  IndexerArgs a;
  Problem(Lists lists, const Dev<uint16_t>& pool) : l(std::move(lists)) {
    S = int64_t(l.count.size());
    for (int c : l.count) maxc = std::max(maxc, c);
    ld = maxc + 5;  // odd on purpose
    q = randn(size_t(S * kNI * kDI), 1.f);
    w = randn(size_t(S * kNI), 1.f);
    dq = std::make_unique<Dev<float>>(q);
    dw = std::make_unique<Dev<float>>(w);
    drows = std::make_unique<Dev<int32_t>>(l.rows);
    dcount = std::make_unique<Dev<int32_t>>(l.count);
    doff = std::make_unique<Dev<int64_t>>(l.offset);
    a.q = dq->p; a.weights = dw->p; a.key_pool = pool.p; a.key_dtype = KvDtype::kBf16;
    a.cand = {drows->p, doff->p, dcount->p};
    a.n_rows = S; a.n_heads = kNI; a.head_dim = kDI;
  }
  // Scores of `variant` (poisoned output first), host copy.
  std::vector<float> run(int variant, int n_sms, bool pdl = false) {
    Dev<float> out(size_t(S * ld));
    out.poison();
    EXPECT_TRUE(cuda::indexer_scores_tc(a, maxc, out.p, ld, n_sms, nullptr, variant, pdl).ok())
        << "variant " << variant;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "variant " << variant;
    return out.host();
  }
};

TEST(CudaIndexerWg, MatchesReferenceAndDecodeKernel) {
  V4_REQUIRE_GPU();
  const int64_t pool_rows = 262144;
  Bf16Pool pool(pool_rows);
  Dev<uint16_t> dpool(pool.bits);
  std::vector<int> b64_short(64), b64_long(64);
  for (int& c : b64_short) c = rand_int(0, 3000);
  b64_short[5] = 0; b64_short[6] = 1; b64_short[7] = 64; b64_short[8] = 65;
  for (int& c : b64_long) c = rand_int(0, 230400);
  b64_long[0] = 0; b64_long[1] = 1; b64_long[2] = 63; b64_long[3] = 230400; b64_long[4] = 65536;
  struct Case { std::vector<int> counts; int n_sms; int invalid_per_mille; bool ref; };
  const Case cases[] = {
      {{1024}, 132, 0, true},
      {{65536}, 132, 0, true},
      {{230400}, 132, 0, true},
      {{230400}, 132, 3, false},
      {{0, 1, 15, 63, 64, 65, 1000}, 132, 20, true},
      {{70001, 5000}, 3, 5, false},  // 3-SM grid: each CTA wraps its ring many times
      {b64_short, 132, 10, true},
      {b64_long, 132, 1, false},
  };
  for (const Case& c : cases) {
    Problem p(make_lists(c.counts, pool_rows, c.invalid_per_mille), dpool);
    SCOPED_TRACE(::testing::Message() << "S=" << p.S << " max count " << p.maxc << " n_sms "
                                      << c.n_sms << " invalid ‰ " << c.invalid_per_mille);
    ASSERT_TRUE(cuda::indexer_decode_supported(p.a));
    const auto base = p.run(3, c.n_sms);
    expect_well_formed(base, p.l, p.S, p.ld, "variant 3");
    std::vector<std::vector<double>> ref(size_t(p.S));
    if (c.ref)
      for (int64_t t = 0; t < p.S; ++t)
        ref[size_t(t)] = ref_row(p.q, p.w, pool, p.l.list(t), p.l.count[size_t(t)], t);
    for (int variant : {8, 9, 10, 11, 12})
      for (bool pdl : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "variant " << variant << " pdl " << pdl);
        const auto got = p.run(variant, c.n_sms, pdl);
        expect_well_formed(got, p.l, p.S, p.ld, "wgmma kernel");
        double worst_ref = 0, worst_v3 = 0;
        int64_t worst_row = -1;
        for (int64_t t = 0; t < p.S; ++t) {
          const int n = p.l.count[size_t(t)];
          if (n == 0) continue;
          const float* g = &got[size_t(t * p.ld)];
          const double e3 = row_err(g, as_double(&base[size_t(t * p.ld)], n));
          if (e3 > worst_v3) worst_row = t;
          worst_v3 = std::max(worst_v3, e3);
          if (c.ref) worst_ref = std::max(worst_ref, row_err(g, ref[size_t(t)]));
        }
        std::printf("[indexer wg] v%d pdl %d S=%lld max count %d: vs variant 3 %.2e%s", variant,
                    int(pdl), (long long)p.S, p.maxc, worst_v3, c.ref ? "" : "\n");
        if (c.ref) std::printf(", vs double reference %.2e\n", worst_ref);
        EXPECT_LE(worst_v3, kTol) << "worst row " << worst_row;
        if (c.ref) {
          EXPECT_LE(worst_ref, kTol);
        }
      }
    if (c.ref) {  // variant 3 itself against the reference (the comparison above means something)
      double worst = 0;
      for (int64_t t = 0; t < p.S; ++t)
        if (p.l.count[size_t(t)] > 0)
          worst = std::max(worst, row_err(&base[size_t(t * p.ld)], ref[size_t(t)]));
      EXPECT_LE(worst, kTol) << "variant 3 vs reference";
    }
  }
}

// The per-key check rejects plausible layout mistakes: the wgmma output of a 1K row compared with
// references computed with the two 8-dim halves of every k-step swapped (a confused LBO), keys
// swapped in pairs (a wrong accumulator column map), heads g ↔ g + 8 swapped (a wrong row map)
// fails the tolerance by far, while the right reference passes.
TEST(CudaIndexerWg, CheckerRejectsWrongLayouts) {
  V4_REQUIRE_GPU();
  const int64_t pool_rows = 8192;
  Bf16Pool pool(pool_rows);
  Dev<uint16_t> dpool(pool.bits);
  Problem p(make_lists({1024}, pool_rows, 0), dpool);
  for (int variant : {8, 9, 10, 11, 12}) {
    const auto got = p.run(variant, 132);
    const int n = p.l.count[0];
    const double ok = row_err(got.data(), ref_row(p.q, p.w, pool, p.l.list(0), n, 0));
    EXPECT_LE(ok, kTol) << "variant " << variant;
    for (Wrong wr : {Wrong::kDimHalves, Wrong::kKeyPairs, Wrong::kHeadHalves}) {
      const double bad = row_err(got.data(), ref_row(p.q, p.w, pool, p.l.list(0), n, 0, wr));
      std::printf("[indexer wg] v%d: right reference %.2e, wrong layout %d %.2e\n", variant, ok,
                  int(wr), bad);
      EXPECT_GT(bad, 20 * kTol) << "variant " << variant << " wrong layout " << int(wr);
    }
  }
}

// Which reading of the descriptor strides the hardware uses: a 1K row with the kernel's
// descriptors as documented (LBO = 128 B between core matrices along K, SBO = 2048 B between 8-row
// groups) and with the two fields exchanged (cuda::indexer_wg_set_desc_swap); the documented one
// must match the reference. Both runs stay inside each operand's 16 KB, so a wrong reading gives
// wrong numbers, not a fault. Printed for the first GPU run.
TEST(CudaIndexerWg, DescriptorStrideDiagnostic) {
  V4_REQUIRE_GPU();
  const int64_t pool_rows = 8192;
  Bf16Pool pool(pool_rows);
  Dev<uint16_t> dpool(pool.bits);
  Problem p(make_lists({1024}, pool_rows, 0), dpool);
  const auto ref = ref_row(p.q, p.w, pool, p.l.list(0), p.l.count[0], 0);
  double err[2] = {};
  for (int swap = 0; swap < 2; ++swap) {
    cuda::indexer_wg_set_desc_swap(swap != 0);
    const auto got = p.run(8, 132);
    err[swap] = row_err(got.data(), ref);
  }
  cuda::indexer_wg_set_desc_swap(false);
  std::printf("[indexer wg] descriptor strides as documented: err %.2e; LBO / SBO exchanged: %.2e\n",
              err[0], err[1]);
  EXPECT_LE(err[0], kTol) << (err[1] <= kTol ? "the hardware reads LBO / SBO the other way round: "
                                               "exchange them in wg_desc (indexer.cu)"
                                             : "neither stride reading matches the reference");
}

// Top-512 sets: one N(0, 1) row of 64K candidates is scored in double, then every candidate ranked
// below 512 whose score is within 2% of the row's largest |score| under the 512th is dropped from
// the list, so the 512th and 513th scores of the new list are ≥ 2% apart (far beyond both
// kernels' error). The host top-512 of the variant 8 / 9 scores, of variant 3's and of the
// reference are then the same set, and so are the rows Ops::indexer_topk selects with
// CudaOptions::indexer_scores_variant = 8 / 9 and with the default backend (batch 1 and a batch
// of 3 such rows plus a short one).
TEST(CudaIndexerWg, Top512SetsEqualOnSeparatedScores) {
  V4_REQUIRE_GPU();
  const int k = 512;
  const int64_t pool_rows = 65536;
  Bf16Pool pool(pool_rows);
  Dev<uint16_t> dpool(pool.bits);
  auto top_set = [&](const auto* scores, int n) {
    std::vector<int> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    const int kk = std::min(k, n);
    std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(),
                      [&](int x, int y) { return scores[x] > scores[y] || (scores[x] == scores[y] && x < y); });
    return std::set<int>(idx.begin(), idx.begin() + kk);
  };
  auto make = [](int variant) {
    CudaOptions co;
    co.precision = Precision::kBf16;
    co.indexer_scores_variant = variant;
    auto made = make_cuda_ops(co);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    return std::move(made).value();
  };
  std::unique_ptr<Ops> ops0 = make(0), ops8 = make(8), ops9 = make(9);
  for (int S : {1, 4}) {
    SCOPED_TRACE(::testing::Message() << "S=" << S);
    // Draw q / w first (Problem draws them), then filter each row's list against its reference.
    Lists raw;
    for (int t = 0; t < S; ++t) raw.add(make_list(t == 3 ? 300 : 60000, pool_rows, 0));
    Problem p0(raw, dpool);
    Lists filtered;
    std::vector<std::set<int32_t>> want(static_cast<size_t>(S));  // pool rows of the reference top-512
    for (int64_t t = 0; t < S; ++t) {
      const int n = raw.count[size_t(t)];
      const auto r = ref_row(p0.q, p0.w, pool, raw.list(t), n, t);
      std::vector<int> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int x, int y) { return r[size_t(x)] > r[size_t(y)]; });
      double top = 0;
      for (double v : r) top = std::max(top, std::fabs(v));
      const double cut = n > k ? r[size_t(order[size_t(k - 1)])] - 0.02 * top : -INFINITY;
      std::vector<char> in_top(size_t(n), 0);
      for (int i = 0; i < std::min(n, k); ++i) in_top[size_t(order[size_t(i)])] = 1;
      std::vector<int32_t> list;
      for (int s = 0; s < n; ++s) {
        if (in_top[size_t(s)]) want[size_t(t)].insert(raw.list(t)[s]);
        if (in_top[size_t(s)] || r[size_t(s)] < cut) list.push_back(raw.list(t)[s]);
      }
      filtered.add(list);
    }
    // Same q / w on the filtered lists.
    Problem p(filtered, dpool);
    p.q = p0.q;
    p.w = p0.w;
    ASSERT_EQ(cudaMemcpy(p.dq->p, p.q.data(), p.q.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(p.dw->p, p.w.data(), p.w.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    const auto base = p.run(3, 132);
    for (int variant : {8, 9, 10, 11, 12}) {
      const auto got = p.run(variant, 132);
      for (int64_t t = 0; t < S; ++t) {
        const int n = p.l.count[size_t(t)];
        std::set<int32_t> rows_got, rows_base;
        for (int s : top_set(&got[size_t(t * p.ld)], n)) rows_got.insert(p.l.list(t)[s]);
        for (int s : top_set(&base[size_t(t * p.ld)], n)) rows_base.insert(p.l.list(t)[s]);
        EXPECT_EQ(rows_got, want[size_t(t)]) << "variant " << variant << " row " << t;
        EXPECT_EQ(rows_base, want[size_t(t)]) << "variant 3 row " << t;
      }
    }
    // Through Ops::indexer_topk (scores → topk_rows → finalize), the variant forced by option.
    Dev<int32_t> dout(size_t(S * k)), dcnt{size_t(S)};
    p.a.topk = k;
    p.a.max_count = p.maxc;
    p.a.out_rows = dout.p;
    p.a.out_count = dcnt.p;
    for (Ops* ops : {ops0.get(), ops8.get(), ops9.get()}) {
      dout.poison();
      dcnt.poison();
      ops->indexer_topk(p.a);
      ops->synchronize();
      const auto rows = dout.host();
      const auto cnt = dcnt.host();
      for (int64_t t = 0; t < S; ++t) {
        ASSERT_EQ(cnt[size_t(t)], int32_t(want[size_t(t)].size())) << "row " << t;
        const std::set<int32_t> got(rows.begin() + t * k, rows.begin() + t * k + cnt[size_t(t)]);
        EXPECT_EQ(got, want[size_t(t)]) << "row " << t << " backend variant "
                                        << (ops == ops0.get() ? 0 : ops == ops8.get() ? 8 : 9);
      }
    }
  }
}

// fp8 (kFp8Index) and f32 key pools: variants 8 / 9 run the decode kernel's default, bit for bit
// (fp8: variant 3; f32: variant 2).
TEST(CudaIndexerWg, OtherKeyFormatsRunTheDecodeKernel) {
  V4_REQUIRE_GPU();
  const int64_t pool_rows = 8192;
  const std::vector<int> counts = {4000, 17, 0, 8000};
  Lists l = make_lists(counts, pool_rows, 5);
  const int64_t S = int64_t(counts.size()), ld = 8003;
  auto q = randn(size_t(S * kNI * kDI), 1.f), w = randn(size_t(S * kNI), 1.f);
  Dev<float> dq(q), dw(w), out(size_t(S * ld));
  Dev<int32_t> drows(l.rows), dcount(l.count);
  Dev<int64_t> doff(l.offset);
  // fp8 rows: random codes (finite: 0x7f / 0xff skipped) and a positive scale.
  const KvFp8IndexLayout L = kv_fp8_index_layout(kDI);
  std::vector<uint8_t> fp8(size_t(pool_rows) * L.bytes);
  for (int64_t r = 0; r < pool_rows; ++r) {
    uint8_t* row = &fp8[size_t(r) * L.bytes];
    for (int c = 0; c < kDI; ++c) {
      int code = rand_int(0, 253);
      if (code >= 0x7f) ++code;
      row[c] = uint8_t(code);
    }
    const float scale = std::ldexp(1.f + float(rand_int(0, 1023)) / 1024.f, rand_int(-4, 3));
    std::memcpy(row + L.scale_off, &scale, 4);
  }
  Dev<uint8_t> dfp8(fp8);
  Dev<float> df32(randn(size_t(pool_rows) * kDI, 1.f));
  for (KvDtype dt : {KvDtype::kFp8Index, KvDtype::kF32}) {
    SCOPED_TRACE(kv_dtype_name(dt));
    IndexerArgs a;
    a.q = dq.p; a.weights = dw.p; a.key_dtype = dt;
    a.key_pool = dt == KvDtype::kF32 ? static_cast<const void*>(df32.p) : static_cast<const void*>(dfp8.p);
    a.cand = {drows.p, doff.p, dcount.p};
    a.n_rows = S; a.n_heads = kNI; a.head_dim = kDI;
    const int base_variant = dt == KvDtype::kF32 ? 2 : 3;
    out.poison();
    ASSERT_TRUE(cuda::indexer_scores_tc(a, 8000, out.p, ld, 132, nullptr, base_variant).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto base = out.host();
    expect_well_formed(base, l, S, ld, "default");
    for (int variant : {8, 9, 10, 11, 12}) {
      out.poison();
      ASSERT_TRUE(cuda::indexer_scores_tc(a, 8000, out.p, ld, 132, nullptr, variant).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got = out.host();
      EXPECT_EQ(std::memcmp(got.data(), base.data(), got.size() * 4), 0) << "variant " << variant;
    }
  }
}

}  // namespace
}  // namespace v4::ops
