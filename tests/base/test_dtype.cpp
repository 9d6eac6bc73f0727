#include <gtest/gtest.h>

#include <cmath>

#include "base/dtype.h"
#include "base/status.h"
#include "base/thread_pool.h"

using namespace v4;

TEST(DType, Fp8E4M3RoundTripAllCodes) {
  for (int b = 0; b < 256; ++b) {
    float f = fp8e4m3_to_f32(uint8_t(b));
    if (std::isnan(f)) continue;
    uint8_t back = f32_to_fp8e4m3(f);
    if (f == 0.0f) {
      EXPECT_EQ(fp8e4m3_to_f32(back), 0.0f);
    } else {
      EXPECT_EQ(back, uint8_t(b)) << "code " << b << " value " << f;
    }
  }
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f32_to_fp8e4m3(1e6f), 0x7e);
}

TEST(DType, Bf16AndF16) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(round_bf16(1.00390625f), 1.0f);  // tie to even
  for (int h = 0; h < 65536; ++h) {
    float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f16_to_f32(f32_to_f16(f)), f) << h;
  }
}

TEST(DType, Fp4AndUe8m0) {
  EXPECT_EQ(fp4e2m1_to_f32(7), 6.0f);
  EXPECT_EQ(fp4e2m1_to_f32(15), -6.0f);
  EXPECT_EQ(ue8m0_to_f32(127), 1.0f);
  EXPECT_EQ(ue8m0_to_f32(120), 1.0f / 128);
  EXPECT_TRUE(std::isnan(ue8m0_to_f32(255)));
}

TEST(ThreadPool, CoversRangeOnce) {
  ThreadPool pool(3);
  std::vector<int> hits(10007, 0);
  pool.parallel_for(int64_t(hits.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (int h : hits) ASSERT_EQ(h, 1);
}

TEST(Status, ResultCarriesError) {
  Result<int> r = make_error(ErrorCode::kNotFound, "tensor {} missing", "x");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().to_string(), "not_found: tensor x missing");
  Result<int> g = 3;
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(*g, 3);
}
