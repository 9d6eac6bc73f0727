// FlashCompressor with its projections (ops/cuda/compress_proj.h, Ops::compress_project): the
// projection kernel (kc, zc and the ring refresh in one launch) followed by the pooling kernel,
// against (1) a double-precision host product for kc / zc, (2) the CPU backend's compress_fused
// run on those kc / zc for the pool and ring rows, and (3) the CUDA default composition
// (V4_COMPRESS_PROJ=0: linear_w ×2 + compress_fused). Inputs are bf16 values (x and weights), so
// the kernel's rounding of x to bf16 is exact and only summation order separates it from the
// references: tolerance 1e-5 relative to the largest magnitude for kc / zc / ring rows and the
// pool rows (a wrong row, column or K slice gives O(1) errors). Decode steps of the model's
// shapes (C4 d512, the indexer's C4 d128, C128 d512; D 4096 as V4-Flash and 1024) at B = 1, 3,
// 17, 64, eager and graph-captured; kc / zc of a row bit-identical whatever B (batch invariance);
// the plan of the model shapes (host-only).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "../model/compressor_cases.h"
#include "base/dtype.h"
#include "cuda_test_util.h"
#include "ops/cuda/compress_proj.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"

namespace v4::ops {
namespace {

using cuda::testing::Dev;
using cuda::testing::rel_err;
using v4::testing::CompressCase;
using v4::testing::random_decode_positions;

constexpr double kTol = 1e-5;
constexpr float kEps = 1e-6f;

Ops* cpu() {
  static auto o = make_cpu_ops();
  return o.get();
}
Ops* gpu() {  // bf16 mode: the mode compress_proj runs in
  static std::unique_ptr<Ops> o = [] {
    CudaOptions co;
    co.precision = Precision::kBf16;
    auto r = make_cuda_ops(co);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? std::move(r).value() : nullptr;
  }();
  return o.get();
}

uint16_t bf16_bits(float v) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float bf16_value(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

// x [S, D] and the two weight matrices [c·d, D] as bf16 values (host floats + device bits).
struct ProjInputs {
  int64_t S = 0, D = 0, n = 0;
  std::vector<float> x, wkv, wg;  // exact bf16 values
  std::vector<uint16_t> wkv_bits, wg_bits;
};

ProjInputs make_inputs(int64_t S, int64_t D, int64_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  ProjInputs p;
  p.S = S, p.D = D, p.n = n;
  p.x.resize(size_t(S * D));
  for (auto& v : p.x) v = bf16_value(bf16_bits(nd(g)));
  const float ws = 1.f / std::sqrt(float(D));
  for (auto* pair : {&p.wkv, &p.wg}) {
    pair->resize(size_t(n * D));
    for (auto& v : *pair) v = bf16_value(bf16_bits(nd(g) * ws));
  }
  for (float v : p.wkv) p.wkv_bits.push_back(bf16_bits(v));
  for (float v : p.wg) p.wg_bits.push_back(bf16_bits(v));
  return p;
}

// y[t, j] = Σ_k x[t, k] · w[j, k] in double, rounded to float.
std::vector<float> host_product(const ProjInputs& p, const std::vector<float>& w) {
  std::vector<float> y(size_t(p.S * p.n));
  for (int64_t t = 0; t < p.S; ++t)
    for (int64_t j = 0; j < p.n; ++j) {
      double s = 0;
      for (int64_t k = 0; k < p.D; ++k)
        s += double(p.x[size_t(t * p.D + k)]) * double(w[size_t(j * p.D + k)]);
      y[size_t(t * p.n + j)] = float(s);
    }
  return y;
}

WeightView bf16_view(const uint16_t* d, int64_t n, int64_t k) {
  WeightView v;
  v.data = d;
  v.format = WFormat::kBF16;
  v.n = n;
  v.k = k;
  v.rows_total = n;
  return v;
}

// Device state of one compress_project call.
struct GpuStep {
  std::unique_ptr<Dev<float>> x, kc, zc, rkv, rg, bias, norm, freq, pool, scratch;
  std::unique_ptr<Dev<uint16_t>> wkv, wg;
  std::unique_ptr<Dev<int32_t>> src, dst, rs, rd;
  std::unique_ptr<Dev<int64_t>> pos;
  CompressProjectArgs args;
};

std::unique_ptr<GpuStep> gpu_step(const CompressCase& k, const ProjInputs& p) {
  auto g = std::make_unique<GpuStep>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  g->x = std::make_unique<Dev<float>>(p.x);
  g->wkv = std::make_unique<Dev<uint16_t>>(p.wkv_bits);
  g->wg = std::make_unique<Dev<uint16_t>>(p.wg_bits);
  g->kc = std::make_unique<Dev<float>>(std::vector<float>(size_t(p.S * p.n), nan));
  g->zc = std::make_unique<Dev<float>>(std::vector<float>(size_t(p.S * p.n), nan));
  g->rkv = std::make_unique<Dev<float>>(k.ring_kv);
  g->rg = std::make_unique<Dev<float>>(k.ring_gate);
  g->bias = std::make_unique<Dev<float>>(k.bias);
  g->norm = std::make_unique<Dev<float>>(k.norm);
  g->freq = std::make_unique<Dev<float>>(k.inv_freq);
  g->pool = std::make_unique<Dev<float>>(k.pool);
  g->scratch = std::make_unique<Dev<float>>(
      size_t(std::max<int64_t>(1, std::max<int64_t>(k.n_out() * k.d, k.n_ring() * k.width()))));
  g->src = std::make_unique<Dev<int32_t>>(k.src);
  g->dst = std::make_unique<Dev<int32_t>>(k.dst);
  g->rs = std::make_unique<Dev<int32_t>>(k.ring_src);
  g->rd = std::make_unique<Dev<int32_t>>(k.ring_dst);
  g->pos = std::make_unique<Dev<int64_t>>(k.positions);
  CompressProjectArgs& a = g->args;
  a.x = g->x->p;
  a.ldx = p.D;
  a.n_fresh = p.S;
  a.wkv = bf16_view(g->wkv->p, p.n, p.D);
  a.wgate = bf16_view(g->wg->p, p.n, p.D);
  a.kc = g->kc->p;
  a.zc = g->zc->p;
  CompressFusedArgs& s = a.step;
  s.eps = kEps;
  s.n_out = k.n_out();
  s.n_ring = k.n_ring();
  s.ratio = k.m;
  s.overlap = k.c;
  s.dim = k.d;
  s.rope_dim = k.rd;
  s.attention_scaling = 1.f;
  s.state_kv = g->rkv->p;
  s.state_gate = g->rg->p;
  s.bias = g->bias->p;
  s.norm = g->norm->p;
  s.src = g->src->p;
  s.positions = g->pos->p;
  s.dst = g->dst->p;
  s.ring_src = g->rs->p;
  s.ring_dst = g->rd->p;
  s.inv_freq = g->freq->p;
  s.pool = g->pool->p;
  s.scratch = g->scratch->p;
  s.ring_disjoint = true;  // device-planned decode step
  return g;
}

// Sets V4_COMPRESS_PROJ for a scope ("0": the default composition; "1": compress_proj for every
// step it supports, one-row steps included — by default those take the composition); the
// previous value comes back after it.
struct ProjEnv : cuda::testing::ScopedEnv {
  explicit ProjEnv(const char* v) : ScopedEnv("V4_COMPRESS_PROJ", v) {}
};

enum class Mode { kEager, kGraph, kComposed };

// One decode step of shape (m, c, d) over D input columns with B rows: the GPU (mode) against
// the references. `disjoint`: the step's ring_disjoint (false, or B > 64: compress_proj must
// decline and the composition run). B < kCompressProjMinRows takes the composition by default,
// compress_proj with `force_fused` (V4_COMPRESS_PROJ=1). Returns the GPU's kc.
std::vector<float> run_step(int m, int c, int d, int64_t D, int B, Mode mode, uint64_t seed,
                            bool disjoint = true, bool force_fused = false) {
  CompressCase k = v4::testing::decode_case(m, c, d, 64, random_decode_positions(B, m, seed), seed);
  const ProjInputs p = make_inputs(B, D, k.width(), seed + 1);
  k.kc = host_product(p, p.wkv);
  k.zc = host_product(p, p.wg);
  // Reference: the CPU backend's step on the double-precision kc / zc.
  std::vector<float> pool = k.pool, rkv = k.ring_kv, rg = k.ring_gate;
  std::vector<float> scratch(size_t(std::max<int64_t>(k.n_out() * k.d, k.n_ring() * k.width())));
  const CompressFusedArgs ca =
      v4::testing::host_args(k, pool.data(), rkv.data(), rg.data(), scratch.data(), kEps, 1.f);
  cpu()->compress_fused(ca);

  auto g = gpu_step(k, p);
  g->args.step.ring_disjoint = disjoint;
  const bool supported = disjoint && B <= cuda::kCompressProjMaxRows;
  const bool fused = supported && (force_fused || B >= cuda::kCompressProjMinRows);
  int sms = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  EXPECT_EQ(cuda::compress_proj_supported(g->args, sms), supported);
  std::unique_ptr<ProjEnv> force;
  if (force_fused) force = std::make_unique<ProjEnv>("1");
  const int64_t launches0 = cuda::compress_proj_launches();
  if (mode == Mode::kGraph) {
    std::unique_ptr<Graph> gr = gpu()->capture([&] { gpu()->compress_project(g->args); });
    EXPECT_NE(gr, nullptr);
    if (gr) gr->replay();
  } else if (mode == Mode::kComposed) {
    ProjEnv env("0");
    gpu()->compress_project(g->args);
  } else {
    gpu()->compress_project(g->args);
  }
  gpu()->synchronize();
  // The fused path ran (once: eager or one graph capture), or not at all when composed.
  EXPECT_EQ(cuda::compress_proj_launches() - launches0, fused && mode != Mode::kComposed ? 1 : 0);
  const auto kc = g->kc->host(), zc = g->zc->host();
  const double ekc = rel_err(kc, k.kc), ezc = rel_err(zc, k.zc);
  const double epool = rel_err(g->pool->host(), pool);
  const double erkv = rel_err(g->rkv->host(), rkv), erg = rel_err(g->rg->host(), rg);
  std::printf("  m=%d c=%d d=%d D=%lld B=%d %s: kc %.1e zc %.1e pool %.1e ring %.1e / %.1e\n", m, c,
              d, (long long)D, B,
              mode == Mode::kGraph      ? "graph"
              : mode == Mode::kComposed ? "composed"
                                        : "eager",
              ekc, ezc, epool, erkv, erg);
  EXPECT_LE(ekc, kTol);
  EXPECT_LE(ezc, kTol);
  EXPECT_LE(epool, kTol);
  EXPECT_LE(erkv, kTol);
  EXPECT_LE(erg, kTol);
  return kc;
}

struct Shape {
  int m, c, d;
};
const Shape kShapes[] = {{4, 2, 512}, {4, 2, 128}, {128, 1, 512}};

TEST(CudaCompressProj, DecodeMatchesReferences) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  for (Shape s : kShapes)
    // D 4096 (V4-Flash) and 1024: clusters of 8; 1280: clusters of 4 (320-column slices, 16 rows
    // a rank); 192: one CTA a cluster, 3 chunks.
    for (int64_t D : {int64_t(4096), int64_t(1024), int64_t(1280), int64_t(192)})
      for (int B : {1, 3, 17, 64}) {
        SCOPED_TRACE(::testing::Message()
                     << "m=" << s.m << " d=" << s.d << " D=" << D << " B=" << B);
        run_step(s.m, s.c, s.d, D, B, Mode::kEager,
                 cuda::testing::test_seed() + 7 * B + s.m + s.d + D);
        if (B < cuda::kCompressProjMinRows)  // the composition by default: compress_proj as well
          run_step(s.m, s.c, s.d, D, B, Mode::kEager,
                   cuda::testing::test_seed() + 7 * B + s.m + s.d + D, true, true);
      }
}

TEST(CudaCompressProj, GraphCaptureAndComposedPathAgree) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  for (Shape s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "m=" << s.m << " d=" << s.d);
    const uint64_t seed = cuda::testing::test_seed() + 4242 + s.d;
    run_step(s.m, s.c, s.d, 4096, 64, Mode::kGraph, seed);
    run_step(s.m, s.c, s.d, 4096, 64, Mode::kComposed, seed);
  }
}

