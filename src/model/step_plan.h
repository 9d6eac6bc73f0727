// The per-step plans of DeepseekV4::forward and the memory they live in ("plan, then run";
// docs/model.md §One forward step, §Decode plans and graphs).
//
// - `plan_on_host`: the host planner. For any ragged batch it builds, from KvCache's addressing
//   functions, every index array the layers read: SWA rows and key maps, per compression rate the
//   pooling plan, ring updates and candidate maps, top-k offsets.
// - `DecodeStager`: the raw state of a decode-only batch (token ids, sequences, state slots,
//   positions, padded to a bucket of B rows) plus the page-table rows that changed since they were
//   last sent, in one int32 buffer for one upload; `Ops::build_decode_plan` turns it into the same
//   maps on the backend, at fixed capacity (what a CUDA graph needs).
// - `StepMemory`: every temporary of one step. Eager mode allocates each block from the backend
//   (today's behaviour); workspace mode carves the same sequence of blocks from one region at the
//   offsets an eager run of the same step computed, so a captured graph sees fixed addresses.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cache/pools.h"
#include "model/forward_batch.h"
#include "ops/ops.h"

namespace v4::model {

/// The model constants the planners need.
struct PlanShape {
  int window = 0;      // W (sliding_window, incl. the token itself)
  int csa_ratio = 0;   // m of CSA layers (overlap 2; also the indexer compressor), 0 = none
  int hca_ratio = 0;   // m of HCA layers (overlap 1), 0 = none
  int index_topk = 0;  // k of the lightning indexer
};

/// A ragged list of pool rows per query row (ops::RowMap) in host memory.
struct HostRowMap {
  std::vector<int32_t> rows;
  std::vector<int64_t> offset;  // [S]
  std::vector<int32_t> count;   // [S]
};

/// Compressor plan of one rate m (overlap c) for a step (dsv4-model.md §5): the compressed rows
/// that close in this step with their c·m source slots (ops::CompressArgs::src), rope positions
/// w·m and destination rows; the ring rows to refresh (the last c·m tokens of each slice); and per
/// query the causal candidate rows (entries w < ⌊(t+1)/m⌋, in entry order).
struct HostCompressPlan {
  int ratio = 0, overlap = 1;
  std::vector<int32_t> src;        // [n_out, c·m]
  std::vector<int64_t> positions;  // [n_out]
  std::vector<int32_t> dst;        // [n_out]
  std::vector<int32_t> ring_src;   // [n_ring] batch rows
  std::vector<int32_t> ring_dst;   // [n_ring] ring rows
  HostRowMap cand;
  int64_t max_cand = 0;  // max over queries of cand.count
  /// Output window index of each compressed row (for tests: which slice produced it).
  std::vector<int32_t> out_slice;  // [n_out] slice index
};

/// Everything the host planner builds for one step.
struct HostStepPlan {
  int64_t S = 0;                 // rows of the step
  std::vector<int64_t> row0;     // [slices + 1] first batch row of each slice
  std::vector<int32_t> ids;      // [S]
  std::vector<int64_t> pos;      // [S]
  std::vector<int32_t> swa_dst;  // [S] SWA row of each new token
  HostRowMap swa;                // per query: the window's key rows (W incl. itself)
  bool has_csa = false, has_hca = false;
  HostCompressPlan csa, hca;
  std::vector<int64_t> topk_offset;  // [S] t·index_topk (CSA only)
};

/// Host planner (the reference for the device plan). `batch` must be validated and reserved.
HostStepPlan plan_on_host(const ForwardBatch& batch, const cache::KvCache& kv, const PlanShape& ps);

/// Batch buckets of the decode fast path: 1, 2, 4, ..., kMaxDecodeRows.
constexpr int kMaxDecodeRows = 256;
/// Smallest bucket ≥ n (n in [1, kMaxDecodeRows]).
int64_t decode_bucket(int64_t n);
/// Logical pages per sequence the device page tables hold for `kv` (P): the whole pool or the
/// longest sequence `max_positions` allows, whichever is smaller.
int64_t decode_table_pages(const cache::KvCache& kv, int64_t max_positions);

/// Raw decode-batch state in one int32 buffer (layout below, capacity kMaxDecodeRows rows and P
/// pages per table row), rebuilt on the host each step and uploaded as one prefix:
///   [ids 256][seq 256][slot 256][pos 256][delta_count 1][delta_seq 256][delta_rows 256 × 2P]
/// Rows ≥ n are padding (id 0, seq −1, slot 0, pos 0). A sequence's page-table row is staged
/// when KvCache::addressing_version differs from the version last staged for that row.
class DecodeStager {
 public:
  DecodeStager() = default;
  /// `table_rows` = KvCache max_seqs (sequence handles are < max_seqs), `max_pages` = P.
  DecodeStager(int table_rows, int64_t max_pages);
  /// Stages `batch` (decode rows only: one token each) padded to B rows. Returns the number of
  /// int32 values to upload (the used prefix of host()).
  int64_t stage(const ForwardBatch& batch, const cache::KvCache& kv, int64_t B);
  /// Forgets what was staged (the device tables must be re-sent, e.g. after a failed step).
  void invalidate();
  const int32_t* host() const { return host_.data(); }
  int64_t total_ints() const { return int64_t(host_.size()); }
  int64_t max_pages() const { return P_; }
  int table_rows() const { return int(version_.size()); }
  /// Rows staged by the last stage() call.
  int64_t last_deltas() const { return last_deltas_; }
  static constexpr int64_t kIds = 0, kSeq = kMaxDecodeRows, kSlot = 2 * kMaxDecodeRows,
                           kPos = 3 * kMaxDecodeRows, kDeltaCount = 4 * kMaxDecodeRows,
                           kDeltaSeq = kDeltaCount + 1, kDeltaRows = kDeltaSeq + kMaxDecodeRows;

