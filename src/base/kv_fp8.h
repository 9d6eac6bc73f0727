// FP8 KV rows (--kv-cache-dtype fp8): the quantizer shared bit for bit by the CPU backend (the
// reference) and the CUDA kernels (the functions below compile for host and device; the same
// integer and IEEE f32 operations on both, so a device-stored row equals the host's byte for
// byte). Row layout: KvFp8Layout (base/dtype.h); indexer keys (KvDtype::kFp8Index):
// KvFp8IndexLayout, one block of all n values (same rules, RoPE channels quantized too).
//
// Per block of 64 nope values (the last block may be shorter):
//   amax  = max |x| over the block's finite values (0 if none)
//   scale = amax / 448 (f32 division, round to nearest) if amax ≥ 2^-64, else 0
//   code  = e4m3(x / scale): round to nearest even, saturating to ±448 (x / scale is ≤ 448 up to
//           one rounding); scale 0 → code 0x00 (the block reads back as zeros)
//   non-finite x (NaN, ±Inf) → code 0x7f (e4m3 NaN): it reads back as NaN, as an f32 pool would
//           propagate it (Inf becomes NaN); it does not enter amax
// Read: x' = e4m3_value(code) · scale. Rope values: bf16, round to nearest even (NaN stays NaN).
// Padding bytes (after the scales, after the rope values) are written as zeros.
// Why 2^-64: scale stays a normal f32 (≥ 2^-73), so the result does not depend on whether a
// device flushes subnormals; rows this small are zeros to attention anyway.
#pragma once
#include <cstdint>
#include <cstring>

#include "base/dtype.h"

#if defined(__CUDACC__)
#define V4_KV_HD __host__ __device__ __forceinline__
#else
#define V4_KV_HD inline
#endif

namespace v4::kvfp8 {

V4_KV_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
V4_KV_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
/// a / b rounded to nearest (IEEE; also under --use_fast_math on the device).
V4_KV_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
/// a · b rounded to nearest (no contraction into an FMA).
V4_KV_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/// Smallest block amax that gets a nonzero scale (2^-64).
constexpr float kMinAmax = 5.421010862427522170e-20f;
/// The e4m3fn NaN code written for non-finite inputs.
constexpr uint8_t kNanCode = 0x7f;

/// f32 → e4m3fn code: round to nearest even, saturating to ±448 (±Inf too), NaN → 0x7f.
/// Integer-only: the same result on host and device (equals f32_to_fp8e4m3 of base/dtype.h for
/// every f32, which tests check).
V4_KV_HD uint8_t e4m3_encode(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return kNanCode;
  if (a >= 0x43e00000u) return uint8_t(sign | 0x7eu);  // ≥ 448 (RNE of [448, 464) is 448)
  const uint32_t ef = a >> 23;                          // f32 biased exponent
  if (a < 0x3c800000u) {                                // < 2^-6: e4m3 subnormals k · 2^-9
    if (ef == 0) return sign;                           // f32 subnormal: rounds to 0
    const uint32_t sig = (a & 0x7fffffu) | 0x800000u;   // value = sig · 2^(ef − 150)
    const uint32_t shift = 141u - ef;                   // value · 2^9 = sig >> shift; ≥ 21
    if (shift >= 32u) return sign;
    uint32_t q = sig >> shift;
    const uint32_t rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return uint8_t(sign | q);  // q ≤ 8; q == 8 is the code of 2^-6 (exponent 1, mantissa 0)
  }
  uint32_t e = ef - 120u;  // e4m3 biased exponent 1..15
  uint32_t keep = (a >> 20) & 7u;
  const uint32_t rest = a & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (keep & 1u))) ++keep;
  if (keep == 8u) {
    keep = 0;
    ++e;
  }
  if (e > 15u || (e == 15u && keep == 7u)) return uint8_t(sign | 0x7eu);
  return uint8_t(sign | (e << 3) | keep);
}

