// Device-side helpers shared by the .cu files of the CUDA backend (internal header).
#pragma once
#include <cstdint>

#include "base/dtype.h"  // KvDtype

namespace v4::cuda {

// ---- KV pool element access (--kv-cache-dtype; base/dtype.h KvDtype) ---------------------------
/// Value i of a KV pool of element type `dt` as f32 (bf16 → f32 is exact: bits << 16).
__device__ __forceinline__ float kv_load(const void* pool, KvDtype dt, int64_t i) {
  if (dt == KvDtype::kBf16)
    return __uint_as_float(uint32_t(static_cast<const uint16_t*>(pool)[i]) << 16);
  return static_cast<const float*>(pool)[i];
}
/// Values [i, i + 4) as a float4 (i % 4 == 0; f32: 16-byte load, bf16: 8-byte load; the pool
/// base must be 16-byte aligned, as backend allocations are).
__device__ __forceinline__ float4 kv_load4(const void* pool, KvDtype dt, int64_t i) {
  if (dt == KvDtype::kBf16) {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(pool) + i));
    // little endian: value i is the low half of u.x
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                       __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
  }
  return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(pool) + i));
}
/// f32 → bf16 bits, round to nearest even: the same bit operations as the host's f32_to_bf16
/// (base/dtype.h), so a device-stored row equals the CPU backend's bit for bit (NaN stays NaN).
__device__ __forceinline__ uint16_t kv_f32_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
/// Stores v as value i of a KV pool of element type `dt`.
__device__ __forceinline__ void kv_store(void* pool, KvDtype dt, int64_t i, float v) {
  if (dt == KvDtype::kBf16)
    static_cast<uint16_t*>(pool)[i] = kv_f32_to_bf16(v);
  else
    static_cast<float*>(pool)[i] = v;
}

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
