// model::fill_kv_pools_random (the bench's KV pool contents): fp8 rows must look like stored rows
// — positive, finite scales and N(0, 1)-like values after dequantization — not random bytes
// (whose f32 scales would be random floats of either sign).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/dtype.h"
#include "base/kv_fp8.h"
#include "cache/pools.h"
#include "model/kv_fill.h"
#include "ops/ops.h"

namespace v4::model {
namespace {

TEST(KvFill, Fp8RowsHaveRealScalesAndNormalValues) {
  auto ops = ops::make_cpu_ops();
  cache::CacheSpec spec;
  spec.sliding_window = 128;
  spec.rope_dim = 64;
  spec.kv_dtype = KvDtype::kFp8;  // attention rows kFp8, indexer keys kFp8Index
  spec.layers = {{cache::AttnKind::kSliding, 0, 512, 0},
                 {cache::AttnKind::kCsa, 4, 512, 128},
                 {cache::AttnKind::kHca, 128, 512, 0}};
  cache::KvCacheOptions opt{256, 300, 4, 1};  // 19,200 C4 rows: two fill chunks
  ops::Ops* o = ops.get();
  auto kv = cache::KvCache::create(
      spec, opt, [o](size_t b) { return o->alloc(b); }, [o](void* p) { o->free(p); });
  ASSERT_TRUE(kv.ok()) << kv.status().to_string();
  fill_kv_pools_random(*ops, **kv, 7);
  int fp8_buffers = 0, index_buffers = 0;
  for (const auto& b : (*kv)->buffers()) {
    SCOPED_TRACE(b.name + " layer " + std::to_string(b.layer));
    const auto* bytes = static_cast<const uint8_t*>(b.data);
    if (b.dtype == KvDtype::kFp8) {
      ++fp8_buffers;
      const KvFp8Layout L = kv_fp8_layout(512, 64);
      const int64_t rows = b.values / L.bytes;
      ASSERT_GT(rows, 0);
      double sum = 0, sum2 = 0;
      int64_t n = 0;
      std::vector<float> v(512);
      for (int64_t r = 0; r < rows; r += 7) {
        const uint8_t* row = bytes + r * L.bytes;
        for (int s = 0; s < L.n_scales; ++s) {
          float sc;
          std::memcpy(&sc, row + L.scale_off + 4 * s, 4);
          ASSERT_TRUE(std::isfinite(sc) && sc > 0.f && sc < 1.f) << "row " << r << " scale " << sc;
        }
        kvfp8::dequantize_row(row, L, v.data());
        for (float x : v) {
          ASSERT_TRUE(std::isfinite(x));
          sum += x;
          sum2 += double(x) * x;
          ++n;
        }
      }
      const double mean = sum / double(n), sd = std::sqrt(sum2 / double(n) - mean * mean);
      EXPECT_NEAR(mean, 0.0, 0.05);
      EXPECT_NEAR(sd, 1.0, 0.1);
    } else if (b.dtype == KvDtype::kFp8Index) {
      ++index_buffers;
      const KvFp8IndexLayout L = kv_fp8_index_layout(128);
      const int64_t rows = b.values / L.bytes;
      ASSERT_EQ(rows, opt.n_pages * opt.page_size / 4);
      double sum2 = 0;
      int64_t n = 0;
      std::vector<float> v(128);
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = bytes + r * L.bytes;
        const float sc = kvfp8::index_row_scale(row, L);
        ASSERT_TRUE(std::isfinite(sc) && sc > 0.f && sc < 1.f) << "row " << r << " scale " << sc;
        kvfp8::dequantize_index_row(row, L, v.data());
        for (float x : v) sum2 += double(x) * x, ++n;
      }
      EXPECT_NEAR(std::sqrt(sum2 / double(n)), 1.0, 0.1);
    } else {
      ASSERT_EQ(b.dtype, KvDtype::kF32);  // the compressor-state rings
      const auto* f = static_cast<const float*>(b.data);
      double sum2 = 0;
      for (int64_t i = 0; i < b.values; ++i) sum2 += double(f[i]) * f[i];
      EXPECT_NEAR(std::sqrt(sum2 / double(b.values)), 1.0, 0.1);
    }
  }
  EXPECT_EQ(fp8_buffers, 5);   // SWA × 3 layers, C4, C128
  EXPECT_EQ(index_buffers, 1);
}

}  // namespace
}  // namespace v4::model
