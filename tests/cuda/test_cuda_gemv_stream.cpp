// GPU tests of the streaming GEMV (ops/cuda/gemv_stream.h), the bf16 mode's batch-1 linear:
// every weight format (f32, bf16, FP8 128×128 blocks, MXFP4), the V4-Flash shapes and odd ones,
// all GemvArgs forms (plain, grouped plain = wo_a, grouped by expert = MoE, SwiGLU), against an
// fp64 host reference on the exactly dequantized weights (base/dtype.h conversions).
// Tolerance: the GEMV class of docs/cuda.md §Precision modes: max |Δ| / max |ref| ≤ 1e-5 (fp32
// math on exact weights, only the summation order differs). One-hot x must reproduce the
// dequantized weight column bit-exactly (catches any index / scale / nibble-order slip). Outputs
// are NaN-poisoned, and padding columns of y must stay NaN. Row 0 must be bit-identical for every
// M (batch invariance).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "cuda_test_util.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/gemv_stream.h"
#include "ops/cuda/wgemm.h"
#include "ops/ops.h"

namespace v4::ops {
namespace {

using cuda::GemvArgs;
using cuda::testing::Dev;
using cuda::testing::test_seed;

constexpr double kTol = 1e-5;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

#define V4_GPU()                             \
  do {                                       \
    V4_REQUIRE_GPU();                        \
  } while (0)

int num_sms() {
  int n = 0;
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0);
  return n > 0 ? n : 132;
}

// splitmix64 stream for large weight tensors.
struct Bits {
  uint64_t s;
  explicit Bits(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(next() >> 40) / float(1 << 24); }  // [0, 1)
};
uint64_t fresh_seed() {
  static uint64_t n = 0;
  return test_seed() * 7919ull + (++n);
}

/// Host weights: E experts × rows × K in format f with exact dequantization `at`.
struct HostW {
  WFormat f = WFormat::kF32;
  int64_t E = 1, rows = 0, K = 0;
  std::vector<uint8_t> data, scale;
  double at(int64_t e, int64_t r, int64_t k) const {
    const int64_t row = e * rows + r;
    switch (f) {
      case WFormat::kF32: {
        float v;
        std::memcpy(&v, &data[size_t(row * K + k) * 4], 4);
        return v;
      }
      case WFormat::kBF16: {
        uint16_t h;
        std::memcpy(&h, &data[size_t(row * K + k) * 2], 2);
        return bf16_to_f32(h);
      }
      case WFormat::kFP8Block: {
        const int64_t rb = (rows + 127) / 128, kb = (K + 127) / 128;
        float s;
        std::memcpy(&s, &scale[size_t((e * rb + r / 128) * kb + k / 128) * 4], 4);
        return double(fp8e4m3_to_f32(data[size_t(row * K + k)])) * double(s);
      }
      case WFormat::kMXFP4: {
        const uint8_t b = data[size_t(row * (K / 2) + k / 2)];
        const uint8_t nib = (k & 1) ? (b >> 4) : (b & 0xf);
        return double(fp4e2m1_to_f32(nib)) * double(ue8m0_to_f32(scale[size_t(row * (K / 32) + k / 32)]));
      }
    }
    return 0.0;
  }
  /// The f32 value the kernels see for a one-hot x (FP8: float(e4m3 · scale), one rounding).
  float at_f32(int64_t e, int64_t r, int64_t k) const { return float(at(e, r, k)); }
};

/// Random weights, |W| around amp. FP8 scales arbitrary positive f32 (not powers of two: the
/// kernels must apply them, not rely on exactness); MXFP4 ue8m0 scales around amp.
HostW make_weights(WFormat f, int64_t E, int64_t rows, int64_t K, float amp) {
  HostW w;
  w.f = f;
  w.E = E;
  w.rows = rows;
  w.K = K;
  Bits g(fresh_seed());
  const int64_t n = E * rows * K;
  switch (f) {
    case WFormat::kF32:
      w.data.resize(size_t(n) * 4);
      for (int64_t i = 0; i < n; ++i) {
        const float v = (g.uniform() * 2.f - 1.f) * amp * 1.7f;
        std::memcpy(&w.data[size_t(i) * 4], &v, 4);
      }
      break;
    case WFormat::kBF16:
      w.data.resize(size_t(n) * 2);
      for (int64_t i = 0; i < n; i += 4) {
        uint64_t r = g.next();
        for (int b = 0; b < 4 && i + b < n; ++b, r >>= 16) {
          const float v = (float(r & 0xffff) / 32768.f - 1.f) * amp * 1.7f;
          const uint16_t h = f32_to_bf16(v);
          std::memcpy(&w.data[size_t(i + b) * 2], &h, 2);
        }
      }
      break;
    case WFormat::kFP8Block: {
      w.data.resize(size_t(n));
      for (int64_t i = 0; i < n; i += 8) {
        uint64_t r = g.next();
        for (int b = 0; b < 8 && i + b < n; ++b, r >>= 8) {
          uint8_t v = uint8_t(r & 0xff);
          if (((v >> 3) & 0xf) > 9) v = uint8_t(v & 0xcf);  // |v| ≤ 7.5, never NaN
          w.data[size_t(i + b)] = v;
        }
      }
      const int64_t rb = (rows + 127) / 128, kb = (K + 127) / 128;
      w.scale.resize(size_t(E * rb * kb) * 4);
      for (int64_t i = 0; i < E * rb * kb; ++i) {
        const float s = amp * (0.05f + 0.3f * g.uniform());
        std::memcpy(&w.scale[size_t(i) * 4], &s, 4);
      }
      break;
    }
    case WFormat::kMXFP4: {
      w.data.resize(size_t(n / 2));
      for (size_t i = 0; i < w.data.size(); i += 8) {
        uint64_t r = g.next();
        for (size_t b = 0; b < 8 && i + b < w.data.size(); ++b, r >>= 8) w.data[i + b] = uint8_t(r);
      }
      const int e0 = int(std::lround(std::log2(amp / 2.f))) + 127;
      w.scale.resize(size_t(E * rows * (K / 32)));
      for (auto& s : w.scale) s = uint8_t(e0 - 2 + int(g.next() % 5));
      break;
    }
  }
  return w;
}

struct DevW {
  Dev<uint8_t> data, scale;
  const HostW* h = nullptr;
  explicit DevW(const HostW& hw) : data(hw.data), scale(hw.scale), h(&hw) {}
  WeightView view(int64_t row0, int64_t n) const {
    WeightView v;
    v.data = data.p;
    v.scale = scale.n ? scale.p : nullptr;
    v.format = h->f;
    v.n = n;
    v.k = h->K;
    v.experts = h->E;
    v.row0 = row0;
    v.rows_total = h->rows;
    return v;
  }
};

std::vector<float> rand_x(size_t n) {
  Bits g(fresh_seed());
  std::vector<float> x(n);
  for (auto& v : x) v = (g.uniform() * 2.f - 1.f) * (g.uniform() < 0.02f ? 8.f : 1.f);
  return x;
}

struct Check {
  double rel = 0;
  int64_t unwritten = 0, clobbered = 0;
};

/// y [M, ldy] vs ref [M, N]: max |Δ| / max |ref|; NaN outputs counted; columns ≥ N must be NaN.
Check compare(const std::vector<float>& y, const std::vector<double>& ref, int64_t M, int64_t N,
              int64_t ldy) {
  Check c;
  double num = 0, den = 1e-30;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < ldy; ++j) {
      const float a = y[size_t(i * ldy + j)];
      if (j >= N) {
        c.clobbered += !std::isnan(a);
        continue;
      }
      if (std::isnan(a)) {
        ++c.unwritten;
        continue;
      }
      const double b = ref[size_t(i * N + j)];
      num = std::max(num, std::fabs(double(a) - b));
      den = std::max(den, std::fabs(b));
    }
  c.rel = num / den;
  return c;
}

