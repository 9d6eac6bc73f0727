// One contiguous byte copy of a batched copy: the unit both the op backends
// (ops::Ops::copy_batch) and the KV cache's copy hook (cache::KvCache::set_copy_batch) take, so
// the prefix cache can hand its row copies to the backend without a conversion.
#pragma once
#include <cstddef>

namespace v4 {

/// Copy `bytes` bytes from `src` to `dst`. Both point into the same memory space (backend memory:
/// device memory on CUDA, host memory on the CPU backend). 24 bytes, the same layout on host and
/// device (the CUDA backend uploads arrays of it as they are).
struct CopySegment {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};
static_assert(sizeof(CopySegment) == 24, "CopySegment layout is shared with the device");

}  // namespace v4
