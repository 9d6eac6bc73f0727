// The FlashCompressor work split (src/ops/cuda/compress_split.h) on the host: the launch plans
// cover every channel and window slot exactly once and stay within the kernel's limits, and the
// kernel's arithmetic — per-thread online softmax over slot partitions (cs_fold_slots), ordered
// partition merge (cs_merge), per-slice sums of squares added in CTA-rank order, RMSNorm, RoPE —
// run for every thread of every CTA of the plan, matches the CPU op composition and the
// double-precision reference of dsv4-model.md §5 within the GPU test tolerance (1e-5 of the
// largest magnitude). The GPU kernel itself is tested in tests/cuda/test_cuda_compressor.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "compressor_cases.h"
#include "base/kv_fp8.h"
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

CompressRowsPlan make_plan(int m, int c, int d, bool vec_ok, bool wide) {
  return wide ? cuda::plan_compress_rows_wide(m, c, d, vec_ok)
              : cuda::plan_compress_rows(m, c, d, vec_ok);
}

// Every (group, slot) pair of a row is visited by exactly one (CTA, thread); limits hold. `wide`:
// the decode plan (plan_compress_rows_wide), which must keep the base plan's numerics.
void check_plan(int m, int c, int d, bool vec_ok, bool wide) {
  SCOPED_TRACE(::testing::Message() << "m=" << m << " c=" << c << " d=" << d << " vec_ok=" << vec_ok
                                    << " wide=" << wide);
  const CompressRowsPlan pl = make_plan(m, c, d, vec_ok, wide);
  ASSERT_GT(pl.threads, 0);
  const CompressRowsPlan base = cuda::plan_compress_rows(m, c, d, vec_ok);
  // What fixes a row's rounding is shared with the base plan: vec, spp, parts, unroll.
  EXPECT_EQ(pl.vec, base.vec);
  EXPECT_EQ(pl.spp, base.spp);
  EXPECT_EQ(pl.parts, base.parts);
  EXPECT_EQ(pl.unroll, base.unroll);
  if (!wide) {
    EXPECT_FALSE(pl.prefetch);
  }
  if (pl.prefetch) {
    EXPECT_LE(pl.spp, 2 * pl.unroll);  // cs_fold_slots_pf<V, U, 2> covers the partition
    EXPECT_EQ(pl.vec, 4);
  }
  // Slices start on Σx² chunk boundaries (the row's Σx² order does not depend on K).
  if (pl.ctas > 1) {
    EXPECT_EQ(pl.gpc * pl.vec % cuda::kCsChunk, 0);
  }
  EXPECT_EQ((pl.groups + pl.gpc - 1) / pl.gpc, pl.ctas);  // no empty CTA
  EXPECT_LE((pl.gpc * pl.vec + cuda::kCsChunk - 1) / cuda::kCsChunk, cuda::kCsMaxChunks);
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
    // (7, 2, 11000): near the largest d (the scalar path's row alone is 44 KB of shared memory).
    for (auto [m, c, d] : {std::tuple{4, 2, 512}, std::tuple{4, 2, 128}, std::tuple{128, 1, 512},
                           std::tuple{3, 2, 37}, std::tuple{5, 1, 1100}, std::tuple{4, 2, 64},
                           std::tuple{128, 1, 196}, std::tuple{16, 2, 132}, std::tuple{128, 2, 4096},
                           std::tuple{1, 1, 4}, std::tuple{128, 1, 8}, std::tuple{7, 2, 11000}})
      for (bool wide : {false, true}) check_plan(m, c, d, v, wide);
}