struct Case {
  WFormat f;
  int64_t rows_total, row0, N, K;
  std::vector<int64_t> Ms;
};

// Plain form through wgemv (default: streaming kernel) vs the fp64 reference, row 0 bit-identical
// across M; returns nothing, EXPECTs inside.
void run_plain(const Case& c) {
  SCOPED_TRACE(::testing::Message() << wformat_name(c.f) << " N=" << c.N << " K=" << c.K
                                    << " row0=" << c.row0 << " rows_total=" << c.rows_total);
  const HostW hw = make_weights(c.f, 1, c.rows_total, c.K, 1.f / std::sqrt(float(c.K)));
  const DevW dw(hw);
  const int64_t Mmax = *std::max_element(c.Ms.begin(), c.Ms.end());
  const int64_t ldx = c.K + 4, ldy = c.N + 3;
  const auto x = rand_x(size_t(Mmax * ldx));
  Dev<float> dx(x), dy(size_t(Mmax * ldy));
  std::vector<double> ref(size_t(Mmax * c.N));
  for (int64_t i = 0; i < Mmax; ++i)
    for (int64_t n = 0; n < c.N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < c.K; ++k) s += double(x[size_t(i * ldx + k)]) * hw.at(0, c.row0 + n, k);
      ref[size_t(i * c.N + n)] = s;
    }
  std::vector<float> first_row0;
  for (int64_t M : c.Ms) {
    SCOPED_TRACE(::testing::Message() << "M=" << M);
    dy.poison();
    GemvArgs a;
    a.w = dw.view(c.row0, c.N);
    a.x = dx.p;
    a.ldx = ldx;
    a.y = dy.p;
    a.ldy = ldy;
    a.rows = M;
    a.n_out = c.N;
    ASSERT_TRUE(cuda::gemv_stream_supported(a)) << "the test must reach the streaming kernel";
    const Status st = cuda::wgemv(a, 1, num_sms(), nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto y = dy.host();
    y.resize(size_t(M * ldy));
    std::vector<double> r(ref.begin(), ref.begin() + M * c.N);
    const Check e = compare(y, r, M, c.N, ldy);
    EXPECT_EQ(e.unwritten, 0) << "outputs never written";
    EXPECT_EQ(e.clobbered, 0) << "padding columns of y written";
    EXPECT_LE(e.rel, kTol);
    std::printf("[gemv_stream] %-9s N=%lld K=%lld row0=%lld M=%lld ks=%d: rel err %.3g\n",
                wformat_name(c.f), (long long)c.N, (long long)c.K, (long long)c.row0, (long long)M,
                cuda::gemv_stream_kslices(a, 1, num_sms()), e.rel);
    std::vector<float> row0(y.begin(), y.begin() + c.N);
    if (first_row0.empty()) {
      first_row0 = row0;
    } else {
      EXPECT_EQ(std::memcmp(first_row0.data(), row0.data(), size_t(c.N) * 4), 0)
          << "row 0 differs bitwise between M values (batch invariance)";
    }
  }
}

