// The physical side of prefix reuse on top of KvCache's pools (src/cache/pools.h, f32 rows):
// what ShadowRadix's plans ask the tensor owner to do.
//
// - `StateSnapshots`: compressor-state snapshot slots (ShadowRadix snapshot ids). A snapshot is
//   a copy of one sequence's ring slot of every compressor (main and indexer, all layers), taken
//   after exactly L tokens; loading it into another sequence at length L continues the
//   computation bit for bit (the rings are indexed by position, row p % (c·m)).
// - `copy_prefix_state`: copy-mode reuse. Copies what a sequence resuming at L reads from a
//   source sequence: compressed entries e < L/m of every C4 / indexer / C128 pool and the SWA rows
//   [L - W + 1, L). Used by the exactness tests.
// - `apply_page_copy`: ShadowRadix's tail-page copy at page-id level (shared-page mode).
// - `PrefixCache`: ShadowRadix bound to KvCache in two tiers (copy mode). The radix tree's pages
//   live in a store with the pools' layout, addressed by ShadowRadix's ids; running sequences
//   compute in KvCache as before. Admission copies the hit's boundary state into the new KvCache
//   sequence; snapshot points and finish copy the sequence's new state into the tree's pages.
//   When KvCache can address external pages, the store goes away and nothing is copied; the API
//   stays the same (docs/cache.md "Binding to the pools").
//
// Memory: the store and the snapshots live in the pools' memory (KvCache::alloc_bytes: device
// memory on CUDA) and every copy — pool ↔ store, store → store, pool → pool — is a segment of a
// KvCache::copy_batch call (one per phase: admission, a step's write-back, finish), so the host
// never touches row bytes and a device backend runs each phase as one kernel, stream-ordered
// with the forward.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "cache/copy_list.h"
#include "cache/pools.h"
#include "cache/shadow_radix.h"

namespace v4::cache {

/// Snapshot slots sized for one KvCache's rings, in the pools' memory (KvCache::alloc_bytes).
class StateSnapshots {
 public:
  /// Errors (kInvalidArgument): n_slots < 0. Must be destroyed before the backend that
  /// allocated `kv`'s pools.
  static Result<std::unique_ptr<StateSnapshots>> create(const KvCache& kv, int32_t n_slots);
  ~StateSnapshots();
  StateSnapshots(const StateSnapshots&) = delete;
  StateSnapshots& operator=(const StateSnapshots&) = delete;
  /// f32 values of one snapshot (all layers' rings, kv + gate).
  int64_t floats_per_slot() const { return floats_per_slot_; }
  int32_t n_slots() const { return n_slots_; }
  /// Copies the rings of `seq` into slot `id`: appended to `list` (the caller flushes it), or,
  /// without a list, run at once. Errors: bad id or sequence.
  Status save(const KvCache& kv, int32_t seq, int32_t id, CopyList* list = nullptr);
  /// Copies slot `id` into the rings of `seq` (same `list` rule). Errors: bad id or sequence.
  Status load(KvCache& kv, int32_t id, int32_t seq, CopyList* list = nullptr) const;

