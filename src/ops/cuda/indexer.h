// Lightning indexer scores on tensor cores over paged f32 key pools (dsv4-model.md §6):
//   score[t, s] = Σ_h ReLU(q[t,h] · K[cand_t[s]]) · dI^-1/2 · w[t,h] · nI^-1/2,  s < count[t]
// with q and keys rounded to bf16 (fp32 accumulate; fp8 keys: q's per-head e4m3 codes and the key
// codes, exact, IndexerArgs) — the bf16 tolerance applies, so the CUDA backend uses this only when
// batch invariance / fp32 results are not required.
//
// Three kernels: the decode kernel (≤ 128 rows, nI = 64, dI = 128; described at
// indexer_scores_tc), the prefill warpgroup-MMA kernel (> 128 rows, nI = 64, dI = 128, bf16 / fp8
// keys: indexer_prefill_wg, indexer_prefill.cu) and the WMMA kernel (any supported dims: the
// other shapes and f32 keys). WMMA kernel: blocks take groups of 4
// consecutive query rows; when the 4 rows share one candidate list (rows
// of one sequence's prefill chunk: same RowMap offset), every key tile is loaded once for all of
// them (a [4·nI, dI] × [dI, 64] product per tile), otherwise row by row. Key tiles of 64 candidates
// are gathered through the row map, converted to bf16 in shared memory, multiplied with WMMA
// 16×16×16 bf16 fragments, and reduced over heads in a fixed order (h = 0..nI−1).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "ops/ops.h"

