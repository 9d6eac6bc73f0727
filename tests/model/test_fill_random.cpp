// Ops::fill_random on the CPU backend: each kind checked against an independent conversion of the
// f32 normal values of the same seed (base/dtype.h: f32_to_bf16, f32_to_fp8e4m3), against its
// distribution (mean, standard deviation, code histograms), for determinism (same seed → same
// bytes whatever the thread count; different seed → different bytes) and against the host
// default implementation (Ops::fill_random of the base class). Also memory_info, device_info and
// copy. The CUDA backend is compared byte for byte with this one in tests/cuda.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "base/dtype.h"
#include "base/thread_pool.h"
#include "ops/ops.h"

namespace v4::ops {
namespace {

// n units of `kind` whose C++ type is T (T = uint8_t for a byte view of wider kinds: 4n bytes).
template <typename T>
std::vector<T> fill(Ops& o, int64_t n, RandomFill kind, float scale, uint64_t seed,
                    bool base_impl = false) {
  const int unit = (kind == RandomFill::kF32Normal || kind == RandomFill::kF32Constant ||
                    kind == RandomFill::kI32Uniform)
                       ? 4
                   : kind == RandomFill::kBF16Normal ? 2
                                                     : 1;
  const size_t bytes = size_t(n) * unit;
  std::vector<T> out;
  out.resize(bytes / sizeof(T));
  void* d = o.alloc(bytes);
  std::memset(d, 0xcd, bytes);  // poison
  if (base_impl)
    o.Ops::fill_random(d, n, kind, scale, seed);
  else
    o.fill_random(d, n, kind, scale, seed);
  o.download(out.data(), d, bytes);
  o.free(d);
  return out;
}

TEST(FillRandom, F32NormalHasTheAskedMeanAndStd) {
  auto ops = make_cpu_ops();
  const int64_t n = 1 << 20;
  for (float scale : {1.f, 0.015625f, 3.f}) {
    auto v = fill<float>(*ops, n, RandomFill::kF32Normal, scale, 7);
    double s = 0, s2 = 0, mx = 0;
    for (float x : v) {
      ASSERT_TRUE(std::isfinite(x));
      s += x;
      s2 += double(x) * x;
      mx = std::max(mx, std::fabs(double(x)));
    }
    const double mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
    EXPECT_NEAR(mean, 0.0, 5e-3 * scale) << scale;
    EXPECT_NEAR(sd / scale, 1.0, 5e-3) << scale;
    EXPECT_LE(mx, 3.4642 * scale) << "Irwin-Hall bound";
    EXPECT_GE(mx, 3.0 * scale) << "tails present";
  }
}

TEST(FillRandom, NarrowFormatsAreTheF32ValuesConverted) {
  auto ops = make_cpu_ops();
  const int64_t n = 100003;
  for (float scale : {1.f, 0.05f, 200.f, 1e-3f}) {
    auto f = fill<float>(*ops, n, RandomFill::kF32Normal, scale, 42);
    auto b = fill<uint16_t>(*ops, n, RandomFill::kBF16Normal, scale, 42);
    auto e = fill<uint8_t>(*ops, n, RandomFill::kE4M3Normal, scale, 42);
    int64_t saturated = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(b[i], f32_to_bf16(f[i])) << "bf16 unit " << i << " of value " << f[i];
      ASSERT_EQ(e[i], f32_to_fp8e4m3(f[i])) << "e4m3 unit " << i << " of value " << f[i];
      ASSERT_NE(e[i] & 0x7f, 0x7f) << "NaN code at " << i;
      saturated += (e[i] & 0x7f) == 0x7e;
    }
    if (scale == 200.f) {
      EXPECT_GT(saturated, 0) << "values beyond 448 saturate";
    }
  }
}

TEST(FillRandom, E2M1CodesAreUniform) {
  auto ops = make_cpu_ops();
  const int64_t n = 1 << 18;
  auto v = fill<uint8_t>(*ops, n, RandomFill::kE2M1Packed, 1.f, 3);
  std::vector<int64_t> lo(16), hi(16);
  for (uint8_t x : v) {
    lo[x & 0xf]++;
    hi[x >> 4]++;
  }
  const double want = double(n) / 16;
  double chi_lo = 0, chi_hi = 0;
  for (int c = 0; c < 16; ++c) {
    chi_lo += (lo[c] - want) * (lo[c] - want) / want;
    chi_hi += (hi[c] - want) * (hi[c] - want) / want;
  }
  // 15 degrees of freedom: P(chi² > 45) < 1e-4.
  EXPECT_LT(chi_lo, 45.0);
  EXPECT_LT(chi_hi, 45.0);
}

TEST(FillRandom, Ue8m0IsTheScaleExponentWithJitter) {
  auto ops = make_cpu_ops();
  const int64_t n = 30000;
  for (auto [scale, base] : std::vector<std::pair<float, int>>{
           {1.f, 127}, {0.01f, 120}, {std::ldexp(1.f, -9), 118}, {1e-3f, 117}}) {
    // round(log2(0.01)) = round(-6.64) = -7; round(log2(1e-3)) = round(-9.97) = -10.
    auto v = fill<uint8_t>(*ops, n, RandomFill::kUe8m0, scale, 11);
    std::map<int, int64_t> hist;
    for (uint8_t x : v) hist[x]++;
    ASSERT_EQ(hist.size(), 3u) << "scale " << scale;
    EXPECT_EQ(hist.begin()->first, base - 1) << "scale " << scale;
    EXPECT_EQ(hist.rbegin()->first, base + 1) << "scale " << scale;
    for (auto [code, count] : hist) EXPECT_NEAR(double(count) / n, 1.0 / 3, 0.02) << code;
  }
}

TEST(FillRandom, ConstantAndIntegerKinds) {
  auto ops = make_cpu_ops();
  auto c = fill<float>(*ops, 1001, RandomFill::kF32Constant, 0.75f, 5);
  for (float x : c) ASSERT_EQ(x, 0.75f);
  auto t = fill<int32_t>(*ops, 200000, RandomFill::kI32Uniform, 256.f, 5);
  std::vector<int64_t> hist(256);
  for (int32_t x : t) {
    ASSERT_GE(x, 0);
    ASSERT_LT(x, 256);
    hist[x]++;
  }
  for (int e = 0; e < 256; ++e) EXPECT_NEAR(double(hist[e]) / 200000, 1.0 / 256, 1.5e-3) << e;
}

TEST(FillRandom, DeterministicAcrossThreadCountsAndEqualToTheHostDefault) {
  ThreadPool one(1), four(4);
  auto a = make_cpu_ops(&one);
  auto b = make_cpu_ops(&four);
  const int64_t n = 300007;
  for (RandomFill k : {RandomFill::kF32Normal, RandomFill::kBF16Normal, RandomFill::kE4M3Normal,
                       RandomFill::kE2M1Packed, RandomFill::kUe8m0, RandomFill::kI32Uniform}) {
    const float scale = k == RandomFill::kI32Uniform ? 100.f : 0.5f;
    auto x = fill<uint8_t>(*a, n, k, scale, 99);  // byte view
    auto y = fill<uint8_t>(*b, n, k, scale, 99);
    auto z = fill<uint8_t>(*b, n, k, scale, 99, /*base_impl=*/true);
    auto w = fill<uint8_t>(*b, n, k, scale, 100);
    EXPECT_EQ(x, y) << "kind " << int(k);
    EXPECT_EQ(x, z) << "kind " << int(k);
    EXPECT_NE(x, w) << "kind " << int(k) << ": another seed must change the bytes";
  }
  // A prefix fill equals the start of a longer fill (value depends on the index only).
  auto longer = fill<float>(*b, 5000, RandomFill::kF32Normal, 1.f, 8);
  auto shorter = fill<float>(*b, 1234, RandomFill::kF32Normal, 1.f, 8);
  EXPECT_TRUE(std::equal(shorter.begin(), shorter.end(), longer.begin()));
}

TEST(FillRandom, MemoryInfoDeviceInfoAndCopy) {
  auto ops = make_cpu_ops();
  const MemoryInfo m = ops->memory_info();
  EXPECT_GT(m.total_bytes, int64_t(1) << 26);
  EXPECT_GT(m.free_bytes, 0);
  EXPECT_LE(m.free_bytes, m.total_bytes);
  EXPECT_NE(ops->device_info().find("CPU"), std::string::npos) << ops->device_info();
  const size_t bytes = (size_t(9) << 20) + 13;  // spans several copy chunks, odd tail
  auto* src = static_cast<uint8_t*>(ops->alloc(bytes));
  auto* dst = static_cast<uint8_t*>(ops->alloc(bytes));
  for (size_t i = 0; i < bytes; ++i) src[i] = uint8_t(i * 131 + 7);
  std::memset(dst, 0, bytes);
  ops->copy(dst, src, bytes);
  ops->synchronize();
  EXPECT_EQ(std::memcmp(dst, src, bytes), 0);
  ops->free(src);
  ops->free(dst);
}

}  // namespace
}  // namespace v4::ops