TEST(CudaGemvStream, OddShapesAllFormats) {
  V4_GPU();
  const std::vector<int64_t> Ms = {1, 2, 3, 4, 5, 9};
  for (const Case& c : std::vector<Case>{
           {WFormat::kF32, 1, 0, 1, 4, Ms},             // one output, one 16-byte load
           {WFormat::kF32, 70, 0, 70, 68, Ms},          // partial chunk
           {WFormat::kF32, 300, 37, 200, 1000, Ms},     // unaligned row slice
           {WFormat::kF32, 256, 0, 256, 4096, Ms},      // the router
           {WFormat::kF32, 256, 0, 256, 4096, {1, 64, 256}},  // router at batch 64/256: grid.z passes
           {WFormat::kFP8Block, 40, 0, 40, 128, {1, 33}},  // passes over grid.z, partial last pass
           {WFormat::kBF16, 3, 0, 3, 8, Ms},
           {WFormat::kBF16, 129, 0, 129, 336, Ms},
           {WFormat::kBF16, 300, 37, 200, 1000, Ms},
           {WFormat::kFP8Block, 5, 0, 5, 16, Ms},
           {WFormat::kFP8Block, 200, 0, 200, 304, Ms},  // partial 128-block in K
           {WFormat::kFP8Block, 257, 0, 257, 1040, Ms},  // partial 128-blocks both ways
           {WFormat::kFP8Block, 520, 200, 264, 1040, Ms},  // slice across scale-row blocks
           {WFormat::kFP8Block, 67, 0, 67, 8208, Ms},   // 17 chunks: odd split-K tail
           {WFormat::kMXFP4, 1, 0, 1, 32, Ms},
           {WFormat::kMXFP4, 67, 0, 67, 96, Ms},
           {WFormat::kMXFP4, 300, 5, 200, 2080, Ms},
       })
    run_plain(c);
}

