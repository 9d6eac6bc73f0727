// Device-side helpers shared by the .cu files of the CUDA backend (internal header).
#pragma once
#include <cstdint>

#include "base/dtype.h"   // KvDtype
#include "base/kv_fp8.h"  // fp8 KV rows: kvfp8::quantize / dequantize (shared with the CPU)

namespace v4::cuda {

// ---- Programmatic dependent launch (sm_90; no-ops on older targets and without the launch
// attribute cudaLaunchAttributeProgrammaticStreamSerialization) ------------------------------
/// griddepcontrol.wait: blocks until the previous kernel of the stream has completed and its
/// memory is visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/// griddepcontrol.launch_dependents: the next PDL-launched kernel may be scheduled once every CTA
/// of this grid has executed it (or exited).
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

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
/// Value c of row `row` of an attention KV pool (rows of `dim` values, `rope_dim` of them rope):
/// f32 / bf16 as kv_load; kFp8 rows (kv_fp8_layout(dim, rope_dim)) dequantized (nope: code ·
/// its block's scale, kvfp8::dequantize; rope: bf16 widened), as the CPU backend reads them.
__device__ __forceinline__ float kv_row_load(const void* pool, KvDtype dt, int64_t row, int dim,
                                             int c, int rope_dim) {
  if (dt != KvDtype::kFp8) return kv_load(pool, dt, row * dim + c);
  const KvFp8Layout L = kv_fp8_layout(dim, rope_dim);
  const unsigned char* p = static_cast<const unsigned char*>(pool) + row * L.bytes;
  if (c < L.nope)
    return kvfp8::dequantize(
        p[c], __ldg(reinterpret_cast<const float*>(p + L.scale_off) + c / KvFp8Layout::kBlock));
  return __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(p + L.rope_off)[c - L.nope])
                         << 16);
}
/// Values [c, c + 4) of row `row` (c % 4 == 0) as kv_row_load; kFp8 needs (dim − rope_dim) % 4
/// == 0 (the 4 values are all nope, in one 64-block, or all rope) — the host checks it.
__device__ __forceinline__ float4 kv_row_load4(const void* pool, KvDtype dt, int64_t row, int dim,
                                               int c, int rope_dim) {
  if (dt != KvDtype::kFp8) return kv_load4(pool, dt, row * dim + c);
  const KvFp8Layout L = kv_fp8_layout(dim, rope_dim);
  const unsigned char* p = static_cast<const unsigned char*>(pool) + row * L.bytes;
  if (c < L.nope) {
    const float s =
        __ldg(reinterpret_cast<const float*>(p + L.scale_off) + c / KvFp8Layout::kBlock);
    const uint32_t w = __ldg(reinterpret_cast<const unsigned int*>(p + c));  // 4 codes
    return make_float4(kvfp8::dequantize(uint8_t(w & 0xffu), s),
                       kvfp8::dequantize(uint8_t((w >> 8) & 0xffu), s),
                       kvfp8::dequantize(uint8_t((w >> 16) & 0xffu), s),
                       kvfp8::dequantize(uint8_t(w >> 24), s));
  }
  const uint2 u = __ldg(reinterpret_cast<const uint2*>(p + L.rope_off + 2 * (c - L.nope)));
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                     __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
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

/// Four e4m3 codes (byte i = code i) → bf16 pairs (codes 0, 1) and (codes 2, 3), exact for every
/// finite code (subnormals included; NaN codes give finite values): the code's exponent and
/// mantissa bits moved into bf16 position, then one bf16x2 multiply by 2^120 rebiases the exponent
/// (indexer.cu's pipelined decode kernel, indexer_prefill.cu).
__device__ __forceinline__ uint2 e4m3x4_to_bf16x4_fast(uint32_t w) {
  uint2 r;
  const uint32_t lo = __byte_perm(w, 0u, 0x4140u);  // bytes [c0, 0, c1, 0]
  const uint32_t hi = __byte_perm(w, 0u, 0x4342u);  // bytes [c2, 0, c3, 0]
  const uint32_t ml = ((lo & 0x007f007fu) << 4) | ((lo & 0x00800080u) << 8);
  const uint32_t mh = ((hi & 0x007f007fu) << 4) | ((hi & 0x00800080u) << 8);
  const uint32_t k2p120 = 0x7b807b80u;  // bf16 2^120 in both halves (exponent 247)
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r.x) : "r"(ml), "r"(k2p120));
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r.y) : "r"(mh), "r"(k2p120));
  return r;
}

}  // namespace v4::cuda
