// FlashCompressor (ops/cuda/compressor.h): CudaOps::compress_fused vs (1) the default composition
// of the same backend's ops (compress_pool → rms_norm → rope → store_rows, ring gather/store:
// the unfused CUDA sequence the model ran before) and (2) the CPU backend's composition, on
// C4 (m 4, overlap 2, d 512 and the indexer's d 128) and C128 (m 128, overlap 1, d 512), for
// host-planned prefill steps (many closing windows, chunks longer than the ring so refreshed
// ring rows are also read as state) and device-planned decode steps (B rows, a few closing,
// padding). Every pool row and ring row the step must write is NaN before the call.
// Tolerance: ≤ 1e-5 relative to the largest magnitude (fp32 reference mode). The kernel is not
// bit-identical to the unfused sequence: its pooling is an online softmax over slot partitions
// merged with the standard rescale, and its Σx² is a different reduction tree (per CTA slice,
// then cluster ranks in order), which moves results by a few ulps (≈1e-7 relative; the same
// arithmetic run on the host in tests/model/test_compress_split.cpp stays below 1e-6), so the
// tolerance was not changed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "../model/compressor_cases.h"
#include "cuda_test_util.h"
#include "ops/cuda/compressor.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"

namespace v4::ops {
namespace {

using cuda::testing::Dev;
using cuda::testing::rel_err;
using v4::testing::CompressCase;
using v4::testing::CompressSlice;
using v4::testing::random_decode_positions;

constexpr double kTol = 1e-5;
constexpr float kEps = 1e-6f;

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

// Inputs with NaN in every pool row and ring row the step writes (ring rows also read as state
// keep their values: the pooling must see them).
void poison_outputs(CompressCase& k) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int32_t r : k.dst)
    if (r >= 0) std::fill_n(k.pool.begin() + int64_t(r) * k.d, k.d, nan);
  std::vector<char> read(size_t(k.ring_total), 0);
  for (int32_t v : k.src)
    if (v <= -2) read[size_t(-v - 2)] = 1;
  for (int32_t r : k.ring_dst)
    if (r >= 0 && !read[size_t(r)]) {
      std::fill_n(k.ring_kv.begin() + int64_t(r) * k.width(), k.width(), nan);
      std::fill_n(k.ring_gate.begin() + int64_t(r) * k.width(), k.width(), nan);
    }
}

// The case's buffers on one backend (host vectors for the CPU, device copies for the GPU).
struct Bufs {
  std::vector<float> pool, rkv, rg, scratch;  // CPU
  std::unique_ptr<Dev<float>> dkc, dzc, drkv, drg, dbias, dnorm, dfreq, dpool, dscratch;
  std::unique_ptr<Dev<int32_t>> dsrc, ddst, drs, drd;
  std::unique_ptr<Dev<int64_t>> dpos;
};

CompressFusedArgs base_args(const CompressCase& k) {
  CompressFusedArgs a;
  a.eps = kEps;
  a.n_out = k.n_out();
  a.n_ring = k.n_ring();
  a.ratio = k.m;
  a.overlap = k.c;
  a.dim = k.d;
  a.rope_dim = k.rd;
  a.attention_scaling = 1.f;
  return a;
}

CompressFusedArgs cpu_args(CompressCase& k, Bufs& b) {
  CompressFusedArgs a = base_args(k);
  b.pool = k.pool;
  b.rkv = k.ring_kv;
  b.rg = k.ring_gate;
  b.scratch.assign(size_t(std::max<int64_t>(k.n_out() * k.d, k.n_ring() * k.width())), 0.f);
  a.fresh_kv = k.kc.data();
  a.fresh_gate = k.zc.data();
  a.state_kv = b.rkv.data();
  a.state_gate = b.rg.data();
  a.bias = k.bias.data();
  a.norm = k.norm.data();
  a.src = k.src.data();
  a.positions = k.positions.data();
  a.dst = k.dst.data();
  a.ring_src = k.ring_src.data();
  a.ring_dst = k.ring_dst.data();
  a.inv_freq = k.inv_freq.data();
  a.pool = b.pool.data();
  a.scratch = b.scratch.data();
  return a;
}