 private:
  StateSnapshots() = default;
  struct Ring {
    int layer, which, rows, width;
  };
  std::vector<Ring> rings_;
  int64_t floats_per_slot_ = 0;
  int32_t n_slots_ = 0;
  float* data_ = nullptr;  // [n_slots, floats_per_slot] in backend memory
  KvCache::FreeFn free_;
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
Status apply_page_copy(KvCache& kv, const PageCopy& c, int32_t swa_src_page, int32_t swa_dst_page);

/// One step of one sequence for PrefixCache::on_steps: the KvCache sequence and the tokens the
/// step appended.
struct StepAppend {
  int32_t kv_seq = -1;
  std::span<const int32_t> tokens;
};

/// A request's handle in PrefixCache.
struct PrefixSeq {
  int32_t kv_seq = -1;        // KvCache sequence (ForwardBatch SeqSlice::seq)
  int32_t radix_seq = -1;     // ShadowRadix sequence, -1 once detached (not inserted at finish)
  int64_t cached_tokens = 0;  // prompt tokens served from the cache (usage.cached_tokens)
  std::vector<int64_t> snapshot_points;  // lengths at which a step must end (then: on_step)
};

/// ShadowRadix + KvCache, two-tier binding (see file comment). Sequences are named by their
/// KvCache handle, so an Executor wires it in three calls (docs/cache.md "Engine API"):
/// start_sequence → admit, after each forward → on_steps (all slices), end_sequence → finish.
/// Not thread-safe.
class PrefixCache {
 public:
  /// Tree-store sizes for a byte budget (rows in the pools' layout: attention rows of
  /// kv.kv_dtype(), indexer keys of kv.index_dtype(); snapshots f32): SWA pages and snapshot
  /// slots for `kept_boundaries` boundary windows, the rest as pages. `page_tokens` must be a multiple of 128. Errors (kInvalidArgument): budget below one page per boundary.
  static Result<ShadowRadixConfig> config_for_budget(const KvCache& kv, int64_t budget_bytes,
                                                     int64_t page_tokens = 256,
                                                     int64_t swa_page_tokens = 64,
                                                     int32_t kept_boundaries = 64);
  /// `cfg` sizes the tree's store; its page_tokens must be a multiple of every compression
  /// ratio; window_tokens is set to sliding_window - 1 (the rows a resumed query reads).
  /// Errors (kInvalidArgument): bad config (see ShadowRadix::create).
  /// The store (sized by `cfg`) is allocated with kv.alloc_bytes and freed by the destructor,
  /// which must therefore run before the backend that allocated `kv`'s pools goes.
  static Result<std::unique_ptr<PrefixCache>> create(const KvCache& kv,
                                                     const ShadowRadixConfig& cfg);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;
  /// Starts a request: a new KvCache sequence that already holds the longest resumable cached
  /// prefix of `prompt` (at most prompt.size() - 1 tokens, and at most `max_cached`). Errors:
  /// kResourceExhausted when KvCache has no free sequence or pages (retry later); the tree side
  /// never blocks admission.
  Result<PrefixSeq> admit(KvCache& kv, std::span<const int32_t> prompt,
                          int64_t max_cached = INT64_MAX);
  /// Call after every forward step of `kv_seq` with the tokens the step appended. Saves a
  /// boundary when the new length is a snapshot point. If the tree cannot hold the request's
  /// state (everything locked by running requests) the request is detached from the tree: it
  /// keeps running, it is only not inserted at the end. Unknown sequences are ignored.
  Status on_step(KvCache& kv, int32_t kv_seq, std::span<const int32_t> tokens);
  /// on_step for every sequence of a step (each at most once), with all their write-back and
  /// snapshot copies in one KvCache::copy_batch call. The tree takes a step's positions a page
  /// at a time, so a long chunk needs no more of the store's SWA pages than one page plus the
  /// window. Errors: as on_step (the first one; the other sequences are still processed).
  Status on_steps(KvCache& kv, std::span<const StepAppend> steps);
  /// Ends a request: with `insert`, its computed tokens enter the tree (with a boundary at its
  /// end); always frees the KvCache sequence. Returns tokens newly added to the tree.
  Result<int64_t> finish(KvCache& kv, int32_t kv_seq, bool insert = true);
  /// Requests detached from the tree so far (the store was full of locked state; they ran
  /// without being cached). Non-zero means the store is too small for the load.
  int64_t detached_total() const { return detached_total_; }
  /// Bytes of the tree store and its startup line ("prefix cache: ... pages ... boundaries").
  int64_t store_bytes() const;
  std::string explain() const;
  /// Copies issued so far (every byte the prefix cache moved went through KvCache::copy_batch).
  const CopyCounters& copy_counters() const { return copies_; }

  ShadowRadix& radix() { return *radix_; }
  const ShadowRadix& radix() const { return *radix_; }

 private:
  PrefixCache() = default;
  Status snapshot(KvCache& kv, PrefixSeq& h, CopyList* list);
  /// One sequence's part of on_steps: tree bookkeeping, its copies appended to `list`.
  Status step_one(KvCache& kv, const StepAppend& st, CopyList* list);
  void detach(PrefixSeq& h);
  std::unique_ptr<ShadowRadix> radix_;
  std::unique_ptr<StateSnapshots> snaps_;
  std::unordered_map<int32_t, PrefixSeq> live_;  // by KvCache sequence
  // Store of the tree tier, per layer: compressed rows by slot / m, indexer rows, SWA rows (into
  // one block of backend memory, store_), in the KvCache's row format (dim_ / idim_: row sizes
  // in bytes, eb_ = 1).
  std::vector<char*> comp_, index_, swa_;
  int64_t eb_ = 1;
  /// Byte address of row `row` (`dim` · eb_ bytes a row) of a store buffer.
  char* srow(char* base, int64_t row, int64_t dim) const { return base + row * dim * eb_; }
  void* store_ = nullptr;
  int64_t store_bytes_ = 0;
  KvCache::FreeFn free_;
  CopyCounters copies_;
  std::vector<int> ratio_, dim_, idim_;
  int64_t window_ = 0;  // SWA rows a boundary keeps: sliding_window - 1
  int64_t detached_total_ = 0;
};

}  // namespace v4::cache
