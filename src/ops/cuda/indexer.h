// Lightning indexer scores on tensor cores over paged f32 key pools (dsv4-model.md §6):
//   score[t, s] = Σ_h ReLU(q[t,h] · K[cand_t[s]]) · dI^-1/2 · w[t,h] · nI^-1/2,  s < count[t]
// with q and keys rounded to bf16 (fp32 accumulate) — the bf16 tolerance applies, so the CUDA
// backend uses this only when batch invariance / fp32 results are not required.
//
// Blocks take groups of 4 consecutive query rows; when the 4 rows share one candidate list (rows
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

/// Whether `indexer_scores_tc` handles (nI, dI): multiples of 16, nI ≤ 128, dI ≤ 256.
bool indexer_tc_supported(int n_heads, int head_dim);

/// Writes score[t, s] for s < a.cand.count[t] into `scores` (f32 [S, ld]); other entries are
/// untouched. `max_count` ≥ every count (host bound; sizes the grid). Errors: kInvalidArgument
/// for unsupported dims, kInternal for launch failures.
Status indexer_scores_tc(const ops::IndexerArgs& a, int64_t max_count, float* scores, int64_t ld,
                         int n_sms, cudaStream_t stream);

}  // namespace v4::cuda
