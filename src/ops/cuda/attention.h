// Sparse MQA attention with sink for the CUDA backend (dsv4-model.md §4), split-KV version.
//
// For query row t and head h the keys are the SWA rows of `a.swa` followed by the compressed rows
// of `a.comp` (one list of n_t keys, K = V, one latent of hd values), and
//   out[t,h] = Σ_j p_j · key_j,  p_j = exp(l_j) / (Σ_i exp(l_i) + exp(sink[h])),  l_j = q·key_j·scale.
//
// Work split: one block per (key split s, group of 16 heads, row t); 4 warps × 4 heads each. The
// block streams its key range through shared memory in tiles of 16 keys that all 16 heads reuse
// (MQA: every head reads the same keys, so a key is fetched from memory once per block instead of
// once per head). Each warp keeps its 4 heads' q and running output in registers (hd/32 values per
// lane per head) with an online softmax.
//  - n_splits == 1: the block writes the final output (sink folded into the denominator).
//  - n_splits > 1 (long key lists / few rows): the key list of every row is cut into n_splits equal
//    ranges; blocks write (max, sum, unnormalized output) partials to `workspace` and a combine
//    kernel merges them with the sink. The result of a row depends on n_splits, so callers that
//    need batch invariance choose n_splits from the row's own data only (or 1).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "ops/ops.h"

namespace v4::cuda {

/// Largest head_dim the split kernel handles (V4: 512); larger dims use the generic kernel.
constexpr int kAttnSplitMaxHd = 512;

/// Floats of workspace `sparse_attention_split` needs for (S, H, hd, n_splits) (0 if n_splits==1).
int64_t attention_workspace_floats(int64_t S, int H, int hd, int n_splits);

/// Number of splits that fills the GPU for S rows of up to `max_keys` keys each: 1 when the rows
/// alone give ≥ 2 blocks per SM, else enough splits to reach that, with ≥ 64 keys per split.
/// `heads_per_block`: 16 for sparse_attention_split, 64 for sparse_attention_mma.
int attention_auto_splits(int64_t S, int H, int64_t max_keys, int n_sms, int heads_per_block = 16);

/// Merges split partials (layout of sparse_attention_split) with the sink into a.out.
Status attention_combine(const ops::AttentionArgs& a, int n_splits, const float* workspace,
                         cudaStream_t stream);

/// Whether the tensor-core kernel handles (H, hd): hd == 512 and H a multiple of 16.
bool attention_mma_supported(int n_heads, int head_dim);

/// TF32 tensor-core version (attention_mma.cu): 64 heads per block, 8 warps (16 heads × 256
/// dims each), key tiles of 16 rows double-buffered with cp.async. TF32 rounding of q, k and p:
/// results within ~1e-3 relative of the fp32 op (not for the fp32 reference mode). Same split /
/// workspace contract as sparse_attention_split.
Status sparse_attention_mma(const ops::AttentionArgs& a, int n_splits, float* workspace,
                            cudaStream_t stream);

/// Runs the split-KV attention. `workspace` must hold attention_workspace_floats(...) floats
/// (may be nullptr when n_splits == 1). Errors: kInvalidArgument for hd > kAttnSplitMaxHd or
/// n_splits < 1; CUDA launch errors.
Status sparse_attention_split(const ops::AttentionArgs& a, int n_splits, float* workspace,
                              cudaStream_t stream);

}  // namespace v4::cuda
