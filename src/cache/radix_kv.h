// The physical side of prefix reuse on top of KvCache's pools (src/cache/pools.h, CPU f32 rows):
// what ShadowRadix's plans ask the tensor owner to do.
//
// - `StateSnapshots`: compressor-state snapshot slots (ShadowRadix snapshot ids). A snapshot is
//   a copy of one sequence's ring slot of every compressor (main and indexer, all layers), taken
//   after exactly L tokens; loading it into another sequence at length L continues the
//   computation bit for bit (the rings are indexed by position, row p % (c·m)).
// - `copy_prefix_state`: copy-mode reuse. Copies what a sequence resuming at L reads from a
//   source sequence: compressed entries e < L/m of every C4 / indexer / C128 pool and the SWA rows
//   [L - W + 1, L). Used by the exactness tests and by the engine until KvCache takes shared
//   pages (see docs/cache.md "Binding to the pools").
// - `apply_page_copy`: ShadowRadix's tail-page copy at page-id level (shared-page mode).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "cache/pools.h"
#include "cache/shadow_radix.h"

namespace v4::cache {

/// Host-memory snapshot slots sized for one KvCache's rings.
class StateSnapshots {
 public:
  /// Errors (kInvalidArgument): n_slots < 0.
  static Result<std::unique_ptr<StateSnapshots>> create(const KvCache& kv, int32_t n_slots);
  /// f32 values of one snapshot (all layers' rings, kv + gate).
  int64_t floats_per_slot() const { return floats_per_slot_; }
  int32_t n_slots() const { return n_slots_; }
  /// Copies the rings of `seq` into slot `id`. Errors: bad id or sequence.
  Status save(const KvCache& kv, int32_t seq, int32_t id);
  /// Copies slot `id` into the rings of `seq`. Errors: bad id or sequence.
  Status load(KvCache& kv, int32_t id, int32_t seq) const;

 private:
  struct Ring {
    int layer, which, rows, width;
  };
  std::vector<Ring> rings_;
  int64_t floats_per_slot_ = 0;
  int32_t n_slots_ = 0;
  std::vector<float> data_;
};

/// Copies the compressed entries of positions [0, n_tokens) and the SWA rows
/// [n_tokens - W + 1, n_tokens) of `src` into `dst` (rings: use StateSnapshots). `dst` must have
/// positions [0, n_tokens) reserved and hold no tokens yet; `src` must hold >= n_tokens tokens
/// with its window rows still live (length(src) == n_tokens is always safe). Errors:
/// kInvalidArgument naming the violated condition.
Status copy_prefix_state(KvCache& kv, int32_t src, int32_t dst, int64_t n_tokens);

/// Executes a ShadowRadix tail-page copy on KvCache's pools when both use the same page ids
/// (shared-page mode: ShadowRadix page_tokens == swa_page_tokens == KvCache page size).
/// `swa_src_page`/`swa_dst_page` are the SWA pages of the two virtual pages (ShadowRadix
/// swa_map). Errors: page size mismatch, ids out of range.
Status apply_page_copy(KvCache& kv, const PageCopy& c, int32_t swa_src_page,
                       int32_t swa_dst_page);

}  // namespace v4::cache