namespace v4::cuda {

/// Auto (variant 0) runs the decode kernel for calls of at most this many query rows.
inline constexpr int64_t kIndexerDecodeMaxRows = 128;
/// Largest `variant` of `indexer_scores_tc`.
inline constexpr int kIndexerScoresMaxVariant = 30;
/// `indexer_scores_tc` variant that forces the prefill warpgroup-MMA kernel (indexer_prefill_wg).
inline constexpr int kIndexerPrefillWgVariant = 27;
/// The same kernel with fp8 keys multiplied on e4m3 wgmma (q's codes × the key codes; the tensor
/// cores' fp8 accumulation, not fp32) instead of converted to bf16 (bf16 keys: = 27).
inline constexpr int kIndexerPrefillWgE4m3Variant = 28;
/// The same kernel with fp8 codes loaded into registers one tile ahead and converted into the
/// other of two bf16 tile slots during the current tile's wgmma: auto's fp8 mode since session 18
/// (13–17% faster than 27's shared-memory conversion on the H200, the same bits; bf16 keys: = 27).
inline constexpr int kIndexerPrefillWgRegVariant = 29;
/// Decode kernel for fp8 keys moving whole pages of key rows by cp.async.bulk (64 consecutive
/// pool rows in one 9,216-byte copy; other tiles row by row) and multiplying the code values on
/// f16 wgmma (keys = M, A from registers): the same products as variant 24, another fp32
/// summation order. bf16 / f32 keys run the default.
inline constexpr int kIndexerBulkVariant = 30;
/// Auto (variant 0) takes variant 30 for fp8 keys in calls of at most kIndexerBulkMaxRows rows
/// whose count bound is at least kIndexerBulkMinCount or at most kIndexerBulkMaxShort
/// (V4_INDEXER_BULK=0: never); variant 24 otherwise (measured at batch 1 only).
inline constexpr int64_t kIndexerBulkMinCount = 196608, kIndexerBulkMaxShort = 4096,
                         kIndexerBulkMaxRows = 4;
/// indexer_prefill_wg's fp8 modes: codes converted to bf16 in shared memory (variant 27), e4m3
/// wgmma (28), codes converted from registers (29, auto's default).
inline constexpr int kPrefillFp8Convert = 0, kPrefillFp8E4m3 = 1, kPrefillFp8Registers = 2;
/// Largest pipelined (cp.async ring) variant: 4 … this give the decode kernel's scores bit for bit.
inline constexpr int kIndexerPipeMaxVariant = 7;

/// Whether the prefill warpgroup-MMA kernel handles `a`: nI = 64, dI = 128, bf16 or kFp8Index
/// keys, ≤ 4·65535 rows, q and key_pool 16-byte aligned.
bool indexer_prefill_wg_supported(const ops::IndexerArgs& a);

/// Whether auto (variant 0) takes the prefill kernel: more than kIndexerDecodeMaxRows rows,
/// indexer_prefill_wg_supported, and V4_INDEXER_PREFILL_WG is not "0" (A/B switch, read once).
bool indexer_prefill_wg_auto(const ops::IndexerArgs& a);

/// Whether auto runs fp8 keys on e4m3 wgmma (V4_INDEXER_PREFILL_FP8=e4m3, read once; default:
/// codes converted to bf16 from registers (variant 29), exact products and fp32 sums).
bool indexer_prefill_wg_auto_e4m3();

/// Prefill scores (indexer_prefill.cu), the same contract as `indexer_scores_tc`: score[t, s] for
/// s < count[t] into `scores` (f32 [S, ld]), other entries untouched. CTAs of 2 warpgroups take 4
/// consecutive rows; rows with the same RowMap offset (one sequence's chunk) share every 64-key
/// tile, gathered by cp.async into the 128-byte-swizzle layout and multiplied with keys = M,
/// 2 rows × 64 heads = N, dims = K: bf16 keys by wgmma.m64n128k16 on bf16 q; fp8 keys: q's
/// per-head e4m3 codes (kvfp8::index_query_fp8) × the key codes, converted to their exact bf16
/// values in shared memory, on bf16 wgmma (`fp8_mode` kPrefillFp8Convert, or kPrefillFp8Registers:
/// converted from registers one tile ahead), or on wgmma.m64n128k32 e4m3 (kPrefillFp8E4m3: no
/// conversion; the tensor cores' fp8 accumulation); a group with different lists runs one pass per row. Σ_h ReLU(q_h·k)·w_h in fp32 in a
/// fixed order (grid-independent). Errors: kInvalidArgument when !indexer_prefill_wg_supported;
/// launch failures. No allocation, no sync.
Status indexer_prefill_wg(const ops::IndexerArgs& a, int64_t max_count, float* scores, int64_t ld,
                          int n_sms, cudaStream_t stream, int fp8_mode = kPrefillFp8Convert);

/// Whether `indexer_scores_tc` handles (nI, dI): multiples of 16, nI ≤ 128, dI ≤ 256.
bool indexer_tc_supported(int n_heads, int head_dim);

/// Whether the decode kernel handles `a`: nI = 64, dI = 128 (V4-Flash / V4-Pro indexer),
/// 1 ≤ S ≤ 65535 rows, q and key_pool 16-byte aligned.
bool indexer_decode_supported(const ops::IndexerArgs& a);

/// Writes score[t, s] for s < a.cand.count[t] into `scores` (f32 [S, ld]); other entries are
/// untouched. `max_count` ≥ every count (host bound; sizes the grid). `n_sms`: SMs of the device
/// (grid sizing). `variant`: 0 auto — the decode kernel (below; bf16 keys with S ≥ 16 rows: its
/// bit-identical pipelined form, variant 5) for S ≤ 128 rows when
/// `indexer_decode_supported` (and V4_INDEXER_DECODE is not "0"), the prefill kernel (variant 27)
/// for S > 128 rows when `indexer_prefill_wg_auto`, else the WMMA kernel (one
/// query row per group for S ≤ 64, 4 rows sharing key tiles above); 1 the WMMA kernel only (the
/// previous decode path, for benchmarks); 2 the decode kernel only (bf16 / fp8 keys: 16-key
/// chunks; f32: the default 16); 3 the decode kernel with 32-key chunks (f32 keys; bf16 / fp8:
/// their default 32); 4–7 the pipelined decode kernel (bf16 / fp8 keys; f32 keys run the decode
/// kernel's default): 32-key chunks streamed by cp.async through a per-warp ring of 3 (4), 2 (5)
/// or 4 (6) chunk slots in shared memory, fp8 codes converted by bit moves + one bf16x2 multiply;
/// 7 = 4 with fp8 keys converted as the decode kernel does (A/B of the conversion). Variants 2–7
/// give bit-identical scores for a key format (same math and summation order). 8 / 9 (bf16 keys;
/// fp8 / f32 keys run the decode kernel's default): the warpgroup-MMA decode kernel — one
/// wgmma.m64n64k16 per k-step over all 64 heads × a 64-key tile from shared memory, key tiles
/// gathered by cp.async through a ring of 4 (8) or 3 (9) tiles per 128-thread CTA; scores equal
/// the decode kernel's up to fp32 rounding (another summation order), never chosen by auto.
/// 10 / 11 / 12 (bf16 keys): the warpgroup-MMA kernel with keys on M (A = a 64-key tile, B = Q:
/// each warp owns 16 whole keys, no cross-warp head sums, one barrier a tile) and a ring of 4 /
/// 3 / 2 tiles; equal to the decode kernel's scores up to fp32 rounding. 13 / 14: the decode
/// kernel (default chunk per key format) compiled for ≥ 4 / 5 resident blocks per SM (fewer
/// registers, more warps in flight); bit-identical to variant 3 (bf16 / fp8) / 2 (f32).
/// 15 / 16 (bf16 keys; fp8 / f32 keys run the default): the pipelined kernel (2 / 3 ring slots)
/// copying whole 256-byte key rows per warp instruction into a row-major, XOR-swizzled slot
/// (instead of 8 rows × 64 bytes), fragments read across lanes after a __syncwarp;
/// bit-identical to the decode kernel (same B values, same mma order). 17 / 18: 15 / 16 with
/// 16-key chunks (4 KB slots: 4 / 3 CTAs an SM; 22.6 / 24.1 µs vs 23.5 at 230,400 keys, not
/// chosen by auto). 19 / 20 / 21 (fp8 keys; auto runs 20): the decode kernel on e4m3 tensor cores
/// — q's per-head e4m3 codes (IndexerArgs: fp8 keys score a per-head quantized q) × the key codes
/// with mma.m16n8k32.e4m3, no code conversion; the scores equal the bf16-converting fp8 kernels'
/// (variants 2–7, 13, 14) up to fp32 rounding; compiled for ≥ 1 / 3 / 4 resident blocks an SM.
/// bf16 / f32 keys: 19–21 run the default. 27 (kIndexerPrefillWgVariant): the prefill
/// warpgroup-MMA kernel (indexer_prefill_wg; bf16 / fp8 keys, nI = 64, dI = 128; other
/// arguments run auto; 28: fp8 keys on e4m3 wgmma, kIndexerPrefillWgE4m3Variant) — auto takes it for S > 128 rows when indexer_prefill_wg_auto, before the
/// WMMA kernel (which stays for other shapes and f32 keys).
/// No host sync, no allocation
/// (graph-capturable). Errors: kInvalidArgument for unsupported dims / variant, launch errors.
///
/// Decode path: blocks of 4 warps per query row, spread over one wave of the GPU; each warp
/// takes chunks of 16 candidates, loads their f32 key rows straight into mma B registers (one
/// 16-byte load per lane per 16 dims: the k dimension is permuted inside each k-step, the same
/// way for q, so no shared-memory staging of keys and no block barrier in the loop), q is packed
/// once per block into shared memory as A fragments, bf16 m16n8k16 mma.sync with fp32
/// accumulation, then ReLU·w per head and a fixed shuffle tree over heads.
///
/// `pdl` (decode kernel only; the WMMA kernel ignores it): launched with programmatic dependent
/// launch — the kernel may be scheduled while the previous kernel of `stream` still runs and
/// waits for it (griddepcontrol.wait) before its first global access, then triggers its
/// dependents at once (a PDL-launched consumer must wait before reading the scores). Same
/// scores bit for bit.
Status indexer_scores_tc(const ops::IndexerArgs& a, int64_t max_count, float* scores, int64_t ld,
                         int n_sms, cudaStream_t stream, int variant = 0, bool pdl = false);

/// Diagnostics only (CudaIndexerWg.DescriptorStrideDiagnostic; not thread-safe, process-wide):
/// variants 8 / 9 launch with the LBO and SBO fields of their wgmma shared-memory descriptors
/// exchanged while `swap` is set (default false: the PTX ISA reading, docs/cuda.md).
void indexer_wg_set_desc_swap(bool swap);

/// Diagnostics (bench_kernels --probe-indexer-gather): how the gather probe reads.
/// blocks_per_sm: 0 = the decode kernel's grid (one wave at the decode kernel's occupancy), else
/// that many CTAs an SM (capped by the probe's own occupancy). depth: chunks in flight per warp
/// (1 = as the decode kernel, 2 = two chunks issued together). half_rows: read only the first
/// 128 bytes of every 256-byte row (same rows, half the bytes: rows-bound vs bytes-bound).
/// whole_rows: each 16-byte-per-lane load covers two whole rows (lanes 0–15 one row, 16–31 the
/// next: 2 × 256 contiguous bytes) instead of the decode kernel's 8 rows × 64 bytes (depth and
/// half_rows ignored).
struct GatherProbeOptions {
  int blocks_per_sm = 0;
  int depth = 1;
  bool half_rows = false;
  bool whole_rows = false;
};

/// Diagnostics (bench_kernels --probe-indexer-gather): the memory side of the decode kernel
/// alone. Reads every candidate key row of a **bf16** key pool exactly as the decode kernel's
/// lanes do for bf16 keys (by default the same grid — one wave sized by the decode kernel's
/// occupancy — same 32-key chunks per warp, grid-strided, candidate rows one chunk ahead, 16-byte
/// non-caching loads of dims 32u + 8t … of key 8j + g; `o` varies grid, depth and bytes) but
/// without the math: XORs the loaded words and writes one u32 per thread to `sink` (at least
/// `indexer_gather_probe_sink_words` entries). Errors: kInvalidArgument for a non-bf16 pool,
/// dims other than nI = 64, dI = 128, or bad options; launch errors.
Status indexer_gather_probe(const ops::IndexerArgs& a, int64_t max_count, uint32_t* sink,
                            int n_sms, cudaStream_t stream, const GatherProbeOptions& o = {});
/// Entries of `sink` indexer_gather_probe writes for `a` (rows × grid blocks × 128).
int64_t indexer_gather_probe_sink_words(const ops::IndexerArgs& a, int64_t max_count, int n_sms,
                                        const GatherProbeOptions& o = {});

/// Diagnostics: a plain contiguous read of `bytes` (multiple of 16, 16-byte aligned `p`) by
/// n_sms · blocks_per_sm CTAs of 256 threads, grid-strided, four 16-byte non-caching loads in
/// flight per thread; XORs into one u32 per thread of `sink` (read_probe_sink_words entries).
/// The achievable read time of that many bytes in one kernel (ramp and tail included).
Status read_probe(const void* p, int64_t bytes, uint32_t* sink, int n_sms, int blocks_per_sm,
                  cudaStream_t stream);
int64_t read_probe_sink_words(int n_sms, int blocks_per_sm);

}  // namespace v4::cuda