// FlashCompressor's fused fp8 store (compressor.cu, FP8 kernels) on the host: for a finished f32
// row, every CTA k of the plan owns channels [c0, c0 + cw) (c0 = k·gpc·vec); it writes the max
// |x| of the finite nope values of each kCsChunk chunk of its slice (chunk q of the row at rank
// q / cpr, index q % cpr, cpr = ceil(gpc·vec / 32)); each group of vec nope channels takes the
// amax of its 64-value block b = max(chunk 2b, chunk 2b + 1 if it exists), codes its values
// (4-byte store when the whole group is nope), the group at the block's first channel writes
// the scale, rope groups store bf16, rank 0 writes the padding. The index math of the kernel,
// run for base and wide plans of shapes whose slices are 32 mod 64 channels (blocks straddling
// two CTAs), with nope not a multiple of 4 / 64, rope 0 and the scalar path: the bytes must equal
// kvfp8::quantize_row of the same row (byte poison elsewhere: every byte written).
void check_fp8_store(int m, int c, int d, int rd, bool vec_ok, bool wide) {
  SCOPED_TRACE(::testing::Message() << "m=" << m << " c=" << c << " d=" << d << " rd=" << rd
                                    << " vec_ok=" << vec_ok << " wide=" << wide);
  const CompressRowsPlan pl = make_plan(m, c, d, vec_ok, wide);
  ASSERT_GT(pl.threads, 0);
  const KvFp8Layout L = kv_fp8_layout(d, rd);
  const int nope = d - rd, V = pl.vec, K = pl.ctas, cw_max = pl.gpc * V;
  const int cpr = (cw_max + cuda::kCsChunk - 1) / cuda::kCsChunk;
  const int nq_row = (d + cuda::kCsChunk - 1) / cuda::kCsChunk;
  std::vector<float> row(static_cast<size_t>(d));
  uint64_t st = 0x9E3779B97F4A7C15ull * uint64_t(d + 7 * m + rd);
  for (int i = 0; i < d; ++i) {  // block-varying magnitudes, a NaN and an Inf
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    row[size_t(i)] = (float(int(st >> 40) % 2001 - 1000) / 1000.f) * std::ldexp(1.f, (i / 64) * 3 - 6);
  }
  if (nope > 70) {
    row[65] = std::numeric_limits<float>::quiet_NaN();
    row[66] = std::numeric_limits<float>::infinity();
  }
  std::vector<uint8_t> want(size_t(L.bytes)), got(size_t(L.bytes), 0xAB);
  kvfp8::quantize_row(row.data(), L, want.data());
  std::vector<std::vector<float>> chunk(static_cast<size_t>(K));
  for (int k = 0; k < K; ++k) {  // phase 1: chunk amaxes of each slice
    const int g0 = k * pl.gpc, g1 = std::min(pl.groups, g0 + pl.gpc);
    const int c0 = g0 * V, cw = std::max(0, g1 - g0) * V, nq = (cw + cuda::kCsChunk - 1) / cuda::kCsChunk;
    ASSERT_LE(nq, cpr);
    if (K > 1) {
      ASSERT_EQ(c0 % cuda::kCsChunk, 0);
    }
    chunk[size_t(k)].assign(size_t(cpr), -1.f);  // -1: not written
    for (int q = 0; q < nq; ++q) {
      float v = 0.f;
      for (int lane = 0; lane < 32; ++lane) {
        const int l = q * cuda::kCsChunk + lane;
        const float a = l < cw && c0 + l < nope ? kvfp8::abs_finite(row[size_t(c0 + l)]) : 0.f;
        v = std::fmax(v, a);
      }
      chunk[size_t(k)][size_t(q)] = v;
    }
  }
  auto chunk_amax = [&](int q) {
    const int rank = q / cpr, idx = q % cpr;
    EXPECT_LT(rank, K);
    const float v = rank < K ? chunk[size_t(rank)][size_t(idx)] : -1.f;
    EXPECT_GE(v, 0.f) << "chunk " << q << " read before it was written";
    return v;
  };
  for (int k = 0; k < K; ++k) {  // phase 2: stores
    const int g0 = k * pl.gpc, g1 = std::min(pl.groups, g0 + pl.gpc);
    const int c0 = g0 * V, cw = std::max(0, g1 - g0) * V;
    for (int l = 0; l < cw; l += V) {
      const int ch = c0 + l;
      for (int i = 0; i < V; ++i) {  // rope part (store_fp8_rope)
        if (ch + i < nope) continue;
        const uint16_t h = kvfp8::bf16_encode(row[size_t(ch + i)]);
        std::memcpy(&got[size_t(L.rope_off + 2 * (ch + i - nope))], &h, 2);
      }
      if (ch >= nope) continue;
      const int b = ch / KvFp8Layout::kBlock;
      ASSERT_EQ((ch + V - 1) / KvFp8Layout::kBlock, b) << "group straddles a block";
      float amax = chunk_amax(2 * b);
      if (2 * b + 1 < nq_row) amax = std::fmax(amax, chunk_amax(2 * b + 1));
      const float scale = kvfp8::block_scale(amax);
      for (int i = 0; i < V && ch + i < nope; ++i)
        got[size_t(ch + i)] = kvfp8::quantize(row[size_t(ch + i)], scale);
      if (ch % KvFp8Layout::kBlock == 0) std::memcpy(&got[size_t(L.scale_off + 4 * b)], &scale, 4);
    }
  }
  for (int o = L.nope; o < L.scale_off; ++o) got[size_t(o)] = 0;
  for (int o = L.scale_off + 4 * L.n_scales; o < L.rope_off; ++o) got[size_t(o)] = 0;
  for (int o = L.rope_off + 2 * L.rope; o < L.bytes; ++o) got[size_t(o)] = 0;
  for (int i = 0; i < L.bytes; ++i) ASSERT_EQ(int(got[size_t(i)]), int(want[size_t(i)])) << "byte " << i;
}

