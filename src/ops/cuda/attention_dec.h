// Decode sparse MQA attention with sink at the byte floor (bf16 mma.sync, attention_dec.cu).
//
// Same contract as ops::Ops::sparse_attention (ops.h AttentionArgs, dsv4-model.md §4) for
// head_dim 512 and any number of heads (64 per thread block; V4-Flash 64, V4-Pro 128):
//   out[t,h] = Σ_j p_j · key_j,  p_j = exp(l_j) / (Σ_i exp(l_i) + exp(sink[h])),  l_j = q·key_j·scale.
//
// Work split: one block per (query row t, key split s, group of 64 heads); 8 warps, warp w owns
// heads 16·(w/2) .. +15 and dims 256·(w%2) .. +255. The block streams its key range in tiles of
// 32 keys: f32 pool rows are staged by cp.async two tiles ahead (128 KiB in flight per SM),
// converted once to a bf16 tile, then
//   1. S_half = Q[16 heads, my 256 dims] · K[32 keys, my 256 dims]ᵀ  (bf16 m16n8k16, Q held in
//      shared memory as bf16, 64 KiB); the two dim halves add their partial S through shared
//      memory (both warps of a head group then hold the same S);
//   2. online softmax per head in registers (fp32);
//   3. O[16 heads, my 256 dims] += P · V with P taken straight from the S accumulators (bf16)
//      and V = the same bf16 key tile (K = V), read transposed by ldmatrix.
// bf16 rounding of q, k and p (fp32 accumulate, fp32 softmax): results within ~4e-3 of the
// fp32 op's max |out| (bf16 mode only; fp32 mode keeps the batch-invariant kernels).
// Splits: the keys of a row are cut into n_splits ranges of whole tiles; with n_splits > 1 the
// blocks write (max, sum, unnormalized output) partials to `workspace` (attention.h layout) and
// a combine kernel (one block per row, head and 128 dims) merges them with the sink (variant 2:
// launched with PDL). No host sync, no allocation: graph-capturable.
// Variants (A/B, V4_ATTN_DEC=1): v1 stages pool rows in two buffers and converts each tile to
// bf16 (4 barriers per tile); v2 (default; bf16 pools) cp.asyncs bf16 rows straight into a ring
// of 4 padded bf16 tiles (3 in flight, 2 barriers per tile). f32 pools always take the v1 body.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "ops/ops.h"