CompressFusedArgs gpu_args(const CompressCase& k, Bufs& b) {
  CompressFusedArgs a = base_args(k);
  b.dkc = std::make_unique<Dev<float>>(k.kc);
  b.dzc = std::make_unique<Dev<float>>(k.zc);
  b.drkv = std::make_unique<Dev<float>>(k.ring_kv);
  b.drg = std::make_unique<Dev<float>>(k.ring_gate);
  b.dbias = std::make_unique<Dev<float>>(k.bias);
  b.dnorm = std::make_unique<Dev<float>>(k.norm);
  b.dfreq = std::make_unique<Dev<float>>(k.inv_freq);
  b.dpool = std::make_unique<Dev<float>>(k.pool);
  b.dscratch = std::make_unique<Dev<float>>(
      size_t(std::max<int64_t>(k.n_out() * k.d, k.n_ring() * k.width())));
  b.dsrc = std::make_unique<Dev<int32_t>>(k.src);
  b.ddst = std::make_unique<Dev<int32_t>>(k.dst);
  b.drs = std::make_unique<Dev<int32_t>>(k.ring_src);
  b.drd = std::make_unique<Dev<int32_t>>(k.ring_dst);
  b.dpos = std::make_unique<Dev<int64_t>>(k.positions);
  a.fresh_kv = b.dkc->p;
  a.fresh_gate = b.dzc->p;
  a.state_kv = b.drkv->p;
  a.state_gate = b.drg->p;
  a.bias = b.dbias->p;
  a.norm = b.dnorm->p;
  a.src = b.dsrc->p;
  a.positions = b.dpos->p;
  a.dst = b.ddst->p;
  a.ring_src = b.drs->p;
  a.ring_dst = b.drd->p;
  a.inv_freq = b.dfreq->p;
  a.pool = b.dpool->p;
  a.scratch = b.dscratch->p;
  return a;
}

enum class Mode { kEager, kGraph };

// Runs the step on the CPU (reference), the CUDA default composition and the FlashCompressor:
// the two-launch form (ring_disjoint = false) always, and the one-launch form (ring refresh in
// the rows kernel's grid) when the case has no ring hazard — as the model sets the flag
// (ops::compress_ring_disjoint for host plans, always for device decode plans). `expect_one`:
// the case must take the one-launch form too (asserts the case builder's intent).
void run_case(CompressCase k, Mode mode = Mode::kEager, bool expect_one = false) {
  poison_outputs(k);
  Bufs c, unfused;
  cpu()->compress_fused(cpu_args(k, c));
  // The CPU composition is the reference: it wrote every poisoned row.
  for (float v : c.pool) ASSERT_FALSE(std::isnan(v));
  for (float v : c.rkv) ASSERT_FALSE(std::isnan(v));
  const CompressFusedArgs au = gpu_args(k, unfused);
  gpu()->Ops::compress_fused(au);  // the default composition on the CUDA backend
  gpu()->synchronize();
  const auto pu = unfused.dpool->host();
  EXPECT_LE(rel_err(pu, c.pool), kTol);  // the two compositions agree
  EXPECT_TRUE(unfused.drkv->host() == c.rkv);

  const bool disjoint = compress_ring_disjoint(k.src.data(), int64_t(k.src.size()),
                                               k.ring_dst.data(), k.n_ring());
  ASSERT_EQ(disjoint, !k.ring_hazard());
  if (expect_one) {
    ASSERT_TRUE(disjoint);
  }
  for (bool one : {false, true}) {
    if (one && !disjoint) continue;
    SCOPED_TRACE(one ? "one launch (ring_disjoint)" : "two launches");
    Bufs fused;
    CompressFusedArgs af = gpu_args(k, fused);
    af.ring_disjoint = one;
    if (mode == Mode::kGraph) {
      std::unique_ptr<Graph> g = gpu()->capture([&] { gpu()->compress_fused(af); });
      ASSERT_NE(g, nullptr);
      g->replay();
    } else {
      gpu()->compress_fused(af);
    }
    gpu()->synchronize();
    const auto pf = fused.dpool->host();
    const double e_unfused = rel_err(pf, pu), e_cpu = rel_err(pf, c.pool);
    std::printf("  n_out=%lld n_ring=%lld %s: fused vs CUDA unfused %.2e, vs CPU %.2e\n",
                (long long)k.n_out(), (long long)k.n_ring(), one ? "1 launch" : "2 launches",
                e_unfused, e_cpu);
    EXPECT_LE(e_unfused, kTol);
    EXPECT_LE(e_cpu, kTol);
    // rel_err covers the whole pool: rows not written keep their values, the poisoned rows
    // were all written (a NaN left gives inf). Ring refresh: exact copies.
    EXPECT_TRUE(fused.drkv->host() == c.rkv);
    EXPECT_TRUE(fused.drg->host() == c.rg);
  }
}

