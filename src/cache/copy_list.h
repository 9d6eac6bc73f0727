// CopyList: the copies of one phase of prefix-cache work (an admission, a step's write-back),
// collected on the host and executed as one KvCache::copy_batch call (one kernel on CUDA).
#pragma once
#include <cstdint>
#include <vector>

#include "base/copy_segment.h"
#include "cache/pools.h"

namespace v4::cache {

/// Counters of the copies a CopyList executed (tests, benchmarks, docs/cache.md §6).
struct CopyCounters {
  int64_t calls = 0;     // KvCache::copy_batch calls (non-empty flushes)
  int64_t segments = 0;  // segments after merging
  int64_t rows = 0;      // add() calls (rows or row ranges before merging)
  int64_t bytes = 0;
};

/// A list of copies between backend-memory regions, run by one KvCache::copy_batch call. A copy
/// that continues the previous one on both sides (dst and src adjacent) extends it instead of
/// adding a segment, so consecutive rows of a page become one segment. The caller guarantees
/// the copy_batch contract: within one list no destination overlaps another copy's source or
/// destination (put dependent copies in a later flush).
class CopyList {
 public:
  /// Appends a copy of `bytes` bytes (0: nothing).
  void add(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    ++pending_rows_;
    if (!segs_.empty()) {
      CopySegment& b = segs_.back();
      if (static_cast<char*>(b.dst) + b.bytes == dst &&
          static_cast<const char*>(b.src) + b.bytes == src) {
        b.bytes += bytes;
        return;
      }
    }
    segs_.push_back({dst, src, bytes});
  }
  /// Appends every copy of `other` (in order) and clears it.
  void append(CopyList& other) {
    for (const CopySegment& s : other.segs_) add(s.dst, s.src, s.bytes);
    pending_rows_ += other.pending_rows_ - int64_t(other.segs_.size());
    other.clear();
  }
  /// Runs the list with kv.copy_batch (nothing when empty), counts it in `counters` (optional)
  /// and clears it.
  void flush(const KvCache& kv, CopyCounters* counters = nullptr) {
    if (segs_.empty()) return;
    kv.copy_batch(segs_.data(), int64_t(segs_.size()));
    if (counters) {
      counters->calls += 1;
      counters->segments += int64_t(segs_.size());
      counters->rows += pending_rows_;
      for (const CopySegment& s : segs_) counters->bytes += int64_t(s.bytes);
    }
    clear();
  }
  void clear() {
    segs_.clear();
    pending_rows_ = 0;
  }
  bool empty() const { return segs_.empty(); }
  const std::vector<CopySegment>& segments() const { return segs_; }

 private:
  std::vector<CopySegment> segs_;
  int64_t pending_rows_ = 0;
};

}  // namespace v4::cache
