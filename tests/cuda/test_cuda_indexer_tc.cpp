// Tensor-core indexer scores (src/ops/cuda/indexer.h) vs a host reference computed in double from
// the same bf16-rounded q and keys (so only the summation order differs): decode-shaped groups
// (every row its own candidate list) and prefill-shaped groups (rows of one sequence sharing a list
// with causal counts, groups crossing a sequence boundary). Untouched entries must stay poisoned.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "base/dtype.h"
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

// Random candidate lists in the shape of the paged pools: a list is runs of 64 consecutive pool
// rows (one C4 page of 256 tokens) from distinct random pages, so its pool rows are distinct.
struct Lists {
  std::vector<int32_t> rows, count;
  std::vector<int64_t> offset;
};
Lists paged_lists(const std::vector<int>& counts, int64_t pool_rows) {
  Lists l;
  std::vector<int> pages(size_t(pool_rows / 64));
  for (int c : counts) {
    EXPECT_LE(int64_t(c), int64_t(pages.size()) * 64) << "pool too small for the list";
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng());
    l.offset.push_back(int64_t(l.rows.size()));
    l.count.push_back(c);
    for (int s = 0; s < c; ++s) l.rows.push_back(pages[s / 64] * 64 + s % 64);
  }
  if (l.rows.empty()) l.rows.push_back(0);
  return l;
}

// score[s] in double for row t: Σ_h ReLU(q_h·k)·w_h·(nI·dI)^-1/2, q and keys rounded to bf16 or not.
std::vector<double> ref_row(const std::vector<float>& q, const std::vector<float>& w,
                            const std::vector<float>& pool, const int32_t* rows, int n, int64_t t,
                            int nI, int dI, bool bf16) {
  const double wscale = 1.0 / std::sqrt(double(nI)) / std::sqrt(double(dI));
  std::vector<double> qd(size_t(nI) * dI), out(n);
  for (size_t i = 0; i < qd.size(); ++i) {
    const float v = q[size_t(t) * nI * dI + i];
    qd[i] = bf16 ? round_bf16(v) : v;
  }
  std::vector<double> kd(dI);
  for (int s = 0; s < n; ++s) {
    const float* key = &pool[size_t(rows[s]) * dI];
    for (int k = 0; k < dI; ++k) kd[k] = bf16 ? round_bf16(key[k]) : key[k];
    double acc = 0;
    for (int h = 0; h < nI; ++h) {
      double d = 0;
      for (int k = 0; k < dI; ++k) d += qd[size_t(h) * dI + k] * kd[k];
      acc += std::max(0.0, d) * double(w[t * nI + h]) * wscale;
    }
    out[s] = acc;
  }
  return out;
}

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
    // mag = Σ_h |ReLU(d_h) · w_h| · scale: the size of the terms the kernel adds in fp32. The error
    // is measured against it (plus a 1e-3 floor), not against |ref|, which a cancelling head sum
    // can make arbitrarily small (a fresh-seed run hit 2.2e-4 against |ref| on a correct kernel).
    std::vector<float> ref(size_t(S * ld), NAN), mag(size_t(S * ld), 0.f);
    const double wscale = 1.0 / std::sqrt(double(c.nI)) / std::sqrt(double(c.dI));
    for (int64_t t = 0; t < S; ++t)
      for (int s = 0; s < count[t]; ++s) {
        const float* key = &pool[size_t(rows[offset[t] + s]) * c.dI];
        double acc = 0, acc_abs = 0;
        for (int h = 0; h < c.nI; ++h) {
          double d = 0;
          for (int k = 0; k < c.dI; ++k)
            d += double(round_bf16(q[(t * c.nI + h) * c.dI + k])) * double(round_bf16(key[k]));
          const double term = std::max(0.0, d) * double(w[t * c.nI + h]) * wscale;
          acc += term;
          acc_abs += std::fabs(term);
        }
        ref[t * ld + s] = float(acc);
        mag[t * ld + s] = float(acc_abs);
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
    // variant 0: auto (the decode kernel for the 64 × 128 cases), 1: the WMMA kernel only.
    for (int variant : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "variant " << variant);
    dscores.poison();
    ASSERT_TRUE(cuda::indexer_scores_tc(a, c.max_count, dscores.p, ld, 132, nullptr, variant).ok());
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
        worst = std::max(worst, std::fabs(double(g) - r) / (1e-3 + double(mag[t * ld + s])));
      }
    std::printf("[indexer tc] nI=%d dI=%d S=%lld variant %d worst err / term magnitude %.2e\n", c.nI, c.dI,
                (long long)S, variant, worst);
    EXPECT_LE(worst, 2e-4);
    EXPECT_EQ(bad_untouched, 0) << "entries beyond count[t] were written";
    }
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