struct Rate {
  int m, c, d;
};
const Rate kRates[] = {{4, 2, 512}, {4, 2, 128}, {128, 1, 512}};

TEST(CudaCompressor, PrefillMatchesUnfused) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  for (Rate r : kRates) {
    SCOPED_TRACE(::testing::Message() << "m=" << r.m << " c=" << r.c << " d=" << r.d);
    // Three chunks: one from position 0, two starting mid-window with earlier tokens in the ring;
    // each longer than the ring, so refreshed ring rows are read as state in the same step.
    const int64_t L = 3 * r.c * r.m + 5;
    CompressCase k = v4::testing::prefill_case(
        r.m, r.c, r.d, 64, {{0, r.m + 3, L}, {3, 0, L + r.m}, {1, 2 * r.m - 1, L + 1}},
        cuda::testing::test_seed() + r.m + r.d);
    ASSERT_TRUE(k.ring_hazard());
    ASSERT_GE(k.n_out(), 6);
    run_case(std::move(k));
  }
}

TEST(CudaCompressor, LongPrefillC4) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  // 2K tokens of one sequence after 130 earlier ones: 512 closing windows.
  for (int d : {512, 128})
    run_case(v4::testing::prefill_case(4, 2, d, 64, {{2, 130, 2048}},
                                       cuda::testing::test_seed() + d));
}

TEST(CudaCompressor, LongPrefillC128) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  // 4K tokens of one sequence after 130 earlier ones: 32 closing windows, each split over a
  // cluster of CTAs (d 512: 8 slices of 64 channels; d 196: 4 slices of 52, 52, 52, 40 channels).
  for (int d : {512, 196}) {
    CompressCase k = v4::testing::prefill_case(128, 1, d, 64, {{2, 130, 4096}},
                                               cuda::testing::test_seed() + 128 + d);
    ASSERT_TRUE(k.ring_hazard());
    ASSERT_EQ(k.n_out(), 32);
    run_case(std::move(k));
  }
}

TEST(CudaCompressor, DecodeMatchesUnfused) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  for (Rate r : kRates)
    for (int B : {1, 3, 7, 64}) {
      SCOPED_TRACE(::testing::Message() << "m=" << r.m << " d=" << r.d << " B=" << B);
      const uint64_t seed = cuda::testing::test_seed() + B * 31 + r.m;
      run_case(v4::testing::decode_case(r.m, r.c, r.d, 64, random_decode_positions(B, r.m, seed), seed),
               Mode::kEager, /*expect_one=*/true);
    }
}

TEST(CudaCompressor, DecodeUnderGraphCapture) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  ASSERT_TRUE(gpu()->supports_graphs());
  for (Rate r : kRates) {
    SCOPED_TRACE(::testing::Message() << "m=" << r.m << " d=" << r.d);
    const uint64_t seed = cuda::testing::test_seed() + 977 + r.m;
    run_case(v4::testing::decode_case(r.m, r.c, r.d, 64, random_decode_positions(64, r.m, seed), seed),
             Mode::kGraph, /*expect_one=*/true);
  }
}

TEST(CudaCompressor, OddShapes) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  // d odd (scalar path: 1 channel per thread, scalar ring copy), d = 130 (d % 4 = 2: scalar path
  // with 16 window partitions and several channels per thread), d = 1100 (vector path, 2 CTAs of
  // 138 / 137 groups), d = 132 with rd = 6 (vector path, RoPE starting inside a float4, 4 window
  // partitions), rope_dim = d, d = 4.
  struct S { int m, c, d, rd; };
  for (S s : {S{3, 2, 37, 8}, S{128, 1, 130, 64}, S{5, 1, 1100, 64}, S{16, 2, 132, 6},
              S{4, 2, 64, 64}, S{4, 2, 4, 4}}) {
    SCOPED_TRACE(::testing::Message() << "m=" << s.m << " c=" << s.c << " d=" << s.d);
    CompressCase k = v4::testing::prefill_case(s.m, s.c, s.d, s.rd, {{0, 1, 4 * s.m + 3}, {1, 0, 9}},
                                               cuda::testing::test_seed() + s.d);
    run_case(std::move(k));
    // Hazard-free form of the same shape: the one-launch kernel (ring CTAs after the rows).
    run_case(v4::testing::prefill_case(s.m, s.c, s.d, s.rd, {{0, 0, 4 * s.m + 3}, {1, 2 * s.m - 2, 2}},
                                       cuda::testing::test_seed() + 5 + s.d),
             Mode::kEager, /*expect_one=*/true);
  }
}