 private:
  int64_t P_ = 0;
  std::vector<int32_t> host_;
  std::vector<uint64_t> version_;  // per table row: version last staged (0 = never)
  int64_t last_deltas_ = 0;
};

/// Fills the input fields of a DecodePlanArgs (raw state, tables, deltas) from a staging buffer
/// in backend memory laid out as DecodeStager's. Outputs stay for the caller to allocate.
ops::DecodePlanArgs decode_plan_inputs(const int32_t* staging, int32_t* page_table,
                                       int32_t* swa_table, int64_t max_pages, int page_size,
                                       int window, int64_t B);

/// Step-scoped backend memory: a stack of blocks with marks (a layer's temporaries are released
/// when it returns). Offsets are simulated identically in both modes (each block at the previous
/// top rounded up to kAlign), so a workspace of peak() bytes from an eager run holds a workspace
/// run of the same allocation sequence at the same offsets.
class StepMemory {
 public:
  static constexpr size_t kAlign = 256;
  /// Eager: each block from ops->alloc, freed on release/destruction.
  explicit StepMemory(ops::Ops* ops) : ops_(ops) {}
  /// Workspace: blocks carved from [base, base + capacity); nothing allocated or freed.
  StepMemory(void* base, size_t capacity) : base_(static_cast<char*>(base)), cap_(capacity) {}
  ~StepMemory();
  StepMemory(const StepMemory&) = delete;
  StepMemory& operator=(const StepMemory&) = delete;

  struct Mark {
    size_t top = 0;
    size_t blocks = 0;
  };
  /// A block of `bytes` (nullptr for 0). Workspace overflow throws std::length_error (naming the
  /// sizes); eager exhaustion throws std::bad_alloc like Ops::alloc.
  void* alloc(size_t bytes);
  template <typename T>
  T* alloc_n(int64_t n) {
    return static_cast<T*>(alloc(size_t(n > 0 ? n : 0) * sizeof(T)));
  }
  Mark mark() const { return {top_, blocks_.size()}; }
  /// Frees (eager) / forgets (workspace) every block allocated after `m`.
  void release(Mark m);
  /// Highest top of the stack so far (bytes).
  size_t peak() const { return peak_; }
  /// Blocks handed out so far (all modes).
  int64_t allocations() const { return n_allocs_; }
  bool workspace() const { return base_ != nullptr; }

 private:
  ops::Ops* ops_ = nullptr;
  char* base_ = nullptr;
  size_t cap_ = 0;
  size_t top_ = 0, peak_ = 0;
  int64_t n_allocs_ = 0;
  std::vector<void*> blocks_;  // eager blocks in allocation order (nullptr in workspace mode)
};

}  // namespace v4::model
