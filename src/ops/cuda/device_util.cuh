// Device-side helpers shared by the .cu files of the CUDA backend (internal header).
#pragma once
#include <cstdint>

namespace v4::cuda {

/// Order-preserving map float -> uint32 (larger score -> larger key); NaN -> 0 (lowest, below
/// −inf, which maps to 0x007fffff); −0 and +0 map to the same key.
__device__ __forceinline__ uint32_t order_key(float f) {
  if (f != f) return 0u;
  uint32_t u = f == 0.f ? 0u : __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/// Grid size for a grid-stride loop over n items with `threads` per block (capped).
inline unsigned grid_for(int64_t n, int threads, int64_t cap = 65536) {
  int64_t g = (n + threads - 1) / threads;
  return unsigned(g < 1 ? 1 : (g > cap ? cap : g));
}

}  // namespace v4::cuda