/// e4m3fn code → f32 (exact; 0x7f / 0xff → NaN).
V4_KV_HD float e4m3_decode(uint8_t c) {
  const uint32_t sign = uint32_t(c & 0x80u) << 24;
  const uint32_t e = (c >> 3) & 15u, m = c & 7u;
  if (e == 15u && m == 7u) return bits_f32(0x7fc00000u);
  if (e == 0u) return bits_f32(f32_bits(float(m) * 0.001953125f) | sign);  // m · 2^-9
  return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

/// |x| for finite x, 0 for NaN / ±Inf (the amax term of one value).
V4_KV_HD float abs_finite(float x) {
  const uint32_t a = f32_bits(x) & 0x7fffffffu;
  return a >= 0x7f800000u ? 0.f : bits_f32(a);
}
/// The scale of a block whose finite values have max |x| = amax.
V4_KV_HD float block_scale(float amax) { return amax >= kMinAmax ? div_rn(amax, 448.f) : 0.f; }
/// The code of x in a block of scale `scale`.
V4_KV_HD uint8_t quantize(float x, float scale) {
  if ((f32_bits(x) & 0x7fffffffu) >= 0x7f800000u) return kNanCode;
  if (scale == 0.f) return 0;
  return e4m3_encode(div_rn(x, scale));
}
/// The value a code of a block of scale `scale` reads back as.
V4_KV_HD float dequantize(uint8_t code, float scale) { return mul_rn(e4m3_decode(code), scale); }
/// f32 → bf16 bits, round to nearest even, NaN stays NaN (= f32_to_bf16 of base/dtype.h).
V4_KV_HD uint16_t bf16_encode(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

/// Host: quantizes one row src[dim] (dim = L.nope + L.rope) into dst[L.bytes] (every byte written).
inline void quantize_row(const float* src, const KvFp8Layout& L, uint8_t* dst) {
  std::memset(dst, 0, size_t(L.bytes));
  for (int b = 0; b < L.n_scales; ++b) {
    const int c0 = b * KvFp8Layout::kBlock;
    const int c1 = c0 + KvFp8Layout::kBlock < L.nope ? c0 + KvFp8Layout::kBlock : L.nope;
    float amax = 0.f;
    for (int c = c0; c < c1; ++c) {
      const float v = abs_finite(src[c]);
      amax = v > amax ? v : amax;
    }
    const float scale = block_scale(amax);
    std::memcpy(dst + L.scale_off + 4 * b, &scale, 4);
    for (int c = c0; c < c1; ++c) dst[c] = quantize(src[c], scale);
  }
  for (int i = 0; i < L.rope; ++i) {
    const uint16_t h = bf16_encode(src[L.nope + i]);
    std::memcpy(dst + L.rope_off + 2 * i, &h, 2);
  }
}
/// Host: one stored row → out[dim] f32.
inline void dequantize_row(const uint8_t* row, const KvFp8Layout& L, float* out) {
  for (int c = 0; c < L.nope; ++c) {
    float scale;
    std::memcpy(&scale, row + L.scale_off + 4 * (c / KvFp8Layout::kBlock), 4);
    out[c] = dequantize(row[c], scale);
  }
  for (int i = 0; i < L.rope; ++i) {
    uint16_t h;
    std::memcpy(&h, row + L.rope_off + 2 * i, 2);
    out[L.nope + i] = bf16_to_f32(h);
  }
}

/// Host: quantizes one indexer-key row src[L.n] into dst[L.bytes] (KvFp8IndexLayout, every byte
/// written, the padding zero): one block of all n values, with the rules above (amax over the
/// finite values, block_scale, quantize; RoPE channels are quantized like the others).
inline void quantize_index_row(const float* src, const KvFp8IndexLayout& L, uint8_t* dst) {
  float amax = 0.f;
  for (int c = 0; c < L.n; ++c) {
    const float v = abs_finite(src[c]);
    amax = v > amax ? v : amax;
  }
  const float scale = block_scale(amax);
  for (int c = 0; c < L.n; ++c) dst[c] = quantize(src[c], scale);
  std::memcpy(dst + L.scale_off, &scale, 4);
  for (int b = L.scale_off + 4; b < L.bytes; ++b) dst[b] = 0;
}
/// Host: the scale of a stored indexer-key row.
inline float index_row_scale(const uint8_t* row, const KvFp8IndexLayout& L) {
  float scale;
  std::memcpy(&scale, row + L.scale_off, 4);
  return scale;
}
/// Host: one stored indexer-key row → out[L.n] f32 (code value · scale, dequantize).
inline void dequantize_index_row(const uint8_t* row, const KvFp8IndexLayout& L, float* out) {
  const float scale = index_row_scale(row, L);
  for (int c = 0; c < L.n; ++c) out[c] = dequantize(row[c], scale);
}

/// The multiplier of an fp8 indexer query head of scale `scale` (index_query_fp8): 1 / scale
/// rounded to nearest, 0 for scale 0.
V4_KV_HD float index_query_inv(float scale) { return scale > 0.f ? div_rn(1.f, scale) : 0.f; }

/// Host: the query head q[n] as an fp8 indexer scores it against kFp8Index keys (IndexerArgs):
///   scale = block_scale(amax over the finite values)   (as an index row)
///   code  = e4m3_encode(x · index_query_inv(scale))    (RNE, saturating; NaN → 0x7f)
///   dst   = dequantize(code, scale)
/// A product with the rounded inverse, not a division (unlike the key rows), so the CUDA kernels
/// quantize q with one multiply and the hardware cvt.rn.satfinite.e4m3x2.f32 per value and get the
/// same codes (e4m3_encode is RNE + satfinite too). The scores are then Σ_h w_h · ReLU(q̂_h · k̂)
/// with both sides e4m3 codes times one f32 scale, which the kernels compute as
/// s_q · s_k · Σ code_q · code_k (the official V4 indexer quantizes q and k alike: FP4
/// simulation, dsv4-model.md §6).
inline void index_query_fp8(const float* src, int n, float* dst) {
  float amax = 0.f;
  for (int c = 0; c < n; ++c) {
    const float v = abs_finite(src[c]);
    amax = v > amax ? v : amax;
  }
  const float scale = block_scale(amax), inv = index_query_inv(scale);
  for (int c = 0; c < n; ++c) dst[c] = dequantize(e4m3_encode(mul_rn(src[c], inv)), scale);
}

}  // namespace v4::kvfp8