namespace v4::cuda {

/// Keys per tile of the decode kernel (a split holds a whole number of tiles).
constexpr int kAttnDecTileKeys = 32;

/// Whether sparse_attention_dec handles (H, hd): hd == 512 and H ≥ 1.
bool attention_dec_supported(int n_heads, int head_dim);

/// Split count for S rows of up to `max_keys` keys on `n_sms` SMs (one block per SM resident),
/// from a byte-cost model: per block, its key tiles (kv_bytes bytes per pool element: 4 = f32,
/// 2 = bf16; others count as 4) + q + output or partial, per wave, with one SM running at most
/// 1.25× its fair share of bandwidth and a tile's math taking at least as long as a 48 KiB read
/// at that share (so bf16 blocks are math-bound); split: + the combine's read of the partials
/// and one more launch. Returns 1 for max_keys ≤ 0 (unknown) or ≤ one tile. Result in [1, 128].
int attention_dec_splits(int64_t S, int H, int64_t max_keys, int n_sms, int kv_bytes = 4);

/// Split count of variants 3 / 4 (`heads_per_cta` 32 / 16) for S rows of up to `max_keys`
/// keys: as many splits as fill one wave of n_sms CTAs (S · ⌈H / heads_per_cta⌉ CTAs per split),
/// at most one per tile and 128, balanced so every split of a max_keys row gets whole tiles.
/// Returns 1 for max_keys ≤ one tile (or unknown). Result in [1, 128].
int attention_dec3_splits(int64_t S, int H, int64_t max_keys, int n_sms, int heads_per_cta);

/// Split count of variant 5 (16 heads per CTA) for S rows of up to `max_keys` keys on n_sms
/// SMs: the count of whole-tile splits (≤ one per tile, ≤ 128) with the least modelled critical
/// path — waves · tiles per split · ~1 µs, plus the combine launch (~4.5 µs) when split, or a
/// cluster merge (~0.6 µs) when 2 ≤ splits ≤ max_cluster (attention_dec5_max_cluster; 0: none).
/// `variant` 6 models its cheaper tiles (~0.6 µs instead of ~1; to be re-fit on the H200).
/// Returns 1 for max_keys ≤ one tile (or unknown). Result in [1, 128].
int attention_dec5_splits(int64_t S, int H, int64_t max_keys, int n_sms, int max_cluster,
                          int variant = 5);

/// Split count of variants 7 / 8 (64 heads per CTA, `keys_per_tile` 64 / 32) for S rows of up
/// to `max_keys` keys on n_sms SMs: the whole-tile split count (≤ one per tile, ≤ 128) with the
/// least modelled critical path — waves · tiles per split · a tile's time, plus, when split, the
/// combine launch, a CTA's partial write and the combine's read of all partials — or, for
/// 2 ≤ splits ≤ max_cluster (variants 11 … 14: attention_dec11_max_cluster), the merge inside a
/// thread block cluster (~1.5 µs). Returns 1 for max_keys ≤ one tile (or unknown). Result in
/// [1, 128].
int attention_dec7_splits(int64_t S, int H, int64_t max_keys, int n_sms, int keys_per_tile = 64,
                          int max_cluster = 0);

/// Largest split count (≤ 8) that variant `variant` (11 … 14) merges inside a thread block
/// cluster on this device (its cluster of one 200+ KiB CTA per SM can be resident); 0 for other
/// variants or with V4_ATTN_DEC_CLUSTER=0. Queries the device once per variant and process.
int attention_dec11_max_cluster(int variant);

/// Keys per tile of warpgroup-MMA variant `variant` (7 … 14): 32 for 8 / 10 / 12, 48 for 13, else
/// 64 — the keys_per_tile argument of attention_dec7_splits.
int attention_dec7_tile_keys(int variant);

/// The attention_dec variant CudaOps takes for a call when CudaOptions::attention_dec_variant is
/// 0 (auto).
/// From bench/results/cuda-attention.md (H200, session 7, 64 heads, bf16 pools): at batch 1
/// variant 4 (16 heads per block) takes 9.8 µs for CSA (v2 18.6, v5 10.7) and 9.0 for HCA at 4K
/// (v2 15.4); with long key lists variant 5 (key rows preloaded, cluster merge) is fastest
/// (HCA 1M, 8,320 keys: v5 24.3 µs, v3 25.5, v4 28.3, v2 31.4); at batch 64 variant 2 is
/// fastest or within 1 % end to end (bench/results/bench-v4flash-20l-attn-b64.md), v4 2× slower
/// per kernel. rows = query rows of the call (batch × tokens per sequence); max_keys = longest
/// key list (0 = unknown). lean (CudaOptions::attention_dec_lean, the default; V4_ATTN_DEC_LEAN=0
/// turns it off): variant 6 (variant 5 with fewer instructions per tile) for every call of ≤ 4
/// rows — faster than variant 4 on CSA (9.2 vs 9.8 µs) and short HCA rows (8.6 vs 8.7 at 4K, 10.5
/// vs 12.3 at 128K) and than variant 5 on HCA 1M (18.7 vs 24.1), cuda-attention.md at 309d01f;
/// in the step once attention_dec5_splits' variant-6 model was re-fit (session 9). Calls of more
/// rows take variant 11 (warp-specialized warpgroup MMA; bf16 pools, others run variant 2
/// inside), the fastest kernel at batch 64 for every key count measured
/// (bench/results/cuda-attention-wg-ws.md, session 15): HCA 1M (8,320 keys) 225 µs against
/// variant 9's 252, variant 7's 361 (cuda-attention-wg-swizzle.md) and variant 2's 421; CSA 640
/// keys 36.7 against 47.6 (v9) and 51.5 (v2); HCA 1,152 keys 63.7 against 71.9 / 76.9; HCA 160
/// keys 18.7 against 22.1 / 27.7. Prefill chunks (more rows) take it too.
int attention_dec_auto_variant(int64_t rows, int64_t max_keys, bool lean);

/// Largest split count (≤ 16) whose thread block cluster of variant-5 (`variant` 5) or
/// variant-6 (6) CTAs can be resident on the current device for pools of `kv_dtype` (f32 /
/// bf16; others 0), 0 when none can or when V4_ATTN_DEC_CLUSTER=0. Queries the device once per
/// size, variant and process (CUDA runtime calls).
int attention_dec5_max_cluster(KvDtype kv_dtype, int variant = 5);

/// Runs the decode kernel (and the combine when n_splits > 1). `workspace` must hold
/// attention_workspace_floats(S, H, 512, n_splits) floats (attention.h; may be nullptr when
/// n_splits == 1). Works for any S (prefill rows: one block per row and split), each row its own
/// key list. `variant`: 2 (default: bf16 pools stream into a ring of bf16 tiles, f32 pools run
/// the v1 body; PDL launches, V4_ATTN_DEC_PDL=0 turns them off) or 1 (the session-5 kernel,
/// plain launches; CudaOptions::attention_dec_variant, V4_ATTN_DEC=1); same math, same results.
/// Variants 3 / 4 (issue 7, batch 1; V4_ATTN_DEC=3 / 4; split counts: attention_dec3_splits):
/// the v2 ring kernel with 32 / 16 heads per block instead of 64 (smaller Q staging, tile math
/// and partials per block, so short rows spread over more SMs), f32 and bf16 pools (f32 rows
/// loaded and converted by the threads; fp8 pools run variant 2), the combine kernel (PDL) when
/// split; same math per head (within rounding of the partial-S summation order).
/// Variant 5 (issue 7, batch 1; V4_ATTN_DEC=5; split counts: attention_dec5_splits): 16 heads
/// per CTA with the split's key rows (≤ 1,024 keys) preloaded into shared memory in one pass, QK
/// split over keys (Q in registers, 4 KiB S exchange) and, for 2–16 splits, the partials merged
/// inside a thread block cluster (distributed shared memory; no workspace writes, no combine
/// launch; V4_ATTN_DEC_CLUSTER=0 or a cluster that cannot be resident: the combine kernel).
/// f32 and bf16 pools (fp8: variant 2); within rounding of variant 4 (another partial-S order).
/// Variant 6 (issue 7; V4_ATTN_DEC=6; splits: attention_dec5_splits(..., 6), clusters:
/// attention_dec5_max_cluster(kv, 6)): variant 5 with fewer instructions per tile — logits in
/// log2 units with ex2.approx.ftz, lazy rescale (the reference max moves only when a row's tile
/// max exceeds it by > 8 in log2 units), per-thread l, key masks as register ballots applied
/// only to tiles with a masked key, shuffled source pointers in the bf16 issue; the same
/// (m, l, o) partials, within f32 / bf16 rounding of variant 5.
/// Variants 7 / 8 (issue 7; V4_ATTN_DEC=7 / 8; splits: attention_dec7_splits(..., 64 / 32)):
/// warpgroup MMA (wgmma) with 64 heads per CTA of 2 warpgroups — QK from shared-memory operands
/// (each warpgroup half of the dims, partial S summed through shared memory), variant 6's lazy
/// log2 softmax, P·V as m64n256k16 with P from registers; 64- / 32-key tiles in a 2- / 4-deep
/// cp.async ring; bf16 pools only (others run variant 2); the combine kernel when split. Within
/// bf16 rounding of variant 6 (the same p up to the lazy reference and fp32 order).
/// Variants 9 / 10 (V4_ATTN_DEC=9 / 10; splits as 7 / 8): variants 7 / 8 with Q and the key
/// tiles in the 128-byte-swizzle operand layout (a key row's 64-dim blocks in 128-byte lines)
/// instead of 8 × 16-byte core matrices; the same products in the same order (bit-identical to
/// 7 / 8).
/// Variants 11 / 12 (V4_ATTN_DEC=11 / 12; splits as 7 / 8; attention_dec_ws.cuh): warp-
/// specialized, in FlashMLA's shape — warpgroup 0 computes S over all 512 dims, the softmax and
/// P·V of dims 0–255 (P from registers); warpgroup 1 copies the key rows (cp.async into an
/// mbarrier ring of 2 × 64 / 4 × 32 keys; an L2 prefetch of later rows is an A/B option,
/// set_attention_dec11_prefetch) and computes P·V of dims 256–511 with P from shared memory.
/// bf16 pools only (others run variant 2); within bf16 rounding of variant 6.
/// Variant 13 (V4_ATTN_DEC=13; splits: attention_dec7_splits(..., 48)): variant 11 with 48-key
/// tiles in a 3-slot ring (96 KiB of key rows in flight while one tile is computed on, against
/// 64 KiB), wgmma m64n48k16 for QK.
/// Variant 14 (V4_ATTN_DEC=14; splits: attention_dec7_splits(..., 64), merge as 11;
/// attention_dec_tr.cuh): one bulk copy (cp.async.bulk) per whole key row into rows of 1,040
/// bytes, K and V as the register (A) operand loaded by ldmatrix, the products transposed (Sᵀ =
/// K·Qᵀ, Oᵀ += Vᵀ·Pᵀ), the per-head softmax across the 4 warps of warpgroup 0 through shared
/// memory; within bf16 rounding of variant 11.
/// Errors: kInvalidArgument for unsupported (H, hd), n_splits outside [1, 256], a missing
/// workspace, another variant; kUnsupported for a KV dtype other than f32 / bf16; CUDA launch
/// errors.
Status sparse_attention_dec(const ops::AttentionArgs& a, int n_splits, float* workspace,
                            cudaStream_t stream, int variant = 2);

/// Diagnostic of variants 7 … 13 for bench_kernels (never set by the engine): `mode` 0 normal,
/// 1 the kernels skip their key-row copies (tiles of zeros: compute and pipeline only), 2 they
/// skip their wgmma instructions (copies, barriers and softmax only). Process-wide (a
/// __constant__); the outputs are wrong in modes 1 / 2. Errors: kInvalidArgument for another
/// mode; CUDA errors.
Status set_attention_dec7_diag(int mode);

/// L2 prefetch distance of variants 11 … 13 (bench A/B; default 0): warpgroup 1 prefetches
/// (cp.async.bulk.prefetch.L2) the key rows `tiles` tiles beyond the one it copies into shared
/// memory; 0 turns it off. Process-wide (a __constant__). Errors: kInvalidArgument outside
/// [0, 2]; CUDA errors.
Status set_attention_dec11_prefetch(int tiles);

/// Key-row gather probe (bench_kernels --probe-attention-gather; never run by the engine):
/// variant 11's 64-key ring without any math, `ctas` CTAs of 256 threads (warpgroup 1 copies,
/// warpgroup 0 waits for each slot and frees it), over `n_tiles` tiles of 64 rows of the bf16
/// pool (pool_rows × 512), row ids rows[tile · 64 + key] (n_tiles · 64 of them, each < pool_rows).
/// `mode`: 0 cp.async 16 B a lane into the swizzled operand layout (variant 11's copies), 1 TMA
/// 2-D boxes of 128 B (8 per row) into the same layout with 256-byte L2 promotion, 2 the same
/// without promotion, 3 a 1 KiB bulk copy per row (contiguous), 4 a TMA 3-D box of a whole row;
/// `stages` 2 or 3 slots of 64 KiB. With `check` every CTA adds a position-weighted hash of the
/// bytes it received, at their logical (row, 16-byte piece) places, to *sink: the same rows give
/// the same sum in every mode, stage count and grid. Errors: kInvalidArgument for bad arguments;
/// the tensor-map encoder's errors (tma.h); CUDA launch errors.
Status attention_gather_probe(const void* pool, int64_t pool_rows, const int32_t* rows,
                              int64_t n_tiles, int mode, int stages, int ctas, uint32_t* sink,
                              bool check, cudaStream_t stream);

}  // namespace v4::cuda