// A row's kc / zc do not depend on how many rows the call has (the plan ignores S; token tiles
// are independent): rows 0..B−1 of a B-row call equal the first B rows of a 64-row call, bit
// for bit (compress_proj forced for the one-row call).
TEST(CudaCompressProj, RowsBitIdenticalWhateverTheBatch) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  ProjEnv force("1");
  for (Shape s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "m=" << s.m << " d=" << s.d);
    const int64_t n = int64_t(s.c) * s.d, D = 4096;
    const ProjInputs p = make_inputs(64, D, n, cuda::testing::test_seed() + 99 + s.d);
    Dev<float> x(p.x);
    Dev<uint16_t> wkv(p.wkv_bits), wg(p.wg_bits);
    std::vector<std::vector<float>> kcs;
    for (int B : {64, 1, 9, 17, 33}) {  // every instance: 16, 32 and 64 token rows
      Dev<float> kc(size_t(B) * n), zc(size_t(B) * n);
      CompressProjectArgs a;
      a.x = x.p;
      a.ldx = D;
      a.n_fresh = B;
      a.wkv = bf16_view(wkv.p, n, D);
      a.wgate = bf16_view(wg.p, n, D);
      a.kc = kc.p;
      a.zc = zc.p;
      a.step.ratio = s.m;
      a.step.overlap = s.c;
      a.step.dim = s.d;
      a.step.ring_disjoint = true;  // no windows, no ring rows: the projections alone
      const int64_t launches0 = cuda::compress_proj_launches();
      gpu()->compress_project(a);
      gpu()->synchronize();
      EXPECT_EQ(cuda::compress_proj_launches() - launches0, 1);  // the fused kernel ran
      std::vector<float> h = kc.host(), hz = zc.host();
      h.insert(h.end(), hz.begin(), hz.end());
      kcs.push_back(std::move(h));
    }
    for (size_t i = 1; i < kcs.size(); ++i) {
      const size_t half = kcs[i].size() / 2, B = half / size_t(n);
      for (size_t j = 0; j < half; ++j) {
        ASSERT_EQ(kcs[i][j], kcs[0][j]) << "kc B=" << B << " index " << j;
        ASSERT_EQ(kcs[i][half + j], kcs[0][kcs[0].size() / 2 + j])
            << "zc B=" << B << " index " << j;
      }
    }
  }
}

