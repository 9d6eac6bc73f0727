#include "cache/allocator.h"

#include <cassert>

namespace v4::cache {

RefPagePool::RefPagePool(int32_t capacity) : refs_(size_t(capacity), 0) {
  free_.reserve(size_t(capacity));
  for (int32_t i = capacity - 1; i >= 0; --i) free_.push_back(i);
}

std::optional<int32_t> RefPagePool::alloc() {
  if (free_.empty()) return std::nullopt;
  const int32_t p = free_.back();
  free_.pop_back();
  assert(refs_[size_t(p)] == 0);
  refs_[size_t(p)] = 1;
  return p;
}

void RefPagePool::ref(int32_t page) {
  assert(refs_[size_t(page)] > 0);
  ++refs_[size_t(page)];
}

bool RefPagePool::unref(int32_t page) {
  assert(refs_[size_t(page)] > 0);
  if (--refs_[size_t(page)] == 0) {
    free_.push_back(page);
    return true;
  }
  return false;
}

SwaMap::SwaMap(int64_t n_vblocks, int32_t n_swa_pages, int64_t rows_per_block)
    : map_(size_t(n_vblocks), -1),
      refs_(size_t(n_vblocks), 0),
      words_((rows_per_block + 63) / 64),
      bits_(size_t(n_vblocks * words_), 0),
      pool_(n_swa_pages) {}

void SwaMap::set_written(int64_t vb, int64_t b, int64_t e) {
  assert(map_[size_t(vb)] >= 0);
  for (int64_t r = b; r < e; ++r) bits_[size_t(vb * words_ + r / 64)] |= uint64_t(1) << (r % 64);
}

bool SwaMap::alloc(int64_t vb) {
  assert(map_[size_t(vb)] < 0);
  auto p = pool_.alloc();
  if (!p) return false;
  map_[size_t(vb)] = *p;
  refs_[size_t(vb)] = 1;
  for (int64_t w = 0; w < words_; ++w) bits_[size_t(vb * words_ + w)] = 0;
  return true;
}

void SwaMap::ref(int64_t vb) {
  assert(map_[size_t(vb)] >= 0 && refs_[size_t(vb)] > 0);
  ++refs_[size_t(vb)];
}

bool SwaMap::unref(int64_t vb) {
  assert(map_[size_t(vb)] >= 0 && refs_[size_t(vb)] > 0);
  if (--refs_[size_t(vb)] == 0) {
    pool_.unref(map_[size_t(vb)]);
    map_[size_t(vb)] = -1;
    return true;
  }
  return false;
}

}  // namespace v4::cache
