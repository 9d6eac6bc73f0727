// Counter-based uniform draws shared by the CPU sampler (engine/sampler.cpp) and the device
// sampler (ops/cuda/sampling.cu), so a seeded request draws the same numbers on both: the draw
// for a request's i-th generated token is sample_uniform(seed, i), independent of the batch.
// Header-only, usable from host and device code.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define V4_SAMPLE_HD __host__ __device__ __forceinline__
#else
#define V4_SAMPLE_HD inline
#endif

namespace v4::ops {

/// splitmix64 finalizer (Steele, Lea, Flood 2014): a bijective 64-bit mix.
V4_SAMPLE_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// A uniform double in [0, 1) from (seed, index): splitmix64 of both, top 53 bits. Exact in
/// IEEE double on host and device (integer ops, then a power-of-two scaling).
V4_SAMPLE_HD double sample_uniform(uint64_t seed, uint64_t index) {
  const uint64_t h = splitmix64(splitmix64(seed) ^ (index * 0xD1B54A32D192ED03ull));
  return double(h >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace v4::ops