TEST(CompressSplit, Fp8StoreIndexMathMatchesQuantizer) {
  // (128, 1, 192, 32) wide: 6 CTAs × 32 channels (blocks straddle CTAs); (4, 2, 100, 10): nope 90
  // (a float4 group of nope and rope channels); (128, 1, 130, 6), (3, 2, 37, 8): scalar path.
  for (bool v : {true, false})
    for (auto [m, c, d, rd] : {std::tuple{4, 2, 512, 64}, std::tuple{128, 1, 512, 64},
                               std::tuple{4, 2, 128, 64}, std::tuple{128, 1, 192, 32},
                               std::tuple{128, 1, 192, 64}, std::tuple{4, 2, 100, 10},
                               std::tuple{128, 1, 130, 6}, std::tuple{3, 2, 37, 8},
                               std::tuple{4, 2, 64, 0}, std::tuple{4, 2, 32, 8},
                               std::tuple{5, 1, 1100, 64}, std::tuple{128, 1, 256, 256}})
      for (bool wide : {false, true}) check_fp8_store(m, c, d, rd, v, wide);
  // The shape that exercises the cross-CTA block: slices of 32 channels.
  const CompressRowsPlan w = cuda::plan_compress_rows_wide(128, 1, 192, true);
  EXPECT_EQ(w.gpc * w.vec, 32);
  EXPECT_EQ(w.ctas, 6);
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
  EXPECT_FALSE(c4.prefetch);
  // The wide (decode) plans: about one warp of (group, partition) pairs per CTA, all slot loads
  // of a thread in flight at once.
  const CompressRowsPlan c4w = cuda::plan_compress_rows_wide(4, 2, 512, true);
  EXPECT_EQ(c4w.ctas, 4);
  EXPECT_EQ(c4w.gpc, 32);
  EXPECT_EQ(c4w.threads, 32);
  EXPECT_TRUE(c4w.prefetch);
  const CompressRowsPlan ixw = cuda::plan_compress_rows_wide(4, 2, 128, true);
  EXPECT_EQ(ixw.ctas, 2);
  EXPECT_EQ(ixw.gpc, 16);
  EXPECT_EQ(ixw.threads, 32);
  EXPECT_TRUE(ixw.prefetch);
  const CompressRowsPlan hcaw = cuda::plan_compress_rows_wide(128, 1, 512, true);
  EXPECT_EQ(hcaw.ctas, 8);
  EXPECT_EQ(hcaw.gpc, 16);
  EXPECT_EQ(hcaw.threads, 256);
  EXPECT_TRUE(hcaw.prefetch);
  // Scalar path: no wide plan (the base one).
  EXPECT_FALSE(cuda::plan_compress_rows_wide(4, 2, 512, false).prefetch);
}