// Steps compress_proj must decline run the composition, with the same results: more than 64
// rows, and a step without ring_disjoint (the ring would be written before the pooling reads
// the state).
TEST(CudaCompressProj, UnsupportedStepsTakeTheComposition) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  const uint64_t seed = cuda::testing::test_seed() + 515;
  run_step(4, 2, 512, 1024, 65, Mode::kEager, seed);
  run_step(4, 2, 512, 1024, 8, Mode::kEager, seed + 1, /*disjoint=*/false);
  run_step(128, 1, 512, 1024, 8, Mode::kEager, seed + 2, /*disjoint=*/false);
}

// x rows with a stride (ldx = D + 4) from an offset pointer, and weight views that start at a row
// offset of shared storage (row0 ≠ 0, as views of a larger tensor): kc / zc against the host
// product.
TEST(CudaCompressProj, StridedRowsAndViewOffsets) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  ProjEnv force("1");  // the one-row call too
  const int64_t D = 1024, n = 1024, ldx = D + 4, pad = 32;
  for (int B : {1, 20, 64}) {
    SCOPED_TRACE(::testing::Message() << "B=" << B);
    const ProjInputs p = make_inputs(B, D, n, cuda::testing::test_seed() + 77 + B);
    std::vector<float> xs(size_t(4 + B * ldx), 1e30f);  // padding that must never be read
    for (int t = 0; t < B; ++t) std::copy_n(p.x.begin() + t * D, D, xs.begin() + 4 + t * ldx);
    std::vector<uint16_t> w(size_t((2 * n + pad) * D), 0x7fc0);  // NaN rows around the views
    std::copy(p.wkv_bits.begin(), p.wkv_bits.end(), w.begin() + pad * D);
    std::copy(p.wg_bits.begin(), p.wg_bits.end(), w.begin() + (pad + n) * D);
    Dev<float> x(xs), kc(size_t(B) * n), zc(size_t(B) * n);
    Dev<uint16_t> wd(w);
    CompressProjectArgs a;
    a.x = x.p + 4;
    a.ldx = ldx;
    a.n_fresh = B;
    a.wkv = bf16_view(wd.p, 2 * n + pad, D).rows(pad, n);
    a.wgate = bf16_view(wd.p, 2 * n + pad, D).rows(pad + n, n);
    a.kc = kc.p;
    a.zc = zc.p;
    a.step.ratio = 4;
    a.step.overlap = 2;
    a.step.dim = 512;
    a.step.ring_disjoint = true;
    int sms = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    EXPECT_TRUE(cuda::compress_proj_supported(a, sms));
    const int64_t launches0 = cuda::compress_proj_launches();
    gpu()->compress_project(a);
    gpu()->synchronize();
    EXPECT_EQ(cuda::compress_proj_launches() - launches0, 1);
    EXPECT_LE(rel_err(kc.host(), host_product(p, p.wkv)), kTol);
    EXPECT_LE(rel_err(zc.host(), host_product(p, p.wg)), kTol);
  }
}

