// What one engine step must move and compute, for the floors `v4serve bench` prints next to each
// measured time (performance.md "Count first"): bytes a decode step reads (divided by the measured
// copy bandwidth: the byte floor) and FLOPs a prefill step runs (divided by a dense peak: the
// FLOP floor). Counted from the config and the weights as stored on the backend.
#pragma once
#include <cstdint>

#include "model/config.h"
#include "model/weights.h"

namespace v4::model {

/// Bytes one decode step of `batch` sequences at context `context` must read at least.
struct DecodeBytes {
  /// Every matrix except routed experts and lm_head, in its stored format (attention
  /// wq_a/wq_b/wkv/wo_a/wo_b, compressor and indexer matrices, shared expert), the f32 router
  /// gate and mHC fn of every layer, HyperHead fn, and the batch's embedding rows.
  double dense = 0;
  /// Routed experts: per MoE layer (hash layers too) E·(1 − (1 − k/E)^B) distinct experts are
  /// expected to be touched by B·k uniform picks; each costs its w13 + w2 bytes.
  double experts = 0;
  double expected_experts_per_layer = 0;  // E·(1 − (1 − k/E)^B)
  /// lm_head [V, D] in its stored format (read once for the B rows).
  double head = 0;
  /// KV rows the B queries read, in the pools' row format (kv_row_bytes of `kv_dtype`; indexer
  /// keys of kv_index_dtype(kv_dtype, index_cache)): every layer its SWA window
  /// (min(W, L+1) rows × hd); CSA layers + min(topk, ⌊(L+1)/m⌋) compressed rows × hd + all
  /// ⌊(L+1)/m⌋ indexer keys × dI (the indexer scores every candidate); HCA layers
  /// + ⌊(L+1)/m'⌋ rows × hd. (L+1: the decoded token sees the L cached ones and itself.)
  double kv = 0;
  double total() const { return dense + experts + head + kv; }
};
/// `kv_dtype`, `index_cache`: the pools' element types (--kv-cache-dtype, --index-cache-dtype).
DecodeBytes decode_step_bytes(const ModelConfig& cfg, const Weights& w, int64_t batch,
                              int64_t context, KvDtype kv_dtype = KvDtype::kF32,
                              IndexCacheDtype index_cache = IndexCacheDtype::kAuto);

/// FLOPs of one prefill step of `chunk` tokens at positions [start, start + chunk) of one
/// sequence (multiply-add = 2 FLOPs):
///   matmul    = 2 · tokens · (active matrix parameters per token: attention, compressors,
///               indexer, router, shared expert, k routed experts, mHC fn) + 2·V·D (lm_head on
///               the last row only);
///   attention = Σ_t Σ_layers 4·H·hd·keys(t), keys = min(W, t+1) + (CSA: min(topk, ⌊(t+1)/m⌋);
///               HCA: ⌊(t+1)/m'⌋)  (q·k and p·v);
///   indexer   = Σ_t Σ_CSA layers 2·nI·dI·⌊(t+1)/m⌋ (scores of every candidate row).
struct PrefillFlops {
  double matmul = 0, attention = 0, indexer = 0;
  double total() const { return matmul + attention + indexer; }
};
PrefillFlops prefill_step_flops(const ModelConfig& cfg, int64_t start, int64_t chunk);

}  // namespace v4::model