// V4-Flash shapes: wq_a, wq_b, wkv, wo_b, a wo_a group slice, shared expert as linears,
// indexer wq_b; the bf16 head at M = 1, 2.
TEST(CudaGemvStream, V4FlashShapes) {
  V4_GPU();
  const std::vector<int64_t> Ms = {1, 2, 4};
  for (const Case& c : std::vector<Case>{
           {WFormat::kFP8Block, 1024, 0, 1024, 4096, Ms},
           {WFormat::kFP8Block, 32768, 0, 32768, 1024, Ms},
           {WFormat::kFP8Block, 512, 0, 512, 4096, Ms},
           {WFormat::kFP8Block, 4096, 0, 4096, 8192, Ms},
           {WFormat::kFP8Block, 8192, 3072, 1024, 4096, Ms},
           {WFormat::kFP8Block, 4096, 0, 4096, 4096, Ms},
           {WFormat::kFP8Block, 4096, 0, 4096, 2048, Ms},
           {WFormat::kFP8Block, 8192, 0, 8192, 1024, Ms},
           {WFormat::kMXFP4, 4096, 0, 4096, 4096, Ms},
           {WFormat::kBF16, 1024, 0, 1024, 4096, Ms},
           {WFormat::kBF16, 129280, 0, 129280, 4096, {1, 2}},
       })
    run_plain(c);
}

