// ShadowRadix: prefix caching for DeepSeek-V4's hybrid KV state (docs/cache.md).
//
// One radix tree over token ids. A node's value is the list of virtual pages that hold its
// tokens (C4 KV, indexer keys and C128 KV of those pages are addressed by division of the slot).
// The end of a node is a *boundary*; a boundary is resumable when it keeps
//   - a compressor-state snapshot taken after exactly `end` tokens, and
//   - the SWA window before it (positions [end - W, end)) live in the SWA pool, every row written,
// so that a request matching it can start computing at `end` and reproduce a cold prefill bit
// for bit. `match` only ever returns resumable boundaries (the root, 0 tokens, always is).
//
// Memory is reference counted (virtual pages, SWA blocks, snapshots); holders are tree nodes and
// running sequences. Locks are separate, logical counts: `lock` (whole node: on the path of a
// running sequence, never dropped) and `swa_lock` (the boundary a running sequence resumed from,
// never tombstoned). Eviction has two phases: (1) free the boundary state (SWA window +
// snapshot) of cold nodes without swa_lock → tombstone; (2) drop cold unlocked leaves.
//
// Physical work (copying the tail page at admission, restoring / saving compressor rings) is
// returned as plain data to the owner of the tensors; this class never touches tensor memory.
// Not thread-safe: the scheduler thread owns it.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "cache/allocator.h"

namespace v4::cache {

/// Sizes of the pools (usually from `plan_pools`).
struct ShadowRadixConfig {
  int64_t page_tokens = 256;     // P: virtual page size, multiple of 128, >= window
  int64_t swa_page_tokens = 64;  // Ps: SWA page size, divides P
  int64_t window_tokens = 128;   // W: SWA rows kept before a boundary (the rows a resumed query
                                 // reads: sliding_window - 1 suffices; sliding_window is safe)
  int32_t n_pages = 0;           // virtual pages
  int32_t n_swa_pages = 0;
  int32_t n_snapshots = 0;
  bool enable_prefix_cache = true;  // false: match always returns 0, finish never inserts
  /// > 0: `admit` also asks for boundaries at every multiple of this many tokens inside the
  /// prompt, so a later request that shares only part of this prompt (e.g. the system prompt of
  /// the first two requests of a chat service) resumes at the last multiple ≤ the shared length
  /// instead of recomputing it once more. Each point ends a prefill step there and keeps a
  /// compressor snapshot + SWA window (LRU-evicted like any boundary). 0: branch points and the
  /// prompt end only.
  int64_t snapshot_interval = 0;
  /// Most periodic points (snapshot_interval) one prompt asks for; a prompt with more multiples
  /// gets them at a power-of-two multiple of the interval instead
  /// (thinned_snapshot_interval), so its boundaries always fit in the store next to those of
  /// other requests and its prompt-end boundaries. 0: n_snapshots / 4 (at least 1).
  int32_t max_interval_points = 0;
  /// Debug builds (NDEBUG undefined): run check_invariants() after every public mutating call
  /// and abort with the violation. O(tree + pools) per call; ignored in release builds.
  bool debug_checks = true;
};

/// Result of a lookup (no state change).
struct MatchResult {
  int64_t cached_tokens = 0;   // R: deepest resumable boundary <= max_cached (0 = cold)
  int64_t matched_tokens = 0;  // M: longest common prefix with the tree (>= R)
  /// Positions in (R, M] where the request should save a snapshot while it prefills so that the
  /// tree can resume there later (node ends without live state, and the branch point M).
  std::vector<int64_t> snapshot_points;
};

/// Copy of the head of a shared page into a sequence's own page (a hit whose boundary is not
/// page-aligned). Copy compressed entries of in-page token offsets [0, n_tokens) (C4/indexer
/// entries [0, n_tokens/4), C128 entries [0, n_tokens/128)) and SWA rows of offsets
/// [swa_begin, n_tokens), from `src_page` to `dst_page`.
struct PageCopy {
  int32_t src_page = -1, dst_page = -1;
  int64_t n_tokens = 0, swa_begin = 0;
};

/// What the tensor owner must do before a sequence's first step.
struct AdmitPlan {
  int32_t seq = -1;
  int64_t cached_tokens = 0;       // the sequence starts computing at this position
  int64_t matched_tokens = 0;
  int32_t restore_snapshot = -1;   // load the compressor rings from this snapshot (-1: zero)
  bool has_copy = false;
  PageCopy copy;
  std::vector<int64_t> snapshot_points;  // save a snapshot (begin_snapshot) at these lengths
};

/// What `evict` should make free (0 = nothing needed in that pool).
struct EvictNeed {
  int32_t pages = 0, swa_pages = 0, snapshots = 0;
};

/// Counters for /metrics and tests.
struct CacheStats {
  int32_t pages_total = 0, pages_used = 0;
  int32_t swa_total = 0, swa_used = 0;
  int32_t snapshots_total = 0, snapshots_used = 0;
  int32_t nodes = 0, tombstones = 0, resumable = 0, running = 0;
  int64_t tree_tokens = 0;               // tokens stored in the tree
  int64_t match_queries = 0, query_tokens = 0, hit_tokens = 0;
  int64_t evicted_nodes = 0, tombstoned_nodes = 0, adopted_nodes = 0;
};

/// Periodic snapshot interval `admit` uses for a prompt of `n` tokens that resumes at `R`:
/// `interval` doubled until the multiples in (R, n) number at most `cap` (>= 1), so the points of
/// a long prompt are a subset of those of a short one (multiples of interval·2^k nest). Returns 0
/// (no periodic points) when interval <= 0 or no multiple lies in (R, n).
int64_t thinned_snapshot_interval(int64_t interval, int64_t R, int64_t n, int32_t cap);

/// The startup line for ShadowRadixConfig::snapshot_interval (serve
/// --prefix-snapshot-interval): the interval in use, the per-prompt cap `cap` and the store's
/// `n_snapshots`. `warn` is set when the value misbehaves for prompts up to `max_prompt` tokens
/// (the context length): the interval is >= it (no effect), or such a prompt would ask for more
/// than `cap` boundaries (they are thinned, thinned_snapshot_interval; the line says from which
/// prompt length and the smallest interval that is never thinned).
std::string describe_snapshot_interval(int64_t interval, int32_t cap, int32_t n_snapshots,
                                       int64_t max_prompt, bool* warn);

struct RadixNode;

/// The cache index. See the file comment; docs/cache.md has a worked example.
class ShadowRadix {
 public:
  /// Errors (kInvalidArgument): page sizes inconsistent (P multiple of 128 and >= W, Ps | P).
  static Result<std::unique_ptr<ShadowRadix>> create(const ShadowRadixConfig& cfg);
  ~ShadowRadix();
  ShadowRadix(const ShadowRadix&) = delete;
  ShadowRadix& operator=(const ShadowRadix&) = delete;

