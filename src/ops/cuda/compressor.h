// FlashCompressor: the KV compressor step after its two projections (ops.h CompressFusedArgs,
// dsv4-model.md §5) on the device in one or two launches instead of eight (docs/cuda.md "FlashCompressor").
#pragma once
#include <cuda_runtime.h>

#include "base/status.h"
#include "ops/ops.h"

namespace v4::cuda {

/// Runs `Ops::compress_fused` (same contract; f32, bf16 or fp8 pools) on `stream`:
///   1. compress_fused_rows_kernel: a cluster of K ≤ 8 CTAs per output row r with dst[r] ≥ 0
///      (others exit after the first round of loads), each CTA a channel slice, its threads P slot
///      partitions of the window (plan: compress_split.h, a function of (m, c, d) only): slot
///      indices, dst, position, norm and inv_freq slices in one first round of loads; float4
///      reads of kv / gate / bias, one batch of up to 8 slots per thread in flight, online softmax
///      per channel, partitions merged in shared memory, Σx² over the cluster through distributed
///      shared memory (in an order independent of K), RMSNorm, interleaved RoPE at positions[r],
///      one float4 store of the finished row into pool[dst[r]] (bf16 pools: 4 rounded values;
///      fp8 pools, kv_fp8_layout(d, rope_dim) rows: the amax of each 64-value block from the
///      Σx² chunk grid, exchanged over the cluster, then kvfp8::quantize — the bytes of
///      kvfp8::quantize_row of the same f32 row — and bf16 rope values). Scalar path (1 channel per
///      thread, K = 1) when d % 4 ≠ 0 or a pointer is not 16-byte aligned. The WIDE plan
///      (compress_split.h plan_compress_rows_wide: more, smaller CTAs per row, all slot loads of
///      a thread in flight at once; bit-identical rows) measured slower in decode and is off
///      unless V4_COMPRESS_WIDE=1 (every call) or =auto (decode-sized grids).
///      ROW-WARP form (compress_rows_warp_kernel, compress_fused_takes_row_warp): for windows of
///      ≤ 8 slots and d ≤ 128, d % 32 == 0 (the indexer's C4 d128) and calls of ≥ 256 rows
///      (prefill) one warp per row instead, no shared memory or barrier, every slot load of a
///      lane in flight at once; the same bits as the rows kernel's base plan (partitions, merge
///      and Σx² order reproduced). V4_COMPRESS_ROWWARP=0: never; =1: at any row count.
///   2. The ring refresh (kv and gate rows, float4 when the rows allow):
///      - a.ring_disjoint (decode; prefill chunks without the hazard): extra CTAs of the same grid,
///        running concurrently with the pooling — ONE launch;
///      - otherwise compress_ring_kernel, a second launch: stream order puts it after every state
///        read of launch 1.
/// Both kernels use programmatic dependent launch (griddepcontrol.wait before any memory access
/// in every CTA, after its plan-index loads; off with V4_COMPRESS_PDL=0). V4_COMPRESS_UNROLL=4|8
/// forces load batches of 4 / 8 slots (8: base plans only). V4_COMPRESS_FLOOR=1 is a benchmark
/// diagnostic that computes NOTHING (launch shape only). The variables are read at every call.
/// No allocation, no host sync: graph-capturable. `scratch` is ignored.
/// fp8 indexer-key pools (a.pool_dtype == kFp8Index, kv_fp8_index_layout(d) rows: d codes,
/// a scale, zero padding to 16 bytes):
/// the vector path keeps every finished value (rope too) in shared memory, takes the row amax
/// over the cluster and stores d codes + one scale + the padding — the bytes of kvfp8::quantize_index_row of
/// the f32 row the same plan writes into an f32 pool. Needs compress_fused_index_fp8_ok(a).
/// Errors: kInvalidArgument for d < 1, odd or too large rope_dim, ratio/overlap out of range,
/// d too large for the shared-memory plan (> ~12K), an fp8 pool not 4-byte aligned; kUnsupported
/// for kFp8Index args that fail compress_fused_index_fp8_ok; launch failures.
Status compress_fused(const ops::CompressFusedArgs& a, cudaStream_t stream);
/// Whether compress_fused runs args `a` with the row-warp kernel (a function of the shape, the
/// pool type, the pointers' 16-byte alignment, n_out and the V4_COMPRESS_* variables; the rows
/// are the same bits either way).
bool compress_fused_takes_row_warp(const ops::CompressFusedArgs& a);
/// Whether compress_fused takes kFp8Index args `a`: d % 16 == 0, even rope_dim, and the fresh /
/// state / bias rows and the pool 16-byte aligned (the vector plan).
bool compress_fused_index_fp8_ok(const ops::CompressFusedArgs& a);

}  // namespace v4::cuda
