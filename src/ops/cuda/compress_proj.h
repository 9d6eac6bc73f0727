// FlashCompressor's projection pass for decode-sized steps (issue 7): the compressor's two
// projections Kc = x·W_kvᵀ and Zc = x·W_gᵀ (bf16 weights [c·d, D]) in ONE kernel whose epilogue
// also refreshes the compressor-state ring, so a compressor step is this kernel plus the pooling
// kernel of compressor.h (PDL-chained) instead of five launches (two x→bf16 conversions, two
// GEMMs, the pooling). docs/cuda.md §"FlashCompressor with its projections".
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "ops/ops.h"

namespace v4::cuda {

/// How compress_proj splits one call (a function of (c·d, D, SMs) only, never of the row count
/// S, so a row's sums — and its fp32 results — are the same in every batch):
/// the 2·c·d weight rows of [W_kv; W_g] in tiles of `rows` rows (a tile never straddles the two
/// matrices), K = D split over a cluster of `ks` CTAs (`kslice` = D / ks columns each, a multiple
/// of 64); grid = tiles · ks CTAs of 256 threads (the x slice sits in shared memory, the weight
/// tile streams through a 2-stage ring of 64-column chunks; V4-Flash's shapes fit 2 CTAs per SM).
struct CompressProjPlan {
  int ks = 0;       // CTAs per cluster (K split); 0 = no plan (the caller composes instead)
  int rows = 0;     // weight rows per tile (32, 64 or 128)
  int kslice = 0;   // D / ks
  int tiles = 0;    // 2·c·d / rows
  size_t smem = 0;  // dynamic shared memory bytes (the largest of the 16 / 32 / 64-row instances)
};

/// Most x rows one compress_proj call takes (decode batches up to 64 sequences).
constexpr int64_t kCompressProjMaxRows = 64;

/// Fewest x rows for which CudaOps::compress_project picks compress_proj by default. A one-row
/// step is a pure weight stream that the composition's GEMV kernels read as fast, while
/// compress_proj's one wave of clusters takes every SM from the side stream's indexer: at batch 1
/// the composition measured the same at 4K and 0.04 ms a step faster at 900K
/// (bench/results/bench-v4flash-20l-ratio-ab-s24.md; batch 64 measured the fused kernel ahead,
/// sizes in between are not measured). V4_COMPRESS_PROJ=1 forces compress_proj at every size it
/// supports, =0 never.
constexpr int64_t kCompressProjMinRows = 2;

/// The plan for output width n = c·d and input width k = D on `num_sms` SMs: the largest ks ≤ 8
/// with D % (64·ks) == 0, then the smallest tile of 32, 64 or 128 rows whose grid fits one wave
/// (else the largest that fits shared memory); ks = 0 when none fits (n % 32 ≠ 0, D not a
/// multiple of 64, or the x slice exceeds shared memory).
CompressProjPlan plan_compress_proj(int64_t n, int64_t k, int num_sms);

/// Whether compress_proj takes these arguments: both views BF16 [c·d, D] with one expert and
/// 16-byte aligned rows, x rows 16-byte aligned (x and ldx), 1 ≤ n_fresh ≤ kCompressProjMaxRows,
/// step.ring_disjoint (the ring rows are written before the pooling reads the state), n_ring ≤ 64,
/// a step compress_fused accepts (dim, ratio, overlap, rope_dim, pool type), a plan
/// (plan_compress_proj) and a device that can place its clusters (cached occupancy query).
bool compress_proj_supported(const ops::CompressProjectArgs& a, int num_sms);

/// Kc, Zc and the ring refresh of `a` (Ops::compress_project's first half) on `stream`:
///   kc[t, :] = bf16(x[t, :]) · W_kvᵀ,  zc[t, :] = bf16(x[t, :]) · W_gᵀ   (fp32 accumulation)
///   state_kv[ring_dst[i], :] = kc[ring_src[i], :], state_gate likewise (ring_dst < 0: skipped)
/// x is rounded to bf16 (the tensor-core tolerance class of bf16 mode). Per CTA: the first
/// weight chunks are copied with cp.async BEFORE the programmatic-dependent-launch wait (weights
/// are never written by a predecessor), x's K slice (f32 → bf16) after it, chunk by chunk;
/// mma.sync m16n8k16 over shared memory; the K partials summed in a fixed order (warps in the
/// CTA, then the cluster's CTAs in rank order through distributed shared memory), each CTA
/// finishing rows/ks of the tile.
/// Errors: kUnsupported when !compress_proj_supported; launch failures. No allocation, no sync:
/// graph-capturable.
Status compress_proj(const ops::CompressProjectArgs& a, int num_sms, cudaStream_t stream);

/// Launches of the projection kernel since process start (all threads; tests check that a call
/// took the fused path).
int64_t compress_proj_launches();

/// Sets the kernels' shared-memory limits (once per device, at backend creation).
Status compress_proj_prepare();

/// Clusters of plan `p` that can be resident at once (cudaOccupancyMaxActiveClusters; −1 when
/// the query fails). For benchmarks: the grid has p.tiles clusters.
int compress_proj_max_active_clusters(const CompressProjPlan& p);

}  // namespace v4::cuda
