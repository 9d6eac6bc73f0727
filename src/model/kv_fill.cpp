#include "model/kv_fill.h"

#include <algorithm>
#include <vector>

namespace v4::model {
namespace {

constexpr int64_t kFillRows = 16384;

// Rows of one fp8 buffer, quantized from N(0, 1) f32 rows in chunks (see kv_fill.h).
void fill_fp8_rows(ops::Ops& ops, const cache::CacheSpec& spec,
                   const cache::KvCache::PoolBuffer& b, uint64_t seed) {
  const cache::LayerCacheSpec& l = spec.layers[size_t(b.layer)];
  const bool index = b.dtype == KvDtype::kFp8Index;
  const int64_t row_bytes = index ? spec.index_row_bytes(l) : spec.attn_row_bytes(l);
  const int width = index ? l.index_dim : l.kv_dim;
  const int64_t rows = b.values * int64_t(kv_dtype_size(b.dtype)) / row_bytes;
  if (rows <= 0 || width <= 0) return;
  const int64_t chunk = std::min(rows, kFillRows);
  std::vector<int32_t> iota(static_cast<size_t>(chunk));
  for (int64_t i = 0; i < chunk; ++i) iota[size_t(i)] = int32_t(i);
  auto* ids = static_cast<int32_t*>(ops.alloc(size_t(chunk) * sizeof(int32_t)));
  auto* tmp = static_cast<float*>(ops.alloc(size_t(chunk) * size_t(width) * sizeof(float)));
  ops.upload(ids, iota.data(), iota.size() * sizeof(int32_t));
  for (int64_t base = 0; base < rows; base += chunk) {
    const int64_t n = std::min(chunk, rows - base);
    ops.fill_random(tmp, n * width, ops::RandomFill::kF32Normal, 1.f, seed + uint64_t(base));
    ops.store_rows_kv(static_cast<char*>(b.data) + base * row_bytes, b.dtype, ids, n, width, tmp,
                      index ? 0 : spec.rope_dim);
  }
  ops.synchronize();  // tmp / ids are read by the stores
  ops.free(tmp);
  ops.free(ids);
}

}  // namespace

void fill_kv_pools_random(ops::Ops& ops, const cache::KvCache& kv, uint64_t seed) {
  for (const auto& b : kv.buffers()) {
    if (b.dtype == KvDtype::kFp8 || b.dtype == KvDtype::kFp8Index) {
      fill_fp8_rows(ops, kv.spec(), b, seed + 1000);
      continue;
    }
    ops.fill_random(b.data, b.values,
                    b.dtype == KvDtype::kBf16 ? ops::RandomFill::kBF16Normal
                                              : ops::RandomFill::kF32Normal,
                    1.f, seed + 1000);
  }
  ops.synchronize();
}

}  // namespace v4::model