// One-hot rows of x: y[i, n] must equal the dequantized W[n, k_i] bit-exactly (one f32
// rounding of value · scale, as the CPU loader computes it), for columns at chunk, scale-block
// and row ends, in every format.
TEST(CudaGemvStream, OneHotIsExact) {
  V4_GPU();
  struct OH {
    WFormat f;
    int64_t N, K;
  };
  for (const OH& c : {OH{WFormat::kF32, 37, 1028}, OH{WFormat::kBF16, 70, 2056},
                      OH{WFormat::kFP8Block, 300, 4112}, OH{WFormat::kFP8Block, 1024, 1024},
                      OH{WFormat::kMXFP4, 130, 4128}}) {
    SCOPED_TRACE(::testing::Message() << wformat_name(c.f) << " N=" << c.N << " K=" << c.K);
    const HostW hw = make_weights(c.f, 1, c.N, c.K, 0.05f);
    const DevW dw(hw);
    const int64_t ldx = c.K, ldy = c.N;
    std::vector<int64_t> cols = {0, 1, 15, 16, 127, 128, 511, 512, c.K / 2 + 3, c.K - 1};
    for (auto& k : cols) k = std::min(k, c.K - 1);
    for (size_t i0 = 0; i0 < cols.size(); i0 += 3) {
      const int64_t M = int64_t(std::min<size_t>(3, cols.size() - i0));
      std::vector<float> x(size_t(M * ldx), 0.f);
      for (int64_t i = 0; i < M; ++i) x[size_t(i * ldx + cols[i0 + size_t(i)])] = 1.f;
      Dev<float> dx(x), dy(size_t(M * ldy));
      dy.poison();
      GemvArgs a;
      a.w = dw.view(0, c.N);
      a.x = dx.p;
      a.ldx = ldx;
      a.y = dy.p;
      a.ldy = ldy;
      a.rows = M;
      a.n_out = c.N;
      ASSERT_TRUE(cuda::gemv_stream_supported(a));
      ASSERT_TRUE(cuda::wgemv(a, 1, num_sms(), nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto y = dy.host();
      int64_t bad = 0, first_bad = -1;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t n = 0; n < c.N; ++n) {
          const float want = hw.at_f32(0, n, cols[i0 + size_t(i)]);
          const float got = y[size_t(i * ldy + n)];
          if (!(got == want)) {
            ++bad;
            if (first_bad < 0) first_bad = i * c.N + n;
          }
        }
      EXPECT_EQ(bad, 0) << "first mismatch at (row, out) index " << first_bad << " of columns "
                        << cols[i0];
    }
  }
}

// Grouped plain form (wo_a: groups of n rows, group g reads x columns [g·K, (g+1)·K)) and
// SwiGLU (gate rows [0, n_out), up rows [n_out, 2·n_out); silu(min(g, L))·clamp(u, ±L)).
TEST(CudaGemvStream, GroupedAndSwiglu) {
  V4_GPU();
  struct G {
    WFormat f;
    int groups;
    int64_t n, K;
  };
  for (const G& c : {G{WFormat::kFP8Block, 8, 1024, 4096}, G{WFormat::kBF16, 3, 67, 96},
                     G{WFormat::kMXFP4, 4, 64, 256}, G{WFormat::kF32, 5, 9, 12}}) {
    for (int64_t M : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << wformat_name(c.f) << " groups=" << c.groups << " M=" << M);
      const HostW hw = make_weights(c.f, 1, c.groups * c.n, c.K, 0.05f);
      const DevW dw(hw);
      const int64_t N = c.groups * c.n, ldx = c.groups * c.K + 4, ldy = N + 3;
      const auto x = rand_x(size_t(M * ldx));
      std::vector<double> ref(size_t(M * N));
      for (int64_t i = 0; i < M; ++i)
        for (int g = 0; g < c.groups; ++g)
          for (int64_t j = 0; j < c.n; ++j) {
            double s = 0;
            for (int64_t k = 0; k < c.K; ++k)
              s += double(x[size_t(i * ldx + g * c.K + k)]) * hw.at(0, g * c.n + j, k);
            ref[size_t(i * N + g * c.n + j)] = s;
          }
      Dev<float> dx(x), dy(size_t(M * ldy));
      dy.poison();
      GemvArgs a;
      a.w = dw.view(0, N);
      a.w.experts = 1;
      a.x = dx.p;
      a.ldx = ldx;
      a.y = dy.p;
      a.ldy = ldy;
      a.rows = M;
      a.n_out = c.n;
      a.x_group_stride = c.K;
      a.y_group_stride = c.n;
      ASSERT_TRUE(cuda::gemv_stream_supported(a));
      ASSERT_TRUE(cuda::wgemv(a, c.groups, num_sms(), nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const Check e = compare(dy.host(), ref, M, N, ldy);
      EXPECT_EQ(e.unwritten, 0);
      EXPECT_EQ(e.clobbered, 0);
      EXPECT_LE(e.rel, kTol);
    }
  }
  // SwiGLU, plain form: the shared expert's gate/up (4096 → 2·2048) and odd sizes, with and
  // without the clamp.
  struct S {
    WFormat f;
    int64_t n_out, K;
    float limit;
  };
  for (const S& c : {S{WFormat::kFP8Block, 2048, 4096, 10.f}, S{WFormat::kFP8Block, 37, 1040, 0.f},
                     S{WFormat::kBF16, 33, 264, 0.5f}, S{WFormat::kMXFP4, 70, 2048, 0.f},
                     S{WFormat::kF32, 3, 40, 0.f}}) {
    for (int64_t M : {1, 2, 5}) {
      SCOPED_TRACE(::testing::Message() << "swiglu " << wformat_name(c.f) << " n_out=" << c.n_out
                                        << " K=" << c.K << " M=" << M);
      const HostW hw = make_weights(c.f, 1, 2 * c.n_out, c.K, 2.f / std::sqrt(float(c.K)));
      const DevW dw(hw);
      const int64_t ldx = c.K + 8, ldy = c.n_out + 1;
      const auto x = rand_x(size_t(M * ldx));
      std::vector<double> ref(size_t(M * c.n_out));
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < c.n_out; ++j) {
          double g = 0, u = 0;
          for (int64_t k = 0; k < c.K; ++k) {
            g += double(x[size_t(i * ldx + k)]) * hw.at(0, j, k);
            u += double(x[size_t(i * ldx + k)]) * hw.at(0, c.n_out + j, k);
          }
          if (c.limit > 0) {
            g = std::min(g, double(c.limit));
            u = std::clamp(u, -double(c.limit), double(c.limit));
          }
          ref[size_t(i * c.n_out + j)] = g / (1.0 + std::exp(-g)) * u;
        }
      Dev<float> dx(x), dy(size_t(M * ldy));
      dy.poison();
      GemvArgs a;
      a.w = dw.view(0, 2 * c.n_out);
      a.x = dx.p;
      a.ldx = ldx;
      a.y = dy.p;
      a.ldy = ldy;
      a.rows = M;
      a.n_out = c.n_out;
      a.swiglu = true;
      a.limit = c.limit;
      ASSERT_TRUE(cuda::gemv_stream_supported(a));
      ASSERT_TRUE(cuda::wgemv(a, 1, num_sms(), nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const Check e = compare(dy.host(), ref, M, c.n_out, ldy);
      EXPECT_EQ(e.unwritten, 0);
      EXPECT_EQ(e.clobbered, 0);
      EXPECT_LE(e.rel, kTol);
    }
  }
}

// Grouped-by-expert form (the MoE GEMV: expert e = active[y] serves items list[offset[e] ..
// offset[e+1]), x row list[i] / xdiv, y row list[i]) with SwiGLU and without; one inactive slot
// and an expert with more items than a pass.
// The persistent grid (GemvArgs::persist, the default: about one wave of blocks looping over
// tiles) against one block per tile: the same bits, every output written, for grids of several
// tiles per block (wq_b), K split over warps (wo_b), passes of x rows (M = 9), SwiGLU, the
// grouped plain form (wo_a's 8 groups) and the bf16 head (past 4 waves: one block per tile).
TEST(CudaGemvStream, PersistentGridSameBits) {
  V4_GPU();
  struct P {
    WFormat f;
    int groups;
    int64_t n, K, M;
    bool swiglu;
  };
  for (const P& c : {P{WFormat::kFP8Block, 1, 32768, 1024, 1, false},
                     P{WFormat::kFP8Block, 1, 32768, 1024, 9, false},
                     P{WFormat::kFP8Block, 1, 4096, 8192, 1, false},
                     P{WFormat::kFP8Block, 8, 1024, 4096, 1, false},
                     P{WFormat::kFP8Block, 1, 2048, 4096, 1, true},
                     P{WFormat::kMXFP4, 1, 4096, 4096, 2, false},
                     P{WFormat::kBF16, 1, 129280, 4096, 1, false},
                     P{WFormat::kF32, 1, 5000, 68, 3, true}}) {
    SCOPED_TRACE(::testing::Message() << wformat_name(c.f) << " groups=" << c.groups << " n=" << c.n
                                      << " K=" << c.K << " M=" << c.M << " swiglu=" << c.swiglu);
    const int64_t rows = c.groups * c.n * (c.swiglu ? 2 : 1);
    const HostW hw = make_weights(c.f, 1, rows, c.K, 0.05f);
    const DevW dw(hw);
    const int64_t outs = c.groups * c.n, ldx = c.groups * c.K + 4, ldy = outs + 3;
    const auto x = rand_x(size_t(c.M * ldx));
    Dev<float> dx(x), dy(size_t(c.M * ldy));
    std::vector<float> got[2];
    for (int persist = 0; persist < 2; ++persist) {
      dy.poison();
      GemvArgs a;
      a.w = dw.view(0, rows);
      a.x = dx.p;
      a.ldx = ldx;
      a.y = dy.p;
      a.ldy = ldy;
      a.rows = c.M;
      a.n_out = c.n;
      a.swiglu = c.swiglu;
      a.limit = c.swiglu ? 10.f : 0.f;
      if (c.groups > 1) {
        a.x_group_stride = c.K;
        a.y_group_stride = c.n;
      }
      a.persist = persist == 1;
      ASSERT_TRUE(cuda::gemv_stream_supported(a));
      const Status st = cuda::gemv_stream(a, c.groups, num_sms(), nullptr);
      ASSERT_TRUE(st.ok()) << st.to_string();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      got[persist] = dy.host();
      int64_t unwritten = 0;
      for (int64_t i = 0; i < c.M; ++i)
        for (int64_t j = 0; j < outs; ++j) unwritten += std::isnan(got[persist][size_t(i * ldy + j)]);
      EXPECT_EQ(unwritten, 0) << "persist=" << persist;
    }
    EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * 4), 0)
        << "the persistent grid changed the results";
  }
}

TEST(CudaGemvStream, GroupedByExpert) {
  V4_GPU();
  for (WFormat f : {WFormat::kFP8Block, WFormat::kMXFP4, WFormat::kBF16}) {
    for (bool swiglu : {false, true}) {
      SCOPED_TRACE(::testing::Message() << wformat_name(f) << (swiglu ? " swiglu" : ""));
      const int64_t E = 4, n_out = 96, K = 512, topk = 2, S = 5;
      const int64_t rows = swiglu ? 2 * n_out : n_out;
      const HostW hw = make_weights(f, E, rows, K, 2.f / std::sqrt(float(K)));
      const DevW dw(hw);
      // pairs p = s·topk + j; token s takes experts {0, 2}, except token 3: {0, 3}. So expert 0
      // has 5 items (3 passes of 2), expert 2 has 4, expert 3 has 1, expert 1 none.
      std::vector<int32_t> expert_of(size_t(S * topk));
      for (int64_t s = 0; s < S; ++s) {
        expert_of[size_t(s * topk)] = 0;
        expert_of[size_t(s * topk + 1)] = s == 3 ? 3 : 2;
      }
      std::vector<int32_t> offset(size_t(E + 1), 0), list;
      for (int64_t e = 0; e < E; ++e) {
        offset[size_t(e)] = int32_t(list.size());
        for (int64_t p = 0; p < S * topk; ++p)
          if (expert_of[size_t(p)] == e) list.push_back(int32_t(p));
      }
      offset[size_t(E)] = int32_t(list.size());
      const std::vector<int32_t> active = {0, 2, 3, 0}, count = {3};  // slot 3 inactive
      const int64_t ldx = K, ldy = n_out + 2;
      const auto x = rand_x(size_t(S * ldx));
      std::vector<double> ref(size_t(S * topk * n_out));
      for (int64_t p = 0; p < S * topk; ++p) {
        const int64_t e = expert_of[size_t(p)], s = p / topk;
        for (int64_t j = 0; j < n_out; ++j) {
          double g = 0, u = 0;
          for (int64_t k = 0; k < K; ++k) {
            g += double(x[size_t(s * ldx + k)]) * hw.at(e, j, k);
            if (swiglu) u += double(x[size_t(s * ldx + k)]) * hw.at(e, n_out + j, k);
          }
          ref[size_t(p * n_out + j)] = swiglu ? g / (1.0 + std::exp(-g)) * u : g;
        }
      }
      Dev<float> dx(x), dy(size_t(S * topk * ldy));
      Dev<int32_t> dlist(list), doff(offset), dact(active), dcnt(count);
      dy.poison();
      GemvArgs a;
      a.w = dw.view(0, rows);
      a.x = dx.p;
      a.ldx = ldx;
      a.y = dy.p;
      a.ldy = ldy;
      a.n_out = n_out;
      a.swiglu = swiglu;
      a.list = dlist.p;
      a.offset = doff.p;
      a.active = dact.p;
      a.active_count = dcnt.p;
      a.xdiv = int(topk);
      a.rows_hint = 2;  // expert 2 has 4 items: two passes
      ASSERT_TRUE(cuda::gemv_stream_supported(a));
      ASSERT_TRUE(cuda::wgemv(a, 4, num_sms(), nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const Check e = compare(dy.host(), ref, S * topk, n_out, ldy);
      EXPECT_EQ(e.unwritten, 0);
      EXPECT_EQ(e.clobbered, 0);
      EXPECT_LE(e.rel, kTol);
    }
  }
}

// Through the backend: bf16-mode linear_w at M = 1 with aligned x takes the streaming kernel by
// default and the shared-memory kernel with CudaOptions::gemv_stream = false; both within the
// GEMV tolerance of the fp64 reference, and the two kernels' outputs are not required to match
// bitwise (different summation trees).
TEST(CudaGemvStream, BackendOptionBothKernels) {
  V4_GPU();
  const int64_t N = 4096, K = 8192;
  const HostW hw = make_weights(WFormat::kFP8Block, 1, N, K, 1.f / std::sqrt(float(K)));
  const DevW dw(hw);
  const auto x = rand_x(size_t(K));
  std::vector<double> ref(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t k = 0; k < K; ++k) s += double(x[size_t(k)]) * hw.at(0, n, k);
    ref[size_t(n)] = s;
  }
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "gemv_stream on" : "gemv_stream off");
    CudaOptions o;
    o.precision = Precision::kBf16;
    o.gemv_stream = on;
    auto r = make_cuda_ops(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    auto ops = std::move(r).value();
    Dev<float> dx(x), dy(static_cast<size_t>(N));
    dy.poison();
    ops->linear_w(dx.p, K, dw.view(0, N), 1, dy.p, N);
    ops->synchronize();
    const Check e = compare(dy.host(), ref, 1, N, N);
    EXPECT_EQ(e.unwritten, 0);
    EXPECT_LE(e.rel, kTol);
  }
}

}  // namespace
}  // namespace v4::ops
