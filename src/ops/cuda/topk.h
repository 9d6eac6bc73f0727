// Lightning indexer scores and exact top-k row selection on the device
// (docs dsv4-model.md §6, pitfalls P19; issue 7 "Lightning TopK").
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace v4::cuda {

/// Indexer scores for R query rows:
///   score[r, s] = scale · Σ_h w[r, h] · ReLU(q[r, h, :] · K[key_begin[r] + s, :]),  s < n_keys[r]
/// q bf16 [R, nI, dI]; w f32 [R, nI] (the weights_proj output, ·nI^-1/2 applied by the caller or
/// folded into `scale`); keys bf16 [*, dI] (a row's candidates are contiguous from key_begin[r]);
/// n_keys int32 [R]; scores f32 [R, ld], entries s ≥ n_keys[r] are left untouched.
/// `max_keys` ≥ every n_keys[r] sizes the grid (host value; a graph capacity). Tensor cores are
/// used when nI and dI are multiples of 16 with nI ≤ 64 and dI ≤ 128; otherwise a plain path.
/// Errors: kInvalidArgument for bad sizes.
Status indexer_scores(const __nv_bfloat16* q, const float* w, const __nv_bfloat16* keys,
                      const int64_t* key_begin, const int32_t* n_keys, int64_t R, int nI, int dI,
                      float scale, float* scores, int64_t ld, int64_t max_keys,
                      cudaStream_t stream);

/// Largest row length top_k accepts.
constexpr int64_t kTopkMaxRow = 524288;

/// Exact top-k of each row of `scores` (f32 [R, ld]; row r has n[r] valid entries, n[r] ≤ ld).
/// Order of preference: higher score first; equal scores -> lower index first; NaN is the lowest
/// value (below −inf); −0 == +0. Output: out_idx int32 [R, k] holds the selected indices in
/// ASCENDING INDEX order (deterministic, gather-friendly); rows with n[r] < k hold 0..n[r]−1 then
/// −1 padding; out_len [R] (optional, may be nullptr) gets min(n[r], k).
/// Algorithm: radix select (12+12+8 bits) over the 32-bit order-preserving key, one
/// thread-block cluster per row whose CTAs keep their slice in registers and exchange their
/// histograms through distributed shared memory; single-CTA path for short rows (≤ 8192).
/// `max_n` (host) ≥ every n[r] picks the configuration. `variant` = 0 auto (the fastest tested
/// configuration per size on the H200), else a fixed configuration for benchmarks and tests, all
/// with 512 threads per CTA ("cluster C×I" = C CTAs, I keys per thread, rows ≤ C·512·I):
/// v1 kernel 1: 1 CTA×16, 2: 1 CTA×64, 3: cluster 8×64, 4: 16×32, 5: 16×64, 6: 8×64 without
/// warp-aggregated atomics; v2 kernel 7: 1 CTA×16, 8: 1 CTA×64, 9: 8×64, 10: 16×32,
/// 11: 16×64 (does not launch on the H200: 16 CTAs of 64K registers exceed a GPC), 12: 4×64,
/// 13: 2×64; v3 kernel (reduce-scatter histograms) 14: 2×64, 15: 4×64, 16: 8×64, 17: 16×32
/// (does not launch on the H200 either), 18: 8×32.
/// v4 kernel (CTA-local radix passes find each CTA's own k-th key T_q after a min-of-thread-max
/// pre-filter; T0 = max T_q is exchanged through DSMEM; the keys > T0 (≤ cap per CTA) are pushed
/// as (key, index) candidates; the k-th candidate is radix-selected in shared memory; 2 cluster
/// barriers instead of ~8; cap = per-CTA candidate capacity, dynamic shared memory C·cap·8 B):
/// 19: 8×64 cap 2k, 20: 8×64 cap 1.25k (both run as 8×32 for rows ≤ 131072), 21: 16×32 cap 2k
/// (non-portable cluster of 16), 22: 8×32 cap 2k, 23: 4×64 cap 2k; v4 "gather" (candidates only to
/// CTA 0, which selects and hands the result back; 3 barriers) 24: 16×32 cap 1.25k, 25: 8×32
/// cap 1.25k. Measured on the H200 (bench/results/cuda-topk.md) v4 is slower than v3: pushing
/// ~4–10K candidates over DSMEM and selecting among them costs more than the barriers it saves.
/// 26: v3 cluster 8 with keys/thread sized to the row (16/32/64). 27/28/29: v3 cluster 8/4/2,
/// sized to the row, with coalesced loads (each warp owns a contiguous slice, lanes interleaved by
/// float4; output order from warp shuffles instead of a block scan).
/// v5 kernel (one cluster barrier per radix pass: each CTA publishes its local histogram and
/// highest bin, every CTA reads only the window of bins between the row maximum and the k-th key;
/// keys < a per-CTA pre-filter bound (min over threads of the thread's max key, k ≤ 512) never
/// enter a histogram; when the threshold bin holds ≤ 2048 keys they are broadcast to every CTA and
/// selected locally; output offsets come from the window counts, no extra exchange), keys/thread
/// sized to the row, coalesced loads: 30: cluster 16 (rows ≤ 524288; auto for < 16 rows above
/// 8192 where a 16-CTA cluster can be resident), 31: cluster 8 (≤ 262144), 32: cluster 4
/// (≤ 131072), 33: as 30, launched with programmatic dependent launch (waits for the previous
/// kernel of the stream before its first global access; lets the next one launch early).
/// v6 kernel (v5's protocol, but the keys ≥ the pre-filter bound are compacted once into an
/// index-ordered shared-memory list of (key, u16 index in the CTA's slice), and the histograms,
/// candidates and the output run over that list instead of every register key; dynamic shared
/// memory 512·I·6 B), keys/thread sized to the row, I ≤ 32: 34: cluster 16 (rows ≤ 262144),
/// 35: as 34 with programmatic dependent launch, 36: cluster 8 (rows ≤ 131072), 37: as 34 without
/// the warp merging of equal digits before the histogram atomics (A/B).
/// v7 kernel (v6 with the window walk done by one warp — lane g reads 4-bin group g from every
/// CTA, one block barrier per pass instead of one per step plus 16 redundant scans —, plain list-
/// histogram atomics, register keys without validity tests when the warp's slice is whole and
/// fills ITEMS), cluster 16, rows ≤ 262144, keys/thread sized to the row: 38: 512 threads
/// (I ≤ 32), 39: 38 with programmatic dependent launch, 40: 256 threads (I ≤ 64; pre-filter bound
/// = min over threads of each thread's second largest key, valid for k ≤ 512), 41: 40 with
/// programmatic dependent launch, 42: cluster 8 × 256 threads (rows ≤ 131072). Not in auto (the
/// lead sets it from measurements).
/// v8 kernel (v6's protocol on a much shorter list: a row-wide pre-filter bound T from one
/// cluster exchange of per-group maxima — groups of 1…32 threads, the largest group size whose
/// non-empty groups number ≥ k —, float compares against T instead of a key conversion per key,
/// NaN-padded slices, compaction from a per-thread bit mask; ~1.2% of N(0,1) keys enter the list at
/// 262,144 → 512 against ~19% in v6; dynamic shared memory 512·I·10 B), keys/thread sized to the
/// row, I ≤ 32: 46: cluster 16 (rows ≤ 262144), 47: 46 with programmatic dependent launch, 48:
/// cluster 8 (rows ≤ 131072). Not in auto (the lead sets it from measurements).
/// 43: 37 launched with programmatic dependent launch (the PDL form auto picks for 37); 44 / 45:
/// v2 single CTA (7 / 8) with programmatic dependent launch.
/// `pdl` (auto only, variant = 0): launch the auto choice in its PDL form where it has one (7 →
/// 44, 8 → 45, 37 → 43, 30 → 33; the others launch plainly): the kernel may be scheduled while
/// the previous kernel of `stream` runs, waits for it (griddepcontrol.wait: completed, memory visible) before its
/// first global access, and lets the next kernel launch early (which must itself wait before
/// reading out_idx). Same results bit for bit. Ignored for a fixed variant.
/// A variant whose cluster cannot be resident (cudaOccupancyMaxActiveClusters = 0), or whose
/// candidate buffer would not fit (v4 with large k), returns kUnsupported.
/// Errors: kInvalidArgument (k < 1, max_n > kTopkMaxRow or too large for the variant),
/// kUnsupported (above).
Status topk_rows(const float* scores, int64_t ld, const int32_t* n, int64_t R, int k,
                 int64_t max_n, int32_t* out_idx, int32_t* out_len, cudaStream_t stream,
                 int variant = 0, bool pdl = false);

/// topk_rows (auto) with the selection mapped through a row map: the indexer's finalize fused
/// into the top-k's output stage. For row r with n[r] candidates:
///   out_rows[r·k + e] = map_rows[map_offset[r] + sel_e] for e < min(n[r], k), −1 after;
///   out_count[r] = min(n[r], k) (out_count may be null),
/// where sel_e are the indices topk_rows returns (same order, same ties). Shapes: scores [R, ld]
/// f32, n [R], map_offset [R] (int64), map_rows int32 (each row's n[r] entries from its offset),
/// out_rows [R, k] int32. Only where auto takes v8 (R < 16, 8,192 < max_n ≤ 262,144, v8 not
/// switched off by V4_TOPK_V8=0) and V4_TOPK_FUSE_MAP is not 0: otherwise kUnsupported, and the
/// caller runs topk_rows plus its own mapping (nothing was launched). `pdl` as topk_rows.
/// Errors: kInvalidArgument (null map / output, k < 1, max_n > ld or kTopkMaxRow), kUnsupported
/// (above, or a 16-CTA cluster cannot be resident).
Status topk_rows_mapped(const float* scores, int64_t ld, const int32_t* n, int64_t R, int k,
                        int64_t max_n, const int32_t* map_rows, const int64_t* map_offset,
                        int32_t* out_rows, int32_t* out_count, cudaStream_t stream,
                        bool pdl = false);

/// Debug aid: clock64() stamps (SM cycles) recorded by thread 0 of CTA 0 of row 0 at fixed points
/// of the last v3–v6 launch (see TOPK_TS in topk.cu), 16 entries; the stamps are cleared after
/// reading, so ones the last launch did not reach read 0. Only in builds with -DV4_TOPK_PHASES=1;
/// otherwise kUnsupported.
Status topk_phase_cycles(long long* cycles16);

/// Baseline for benchmarks: full descending segmented sort of (score, index) pairs with CUB
/// (cub::DeviceSegmentedSort) of R rows of equal length n; the first k values of each row of
/// `idx_sorted` [R, n] are the top-k (ties in no guaranteed order). `temp`/`temp_bytes`: query with
/// temp == nullptr first (like CUB). keys_tmp f32 [R, n] (sorted keys) and idx_in int32 [R, n]
/// are scratch. Rows are contiguous (ld = n).
Status topk_cub_sort_baseline(const float* scores, int64_t R, int64_t n, float* keys_tmp,
                              int32_t* idx_in, int32_t* idx_sorted, void* temp,
                              size_t* temp_bytes, cudaStream_t stream);

}  // namespace v4::cuda
