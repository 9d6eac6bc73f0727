// Element generator of `Ops::fill_random` (ops.h), shared by the CPU backend and the CUDA kernel
// (src/ops/cuda/fill.cu) so both write identical bytes for the same (seed, index).
//
// RNG: counter-based. Element i of a call with seed s uses the 64-bit hash
//   h(s, i) = mix64(mix64(s) + (i + 1) · 0x9E3779B97F4A7C15),   mix64 = splitmix64's finalizer,
// so the value of element i depends on nothing but (s, i): any thread split gives the same bytes.
// "Normal" values are the Irwin–Hall sum of the hash's four 16-bit fields, centred and scaled to
// unit variance: an integer in [−131070, 131070] times one f32 constant, so no transcendental
// function (whose last bit differs between libm and CUDA) is involved; the distribution is
// bounded at ±3.46 σ and otherwise close to N(0, 1). Every step is integer arithmetic or one
// correctly rounded f32 multiply, identical on the host and the device.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/ops.h"  // RandomFill, V4_HOST_DEVICE

namespace v4::ops::fill {

/// splitmix64's output function (Steele, Lea, Flood 2014).
V4_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// The hash of element i for a call whose seed was pre-mixed: `seed_mixed` = mix64(seed).
V4_HOST_DEVICE inline uint64_t element_hash(uint64_t seed_mixed, uint64_t i) {
  return mix64(seed_mixed + (i + 1) * 0x9e3779b97f4a7c15ull);
}

/// 1 / standard deviation of a sum of four uniform 16-bit integers: sqrt(12 / (4·(65536² − 1))),
/// rounded to f32.
constexpr float kIrwinHallInvStd = 2.6428997e-05f;

/// Irwin–Hall integer of a hash: Σ of its four 16-bit fields − 131070 (mean), in [−131070, 131070].
V4_HOST_DEVICE inline int32_t centred_sum(uint64_t h) {
  const int32_t s = int32_t(h & 0xffff) + int32_t((h >> 16) & 0xffff) +
                    int32_t((h >> 32) & 0xffff) + int32_t((h >> 48) & 0xffff);
  return s - 131070;
}

/// Approximately normal value with standard deviation `std_scale` = kIrwinHallInvStd · scale
/// (pre-multiplied once per call so that each element costs one correctly rounded multiply).
V4_HOST_DEVICE inline float normal_value(uint64_t h, float std_scale) {
  return float(centred_sum(h)) * std_scale;
}

V4_HOST_DEVICE inline uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#endif
}
V4_HOST_DEVICE inline float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}

/// f32 -> bf16 bits, round to nearest even (finite inputs).
V4_HOST_DEVICE inline uint16_t to_bf16(float f) {
  uint32_t u = f32_bits(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

/// f32 -> FP8 e4m3fn byte, round to nearest even, saturating to ±448 (never a NaN code).
V4_HOST_DEVICE inline uint8_t to_e4m3(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x43e00000u) return uint8_t(sign | 0x7e);  // |f| >= 448 (and inf): max finite
  if (a < 0x3c800000u) {                              // |f| < 2^-6: subnormal, step 2^-9
    // |f| · 512 is exact; round half to even by hand (code 8 = the smallest normal, also right).
    const float x = bits_f32(a) * 512.f;
    uint32_t q = uint32_t(x);
    const float r = x - float(q);
    if (r > 0.5f || (r == 0.5f && (q & 1u))) ++q;
    return uint8_t(sign | q);
  }
  // Normal: keep 3 mantissa bits with round-to-nearest-even on the f32 bits.
  uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
  const int exp = int(r >> 23) - 127 + 7;  // e4m3 exponent field (1..15)
  uint32_t code = (uint32_t(exp) << 3) | ((r >> 20) & 7u);
  if (code > 0x7eu) code = 0x7eu;
  return uint8_t(sign | code);
}

/// Parameters of one call, derived once from (kind, scale, seed) on the host.
struct FillParams {
  RandomFill kind = RandomFill::kF32Normal;
  uint64_t seed_mixed = 0;
  float std_scale = 0.f;     // normal kinds: kIrwinHallInvStd · scale
  float constant = 0.f;      // kF32Constant
  int32_t ue8m0_base = 127;  // kUe8m0: 127 + round(log2(scale)), clamped to [1, 253]
  uint32_t bound = 1;        // kI32Uniform: values in [0, bound)
};

/// FillParams of a call (host side; ue8m0 base = 127 + round(log2(scale)), i32 bound = scale).
inline FillParams make_params(RandomFill kind, float scale, uint64_t seed) {
  FillParams p;
  p.kind = kind;
  p.seed_mixed = mix64(seed);
  p.std_scale = kIrwinHallInvStd * scale;
  p.constant = scale;
  if (kind == RandomFill::kUe8m0) {
    const long e = scale > 0 ? std::lround(std::log2(double(scale))) : 0;
    p.ue8m0_base = int32_t(std::min<long>(253, std::max<long>(1, 127 + e)));
  }
  if (kind == RandomFill::kI32Uniform) p.bound = scale >= 1 ? uint32_t(scale) : 1u;
  return p;
}

/// Bytes of one stored unit of `kind` (f32/i32 4, bf16 2, e4m3/e2m1-pair/ue8m0 1).
V4_HOST_DEVICE inline int unit_bytes(RandomFill kind) {
  switch (kind) {
    case RandomFill::kF32Normal:
    case RandomFill::kF32Constant:
    case RandomFill::kI32Uniform:
      return 4;
    case RandomFill::kBF16Normal:
      return 2;
    default:
      return 1;
  }
}

/// Writes unit i of the call described by `p` into `dst` (a buffer of the kind's unit type).
V4_HOST_DEVICE inline void fill_one(void* dst, uint64_t i, const FillParams& p) {
  const uint64_t h = element_hash(p.seed_mixed, i);
  switch (p.kind) {
    case RandomFill::kF32Normal:
      static_cast<float*>(dst)[i] = normal_value(h, p.std_scale);
      break;
    case RandomFill::kF32Constant:
      static_cast<float*>(dst)[i] = p.constant;
      break;
    case RandomFill::kBF16Normal:
      static_cast<uint16_t*>(dst)[i] = to_bf16(normal_value(h, p.std_scale));
      break;
    case RandomFill::kE4M3Normal:
      static_cast<uint8_t*>(dst)[i] = to_e4m3(normal_value(h, p.std_scale));
      break;
    case RandomFill::kE2M1Packed:
      static_cast<uint8_t*>(dst)[i] = uint8_t(h >> 56);  // two uniform 4-bit codes
      break;
    case RandomFill::kUe8m0: {
      const int32_t jitter = int32_t((h >> 32) % 3u) - 1;  // −1, 0, +1
      static_cast<uint8_t*>(dst)[i] = uint8_t(p.ue8m0_base + jitter);
      break;
    }
    case RandomFill::kI32Uniform:
      static_cast<int32_t*>(dst)[i] = int32_t((h >> 32) % p.bound);
      break;
  }
}

}  // namespace v4::ops::fill