// Prefill chunks without a ring hazard take the one-launch form: a chunk from position 0
// crossing many windows (refreshing c·m ring rows), the last two tokens of a window (closing it
// with state rows) and a single closing token, in one call; and long chunks from 0 as the
// benchmark's prefill 8K (C4: 512 windows; C128: 32 windows, each a cluster of 8 CTAs, with the
// ring CTAs appended as whole clusters).
TEST(CudaCompressor, PrefillOneLaunch) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  for (Rate r : kRates) {
    SCOPED_TRACE(::testing::Message() << "m=" << r.m << " c=" << r.c << " d=" << r.d);
    const uint64_t seed = cuda::testing::test_seed() + 313 + r.m + r.d;
    run_case(v4::testing::prefill_case(r.m, r.c, r.d, 64,
                                       {{0, 0, 5 * int64_t(r.m) + 3},
                                        {1, 2 * int64_t(r.m) - 2, 2},
                                        {2, 3 * int64_t(r.m) - 1, 1}},
                                       seed),
             Mode::kEager, /*expect_one=*/true);
    run_case(v4::testing::prefill_case(r.m, r.c, r.d, 64, {{0, 0, r.m == 4 ? 2048 : 4096}}, seed + 1),
             Mode::kEager, /*expect_one=*/true);
  }
}

// Consecutive decode steps issued back to back (no host sync; eager and as one captured graph):
// step s + 1 pools ring rows that step s refreshed and writes ring rows step s read, so each
// launch must see the previous one complete (the kernels are launched with programmatic
// dependent launch; every CTA waits on griddepcontrol.wait before touching memory). Compared
// with the CPU running the same steps; 2m steps at positions p0 + s, every row closing a window
// once per m steps.
TEST(CudaCompressor, ConsecutiveDecodeSteps) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  for (Rate r : kRates)
    for (Mode mode : {Mode::kEager, Mode::kGraph}) {
      SCOPED_TRACE(::testing::Message() << "m=" << r.m << " d=" << r.d
                                        << (mode == Mode::kGraph ? " graph" : " eager"));
      const int B = 64, steps = std::min(2 * r.m, 12);
      std::vector<int64_t> p0(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b) p0[size_t(b)] = b == 5 ? -1 : 1000 + 7 * b;  // one padding row
      std::vector<CompressCase> ks;
      for (int s = 0; s < steps; ++s) {
        std::vector<int64_t> pos = p0;
        for (auto& p : pos)
          if (p >= 0) p += s;
        ks.push_back(v4::testing::decode_case(r.m, r.c, r.d, 64, pos,
                                              cuda::testing::test_seed() + 71 * s + r.m));
      }
      // CPU: the steps in order on one ring / pool.
      std::vector<float> pool = ks[0].pool, rkv = ks[0].ring_kv, rg = ks[0].ring_gate;
      for (CompressCase& k : ks) {
        Bufs c;
        CompressFusedArgs a = cpu_args(k, c);
        a.state_kv = rkv.data();
        a.state_gate = rg.data();
        a.pool = pool.data();
        cpu()->compress_fused(a);
      }
      // GPU: every input uploaded first, then the steps without a sync in between.
      std::vector<Bufs> gb(ks.size());
      std::vector<CompressFusedArgs> ga;
      for (size_t s = 0; s < ks.size(); ++s) {
        ga.push_back(gpu_args(ks[s], gb[s]));
        ga.back().ring_disjoint = true;
        ga.back().state_kv = gb[0].drkv->p;
        ga.back().state_gate = gb[0].drg->p;
        ga.back().pool = gb[0].dpool->p;
      }
      auto body = [&] {
        for (const CompressFusedArgs& a : ga) gpu()->compress_fused(a);
      };
      if (mode == Mode::kGraph) {
        std::unique_ptr<Graph> g = gpu()->capture(body);
        ASSERT_NE(g, nullptr);
        g->replay();
      } else {
        body();
      }
      gpu()->synchronize();
      const double e = rel_err(gb[0].dpool->host(), pool);
      std::printf("  %d steps: pool vs CPU %.2e\n", steps, e);
      EXPECT_LE(e, kTol);
      EXPECT_TRUE(gb[0].drkv->host() == rkv);
      EXPECT_TRUE(gb[0].drg->host() == rg);
    }
}

