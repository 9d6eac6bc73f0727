// Device-side reading of ops::WeightView matrices in their stored format (internal header of the
// CUDA backend). Formats (ops.h WFormat, docs/checkpoint-format.md, dsv4-model.md §11.2):
//   kF32      f32 [E, rows_total, K]
//   kBF16     bf16 bits [E, rows_total, K]
//   kFP8Block e4m3fn [E, rows_total, K]; scale f32 [E, ceil(rows_total/128), ceil(K/128)]
//   kMXFP4    e2m1 nibbles [E, rows_total, K/2] (low nibble = even k);
//             scale ue8m0 [E, rows_total, K/32]
// A view selects rows [row0, row0 + n) of each expert; scales are indexed with the absolute row.
// Every conversion here is exact (e4m3, e2m1, bf16 and powers of two are exact in f32), and the
// dequantized value of `wval` is the f32 product value·scale the CPU loader computes, so fp32-mode
// kernels see bit-identical weights.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ops/ops.h"

namespace v4::cuda {

using ops::WeightView;
using ops::WFormat;

/// Bytes of one stored row of `k` values.
__host__ __device__ inline int64_t wrow_bytes(WFormat f, int64_t k) {
  switch (f) {
    case WFormat::kF32:
      return 4 * k;
    case WFormat::kBF16:
      return 2 * k;
    case WFormat::kFP8Block:
      return k;
    case WFormat::kMXFP4:
      return k / 2;
  }
  return 0;
}

/// Stored bytes of view row `n` (absolute row row0 + n) of expert `e`.
__host__ __device__ inline const uint8_t* wrow(const WeightView& w, int64_t e, int64_t n) {
  return static_cast<const uint8_t*>(w.data) +
         (e * w.rows_total + w.row0 + n) * wrow_bytes(w.format, w.k);
}

/// kFP8Block: the f32 scales of view row n of expert e (one per 128 columns).
__host__ __device__ inline const float* fp8_scale_row(const WeightView& w, int64_t e, int64_t n) {
  const int64_t rb = (w.rows_total + 127) / 128, kb = (w.k + 127) / 128;
  return static_cast<const float*>(w.scale) + (e * rb + (w.row0 + n) / 128) * kb;
}

/// kMXFP4: the ue8m0 scale bytes of view row n of expert e (one per 32 columns).
__host__ __device__ inline const uint8_t* mxfp4_scale_row(const WeightView& w, int64_t e,
                                                          int64_t n) {
  return static_cast<const uint8_t*>(w.scale) + (e * w.rows_total + w.row0 + n) * (w.k / 32);
}

/// Two e4m3fn bytes (low byte first) -> two f32 (exact; 0x7f/0xff -> NaN). sm_89+ cvt.
__device__ __forceinline__ float2 e4m3x2_to_f32(uint32_t two) {
  uint32_t h2;
  const unsigned short in = static_cast<unsigned short>(two & 0xffffu);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(in));
  __half2_raw raw;
  raw.x = static_cast<unsigned short>(h2 & 0xffffu);
  raw.y = static_cast<unsigned short>(h2 >> 16);
  return __half22float2(__half2(raw));
}

__device__ __forceinline__ float e4m3_to_f32(uint32_t b) {
  return e4m3x2_to_f32(b & 0xffu).x;
}

/// ue8m0 byte -> 2^(b − 127) exactly (b = 0 -> 2^-127, a denormal; 255 -> NaN).
__device__ __forceinline__ float ue8m0_to_f32(uint32_t b) {
  if (b == 0xffu) return __uint_as_float(0x7fc00000u);
  if (b == 0u) return __uint_as_float(0x00400000u);
  return __uint_as_float(b << 23);
}

/// One e2m1 nibble (bits 0..3) -> f32 (exact): {0, .5, 1, 1.5, 2, 3, 4, 6}, sign bit 3.
__device__ __forceinline__ float e2m1_to_f32(uint32_t nib) {
  // exponent e = bits 1..2, mantissa m = bit 0: e = 0 -> m·0.5, else 2^(e−1)·(1 + m/2).
  const uint32_t e = (nib >> 1) & 3u, m = nib & 1u;
  const float mag = e == 0 ? 0.5f * float(m) : __uint_as_float((e + 126u) << 23 | m << 22);
  return (nib & 8u) ? -mag : mag;
}

/// One byte of two e2m1 nibbles -> two f32 values scaled by 2^-14 (exact): the nibble's
/// e1 e0 m bits placed at f16 bits 11..9 (sign at 15) are e2m1·2^-14 including the subnormal 0.5.
/// Callers multiply the dot product by 2^14 (with the block scale).
__device__ __forceinline__ float2 e2m1x2_to_f32_2m14(uint32_t b) {
  const uint32_t h =
      ((b & 0x8u) << 12) | ((b & 0x7u) << 9) | ((b & 0x80u) << 24) | ((b & 0x70u) << 21);
  __half2_raw raw;
  raw.x = static_cast<unsigned short>(h & 0xffffu);
  raw.y = static_cast<unsigned short>(h >> 16);
  return __half22float2(__half2(raw));
}

/// f16x2 bits -> two f32 (low half first), exact.
__device__ __forceinline__ float2 f16x2_bits_to_f32(uint32_t h) {
  __half2_raw raw;
  raw.x = static_cast<unsigned short>(h & 0xffffu);
  raw.y = static_cast<unsigned short>(h >> 16);
  return __half22float2(__half2(raw));
}

/// 4 bytes of packed e2m1 (8 values, low nibble first) -> 8 f32 values scaled by 2^-14 (exact),
/// ~3 integer ops per value: bytes are spread to 16-bit lanes with one byte permute, then the
/// low and the high nibbles of two bytes become f16x2 words with two shifts and masks each
/// (the e2m1x2_to_f32_2m14 placement).
__device__ __forceinline__ void e2m1x8_to_f32_2m14(uint32_t u, float* f) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t a = __byte_perm(u, 0u, h ? 0x4342u : 0x4140u);  // [b, 0, b', 0]
    const uint32_t lo = ((a << 12) & 0x80008000u) | ((a << 9) & 0x0E000E00u);
    const uint32_t hi = ((a << 8) & 0x80008000u) | ((a << 5) & 0x0E000E00u);
    const float2 l = f16x2_bits_to_f32(lo), g = f16x2_bits_to_f32(hi);
    f[4 * h] = l.x;
    f[4 * h + 1] = g.x;
    f[4 * h + 2] = l.y;
    f[4 * h + 3] = g.y;
  }
}

/// Dequantized W[n, kk] of view row n, expert e (f32; FP8: e4m3·scale, MXFP4: e2m1·2^(s−127),
/// each one f32 multiply, as the CPU loader computes it).
__device__ __forceinline__ float wval(const WeightView& w, int64_t e, int64_t n, int64_t kk) {
  const uint8_t* row = wrow(w, e, n);
  switch (w.format) {
    case WFormat::kF32:
      return reinterpret_cast<const float*>(row)[kk];
    case WFormat::kBF16:
      return __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(row)[kk]) << 16);
    case WFormat::kFP8Block:
      return e4m3_to_f32(row[kk]) * fp8_scale_row(w, e, n)[kk / 128];
    case WFormat::kMXFP4: {
      const uint32_t byte = row[kk / 2];
      const uint32_t nib = (kk & 1) ? (byte >> 4) : (byte & 0xfu);
      return e2m1_to_f32(nib) * ue8m0_to_f32(mxfp4_scale_row(w, e, n)[kk / 32]);
    }
  }
  return 0.f;
}

}  // namespace v4::cuda
