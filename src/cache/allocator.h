// Page allocators of ShadowRadix (docs/cache.md): fixed-size pools of pages with reference
// counts, and the virtual→SWA page map. They hand out ids only; the memory behind an id belongs to
// whoever stores the tensors (src/cache/pools.*), which addresses it by the same ids:
//   virtual page v, token slot s = v·page_tokens + i  →  C4 KV / indexer entry s/4, C128 entry
//   s/128 (no tables: division of the slot);
//   SWA KV of slot s  →  SWA page swa_map[s / swa_page_tokens], row s % swa_page_tokens;
//   compressor-state snapshot id  →  one snapshot slot.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

namespace v4::cache {

/// A pool of `capacity` page ids [0, capacity) with a reference count per page. A page is in use
/// iff its count is > 0; it returns to the free list when the last reference is dropped.
/// Invariant: free_count() + used_count() == capacity().
class RefPagePool {
 public:
  explicit RefPagePool(int32_t capacity = 0);
  /// Takes a free page with count 1; nullopt when none is free.
  std::optional<int32_t> alloc();
  /// Adds a reference to an in-use page.
  void ref(int32_t page);
  /// Drops a reference; returns true when the page became free.
  bool unref(int32_t page);
  int32_t refcount(int32_t page) const { return refs_[size_t(page)]; }
  int32_t capacity() const { return int32_t(refs_.size()); }
  int32_t free_count() const { return int32_t(free_.size()); }
  int32_t used_count() const { return capacity() - free_count(); }

 private:
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // LIFO
};

/// The virtual→SWA page map. Virtual SWA blocks are `slot / swa_page_tokens` (n_vblocks =
/// virtual pages × page_tokens / swa_page_tokens); each block is either unmapped (-1) or owns one
/// SWA page. A mapped block has a reference count (holders: radix-node boundary windows and
/// running sequences); it is unmapped and its SWA page freed when the count drops to 0.
/// Each mapped block also knows which of its rows hold written data (a bit per row): a window
/// is only kept or handed out when every row of it was written.
class SwaMap {
 public:
  SwaMap(int64_t n_vblocks = 0, int32_t n_swa_pages = 0, int64_t rows_per_block = 64);
  /// Marks rows [row_begin, row_end) of a mapped block as written.
  void set_written(int64_t vblock, int64_t row_begin, int64_t row_end);
  /// Whether row `row` of a block holds written data (false when unmapped).
  bool written(int64_t vblock, int64_t row) const {
    return map_[size_t(vblock)] >= 0 &&
           (bits_[size_t(vblock * words_ + row / 64)] >> (row % 64) & 1u);
  }
  /// SWA page of a virtual block, or -1 when it holds no SWA (never written or freed).
  int32_t page(int64_t vblock) const { return map_[size_t(vblock)]; }
  /// Maps an unmapped block to a fresh SWA page (count 1); false when the SWA pool is empty.
  bool alloc(int64_t vblock);
  void ref(int64_t vblock);
  /// Drops a reference; returns true when the block's SWA page was freed.
  bool unref(int64_t vblock);
  int32_t refcount(int64_t vblock) const { return refs_[size_t(vblock)]; }
  const RefPagePool& pool() const { return pool_; }
  int64_t n_vblocks() const { return int64_t(map_.size()); }

 private:
  std::vector<int32_t> map_;
  std::vector<int32_t> refs_;
  int64_t words_ = 1;
  std::vector<uint64_t> bits_;
  RefPagePool pool_;
};

}  // namespace v4::cache