// Sets V4_COMPRESS_WIDE for a scope (compressor.cu reads it at every call): "1" the wide
// (decode) plans for every call, "0" the base plans for every call.
struct WideEnv {
  explicit WideEnv(const char* v) { setenv("V4_COMPRESS_WIDE", v, 1); }
  ~WideEnv() { unsetenv("V4_COMPRESS_WIDE"); }
  WideEnv(const WideEnv&) = delete;
  WideEnv& operator=(const WideEnv&) = delete;
};

// Pool and ring contents after one FlashCompressor call of case k (poisoned outputs).
struct FusedOut {
  std::vector<float> pool, rkv, rg;
};
FusedOut run_fused(const CompressCase& k, bool one, bool rows_close = false) {
  Bufs b;
  CompressFusedArgs a = gpu_args(k, b);
  a.ring_disjoint = one;
  a.rows_close = rows_close;
  gpu()->compress_fused(a);
  gpu()->synchronize();
  return FusedOut{b.dpool->host(), b.drkv->host(), b.drg->host()};
}

// The wide (decode) plans — K CTAs per row over more SMs (C4 d512: 4 × 32 channels; indexer
// d128: 2 × 64; C128: 8 × 64), every slot load of a thread in flight before any math — against
// the CPU composition (1e-5) and against the base plans (V4_COMPRESS_WIDE=0): they are built to
// give the same bits (same partitions and load batches, Σx² in the kCsChunk order for any K),
// checked at ≤ 1e-6 (a compiler's different FMA contraction would be the only excuse; printed).
// Cases per shape: decode B = 1 and 64 (one launch; ring rows of every sequence), prefill chunks
// with the ring hazard (two launches; ring wrap: refreshed rows read as state), chunks that end
// on / start at window edges (the last two tokens of a window, a single closing token), a long
// chunk from 0 (C4: 512 windows, over kWideMaxRows — the wide plan only because it is forced).
TEST(CudaCompressor, WidePlanMatchesBaseAndCpu) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  for (Rate r : kRates) {
    const uint64_t seed = cuda::testing::test_seed() + 4242 + r.m + r.d;
    const auto cases = v4::testing::standard_cases(r.m, r.c, r.d, 64, seed, r.m == 4 ? 2048 : 4096);
    for (auto& [name, k0] : cases) {
      SCOPED_TRACE(::testing::Message() << "m=" << r.m << " d=" << r.d << " " << name);
      CompressCase k = k0;
      poison_outputs(k);
      Bufs c;
      cpu()->compress_fused(cpu_args(k, c));
      const bool disjoint = compress_ring_disjoint(k.src.data(), int64_t(k.src.size()),
                                                   k.ring_dst.data(), k.n_ring());
      for (bool one : {false, true}) {
        if (one && !disjoint) continue;
        SCOPED_TRACE(one ? "one launch" : "two launches");
        FusedOut wide, base;
        {
          WideEnv e("1");
          wide = run_fused(k, one);
        }
        {
          WideEnv e("0");
          base = run_fused(k, one);
        }
        const double e_cpu = rel_err(wide.pool, c.pool), e_base = rel_err(wide.pool, base.pool);
        const bool same_bits = wide.pool == base.pool;
        std::printf("  m=%d d=%d %s %s: wide vs CPU %.2e, vs base plan %.2e (%s)\n", r.m, r.d,
                    name, one ? "1 launch" : "2 launches", e_cpu, e_base,
                    same_bits ? "bit-identical" : "NOT bit-identical");
        EXPECT_LE(e_cpu, kTol);
        EXPECT_LE(rel_err(base.pool, c.pool), kTol);
        EXPECT_LE(e_base, 1e-6);
        EXPECT_TRUE(wide.rkv == c.rkv);
        EXPECT_TRUE(wide.rg == c.rg);
        EXPECT_TRUE(base.rkv == c.rkv);
        EXPECT_TRUE(base.rg == c.rg);
      }
    }
  }
}