// The decode kernel (variant 2) on its own: V4-Flash dims, paged candidate lists, counts that are
// not multiples of the 16-key chunk, an empty row, batch 64, and a tiny grid (n_sms = 3) so every
// warp strides over many chunks. Scores vs the double reference on bf16-rounded inputs; entries
// at or beyond count[t] must stay poisoned.
TEST(CudaIndexerTc, DecodeKernelMatchesBf16Reference) {
  V4_REQUIRE_GPU();
  const int nI = 64, dI = 128;
  struct Case { std::vector<int> counts; int n_sms; };
  std::vector<int> b64(64);
  for (int& c : b64) c = rand_int(1, 2100);
  b64[5] = 0;
  const Case cases[] = {{{5000}, 132}, {{1, 15, 16, 17, 0, 33, 1000}, 132}, {b64, 132},
                        {{70001}, 132}, {{4099, 20000}, 3}};
  for (const Case& c : cases) {
    const int64_t S = int64_t(c.counts.size()), pool_rows = 80000;
    const int maxc = std::max(1, *std::max_element(c.counts.begin(), c.counts.end()));
    SCOPED_TRACE(::testing::Message() << "S=" << S << " max count " << maxc << " n_sms " << c.n_sms);
    auto q = randn(size_t(S * nI * dI), 1.f), w = randn(size_t(S * nI), 1.f);
    auto pool = randn(size_t(pool_rows * dI), 1.f);
    Lists l = paged_lists(c.counts, pool_rows);
    const int64_t ld = maxc + 5;  // odd on purpose: the kernel must not assume an aligned ld
    Dev<float> dq(q), dw(w), dpool(pool), dscores(size_t(S * ld));
    Dev<int32_t> drows(l.rows), dcount(l.count);
    Dev<int64_t> doff(l.offset);
    IndexerArgs a;
    a.q = dq.p; a.weights = dw.p; a.key_pool = dpool.p;
    a.cand = {drows.p, doff.p, dcount.p};
    a.n_rows = S; a.n_heads = nI; a.head_dim = dI;
    ASSERT_TRUE(cuda::indexer_decode_supported(a));
    std::vector<std::vector<double>> ref(S);
    for (int64_t t = 0; t < S; ++t)
      ref[t] = ref_row(q, w, pool, l.rows.data() + l.offset[t], l.count[t], t, nI, dI, true);
    for (int variant : {2, 3}) {  // 16- and 32-key chunks
    dscores.poison();
    ASSERT_TRUE(cuda::indexer_scores_tc(a, maxc, dscores.p, ld, c.n_sms, nullptr, variant).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto got = dscores.host();
    double worst = 0;
    int64_t bad_untouched = 0, checked = 0;
    for (int64_t t = 0; t < S; ++t) {
      const int n = l.count[t];
      for (int64_t s = 0; s < ld; ++s) {
        const float g = got[t * ld + s];
        if (s >= n) {
          bad_untouched += !std::isnan(g);
          continue;
        }
        ++checked;
        const double r = ref[t][s];
        // abs floor 1e-2 (scores are O(1)): near-zero scores are sums that cancel, where fp32
        // summation noise (~1e-7 abs) is not a relative error of the score
        worst = std::max(worst, std::fabs(double(g) - r) / (1e-2 + std::fabs(r)));
      }
    }
    std::printf("[indexer decode] variant %d S=%lld max count %d: %lld scores, worst rel err %.2e\n",
                variant, (long long)S, maxc, (long long)checked, worst);
    EXPECT_LE(worst, 2e-4) << "variant " << variant;
    EXPECT_EQ(bad_untouched, 0) << "variant " << variant << ": entries beyond count[t] were written";
    }
  }
  // Dims other than 64 × 128 are refused by the forced variant and served by the WMMA kernel in auto.
  IndexerArgs small;
  small.n_rows = 1; small.n_heads = 16; small.head_dim = 32;
  EXPECT_FALSE(cuda::indexer_decode_supported(small));
}

// A row's decode scores are bit-identical whatever the batch around it and the grid (n_sms),
// and between repeated calls.
TEST(CudaIndexerTc, DecodeKernelIsBatchInvariant) {
  V4_REQUIRE_GPU();
  const int nI = 64, dI = 128;
  const int64_t S = 37, pool_rows = 40000;
  std::vector<int> counts(S);
  for (int& c : counts) c = rand_int(1, 9000);
  auto q = randn(size_t(S * nI * dI), 1.f), w = randn(size_t(S * nI), 1.f);
  auto pool = randn(size_t(pool_rows * dI), 1.f);
  Lists l = paged_lists(counts, pool_rows);
  const int64_t ld = 9000;
  Dev<float> dq(q), dw(w), dpool(pool), all{size_t(S * ld)}, one{size_t(ld)}, again{size_t(S * ld)};
  Dev<int32_t> drows(l.rows), dcount(l.count);
  Dev<int64_t> doff(l.offset);
  all.poison(); one.poison(); again.poison();
  IndexerArgs a;
  a.q = dq.p; a.weights = dw.p; a.key_pool = dpool.p;
  a.cand = {drows.p, doff.p, dcount.p};
  a.n_rows = S; a.n_heads = nI; a.head_dim = dI;
  ASSERT_TRUE(cuda::indexer_scores_tc(a, 9000, all.p, ld, 132, nullptr, 2).ok());
  ASSERT_TRUE(cuda::indexer_scores_tc(a, 9000, again.p, ld, 5, nullptr, 2).ok());
  const int64_t t = 17;  // row t alone: pointers shifted to its q, weights and map entries
  IndexerArgs b = a;
  b.q = dq.p + t * nI * dI; b.weights = dw.p + t * nI;
  b.cand = {drows.p, doff.p + t, dcount.p + t};
  b.n_rows = 1;
  ASSERT_TRUE(cuda::indexer_scores_tc(b, l.count[t], one.p, ld, 132, nullptr, 2).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto ha = all.host(), hb = one.host(), hc = again.host();
  EXPECT_EQ(std::memcmp(ha.data(), hc.data(), ha.size() * sizeof(float)), 0)
      << "scores depend on the grid";
  EXPECT_EQ(std::memcmp(ha.data() + t * ld, hb.data(), size_t(l.count[t]) * sizeof(float)), 0)
      << "row " << t << " alone differs from the row inside the batch";
  EXPECT_FALSE(std::isnan(hb[l.count[t] - 1]));
}

// CudaOps::indexer_topk in bf16 mode (decode kernel + Lightning TopK + finalize) vs the CPU op.
// The GPU selects on scores of bf16-rounded q and keys, the CPU op on f32 ones, so:
//  - against the bf16 reference (double, bf16-rounded inputs) the selection must be exact up to
//    fp32 summation noise: every clear winner chosen, nothing below the k-th score, output in
//    ascending map position order (IndexerArgs);
//  - against the CPU op's rows, a difference is allowed only between near-ties: a key chosen by
//    one side only must lie within the row's bf16 perturbation (4 × max |ref_bf16 − ref_f32|) of
//    the f32 k-th score.
TEST(CudaIndexerTc, Bf16IndexerTopkMatchesCpuOp) {
  V4_REQUIRE_GPU();
  CudaOptions co;
  co.precision = Precision::kBf16;
  auto made = make_cuda_ops(co);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  std::unique_ptr<Ops> gpu = std::move(made).value();
  auto cpu = make_cpu_ops();
  const int nI = 64, dI = 128, k = 512;
  std::vector<int> batch64(64);
  for (int& c : batch64) c = rand_int(300, 2500);
  struct TopkCase { std::vector<int> counts; bool ties; };
  for (const TopkCase& tc : {TopkCase{{1024}, false}, TopkCase{{5, 512, 513, 3000, 40000}, false},
                             TopkCase{batch64, false}, TopkCase{{3000, 700}, true}}) {
    const std::vector<int>& counts = tc.counts;
    const int64_t S = int64_t(counts.size()), pool_rows = 60000;
    SCOPED_TRACE(::testing::Message() << "S=" << S << " ties=" << tc.ties);
    auto q = randn(size_t(S * nI * dI), 1.f), w = randn(size_t(S * nI), 1.f);
    auto pool = randn(size_t(pool_rows * dI), 1.f);
    if (tc.ties) {
      // Pool rows 8g … 8g+7 hold the same vector: candidates at consecutive map positions tie
      // exactly (identical inputs give bit-identical scores on both backends), so the order
      // "equal score → lower map position first" decides the k-th boundary.
      for (int64_t r = 0; r < pool_rows; ++r)
        std::copy_n(&pool[size_t(r / 8 * 8) * dI], dI, &pool[size_t(r) * dI]);
    }
    Lists l = paged_lists(counts, pool_rows);
    IndexerArgs a;
    a.n_rows = S; a.n_heads = nI; a.head_dim = dI; a.topk = k;
    a.max_count = *std::max_element(counts.begin(), counts.end());
    std::vector<int32_t> out_cpu(size_t(S * k), -7), cnt_cpu(S, -7);
    IndexerArgs ac = a;
    ac.q = q.data(); ac.weights = w.data(); ac.key_pool = pool.data();
    ac.cand = {l.rows.data(), l.offset.data(), l.count.data()};
    ac.out_rows = out_cpu.data(); ac.out_count = cnt_cpu.data();
    cpu->indexer_topk(ac);
    Dev<float> dq(q), dw(w), dpool(pool);
    Dev<int32_t> drows(l.rows), dcount(l.count), dout(out_cpu.size()), dcnt{size_t(S)};
    Dev<int64_t> doff(l.offset);
    dout.poison(); dcnt.poison();
    IndexerArgs ag = a;
    ag.q = dq.p; ag.weights = dw.p; ag.key_pool = dpool.p;
    ag.cand = {drows.p, doff.p, dcount.p};
    ag.out_rows = dout.p; ag.out_count = dcnt.p;
    gpu->indexer_topk(ag);
    gpu->synchronize();
    auto out = dout.host(), cnt = dcnt.host();
    EXPECT_EQ(cnt, cnt_cpu);
    int exact_rows = 0, swapped = 0;
    for (int64_t t = 0; t < S; ++t) {
      const int n = l.count[t], n_sel = std::min(n, k);
      const int32_t* rw = l.rows.data() + l.offset[t];
      auto sb = ref_row(q, w, pool, rw, n, t, nI, dI, true);
      auto sf = ref_row(q, w, pool, rw, n, t, nI, dI, false);
      double top = 0, pert = 0;
      for (int j = 0; j < n; ++j) {
        top = std::max(top, std::fabs(sb[j]));
        pert = std::max(pert, std::fabs(sb[j] - sf[j]));
      }
      const double tb = 1e-4 * top + 1e-6, tf = 4 * pert + 1e-6;
      auto kth = [&](const std::vector<double>& v) {
        std::vector<double> c = v;
        std::nth_element(c.begin(), c.begin() + (n_sel - 1), c.end(), std::greater<>());
        return c[n_sel - 1];
      };
      const double thr_b = n_sel ? kth(sb) : 0, thr_f = n_sel ? kth(sf) : 0;
      // map position of each selected pool row (pool rows are distinct within a list)
      std::vector<int> pos(pool_rows, -1);
      for (int j = 0; j < n; ++j) pos[rw[j]] = j;
      std::vector<char> g_sel(n, 0), c_sel(n, 0);
      int prev_j = -1;
      for (int i = 0; i < k; ++i) {
        const int32_t r = out[t * k + i], rc = out_cpu[t * k + i];
        if (i >= n_sel) {
          EXPECT_EQ(r, -1) << "row " << t << " pad " << i;
          continue;
        }
        ASSERT_GE(r, 0) << "row " << t << " entry " << i;
        ASSERT_LT(r, pool_rows);
        const int j = pos[r];
        ASSERT_GE(j, 0) << "row " << t << ": not a candidate";
        EXPECT_FALSE(g_sel[j]) << "row " << t << ": duplicate";
        g_sel[j] = 1;
        ASSERT_TRUE(rc >= 0 && rc < pool_rows && pos[rc] >= 0) << "CPU op row " << rc;
        c_sel[pos[rc]] = 1;
        EXPECT_GE(sb[j], thr_b - tb) << "row " << t << " entry " << i << " below the k-th score";
        EXPECT_GT(j, prev_j) << "row " << t << " entry " << i << " not in map position order";
        prev_j = j;
      }
      for (int j = 0; j < n; ++j) {
        if (sb[j] > thr_b + tb) {
          EXPECT_TRUE(g_sel[j]) << "row " << t << " missed a clear winner";
        }
        if (g_sel[j] != c_sel[j]) {
          ++swapped;
          if (g_sel[j]) {
            EXPECT_GE(sf[j], thr_f - tf) << "row " << t << ": GPU-only pick is no near-tie";
          } else {
            EXPECT_LE(sf[j], thr_f + tf) << "row " << t << ": CPU-only pick is no near-tie";
          }
        }
      }
      if (tc.ties) {
        // Exact ties at the boundary: a tied candidate left out must come after every tied one
        // taken (equal score → lower map position first).
        int max_taken = -1, min_left = n;
        for (int j = 0; j < n; ++j)
          if (sb[j] == thr_b) {
            if (g_sel[j]) max_taken = std::max(max_taken, j);
            else min_left = std::min(min_left, j);
          }
        EXPECT_LT(max_taken, min_left) << "row " << t << ": boundary tie broken against position order";
      }
      exact_rows += std::equal(out.begin() + t * k, out.begin() + (t + 1) * k,
                               out_cpu.begin() + t * k);
    }
    std::printf("[indexer bf16 topk] S=%lld: %d/%lld rows identical to the CPU op, %d near-tie "
                "swaps\n", (long long)S, exact_rows, (long long)S, swapped);
  }
}

}  // namespace
}  // namespace v4::ops
