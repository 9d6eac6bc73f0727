// fp8 KV cache pools (--kv-cache-dtype fp8: e4m3 nope + per-64 f32 scales + bf16 rope rows,
// KvFp8Layout) on the CUDA backend, against the CPU backend (the reference quantizer,
// base/kv_fp8.h) on the same inputs (device outputs poisoned first):
//  - store_rows_kv: the device rows equal the CPU's byte for byte (every byte of the pool,
//    padding included) on random rows and on rows of zeros, huge (1e30), tiny (< 2^-64 and f32
//    subnormal) values, NaN / ±Inf, −0, several layouts (V4 512/64, the fixtures' 32/8, nope not
//    a multiple of 16 or 64);
//  - compress_fused into an fp8 pool, both CudaOps routes (FlashCompressor's fused fp8 store,
//    default; the composition pool/norm/rope + the fp8 store with V4_COMPRESS_FP8_FUSED=0): each
//    row within one e4m3 step of the CPU op's row (the f32 values before quantization may differ
//    in the last bits: summation order), ≥ 90% of the bytes identical, rings exact; the fused
//    store's bytes equal the CPU quantizer run on the same kernel's f32 rows, every plan;
//  - sparse_attention over fp8 pools vs the CPU op on the same bytes: the decode kernel
//    (KeyPool<KvFp8Row>: bf16 mma over the dequantized rows, tolerance 1e-2 as for f32 / bf16
//    pools), the split kernel (fp32: 1e-5; vec4 and scalar loads), CudaOps in fp32 mode (split;
//    generic kernel for hd 576), in bf16 mode with many and few rows (decode kernel at any row
//    count, as for bf16 pools) and with rope_dim ≠ 64 (the decode kernel refuses it: split);
//  - fp8 indexer keys (KvDtype::kFp8Index, 144-byte V4 rows): store_rows_kv bytes equal the
//    CPU's; compress_fused into an indexer pool within one e4m3 step of the CPU op; decode /
//    WMMA indexer scores vs a double reference on the same bytes (2e-4); indexer_topk equal to
//    the CPU op's on well-separated scores (decode, WMMA and fp32 score kernels);
//  - a model decode on the fixtures (bf16 precision): fp8 vs f32 pools within 1.25 of max
//    |logit| (the same procedure on the CPU: ≤ 0.931 with fp8 indexer keys and q, session 11;
//    0.972 before q was quantized), greedy agreement with the transformers oracle ≥ 80% of
//    positions (CPU, same procedure: ≥ 86.9%; 87.3% before), every logit
//    finite, and not bit-identical to the f32-pool run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "../model/compressor_cases.h"
#include "../model/model_test_util.h"
#include "base/dtype.h"
#include "base/kv_fp8.h"
#include "cuda_test_util.h"
#include "model/deepseek_v4.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/attention_dec.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/indexer.h"
#include "ops/ops.h"