  // ---- scheduler API ----------------------------------------------------------------------
  /// Longest resumable cached prefix of `tokens`, at most `max_cached` tokens (pass
  /// prompt_len - 1 so the last prompt token is computed and yields logits). No state change.
  MatchResult match(std::span<const int32_t> tokens, int64_t max_cached) const;

  /// Whether a sequence of `total_tokens` (prompt + max new tokens) computed in chunks of at
  /// most `chunk_tokens` can ever fit, even with an empty cache. Errors (kInvalidArgument, a
  /// message naming the pool, what is needed and the capacity) mean: reject now, never retry.
  Status check_fits(int64_t total_tokens, int64_t chunk_tokens) const;

  /// Starts a sequence: match, lock the matched path, build its page table (shared prefix pages
  /// + a tail copy page when the hit is not page-aligned), take references on its SWA window.
  /// Evicts cold state if needed. Errors: kResourceExhausted when memory held by running
  /// sequences prevents admission now (retry after some finish).
  Result<AdmitPlan> admit(std::span<const int32_t> prompt, int64_t max_cached);

  /// Makes room for the next `n_tokens` of `seq` (positions len .. len+n-1): allocates virtual
  /// pages and SWA pages, evicting cold state if needed. Idempotent for already-reserved
  /// positions. Errors: kResourceExhausted (preempt someone), kInvalidArgument (unknown seq).
  Status reserve(int32_t seq, int64_t n_tokens);

  /// Records that `tokens` were computed (appended at len); they must be reserved. Releases SWA
  /// pages that fell out of the window (unless a boundary of this sequence keeps them).
  /// `swa_rows_written`: how many of the last new positions had their SWA rows written to the
  /// pages (-1 = all, as the forward does on shared pages; a write-back binding that copies only
  /// the last window passes window_tokens). Windows are only kept over written rows.
  Status commit(int32_t seq, std::span<const int32_t> tokens, int64_t swa_rows_written = -1);