// The row-warp kernel (one warp per row; windows of ≤ 8 slots, d ≤ 128, d % 32 == 0; forced with
// V4_COMPRESS_ROWWARP=1, by default it serves calls of ≥ 256 rows) reproduces
// the rows kernel's base plan bit for bit (same partitions, merge and Σx² order, the same RoPE
// roundings): pools equal with V4_COMPRESS_ROWWARP=0, both within 1e-5 of the CPU composition,
// rings exact. Shapes: the indexer's C4 d128 rope 64, C4 d64 / d96 / d32 (idle lanes), m = 2
// (4 slots: one partition) and c = 1 m = 4; cases as WidePlanMatchesBaseAndCpu (decode B = 1 and
// 64, prefill with the ring hazard, window edges, a long chunk from 0), one and two launches.
TEST(CudaCompressor, RowWarpMatchesRowsKernelBits) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  struct Shape { int m, c, d, rd; };
  for (Shape r : {Shape{4, 2, 128, 64}, Shape{4, 2, 64, 32}, Shape{4, 2, 96, 32},
                  Shape{4, 2, 32, 8}, Shape{2, 2, 128, 64}, Shape{4, 1, 128, 64}}) {
    const uint64_t seed = cuda::testing::test_seed() + 977 + r.m + r.d + r.c;
    const auto cases = v4::testing::standard_cases(r.m, r.c, r.d, r.rd, seed, 2048);
    for (auto& [name, k0] : cases) {
      SCOPED_TRACE(::testing::Message() << "m=" << r.m << " c=" << r.c << " d=" << r.d << " "
                                        << name);
      CompressCase k = k0;
      poison_outputs(k);
      Bufs c;
      cpu()->compress_fused(cpu_args(k, c));
      setenv("V4_COMPRESS_ROWWARP", "1", 1);  // at every row count (default: ≥ 256 rows)
      {
        Bufs b;
        EXPECT_TRUE(cuda::compress_fused_takes_row_warp(gpu_args(k, b)));
      }
      unsetenv("V4_COMPRESS_ROWWARP");
      const bool disjoint = compress_ring_disjoint(k.src.data(), int64_t(k.src.size()),
                                                   k.ring_dst.data(), k.n_ring());
      for (bool one : {false, true}) {
        if (one && !disjoint) continue;
        SCOPED_TRACE(one ? "one launch" : "two launches");
        setenv("V4_COMPRESS_ROWWARP", "1", 1);
        const FusedOut warp = run_fused(k, one);
        setenv("V4_COMPRESS_ROWWARP", "0", 1);
        const FusedOut rows = run_fused(k, one);
        unsetenv("V4_COMPRESS_ROWWARP");
        EXPECT_LE(rel_err(warp.pool, c.pool), kTol);
        EXPECT_LE(rel_err(rows.pool, c.pool), kTol);
        ASSERT_EQ(warp.pool.size(), rows.pool.size());
        int64_t differ = 0;
        for (size_t i = 0; i < warp.pool.size(); ++i)
          differ += std::memcmp(&warp.pool[i], &rows.pool[i], sizeof(float)) != 0;
        EXPECT_EQ(differ, 0) << "pool values that differ from the rows kernel's bits";
        EXPECT_TRUE(warp.rkv == c.rkv);
        EXPECT_TRUE(warp.rg == c.rg);
      }
    }
  }
  // Default: prefill-sized calls only (≥ 256 rows), not decode batches.
  {
    Bufs bp, bd;
    EXPECT_TRUE(cuda::compress_fused_takes_row_warp(
        gpu_args(v4::testing::prefill_case(4, 2, 128, 64, {{0, 0, 2048}}, 3), bp)));
    EXPECT_FALSE(cuda::compress_fused_takes_row_warp(gpu_args(
        v4::testing::decode_case(4, 2, 128, 64, random_decode_positions(64, 4, 4), 4), bd)));
  }
  // Not taken: d 512 (the CSA kv and HCA compressors), C128 windows.
  setenv("V4_COMPRESS_ROWWARP", "1", 1);
  Bufs b1, b2;
  EXPECT_FALSE(cuda::compress_fused_takes_row_warp(
      gpu_args(v4::testing::decode_case(4, 2, 512, 64, {7}, 1), b1)));
  EXPECT_FALSE(cuda::compress_fused_takes_row_warp(
      gpu_args(v4::testing::decode_case(128, 1, 128, 64, {255}, 2), b2)));
  unsetenv("V4_COMPRESS_ROWWARP");
}