// Host-only: the plans of V4-Flash's compressors on 132 SMs fill one wave of 128 CTAs in
// clusters of 8 with room for two CTAs per SM; unsupported shapes get no plan.
TEST(CompressProjPlan, ModelShapes) {
  const cuda::CompressProjPlan csa = cuda::plan_compress_proj(1024, 4096, 132);
  EXPECT_EQ(csa.ks, 8);
  EXPECT_EQ(csa.rows, 128);
  EXPECT_EQ(csa.tiles * csa.ks, 128);
  const cuda::CompressProjPlan hca = cuda::plan_compress_proj(512, 4096, 132);
  EXPECT_EQ(hca.rows, 64);
  EXPECT_EQ(hca.tiles * hca.ks, 128);
  const cuda::CompressProjPlan idx = cuda::plan_compress_proj(256, 4096, 132);
  EXPECT_EQ(idx.rows, 32);
  EXPECT_EQ(idx.tiles * idx.ks, 128);
  for (const auto& p : {csa, hca, idx}) {
    EXPECT_EQ(p.kslice, 512);
    EXPECT_LE(p.smem, size_t(113 * 1024));  // two CTAs per SM
  }
  EXPECT_EQ(cuda::plan_compress_proj(100, 4096, 132).ks, 0);   // n % 32 != 0
  EXPECT_EQ(cuda::plan_compress_proj(1024, 4100, 132).ks, 0);  // D % 64 != 0
  // V4-Pro's D = 7168: a plan exists (more than one wave).
  EXPECT_GT(cuda::plan_compress_proj(1024, 7168, 132).ks, 0);
}

}  // namespace
}  // namespace v4::ops
