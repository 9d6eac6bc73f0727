// Random contents for KV pools (benchmarks): every pool buffer of a KvCache filled so that the
// step's kernels see data shaped like a model's (docs/bench.md, "KV pools").
#pragma once

#include <cstdint>

#include "cache/pools.h"
#include "ops/ops.h"

namespace v4::model {

/// Fills every buffer of `kv` (KvCache::buffers) on the backend `ops`:
///   - f32 / bf16 buffers (KV rows, compressor rings): N(0, 1) values (bf16: rounded);
///   - kFp8 attention rows and kFp8Index indexer-key rows: N(0, 1) f32 rows quantized by the
///     backend's own store_rows_kv (kv_fp8_layout / kv_fp8_index_layout), so every row's f32
///     scales are what a real store writes (positive, amax / 448), not random bytes.
/// Seeds: `seed` + 1000 for the plain buffers, + 1000 + the first row of each chunk for fp8
/// rows (chunks of 16,384 rows; the backend's fill_random). Synchronizes the backend.
/// Errors: those of the backend ops (recorded by the backend as for any op).
void fill_kv_pools_random(ops::Ops& ops, const cache::KvCache& kv, uint64_t seed);

}  // namespace v4::model