namespace v4::ops {
namespace {

using cuda::testing::Dev;
using cuda::testing::rand_int;
using cuda::testing::randn;
using v4::testing::random_decode_positions;

std::unique_ptr<Ops> cuda_ops(Precision p) {
  CudaOptions o;
  o.precision = p;
  auto r = make_cuda_ops(o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

/// Quantized rows of x [rows, dim] (host reference).
std::vector<uint8_t> quantize_rows(const std::vector<float>& x, int dim, int rope) {
  const KvFp8Layout L = kv_fp8_layout(dim, rope);
  const size_t rows = x.size() / size_t(dim);
  std::vector<uint8_t> q(rows * size_t(L.bytes));
  for (size_t r = 0; r < rows; ++r) kvfp8::quantize_row(&x[r * dim], L, &q[r * L.bytes]);
  return q;
}

/// max |a − b| / max |b| (NaN in a → infinity).
double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return INFINITY;
    num = std::max(num, std::fabs(double(a[i]) - b[i]));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return num / den;
}

/// Sets an environment variable for a scope (the backends read their switches at every call).
/// Absolute tolerance of a stored rope channel (bf16, channels [nope, d) of a dequantized row y):
/// the device and the CPU rotate the same normalised pair in f32 with differently ordered
/// arithmetic, so a small output of the rotation (a·cos − b·sin cancelling) can differ by a few
/// f32 ulps of the pair's magnitude, and not only by one bf16 step of itself. Bound: 2^-18 of the
/// largest rope value of the row (≈ 32 ulps at that magnitude).
double rope_abs_tol(const float* y, int nope, int d) {
  double m = 0;
  for (int c = nope; c < d; ++c) m = std::max(m, std::fabs(double(y[c])));
  return m * 0x1p-18 + 1e-30;
}

struct EnvVar {
  const char* name;
  EnvVar(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~EnvVar() { unsetenv(name); }
  EnvVar(const EnvVar&) = delete;
  EnvVar& operator=(const EnvVar&) = delete;
};

TEST(CudaKvFp8, StoreRowsKvBytesEqualCpu) {
  V4_REQUIRE_GPU();
  auto g = cuda_ops(Precision::kFp32);
  ASSERT_TRUE(g);
  EXPECT_TRUE(g->supports_kv_dtype(KvDtype::kFp8));
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  struct Shape { int width, rope; };
  for (Shape s : {Shape{512, 64}, Shape{32, 8}, Shape{200, 8}, Shape{100, 10}, Shape{64, 0}}) {
    SCOPED_TRACE(::testing::Message() << "width " << s.width << " rope " << s.rope);
    const KvFp8Layout L = kv_fp8_layout(s.width, s.rope);
    const int64_t n = 45, pool_rows = 50, w = s.width;
    auto src = randn(size_t(n * w), 2.f);
    auto row = [&](int64_t i) { return &src[size_t(i * w)]; };
    for (int64_t c = 0; c < w; ++c) {
      row(0)[c] = 0.f;                                  // all zeros
      row(1)[c] *= 1e30f;                               // huge
      row(2)[c] *= 1e-25f;                              // amax < 2^-64: a zero block
      row(3)[c] = c % 3 == 0 ? 1e-40f : row(3)[c] * 1e-3f;  // f32 subnormals among small values
      row(4)[c] = c % 2 ? -0.f : 0.f;                   // signed zeros
    }
    row(5)[0] = nan;
    row(5)[1] = inf;
    row(5)[w - 1] = -inf;  // rope (or nope when rope = 0)
    row(6)[w / 2] = 448.f * 16;
    row(7)[0] = 3e38f;
    row(7)[1] = -3e38f;
    // ties in the quantized domain: x / scale lands on e4m3 midpoints for scale 1 (amax 448)
    row(8)[0] = 448.f;
    if (w > 4) {
      row(8)[1] = 1.f + 1.f / 16;  // between 1 and 1.125: tie → even (1)
      row(8)[2] = 3 * 0x1p-10f;    // subnormal tie → even (2·2^-9)
      row(8)[3] = 0x1p-10f;        // subnormal tie → 0
    }
    std::vector<int32_t> rows(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) rows[size_t(i)] = i % 7 == 6 ? -1 : int32_t((i * 7) % pool_rows);
    std::vector<uint8_t> cpu(size_t(pool_rows * L.bytes), 0xAB);
    make_cpu_ops()->store_rows_kv(cpu.data(), KvDtype::kFp8, rows.data(), n, w, src.data(), s.rope);
    Dev<float> dsrc(src);
    Dev<int32_t> drows(rows);
    Dev<uint8_t> dpool(std::vector<uint8_t>(cpu.size(), 0xAB));
    g->store_rows_kv(dpool.p, KvDtype::kFp8, drows.p, n, w, dsrc.p, s.rope);
    g->synchronize();
    const auto got = dpool.host();
    size_t first = got.size();
    for (size_t i = 0; i < got.size() && first == got.size(); ++i)
      if (got[i] != cpu[i]) first = i;
    EXPECT_EQ(first, got.size()) << "first differing byte " << first << " (row "
                                 << first / size_t(L.bytes) << ", offset "
                                 << first % size_t(L.bytes) << "): device "
                                 << int(got[first < got.size() ? first : 0]) << " cpu "
                                 << int(cpu[first < got.size() ? first : 0]);
  }
}

TEST(CudaKvFp8, CompressFusedFp8PoolWithinOneStepOfCpu) {
  V4_REQUIRE_GPU();
  auto g = cuda_ops(Precision::kFp32);
  ASSERT_TRUE(g);
  auto cpu = make_cpu_ops();
  struct Shape { int m, c, d, rd; };
  // Both CudaOps routes: FlashCompressor's fused fp8 store (default) and the composition
  // (V4_COMPRESS_FP8_FUSED=0).
  for (const char* fused : {"1", "0"})
  for (Shape s : {Shape{4, 2, 512, 64}, Shape{128, 1, 512, 64}, Shape{4, 2, 32, 8}}) {
    EnvVar env("V4_COMPRESS_FP8_FUSED", fused);
    SCOPED_TRACE(::testing::Message() << "m=" << s.m << " c=" << s.c << " d=" << s.d
                                      << " V4_COMPRESS_FP8_FUSED=" << fused);
    const KvFp8Layout L = kv_fp8_layout(s.d, s.rd);
    auto k = v4::testing::prefill_case(s.m, s.c, s.d, s.rd, {{0, 3, 3 * s.m + 2}, {1, 0, s.m + 1}},
                                       uint64_t(rand_int(1, 1 << 30)));
    ASSERT_GT(k.n_out(), 0);
    const size_t scratch_n = size_t(std::max<int64_t>(k.n_out() * s.d, k.n_ring() * s.c * s.d));
    auto ring_kv = k.ring_kv, ring_gate = k.ring_gate;
    std::vector<uint8_t> pool_cpu(size_t(k.pool_rows * L.bytes), 0);
    std::vector<float> scratch(scratch_n);
    auto ac = v4::testing::host_args(k, nullptr, ring_kv.data(), ring_gate.data(), scratch.data(),
                                     1e-6f, 1.f);
    ac.pool = pool_cpu.data();
    ac.pool_dtype = KvDtype::kFp8;
    cpu->compress_fused(ac);
    Dev<float> kc(k.kc), zc(k.zc), rkv(k.ring_kv), rg(k.ring_gate), bias(k.bias), norm(k.norm),
        invf(k.inv_freq), dscratch(scratch_n);
    Dev<int32_t> src(k.src), dst(k.dst), rsrc(k.ring_src), rdst(k.ring_dst);
    Dev<int64_t> pos(k.positions);
    Dev<uint8_t> dpool(std::vector<uint8_t>(pool_cpu.size(), 0));
    CompressFusedArgs a = ac;
    a.fresh_kv = kc.p;
    a.fresh_gate = zc.p;
    a.state_kv = rkv.p;
    a.state_gate = rg.p;
    a.bias = bias.p;
    a.norm = norm.p;
    a.src = src.p;
    a.positions = pos.p;
    a.dst = dst.p;
    a.ring_src = rsrc.p;
    a.ring_dst = rdst.p;
    a.inv_freq = invf.p;
    a.pool = dpool.p;
    a.scratch = dscratch.p;
    g->compress_fused(a);
    g->synchronize();
    const auto got = dpool.host();
    int64_t same = 0;
    for (size_t i = 0; i < got.size(); ++i) same += got[i] == pool_cpu[i];
    EXPECT_GE(double(same), 0.9 * double(got.size()));
    std::vector<float> yg(static_cast<size_t>(s.d)), yc(static_cast<size_t>(s.d));
    for (int64_t r = 0; r < k.pool_rows; ++r) {
      kvfp8::dequantize_row(&got[size_t(r * L.bytes)], L, yg.data());
      kvfp8::dequantize_row(&pool_cpu[size_t(r * L.bytes)], L, yc.data());
      const double rope_abs = rope_abs_tol(yc.data(), L.nope, s.d);
      for (int c = 0; c < s.d; ++c) {
        float scale = 0;
        if (c < L.nope) std::memcpy(&scale, &pool_cpu[size_t(r * L.bytes + L.scale_off + 4 * (c / 64))], 4);
        // one e4m3 step (2^-3 relative; subnormal step scale·2^-9) plus a scale change of a few
        // ulps; rope values: one bf16 step plus the f32 rounding of the rotation (rope_abs_tol)
        const double tol = c < L.nope ? std::fabs(yc[size_t(c)]) * 0x1p-3 + scale * 0x1p-9 * 1.01 + 1e-30
                                      : std::fabs(yc[size_t(c)]) * 0x1p-7 + rope_abs;
        ASSERT_LE(std::fabs(double(yg[size_t(c)]) - yc[size_t(c)]), tol * 1.001)
            << "row " << r << " channel " << c;
      }
    }
    EXPECT_EQ(rkv.host(), ring_kv);
    EXPECT_EQ(rg.host(), ring_gate);
  }
}

/// One compressor step on the device through CudaOps::compress_fused: pool (pool_dtype, every
/// byte poisoned first: f32 NaN / fp8 0xAB) and the ring after it.
struct Fp8StepOut {
  std::vector<uint8_t> pool;
  std::vector<float> rkv, rg;
};
/// `off`: the pool starts `off` bytes into its allocation (4: not 16-byte aligned, so the kernel
/// takes its scalar path for every dtype; the returned pool excludes those bytes).
Fp8StepOut run_step_device(Ops* g, const v4::testing::CompressCase& k, KvDtype dt, bool one,
                           bool graph, int off = 0) {
  const int64_t row_bytes = kv_row_bytes(dt, k.d, k.rd);
  Dev<float> kc(k.kc), zc(k.zc), rkv(k.ring_kv), rg(k.ring_gate), bias(k.bias), norm(k.norm),
      invf(k.inv_freq),
      scratch(size_t(std::max<int64_t>(k.n_out() * k.d, k.n_ring() * k.width())));
  Dev<int32_t> src(k.src), dst(k.dst), rsrc(k.ring_src), rdst(k.ring_dst);
  Dev<int64_t> pos(k.positions);
  Dev<uint8_t> pool(std::vector<uint8_t>(size_t(k.pool_rows * row_bytes + off),
                                         dt == KvDtype::kF32 ? 0xff : 0xAB));
  CompressFusedArgs a;
  a.fresh_kv = kc.p;
  a.fresh_gate = zc.p;
  a.state_kv = rkv.p;
  a.state_gate = rg.p;
  a.bias = bias.p;
  a.norm = norm.p;
  a.eps = 1e-6f;
  a.src = src.p;
  a.positions = pos.p;
  a.dst = dst.p;
  a.n_out = k.n_out();
  a.ring_src = rsrc.p;
  a.ring_dst = rdst.p;
  a.n_ring = k.n_ring();
  a.ratio = k.m;
  a.overlap = k.c;
  a.dim = k.d;
  a.rope_dim = k.rd;
  a.inv_freq = invf.p;
  a.attention_scaling = 1.f;
  a.pool = pool.p + off;
  a.pool_dtype = dt;
  a.scratch = scratch.p;
  a.ring_disjoint = one;
  if (graph) {
    std::unique_ptr<Graph> gr = g->capture([&] { g->compress_fused(a); });
    EXPECT_NE(gr, nullptr);
    if (gr) gr->replay();
  } else {
    g->compress_fused(a);
  }
  g->synchronize();
  std::vector<uint8_t> bytes = pool.host();
  bytes.erase(bytes.begin(), bytes.begin() + off);
  return Fp8StepOut{std::move(bytes), rkv.host(), rg.host()};
}

// FlashCompressor's fused fp8 store (default route of CudaOps::compress_fused for fp8 pools):
// every byte of the fp8 pool equals the CPU quantizer (kvfp8::quantize_row, base/kv_fp8.h) run
// on the f32 rows the same kernel writes into an f32 pool for the same inputs (same plan, same
// f32 arithmetic: only the final store differs), rows it must not write keep their poison bytes,
// and the rings equal the CPU op's. Plans covered (V4_COMPRESS_WIDE = 0 base / 1 wide): C4 d512
// (1 CTA a row; wide 4 × 128 channels), C128 d512 (clusters of 8 × 64 channels), the indexer
// shape C4 d128 (the model stores indexer keys as kFp8Index rows: kernel coverage only, see
// CompressFusedIndexBytesEqualCpuQuantizer; wide 2 × 64), C128 d192
// rope 32 (wide: 6 CTAs × 32 channels, so the 64-channel blocks straddle two CTAs: the amax
// exchange over distributed shared memory; base 3 × 64), d 100 rope 10 (vector path, a float4
// group with nope and rope channels, nope 90: a short last block), d 130 / 37 (scalar path),
// rope 0 and the fixtures' 32 / 8. Cases: decode B = 1 and 64 (one launch; B = 64 also under
// graph capture), a prefill with the ring hazard (chunks longer than the ring: ring wrap, two
// launches) and prefill chunks from 0 / on window edges (one and two launches). The fp8 rows
// also stay within one e4m3 step of the CPU op's rows (its f32 values differ by a few ulps).
TEST(CudaKvFp8, CompressFusedFp8BytesEqualCpuQuantizer) {
  V4_REQUIRE_GPU();
  auto g = cuda_ops(Precision::kFp32);
  ASSERT_TRUE(g);
  auto cpu = make_cpu_ops();
  EnvVar fused("V4_COMPRESS_FP8_FUSED", "1");
  struct Shape { int m, c, d, rd; };
  int64_t rows_checked = 0;
  for (Shape s : {Shape{4, 2, 512, 64}, Shape{128, 1, 512, 64}, Shape{4, 2, 128, 64},
                  Shape{128, 1, 192, 32}, Shape{4, 2, 100, 10}, Shape{128, 1, 130, 6},
                  Shape{3, 2, 37, 8}, Shape{4, 2, 64, 0}, Shape{4, 2, 32, 8}}) {
    const KvFp8Layout L = kv_fp8_layout(s.d, s.rd);
    const uint64_t seed = uint64_t(rand_int(1, 1 << 30));
    auto cases = v4::testing::standard_cases(s.m, s.c, s.d, s.rd, seed, 0);
    for (auto& [name, k] : cases) {
      ASSERT_GT(k.n_out(), 0);
      // CPU op (the reference composition) into an fp8 pool: rings and the one-step bound.
      std::vector<uint8_t> pool_cpu(size_t(k.pool_rows * L.bytes), 0xAB);
      std::vector<float> cpu_rkv = k.ring_kv, cpu_rg = k.ring_gate;
      std::vector<float> scratch(size_t(std::max<int64_t>(k.n_out() * s.d, k.n_ring() * k.width())));
      auto ac = v4::testing::host_args(k, nullptr, cpu_rkv.data(), cpu_rg.data(), scratch.data(),
                                       1e-6f, 1.f);
      ac.pool = pool_cpu.data();
      ac.pool_dtype = KvDtype::kFp8;
      cpu->compress_fused(ac);
      const bool disjoint = compress_ring_disjoint(k.src.data(), int64_t(k.src.size()),
                                                   k.ring_dst.data(), k.n_ring());
      // threads: V4_COMPRESS_THREADS=128 with V4_COMPRESS_MORE_REGS=1 (the base plan in the
      // 128-thread CTAs and ≤ 85-register instance of C128 prefill chunks)
      for (const char* wide : {"0", "1", "threads"})
        for (bool one : {false, true})
          for (int variant = 0; variant < 3; ++variant) {
            // 0 plain, 1 under graph capture (decode B=64), 2 pool 4 bytes off a 16-byte
            // boundary (scalar path; C4 d512, decode B=64 and the ring-hazard prefill)
            const bool graph = variant == 1, shifted = variant == 2;
            if (one && !disjoint) continue;
            if (graph && std::strcmp(name, "decode B=64") != 0) continue;
            if (shifted && !(s.m == 4 && s.d == 512 && (std::strcmp(name, "decode B=64") == 0 ||
                                                         std::strcmp(name, "prefill ring hazard") == 0)))
              continue;
            SCOPED_TRACE(::testing::Message()
                         << "m=" << s.m << " c=" << s.c << " d=" << s.d << " rd=" << s.rd << " "
                         << name << (one ? ", one launch" : ", two launches")
                         << ", V4_COMPRESS_WIDE=" << wide << (graph ? ", graph" : "")
                         << (shifted ? ", pool at +4 bytes (scalar path)" : ""));
            const bool th = std::strcmp(wide, "threads") == 0;
            EnvVar w("V4_COMPRESS_WIDE", th ? "0" : wide);
            EnvVar tv("V4_COMPRESS_THREADS", th ? "128" : "0");
            EnvVar mr("V4_COMPRESS_MORE_REGS", th ? "1" : "");
            const int off = shifted ? 4 : 0;
            const Fp8StepOut f32 = run_step_device(g.get(), k, KvDtype::kF32, one, graph, off);
            const Fp8StepOut fp8 = run_step_device(g.get(), k, KvDtype::kFp8, one, graph, off);
            // Expected bytes: the poisoned pool with every written row quantized on the host
            // from the device's f32 row.
            std::vector<uint8_t> want(fp8.pool.size(), 0xAB);
            for (int32_t r : k.dst) {
              if (r < 0) continue;
              std::vector<float> row(static_cast<size_t>(s.d));
              std::memcpy(row.data(), &f32.pool[size_t(r) * size_t(s.d) * 4], size_t(s.d) * 4);
              for (float v : row) ASSERT_FALSE(std::isnan(v)) << "f32 row " << r << " not written";
              kvfp8::quantize_row(row.data(), L, &want[size_t(r) * size_t(L.bytes)]);
              ++rows_checked;
            }
            size_t first = want.size(), n_diff = 0;
            for (size_t i = 0; i < want.size(); ++i)
              if (fp8.pool[i] != want[i]) {
                if (first == want.size()) first = i;
                ++n_diff;
              }
            const size_t fi = first < want.size() ? first : 0;
            EXPECT_EQ(first, want.size())
                << n_diff << " bytes differ; first " << first << " (row " << first / size_t(L.bytes)
                << ", offset " << first % size_t(L.bytes) << "): device " << int(fp8.pool[fi])
                << " want " << int(want[fi]);
            EXPECT_TRUE(fp8.rkv == cpu_rkv);
            EXPECT_TRUE(fp8.rg == cpu_rg);
            EXPECT_TRUE(f32.rkv == cpu_rkv);
            // Within one e4m3 step of the CPU op's row (as CompressFusedFp8PoolWithinOneStepOfCpu).
            std::vector<float> yg(static_cast<size_t>(s.d)), yc(static_cast<size_t>(s.d));
            for (int32_t r : k.dst) {
              if (r < 0) continue;
              kvfp8::dequantize_row(&fp8.pool[size_t(r) * size_t(L.bytes)], L, yg.data());
              kvfp8::dequantize_row(&pool_cpu[size_t(r) * size_t(L.bytes)], L, yc.data());
              const double rope_abs = rope_abs_tol(yc.data(), L.nope, s.d);
              for (int c = 0; c < s.d; ++c) {
                float scale = 0;
                if (c < L.nope)
                  std::memcpy(&scale, &pool_cpu[size_t(r) * size_t(L.bytes) + size_t(L.scale_off + 4 * (c / 64))], 4);
                const double tol = c < L.nope ? std::fabs(yc[size_t(c)]) * 0x1p-3 + scale * 0x1p-9 * 1.01 + 1e-30
                                              : std::fabs(yc[size_t(c)]) * 0x1p-7 + rope_abs;
                ASSERT_LE(std::fabs(double(yg[size_t(c)]) - yc[size_t(c)]), tol * 1.001)
                    << "row " << r << " channel " << c;
              }
            }
          }
    }
  }
  std::printf("[kv fp8] fused compressor: %lld rows byte-compared\n", (long long)rows_checked);
}

/// Random attention over fp8 pools: host bytes, the CPU result on them, device copies.
struct Fp8Attn {
  int64_t S;
  int H, hd, rope;
  std::vector<float> q, sinks, out_cpu;
  std::vector<uint8_t> swa, comp;
  std::vector<int32_t> swa_r, comp_r, swa_c, comp_c;
  std::vector<int64_t> swa_o, comp_o;
  int64_t max_keys = 0;
  Fp8Attn(int64_t S_, int H_, int hd_, int rope_, int n_comp_max)
      : S(S_), H(H_), hd(hd_), rope(rope_) {
    const int swa_rows = 300, comp_rows = 3000;
    q = randn(size_t(S * H * hd), 0.3f);
    sinks = randn(size_t(H));
    swa = quantize_rows(randn(size_t(swa_rows) * hd, 0.3f), hd, rope);
    comp = quantize_rows(randn(size_t(comp_rows) * hd, 0.3f), hd, rope);
    for (int64_t t = 0; t < S; ++t) {
      const int n_swa = rand_int(1, 128), n_comp = rand_int(0, n_comp_max);
      max_keys = std::max<int64_t>(max_keys, n_swa + n_comp);
      swa_o.push_back(int64_t(swa_r.size()));
      swa_c.push_back(n_swa);
      for (int j = 0; j < n_swa; ++j) swa_r.push_back(j == 1 ? -1 : rand_int(0, swa_rows - 1));
      comp_o.push_back(int64_t(comp_r.size()));
      comp_c.push_back(n_comp);
      for (int j = 0; j < n_comp; ++j) comp_r.push_back(j % 29 == 4 ? -1 : rand_int(0, comp_rows - 1));
    }
    swa_r.push_back(0);
    comp_r.push_back(0);
    AttentionArgs a = base();
    a.q = q.data();
    a.sinks = sinks.data();
    a.swa_pool = swa.data();
    a.comp_pool = comp.data();
    a.swa = {swa_r.data(), swa_o.data(), swa_c.data()};
    a.comp = {comp_r.data(), comp_o.data(), comp_c.data()};
    out_cpu.assign(size_t(S * H * hd), NAN);
    a.out = out_cpu.data();
    make_cpu_ops()->sparse_attention(a);
  }
  AttentionArgs base() const {
    AttentionArgs a;
    a.n_rows = S;
    a.n_heads = H;
    a.head_dim = hd;
    a.scale = 1.f / std::sqrt(float(hd));
    a.max_keys = max_keys;
    a.kv_dtype = KvDtype::kFp8;
    a.rope_dim = rope;
    return a;
  }
};

struct DevAttn {
  Dev<float> q, sinks, out;
  Dev<uint8_t> swa, comp;
  Dev<int32_t> swa_r, swa_c, comp_r, comp_c;
  Dev<int64_t> swa_o, comp_o;
  AttentionArgs a;
  explicit DevAttn(const Fp8Attn& c)
      : q(c.q), sinks(c.sinks), out(c.out_cpu.size()), swa(c.swa), comp(c.comp), swa_r(c.swa_r),
        swa_c(c.swa_c), comp_r(c.comp_r), comp_c(c.comp_c), swa_o(c.swa_o), comp_o(c.comp_o) {
    a = c.base();
    a.q = q.p;
    a.sinks = sinks.p;
    a.swa_pool = swa.p;
    a.comp_pool = comp.p;
    a.swa = {swa_r.p, swa_o.p, swa_c.p};
    a.comp = {comp_r.p, comp_o.p, comp_c.p};
    a.out = out.p;
  }
};

TEST(CudaKvFp8, AttentionFp8PoolsMatchCpu) {
  V4_REQUIRE_GPU();
  // Decode kernel (hd 512 = 448 + 64, 64 heads): direct, 1 and 5 splits.
  {
    Fp8Attn c(3, 64, 512, 64, 700);
    DevAttn d(c);
    ASSERT_TRUE(cuda::attention_dec_supported(64, 512));
    for (int splits : {1, 5}) {
      Dev<float> ws(size_t(cuda::attention_workspace_floats(c.S, c.H, c.hd, splits)));
      d.out.poison();
      ASSERT_TRUE(cuda::sparse_attention_dec(d.a, splits, splits > 1 ? ws.p : nullptr, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const double e = max_rel(d.out.host(), c.out_cpu);
      std::printf("[kv fp8] attention_dec splits %d rel err %.2e\n", splits, e);
      EXPECT_LE(e, 1e-2) << "splits " << splits;
    }
    Status st = cuda::sparse_attention_mma(d.a, 1, nullptr, nullptr);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << st.to_string();
    AttentionArgs bad = d.a;
    bad.rope_dim = 32;
    st = cuda::sparse_attention_dec(bad, 1, nullptr, nullptr);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << st.to_string();
  }
  // Split kernel (fp32 math): vec4 loads (hd 512/64, 128/64, 32/8) and scalar loads (66/2).
  struct Sp { int hd, rope; };
  for (Sp sp : {Sp{512, 64}, Sp{128, 64}, Sp{32, 8}, Sp{66, 2}}) {
    Fp8Attn c(4, 16, sp.hd, sp.rope, 300);
    DevAttn d(c);
    for (int splits : {1, 4}) {
      Dev<float> ws(size_t(cuda::attention_workspace_floats(c.S, c.H, c.hd, splits)));
      d.out.poison();
      ASSERT_TRUE(cuda::sparse_attention_split(d.a, splits, splits > 1 ? ws.p : nullptr, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const double e = max_rel(d.out.host(), c.out_cpu);
      EXPECT_LE(e, 1e-5) << "hd " << sp.hd << " splits " << splits;
    }
  }
  // Through CudaOps: fp32 mode (split; generic kernel for hd 576), bf16 mode with many and few
  // rows (decode kernel), and rope 32 at hd 512 (decode kernel refuses: split kernel, fp32).
  struct Via { Precision p; int64_t S; int H, hd, rope; double tol; };
  for (Via v : {Via{Precision::kFp32, 3, 64, 512, 64, 1e-5}, Via{Precision::kFp32, 2, 8, 576, 64, 1e-5},
                Via{Precision::kBf16, 300, 64, 512, 64, 1e-2}, Via{Precision::kBf16, 2, 64, 512, 64, 1e-2},
                Via{Precision::kBf16, 2, 64, 512, 32, 1e-5}}) {
    SCOPED_TRACE(::testing::Message() << "S=" << v.S << " hd=" << v.hd << " rope=" << v.rope
                                      << " bf16 mode " << (v.p == Precision::kBf16));
    auto g = cuda_ops(v.p);
    ASSERT_TRUE(g);
    Fp8Attn c(v.S, v.H, v.hd, v.rope, 200);
    DevAttn d(c);
    d.out.poison();
    g->sparse_attention(d.a);
    g->synchronize();
    EXPECT_LE(max_rel(d.out.host(), c.out_cpu), v.tol);
  }
}


// ---- fp8 indexer keys (KvDtype::kFp8Index: n e4m3 codes + one f32 scale per row) -------------

/// Quantized indexer-key rows of x [rows, n] (host reference, kvfp8::quantize_index_row).
std::vector<uint8_t> quantize_index_rows(const std::vector<float>& x, int n) {
  const KvFp8IndexLayout L = kv_fp8_index_layout(n);
  const size_t rows = x.size() / size_t(n);
  std::vector<uint8_t> q(rows * size_t(L.bytes));
  for (size_t r = 0; r < rows; ++r) kvfp8::quantize_index_row(&x[r * n], L, &q[r * L.bytes]);
  return q;
}

// store_rows_kv(kFp8Index): every byte of the device pool equals the CPU's (random rows with
// per-row magnitudes, zeros, huge, tiny, subnormals, NaN / ±Inf, signed zeros, e4m3 ties; rows
// at odd indices; padding zero; skipped rows keep their poison).
TEST(CudaKvFp8, IndexStoreRowsBytesEqualCpu) {
  V4_REQUIRE_GPU();
  auto g = cuda_ops(Precision::kFp32);
  ASSERT_TRUE(g);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  for (int w : {128, 16, 64, 192}) {
    SCOPED_TRACE(::testing::Message() << "width " << w);
    const KvFp8IndexLayout L = kv_fp8_index_layout(w);
    const int64_t n = 45, pool_rows = 50;
    auto src = randn(size_t(n * w), 2.f);
    auto row = [&](int64_t i) { return &src[size_t(i * w)]; };
    for (int64_t c = 0; c < w; ++c) {
      row(0)[c] = 0.f;
      row(1)[c] *= 1e30f;
      row(2)[c] *= 1e-25f;
      row(3)[c] = c % 3 == 0 ? 1e-40f : row(3)[c] * 1e-3f;
      row(4)[c] = c % 2 ? -0.f : 0.f;
    }
    for (int64_t i = 9; i < n; ++i)
      for (int64_t c = 0; c < w; ++c) row(i)[c] *= float(1 + i % 5) * 0.37f;
    row(5)[0] = nan;
    row(5)[1] = inf;
    row(5)[w - 1] = -inf;
    row(6)[w / 2] = 448.f * 16;
    row(7)[0] = 3e38f;
    row(7)[1] = -3e38f;
    row(8)[0] = 448.f;
    row(8)[1] = 1.f + 1.f / 16;
    row(8)[2] = 3 * 0x1p-10f;
    row(8)[3] = 0x1p-10f;
    std::vector<int32_t> rows(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) rows[size_t(i)] = i % 7 == 6 ? -1 : int32_t((i * 7) % pool_rows);
    std::vector<uint8_t> cpu(size_t(pool_rows * L.bytes), 0xAB);
    make_cpu_ops()->store_rows_kv(cpu.data(), KvDtype::kFp8Index, rows.data(), n, w, src.data(), 0);
    Dev<float> dsrc(src);
    Dev<int32_t> drows(rows);
    Dev<uint8_t> dpool(std::vector<uint8_t>(cpu.size(), 0xAB));
    g->store_rows_kv(dpool.p, KvDtype::kFp8Index, drows.p, n, w, dsrc.p, 0);
    g->synchronize();
    const auto got = dpool.host();
    size_t first = got.size();
    for (size_t i = 0; i < got.size() && first == got.size(); ++i)
      if (got[i] != cpu[i]) first = i;
    const size_t fi = first < got.size() ? first : 0;
    EXPECT_EQ(first, got.size()) << "first differing byte " << first << " (row "
                                 << first / size_t(L.bytes) << ", offset "
                                 << first % size_t(L.bytes) << "): device " << int(got[fi])
                                 << " cpu " << int(cpu[fi]);
  }
}

// compress_fused into an fp8 indexer pool, both CudaOps routes (FlashCompressor's fused store,
// default; the composition with V4_COMPRESS_FP8_FUSED=0): indexer shape C4 d128 rope 64, decode
// B = 64 and a prefill: each value within one e4m3 step of the CPU op's row (the f32 rows before
// quantization differ in the last bits), ≥ 90% of the bytes identical, scales within 1e-5
// relative, rings exact; also under graph capture.
TEST(CudaKvFp8, CompressFusedIndexPoolWithinOneStepOfCpu) {
  V4_REQUIRE_GPU();
  auto g = cuda_ops(Precision::kBf16);
  ASSERT_TRUE(g);
  auto cpu = make_cpu_ops();
  const int m = 4, c = 2, d = 128, rd = 64;
  const KvFp8IndexLayout L = kv_fp8_index_layout(d);
  const uint64_t seed = uint64_t(rand_int(1, 1 << 30));
  std::vector<std::pair<const char*, v4::testing::CompressCase>> cases;
  cases.emplace_back("decode B=64", v4::testing::decode_case(m, c, d, rd,
                                                             random_decode_positions(64, m, seed), seed));
  cases.emplace_back("prefill", v4::testing::prefill_case(m, c, d, rd,
                                                          {{0, 3, 3 * m + 2}, {1, 0, 5 * m + 1}},
                                                          seed + 1));
  for (const char* fused : {"1", "0"})
  for (auto& [name, k] : cases)
    for (bool graph : {false, true}) {
      EnvVar env("V4_COMPRESS_FP8_FUSED", fused);
      SCOPED_TRACE(::testing::Message() << name << (graph ? ", graph" : "")
                                        << ", V4_COMPRESS_FP8_FUSED=" << fused);
      ASSERT_GT(k.n_out(), 0);
      std::vector<uint8_t> pool_cpu(size_t(k.pool_rows * L.bytes), 0xAB);
      std::vector<float> cpu_rkv = k.ring_kv, cpu_rg = k.ring_gate;
      std::vector<float> scratch(size_t(std::max<int64_t>(k.n_out() * d, k.n_ring() * k.width())));
      auto ac = v4::testing::host_args(k, nullptr, cpu_rkv.data(), cpu_rg.data(), scratch.data(),
                                       1e-6f, 1.f);
      ac.pool = pool_cpu.data();
      ac.pool_dtype = KvDtype::kFp8Index;
      cpu->compress_fused(ac);
      const Fp8StepOut dev = run_step_device(g.get(), k, KvDtype::kFp8Index, false, graph);
      ASSERT_EQ(dev.pool.size(), pool_cpu.size());
      int64_t same = 0, written = 0;
      for (size_t i = 0; i < dev.pool.size(); ++i) same += dev.pool[i] == pool_cpu[i];
      std::vector<float> yg(static_cast<size_t>(d)), yc(static_cast<size_t>(d));
      for (int32_t r : k.dst) {
        if (r < 0) continue;
        ++written;
        const uint8_t* pg = &dev.pool[size_t(r) * size_t(L.bytes)];
        const uint8_t* pc = &pool_cpu[size_t(r) * size_t(L.bytes)];
        const float sg = kvfp8::index_row_scale(pg, L), sc = kvfp8::index_row_scale(pc, L);
        ASSERT_LE(std::fabs(double(sg) - sc), 1e-5 * sc + 1e-30) << "scale of row " << r;
        kvfp8::dequantize_index_row(pg, L, yg.data());
        kvfp8::dequantize_index_row(pc, L, yc.data());
        for (int ch = 0; ch < d; ++ch) {
          const double tol = std::fabs(yc[size_t(ch)]) * 0x1p-3 + sc * 0x1p-9 * 1.01 + 1e-30;
          ASSERT_LE(std::fabs(double(yg[size_t(ch)]) - yc[size_t(ch)]), tol * 1.001)
              << "row " << r << " channel " << ch;
        }
      }
      EXPECT_GT(written, 0);
      EXPECT_GE(double(same), 0.9 * double(dev.pool.size()));
      EXPECT_TRUE(dev.rkv == cpu_rkv);
      EXPECT_TRUE(dev.rg == cpu_rg);
    }
}

// FlashCompressor's fused fp8 indexer-key store (kFp8Index, the default route): every byte of
// the pool equals kvfp8::quantize_index_row of the f32 row the same kernel writes into an f32
// pool for the same inputs (same plan), unwritten rows keep their poison, rings equal the CPU
// op's. Plans (V4_COMPRESS_WIDE = 0 / 1, and the row-warp kernel with V4_COMPRESS_ROWWARP=1):
// C4 d128 rope 64 (the V4 indexer; wide: 2 CTAs), C4
// d512 rope 64 (clusters: the row amax over distributed shared memory), C128 d192 rope 32 (wide:
// 6 CTAs of 32 channels), the fixtures' C4 d32 rope 8 and d16 rope 8. Cases: decode B = 1 and
// B = 64 (one launch; B = 64 also under graph capture), a prefill with the ring hazard (two
// launches) and prefill chunks on window edges.
TEST(CudaKvFp8, CompressFusedIndexBytesEqualCpuQuantizer) {
  V4_REQUIRE_GPU();
  auto g = cuda_ops(Precision::kFp32);
  ASSERT_TRUE(g);
  auto cpu = make_cpu_ops();
  EnvVar fused("V4_COMPRESS_FP8_FUSED", "1");
  struct Shape { int m, c, d, rd; };
  int64_t rows_checked = 0;
  for (Shape s : {Shape{4, 2, 128, 64}, Shape{4, 2, 512, 64}, Shape{128, 1, 192, 32},
                  Shape{4, 2, 32, 8}, Shape{4, 2, 16, 8}}) {
    const KvFp8IndexLayout L = kv_fp8_index_layout(s.d);
    const uint64_t seed = uint64_t(rand_int(1, 1 << 30));
    auto cases = v4::testing::standard_cases(s.m, s.c, s.d, s.rd, seed, 0);
    for (auto& [name, k] : cases) {
      ASSERT_GT(k.n_out(), 0);
      std::vector<float> cpu_rkv = k.ring_kv, cpu_rg = k.ring_gate;
      {
        std::vector<uint8_t> pool_cpu(size_t(k.pool_rows * L.bytes), 0xAB);
        std::vector<float> scratch(size_t(std::max<int64_t>(k.n_out() * s.d, k.n_ring() * k.width())));
        auto ac = v4::testing::host_args(k, nullptr, cpu_rkv.data(), cpu_rg.data(), scratch.data(),
                                         1e-6f, 1.f);
        ac.pool = pool_cpu.data();
        ac.pool_dtype = KvDtype::kFp8Index;
        cpu->compress_fused(ac);
      }
      const bool disjoint = compress_ring_disjoint(k.src.data(), int64_t(k.src.size()),
                                                   k.ring_dst.data(), k.n_ring());
      // Plans: base, wide, and the row-warp kernel at any row count (V4_COMPRESS_ROWWARP=1;
      // taken for the C4 d128 and d32 shapes, the others keep the base plan).
      for (const char* wide : {"0", "1", "rowwarp", "threads"})
        for (bool one : {false, true})
          for (bool graph : {false, true}) {
            if (one && !disjoint) continue;
            if (graph && std::strcmp(name, "decode B=64") != 0) continue;
            const bool rw = std::strcmp(wide, "rowwarp") == 0;
            const bool th = std::strcmp(wide, "threads") == 0;  // V4_COMPRESS_THREADS=128, base plan
            SCOPED_TRACE(::testing::Message()
                         << "m=" << s.m << " c=" << s.c << " d=" << s.d << " rd=" << s.rd << " "
                         << name << (one ? ", one launch" : ", two launches")
                         << (rw ? ", V4_COMPRESS_ROWWARP=1" : ", V4_COMPRESS_WIDE=") << (rw ? "" : wide)
                         << (graph ? ", graph" : ""));
            EnvVar w("V4_COMPRESS_WIDE", rw || th ? "0" : wide);
            EnvVar r("V4_COMPRESS_ROWWARP", rw ? "1" : "0");
            EnvVar tv("V4_COMPRESS_THREADS", th ? "128" : "0");
            const Fp8StepOut f32 = run_step_device(g.get(), k, KvDtype::kF32, one, graph);
            const Fp8StepOut fp8 = run_step_device(g.get(), k, KvDtype::kFp8Index, one, graph);
            std::vector<uint8_t> want(fp8.pool.size(), 0xAB);
            for (int32_t r : k.dst) {
              if (r < 0) continue;
              std::vector<float> row(static_cast<size_t>(s.d));
              std::memcpy(row.data(), &f32.pool[size_t(r) * size_t(s.d) * 4], size_t(s.d) * 4);
              for (float v : row) ASSERT_FALSE(std::isnan(v)) << "f32 row " << r << " not written";
              kvfp8::quantize_index_row(row.data(), L, &want[size_t(r) * size_t(L.bytes)]);
              ++rows_checked;
            }
            size_t first = want.size(), n_diff = 0;
            for (size_t i = 0; i < want.size(); ++i)
              if (fp8.pool[i] != want[i]) {
                if (first == want.size()) first = i;
                ++n_diff;
              }
            const size_t fi = first < want.size() ? first : 0;
            EXPECT_EQ(first, want.size())
                << n_diff << " bytes differ; first " << first << " (row " << first / size_t(L.bytes)
                << ", offset " << first % size_t(L.bytes) << "): device " << int(fp8.pool[fi])
                << " want " << int(want[fi]);
            EXPECT_TRUE(fp8.rkv == cpu_rkv);
            EXPECT_TRUE(fp8.rg == cpu_rg);
          }
    }
  }
  std::printf("[kv fp8] fused compressor, indexer rows: %lld rows byte-compared\n",
              (long long)rows_checked);
}

/// Random fp8 indexer keys for the score tests: `rows` keys of 128 values with per-row magnitudes
/// (×0.05 … ×20, so the row scale matters), quantized; `deq` = their dequantized values.
struct Fp8Keys {
  std::vector<uint8_t> bytes;
  std::vector<float> deq;
  Fp8Keys(int64_t rows, int dI) {
    auto x = randn(size_t(rows * dI), 1.f);
    for (int64_t r = 0; r < rows; ++r) {
      const float mag = std::pow(20.f, float(r % 9 - 4) / 4.f);
      for (int c = 0; c < dI; ++c) x[size_t(r * dI + c)] *= mag;
    }
    bytes = quantize_index_rows(x, dI);
    const KvFp8IndexLayout L = kv_fp8_index_layout(dI);
    deq.resize(x.size());
    for (int64_t r = 0; r < rows; ++r)
      kvfp8::dequantize_index_row(&bytes[size_t(r * L.bytes)], L, &deq[size_t(r * dI)]);
  }
};

/// Reference score in double of candidate rows `rows[0..n)` for query row t: Σ_h ReLU(q_h · k) ·
/// w_h · (nI·dI)^-1/2 on bf16-rounded q and the dequantized fp8 keys (what the tensor-core
/// kernels compute, up to fp32 summation order: codes are exact in bf16, the row scale is one
/// f32 product).
std::vector<double> fp8_ref_row(const std::vector<float>& q, const std::vector<float>& w,
                                const std::vector<float>& deq, const int32_t* rows, int n,
                                int64_t t, int nI, int dI) {
  const double wscale = 1.0 / std::sqrt(double(nI)) / std::sqrt(double(dI));
  std::vector<double> qd(size_t(nI) * dI), out(static_cast<size_t>(n));
  // q as fp8 keys score it: each head quantized to e4m3 and read back (IndexerArgs); the kernels
  // multiply its codes exactly (bf16 or e4m3 tensor cores) and fold the scale into the weight.
  std::vector<float> qh(static_cast<size_t>(dI));
  for (int h = 0; h < nI; ++h) {
    kvfp8::index_query_fp8(&q[(size_t(t) * nI + h) * dI], dI, qh.data());
    for (int c = 0; c < dI; ++c) qd[size_t(h) * dI + c] = qh[size_t(c)];
  }
  for (int s = 0; s < n; ++s) {
    const float* key = &deq[size_t(rows[s]) * dI];
    double acc = 0;
    for (int h = 0; h < nI; ++h) {
      double dd = 0;
      for (int c = 0; c < dI; ++c) dd += qd[size_t(h) * dI + c] * double(key[c]);
      acc += std::max(0.0, dd) * double(w[size_t(t * nI + h)]) * wscale;
    }
    out[size_t(s)] = acc;
  }
  return out;
}

// Indexer scores over fp8 keys (V4 shapes nI 64, dI 128, 144-byte rows) vs the double reference
// on the same bytes (q quantized per head, as the op defines for fp8 keys): the decode kernel
// (variant 2: 2 n-tiles, 3: 4 n-tiles; auto 0 and 19–21: 4 n-tiles on e4m3 tensor cores; batch 1 /
// 7 / 64, counts not multiples of a chunk, an empty row, a tiny grid) and the WMMA kernel
// (variant 1; decode-shaped and prefill-shaped, rows sharing a list). Tolerance 2e-4 relative
// (abs floor 1e-2 · max score), as for bf16 keys; entries at or beyond count[t] stay poisoned.
TEST(CudaKvFp8, IndexerScoresFp8KeysMatchReference) {
  V4_REQUIRE_GPU();
  const int nI = 64, dI = 128;
  const int64_t pool_rows = 20000;
  Fp8Keys keys(pool_rows, dI);
  Dev<uint8_t> dpool(keys.bytes);
  struct Case { std::vector<int> counts; int n_sms; bool shared; };
  std::vector<int> b64(64), causal(70);
  for (int& c : b64) c = rand_int(1, 1500);
  b64[5] = 0;
  for (int t = 0; t < 70; ++t) causal[size_t(t)] = 700 - 3 * (69 - t);  // > 64 rows: WMMA kQB = 4
  const Case cases[] = {{{5000}, 132, false}, {{1, 15, 16, 17, 0, 33, 1000}, 132, false},
                        {b64, 132, false}, {{4099, 9000}, 3, false},
                        {{700, 700, 700, 700, 700, 690, 650, 600, 3}, 132, true},
                        {causal, 132, true}};
  for (const Case& c : cases) {
    const int64_t S = int64_t(c.counts.size());
    const int maxc = std::max(1, *std::max_element(c.counts.begin(), c.counts.end()));
    SCOPED_TRACE(::testing::Message() << "S=" << S << " max count " << maxc << " shared "
                                      << c.shared);
    auto q = randn(size_t(S * nI * dI), 1.f), w = randn(size_t(S * nI), 1.f);
    std::vector<int32_t> rows, count(c.counts.begin(), c.counts.end());
    std::vector<int64_t> offset(static_cast<size_t>(S));
    if (c.shared) {  // prefill-shaped: one list, causal counts (prefixes of it)
      for (int i = 0; i < maxc; ++i) rows.push_back(rand_int(0, int(pool_rows) - 1));
      for (int64_t t = 0; t < S; ++t) offset[size_t(t)] = 0;
    } else {
      for (int64_t t = 0; t < S; ++t) {  // runs of 64 consecutive rows (odd rows: 4-byte aligned)
        offset[size_t(t)] = int64_t(rows.size());
        const int base = rand_int(0, int(pool_rows / 64) - 40) * 64;
        for (int i = 0; i < count[size_t(t)]; ++i)
          rows.push_back(int32_t((base + i) % pool_rows));
      }
    }
    if (rows.empty()) rows.push_back(0);
    const int64_t ld = maxc + 5;
    Dev<float> dq(q), dw(w), dscores(size_t(S * ld));
    Dev<int32_t> drows(rows), dcount(count);
    Dev<int64_t> doff(offset);
    IndexerArgs a;
    a.q = dq.p;
    a.weights = dw.p;
    a.key_pool = dpool.p;
    a.key_dtype = KvDtype::kFp8Index;
    a.cand = {drows.p, doff.p, dcount.p};
    a.n_rows = S;
    a.n_heads = nI;
    a.head_dim = dI;
    ASSERT_TRUE(cuda::indexer_decode_supported(a));
    std::vector<std::vector<double>> ref(static_cast<size_t>(S));
    for (int64_t t = 0; t < S; ++t)
      ref[size_t(t)] = fp8_ref_row(q, w, keys.deq, rows.data() + offset[size_t(t)],
                                   count[size_t(t)], t, nI, dI);
    for (int variant : {0, 1, 2, 3, 19, 20, 21, 22, 23, 24, 25, 26}) {
      dscores.poison();
      ASSERT_TRUE(cuda::indexer_scores_tc(a, maxc, dscores.p, ld, c.n_sms, nullptr, variant).ok())
          << "variant " << variant;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      auto got = dscores.host();
      double worst = 0;
      int64_t bad_untouched = 0, checked = 0;
      for (int64_t t = 0; t < S; ++t) {
        const int n = count[size_t(t)];
        double top = 0;
        for (int s = 0; s < n; ++s) top = std::max(top, std::fabs(ref[size_t(t)][size_t(s)]));
        for (int64_t s = 0; s < ld; ++s) {
          const float gv = got[size_t(t * ld + s)];
          if (s >= n) {
            bad_untouched += !std::isnan(gv);
            continue;
          }
          ++checked;
          const double r = ref[size_t(t)][size_t(s)];
          worst = std::max(worst, std::fabs(double(gv) - r) / (1e-2 * top + std::fabs(r) + 1e-30));
        }
      }
      std::printf("[indexer fp8] variant %d S=%lld max count %d: %lld scores, worst rel err %.2e\n",
                  variant, (long long)S, maxc, (long long)checked, worst);
      EXPECT_LE(worst, 2e-4) << "variant " << variant;
      EXPECT_EQ(bad_untouched, 0) << "variant " << variant;
    }
  }
}

// The fp8 indexer's query codes on the GPU equal the host definition (kvfp8::index_query_fp8)
// value for value: row t puts weight 1 on head t only and scores 128 one-hot keys (key d = code
// 1.0 at dim d, scale 1), so score[t][d] = ReLU(q̂[t, t, d]) · nI^-1/2 · dI^-1/2 exposes every q̂
// value of head t (q > 0 except the special heads). One e4m3 step is ≥ 1/16 relative, the
// tolerance 1e-6. Heads: random magnitudes 2^-30 … 2^30, all zero, all below the 2^-64 amax
// floor (scale 0: q̂ = 0), values straddling e4m3 rounding boundaries and the subnormal range
// (a head with amax 448·2^k and small entries). Variants: auto / 19 / 20 / 21 (e4m3 tensor cores,
// hardware conversion), 3 (codes as bf16), 1 (WMMA kernel, host encoder).
TEST(CudaKvFp8, IndexerQueryCodesEqualHostQuantizer) {
  V4_REQUIRE_GPU();
  const int nI = 64, dI = 128;
  const int64_t S = nI;
  const KvFp8IndexLayout L = kv_fp8_index_layout(dI);
  std::vector<uint8_t> pool(size_t(dI) * L.bytes, 0);
  for (int d = 0; d < dI; ++d) {
    uint8_t* row = &pool[size_t(d) * L.bytes];
    row[d] = 0x38;  // e4m3 1.0
    const float one = 1.f;
    std::memcpy(row + L.scale_off, &one, 4);
  }
  std::vector<float> q(size_t(S * nI * dI)), w(size_t(S * nI), 0.f);
  auto x = randn(q.size(), 1.f);
  for (int64_t t = 0; t < S; ++t) {
    w[size_t(t * nI + t)] = 1.f;
    float* qh = &q[size_t((t * nI + t) * dI)];
    const float mag = std::ldexp(1.f, int(t % 61) - 30);
    for (int c = 0; c < dI; ++c) qh[c] = (std::fabs(x[size_t((t * nI + t) * dI + c)]) + 1e-3f) * mag;
    if (t == 5) std::fill(qh, qh + dI, 0.f);
    if (t == 6) std::fill(qh, qh + dI, 1e-21f);  // amax < 2^-64: scale 0
    if (t == 7 || t == 8) {  // amax 448 · 2^k: x · inv = x · 2^-k, codes at and around boundaries
      const float k2 = t == 7 ? 1.f : 0.03125f;
      for (int c = 0; c < dI; ++c) {
        const float code_val = kvfp8::e4m3_decode(uint8_t(c % 0x7e));  // 0 … 448, subnormals too
        const float nudge = (c % 3 == 0) ? 1.f : (c % 3 == 1) ? 1.0625f : 0.9375f;
        qh[c] = code_val * nudge * k2;
      }
      qh[0] = 448.f * k2;
    }
  }
  std::vector<int32_t> rows(static_cast<size_t>(dI)), count(static_cast<size_t>(S), dI);
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<int64_t> offset(static_cast<size_t>(S), 0);
  Dev<float> dq(q), dw(w), dscores(size_t(S * dI));
  Dev<uint8_t> dpool(pool);
  Dev<int32_t> drows(rows), dcount(count);
  Dev<int64_t> doff(offset);
  IndexerArgs a;
  a.q = dq.p;
  a.weights = dw.p;
  a.key_pool = dpool.p;
  a.key_dtype = KvDtype::kFp8Index;
  a.cand = {drows.p, doff.p, dcount.p};
  a.n_rows = S;
  a.n_heads = nI;
  a.head_dim = dI;
  const double wscale = 1.0 / std::sqrt(double(nI)) / std::sqrt(double(dI));
  std::vector<float> qh(static_cast<size_t>(dI));
  for (int variant : {0, 19, 20, 21, 22, 23, 24, 25, 26, 3, 1}) {
    dscores.poison();
    ASSERT_TRUE(cuda::indexer_scores_tc(a, dI, dscores.p, dI, 132, nullptr, variant).ok())
        << "variant " << variant;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = dscores.host();
    int64_t bad = 0, nonzero = 0;
    for (int64_t t = 0; t < S; ++t) {
      kvfp8::index_query_fp8(&q[size_t((t * nI + t) * dI)], dI, qh.data());
      for (int d = 0; d < dI; ++d) {
        const double want = std::max(0.0, double(qh[size_t(d)])) * wscale;
        const double g = got[size_t(t * dI + d)];
        nonzero += want != 0.0;
        if (!(std::fabs(g - want) <= 1e-6 * std::fabs(want))) {
          if (bad < 5)
            ADD_FAILURE() << "variant " << variant << " row " << t << " dim " << d << ": " << g
                          << " vs " << want << " (q " << q[size_t((t * nI + t) * dI + d)] << ")";
          ++bad;
        }
      }
    }
    EXPECT_EQ(bad, 0) << "variant " << variant;
    EXPECT_GT(nonzero, (S - 3) * dI / 2) << "variant " << variant;
  }
}

// CudaOps::indexer_topk over fp8 keys on well-separated scores equals the CPU op's selection
// exactly (rows and counts): every key is α_r · v for one random vector v (so all rows quantize
// to nearly the same codes and the score is ∝ the row scale α_r·amax(v)/448), q_h = v, weights
// > 0, α_r distinct and ≥ 4% apart. Paths: bf16 mode (decode kernel at S = 3; WMMA kernel at
// S = 130, rows sharing a list) and fp32 mode (indexer_score_kernel, dequantize on load).
TEST(CudaKvFp8, Fp8IndexerTopkMatchesCpuOp) {
  V4_REQUIRE_GPU();
  auto cpu = make_cpu_ops();
  const int nI = 64, dI = 128, k = 64;
  const int64_t pool_rows = 3000;
  const KvFp8IndexLayout L = kv_fp8_index_layout(dI);
  const auto v = randn(size_t(dI), 1.f);
  std::vector<int> perm(static_cast<size_t>(pool_rows));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), cuda::testing::rng());
  std::vector<float> x(size_t(pool_rows * dI));
  for (int64_t r = 0; r < pool_rows; ++r) {
    const float alpha = 0.01f * std::pow(1.04f, float(perm[size_t(r)] % 300));
    for (int c = 0; c < dI; ++c) x[size_t(r * dI + c)] = alpha * v[size_t(c)];
  }
  // Distinct α per candidate of a list: lists draw distinct rows whose perm % 300 differ.
  const auto bytes = quantize_index_rows(x, dI);
  Dev<uint8_t> dpool(bytes);
  std::vector<int32_t> by_alpha(300, -1);
  for (int64_t r = 0; r < pool_rows; ++r)
    if (by_alpha[size_t(perm[size_t(r)] % 300)] < 0) by_alpha[size_t(perm[size_t(r)] % 300)] = int32_t(r);
  struct Mode { Precision p; int64_t S; bool shared; };
  for (Mode md : {Mode{Precision::kBf16, 3, false}, Mode{Precision::kBf16, 130, true},
                  Mode{Precision::kFp32, 3, false}}) {
    SCOPED_TRACE(::testing::Message() << (md.p == Precision::kBf16 ? "bf16" : "fp32") << " S="
                                      << md.S);
    auto g = cuda_ops(md.p);
    ASSERT_TRUE(g);
    const int64_t S = md.S;
    std::vector<float> q(size_t(S * nI * dI)), w(size_t(S * nI));
    for (int64_t i = 0; i < S * nI; ++i) {
      std::copy(v.begin(), v.end(), q.begin() + i * dI);
      w[size_t(i)] = 0.5f + float(rand_int(0, 100)) / 100.f;
    }
    std::vector<int32_t> rows, count(static_cast<size_t>(S));
    std::vector<int64_t> offset(static_cast<size_t>(S));
    auto one_list = [&](int n) {
      std::vector<int32_t> order(by_alpha);
      std::shuffle(order.begin(), order.end(), cuda::testing::rng());
      order.resize(size_t(n));
      return order;
    };
    if (md.shared) {
      rows = one_list(300);
      for (int64_t t = 0; t < S; ++t) count[size_t(t)] = int(std::max<int64_t>(1, 300 - (S - 1 - t)));
    } else {
      for (int64_t t = 0; t < S; ++t) {
        offset[size_t(t)] = int64_t(rows.size());
        auto l = one_list(t == 1 ? 40 : 250);  // row 1: fewer candidates than k
        rows.insert(rows.end(), l.begin(), l.end());
        count[size_t(t)] = int(l.size());
      }
    }
    const int maxc = *std::max_element(count.begin(), count.end());
    IndexerArgs a;
    a.n_rows = S;
    a.n_heads = nI;
    a.head_dim = dI;
    a.topk = k;
    a.max_count = maxc;
    a.key_dtype = KvDtype::kFp8Index;
    std::vector<int32_t> out_cpu(size_t(S * k), -7), cnt_cpu(static_cast<size_t>(S), -7);
    IndexerArgs ac = a;
    ac.q = q.data();
    ac.weights = w.data();
    ac.key_pool = bytes.data();
    ac.cand = {rows.data(), offset.data(), count.data()};
    ac.out_rows = out_cpu.data();
    ac.out_count = cnt_cpu.data();
    cpu->indexer_topk(ac);
    Dev<float> dq(q), dw(w);
    Dev<int32_t> drows(rows), dcount(count), dout(out_cpu.size()), dcnt{size_t(S)};
    Dev<int64_t> doff(offset);
    dout.poison();
    dcnt.poison();
    IndexerArgs ag = a;
    ag.q = dq.p;
    ag.weights = dw.p;
    ag.key_pool = dpool.p;
    ag.cand = {drows.p, doff.p, dcount.p};
    ag.out_rows = dout.p;
    ag.out_count = dcnt.p;
    g->indexer_topk(ag);
    g->synchronize();
    EXPECT_EQ(dcnt.host(), cnt_cpu);
    const auto out = dout.host();
    int64_t diff = 0;
    for (size_t i = 0; i < out.size(); ++i) diff += out[i] != out_cpu[i];
    EXPECT_EQ(diff, 0) << "selected rows differ from the CPU op's";
    // the CPU selection is the k largest α, in map position order (sanity: the test separates
    // what it claims to)
    for (int64_t t = 0; t < S; ++t) {
      const int n = count[size_t(t)], n_sel = std::min(k, n);
      const int32_t* rw = rows.data() + offset[size_t(t)];
      std::vector<char> taken(static_cast<size_t>(n), 0);
      int prev_j = -1;
      float min_taken = INFINITY, max_left = -INFINITY;
      for (int i = 0; i < n_sel; ++i) {
        const int32_t r = out_cpu[size_t(t * k + i)];
        const int j = int(std::find(rw, rw + n, r) - rw);
        ASSERT_LT(j, n) << "row " << t << " rank " << i << ": not a candidate";
        ASSERT_GT(j, prev_j) << "row " << t << " rank " << i << ": not in map position order";
        prev_j = j;
        taken[size_t(j)] = 1;
        min_taken = std::min(min_taken, kvfp8::index_row_scale(&bytes[size_t(r) * L.bytes], L));
      }
      for (int j = 0; j < n; ++j)
        if (!taken[size_t(j)])
          max_left = std::max(max_left, kvfp8::index_row_scale(&bytes[size_t(rw[j]) * L.bytes], L));
      ASSERT_GT(min_taken, max_left) << "row " << t << ": not the k largest α";
    }
  }
}

}  // namespace
}  // namespace v4::ops

namespace v4::model {
namespace {

// The fixtures in bf16 precision: prefill (all logits) then 8 teacher-forced decode steps, with
// f32 pools and with fp8 pools.
TEST(CudaKvFp8, DecodeFp8PoolsNearF32PoolsAndOracle) {
  V4_REQUIRE_GPU();
  for (const auto& dir : testing::fixture_dirs()) {
    SCOPED_TRACE(dir);
    ops::CudaOptions o;
    o.precision = ops::Precision::kBf16;
    auto ops = ops::make_cuda_ops(o);
    ASSERT_TRUE(ops.ok());
    auto m = DeepseekV4::load(dir, ops->get());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    auto g = testing::load_golden(dir);
    ASSERT_TRUE(g.ok());
    const int64_t V = (*m)->config().vocab_size;
    const int64_t T = int64_t(g->prompt_ids.size());
    const size_t steps = std::min<size_t>(9, g->tokens.size());
    std::vector<float> logits[2];
    for (int i = 0; i < 2; ++i) {
      const KvDtype dt = i ? KvDtype::kFp8 : KvDtype::kF32;
      auto kv = (*m)->make_cache(int64_t(256) << 20, 2, 0, 0, dt);
      ASSERT_TRUE(kv.ok()) << kv.status().to_string();
      const int32_t s = *(*kv)->create_sequence();
      ForwardBatch b;
      b.slices.push_back({s, 0, g->prompt_ids, true});
      auto out = (*m)->forward(b, **kv);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      logits[i] = out->logits;  // T rows, then one row per decode step
      int64_t pos = T;
      for (size_t j = 1; j < steps; ++j) {
        ForwardBatch d;
        d.slices.push_back({s, pos++, {g->tokens[j - 1]}, false});
        auto o2 = (*m)->forward(d, **kv);
        ASSERT_TRUE(o2.ok()) << o2.status().to_string();
        logits[i].insert(logits[i].end(), o2->logits.begin(), o2->logits.end());
      }
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    ASSERT_EQ(logits[1].size(), size_t(T + int64_t(steps) - 1) * size_t(V));
    double worst = 0;
    for (size_t r = 0; r * V < logits[0].size(); ++r)
      worst = std::max(worst, testing::rel_err(&logits[1][r * V], &logits[0][r * V], size_t(V)));
    // Greedy agreement with the oracle: prefill positions, then the decode steps (the last
    // prefill row predicts tokens[0], decode step j predicts tokens[j]).
    int64_t same = 0, total = 0;
    for (int64_t t = 0; t < T; ++t, ++total)
      same += testing::argmax(&logits[1][size_t(t * V)], V) ==
              testing::argmax(&g->prefill_logits[size_t(t * V)], V);
    for (size_t j = 1; j < steps; ++j, ++total)
      same += testing::argmax(&logits[1][size_t((T - 1 + int64_t(j)) * V)], V) == g->tokens[j];
    std::printf("[kv fp8] %s fp8 vs f32 pools worst rel err %.3g; greedy equal to the oracle "
                "%lld/%lld\n",
                dir.c_str(), worst, (long long)same, (long long)total);
    for (float x : logits[1]) ASSERT_TRUE(std::isfinite(x));
    // 1.25: with fp8 indexer keys (idxfp8) the CPU backend's run of this exact procedure reaches
    // 0.972 on tiny-bf16 (0.44–0.67 on the others; 0.72 before, with bf16 indexer keys), so
    // 1.0 left no room for the GPU's bf16 arithmetic. The bound stays a sanity check (a
    // flipped near-tied top-k pick moves single logits by ~max |logit|); the row formats are
    // checked byte for byte above and the agreement bound below.
    EXPECT_LE(worst, 1.25);
    EXPECT_GE(double(same), 0.8 * double(total));
    EXPECT_NE(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)), 0)
        << "fp8 pools gave the f32 logits bit for bit: the option had no effect";
  }
}

}  // namespace
}  // namespace v4::model
