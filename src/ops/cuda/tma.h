// Host side of the TMA copies (tma.cuh): tensor maps over KV pools.
#pragma once
#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "base/status.h"

namespace v4::cuda {

/// Swizzle and L2 promotion of a pool tensor map.
struct PoolMapOptions {
  bool swizzle128 = true;  // CU_TENSOR_MAP_SWIZZLE_128B (else none)
  int l2_promotion = 256;  // bytes: 0, 64, 128 or 256 (CU_TENSOR_MAP_L2_PROMOTION_*)
};

/// Tensor map over a bf16 pool of `rows` rows × `row_elems` elements (row stride row_elems · 2
/// bytes, 16-byte aligned base): rank 2, dims (row_elems, rows), box (box_elems, 1) — one
/// box_elems-wide piece of one row per copy (box_elems a multiple of 8, ≤ 256; box_elems · 2 ≤
/// 128 with the 128-byte swizzle; rows ≤ 2^32; `map` 64-byte aligned, as CUtensorMap is).
/// The driver's cuTensorMapEncodeTiled is looked up through the runtime (no -lcuda).
/// Errors: kInvalidArgument for bad shapes / alignment; kInternal when the driver entry point is
/// missing or rejects the map (its CUresult in the message).
Status encode_pool_map_2d(CUtensorMap* map, const void* pool, int64_t rows, int row_elems,
                          int box_elems, const PoolMapOptions& o = {});

/// Rank-3 view of the same pool: dims (64, row_elems / 64, rows), box (64, row_elems / 64, 1) —
/// one whole row per copy, landing as row_elems / 64 consecutive 128-byte lines (with the
/// 128-byte swizzle, line b's 16-byte chunks XORed by the shared-address bits 7–9).
/// Errors: as encode_pool_map_2d; row_elems a multiple of 64, ≤ 64 · 256.
Status encode_pool_map_rows(CUtensorMap* map, const void* pool, int64_t rows, int row_elems,
                            const PoolMapOptions& o = {});

}  // namespace v4::cuda
