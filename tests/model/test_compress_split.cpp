// The FlashCompressor work split (src/ops/cuda/compress_split.h) on the host: the launch plans
// cover every channel and window slot exactly once and stay within the kernel's limits, and the
// kernel's arithmetic — per-thread online softmax over slot partitions (cs_fold_slots), ordered
// partition merge (cs_merge), per-slice sums of squares added in CTA-rank order, RMSNorm, RoPE —
// run for every thread of every CTA of the plan, matches the CPU op composition and the
// double-precision reference of dsv4-model.md §5 within the GPU test tolerance (1e-5 of the
// largest magnitude). The GPU kernel itself is tested in tests/cuda/test_cuda_compressor.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "compressor_cases.h"
#include "ops/cuda/compress_split.h"
#include "ops/ops.h"

namespace v4::ops {
namespace {

using cuda::CompressRowsPlan;
using v4::testing::CompressCase;

constexpr float kEps = 1e-6f;

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return num / den;
}

// Every (group, slot) pair of a row is visited by exactly one (CTA, thread); limits hold.
void check_plan(int m, int c, int d, bool vec_ok) {
  SCOPED_TRACE(::testing::Message() << "m=" << m << " c=" << c << " d=" << d << " vec_ok=" << vec_ok);
  const CompressRowsPlan pl = cuda::plan_compress_rows(m, c, d, vec_ok);
  ASSERT_GT(pl.threads, 0);
  EXPECT_EQ(pl.vec, vec_ok && d % 4 == 0 ? 4 : 1);
  EXPECT_EQ(pl.groups * pl.vec, d);
  EXPECT_LE(pl.threads, cuda::kCompressMaxThreads);
  EXPECT_EQ(pl.unroll, 4);  // one batch size for every plan (measured: compress_split.h)
  EXPECT_EQ(pl.threads % 32, 0);
  EXPECT_GE(pl.threads, pl.gw * pl.parts);
  EXPECT_GE(pl.ctas, 1);
  EXPECT_LE(pl.ctas, 8);
  if (pl.vec == 1) {
    EXPECT_EQ(pl.ctas, 1);  // RoPE pairs may straddle slices otherwise
  }
  EXPECT_LE(pl.parts, 32);
  EXPECT_LE(pl.smem, cuda::kCompressSmemLimit);
  const int ns = c * m;
  std::vector<int> seen(size_t(pl.groups) * ns, 0);
  for (int k = 0; k < pl.ctas; ++k) {
    const int g0 = k * pl.gpc, g1 = std::min(pl.groups, g0 + pl.gpc);
    for (int t = 0; t < pl.threads; ++t) {
      const int x = t % pl.gw, p = t / pl.gw;
      if (p >= pl.parts) continue;
      for (int g = g0 + x; g < g1; g += pl.gw)
        for (int j = p * pl.spp; j < std::min(ns, (p + 1) * pl.spp); ++j) ++seen[size_t(g) * ns + j];
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "group " << i / ns << " slot " << i % ns;
}

TEST(CompressSplit, PlansCoverEveryChannelAndSlotOnce) {
  for (bool v : {true, false})
    for (auto [m, c, d] : {std::tuple{4, 2, 512}, std::tuple{4, 2, 128}, std::tuple{128, 1, 512},
                           std::tuple{3, 2, 37}, std::tuple{5, 1, 1100}, std::tuple{4, 2, 64},
                           std::tuple{128, 1, 196}, std::tuple{16, 2, 132}, std::tuple{128, 2, 4096},
                           std::tuple{1, 1, 4}, std::tuple{128, 1, 8}, std::tuple{7, 2, 12000}})
      check_plan(m, c, d, v);
}

TEST(CompressSplit, ModelShapes) {
  // The plans docs/cuda.md describes (V4-Flash: CSA kv C4 d512, indexer C4 d128, HCA C128 d512).
  const CompressRowsPlan c4 = cuda::plan_compress_rows(4, 2, 512, true);
  EXPECT_EQ(c4.vec, 4);
  EXPECT_EQ(c4.parts, 1);
  EXPECT_EQ(c4.ctas, 1);
  EXPECT_EQ(c4.threads, 128);
  const CompressRowsPlan ix = cuda::plan_compress_rows(4, 2, 128, true);
  EXPECT_EQ(ix.parts, 2);
  EXPECT_EQ(ix.spp, 4);
  EXPECT_EQ(ix.threads, 64);
  const CompressRowsPlan hca = cuda::plan_compress_rows(128, 1, 512, true);
  EXPECT_EQ(hca.parts, 16);
  EXPECT_EQ(hca.spp, 8);
  EXPECT_EQ(hca.ctas, 8);
  EXPECT_EQ(hca.gpc, 16);
  EXPECT_EQ(hca.threads, 256);
  EXPECT_EQ(hca.unroll, 4);  // cluster plan: two batches of 4, one wave of CTAs
  EXPECT_EQ(c4.unroll, 4);   // 8 slots per thread in two batches (8 in one measured slower)
  EXPECT_EQ(ix.unroll, 4);
  EXPECT_EQ(cuda::plan_compress_rows(4, 2, 100000, true).threads, 0);  // over the smem limit
}

// The rows kernel's arithmetic for every CTA and thread of the plan, in its order (the block
// reduction of a slice's Σx² is summed here in channel order: a different but equally valid
// order, which is all the tolerance has to absorb besides the online softmax).
std::vector<float> emulate(const CompressCase& k, bool vec_ok) {
  const CompressRowsPlan pl = cuda::plan_compress_rows(k.m, k.c, k.d, vec_ok);
  EXPECT_GT(pl.threads, 0);
  std::vector<float> pool = k.pool;
  const int ns = k.c * k.m, d = k.d, V = pl.vec;
  const cuda::CsInputs in{k.kc.data(), k.zc.data(), k.ring_kv.data(), k.ring_gate.data(),
                          k.bias.data(), k.m, k.c, d};
  for (int64_t r = 0; r < k.n_out(); ++r) {
    if (k.dst[size_t(r)] < 0) continue;
    const int32_t* slots = k.src.data() + r * ns;
    std::vector<float> row(static_cast<size_t>(d));
    std::vector<float> slice_ss(size_t(pl.ctas), 0.f);
    for (int rank = 0; rank < pl.ctas; ++rank) {
      const int g0 = rank * pl.gpc, g1 = std::min(pl.groups, g0 + pl.gpc);
      // partition states [p][channel]
      std::vector<float> mx(size_t(pl.parts) * d), sum(mx.size()), acc(mx.size());
      for (int t = 0; t < pl.gw * pl.parts; ++t) {
        const int x = t % pl.gw, p = t / pl.gw;
        const int j0 = p * pl.spp, j1 = std::min(ns, j0 + pl.spp);
        for (int g = g0 + x; g < g1; g += pl.gw) {
          if (V == 4) {
            cuda::CsAcc st[4];
            for (auto& s : st) s = cuda::CsAcc{-INFINITY, 0.f, 0.f};
            if (pl.unroll == 8)
              cuda::cs_fold_slots<4, 8>(in, slots, j0, j1, g * 4, st);
            else
              cuda::cs_fold_slots<4, 4>(in, slots, j0, j1, g * 4, st);
            for (int i = 0; i < 4; ++i) {
              const size_t o = size_t(p) * d + size_t(g) * 4 + i;
              mx[o] = st[i].mx, sum[o] = st[i].sum, acc[o] = st[i].acc;
            }
          } else {
            cuda::CsAcc st[1] = {cuda::CsAcc{-INFINITY, 0.f, 0.f}};
            EXPECT_EQ(pl.unroll, 4);  // the kernel's scalar path has one instantiation
            cuda::cs_fold_slots<1, 4>(in, slots, j0, j1, g, st);
            const size_t o = size_t(p) * d + size_t(g);
            mx[o] = st[0].mx, sum[o] = st[0].sum, acc[o] = st[0].acc;
          }
        }
      }
      for (int ch = g0 * V; ch < g1 * V; ++ch) {
        row[size_t(ch)] = cuda::cs_merge(&mx[size_t(ch)], &sum[size_t(ch)], &acc[size_t(ch)],
                                         pl.parts, d);
        slice_ss[size_t(rank)] += row[size_t(ch)] * row[size_t(ch)];
      }
    }
    float total = 0.f;
    for (float s : slice_ss) total += s;
    const float inv = 1.f / std::sqrt(total / float(d) + kEps);
    std::vector<float> y(static_cast<size_t>(d));
    for (int ch = 0; ch < d; ++ch) y[size_t(ch)] = row[size_t(ch)] * inv * k.norm[size_t(ch)];
    const int nope = d - k.rd;
    float* out = pool.data() + int64_t(k.dst[size_t(r)]) * d;
    const float pos = float(k.positions[size_t(r)]);
    for (int ch = 0; ch < d; ++ch) {
      if (ch < nope) {
        out[ch] = y[size_t(ch)];
        continue;
      }
      const int q = (ch - nope) >> 1;
      const float x0 = y[size_t(nope + 2 * q)], x1 = y[size_t(nope + 2 * q + 1)];
      const float ang = k.inv_freq[size_t(q)] * pos;
      const float sn = std::sin(ang), cs = std::cos(ang);
      out[ch] = ((ch - nope) & 1) ? x0 * sn + x1 * cs : x0 * cs - x1 * sn;
    }
  }
  return pool;
}

void check(const CompressCase& k) {
  std::vector<float> ref_pool, ref_kv, ref_gate;
  v4::testing::reference_step(k, kEps, 1.f, &ref_pool, &ref_kv, &ref_gate);
  // The CPU backend's composition (what the GPU tests compare the kernel against).
  auto cpu = make_cpu_ops();
  std::vector<float> pool = k.pool, rkv = k.ring_kv, rg = k.ring_gate;
  CompressCase kk = k;
  const CompressFusedArgs a =
      v4::testing::host_args(kk, pool.data(), rkv.data(), rg.data(), nullptr, kEps, 1.f);
  cpu->compress_fused(a);
  for (bool vec_ok : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "vec_ok=" << vec_ok);
    const std::vector<float> em = emulate(k, vec_ok);
    const double e_ref = rel_err(em, ref_pool), e_cpu = rel_err(em, pool);
    std::printf("  m=%d c=%d d=%d n_out=%lld vec_ok=%d: vs double ref %.2e, vs CPU ops %.2e\n", k.m,
                k.c, k.d, (long long)k.n_out(), int(vec_ok), e_ref, e_cpu);
    EXPECT_LE(e_ref, 1e-5);
    EXPECT_LE(e_cpu, 1e-5);
    EXPECT_NE(em, k.pool);  // the step wrote rows
  }
}

TEST(CompressSplit, EmulatedKernelMatchesPrefill) {
  struct S {
    int m, c, d, rd;
  };
  for (S s : {S{4, 2, 512, 64}, S{4, 2, 128, 64}, S{128, 1, 512, 64}, S{128, 1, 196, 64},
              S{16, 2, 132, 6}, S{3, 2, 37, 8}, S{5, 1, 1100, 64}}) {
    const int64_t L = 3 * s.c * s.m + 5;
    check(v4::testing::prefill_case(s.m, s.c, s.d, s.rd, {{0, s.m + 3, L}, {3, 0, L + s.m}, {1, 2 * s.m - 1, L + 1}},
                                    100 + s.m + s.d));
  }
  // Many C128 windows in one chunk (32 closing rows).
  check(v4::testing::prefill_case(128, 1, 512, 64, {{2, 130, 4096}}, 7));
}

TEST(CompressSplit, EmulatedKernelMatchesDecode) {
  std::vector<int64_t> pos = {3, 4, 7, -1, 130, 11, 0, 255, 127, -1, 515, 2047};
  for (auto [m, c, d] : {std::tuple{4, 2, 512}, std::tuple{4, 2, 128}, std::tuple{128, 1, 512}})
    check(v4::testing::decode_case(m, c, d, 64, pos, 3 + m + d));
}

// ops::compress_ring_disjoint (the host test behind CompressFusedArgs::ring_disjoint) agrees with
// the case's own hazard check on hazardous prefill chunks, hazard-free ones (a chunk from
// position 0; chunks that end before any window boundary after their start) and decode steps.
TEST(CompressSplit, RingDisjointMatchesHazard) {
  auto disjoint = [](const CompressCase& k) {
    return compress_ring_disjoint(k.src.data(), int64_t(k.src.size()), k.ring_dst.data(),
                                  k.n_ring());
  };
  for (auto [m, c] : {std::pair{4, 2}, std::pair{128, 1}, std::pair{3, 2}}) {
    SCOPED_TRACE(::testing::Message() << "m=" << m << " c=" << c);
    const int64_t L = 3 * c * m + 5;
    const CompressCase hazard =
        v4::testing::prefill_case(m, c, 8, 4, {{0, m + 3, L}, {3, 0, L + m}}, 11);
    ASSERT_TRUE(hazard.ring_hazard());
    EXPECT_FALSE(disjoint(hazard));
    const CompressCase from0 = v4::testing::prefill_case(m, c, 8, 4, {{1, 0, 5 * m + 3}}, 12);
    ASSERT_FALSE(from0.ring_hazard());
    EXPECT_TRUE(disjoint(from0));
    // Chunks that start no window after their first token (the last two tokens of a window;
    // one closing token): no hazard, but state rows are read.
    const CompressCase short_chunks =
        v4::testing::prefill_case(m, c, 8, 4, {{0, 2 * m - 2, 2}, {2, 3 * m - 1, 1}}, 13);
    EXPECT_EQ(disjoint(short_chunks), !short_chunks.ring_hazard());
    EXPECT_TRUE(disjoint(short_chunks));
    std::vector<int64_t> pos = {3, 4, 7, -1, 130, 11, 0, 255, 127, -1, 515, 2047};
    const CompressCase dec = v4::testing::decode_case(m, c, 8, 4, pos, 14);
    ASSERT_FALSE(dec.ring_hazard());
    EXPECT_TRUE(disjoint(dec));
  }
}

}  // namespace
}  // namespace v4::ops