// cs_fold_slots_pf (all loads first) is bit-identical to cs_fold_slots for every partition
// length it serves (1..8 slots, empty slots, fresh and state rows, both series).
TEST(CompressSplit, PrefetchFoldIsBitIdentical) {
  for (auto [m, c] : {std::pair{4, 2}, std::pair{128, 1}, std::pair{3, 2}}) {
    std::vector<int64_t> pos = {3, 4, 7, -1, 130, 11, 0, 255, 127, -1, 515, 2047};
    const CompressCase k = v4::testing::decode_case(m, c, 16, 8, pos, 21 + m);
    const cuda::CsInputs in{k.kc.data(), k.zc.data(), k.ring_kv.data(), k.ring_gate.data(),
                            k.bias.data(), k.m, k.c, k.d};
    const int ns = c * m;
    int compared = 0;
    for (int64_t r = 0; r < k.n_out(); ++r) {
      const int32_t* slots = k.src.data() + r * ns;
      for (int j0 = 0; j0 < ns; ++j0)
        for (int len = 1; len <= 8 && j0 + len <= ns; ++len) {
          for (int ch = 0; ch < k.d; ch += 4) {
            cuda::CsAcc a[4], b[4];
            for (int i = 0; i < 4; ++i) a[i] = b[i] = cuda::CsAcc{-INFINITY, 0.f, 0.f};
            cuda::cs_fold_slots<4, 4>(in, slots, j0, j0 + len, ch, a);
            cuda::cs_fold_slots_pf<4, 4, 2>(in, slots, j0, j0 + len, ch, b);
            for (int i = 0; i < 4; ++i) {
              ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof a[i]), 0)
                  << "m=" << m << " row " << r << " slots [" << j0 << ", " << j0 + len << ") ch "
                  << ch + i;
            }
            ++compared;
          }
        }
    }
    EXPECT_GT(compared, 100);
  }
}

// The kCsChunk Σx² order: cs_row_sumsq equals the chunk-wise sum (within rounding) and is what
// the emulation below uses for every plan.
TEST(CompressSplit, RowSumsqOrder) {
  for (int d : {1, 31, 32, 33, 128, 512, 1100, 4096}) {
    std::vector<float> x(static_cast<size_t>(d));
    double ref = 0;
    for (int i = 0; i < d; ++i) {
      x[size_t(i)] = std::sin(0.37f * float(i) + 1.f) * (1.f + float(i % 7));
      ref += double(x[size_t(i)]) * x[size_t(i)];
    }
    EXPECT_NEAR(cuda::cs_row_sumsq(x.data(), d), ref, 1e-5 * ref) << "d=" << d;
  }
}

// The rows kernel's arithmetic for every CTA and thread of the plan, in its order (Σx² in the
// kernel's kCsChunk order, cs_row_sumsq: the same for every K).
std::vector<float> emulate(const CompressCase& k, bool vec_ok, bool wide = false) {
  const CompressRowsPlan pl = make_plan(k.m, k.c, k.d, vec_ok, wide);
  EXPECT_GT(pl.threads, 0);
  std::vector<float> pool = k.pool;
  const int ns = k.c * k.m, d = k.d, V = pl.vec;
  const cuda::CsInputs in{k.kc.data(), k.zc.data(), k.ring_kv.data(), k.ring_gate.data(),
                          k.bias.data(), k.m, k.c, d};
  for (int64_t r = 0; r < k.n_out(); ++r) {
    if (k.dst[size_t(r)] < 0) continue;
    const int32_t* slots = k.src.data() + r * ns;
    std::vector<float> row(static_cast<size_t>(d));
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
            if (pl.prefetch)
              cuda::cs_fold_slots_pf<4, 4, 2>(in, slots, j0, j1, g * 4, st);
            else if (pl.unroll == 8)
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
      for (int ch = g0 * V; ch < g1 * V; ++ch)
        row[size_t(ch)] = cuda::cs_merge(&mx[size_t(ch)], &sum[size_t(ch)], &acc[size_t(ch)],
                                         pl.parts, d);
    }
    const float total = cuda::cs_row_sumsq(row.data(), d);  // the kernel's order, any K
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
    // The wide (decode) plan: other CTA / thread split, prefetching fold — the same bits.
    const std::vector<float> ew = emulate(k, vec_ok, /*wide=*/true);
    EXPECT_EQ(std::memcmp(ew.data(), em.data(), em.size() * sizeof(float)), 0)
        << "wide plan differs from the base plan: " << rel_err(ew, em);
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
