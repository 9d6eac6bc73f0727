// Ops::compress_fused, default composition (the CPU backend's path): pool + RMSNorm + RoPE + store
// and the ring refresh vs an independent double-precision reference of dsv4-model.md §5, on host
// plans (prefill chunks longer than the ring, so refreshed ring rows are also read as state) and
// device-style decode plans (rows that do not close, padding rows).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "compressor_cases.h"
#include "ops/ops.h"

namespace v4::ops {
namespace {

using v4::testing::CompressCase;
using v4::testing::CompressSlice;

constexpr float kEps = 1e-6f;
constexpr float kScaling = 1.f;

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return num / den;
}

CompressFusedArgs args_for(CompressCase& k, std::vector<float>& pool, std::vector<float>& rkv,
                           std::vector<float>& rg, float* scratch) {
  return v4::testing::host_args(k, pool.data(), rkv.data(), rg.data(), scratch, kEps, kScaling);
}

void check(CompressCase& k, bool with_scratch) {
  auto cpu = make_cpu_ops();
  std::vector<float> ref_pool, ref_kv, ref_gate;
  v4::testing::reference_step(k, kEps, kScaling, &ref_pool, &ref_kv, &ref_gate);
  std::vector<float> pool = k.pool, rkv = k.ring_kv, rg = k.ring_gate;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int32_t r : k.dst)  // rows the step must write: NaN first
    if (r >= 0) std::fill_n(pool.begin() + int64_t(r) * k.d, k.d, nan);
  std::vector<float> scratch(
      size_t(std::max<int64_t>(k.n_out() * k.d, k.n_ring() * k.width())), nan);
  cpu->compress_fused(args_for(k, pool, rkv, rg, with_scratch ? scratch.data() : nullptr));
  EXPECT_LE(rel_err(pool, ref_pool), 1e-5);
  EXPECT_EQ(rkv, ref_kv);  // plain copies: exact
  EXPECT_EQ(rg, ref_gate);
  // Not a vacuous comparison: the step changed the pool and the ring.
  EXPECT_NE(ref_pool, k.pool);
  EXPECT_NE(ref_kv, k.ring_kv);
}

TEST(CompressFused, PrefillC4RingReadBeforeRefresh) {
  // Chunks starting mid-window and longer than the ring (c·m = 8): refreshed rows are state too.
  for (int d : {512, 128}) {
    CompressCase k = v4::testing::prefill_case(4, 2, d, 64,
                                               {{0, 6, 30}, {2, 0, 13}, {1, 3, 9}}, 11 + d);
    ASSERT_TRUE(k.ring_hazard());
    check(k, true);
  }
}

TEST(CompressFused, PrefillC128) {
  CompressCase k = v4::testing::prefill_case(128, 1, 512, 64, {{1, 200, 400}, {0, 0, 130}}, 5);
  ASSERT_TRUE(k.ring_hazard());
  check(k, true);
}

TEST(CompressFused, DecodeRowsAndPadding) {
  std::vector<int64_t> pos = {3, 4, 7, -1, 130, 11, 0, 255, 127, -1, 515};
  for (auto [m, c] : {std::pair{4, 2}, std::pair{128, 1}}) {
    CompressCase k = v4::testing::decode_case(m, c, 512, 64, pos, 3 + m);
    check(k, m == 4);  // the C128 case lets the default allocate its scratch
  }
}

}  // namespace
}  // namespace v4::ops