// Thread / CTA splits of the rows kernel give the base plan's bits: the same batches folded in
// the same order per channel, the same merge and Σx² order, whatever the CTA (V4_COMPRESS_CTAS =
// K CTAs per row) and thread (V4_COMPRESS_THREADS = T threads per CTA: threads walk more channel
// groups) counts, and with the rows_close hint (prefill-sized calls of C128 windows: 128-thread
// CTAs), and with the ≤ 85-register instance (V4_COMPRESS_MORE_REGS=1, which the hint takes for
// those CTAs). Pools compared bit for bit with the default (rows kernel, V4_COMPRESS_ROWWARP=0), both
// within 1e-5 of the CPU composition; rings exact. Shapes: HCA C128 d512, CSA C4 d512, the
// indexer C4 d128, C128 d192 rope 32 (6 slices of 32 channels at K = 8), C16 d64 (one CTA); the
// standard cases (decode B = 1 / 64, the ring hazard, window edges, a long chunk from 0), one and
// two launches.
TEST(CudaCompressor, ThreadAndCtaSplitsMatchBasePlanBits) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  struct Shape { int m, c, d, rd; };
  struct Env { bool rows_close; const char* ctas; const char* threads; const char* regs; };
  const Env envs[] = {{true, nullptr, nullptr, nullptr}, {false, nullptr, "128", nullptr},
                      {false, nullptr, "64", nullptr},   {false, "4", nullptr, nullptr},
                      {false, "2", "64", nullptr},       {false, "4", "128", nullptr},
                      {false, nullptr, nullptr, "1"},    {false, nullptr, "128", "1"},
                      {true, nullptr, nullptr, "1"}};
  auto set = [](const char* n, const char* v) { v ? setenv(n, v, 1) : unsetenv(n); };
  setenv("V4_COMPRESS_ROWWARP", "0", 1);
  int64_t compared = 0;
  for (Shape r : {Shape{128, 1, 512, 64}, Shape{4, 2, 512, 64}, Shape{4, 2, 128, 64},
                  Shape{128, 1, 192, 32}, Shape{16, 1, 64, 16}}) {
    const uint64_t seed = cuda::testing::test_seed() + 1409 + r.m + r.d + r.c;
    const auto cases = v4::testing::standard_cases(r.m, r.c, r.d, r.rd, seed, r.m == 128 ? 2048 : 1024);
    for (auto& [name, k0] : cases) {
      CompressCase k = k0;
      poison_outputs(k);
      Bufs c;
      cpu()->compress_fused(cpu_args(k, c));
      const bool disjoint = compress_ring_disjoint(k.src.data(), int64_t(k.src.size()),
                                                   k.ring_dst.data(), k.n_ring());
      for (bool one : {false, true}) {
        if (one && !disjoint) continue;
        const FusedOut base = run_fused(k, one);
        EXPECT_LE(rel_err(base.pool, c.pool), kTol);
        for (const Env& e : envs) {
          SCOPED_TRACE(::testing::Message()
                       << "m=" << r.m << " c=" << r.c << " d=" << r.d << " " << name
                       << (one ? ", one launch" : ", two launches") << ", rows_close="
                       << e.rows_close << " CTAS=" << (e.ctas ? e.ctas : "-") << " THREADS="
                       << (e.threads ? e.threads : "-") << " MORE_REGS="
                       << (e.regs ? e.regs : "-"));
          set("V4_COMPRESS_CTAS", e.ctas);
          set("V4_COMPRESS_THREADS", e.threads);
          set("V4_COMPRESS_MORE_REGS", e.regs);
          const FusedOut got = run_fused(k, one, e.rows_close);
          set("V4_COMPRESS_CTAS", nullptr);
          set("V4_COMPRESS_THREADS", nullptr);
          set("V4_COMPRESS_MORE_REGS", nullptr);
          ASSERT_EQ(got.pool.size(), base.pool.size());
          int64_t differ = 0;
          for (size_t i = 0; i < got.pool.size(); ++i)
            differ += std::memcmp(&got.pool[i], &base.pool[i], sizeof(float)) != 0;
          EXPECT_EQ(differ, 0) << "pool values that differ from the base plan's bits";
          EXPECT_TRUE(got.rkv == c.rkv);
          EXPECT_TRUE(got.rg == c.rg);
          ++compared;
        }
      }
    }
  }
  unsetenv("V4_COMPRESS_ROWWARP");
  std::printf("[compressor] thread / CTA splits: %lld runs compared bit for bit\n",
              (long long)compared);
}

}  // namespace
}  // namespace v4::ops