  /// Allocates a snapshot slot for the state after exactly len(seq) tokens and keeps the SWA
  /// window before it; the caller then saves the compressor rings into the returned slot.
  /// Errors: kResourceExhausted when no slot can be freed.
  Result<int32_t> begin_snapshot(int32_t seq);

  /// Ends a sequence. With `insert`, its computed tokens and boundaries enter the tree (nodes it
  /// recomputed may adopt its pages so its boundaries become resumable); then all its references
  /// and locks are dropped. Returns the number of tokens newly added to the tree.
  Result<int64_t> finish(int32_t seq, bool insert = true);

  /// Frees cold state until `need` is free in every pool or nothing evictable is left (phase 1
  /// then phase 2, LRU). Returns true if the need is met.
  bool evict(const EvictNeed& need);

  // ---- views for the tensor owner ---------------------------------------------------------
  /// Virtual page of page index i of a sequence (size = ceil(reserved/P)).
  std::span<const int32_t> page_table(int32_t seq) const;
  /// Virtual slot of position `pos` of `seq` (C4 entry = slot/4, C128 entry = slot/128).
  int64_t slot(int32_t seq, int64_t pos) const;
  /// SWA row of position `pos` of `seq`: swa_page·Ps + pos%Ps, or -1 when not live.
  int64_t swa_row(int32_t seq, int64_t pos) const;
  /// Tokens computed (committed) for a sequence, or -1 if unknown.
  int64_t seq_len(int32_t seq) const;
  const SwaMap& swa_map() const { return swa_; }
  const ShadowRadixConfig& config() const { return cfg_; }
  /// ShadowRadixConfig::max_interval_points, resolved (0 → n_snapshots / 4, at least 1).
  int32_t interval_point_cap() const;

  // ---- accounting and checks --------------------------------------------------------------
  CacheStats stats() const;
  /// Full consistency check (O(tree + sequences)): tree shape, reference counts equal the
  /// holders, free + used = total per pool, locks equal running sequences, tombstoned nodes hold
  /// no SWA and no snapshot, every kept boundary window is live and matches the tree's page table.
  /// Returns the first violation found.
  Status check_invariants() const;
  /// Multi-line dump of the tree (debugging, tests).
  std::string debug_string() const;
  /// Debug builds: aborts with the first violated invariant (see ShadowRadixConfig::debug_checks).
  void debug_check_public(const char* op) const { debug_check(op); }

 private:
  struct Seq;
  explicit ShadowRadix(const ShadowRadixConfig& cfg);

  int64_t blocks_per_page() const { return cfg_.page_tokens / cfg_.swa_page_tokens; }
  int64_t n_page_idx(int64_t n_tokens) const {
    return (n_tokens + cfg_.page_tokens - 1) / cfg_.page_tokens;
  }
  Seq* find_seq(int32_t id);
  const Seq* find_seq(int32_t id) const;
  // Tree helpers.
  RadixNode* split(RadixNode* n, int64_t at);  // returns the new parent [start, at)
  /// Page table of the path root..n for page indices >= from_idx (lower entries -1).
  std::vector<int32_t> path_page_table(const RadixNode* n, int64_t from_idx = 0) const;
  /// The entries of it that n's boundary window needs.
  std::vector<int32_t> window_page_table(const RadixNode* n) const;
  std::vector<int64_t> window_vblocks(const std::vector<int32_t>& pt, int64_t end) const;
  bool window_written(const std::vector<int32_t>& pt, int64_t end) const;
  void release_boundary(RadixNode* n);
  void drop_leaf(RadixNode* n);
  void touch(RadixNode* n);
  void lock_path(RadixNode* n, int delta);
  int64_t insert_seq(Seq& s);
  bool evict_impl(const EvictNeed& need);
  void debug_check(const char* op) const;
  bool alloc_page(int32_t* out);
  bool alloc_swa(int64_t vb);
  bool alloc_snapshot(int32_t* out);

  ShadowRadixConfig cfg_;
  RefPagePool pages_;
  SwaMap swa_;
  RefPagePool snaps_;
  std::unique_ptr<RadixNode> root_;
  std::unordered_map<int32_t, std::unique_ptr<Seq>> seqs_;
  int32_t next_seq_ = 0;
  int32_t next_node_id_ = 1;
  uint64_t clock_ = 0;
  mutable CacheStats counters_;
};

}  // namespace v4::cache
