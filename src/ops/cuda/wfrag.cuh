// Device helpers shared by the tensor-core kernels over native weight bytes (moe_mma.cu,
// dense_mma.cu; internal header of the CUDA backend): cp.async, ldmatrix, bf16 mma.sync, and the
// weight-fragment layout — a lane dequantizes its own 16-byte chunks (KC per row per k-tile) into
// mma A fragments, K permuted inside each k-tile; x_logical maps a stored k position to the
// logical one the staged x rows must use (see moe_mma.cu for the derivation).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "ops/cuda/wformat.cuh"

namespace v4::cuda::wfrag {

constexpr int kKC = 2;  // 16-byte chunks per lane per row per k-tile

template <WFormat F>
constexpr int kV = F == WFormat::kMXFP4 ? 32 : 16;  // stored values per 16 bytes
template <WFormat F>
constexpr int kKT = kKC * 4 * kV<F>;  // values per k-tile (MXFP4 256, FP8 128)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
template <int B>
__device__ __forceinline__ void cp_async_small(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_u32(dst)), "l"(src),
               "n"(B), "r"(valid ? B : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo (low half)
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void mma_bf16(float* d, uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// D += A · B on f16 tensor cores (m16n8k16, f32 accumulate); fragments as mma_bf16 with f16
// pairs (PTX ISA, mma.m16n8k16 with .f16).
__device__ __forceinline__ void mma_f16(float* d, uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// D += A · B on e4m3 tensor cores (m16n8k32, f32 accumulate; sm_89+). Registers hold 4 codes
// each, lowest k in the low byte: A a0 = (row g, k 4t..4t+3), a1 = (row g+8, same k), a2 = (row
// g, k 16+4t..+3), a3 = (row g+8, same); B b0 = (k 4t..4t+3, col g), b1 = (k 16+4t..+3, col g);
// D as mma_bf16 (PTX ISA, mma.m16n8k32 with .e4m3).
__device__ __forceinline__ void mma_e4m3(float* d, uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

__device__ __forceinline__ float swiglu_f(float g, float u, float lim) {
  if (lim > 0.f) {
    g = fminf(g, lim);
    u = fminf(fmaxf(u, -lim), lim);
  }
  return g / (1.f + expf(-g)) * u;
}

// bf16x2 of 2^e (e in [-126, 127]) in both halves.
__device__ __forceinline__ uint32_t pow2_bf16x2(int e) {
  const uint32_t b = uint32_t(e + 127) << 7;
  return b | (b << 16);
}
__device__ __forceinline__ uint32_t hmul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// MXFP4: one 32-bit word of 8 e2m1 values v0..v7 (low nibble first) → 4 bf16x2 words
// (v0, v4), (v1, v5), (v2, v6), (v3, v7): each nibble's sign goes to bit 15 and its 3 magnitude
// bits to bits 8..6, which is e2m1 · 2^-126 in bf16 (the e2m1 subnormal 0.5 becomes the bf16
// subnormal 2^-127), then one multiply by 2^(s − 1) gives e2m1 · 2^(s − 127) exactly (two
// multiplies when 2^(s − 1) is not a bf16 normal: s > 128). ~2.5 integer/bf16 ops per value.
// The bit placement alone: e2m1 · 2^-126 as bf16x2 words (v0, v4), (v1, v5), (v2, v6), (v3, v7).
__device__ __forceinline__ void e2m1x8_place(uint32_t u, uint32_t (&o)[4]) {
  constexpr uint32_t kMag = 0x01C001C0u, kSgn = 0x80008000u;
  o[0] = ((u << 6) & kMag) | ((u << 12) & kSgn);
  o[1] = ((u << 2) & kMag) | ((u << 8) & kSgn);
  o[2] = ((u >> 2) & kMag) | ((u << 4) & kSgn);
  o[3] = ((u >> 6) & kMag) | (u & kSgn);
}
__device__ __forceinline__ void e2m1x8_to_bf16(uint32_t u, uint32_t m1, uint32_t m2, bool two,
                                               uint32_t (&o)[4]) {
  e2m1x8_place(u, o);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[i] = hmul_bf16x2(o[i], m1);
    if (two) o[i] = hmul_bf16x2(o[i], m2);
  }
}

// Whether any of the 8 scale bytes in (lo, hi) is > 128 (MXFP4: 2^(s−1) is no bf16 normal, the
// dequantization needs its second multiply). Per byte: bit 7 set and a low bit set (the add
// cannot carry across bytes: 0x7f + 0x7f < 0x100).
__device__ __forceinline__ bool scale_over_128(uint32_t lo, uint32_t hi) {
  const uint32_t a = lo & ((lo & 0x7f7f7f7fu) + 0x7f7f7f7fu);
  const uint32_t b = hi & ((hi & 0x7f7f7f7fu) + 0x7f7f7f7fu);
  return ((a | b) & 0x80808080u) != 0u;
}

// MXFP4 chunk → A fragments of two k steps as wfrag::dequant_steps, with the second multiply
// (scales > 128) a compile-time choice: TWO = false is exact only when every scale of the
// k-tile is ≤ 128 (the caller checks this warp-wide), and then does exactly the same bf16
// operations as dequant_steps (the second multiply of dequant_steps is skipped there too), so
// both forms give the same bits.
template <bool TWO>
__device__ __forceinline__ void e2m1x8_bf16_t(uint32_t u, uint32_t m1, uint32_t m2,
                                              uint32_t (&o)[4]) {
  e2m1x8_place(u, o);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[i] = hmul_bf16x2(o[i], m1);
    if constexpr (TWO) o[i] = hmul_bf16x2(o[i], m2);
  }
}

// Per-chunk MXFP4 multipliers: TWO = false: m1 = 2^(s−1) (s ≤ 128 guaranteed by the caller);
// TWO = true: as wfrag::chunk_scale, with m2 = 1 when s ≤ 128 (an exact multiply).
template <bool TWO>
__device__ __forceinline__ void mx_scale_t(int s, uint32_t& m1, uint32_t& m2) {
  if constexpr (TWO) {
    const bool two = s > 128;
    m1 = two ? pow2_bf16x2(126) : pow2_bf16x2(s - 1);
    m2 = two ? pow2_bf16x2(s - 127) : pow2_bf16x2(0);
  } else {
    m1 = pow2_bf16x2(s - 1);
    m2 = 0u;
  }
}

// Two logical k steps (s2 = 0..V/8−1) of a lane's chunks `qa` (row g) and `qb` (row g + 8):
// {a0, a1, a2, a3} of each step. MXFP4: word s2 (8 values) makes both steps — step 0: a0/a1 =
// (v0, v4), a2/a3 = (v1, v5); step 1: (v2, v6), (v3, v7). FP8: words 2·s2 + h (4 values each)
// make step h — a0/a1 = (b0, b2), a2/a3 = (b1, b3). The x staging (x_logical) uses the same map.
template <WFormat F>
struct ChunkScale {
  float f;           // FP8: the block scale
  uint32_t m1, m2;   // MXFP4: bf16x2 multipliers
  bool two;
};

template <WFormat F>
__device__ __forceinline__ ChunkScale<F> chunk_scale(const unsigned char* sc_row, int q) {
  ChunkScale<F> c;
  if constexpr (F == WFormat::kMXFP4) {
    const int s = sc_row[q];
    c.two = s > 128;
    c.m1 = c.two ? pow2_bf16x2(126) : pow2_bf16x2(s - 1);
    c.m2 = c.two ? pow2_bf16x2(s - 127) : 0u;
    c.f = 0.f;
  } else {
    c.f = *reinterpret_cast<const float*>(sc_row);
    c.m1 = c.m2 = 0u;
    c.two = false;
  }
  return c;
}

template <WFormat F>
__device__ __forceinline__ void dequant_steps(const uint4& qa, const uint4& qb, int s2,
                                              const ChunkScale<F>& sa, const ChunkScale<F>& sb,
                                              uint32_t (&A)[2][4]) {
  if constexpr (F == WFormat::kMXFP4) {
    uint32_t oa[4], ob[4];
    e2m1x8_to_bf16((&qa.x)[s2], sa.m1, sa.m2, sa.two, oa);
    e2m1x8_to_bf16((&qb.x)[s2], sb.m1, sb.m2, sb.two, ob);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      A[h][0] = oa[2 * h];
      A[h][1] = ob[2 * h];
      A[h][2] = oa[2 * h + 1];
      A[h][3] = ob[2 * h + 1];
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t wa = (&qa.x)[2 * s2 + h], wb = (&qb.x)[2 * s2 + h];
      const float2 a01 = e4m3x2_to_f32(wa & 0xffffu), a23 = e4m3x2_to_f32(wa >> 16);
      const float2 b01 = e4m3x2_to_f32(wb & 0xffffu), b23 = e4m3x2_to_f32(wb >> 16);
      A[h][0] = pack_bf16(a01.x * sa.f, a23.x * sa.f);  // (b0, b2)
      A[h][1] = pack_bf16(b01.x * sb.f, b23.x * sb.f);
      A[h][2] = pack_bf16(a01.y * sa.f, a23.y * sa.f);  // (b1, b3)
      A[h][3] = pack_bf16(b01.y * sb.f, b23.y * sb.f);
    }
  }
}

// Logical position (within the k-tile) of stored value q of a k-tile (see the file comment and
// dequant_steps): chunk c = q / 4V of lane t = (q / V) % 4 plays step c·V/4 + st, position pos.
template <WFormat F>
__host__ __device__ __forceinline__ constexpr int x_logical(int q) {
  constexpr int V = kV<F>;
  const int c = q / (4 * V), t = (q / V) & 3, r = q % V;
  int st, pos;
  if constexpr (F == WFormat::kMXFP4) {
    const int j = r / 8, i = r % 8;
    st = 2 * j + ((i >> 1) & 1);
    pos = 2 * t + (i >> 2) + (i & 1) * 8;
  } else {
    const int j = r / 4, i = r % 4;
    st = j;
    pos = 2 * t + (i >> 1) + (i & 1) * 8;
  }
  return (c * (V / 4) + st) * 16 + pos;
}

}  // namespace v4::cuda::wfrag
