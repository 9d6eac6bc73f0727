#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// Tensor-core indexer scores over paged f32 keys (see indexer.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <mma.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/device_util.cuh"  // kv_load4 (f32 or bf16 key pools)
#include "ops/cuda/indexer.h"
#include "ops/cuda/wfrag.cuh"
#include "ops/cuda/tma.cuh"    // mbarriers, bulk copies (variant 30)
#include "ops/cuda/wgmma.cuh"  // descriptors, fences (shared with attention_dec.cu)

namespace v4::cuda {
namespace {

using namespace nvcuda;

constexpr int kKT = 64;       // keys per tile
constexpr int kThreads = 256;  // 8 warps
constexpr int kPad = 8;       // bf16 row padding (keeps WMMA pointers 32-byte aligned)

struct Layout {
  int nI, dI, ldq, ldk, ldc;
  size_t q_off, k_off, c_off, w_off, r_off, s_off, bytes;
};

__host__ __device__ inline size_t align128(size_t x) { return (x + 127) / 128 * 128; }

template <int kQB>
__host__ __device__ inline Layout make_layout(int nI, int dI) {
  Layout L;
  L.nI = nI;
  L.dI = dI;
  L.ldq = dI + kPad;
  L.ldk = dI + kPad;
  L.ldc = kKT + 4;
  L.q_off = 0;
  L.k_off = align128(L.q_off + size_t(kQB) * nI * L.ldq * 2);
  L.c_off = align128(L.k_off + size_t(kKT) * L.ldk * 2);
  L.w_off = align128(L.c_off + size_t(kQB) * nI * L.ldc * 4);
  L.r_off = align128(L.w_off + size_t(kQB) * nI * 4);
  L.s_off = align128(L.r_off + size_t(kKT) * 4);  // fp8 keys: row scale per key of the tile
  L.bytes = align128(L.s_off + size_t(kKT) * 4);
  return L;
}

// kQB = query rows per block group (1 for decode-shaped calls, 4 for prefill chunks).
// kFp8: kFp8Index key pools (separate instances, so the f32 / bf16 kernels are unchanged).
template <int kQB, bool kFp8>
__global__ void __launch_bounds__(kThreads) indexer_tc_kernel(ops::IndexerArgs a,
                                                              float* __restrict__ scores,
                                                              int64_t ld) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Layout L = make_layout<kQB>(a.n_heads, a.head_dim);
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem + L.q_off);
  __nv_bfloat16* ks = reinterpret_cast<__nv_bfloat16*>(smem + L.k_off);
  float* cs = reinterpret_cast<float*>(smem + L.c_off);
  float* wsm = reinterpret_cast<float*>(smem + L.w_off);
  int32_t* rows_s = reinterpret_cast<int32_t*>(smem + L.r_off);
  float* scale_s = reinterpret_cast<float*>(smem + L.s_off);
  const int nI = L.nI, dI = L.dI;
  // fp8 keys (kFp8Index rows, kv_fp8_index_layout(dI)): the tile holds the codes' exact values
  // (e4m3 ⊂ bf16), q is quantized per head (IndexerArgs) and staged as its codes' values, and the
  // two scales multiply outside the dot (score = s_k · Σ_h ReLU(codes_q,h · codes_k) · s_q,h · w_h;
  // scales ≥ 0).
  constexpr bool fp8 = kFp8;
  const int64_t fp8_row_bytes = kv_fp8_index_layout(dI).bytes;
  const int warp = threadIdx.x / 32;
  const int64_t t0 = int64_t(blockIdx.y) * kQB;
  const int nq = int(min(int64_t(kQB), a.n_rows - t0));
  // Rows of the group share a candidate list when their map offsets are equal.
  bool shared = true;
  for (int i = 1; i < nq; ++i) shared &= a.cand.offset[t0 + i] == a.cand.offset[t0];
  const int passes = shared ? 1 : nq;
  const float wscale = rsqrtf(float(nI)) * rsqrtf(float(dI));
  for (int pass = 0; pass < passes; ++pass) {
    const int64_t tq0 = shared ? t0 : t0 + pass;  // first query row of this pass
    const int pq = shared ? nq : 1;               // query rows of this pass
    int maxc = 0;
    for (int i = 0; i < pq; ++i) maxc = max(maxc, a.cand.count[tq0 + i]);
    if (int64_t(blockIdx.x) * kKT >= maxc) continue;
    __syncthreads();  // previous pass done with qs / wsm
    const float* qp = a.q + (tq0 * nI) * int64_t(dI);
    if (fp8) {  // per-head q scales (kvfp8::index_query_fp8) into wsm, a warp a head
      const int lane = threadIdx.x & 31;
      for (int r = warp; r < pq * nI; r += kThreads / 32) {
        float amax = 0.f;
        for (int c = lane; c < dI; c += 32) amax = fmaxf(amax, kvfp8::abs_finite(qp[r * dI + c]));
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if (lane == 0) wsm[r] = kvfp8::block_scale(amax);
      }
      __syncthreads();
    }
    // q rows (bf16; fp8 keys: q's e4m3 codes, exact in bf16) and head weights of the pass (fp8
    // keys: times the head's q scale).
    for (int e = threadIdx.x; e < pq * nI * dI; e += kThreads) {
      const int r = e / dI, c = e - r * dI;  // r = qi·nI + h
      const float x = qp[e];
      qs[r * L.ldq + c] = __float2bfloat16(
          fp8 ? kvfp8::e4m3_decode(kvfp8::e4m3_encode(kvfp8::mul_rn(x, kvfp8::index_query_inv(wsm[r]))))
              : x);
    }
    if (fp8) __syncthreads();  // every read of the scales done
    for (int e = threadIdx.x; e < pq * nI; e += kThreads)
      wsm[e] = a.weights[tq0 * nI + e] * wscale * (fp8 ? wsm[e] : 1.f);
    const int32_t* cand = a.cand.rows + a.cand.offset[tq0];
    const int mt = pq * nI / 16, nt = kKT / 16;
    for (int tile = blockIdx.x; tile * kKT < maxc; tile += gridDim.x) {
      const int s0 = tile * kKT;
      __syncthreads();  // qs/wsm written; previous tile's cs consumed
      if (threadIdx.x < kKT) {
        const int s = s0 + threadIdx.x;
        const int32_t r = s < maxc ? cand[s] : -1;
        rows_s[threadIdx.x] = r;
        if (fp8)
          scale_s[threadIdx.x] =
              r >= 0 ? __ldg(reinterpret_cast<const float*>(static_cast<const uint8_t*>(a.key_pool) +
                                                            int64_t(r) * fp8_row_bytes + dI))
                     : 0.f;
      }
      __syncthreads();
      const int w4 = dI / 4;
      for (int e = threadIdx.x; e < kKT * w4; e += kThreads) {
        const int key = e / w4, c4 = e - key * w4;
        const int32_t r = rows_s[key];
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r >= 0 && fp8) {  // 4 codes (4-byte load; rows kv_fp8_index_layout(dI).bytes)
          const uint32_t w = __ldg(reinterpret_cast<const unsigned int*>(
              static_cast<const uint8_t*>(a.key_pool) + int64_t(r) * fp8_row_bytes + 4 * c4));
          v = make_float4(kvfp8::e4m3_decode(uint8_t(w & 0xffu)),
                          kvfp8::e4m3_decode(uint8_t((w >> 8) & 0xffu)),
                          kvfp8::e4m3_decode(uint8_t((w >> 16) & 0xffu)),
                          kvfp8::e4m3_decode(uint8_t(w >> 24)));
        } else if (r >= 0) {
          v = kv_load4(a.key_pool, a.key_dtype, int64_t(r) * dI + 4 * c4);
        }
        __nv_bfloat16* dst = ks + key * L.ldk + 4 * c4;
        dst[0] = __float2bfloat16(v.x);
        dst[1] = __float2bfloat16(v.y);
        dst[2] = __float2bfloat16(v.z);
        dst[3] = __float2bfloat16(v.w);
      }
      __syncthreads();
      for (int tid = warp; tid < mt * nt; tid += kThreads / 32) {
        const int mi = tid / nt, ni = tid - mi * nt;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
        wmma::fill_fragment(fc, 0.f);
        for (int k = 0; k < dI; k += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
          wmma::load_matrix_sync(fa, qs + mi * 16 * L.ldq + k, L.ldq);
          wmma::load_matrix_sync(fb, ks + ni * 16 * L.ldk + k, L.ldk);
          wmma::mma_sync(fc, fa, fb, fc);
        }
        wmma::store_matrix_sync(cs + mi * 16 * L.ldc + ni * 16, fc, L.ldc, wmma::mem_row_major);
      }
      __syncthreads();
      // Head reduction: 4 lanes per (query, key), each summing every 4th head, then a fixed
      // shuffle tree (deterministic).
      for (int e = threadIdx.x; e < pq * kKT * 4; e += kThreads) {
        const int part = e & 3, pair = e >> 2;
        const int qi = pair / kKT, key = pair - qi * kKT;
        const float* col = cs + (qi * nI) * L.ldc + key;
        const float* w = wsm + qi * nI;
        float acc = 0.f;
        for (int h = part; h < nI; h += 4) acc += fmaxf(0.f, col[h * L.ldc]) * w[h];
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        if (fp8) acc *= scale_s[key];
        const int s = s0 + key;
        const int64_t t = tq0 + qi;
        if (part == 0 && s < a.cand.count[t]) scores[t * ld + s] = acc;
      }
    }
  }
}

// ---- decode kernel: mma.sync over register-fed keys (see indexer.h, "decode path") -------------
//
// One block = kDWarps warps working on one query row (blockIdx.y); warps take chunks of
// kDNT·8 consecutive candidates, grid-strided over the row. Per chunk a warp computes the
// [nI × chunk] product C = Q · Kᵀ with m16n8k16 bf16 mma.sync (heads = M, keys = N, dims = K):
//
//   A (q, heads × dims) comes from shared memory, pre-packed per lane so one 16-byte load gives a
//     lane its 4 A registers of (m-tile, k-step);
//   B (keys) comes straight from global memory into registers: the K dimension is permuted inside
//     every 16-wide k-step (mma k-index 2t+i ↔ dim 4t+i, 2t+8+i ↔ dim 4t+2+i, t = lane % 4,
//     i ∈ {0, 1}), identically for A and B, so Σ_k is unchanged and each lane's B registers of a
//     k-step are ONE float4 of its key row (dims 16·kk + 4t … +3). For one (n-tile, k-step) the
//     warp reads 8 key rows × 64 contiguous bytes; over the 8 k-steps every byte of the 8 rows
//     exactly once.
//
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4):
//   A reg0 = (row g,   k 2t..2t+1)   reg1 = (row g+8, k 2t..2t+1)
//     reg2 = (row g,   k 2t+8..+9)   reg3 = (row g+8, k 2t+8..+9)
//   B reg0 = (k 2t..2t+1, col g)     reg1 = (k 2t+8..2t+9, col g)
//   C c0, c1 = (row g, cols 2t, 2t+1)   c2, c3 = (row g+8, cols 2t, 2t+1)
// With the permutation: A reg0 = q[16m+g][16kk+4t+{0,1}], reg1 = q[16m+g+8][same],
// reg2 = q[16m+g][16kk+4t+{2,3}], reg3 = q[16m+g+8][same]; B reg0 = K[key][16kk+4t+{0,1}],
// reg1 = K[key][16kk+4t+{2,3}] with key = chunk + 8j + g.
// bf16 key pools permute further (key_dim0): lane t's 16-byte load of dims 32u + 8t … +7 gives
// k-step 2u dims +0..3 and k-step 2u+1 dims +4..7, already packed as B registers; q's A fragments
// follow the same map. Σ_k is the same sum in another order.
// fp8 key pools (kFp8Index rows: 128 e4m3 codes + one f32 scale + 12 bytes of padding, 144
// bytes, 16-byte aligned): lane t's 16-byte load u of codes 64u + 16t … +15 gives k-steps 4u … 4u+3
// (dims 64u + 16t + 4w … +3 for k-step 4u + w), converted exactly to bf16 pairs
// (e4m3 → f16x2 → f32 → bf16x2; e4m3 ⊂ bf16); q is quantized per head (IndexerArgs) and staged
// as its codes' values (stage_q); the MMA runs on the unscaled codes, the row scale multiplies the
// key's head sum once and q's head scale sits in the head weight (score = s_k · Σ_h ReLU(codes_q,h
// · codes_k) · s_q,h · w_h, scales ≥ 0). kKeysFp8x8 (variants 19–21, auto for fp8 keys): the same
// loads and scales, the codes multiplied as e4m3 by m16n8k32 (stage_q's K permutation).
//
// Head reduction: lane (g, t) owns heads {16m+g, 16m+g+8 : m < kDMT} of keys 8j+2t, 8j+2t+1; it
// sums ReLU(c)·w over those 8 heads (m ascending, row g before g+8), then a fixed xor-shuffle tree
// over g (4, 8, 16) completes Σ_h. The order depends on nothing but (nI, dI): deterministic and
// independent of the batch and the grid.
constexpr int kDWarps = 4;   // warps per block
constexpr int kDMT = 4;      // m-tiles: nI = 64
constexpr int kDKT = 8;      // k-steps: dI = 128
constexpr int kDNI = 16 * kDMT, kDDI = 16 * kDKT;

__device__ __forceinline__ float4 ld_stream_f4(const float* p) {
  float4 v;
  // read-only during the kernel, touched once: not volatile, no L1 allocation
  asm("ld.global.nc.L1::no_allocate.v4.f32 {%0,%1,%2,%3}, [%4];\n"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "l"(p));
  return v;
}
// Eight consecutive bf16 values (16 bytes at p, 16-byte aligned) as four packed pairs, loaded like
// ld_stream_f4. Pair i holds values 2i (low half) and 2i + 1: exactly an mma B register.
__device__ __forceinline__ uint4 ld_stream_u4(const uint16_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Key pool formats of the decode kernel (template argument kKeys). kKeysFp8x8: fp8 key pools
// multiplied on e4m3 tensor cores (q's codes × the key codes, m16n8k32) instead of converting the
// codes to bf16 (kKeysFp8).
constexpr int kKeysF32 = 0, kKeysBf16 = 1, kKeysFp8 = 2, kKeysFp8x8 = 3, kKeysFp8h = 4;
// Bytes of one fp8 key row (kv_fp8_index_layout(128)).
constexpr int kFp8KeyRowBytes = 144;
static_assert(kv_fp8_index_layout(128).bytes == kFp8KeyRowBytes &&
              kv_fp8_index_layout(128).scale_off == 128);

// First of the four key dims that lane t feeds into k-step kk (the K permutation below). f32
// keys: 16kk + 4t (one 16-byte load per k-step). bf16 keys: one 16-byte load of 8 dims per lane
// serves two k-steps, so 32·(kk/2) + 8t + 4·(kk%2). fp8 keys: one 16-byte load of 16 codes per
// lane serves four k-steps, so 64·(kk/4) + 16t + 4·(kk%4).
// kKeysFp8x8: the same 16-byte loads (one per pair of 32-wide k-steps); see kKeysFp8x8 below.
template <int kKeys>
__device__ __forceinline__ int key_dim0(int kk, int t) {
  return kKeys == kKeysBf16                            ? 32 * (kk >> 1) + 8 * t + 4 * (kk & 1)
         : kKeys == kKeysFp8 || kKeys == kKeysFp8x8 || kKeys == kKeysFp8h
             ? 64 * (kk >> 2) + 16 * t + 4 * (kk & 3)
                                                     : 16 * kk + 4 * t;
}

// Two e4m3 codes (low byte = first value) → their exact values as a packed bf16 pair (low half =
// first value): cvt e4m3x2 → f16x2 (exact), widened to f32, packed (exact: e4m3 ⊂ bf16).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t codes2) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes2 & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  return wfrag::pack_bf16(f.x, f.y);
}
// Two e4m3 codes (low byte = first value) → their exact values as a packed f16 pair (one
// cvt.rn.f16x2.e4m3x2: every e4m3 value, subnormals included, is an f16; NaN stays NaN).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t codes2) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes2 & 0xffffu), __NV_E4M3);
  return uint32_t(h.x) | uint32_t(h.y) << 16;
}
// One 16-byte load (16 codes) of a read-only fp8 key row (16-byte aligned), as ld_stream_u4.
__device__ __forceinline__ uint4 ld_stream_codes16(const uint8_t* p) {
  return ld_stream_u4(reinterpret_cast<const uint16_t*>(p));
}

// fp8 key pools score q quantized per head (IndexerArgs, kvfp8::index_query_fp8): q̂_h = s_h ·
// codes_h. The kernels stage q's codes (kKeysFp8: as exact bf16 values; kKeysFp8x8: the e4m3 bytes)
// and fold s_h ≥ 0 into the head weight (ReLU(s·x) = s·ReLU(x)).
// Per-head q scales of q[row] ([kDNI, kDDI] f32) into qsc[kDNI] and their index_query_inv into
// qinv[kDNI]: one warp a head, the block's kDWarps warps. The amax is a max (order-free), so both
// equal the host's bit for bit.
__device__ __forceinline__ void q_head_scales(const float* __restrict__ qrow, float* qsc,
                                              float* qinv) {
  static_assert(kDDI == 128, "a float4 a lane");
  constexpr int kHeads = kDNI / kDWarps;  // per warp
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // All loads first (one L2 round trip, not one per head: this runs before the key loads).
  float4 v[kHeads];
#pragma unroll
  for (int i = 0; i < kHeads; ++i)
    v[i] = *reinterpret_cast<const float4*>(qrow + (warp + kDWarps * i) * kDDI + 4 * lane);
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    float amax = fmaxf(fmaxf(kvfp8::abs_finite(v[i].x), kvfp8::abs_finite(v[i].y)),
                       fmaxf(kvfp8::abs_finite(v[i].z), kvfp8::abs_finite(v[i].w)));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (lane == 0) {
      const int h = warp + kDWarps * i;
      const float sc = kvfp8::block_scale(amax);
      qsc[h] = sc;
      qinv[h] = kvfp8::index_query_inv(sc);
    }
  }
}
// Four e4m3 codes of x · inv packed into a register, x.x in the low byte: __fmul_rn and the
// hardware RNE satfinite conversion = kvfp8::e4m3_encode(mul_rn(x, inv)) (index_query_fp8).
__device__ __forceinline__ uint32_t q_codes4(float4 x, float inv) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(
      make_float2(__fmul_rn(x.x, inv), __fmul_rn(x.y, inv)), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(
      make_float2(__fmul_rn(x.z, inv), __fmul_rn(x.w, inv)), __NV_SATFINITE, __NV_E4M3);
  return lo | hi << 16;
}
// The exact values of x's codes (q_codes4): what kKeysFp8 multiplies as bf16.
__device__ __forceinline__ float4 q_code_values(float4 x, float inv) {
  const uint32_t c = q_codes4(x, inv);
  const float2 a = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(c & 0xffffu), __NV_E4M3)));
  const float2 b = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(c >> 16), __NV_E4M3)));
  return make_float4(a.x, a.y, b.x, b.y);
}
// Stages q[row] as packed A fragments into qa (all kDWarps warps; the caller syncs after).
//   kKeysF32 / kKeysBf16 / kKeysFp8: [m][kk][lane] for m16n8k16 bf16, k-step kk's dims through
//     key_dim0 (16 KB); kKeysFp8: the values of q's codes (qinv: q_head_scales', already written).
//   kKeysFp8x8: stage_q_fp8x8_one_pass.
template <int kKeys>
__device__ __forceinline__ void stage_q(const float* __restrict__ qrow, const float* qinv, uint4* qa) {
  // Compile-time trip counts, every load of the thread issued before any use: one L2 round trip
  // instead of one per unit (this runs before the kernel's first key load).
  constexpr int kThreads = kDWarps * 32;
  static_assert(kKeys != kKeysFp8x8, "kKeysFp8x8: stage_q_fp8x8_one_pass");
  if constexpr (kKeys != kKeysFp8) {  // bf16 / f32: the loop as before (unrolled, the bf16 kernel
                                      // took 178 registers instead of 172)
    for (int u = threadIdx.x; u < kDMT * kDKT * 32; u += kThreads) {
      const int m = u / (kDKT * 32), kk = (u / 32) % kDKT, ul = u % 32;
      const int ug = ul >> 2, ut = ul & 3;
      const int d0 = key_dim0<kKeys>(kk, ut);
      const float4 lo = *reinterpret_cast<const float4*>(qrow + (16 * m + ug) * kDDI + d0);
      const float4 hi = *reinterpret_cast<const float4*>(qrow + (16 * m + ug + 8) * kDDI + d0);
      qa[u] = make_uint4(wfrag::pack_bf16(lo.x, lo.y), wfrag::pack_bf16(hi.x, hi.y),
                         wfrag::pack_bf16(lo.z, lo.w), wfrag::pack_bf16(hi.z, hi.w));
    }
  } else {
    constexpr int kUnits = kDMT * kDKT * 32 / kThreads;
    float4 lo[kUnits], hi[kUnits];
#pragma unroll
    for (int i = 0; i < kUnits; ++i) {
      const int u = threadIdx.x + kThreads * i;
      const int m = u / (kDKT * 32), kk = (u / 32) % kDKT, ul = u % 32;
      const int ug = ul >> 2, ut = ul & 3;
      const int d0 = key_dim0<kKeys>(kk, ut);
      lo[i] = *reinterpret_cast<const float4*>(qrow + (16 * m + ug) * kDDI + d0);
      hi[i] = *reinterpret_cast<const float4*>(qrow + (16 * m + ug + 8) * kDDI + d0);
    }
#pragma unroll
    for (int i = 0; i < kUnits; ++i) {
      const int u = threadIdx.x + kThreads * i;
      const int m = u / (kDKT * 32), ug = (u % 32) >> 2;
      const float4 l = q_code_values(lo[i], qinv[16 * m + ug]);
      const float4 h = q_code_values(hi[i], qinv[16 * m + ug + 8]);
      qa[u] = make_uint4(wfrag::pack_bf16(l.x, l.y), wfrag::pack_bf16(h.x, h.y),
                         wfrag::pack_bf16(l.z, l.w), wfrag::pack_bf16(h.z, h.w));
    }
  }
}

// kKeysFp8x8 staging: qa = [m][ks][lane] A fragments of m16n8k32 e4m3, 4 k-steps of 32 (8 KB).
// The K permutation of k-step ks: mma k-index 4t + i ↔ dim d0 + i, 16 + 4t + i ↔ dim d0 + 4 + i
// (i < 4), with d0 = 64·(ks/2) + 16t + 8·(ks%2): a lane's 16-byte key load of codes 64u + 16t … +15
// holds its B registers of k-steps 2u (words 0, 1) and 2u + 1 (words 2, 3). A registers: codes of
// (head g, d0 … +3), (g + 8, d0 … +3), (g, d0 + 4 … +7), (g + 8, d0 + 4 … +7).
// One pass over q (scales then codes would read q twice: every CTA of the one-wave grid reads the
// row's 32 KB, ~13 MB of L2 traffic a pass at 396 CTAs; the two-pass form measured 25.7 µs at
// 230,400 keys vs 23.0 for the kernel before q was quantized, session 11).
// Thread (warp w, lane (g, t)) holds unit u = threadIdx.x + 128·m for m < 4, i.e. k-step ks = w of
// m-tile m: dims d0 … d0 + 7 (d0 = 64·(w/2) + 16t + 8·(w%2)) of heads 16m + g and 16m + g + 8.
// A head's 128 dims are spread over the 4 warps × 4 lanes t with that g: the amax is reduced over t
// by shuffles and over the warps through `part` (shared, [4][kDNI]); every one of the 16 threads
// then derives the same scale (a max is order-free: equal to the host's bit for bit). The thread's
// heads are exactly the heads of its lane's head weights (wl), so the scales come back in sc.
// kF16 (kKeysFp8h): the same codes written as their exact f16 values in the m16n8k16 layout of
// stage_q ([m][kk][lane], 16 KB): the thread's dims d0 … d0 + 3 / d0 + 4 … d0 + 7 are exactly
// k-steps kk = 2w / 2w + 1 of key_dim0<kKeysFp8h> at its t.
template <bool kF16 = false>
__device__ __forceinline__ void stage_q_fp8x8_one_pass(const float* __restrict__ qrow, uint4* qa,
                                                       float* part, float (&sc)[kDMT][2]) {
  constexpr int kThreads = kDWarps * 32;
  static_assert(kDMT * (kDKT / 2) * 32 == kDMT * kThreads && kDKT / 2 == kDWarps,
                "one unit per (thread, m-tile), k-step = warp");
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int d0 = 64 * (w >> 1) + 16 * t + 8 * (w & 1);
  float4 x[kDMT][4];
#pragma unroll
  for (int m = 0; m < kDMT; ++m) {
    const float* p0 = qrow + (16 * m + g) * kDDI + d0;
    const float* p1 = p0 + 8 * kDDI;
    x[m][0] = *reinterpret_cast<const float4*>(p0);
    x[m][1] = *reinterpret_cast<const float4*>(p1);
    x[m][2] = *reinterpret_cast<const float4*>(p0 + 4);
    x[m][3] = *reinterpret_cast<const float4*>(p1 + 4);
  }
  auto amax4 = [](float4 v) {
    return fmaxf(fmaxf(kvfp8::abs_finite(v.x), kvfp8::abs_finite(v.y)),
                 fmaxf(kvfp8::abs_finite(v.z), kvfp8::abs_finite(v.w)));
  };
#pragma unroll
  for (int m = 0; m < kDMT; ++m) {
    float a0 = fmaxf(amax4(x[m][0]), amax4(x[m][2])), a1 = fmaxf(amax4(x[m][1]), amax4(x[m][3]));
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
      a0 = fmaxf(a0, __shfl_xor_sync(0xffffffffu, a0, o));
      a1 = fmaxf(a1, __shfl_xor_sync(0xffffffffu, a1, o));
    }
    if (t == 0) {
      part[w * kDNI + 16 * m + g] = a0;
      part[w * kDNI + 16 * m + g + 8] = a1;
    }
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < kDMT; ++m) {
    float inv[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int h = 16 * m + g + 8 * e;
      float amax = part[h];
#pragma unroll
      for (int ww = 1; ww < kDWarps; ++ww) amax = fmaxf(amax, part[ww * kDNI + h]);
      sc[m][e] = kvfp8::block_scale(amax);
      inv[e] = kvfp8::index_query_inv(sc[m][e]);
    }
    const uint32_t c0 = q_codes4(x[m][0], inv[0]), c1 = q_codes4(x[m][1], inv[1]);
    const uint32_t c2 = q_codes4(x[m][2], inv[0]), c3 = q_codes4(x[m][3], inv[1]);
    if constexpr (kF16) {
      // k-step 2w: (g, d0 d0+1), (g+8, d0 d0+1), (g, d0+2 d0+3), (g+8, d0+2 d0+3); 2w + 1: + 4.
      qa[(m * kDKT + 2 * w) * 32 + lane] =
          make_uint4(e4m3x2_to_f16x2(c0), e4m3x2_to_f16x2(c1), e4m3x2_to_f16x2(c0 >> 16),
                     e4m3x2_to_f16x2(c1 >> 16));
      qa[(m * kDKT + 2 * w + 1) * 32 + lane] =
          make_uint4(e4m3x2_to_f16x2(c2), e4m3x2_to_f16x2(c3), e4m3x2_to_f16x2(c2 >> 16),
                     e4m3x2_to_f16x2(c3 >> 16));
    } else {
      qa[threadIdx.x + kThreads * m] = make_uint4(c0, c1, c2, c3);
    }
  }
}

// kDNT = n-tiles (8 keys each) per chunk: 2 (16 keys, 96 registers) by default, 4 as variant 3.
// kKeys == kKeysBf16: the key pool holds bf16 (KvDtype::kBf16) instead of f32; the loaded pairs
// are the B registers as they are (no conversion), and the same 256 bytes per lane in flight cover
// twice the keys when kDNT doubles (launch_decode picks kDNT = 4 for bf16 keys).
// kKeys == kKeysFp8: kFp8Index rows (see above; launch_decode picks kDNT = 4).
// kMinBlocks (variants 13 / 14): __launch_bounds__ minimum of resident blocks per SM, so the
// compiler keeps the registers ≤ 65536 / (128 · kMinBlocks): ncu at 230,400 bf16 keys (ncu-issue7-
// bf60df0.md) shows the default (132 registers, 3 blocks = 12 warps an SM) waiting on the key
// loads 58% of the time with 0.33 eligible warps per scheduler — more resident warps, more bytes
// in flight.
// kPdl: launched with programmatic stream serialization (V4_INDEXER_PDL, docs/cuda.md §Indexer
// chain): lets the dependent kernel (the PDL top-k) launch once every CTA finished its loop — it
// waits for this whole grid before reading any score —, and every thread waits for the previous kernel of the stream
// (griddepcontrol.wait: it has completed and its memory is visible) before its first global
// access (the count, q, weights, candidate rows and keys may all be written by it).
// kPf (fp8 keys, variants 22 / 23): the key loads run one chunk ahead in registers — chunk c + 1's
// loads are issued before chunk c's math, the first chunk's before the q staging — so every warp
// keeps a chunk in flight while it computes (without kPf a warp loads, waits, then computes: the
// ncu profiles show the decode kernels waiting on their key loads most of the time).
template <int kDNT, int kKeys, bool kPdl, int kMinBlocks = 1, bool kPf = false>
__global__ void __launch_bounds__(kDWarps * 32, kMinBlocks) indexer_decode_kernel(ops::IndexerArgs a,
                                                                       float* __restrict__ scores,
                                                                       int64_t ld) {
  constexpr bool kBf16Keys = kKeys == kKeysBf16;
  constexpr bool kMma8 = kKeys == kKeysFp8x8;               // e4m3 tensor cores
  constexpr bool kF16 = kKeys == kKeysFp8h;                 // f16 tensor cores on code values
  constexpr bool kFp8Keys = kKeys == kKeysFp8 || kMma8 || kF16;  // fp8 key rows (loads, scales)
  constexpr int kDChunk = 8 * kDNT;
  __shared__ __align__(16) uint4 qa[kDMT * kDKT * 32];  // packed A fragments (stage_q)
  // fp8 keys: q's head scales and inverses (kKeysFp8x8: the one-pass staging's [4][kDNI] partial
  // maxima)
  __shared__ float qsc[kMma8 || kF16 ? kDWarps * kDNI : kFp8Keys ? 2 * kDNI : 1];
  // PDL: wait for the previous kernel here; trigger the dependents only after the loop (below),
  // so the top-k's CTAs do not sit resident on SMs this one-wave grid was sized to fill (the
  // chain at 230,400 keys took 47.5 µs with the trigger at the start vs 44.6 with plain
  // launches, cuda-indexer.md at e5ca414).
  if constexpr (kPdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  const int64_t row = blockIdx.y;
  const int n = a.cand.count[row];
  if (int64_t(blockIdx.x) * kDWarps * kDChunk >= n) return;  // whole block idle (uniform)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  // Candidate rows of the warp's first chunk (then always one chunk ahead), issued before the
  // q staging so the two latencies overlap.
  const int32_t* cand = a.cand.rows + a.cand.offset[row];
  float* srow = scores + row * ld;
  const int stride = gridDim.x * kDWarps;
  int c = blockIdx.x * kDWarps + warp;
  int32_t rn[kDNT];
#pragma unroll
  for (int j = 0; j < kDNT; ++j) {
    const int s = c * kDChunk + 8 * j + g;
    rn[j] = s < n ? cand[s] : -1;
  }
  // Key loads of one chunk of rows r (16 B per lane per (j, kk), or per (j, kk pair) for bf16
  // keys, or per (j, kk quad) for fp8 keys, plus the row scale of key 8j + g into ksc).
  constexpr int kLoads = kBf16Keys ? kDKT / 2 : kFp8Keys ? kDKT / 4 : kDKT;
  auto load_keys = [&](const int32_t (&r)[kDNT], uint4 (&kv)[kDNT][kLoads], float (&ksc)[kDNT]) {
    if constexpr (kFp8Keys) {
#pragma unroll
      for (int j = 0; j < kDNT; ++j) {
        const uint8_t* kr = static_cast<const uint8_t*>(a.key_pool) +
                            int64_t(r[j] < 0 ? 0 : r[j]) * kFp8KeyRowBytes;
#pragma unroll
        for (int u = 0; u < kLoads; ++u)
          kv[j][u] = r[j] < 0 ? make_uint4(0u, 0u, 0u, 0u)
                              : ld_stream_codes16(kr + key_dim0<kKeysFp8>(4 * u, t));
        ksc[j] = r[j] < 0 ? 0.f : __ldg(reinterpret_cast<const float*>(kr + kDDI));
      }
    } else {
#pragma unroll
      for (int j = 0; j < kDNT; ++j) {
        const int64_t kp = int64_t(r[j] < 0 ? 0 : r[j]) * kDDI;  // value index of the row
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
          if (r[j] < 0) {
            kv[j][u] = make_uint4(0u, 0u, 0u, 0u);
          } else if constexpr (kBf16Keys) {
            kv[j][u] = ld_stream_u4(static_cast<const uint16_t*>(a.key_pool) + kp +
                                    key_dim0<kKeysBf16>(2 * u, t));
          } else {
            const float4 f = ld_stream_f4(static_cast<const float*>(a.key_pool) + kp +
                                          key_dim0<kKeysF32>(u, t));
            kv[j][u] = make_uint4(__float_as_uint(f.x), __float_as_uint(f.y), __float_as_uint(f.z),
                                  __float_as_uint(f.w));
          }
        }
      }
    }
  };
  // The candidate rows of chunk cc (−1 past the row's end).
  auto load_rows = [&](int cc, int32_t (&r)[kDNT]) {
#pragma unroll
    for (int j = 0; j < kDNT; ++j) {
      const int s = cc * kDChunk + 8 * j + g;
      r[j] = s < n ? cand[s] : -1;
    }
  };
  // kPf: the next chunk's keys (first: this warp's first chunk, issued before the q staging), and
  // rn then holds the rows of the chunk after it.
  [[maybe_unused]] uint4 kvp[kPf ? kDNT : 1][kLoads];
  [[maybe_unused]] float kscp[kPf ? kDNT : 1];
  if constexpr (kPf) {
    load_keys(rn, kvp, kscp);
    load_rows(c + stride, rn);
  }
  // Stage q[row] (f32 [nI, dI]) as packed A fragments (fp8 keys: its codes, stage_q; e4m3 MMA:
  // in one pass, stage_q_fp8x8_one_pass, its scales straight into this lane's head weights).
  const float* qrow = a.q + row * (kDNI * kDDI);
  [[maybe_unused]] float sc8[kDMT][2];
  if constexpr (kMma8 || kF16) {
    stage_q_fp8x8_one_pass<kF16>(qrow, qa, qsc, sc8);
  } else {
    if constexpr (kFp8Keys) {
      q_head_scales(qrow, qsc, qsc + kDNI);
      __syncthreads();
    }
    stage_q<kKeys>(qrow, qsc + (kFp8Keys ? kDNI : 0), qa);
  }
  // This lane's head weights, scaled by dI^-1/2 · nI^-1/2 (fp8 keys: and q's head scale).
  const float wscale = rsqrtf(float(kDNI)) * rsqrtf(float(kDDI));
  float wl[kDMT][2];
#pragma unroll
  for (int m = 0; m < kDMT; ++m) {
    float s0 = 1.f, s1 = 1.f;
    if constexpr (kMma8 || kF16) {
      s0 = sc8[m][0];
      s1 = sc8[m][1];
    } else if constexpr (kFp8Keys) {
      s0 = qsc[16 * m + g];
      s1 = qsc[16 * m + g + 8];
    }
    wl[m][0] = a.weights[row * kDNI + 16 * m + g] * wscale * s0;
    wl[m][1] = a.weights[row * kDNI + 16 * m + g + 8] * wscale * s1;
  }
  __syncthreads();
  for (; c * kDChunk < n; c += stride) {
    const int s0 = c * kDChunk;
    [[maybe_unused]] uint4 kv[kDNT][kLoads];
    [[maybe_unused]] float ksc[kDNT];
    if constexpr (kPf) {
      // This chunk's keys were issued one iteration ago; issue the next chunk's now.
#pragma unroll
      for (int j = 0; j < kDNT; ++j) {
        ksc[j] = kscp[j];
#pragma unroll
        for (int u = 0; u < kLoads; ++u) kv[j][u] = kvp[j][u];
      }
      load_keys(rn, kvp, kscp);
      load_rows(c + 2 * stride, rn);
    } else {
      int32_t r[kDNT];
#pragma unroll
      for (int j = 0; j < kDNT; ++j) r[j] = rn[j];
      load_keys(r, kv, ksc);
      // Next chunk's candidate rows while the keys are in flight.
      load_rows(c + stride, rn);
    }
    float acc[kDMT][kDNT][4];
#pragma unroll
    for (int m = 0; m < kDMT; ++m)
#pragma unroll
      for (int j = 0; j < kDNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.f;
    if constexpr (kMma8) {  // 4 k-steps of 32 on e4m3 tensor cores (stage_q's K permutation)
#pragma unroll
      for (int ks = 0; ks < kDKT / 2; ++ks) {
        uint32_t b[kDNT][2];
#pragma unroll
        for (int j = 0; j < kDNT; ++j) {
          const uint4& v = kv[j][ks >> 1];
          b[j][0] = (ks & 1) ? v.z : v.x;
          b[j][1] = (ks & 1) ? v.w : v.y;
        }
#pragma unroll
        for (int m = 0; m < kDMT; ++m) {
          const uint4 af = qa[(m * (kDKT / 2) + ks) * 32 + lane];
#pragma unroll
          for (int j = 0; j < kDNT; ++j)
            wfrag::mma_e4m3(acc[m][j], af.x, af.y, af.z, af.w, b[j][0], b[j][1]);
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < (kMma8 ? 0 : kDKT); ++kk) {
      uint32_t b[kDNT][2];
#pragma unroll
      for (int j = 0; j < kDNT; ++j) {
        if constexpr (kFp8Keys) {  // dims d0..d0+3: codes 0, 1 → reg0, codes 2, 3 → reg1
          const uint4& v = kv[j][kk >> 2];
          const uint32_t w = (kk & 3) == 0 ? v.x : (kk & 3) == 1 ? v.y : (kk & 3) == 2 ? v.z : v.w;
          b[j][0] = kF16 ? e4m3x2_to_f16x2(w) : e4m3x2_to_bf16x2(w);
          b[j][1] = kF16 ? e4m3x2_to_f16x2(w >> 16) : e4m3x2_to_bf16x2(w >> 16);
        } else if constexpr (kBf16Keys) {  // dims d0..d0+3 of the 8 this lane loaded for steps kk, kk+1
          const uint4& v = kv[j][kk >> 1];
          b[j][0] = (kk & 1) ? v.z : v.x;
          b[j][1] = (kk & 1) ? v.w : v.y;
        } else {
          const uint4& v = kv[j][kk];
          b[j][0] = wfrag::pack_bf16(__uint_as_float(v.x), __uint_as_float(v.y));
          b[j][1] = wfrag::pack_bf16(__uint_as_float(v.z), __uint_as_float(v.w));
        }
      }
#pragma unroll
      for (int m = 0; m < kDMT; ++m) {
        const uint4 af = qa[(m * kDKT + kk) * 32 + lane];
#pragma unroll
        for (int j = 0; j < kDNT; ++j)
          if constexpr (kF16)
            wfrag::mma_f16(acc[m][j], af.x, af.y, af.z, af.w, b[j][0], b[j][1]);
          else
            wfrag::mma_bf16(acc[m][j], af.x, af.y, af.z, af.w, b[j][0], b[j][1]);
      }
    }
    // Σ_h ReLU(q_h·k)·w_h for keys 8j+2t (c0, c2) and 8j+2t+1 (c1, c3).
    if constexpr (kF16) {
      // Halving butterfly over g (kKeysFp8h): the 2·kDNT per-lane partials v[2j + e] (key
      // 8j + 2t + e) are summed over the 8 lanes of a t in rounds xor 16, 8, 4; in a halving
      // round each lane keeps the half its lane bit selects and adds the partner's copy of it,
      // so 8 values take 4 + 2 + 1 shuffles instead of 3 per value (kDNT = 2: 2 + 1, then a
      // plain xor-4 round). The lane ends with the sum of v[i], i = its halving bits (MSB first:
      // kDNT = 4 → i = g; 2 → i = g >> 1), scales it by its key's row scale (fp8 rows: from the
      // lane with that key's g, one shuffle per n-tile) and stores it.
      constexpr int kV = 2 * kDNT;
      static_assert(kV == 8 || kV == 4, "kDNT 4 or 2");
      float v[kV];
#pragma unroll
      for (int j = 0; j < kDNT; ++j) {
        float p0 = 0.f, p1 = 0.f;
#pragma unroll
        for (int m = 0; m < kDMT; ++m) {
          p0 += fmaxf(acc[m][j][0], 0.f) * wl[m][0];
          p0 += fmaxf(acc[m][j][2], 0.f) * wl[m][1];
          p1 += fmaxf(acc[m][j][1], 0.f) * wl[m][0];
          p1 += fmaxf(acc[m][j][3], 0.f) * wl[m][1];
        }
        v[2 * j] = p0;
        v[2 * j + 1] = p1;
      }
      int i = 0;  // index of the value this lane keeps (its halving bits so far)
#pragma unroll
      for (int h = kV / 2, o = 16; h >= 1; h >>= 1, o >>= 1) {
        const bool up = (lane & o) != 0;
#pragma unroll
        for (int x = 0; x < h; ++x) {
          const float keep = up ? v[x + h] : v[x];
          const float send = up ? v[x] : v[x + h];
          v[x] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
        i = 2 * i + int(up);
      }
      float sum = v[0];
      if constexpr (kV == 4) sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      const int jm = i >> 1, e = i & 1;  // this lane's key: 8·jm + 2t + e
      float sc = 0.f;
#pragma unroll
      for (int j = 0; j < kDNT; ++j) {
        const float x = __shfl_sync(0xffffffffu, ksc[j], 4 * (2 * t + e));
        if (j == jm) sc = x;
      }
      const int s = s0 + 8 * jm + 2 * t + e;
      if ((kV == 8 || (lane & 4) == 0) && s < n) srow[s] = sum * sc;
    } else {
#pragma unroll
    for (int j = 0; j < kDNT; ++j) {
      float p0 = 0.f, p1 = 0.f;
#pragma unroll
      for (int m = 0; m < kDMT; ++m) {
        p0 += fmaxf(acc[m][j][0], 0.f) * wl[m][0];
        p0 += fmaxf(acc[m][j][2], 0.f) * wl[m][1];
        p1 += fmaxf(acc[m][j][1], 0.f) * wl[m][0];
        p1 += fmaxf(acc[m][j][3], 0.f) * wl[m][1];
      }
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) {
        p0 += __shfl_xor_sync(0xffffffffu, p0, o);
        p1 += __shfl_xor_sync(0xffffffffu, p1, o);
      }
      if constexpr (kFp8Keys) {
        // Row scales of keys 8j + 2t, 8j + 2t + 1: loaded by the lanes with g = 2t, 2t + 1.
        p0 *= __shfl_sync(0xffffffffu, ksc[j], 8 * t);
        p1 *= __shfl_sync(0xffffffffu, ksc[j], 8 * t + 4);
      }
      // Every lane now holds the sums of its t; lanes with g == j write n-tile j.
      if (g == j) {
        const int s = s0 + 8 * j + 2 * t;
        if (s < n) srow[s] = p0;
        if (s + 1 < n) srow[s + 1] = p1;
      }
    }
    }  // !kF16
  }
  if constexpr (kPdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// ---- pipelined decode kernel: per-warp cp.async ring (variants 4–7, docs/cuda.md §Indexer scores)
//
// ncu of indexer_decode_kernel<4, kKeysBf16> at batch 1 × 230,400 keys (H200): 26.2 µs vs a byte
// floor of 14.7, DRAM throughput 49%, 3 CTAs/SM, long_scoreboard 60% of the stalls: each warp
// loads a chunk into registers, waits, runs its 128 mma, then loads the next — per SM too few
// bytes in flight and no overlap of the loads with the math.
//
// This kernel keeps the decode kernel's math exactly (same chunk of 32 keys = 4 n-tiles, same K
// permutation, same B registers, same mma order into the same accumulators, same head reduction;
// the scores are bit-identical: CudaIndexerTc.PipelinedDecodeEqualsDecodeKernelBitwise) but moves
// the keys through a per-warp ring of kStages chunk slots in shared memory, filled with cp.async:
//
//   slot layout: uint4 [j][u][lane] (bf16 keys: u < 4, lane (g, t) copies the 16 bytes
//     32u + 8t … +7 dims of key 8j + g — exactly the bytes the old kernel loaded into kv[j][u]);
//     fp8 keys: uint4 [j][h][lane] = codes 64h + 16t … +15 of key 8j + g (one 16-byte cp.async;
//     word w = the 4 codes of k-step 4h + w), then f32 [j][lane] the row scale of key 8j + g.
//   Every lane reads back (ld.shared) only the bytes it copied itself, so cp.async.wait_group in
//   that lane orders the copy before the read: no barrier in the loop, no __syncwarp (except the
//   kRowMap form, variants 15–18, below: it reads rows other lanes copied).
//   Iteration i (the warp's i-th chunk, slot i % S): issue the copies of chunk i + S − 1 into
//   slot (i − 1) % S (its reads were consumed by chunk i − 1's mma, in this lane: same-thread
//   order), commit, wait until ≤ S − 1 groups are pending (= chunk i landed), compute chunk i.
//   A group is committed every iteration (empty past the row's end) so the count stays exact.
//   Candidate rows are loaded one issue ahead (registers rn).
//
// Shared memory per block: 16 KB q fragments + 4 warps × S × 8 KB (bf16) / 4.5 KB (fp8).
// S = 3, bf16: 112 KB → 2 blocks (8 warps) per SM, ≤ 3 chunks = 24 KB per warp in flight,
// 192 KB per SM while waiting, 128 KB while computing.
// kFastCvt (fp8 keys): e4m3 → bf16 by moving the bits into bf16 fields (sign → bit 15, exponent +
// mantissa → bits 4..10 of the half) and one bf16x2 multiply by 2^120 — exact for every finite
// code, subnormals included (the moved subnormal is a bf16 subnormal 2^-126·m/8, × 2^120 = the
// e4m3 value 2^-6·m/8); NaN codes (0x7f / 0xff) become ±480 instead of NaN: a key row stored from
// non-finite values (quantize_index_row writes 0x7f for NaN / ±Inf) scores finite here, 0 after
// ReLU(NaN) in variant 3 and on the CPU (variants 4–6 only; never chosen by auto).
// Otherwise the decode kernel's e4m3x2_to_bf16x2.
constexpr int kPipeNT = 4;                  // n-tiles per chunk (32 keys), as the bf16 / fp8 default
constexpr int64_t kPipeAutoMinRows = 16;    // auto runs variant 5 for bf16 keys from this many rows
constexpr int kQaBytes = kDMT * kDKT * 32 * 16;  // packed q A fragments (16 KB)
template <int kKeys, int kNT = kPipeNT>
constexpr int pipe_slot_bytes() {
  // bf16: kNT n-tiles × 4 16-byte loads × 32 lanes; fp8: kNT × 2 uint4 × 32 lanes + kNT × 32
  // scales
  return kKeys == kKeysBf16 ? kNT * 4 * 32 * 16 : kNT * 2 * 32 * 16 + kNT * 32 * 4;
}
template <int kStages, int kKeys, int kNT = kPipeNT>
constexpr int pipe_smem_bytes() {
  return kQaBytes + kDWarps * kStages * pipe_slot_bytes<kKeys, kNT>();
}
static_assert(pipe_slot_bytes<kKeysBf16>() == 8192 && pipe_slot_bytes<kKeysFp8>() == 4608);
static_assert(pipe_smem_bytes<4, kKeysBf16>() <= 227 * 1024, "largest ring fits one SM");

__device__ __forceinline__ uint32_t pipe_smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global → shared, L2 only; zero fill when !valid (src must still be a mapped address).
__device__ __forceinline__ void pipe_cp16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(pipe_smem_addr(dst)),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
// 4 bytes global → shared (cp.async 4-byte copies exist only as .ca); zero fill when !valid.
__device__ __forceinline__ void pipe_cp4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(pipe_smem_addr(dst)),
               "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void pipe_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void pipe_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Row-major slot layout of the kRowMap form (variants 15 / 16): 16-byte unit `unit` (0..15) of
// key `key` (0..31) of a chunk at byte 16 · (16 · key + (unit ^ 4 · (key & 1))). The XOR moves
// odd keys' units by 64 bytes, so the fragment reads (a quarter-warp reads 64 bytes of each of two
// consecutive keys) and the copies (8 lanes write 128 bytes of one key) are both conflict-free.
__device__ __forceinline__ int pipe_row_unit_off(int key, int unit) {
  return 16 * (16 * key + (unit ^ ((key & 1) << 2)));
}

// kRowMap (bf16 keys, variants 15 / 16; docs/cuda.md §Indexer scores, session 10): the copies
// read whole rows — copy i of a chunk moves keys 2i (lanes 0–15) and 2i + 1 (lanes 16–31), 16
// bytes a lane, 512 contiguous-per-row bytes a warp instruction, instead of 8 rows × 64 bytes (the
// gather probe: 18.7–19.2 µs for 230,400 keys against 20.7 at the same occupancy,
// cuda-indexer-gather.md) — into the row-major slot layout above; each lane then reads its B
// fragments (the same values as !kRowMap: bit-identical scores) from rows other lanes copied, so
// the warp synchronises (__syncwarp) after the wait and before refilling a slot. Candidate rows:
// one per lane (key `lane` of the chunk), shuffled to the copying lanes.
// kNT: n-tiles (8 keys) per chunk, kPipeNT (32-key chunks) but for variants 17 / 18 (2: 16-key
// chunks, 4 KB slots, so a 2-slot ring of 4 warps takes 48 KB and 4 CTAs fit an SM).
template <int kStages, int kKeys, bool kFastCvt, bool kPdl, bool kRowMap = false,
          int kNT = kPipeNT>
__global__ void __launch_bounds__(kDWarps * 32) indexer_decode_pipe_kernel(ops::IndexerArgs a,
                                                                            float* __restrict__ scores,
                                                                            int64_t ld) {
  static_assert(kKeys == kKeysBf16 || kKeys == kKeysFp8, "f32 keys use indexer_decode_kernel");
  static_assert(!kRowMap || kKeys == kKeysBf16, "row-major staging: bf16 keys only");
  static_assert(kNT == 2 || kNT == 4);
  static_assert(kStages >= 2 && kStages <= 4);
  constexpr bool kFp8Keys = kKeys == kKeysFp8;
  constexpr int kDNT = kNT, kDChunk = 8 * kNT;
  constexpr int kSlotBytes = pipe_slot_bytes<kKeys, kNT>();
  extern __shared__ __align__(16) unsigned char pipe_smem[];
  uint4* qa = reinterpret_cast<uint4*>(pipe_smem);  // [m][kk][lane] packed A fragments
  if constexpr (kPdl) asm volatile("griddepcontrol.wait;" ::: "memory");  // trigger: at the end
  const int64_t row = blockIdx.y;
  const int n = a.cand.count[row];
  if (int64_t(blockIdx.x) * kDWarps * kDChunk >= n) return;  // whole block idle (uniform)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  unsigned char* ring = pipe_smem + kQaBytes + size_t(warp) * kStages * kSlotBytes;
  const int32_t* cand = a.cand.rows + a.cand.offset[row];
  float* srow = scores + row * ld;
  const int stride = gridDim.x * kDWarps;
  const int c0 = blockIdx.x * kDWarps + warp;
  // Candidate rows (key 8j + g of chunk c; kRowMap: key `lane` in r[0]; −1 past the row's end).
  auto load_rows = [&](int c, int32_t (&r)[kDNT]) {
    if constexpr (kRowMap) {  // lanes ≥ kDChunk hold no key (16-key chunks)
      const int s = c * kDChunk + lane;
      r[0] = lane < kDChunk && s < n ? cand[s] : -1;
    } else {
#pragma unroll
      for (int j = 0; j < kDNT; ++j) {
        const int s = c * kDChunk + 8 * j + g;
        r[j] = s < n ? cand[s] : -1;
      }
    }
  };
  // This lane's copies of chunk c (rows r) into ring slot `slot`; nothing past the row's end.
  auto issue = [&](int c, const int32_t (&r)[kDNT], int slot) {
    if (c * kDChunk >= n) return;  // uniform over the warp
    unsigned char* sl = ring + slot * kSlotBytes;
    if constexpr (kRowMap) {
      const int half = lane >> 4, unit = lane & 15;
#pragma unroll
      for (int i = 0; i < kDChunk / 2; ++i) {
        const int key = 2 * i + half;
        const int32_t rr = __shfl_sync(0xffffffffu, r[0], key);
        const bool ok = rr >= 0;
        pipe_cp16(sl + pipe_row_unit_off(key, unit),
                  static_cast<const uint16_t*>(a.key_pool) + int64_t(ok ? rr : 0) * kDDI + 8 * unit,
                  ok);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kDNT; ++j) {
        const bool ok = r[j] >= 0;
        if constexpr (kFp8Keys) {
          const uint8_t* kr = static_cast<const uint8_t*>(a.key_pool) +
                              int64_t(ok ? r[j] : 0) * kFp8KeyRowBytes;
#pragma unroll
          for (int h = 0; h < 2; ++h)
            pipe_cp16(sl + ((j * 2 + h) * 32 + lane) * 16, kr + key_dim0<kKeysFp8>(4 * h, t), ok);
          pipe_cp4(sl + kDNT * 2 * 32 * 16 + (j * 32 + lane) * 4, kr + kDDI, ok);
        } else {
          const uint16_t* kr =
              static_cast<const uint16_t*>(a.key_pool) + int64_t(ok ? r[j] : 0) * kDDI;
#pragma unroll
          for (int u = 0; u < kDKT / 2; ++u)
            pipe_cp16(sl + ((j * 4 + u) * 32 + lane) * 16, kr + key_dim0<kKeysBf16>(2 * u, t), ok);
        }
      }
    }
  };
  // Prologue: chunks 0 … S − 2 of this warp in flight before the q staging (overlaps it).
  int32_t rn[kDNT];
#pragma unroll
  for (int p = 0; p < kStages - 1; ++p) {
    load_rows(c0 + p * stride, rn);
    issue(c0 + p * stride, rn, p);
    pipe_commit();
  }
  load_rows(c0 + (kStages - 1) * stride, rn);  // rows of the first in-loop issue
  // Stage q[row] (f32 [nI, dI]) as packed bf16 A fragments and the head weights, as
  // indexer_decode_kernel (fp8 keys: q's codes, the head scales folded into the weights).
  __shared__ float qsc[kFp8Keys ? 2 * kDNI : 1];  // fp8 keys: q's head scales, inverses
  const float* qrow = a.q + row * (kDNI * kDDI);
  if constexpr (kFp8Keys) {
    q_head_scales(qrow, qsc, qsc + kDNI);
    __syncthreads();
  }
  stage_q<kKeys>(qrow, qsc + (kFp8Keys ? kDNI : 0), qa);
  const float wscale = rsqrtf(float(kDNI)) * rsqrtf(float(kDDI));
  float wl[kDMT][2];
#pragma unroll
  for (int m = 0; m < kDMT; ++m) {
    wl[m][0] = a.weights[row * kDNI + 16 * m + g] * wscale * (kFp8Keys ? qsc[16 * m + g] : 1.f);
    wl[m][1] =
        a.weights[row * kDNI + 16 * m + g + 8] * wscale * (kFp8Keys ? qsc[16 * m + g + 8] : 1.f);
  }
  __syncthreads();  // qa written (the only barrier of the loop's prologue)
  int slot = 0;  // = i % S for the warp's i-th chunk
  for (int c = c0; c * kDChunk < n; c += stride) {
    const int s0 = c * kDChunk;
    // Refill the slot chunk i − 1 used with chunk i + S − 1, then wait for chunk i.
    if constexpr (kRowMap) __syncwarp();  // every lane done reading the slot refilled below
    issue(c + (kStages - 1) * stride, rn, slot == 0 ? kStages - 1 : slot - 1);
    pipe_commit();
    load_rows(c + kStages * stride, rn);  // next issue's rows, in flight during the math
    pipe_wait<kStages - 1>();
    if constexpr (kRowMap) __syncwarp();  // the other lanes' copies of chunk i visible
    const unsigned char* sl = ring + slot * kSlotBytes;
    slot = slot == kStages - 1 ? 0 : slot + 1;
    float acc[kDMT][kDNT][4];
#pragma unroll
    for (int m = 0; m < kDMT; ++m)
#pragma unroll
      for (int j = 0; j < kDNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kDKT; ++kk) {
      uint32_t b[kDNT][2];
#pragma unroll
      for (int j = 0; j < kDNT; ++j) {
        if constexpr (kFp8Keys) {  // word kk % 4 of (j, kk / 4): dims key_dim0<kKeysFp8>(kk, t) … +3
          // One 16-byte ld.shared per (j, kk / 4) (conflict-free: lanes read consecutive 16-byte
          // slots; reloads of the same slot for the next three kk are the same load), not four
          // 4-byte loads at a 16-byte lane stride (4-way bank conflicts).
          const uint4 v4w = reinterpret_cast<const uint4*>(sl)[(j * 2 + (kk >> 2)) * 32 + lane];
          const uint32_t w = (kk & 3) == 0 ? v4w.x : (kk & 3) == 1 ? v4w.y : (kk & 3) == 2 ? v4w.z : v4w.w;
          if constexpr (kFastCvt) {
            const uint2 p = e4m3x4_to_bf16x4_fast(w);
            b[j][0] = p.x;
            b[j][1] = p.y;
          } else {
            b[j][0] = e4m3x2_to_bf16x2(w);
            b[j][1] = e4m3x2_to_bf16x2(w >> 16);
          }
        } else if constexpr (kRowMap) {  // unit 4·(kk/2) + t of key 8j + g: dims key_dim0 … +7
          const uint4 v = *reinterpret_cast<const uint4*>(sl + pipe_row_unit_off(8 * j + g, 4 * (kk >> 1) + t));
          b[j][0] = (kk & 1) ? v.z : v.x;
          b[j][1] = (kk & 1) ? v.w : v.y;
        } else {  // dims d0..d0+3 of the 8 this lane copied for steps kk & ~1, kk | 1
          const uint4 v = reinterpret_cast<const uint4*>(sl)[(j * 4 + (kk >> 1)) * 32 + lane];
          b[j][0] = (kk & 1) ? v.z : v.x;
          b[j][1] = (kk & 1) ? v.w : v.y;
        }
      }
#pragma unroll
      for (int m = 0; m < kDMT; ++m) {
        const uint4 af = qa[(m * kDKT + kk) * 32 + lane];
#pragma unroll
        for (int j = 0; j < kDNT; ++j)
          wfrag::mma_bf16(acc[m][j], af.x, af.y, af.z, af.w, b[j][0], b[j][1]);
      }
    }
    // Σ_h ReLU(q_h·k)·w_h, exactly as indexer_decode_kernel.
#pragma unroll
    for (int j = 0; j < kDNT; ++j) {
      float p0 = 0.f, p1 = 0.f;
#pragma unroll
      for (int m = 0; m < kDMT; ++m) {
        p0 += fmaxf(acc[m][j][0], 0.f) * wl[m][0];
        p0 += fmaxf(acc[m][j][2], 0.f) * wl[m][1];
        p1 += fmaxf(acc[m][j][1], 0.f) * wl[m][0];
        p1 += fmaxf(acc[m][j][3], 0.f) * wl[m][1];
      }
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) {
        p0 += __shfl_xor_sync(0xffffffffu, p0, o);
        p1 += __shfl_xor_sync(0xffffffffu, p1, o);
      }
      if constexpr (kFp8Keys) {
        // Row scale of key 8j + g, copied by this lane; keys 8j + 2t, 8j + 2t + 1 from lanes
        // with g = 2t, 2t + 1.
        const float ksc = reinterpret_cast<const float*>(sl + kDNT * 2 * 32 * 16)[j * 32 + lane];
        p0 *= __shfl_sync(0xffffffffu, ksc, 8 * t);
        p1 *= __shfl_sync(0xffffffffu, ksc, 8 * t + 4);
      }
      if (g == j) {
        const int s = s0 + 8 * j + 2 * t;
        if (s < n) srow[s] = p0;
        if (s + 1 < n) srow[s + 1] = p1;
      }
    }
  }
  pipe_wait<0>();  // no copy outstanding at exit (the groups past the row's end are empty)
  if constexpr (kPdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// ---- warpgroup-MMA decode kernel (variants 8, 9; docs/cuda.md §Indexer scores, "wgmma") --------
//
// Why: the register-fed and pipelined decode kernels are instruction-issue-bound (ncu: ~700 warp
// instructions per 32-key chunk, HMMA 18%: q-fragment LDS, ReLU·w, address math, shuffles). Here
// one Hopper wgmma.m64n64k16 per k-step multiplies all 64 heads with a 64-key tile for the whole
// warpgroup (8 per tile), with both operands read by the tensor cores from shared memory.
//
// One CTA = one warpgroup (4 warps, 128 threads) on one query row (blockIdx.y); CTAs take 64-key
// tiles grid-strided over the row (tile = blockIdx.x + i·gridDim.x, the CTA's i-th tile).
//
//   D[h, key] = Σ_d Q[h, d] · K[key, d]  (M = 64 heads, N = 64 keys, K = 128 dims, 8 k-steps)
//
// Shared memory (dynamic): Q (bf16, 16 KB) | kWgStages key tiles (bf16, 16 KB each) | head-sum
// partials (f32 [4 warps][64 keys], 1 KB). Q and every key tile use the same canonical K-major
// layout without swizzle (PTX ISA "Shared Memory Matrix Layout", K-major, no-swizzling:
// ((8,m),(T,2k)):((1T,SBO),(1,LBO)), T = 8 bf16 = 16 bytes): "core matrices" of 8 rows × 16 bytes
// (8 dims), 128 contiguous bytes each (row r of the core at byte 16·r). Element (row, dim) of a
// 64 × 128 operand (row = head for Q, key for a tile) is at byte
//
//   (row / 8) · 2048 + (dim / 8) · 128 + (row % 8) · 16 + (dim % 8) · 2
//
// i.e. the 16 core matrices of one 8-row group along K are contiguous (LBO = 128 bytes: from a
// core matrix to the next one along K), and 8-row groups follow each other at SBO = 2048 bytes.
// The descriptor of k-step kk (dims 16kk … 16kk + 15: two core matrices along K) starts at
// base + 256·kk. Descriptor (PTX ISA "Matrix Descriptor Format"): bits 0–13 start address >> 4,
// 16–29 LBO >> 4 (= 8), 32–45 SBO >> 4 (= 128), 49–51 base offset 0, 62–63 swizzle 0 (none).
//
// Keys: every 16-byte piece (key, dims 8c … 8c + 7) of the tile is one cp.async.cg; copy it of a
// thread: key 8·it + (lane % 8), piece c = 4·warp + lane / 8 — a warp copies 64 contiguous bytes
// of 8 rows per instruction, and each quarter-warp writes one 128-byte core matrix (conflict-free).
// Invalid candidates (−1) and keys past the row's end are zero-filled (src-size 0): their scores
// are 0 (as the other kernels: ReLU(0) = 0), and past the end nothing is stored.
//
// Pipeline (all 128 threads both copy and compute): the CTA's first kWgStages − 1 tiles are issued
// before the q staging; iteration i issues tile i + S − 1 into the slot tile i − 1 used, commits (a
// group every iteration, empty past the end, so wait_group S − 1 ⇔ tile i landed), waits, then
// fence.proxy.async (cp.async / st.shared are generic-proxy writes, wgmma reads through the async
// proxy), __syncthreads (every thread's pieces), wgmma.fence, 8 wgmma, commit, wait_group 0. The
// slot refilled in iteration i was read by tile i − 1's wgmma, which every thread waited for
// before the epilogue barrier of iteration i − 1.
//
// Epilogue: accumulator fragment of wgmma m64nN (f32): warp w holds heads 16w … 16w + 15; lane
// (g = lane / 4, t = lane % 4) holds d[4j + e] = (head 16w + g, key 8j + 2t + e) and d[4j + 2 + e]
// = (head 16w + g + 8, same key), j < 8, e < 2. ReLU · w_h (w · nI^-1/2 · dI^-1/2) over its two
// heads → 16 values (keys 8j + 2t + e), summed over g (the warp's 16 heads) by a halving butterfly
// (xor 16: keep j of half (lane >> 4), add the partner's; xor 8; xor 4: 8 + 4 + 2 shuffles) that
// leaves lane (g, t) with keys 8g + 2t, 8g + 2t + 1; the 4 warps' sums go through shared memory,
// thread k < 64 adds them (warp 0 … 3) and stores score[tile·64 + k]. The summation order differs
// from the mma.sync kernels (scores equal up to fp32 rounding, not bit for bit).
//
// Keys on M (kKeysM, variants 10–12): the same operands with the roles swapped — A = the key tile
// (M = 64 keys), B = Q (N = 64 heads); both K-major in the same layout, so only the two
// descriptors trade places. D[key, h]: warp w holds keys 16w … 16w + 15; lane (g, t) holds
// d[4j + e] = (key 16w + g, head 8j + 2t + e) and d[4j + 2 + e] = (key 16w + g + 8, same head).
// ReLU · w over its 16 heads (j, then e ascending) gives two partial sums, completed over t by
// two xor shuffles (1, 2): a warp owns whole keys, so no cross-warp partials, no second barrier,
// 4 shuffles instead of 14 and no selects. The single barrier of an iteration (after the tile's
// copies landed) also orders the refill: every warp passed wgmma.wait_group 0 of the previous
// tile before it, so the slot that tile used is refilled right after it (tile i + S − 1), and
// wait_group S − 2 finds tile i landed (S − 1 tiles in flight while one computes).
constexpr int kWgN = 64;                          // keys per tile (wgmma N; kKeysM: M)
constexpr int kWgOperandBytes = 64 * kDDI * 2;    // 64 rows × 128 bf16 = 16 KB (Q or a key tile)
constexpr int kWgLbo = 128, kWgSbo = 2048;        // descriptor strides (bytes), see above
constexpr int kWgPartBytes = kDWarps * kWgN * 4;  // head-sum partials
constexpr int kWgRowQ = 3;                         // issues whose candidate rows are in flight
template <int kStages>
constexpr int wg_smem_bytes() {
  return kWgOperandBytes * (1 + kStages) + kWgPartBytes;
}
static_assert(kDNI == 64 && kDDI == 128 && kDWarps == 4, "wgmma kernel: M = 64 heads, K = 128");
static_assert(wg_smem_bytes<4>() <= 227 * 1024);

// Byte offset of (row, piece c = dims 8c … 8c + 7) in a 64 × 128 bf16 operand (layout above).
__device__ __forceinline__ uint32_t wg_piece_off(int row, int c) {
  return uint32_t((row >> 3) * kWgSbo + c * kWgLbo + (row & 7) * 16);
}
// wgmma shared-memory matrix descriptor of the operand starting at shared address `saddr`.
// swap (diagnostics only, indexer_wg_set_desc_swap): LBO and SBO fields exchanged — should the
// hardware read the two strides the other way round than the PTX ISA text says, the swapped
// descriptor is the right one (CudaIndexerWg.DescriptorStrideDiagnostic tells which).
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, bool swap) {
  return wgmma_desc(saddr, swap ? kWgSbo : kWgLbo, swap ? kWgLbo : kWgSbo);
}
template <int kStages, bool kPdl, bool kKeysM = false>
__global__ void __launch_bounds__(kDWarps * 32) indexer_decode_wg_kernel(ops::IndexerArgs a,
                                                                          float* __restrict__ scores,
                                                                          int64_t ld, int desc_swap) {
  static_assert(kStages >= 2 && kStages <= 4);
  extern __shared__ __align__(128) unsigned char wg_smem[];
  unsigned char* qs = wg_smem;                                         // Q operand
  unsigned char* ring = wg_smem + kWgOperandBytes;                     // kStages key tiles
  float* part = reinterpret_cast<float*>(ring + kStages * kWgOperandBytes);  // [warp][key]
  if constexpr (kPdl) asm volatile("griddepcontrol.wait;" ::: "memory");  // trigger: at the end
  const int64_t row = blockIdx.y;
  const int n = a.cand.count[row];
  if (int64_t(blockIdx.x) * kWgN >= n) return;  // whole CTA idle (uniform)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int32_t* cand = a.cand.rows + a.cand.offset[row];
  float* srow = scores + row * ld;
  const int gx = gridDim.x;
  const int tile0 = blockIdx.x;
  // This thread's copies: keys 8·it + kr (it < 8) of a tile, piece kc.
  const int kr = lane & 7, kc = 4 * warp + (lane >> 3);
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  const uint32_t my_off = wg_piece_off(kr, kc);  // + it · 2048 for key 8·it + kr
  const uint16_t* pool = static_cast<const uint16_t*>(a.key_pool);
  // Candidate rows of this thread's 8 keys of tile `tile` (−1: invalid or past the end).
  auto load_rows = [&](int tile, int32_t (&r)[8]) {
#pragma unroll
    for (int it = 0; it < 8; ++it) {
      const int s = tile * kWgN + 8 * it + kr;
      r[it] = s < n ? cand[s] : -1;
    }
  };
  auto issue = [&](int tile, const int32_t (&r)[8], int slot) {
    if (tile * kWgN >= n) return;  // uniform over the CTA
    const uint32_t dst0 = ring_s + uint32_t(slot * kWgOperandBytes) + my_off;
#pragma unroll
    for (int it = 0; it < 8; ++it) {
      const bool ok = r[it] >= 0;
      const uint16_t* src = pool + int64_t(ok ? r[it] : 0) * kDDI + 8 * kc;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                       dst0 + uint32_t(it * kWgSbo)),
                   "l"(src), "r"(ok ? 16 : 0)
                   : "memory");
    }
  };
  // Prologue: the CTA's tiles 0 … S − 2 in flight before the q staging. Candidate rows then run
  // kWgRowQ issues ahead in registers (rq[0] = the next issue's): ncu of variants 8 / 10 at
  // 230,400 keys (bench/results/ncu-issue7-bf60df0.md) had 25–30% of the warp stalls on the
  // row loads when they were fetched only one tile ahead.
  int32_t rq[kWgRowQ][8];
#pragma unroll
  for (int p = 0; p < kStages - 1; ++p) {
    load_rows(tile0 + p * gx, rq[0]);
    issue(tile0 + p * gx, rq[0], p);
    pipe_commit();
  }
#pragma unroll
  for (int q = 0; q < kWgRowQ; ++q) load_rows(tile0 + (kStages - 1 + q) * gx, rq[q]);
  // Issues tile `tile` + (S − 1)·gx into `slot`, then shifts the row queue and loads the rows
  // kWgRowQ issues ahead.
  auto issue_next = [&](int tile, int slot_) {
    issue(tile + (kStages - 1) * gx, rq[0], slot_);
    pipe_commit();
#pragma unroll
    for (int q = 0; q + 1 < kWgRowQ; ++q)
#pragma unroll
      for (int it = 0; it < 8; ++it) rq[q][it] = rq[q + 1][it];
    load_rows(tile + (kStages - 1 + kWgRowQ) * gx, rq[kWgRowQ - 1]);
  };
  // Stage q[row] (f32 [64, 128]) as bf16 in the operand layout: 1024 pieces of 8 dims.
  const float* qrow = a.q + row * (kDNI * kDDI);
  for (int u = threadIdx.x; u < kDNI * (kDDI / 8); u += kDWarps * 32) {
    const int h = u >> 4, c = u & 15;
    const float4 lo = *reinterpret_cast<const float4*>(qrow + h * kDDI + 8 * c);
    const float4 hi = *reinterpret_cast<const float4*>(qrow + h * kDDI + 8 * c + 4);
    *reinterpret_cast<uint4*>(qs + wg_piece_off(h, c)) =
        make_uint4(wfrag::pack_bf16(lo.x, lo.y), wfrag::pack_bf16(lo.z, lo.w),
                   wfrag::pack_bf16(hi.x, hi.y), wfrag::pack_bf16(hi.z, hi.w));
  }
  // This thread's head weights, scaled by nI^-1/2 · dI^-1/2: heads 16·warp + g, + 8 (heads on
  // M), or heads 8j + 2t + e, j < 8, e < 2 as wk[2j + e] (kKeysM).
  const float wscale = rsqrtf(float(kDNI)) * rsqrtf(float(kDDI));
  const float w0 = a.weights[row * kDNI + 16 * warp + g] * wscale;
  const float w1 = a.weights[row * kDNI + 16 * warp + g + 8] * wscale;
  [[maybe_unused]] float wk[16];
  if constexpr (kKeysM) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      wk[2 * j] = a.weights[row * kDNI + 8 * j + 2 * t] * wscale;
      wk[2 * j + 1] = a.weights[row * kDNI + 8 * j + 2 * t + 1] * wscale;
    }
  }
  const uint64_t qdesc = wg_desc(static_cast<uint32_t>(__cvta_generic_to_shared(qs)), desc_swap);
  float d[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) d[i] = 0.f;
  int slot = 0;  // = i % S
  for (int tile = tile0; tile * kWgN < n; tile += gx) {
    const int refill = slot == 0 ? kStages - 1 : slot - 1;  // the slot tile − gx used
    if constexpr (kKeysM) {
      pipe_wait<kStages - 2>();  // this thread's pieces of `tile` landed
      fence_proxy_async_smem();  // … and (with the q stores) visible to wgmma
      __syncthreads();           // every thread's pieces; every warp done with tile − gx's wgmma
      issue_next(tile, refill);
    } else {
      issue_next(tile, refill);
      pipe_wait<kStages - 1>();            // this thread's pieces of `tile` landed
      fence_proxy_async_smem();            // … and (with the q stores) visible to wgmma
      __syncthreads();                     // every thread's pieces; previous partials consumed
    }
    const uint64_t kdesc = wg_desc(ring_s + uint32_t(slot * kWgOperandBytes), desc_swap);
    slot = slot == kStages - 1 ? 0 : slot + 1;
    wgmma_fence();
    wgmma_fence_acc(d);
#pragma unroll
    for (int kk = 0; kk < kDKT; ++kk) {  // k-step kk: + 256 bytes = + 16 in the address field
      if constexpr (kKeysM)
        wgmma_ss_m64n64k16(d, kdesc + uint64_t(16 * kk), qdesc + uint64_t(16 * kk), kk > 0);
      else
        wgmma_ss_m64n64k16(d, qdesc + uint64_t(16 * kk), kdesc + uint64_t(16 * kk), kk > 0);
    }
    wgmma_commit();
    wgmma_wait0();
    wgmma_fence_acc(d);
    if constexpr (kKeysM) {
      // Σ over this thread's 16 heads of keys 16·warp + g (s0) and + 8 (s1), then over t.
      float s0 = 0.f, s1 = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          s0 += fmaxf(d[4 * j + e], 0.f) * wk[2 * j + e];
          s1 += fmaxf(d[4 * j + 2 + e], 0.f) * wk[2 * j + e];
        }
      }
      s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
      s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
      s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
      s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
      const int k0 = tile * kWgN + 16 * warp + g;
      if (t == 0 && k0 < n) srow[k0] = s0;
      if (t == 1 && k0 + 8 < n) srow[k0 + 8] = s1;
    } else {
      // ReLU · w over this thread's two heads: v[2j + e] = key 8j + 2t + e.
      float v[16];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e)
          v[2 * j + e] = fmaxf(d[4 * j + e], 0.f) * w0 + fmaxf(d[4 * j + 2 + e], 0.f) * w1;
      }
      // Σ over g (lane bits 2–4): halve the kept keys at each step.
      {
        const bool hi = (lane >> 4) & 1;  // keep j ∈ [4hi, 4hi + 4): v[8hi … 8hi + 7]
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float keep = hi ? v[k + 8] : v[k], send = hi ? v[k] : v[k + 8];
          v[k] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
        }
      }
      {
        const bool hi = (lane >> 3) & 1;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float keep = hi ? v[k + 4] : v[k], send = hi ? v[k] : v[k + 4];
          v[k] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
        }
      }
      {
        const bool hi = (lane >> 2) & 1;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const float keep = hi ? v[k + 2] : v[k], send = hi ? v[k] : v[k + 2];
          v[k] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
        }
      }
      // v[0], v[1] = Σ over the warp's 16 heads of keys 8g + 2t, 8g + 2t + 1.
      *reinterpret_cast<float2*>(part + warp * kWgN + 8 * g + 2 * t) = make_float2(v[0], v[1]);
      __syncthreads();
      if (threadIdx.x < kWgN) {
        const int s = tile * kWgN + threadIdx.x;
        const float sc = ((part[threadIdx.x] + part[kWgN + threadIdx.x]) + part[2 * kWgN + threadIdx.x]) +
                         part[3 * kWgN + threadIdx.x];
        if (s < n) srow[s] = sc;
      }
    }  // heads on M
  }
  pipe_wait<0>();  // no copy outstanding at exit (groups past the row's end are empty)
  if constexpr (kPdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
}  // namespace

bool indexer_tc_supported(int n_heads, int head_dim) {
  return n_heads > 0 && head_dim > 0 && n_heads % 16 == 0 && head_dim % 16 == 0 &&
         n_heads <= 128 && head_dim <= 256 && make_layout<4>(n_heads, head_dim).bytes <= 227 * 1024;
}

namespace {
template <int kQB, bool kFp8>
Status launch_tc(const ops::IndexerArgs& a, int64_t max_count, float* scores, int64_t ld,
                 int n_sms, cudaStream_t stream) {
  const Layout L = make_layout<kQB>(a.n_heads, a.head_dim);
  static bool attr_set = false;  // process-wide attribute per instantiation (largest layout)
  if (!attr_set) {
    cudaError_t e = cudaFuncSetAttribute(indexer_tc_kernel<kQB, kFp8>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
    if (e != cudaSuccess) return cuda_status(e, "indexer_tc smem attribute");
    attr_set = true;
  }
  const int64_t groups = (a.n_rows + kQB - 1) / kQB;
  const int64_t tiles = (max_count + kKT - 1) / kKT;
  const int64_t want = 8 * int64_t(n_sms);
  const int64_t gx = std::max<int64_t>(1, std::min<int64_t>(tiles, (want + groups - 1) / groups));
  const dim3 grid{unsigned(gx), unsigned(groups), 1u};
  indexer_tc_kernel<kQB, kFp8><<<grid, kThreads, L.bytes, stream>>>(a, scores, ld);
  return check_launch("indexer_tc_kernel");
}
}  // namespace

bool indexer_decode_supported(const ops::IndexerArgs& a) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.n_heads == kDNI && a.head_dim == kDDI && a.n_rows > 0 && a.n_rows <= 65535 &&
         aligned16(a.q) && aligned16(a.key_pool);
}

namespace {
// Auto picks the decode kernel up to this many query rows: decode batches (each row its own
// list; the WMMA kernel would take such rows one by one) and short prefill chunks (rows of one
// sequence then each read the shared keys, mostly from L2). Longer prefill chunks keep the WMMA
// kernel, whose 4-row groups load each key tile once.
constexpr int64_t kDecodeMaxRows = kIndexerDecodeMaxRows;
// V4_INDEXER_DECODE=0 turns the decode kernel off (A/B against the WMMA kernel); read once.
bool decode_kernel_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("V4_INDEXER_DECODE");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

// Resident CTAs per SM of `kernel` (128 threads, `smem` bytes of dynamic shared memory) from the
// occupancy API, or `fallback` when the query fails.
template <typename... P>
int resident_per_sm(void (*kernel)(P...), int smem, int fallback) {
  int b = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kDWarps * 32, smem) !=
          cudaSuccess ||
      b < 1) {
    (void)cudaGetLastError();
    b = fallback;
  }
  return b;
}
// Grid x of a one-wave launch over S rows: per row `units` work items (chunks / tiles) at most,
// per_sm · n_sms CTAs in all. Floor, not ceil: S·gx ≤ one wave, so no almost-empty second wave
// adds a block's duration.
int64_t one_wave_gx(int64_t units, int per_sm, int n_sms, int64_t S) {
  const int64_t want = int64_t(per_sm) * std::max(1, n_sms);
  return std::max<int64_t>(1, std::min(units, want / std::max<int64_t>(1, S)));
}
// Launches `kernel` (128 threads a CTA) — the plain form, or with pdl the PDL form (same
// signature and body plus griddepcontrol, so the same registers and occupancy the grid was
// sized for) with programmatic stream serialization.
template <typename... P, typename... Args>
Status launch_indexer_kernel_n(void (*kernel)(P...), dim3 grid, int threads, int smem,
                               cudaStream_t stream, bool pdl, const char* name, Args... args) {
  if (!pdl) {
    kernel<<<grid, threads, smem, stream>>>(args...);
    return check_launch(name);
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(unsigned(threads), 1, 1);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  V4_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, args...));
  return check_launch(name);
}
// launch_indexer_kernel_n with 128 threads (kDWarps warps) a CTA.
template <typename... P, typename... Args>
Status launch_indexer_kernel(void (*kernel)(P...), dim3 grid, int smem, cudaStream_t stream,
                             bool pdl, const char* name, Args... args) {
  return launch_indexer_kernel_n(kernel, grid, kDWarps * 32, smem, stream, pdl, name, args...);
}

template <int kDNT, int kKeys, int kMinBlocks = 1, bool kPf = false>
Status launch_decode(const ops::IndexerArgs& a, int64_t max_count, float* scores, int64_t ld,
                     int n_sms, cudaStream_t stream, bool pdl) {
  constexpr int kDChunk = 8 * kDNT;
  // Resident blocks per SM (registers bound it; no dynamic shared memory), queried once.
  static const int per_sm =
      resident_per_sm(indexer_decode_kernel<kDNT, kKeys, false, kMinBlocks, kPf>, 0, 4);
  const int64_t blocks_needed = (max_count + kDWarps * kDChunk - 1) / (kDWarps * kDChunk);
  const dim3 grid{unsigned(one_wave_gx(blocks_needed, per_sm, n_sms, a.n_rows)),
                  unsigned(a.n_rows), 1u};
  return launch_indexer_kernel(pdl ? indexer_decode_kernel<kDNT, kKeys, true, kMinBlocks, kPf>
                                   : indexer_decode_kernel<kDNT, kKeys, false, kMinBlocks, kPf>,
                               grid, 0, stream, pdl, "indexer_decode_kernel", a, scores, ld);
}

// The pipelined decode kernel (bf16 / fp8 keys): grid sized as launch_decode (one wave, resident
// blocks per SM from the occupancy API with the ring's dynamic shared memory).
template <int kStages, int kKeys, bool kFastCvt, bool kRowMap = false, int kNT = kPipeNT>
Status launch_decode_pipe(const ops::IndexerArgs& a, int64_t max_count, float* scores, int64_t ld,
                          int n_sms, cudaStream_t stream, bool pdl) {
  constexpr int kSmem = pipe_smem_bytes<kStages, kKeys, kNT>();
  constexpr auto kPlain = indexer_decode_pipe_kernel<kStages, kKeys, kFastCvt, false, kRowMap, kNT>;
  constexpr auto kWithPdl = indexer_decode_pipe_kernel<kStages, kKeys, kFastCvt, true, kRowMap, kNT>;
  // Opt-in to > 48 KB dynamic shared memory for both launch forms, once per instantiation.
  static const cudaError_t attr_err = [] {
    cudaError_t e = cudaFuncSetAttribute(kPlain, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(kWithPdl, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    return e;
  }();
  if (attr_err != cudaSuccess) return cuda_status(attr_err, "indexer_decode_pipe smem attribute");
  static const int per_sm = resident_per_sm(kPlain, kSmem, 1);
  constexpr int kChunk = 8 * kNT;
  const int64_t blocks_needed = (max_count + kDWarps * kChunk - 1) / (kDWarps * kChunk);
  const dim3 grid{unsigned(one_wave_gx(blocks_needed, per_sm, n_sms, a.n_rows)),
                  unsigned(a.n_rows), 1u};
  return launch_indexer_kernel(pdl ? kWithPdl : kPlain, grid, kSmem, stream, pdl,
                               kRowMap ? "indexer_decode_pipe_kernel (row map)"
                                       : "indexer_decode_pipe_kernel",
                               a, scores, ld);
}

// Variants 4–7 over bf16 / fp8 keys (f32 keys: the decode kernel's default, 2 n-tiles).
template <int kKeys>
Status launch_pipe_variant(int variant, const ops::IndexerArgs& a, int64_t max_count,
                           float* scores, int64_t ld, int n_sms, cudaStream_t stream, bool pdl) {
  switch (variant) {
    case 5: return launch_decode_pipe<2, kKeys, true>(a, max_count, scores, ld, n_sms, stream, pdl);
    case 6: return launch_decode_pipe<4, kKeys, true>(a, max_count, scores, ld, n_sms, stream, pdl);
    case 7:
      if constexpr (kKeys == kKeysFp8)
        return launch_decode_pipe<3, kKeys, false>(a, max_count, scores, ld, n_sms, stream, pdl);
      [[fallthrough]];
    default: return launch_decode_pipe<3, kKeys, true>(a, max_count, scores, ld, n_sms, stream, pdl);
  }
}

// Diagnostics only (indexer_wg_set_desc_swap): exchange the descriptors' LBO / SBO fields.
bool g_wg_desc_swap = false;

// The warpgroup-MMA decode kernel (bf16 keys): one wave of CTAs (resident CTAs per SM from the
// occupancy API with the dynamic shared memory), spread over the S rows as launch_decode does.
template <int kStages, bool kKeysM = false>
Status launch_decode_wg(const ops::IndexerArgs& a, int64_t max_count, float* scores, int64_t ld,
                        int n_sms, cudaStream_t stream, bool pdl) {
  constexpr int kSmem = wg_smem_bytes<kStages>();
  static const cudaError_t attr_err = [] {
    cudaError_t e = cudaFuncSetAttribute(indexer_decode_wg_kernel<kStages, false, kKeysM>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(indexer_decode_wg_kernel<kStages, true, kKeysM>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    return e;
  }();
  if (attr_err != cudaSuccess) return cuda_status(attr_err, "indexer_decode_wg smem attribute");
  static const int per_sm =
      resident_per_sm(indexer_decode_wg_kernel<kStages, false, kKeysM>, kSmem, 1);
  if (a.key_dtype != KvDtype::kBf16)
    return errorf(ErrorCode::kInvalidArgument, "indexer_decode_wg: bf16 keys only");
  const int64_t tiles = (max_count + kWgN - 1) / kWgN;
  const dim3 grid{unsigned(one_wave_gx(tiles, per_sm, n_sms, a.n_rows)), unsigned(a.n_rows), 1u};
  return launch_indexer_kernel(pdl ? indexer_decode_wg_kernel<kStages, true, kKeysM>
                                   : indexer_decode_wg_kernel<kStages, false, kKeysM>,
                               grid, kSmem, stream, pdl, "indexer_decode_wg_kernel", a, scores, ld,
                               int(g_wg_desc_swap));
}

// ---- bulk-copy decode kernel for fp8 keys (variant 30, docs/cuda.md §Bulk-copy fp8 decode kernel)
//
// One CTA = a consumer warpgroup (warps 0–3) + a producer warp (warp 4) on one query row; CTAs
// take 64-key tiles of the row grid-strided (one wave, 3 CTAs an SM). A tile's 64 raw key rows (144 bytes each: codes + f32 scale) land in
// shared memory by cp.async.bulk: one 9,216-byte copy when the tile's candidates are 64
// consecutive pool rows (a page of C4 entries: the decode plan's lists, compressed_row), else one
// 144-byte copy per valid row (−1 rows zero-filled: score 0). The producer warp runs up to kStages
// tiles ahead (candidate rows kBkRowAhead tiles ahead, by cp.async into shared memory): it waits on a slot's `empty` barrier
// (one arrival per consumer warp) and issues the copies, which complete the slot's `full` barrier
// on their bytes. So the consumers never wait on a candidate-row load (with warp 0 as the
// producer, its row loads stalled the whole warpgroup's wgmma every tile: 20.8 µs at 230,400 keys
// against 17.8 for variant 24). Every thread then reads its two keys' 32 code bytes, converts them to their exact f16
// values in registers (one cvt per pair) and the warpgroup multiplies them as the A operand
// (keys = M) with wgmma.m64n64k16.f16 against q's per-head e4m3 codes as exact f16 values (B =
// 64 heads, K-major, 128-byte swizzle, staged once per CTA). K permutation: k-step kk of lane
// (g, t) takes dims 32t + 4kk … + 3 (A columns 2t, 2t + 1 ← dims +0, +1; 2t + 8, 2t + 9 ← +2, +3),
// and q's B rows carry the same permutation, so the products are those of the decode kernels
// (exact) summed in another fp32 order. Epilogue in registers: ReLU · w_h over the thread's 16
// heads of 2 keys, two xor shuffles over t, × the key's row scale.
constexpr int kBkTile = 64;                              // keys per tile (wgmma M)
constexpr int kBkSlot = kBkTile * kFp8KeyRowBytes;       // 9,216 bytes of raw rows a slot
constexpr int kBkQBytes = kDNI * kDDI * 2;               // 16 KB: q's code values as f16
constexpr int kBkThreads = kDWarps * 32 + 32;           // consumer warpgroup + producer warp
// The producer's candidate rows: a ring of kBkRowRing tiles' entries in shared memory, filled by
// cp.async kBkRowAhead tiles ahead of the tile being issued (one row-load latency for the whole
// CTA instead of one per tile: with rows loaded one tile ahead in registers the producer issued
// about one tile per L2 round trip).
constexpr int kBkRowRing = 12, kBkRowAhead = 8;
template <int kStages>
constexpr int bk_smem_bytes() {
  return 1024 + kBkQBytes + kStages * kBkSlot + 2 * kStages * 8 + kDNI * 4 +
         kBkRowRing * kBkTile * 4;  // + alignment slack at the front
}
// 3 CTAs an SM at every depth (sm_90: 228 KiB a multiprocessor, 1 KiB reserved a CTA); the ring
// slot of tile i + kBkRowAhead held tile i + kBkRowAhead − kBkRowRing, read before.
static_assert(3 * (bk_smem_bytes<6>() + 1024) <= 228 * 1024 && kBkRowRing > kBkRowAhead,
              "3 CTAs an SM");

// Byte offset of (head n, permuted k index kp) in q's B operand: two 64-column blocks of 64 rows ×
// 128 bytes, 16-byte chunk j of row n at chunk j ^ (n % 8) (wgmma_desc_sw128's layout).
__device__ __forceinline__ uint32_t bk_q_off(int n, int kp) {
  return uint32_t((kp >> 6) * 8192 + n * 128 + ((((kp & 63) >> 3) ^ (n & 7)) << 4) + (kp & 7) * 2);
}

template <int kStages, bool kPdl, int kMinB = 3>
__global__ void __launch_bounds__(kBkThreads, kMinB)
    indexer_decode_bulk_kernel(ops::IndexerArgs a, float* __restrict__ scores, int64_t ld) {
  extern __shared__ unsigned char bk_raw[];
  if constexpr (kPdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  const int64_t row = blockIdx.y;
  const int n = a.cand.count[row];
  const int64_t cand_off = a.cand.offset[row];  // loaded with the count: one round trip, not two
  const int tiles = (n + kBkTile - 1) / kBkTile;
  const int first = int(blockIdx.x), gx = int(gridDim.x);
  if (first >= tiles) return;  // whole CTA idle (uniform)
  const int my = (tiles - first + gx - 1) / gx;  // this CTA's tiles: first + i·gx, i < my
  // The swizzled q operand needs a 1024-byte aligned shared address (not generic pointer).
  unsigned char* sm =
      bk_raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(bk_raw)) & 1023u)) & 1023u);
  unsigned char* slots = sm + kBkQBytes;
  float* qsc = reinterpret_cast<float*>(slots + kStages * kBkSlot + 2 * kStages * 8);
  int32_t* rring = reinterpret_cast<int32_t*>(qsc + kDNI);  // [kBkRowRing][kBkTile]
  const uint32_t q_sa = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
  const uint32_t slot_sa = q_sa + kBkQBytes;
  const uint32_t bar_sa = slot_sa + kStages * kBkSlot;  // full[s] at 8s, empty[s] at 8(kStages + s)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int32_t* cand = a.cand.rows + cand_off;
  const uint8_t* pool = static_cast<const uint8_t*>(a.key_pool);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_sa + 8 * s, 1);
      mbar_init(bar_sa + 8 * (kStages + s), kDWarps);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  // Producer: cp.async of tile i's candidate rows into ring slot i % kBkRowRing (entries past n
  // not read), one commit group a call (empty past this CTA's tiles, so the counts stay exact).
  auto fetch_rows = [&](int i) {
    if (i < my) {
      const int s0 = (first + i * gx) * kBkTile;
      int32_t* d = rring + (i % kBkRowRing) * kBkTile;
      wfrag::cp_async_small<4>(d + lane, cand + s0 + lane, s0 + lane < n);
      wfrag::cp_async_small<4>(d + 32 + lane, cand + s0 + 32 + lane, s0 + 32 + lane < n);
    }
    wfrag::cp_async_commit();
  };
  // Producer: the copies of tile i into slot i % kStages (the caller waited for its `empty`
  // phase: every consumer warp read the slot's previous tile).
  auto issue = [&](int i, int32_t r0, int32_t r1) {
    const int s0 = (first + i * gx) * kBkTile;
    const int slot = i % kStages;
    const uint32_t dst = slot_sa + slot * kBkSlot, bar = bar_sa + 8 * slot;
    const int32_t base = __shfl_sync(0xffffffffu, r0, 0);
    fence_proxy_async_smem();  // this lane's generic accesses of the slot before the async writes
    if (__all_sync(0xffffffffu, base >= 0 && r0 - lane == base && r1 - 32 - lane == base)) {
      if (lane == 0) {
        mbar_arrive_expect_tx(bar, kBkSlot);
        bulk_g2s(dst, pool + int64_t(base) * kFp8KeyRowBytes, kBkSlot, bar);
      }
      return;
    }
    const bool v0 = r0 >= 0, v1 = r1 >= 0;
    auto zero_row = [&](int k) {
      uint4* p = reinterpret_cast<uint4*>(slots + slot * kBkSlot + k * kFp8KeyRowBytes);
#pragma unroll
      for (int u = 0; u < kFp8KeyRowBytes / 16; ++u) p[u] = make_uint4(0u, 0u, 0u, 0u);
    };
    if (!v0 && s0 + lane < n) zero_row(lane);
    if (!v1 && s0 + 32 + lane < n) zero_row(32 + lane);
    const uint32_t rows = __popc(__ballot_sync(0xffffffffu, v0)) +
                          __popc(__ballot_sync(0xffffffffu, v1));
    __syncwarp();  // the zero rows before the arrive (release) that publishes them
    if (lane == 0) mbar_arrive_expect_tx(bar, rows * kFp8KeyRowBytes);
    __syncwarp();
    if (v0) bulk_g2s(dst + lane * kFp8KeyRowBytes, pool + int64_t(r0) * kFp8KeyRowBytes,
                     kFp8KeyRowBytes, bar);
    if (v1) bulk_g2s(dst + (32 + lane) * kFp8KeyRowBytes, pool + int64_t(r1) * kFp8KeyRowBytes,
                     kFp8KeyRowBytes, bar);
  };
  if (warp == kDWarps) {  // the producer warp
#pragma unroll
    for (int i = 0; i < kBkRowAhead; ++i) fetch_rows(i);
    for (int i = 0; i < my; ++i) {
      fetch_rows(i + kBkRowAhead);  // its slot held tile i + kBkRowAhead − kBkRowRing: read
      wfrag::cp_async_wait<kBkRowAhead>();  // tile i's group has landed (this lane's copies)
      __syncwarp();  // also keeps the ring reads below the wait (the cp.async asm has no clobber)
      const int s0 = (first + i * gx) * kBkTile;
      const int32_t* rr = rring + (i % kBkRowRing) * kBkTile;
      const int32_t r0 = s0 + lane < n ? rr[lane] : -1;
      const int32_t r1 = s0 + 32 + lane < n ? rr[32 + lane] : -1;
      if (i >= kStages)
        mbar_wait(bar_sa + 8 * (kStages + i % kStages), uint32_t(i / kStages - 1) & 1u);
      issue(i, r0, r1);
    }
    return;
  }
  // q[row] quantized per head (kvfp8::index_query_fp8, as stage_q_fp8x8_one_pass: same scales and
  // codes), written as exact f16 values into the B operand; thread = (head tid / 2, 64 dims).
  {
    const int h = threadIdx.x >> 1, half = threadIdx.x & 1;
    const float* qp = a.q + row * (kDNI * kDDI) + h * kDDI + 64 * half;
    float4 x[16];
#pragma unroll
    for (int u = 0; u < 16; ++u) x[u] = *reinterpret_cast<const float4*>(qp + 4 * u);
    float amax = 0.f;
#pragma unroll
    for (int u = 0; u < 16; ++u)
      amax = fmaxf(amax, fmaxf(fmaxf(kvfp8::abs_finite(x[u].x), kvfp8::abs_finite(x[u].y)),
                               fmaxf(kvfp8::abs_finite(x[u].z), kvfp8::abs_finite(x[u].w))));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    const float sc = kvfp8::block_scale(amax), inv = kvfp8::index_query_inv(sc);
    if (half == 0) qsc[h] = sc;
#pragma unroll
    for (int u = 0; u < 16; ++u) {
      const int d = 64 * half + 4 * u, tt = d >> 5, kk = (d & 31) >> 2;
      const uint32_t c = q_codes4(x[u], inv);
      *reinterpret_cast<uint32_t*>(sm + bk_q_off(h, 16 * kk + 2 * tt)) = e4m3x2_to_f16x2(c);
      *reinterpret_cast<uint32_t*>(sm + bk_q_off(h, 16 * kk + 2 * tt + 8)) = e4m3x2_to_f16x2(c >> 16);
    }
  }
  fence_proxy_async_smem();  // q's generic writes → visible to wgmma
  named_sync(1, kDWarps * 32);  // the consumer warpgroup
  // This thread's 16 heads 8j + 2t + e: w_h · dI^-1/2 · nI^-1/2 · q's head scale.
  const float wscale = rsqrtf(float(kDNI)) * rsqrtf(float(kDDI));
  float wl[8][2];
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int h = 8 * j + 2 * t + e;
      wl[j][e] = a.weights[row * kDNI + h] * wscale * qsc[h];
    }
  float* srow = scores + row * ld;
  const int k0 = 16 * warp + g;  // this thread's keys of a tile: k0, k0 + 8
  for (int i = 0; i < my; ++i) {
    const int slot = i % kStages;
    mbar_wait(bar_sa + 8 * slot, uint32_t(i / kStages) & 1u);
    const unsigned char* sb = slots + slot * kBkSlot;
    const uint4* p0 = reinterpret_cast<const uint4*>(sb + k0 * kFp8KeyRowBytes + 32 * t);
    const uint4* p1 = reinterpret_cast<const uint4*>(sb + (k0 + 8) * kFp8KeyRowBytes + 32 * t);
    const uint4 c0a = p0[0], c0b = p0[1], c1a = p1[0], c1b = p1[1];
    const float ks0 = *reinterpret_cast<const float*>(sb + k0 * kFp8KeyRowBytes + kDDI);
    const float ks1 = *reinterpret_cast<const float*>(sb + (k0 + 8) * kFp8KeyRowBytes + kDDI);
    __syncwarp();  // the warp's reads of the slot are done: one arrival frees it for the producer
    if (lane == 0) mbar_arrive(bar_sa + 8 * (kStages + slot));
    uint32_t af[8][4];
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint4& v0 = kk < 4 ? c0a : c0b;
      const uint4& v1 = kk < 4 ? c1a : c1b;
      const int q = kk & 3;
      const uint32_t w0 = q == 0 ? v0.x : q == 1 ? v0.y : q == 2 ? v0.z : v0.w;
      const uint32_t w1 = q == 0 ? v1.x : q == 1 ? v1.y : q == 2 ? v1.z : v1.w;
      af[kk][0] = e4m3x2_to_f16x2(w0);
      af[kk][1] = e4m3x2_to_f16x2(w1);
      af[kk][2] = e4m3x2_to_f16x2(w0 >> 16);
      af[kk][3] = e4m3x2_to_f16x2(w1 >> 16);
    }
    float d[32];
#pragma unroll
    for (int x = 0; x < 32; ++x) d[x] = 0.f;
    // The A registers and accumulators are written before wgmma.fence (operand fences: the
    // compiler may not sink those writes below the fence asm).
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      asm volatile("" : "+r"(af[kk][0]), "+r"(af[kk][1]), "+r"(af[kk][2]), "+r"(af[kk][3])::"memory");
    wgmma_fence_acc(d);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      wgmma_rs_m64n64k16_f16(d, af[kk],
                             wgmma_desc_sw128(q_sa + (kk >> 2) * 8192 + (kk & 3) * 32, 16, 1024),
                             kk > 0);
    wgmma_commit();
    wgmma_wait0();
    wgmma_fence_acc(d);
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s0 += fmaxf(d[4 * j], 0.f) * wl[j][0];
      s0 += fmaxf(d[4 * j + 1], 0.f) * wl[j][1];
      s1 += fmaxf(d[4 * j + 2], 0.f) * wl[j][0];
      s1 += fmaxf(d[4 * j + 3], 0.f) * wl[j][1];
    }
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
      s0 += __shfl_xor_sync(0xffffffffu, s0, o);
      s1 += __shfl_xor_sync(0xffffffffu, s1, o);
    }
    const int s = (first + i * gx) * kBkTile + k0;
    if (t == 0 && s < n) srow[s] = s0 * ks0;
    if (t == 1 && s + 8 < n) srow[s + 8] = s1 * ks1;
  }
  if constexpr (kPdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// The bulk-copy kernel (fp8 keys): one wave of CTAs (resident CTAs per SM from the occupancy API
// with its dynamic shared memory), spread over the S rows as launch_decode does. kMinB: CTAs an
// SM the register budget is set for (3; 4 with a 3-deep ring: A/B, V4_INDEXER_BULK_CTAS=4).
template <int kStages, int kMinB = 3>
Status launch_decode_bulk_n(const ops::IndexerArgs& a, int64_t max_count, float* scores, int64_t ld,
                            int n_sms, cudaStream_t stream, bool pdl) {
  constexpr int kSmem = bk_smem_bytes<kStages>();
  static_assert(kMinB * (kSmem + 1024) <= 228 * 1024, "kMinB CTAs an SM");
  static const cudaError_t attr_err = [] {
    cudaError_t e = cudaFuncSetAttribute(indexer_decode_bulk_kernel<kStages, false, kMinB>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(indexer_decode_bulk_kernel<kStages, true, kMinB>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    return e;
  }();
  if (attr_err != cudaSuccess) return cuda_status(attr_err, "indexer_decode_bulk smem attribute");
  static const int per_sm = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &b, indexer_decode_bulk_kernel<kStages, false, kMinB>, kBkThreads, kSmem) !=
            cudaSuccess ||
        b < 1) {
      (void)cudaGetLastError();
      b = 1;
    }
    return b;
  }();
  const int64_t tiles = (max_count + kBkTile - 1) / kBkTile;
  const dim3 grid{unsigned(one_wave_gx(tiles, per_sm, n_sms, a.n_rows)), unsigned(a.n_rows), 1u};
  return launch_indexer_kernel_n(pdl ? indexer_decode_bulk_kernel<kStages, true, kMinB>
                                     : indexer_decode_bulk_kernel<kStages, false, kMinB>,
                                 grid, kBkThreads, kSmem, stream, pdl,
                                 "indexer_decode_bulk_kernel", a, scores, ld);
}
// Ring depth of the bulk-copy kernel: 4 tiles (default) or V4_INDEXER_BULK_STAGES=2|3|6 (A/B,
// read once; 3 CTAs an SM at every depth).
Status launch_decode_bulk(const ops::IndexerArgs& a, int64_t max_count, float* scores, int64_t ld,
                          int n_sms, cudaStream_t stream, bool pdl) {
  static const int stages = [] {
    const char* e = std::getenv("V4_INDEXER_BULK_STAGES");
    const int v = e ? std::atoi(e) : 4;
    return v == 2 || v == 3 || v == 6 ? v : 4;
  }();
  static const bool four = [] {
    const char* e = std::getenv("V4_INDEXER_BULK_CTAS");
    return e && e[0] == '4';
  }();
  if (four) return launch_decode_bulk_n<3, 4>(a, max_count, scores, ld, n_sms, stream, pdl);
  switch (stages) {
    case 2: return launch_decode_bulk_n<2>(a, max_count, scores, ld, n_sms, stream, pdl);
    case 3: return launch_decode_bulk_n<3>(a, max_count, scores, ld, n_sms, stream, pdl);
    case 6: return launch_decode_bulk_n<6>(a, max_count, scores, ld, n_sms, stream, pdl);
    default: return launch_decode_bulk_n<4>(a, max_count, scores, ld, n_sms, stream, pdl);
  }
}
// V4_INDEXER_BULK=0 keeps variant 24 for every fp8 decode call of auto (A/B; read once).
bool bulk_auto_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("V4_INDEXER_BULK");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}
}  // namespace

void indexer_wg_set_desc_swap(bool swap) { g_wg_desc_swap = swap; }

namespace {
// ld_stream_u4 as a volatile asm: the probe kernels' loads stay in program order, all issued
// before the first use (a plain asm let ptxas interleave the XORs and keep 32 registers, so
// fewer bytes were in flight than in the decode kernel).
__device__ __forceinline__ uint4 ld_stream_u4_ordered(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// indexer_gather_probe's kernel: indexer_decode_kernel<4, kKeysBf16, false>'s loads, no math.
// kDepth chunks per warp in flight (1 = the decode kernel: chunks c, c + stride, … one at a
// time; 2 = chunks c and c + stride issued together, then c + 2·stride, …). kHalf: only the
// first 128 bytes of each 256-byte row (u < 2): the same rows, half the bytes.
template <int kDepth, bool kHalf>
__global__ void __launch_bounds__(kDWarps * 32) indexer_gather_probe_kernel(ops::IndexerArgs a,
                                                                             uint32_t* sink) {
  constexpr int kDNT = 4, kDChunk = 8 * kDNT, kU = kHalf ? kDKT / 4 : kDKT / 2;
  const int64_t row = blockIdx.y;
  const int n = a.cand.count[row];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int32_t* cand = a.cand.rows + a.cand.offset[row];
  const uint16_t* pool = static_cast<const uint16_t*>(a.key_pool);
  const int stride = gridDim.x * kDWarps;
  int c = blockIdx.x * kDWarps + warp;
  int32_t rn[kDepth][kDNT];
#pragma unroll
  for (int d = 0; d < kDepth; ++d)
#pragma unroll
    for (int j = 0; j < kDNT; ++j) {
      const int s = (c + d * stride) * kDChunk + 8 * j + g;
      rn[d][j] = s < n ? cand[s] : -1;
    }
  uint32_t acc = 0;
  for (; c * kDChunk < n; c += kDepth * stride) {
    uint4 kv[kDepth][kDNT][kU];
#pragma unroll
    for (int d = 0; d < kDepth; ++d)
#pragma unroll
      for (int j = 0; j < kDNT; ++j)
#pragma unroll
        for (int u = 0; u < kU; ++u)
          kv[d][j][u] = rn[d][j] < 0 ? make_uint4(0u, 0u, 0u, 0u)
                                     : ld_stream_u4_ordered(pool + int64_t(rn[d][j]) * kDDI +
                                                            key_dim0<kKeysBf16>(2 * u, t));
#pragma unroll
    for (int d = 0; d < kDepth; ++d)
#pragma unroll
      for (int j = 0; j < kDNT; ++j) {
        const int s = (c + (kDepth + d) * stride) * kDChunk + 8 * j + g;
        rn[d][j] = s < n ? cand[s] : -1;
      }
#pragma unroll
    for (int d = 0; d < kDepth; ++d)
#pragma unroll
      for (int j = 0; j < kDNT; ++j)
#pragma unroll
        for (int u = 0; u < kU; ++u)
          acc ^= kv[d][j][u].x ^ kv[d][j][u].y ^ kv[d][j][u].z ^ kv[d][j][u].w;
  }
  sink[(row * gridDim.x + blockIdx.x) * (kDWarps * 32) + threadIdx.x] = acc;
}

// The probe with whole rows per load: load i (0..15) of a 32-key chunk reads keys 2i and 2i + 1,
// lanes 0–15 the 256 bytes of the first, 16–31 of the second (each load = 2 contiguous rows),
// the row numbers shuffled from lane k (candidate k of the chunk).
__global__ void __launch_bounds__(kDWarps * 32) indexer_gather_probe_rows_kernel(ops::IndexerArgs a,
                                                                                  uint32_t* sink) {
  constexpr int kDChunk = 32;
  const int64_t row = blockIdx.y;
  const int n = a.cand.count[row];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t* cand = a.cand.rows + a.cand.offset[row];
  const uint16_t* pool = static_cast<const uint16_t*>(a.key_pool);
  const int stride = gridDim.x * kDWarps;
  int c = blockIdx.x * kDWarps + warp;
  int32_t rn = c * kDChunk + lane < n ? cand[c * kDChunk + lane] : -1;
  uint32_t acc = 0;
  for (; c * kDChunk < n; c += stride) {
    const int32_t mine = rn;
    uint4 kv[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int32_t r = __shfl_sync(0xffffffffu, mine, 2 * i + (lane >> 4));
      kv[i] = r < 0 ? make_uint4(0u, 0u, 0u, 0u)
                    : ld_stream_u4_ordered(pool + int64_t(r) * kDDI + 8 * (lane & 15));
    }
    const int s = (c + stride) * kDChunk + lane;
    rn = s < n ? cand[s] : -1;
#pragma unroll
    for (int i = 0; i < 16; ++i) acc ^= kv[i].x ^ kv[i].y ^ kv[i].z ^ kv[i].w;
  }
  sink[(row * gridDim.x + blockIdx.x) * (kDWarps * 32) + threadIdx.x] = acc;
}

// Contiguous read of n16 16-byte words (grid-stride, 4 loads in flight per thread).
__global__ void __launch_bounds__(256) read_probe_kernel(const uint4* __restrict__ p, int64_t n16,
                                                         uint32_t* sink) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * step < n16; i += 4 * step) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = ld_stream_u4_ordered(p + i + k * step);
#pragma unroll
    for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (; i < n16; i += step) {
    const uint4 v = ld_stream_u4(reinterpret_cast<const uint16_t*>(p + i));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  sink[int64_t(blockIdx.x) * blockDim.x + threadIdx.x] = acc;
}

// The probe kernel `o` selects.
using GatherProbeKernel = void (*)(ops::IndexerArgs, uint32_t*);
GatherProbeKernel gather_probe_kernel(const GatherProbeOptions& o) {
  if (o.whole_rows) return indexer_gather_probe_rows_kernel;
  if (o.depth == 2)
    return o.half_rows ? indexer_gather_probe_kernel<2, true> : indexer_gather_probe_kernel<2, false>;
  return o.half_rows ? indexer_gather_probe_kernel<1, true> : indexer_gather_probe_kernel<1, false>;
}
// The probe's grid: the decode kernel's for bf16 keys (launch_decode<4, kKeysBf16>), or
// o.blocks_per_sm CTAs an SM (capped by the probe kernel's own occupancy).
int64_t gather_probe_gx(const ops::IndexerArgs& a, int64_t max_count, int n_sms,
                        const GatherProbeOptions& o) {
  static const int decode_per_sm =
      resident_per_sm(indexer_decode_kernel<4, kKeysBf16, false>, 0, 4);
  int per_sm = decode_per_sm;
  if (o.blocks_per_sm > 0)
    per_sm = std::min(o.blocks_per_sm, resident_per_sm(gather_probe_kernel(o), 0, 1));
  return one_wave_gx((max_count + kDWarps * 32 - 1) / (kDWarps * 32), per_sm, n_sms, a.n_rows);
}
}  // namespace

int64_t indexer_gather_probe_sink_words(const ops::IndexerArgs& a, int64_t max_count, int n_sms,
                                        const GatherProbeOptions& o) {
  return std::max<int64_t>(1, a.n_rows) * gather_probe_gx(a, max_count, n_sms, o) * (kDWarps * 32);
}

Status indexer_gather_probe(const ops::IndexerArgs& a, int64_t max_count, uint32_t* sink,
                            int n_sms, cudaStream_t stream, const GatherProbeOptions& o) {
  if (a.key_dtype != KvDtype::kBf16 || a.n_heads != kDNI || a.head_dim != kDDI ||
      a.n_rows <= 0 || a.n_rows > 65535 || max_count <= 0 || !sink ||
      (o.depth != 1 && o.depth != 2) || o.blocks_per_sm < 0)
    return errorf(ErrorCode::kInvalidArgument,
                  "indexer_gather_probe: bf16 keys, nI {} dI {}, 1..65535 rows, a sink, depth 1 "
                  "or 2, blocks_per_sm >= 0", kDNI, kDDI);
  const dim3 grid{unsigned(gather_probe_gx(a, max_count, n_sms, o)), unsigned(a.n_rows), 1u};
  gather_probe_kernel(o)<<<grid, kDWarps * 32, 0, stream>>>(a, sink);
  return check_launch("indexer_gather_probe_kernel");
}

int64_t read_probe_sink_words(int n_sms, int blocks_per_sm) {
  return int64_t(std::max(1, n_sms)) * std::max(1, blocks_per_sm) * 256;
}

Status read_probe(const void* p, int64_t bytes, uint32_t* sink, int n_sms, int blocks_per_sm,
                  cudaStream_t stream) {
  if (!p || !sink || bytes < 16 || bytes % 16 != 0 || blocks_per_sm < 1 ||
      reinterpret_cast<uintptr_t>(p) % 16 != 0)
    return errorf(ErrorCode::kInvalidArgument,
                  "read_probe: a 16-byte aligned buffer of a positive multiple of 16 bytes, a "
                  "sink, blocks_per_sm >= 1");
  read_probe_kernel<<<unsigned(std::max(1, n_sms) * blocks_per_sm), 256, 0, stream>>>(
      static_cast<const uint4*>(p), bytes / 16, sink);
  return check_launch("read_probe_kernel");
}

Status indexer_scores_tc(const ops::IndexerArgs& a, int64_t max_count, float* scores, int64_t ld,
                         int n_sms, cudaStream_t stream, int variant, bool pdl) {
  if (a.n_rows <= 0 || max_count <= 0) return Status::Ok();
  if (variant < 0 || variant > kIndexerScoresMaxVariant)
    return errorf(ErrorCode::kInvalidArgument, "indexer_scores_tc: variant {}", variant);
  if (max_count > int64_t(1) << 30)
    return errorf(ErrorCode::kInvalidArgument, "indexer_scores_tc: max_count {} too large",
                  max_count);
  // Prefill chunks (> kDecodeMaxRows rows): the warpgroup-MMA prefill kernel (indexer_prefill.cu);
  // variant 27 on arguments it does not take (f32 keys, other dims) runs auto, as the other
  // key-format-specific variants do.
  const bool pf_forced = variant == kIndexerPrefillWgVariant ||
                         variant == kIndexerPrefillWgE4m3Variant ||
                         variant == kIndexerPrefillWgRegVariant;
  if (pf_forced && !indexer_prefill_wg_supported(a)) variant = 0;
  if ((pf_forced && variant != 0) || (variant == 0 && indexer_prefill_wg_auto(a))) {
    const int fp8_mode =
        variant == kIndexerPrefillWgE4m3Variant || (variant == 0 && indexer_prefill_wg_auto_e4m3())
            ? kPrefillFp8E4m3
        : variant == kIndexerPrefillWgVariant ? kPrefillFp8Convert
                                              : kPrefillFp8Registers;
    return indexer_prefill_wg(a, max_count, scores, ld, n_sms, stream, fp8_mode);
  }
  if (variant >= 2 || (variant == 0 && a.n_rows <= kDecodeMaxRows && decode_kernel_enabled() &&
                       indexer_decode_supported(a))) {
    if (!indexer_decode_supported(a))
      return errorf(ErrorCode::kInvalidArgument,
                    "indexer_scores_tc: decode kernel needs nI={} dI={} (got {}, {}), rows <= "
                    "65535, 16-byte aligned q and keys",
                    kDNI, kDDI, a.n_heads, a.head_dim);
    // bf16 keys: 4 n-tiles keep the f32 kernel's 256 bytes per lane in flight (variant 2 = 2
    // n-tiles for A/B); f32 keys: 2 n-tiles (variant 3 = 4).
    // fp8 keys: 4 n-tiles (128 bytes per lane in flight, 32 key registers; variant 2 = 2).
    const bool pipe = variant >= 4 && variant <= kIndexerPipeMaxVariant;
    // Auto, bf16 keys, ≥ kPipeAutoMinRows rows: the pipelined kernel with a 2-slot ring (variant
    // 5), bit-identical to the decode kernel and faster with many rows (cuda-indexer.md, session
    // 9: batch 64 × 230,400 keys 1,011 µs vs 1,175; × 32,768 153 vs 160); at batch 1 it is within
    // ±1 µs either way, so small batches keep the decode kernel.
    if (variant == 0 && a.key_dtype == KvDtype::kBf16 && a.n_rows >= kPipeAutoMinRows)
      return launch_pipe_variant<kKeysBf16>(5, a, max_count, scores, ld, n_sms, stream, pdl);
    if (pipe && a.key_dtype == KvDtype::kFp8Index)
      return launch_pipe_variant<kKeysFp8>(variant, a, max_count, scores, ld, n_sms, stream, pdl);
    if (pipe && a.key_dtype == KvDtype::kBf16)
      return launch_pipe_variant<kKeysBf16>(variant, a, max_count, scores, ld, n_sms, stream, pdl);
    // Variants 8 / 9: the warpgroup-MMA kernel for bf16 keys (fp8 / f32 keys: the default below).
    if (variant == 8 && a.key_dtype == KvDtype::kBf16)
      return launch_decode_wg<4>(a, max_count, scores, ld, n_sms, stream, pdl);
    if (variant == 9 && a.key_dtype == KvDtype::kBf16)
      return launch_decode_wg<3>(a, max_count, scores, ld, n_sms, stream, pdl);
    // Variants 10 / 11 / 12: the same kernel with keys on M (4 / 3 / 2 ring slots).
    if (variant == 10 && a.key_dtype == KvDtype::kBf16)
      return launch_decode_wg<4, true>(a, max_count, scores, ld, n_sms, stream, pdl);
    if (variant == 11 && a.key_dtype == KvDtype::kBf16)
      return launch_decode_wg<3, true>(a, max_count, scores, ld, n_sms, stream, pdl);
    if (variant == 12 && a.key_dtype == KvDtype::kBf16)
      return launch_decode_wg<2, true>(a, max_count, scores, ld, n_sms, stream, pdl);
    // Variants 15 / 16: the pipelined kernel (2 / 3 ring slots) copying whole key rows (kRowMap),
    // bf16 keys only (fp8 / f32 keys: the default below).
    if (variant == 15 && a.key_dtype == KvDtype::kBf16)
      return launch_decode_pipe<2, kKeysBf16, true, true>(a, max_count, scores, ld, n_sms, stream, pdl);
    if (variant == 16 && a.key_dtype == KvDtype::kBf16)
      return launch_decode_pipe<3, kKeysBf16, true, true>(a, max_count, scores, ld, n_sms, stream, pdl);
    // Variants 17 / 18: the same with 16-key chunks (2 / 3 slots of 4 KB: 48 / 64 KB a CTA, so 4 /
    // 3 CTAs an SM instead of 2).
    if (variant == 17 && a.key_dtype == KvDtype::kBf16)
      return launch_decode_pipe<2, kKeysBf16, true, true, 2>(a, max_count, scores, ld, n_sms, stream, pdl);
    if (variant == 18 && a.key_dtype == KvDtype::kBf16)
      return launch_decode_pipe<3, kKeysBf16, true, true, 2>(a, max_count, scores, ld, n_sms, stream, pdl);
    // Variants 13 / 14: the decode kernel (default chunk) with ≥ 4 / 5 resident blocks an SM.
    if (variant == 13 || variant == 14) {
      const bool five = variant == 14;
      if (a.key_dtype == KvDtype::kFp8Index)
        return five ? launch_decode<4, kKeysFp8, 5>(a, max_count, scores, ld, n_sms, stream, pdl)
                    : launch_decode<4, kKeysFp8, 4>(a, max_count, scores, ld, n_sms, stream, pdl);
      if (a.key_dtype == KvDtype::kBf16)
        return five ? launch_decode<4, kKeysBf16, 5>(a, max_count, scores, ld, n_sms, stream, pdl)
                    : launch_decode<4, kKeysBf16, 4>(a, max_count, scores, ld, n_sms, stream, pdl);
      return five ? launch_decode<2, kKeysF32, 5>(a, max_count, scores, ld, n_sms, stream, pdl)
                  : launch_decode<2, kKeysF32, 4>(a, max_count, scores, ld, n_sms, stream, pdl);
    }
    // fp8 keys: auto (0 = 24: f16 tensor cores on the code values, key loads one chunk ahead;
    // 17.8 µs at 230,400 keys vs 22.9 for 20 and 23.1 for bf16 keys, cuda-indexer-variants.md,
    // session 12); 19–23 the e4m3 mma.sync form (kKeysFp8x8); 2 / 3 and the others that land
    // here convert the codes to bf16 (kKeysFp8, bit-identical to variants 4–7).
    // 19 / 20 / 21: ≥ 1 / 3 / 4 resident blocks an SM (246 / 168 / 128 registers: at 1 the
    // compiler keeps all of q's A fragments in registers).
    // Variant 30: the bulk-copy kernel (whole pages of key rows by cp.async.bulk, wgmma on f16
    // code values; equal to 24 up to fp32 rounding).
    if (a.key_dtype == KvDtype::kFp8Index && variant == kIndexerBulkVariant)
      return launch_decode_bulk(a, max_count, scores, ld, n_sms, stream, pdl);
    // Auto for fp8 keys: the bulk-copy kernel (30) for long rows (bound ≥ kIndexerBulkMinCount:
    // 16.1–16.7 µs at 230,400 keys against 17.9–18.0 for 24) and short ones (≤
    // kIndexerBulkMaxShort: 4.8–5.1 against 5.5–5.9 µs at 1,024 / 4,096); 24 between (65,536:
    // 9.9 against 10.4, 131,072: 13.2 against 13.5; bench/results/cuda-indexer-bulk-s25.md).
    // Measured at batch 1 only, so auto keeps 24 above kIndexerBulkMaxRows rows.
    if (a.key_dtype == KvDtype::kFp8Index && variant == 0 && a.n_rows <= kIndexerBulkMaxRows &&
        (max_count >= kIndexerBulkMinCount || max_count <= kIndexerBulkMaxShort) &&
        bulk_auto_enabled())
      return launch_decode_bulk(a, max_count, scores, ld, n_sms, stream, pdl);
    if (a.key_dtype == KvDtype::kFp8Index && variant == 0)
      return launch_decode<4, kKeysFp8h, 2, true>(a, max_count, scores, ld, n_sms, stream, pdl);
    if (a.key_dtype == KvDtype::kFp8Index && variant == 20)
      return launch_decode<4, kKeysFp8x8, 3>(a, max_count, scores, ld, n_sms, stream, pdl);
    if (a.key_dtype == KvDtype::kFp8Index && variant == 19)
      return launch_decode<4, kKeysFp8x8>(a, max_count, scores, ld, n_sms, stream, pdl);
    if (a.key_dtype == KvDtype::kFp8Index && variant == 21)
      return launch_decode<4, kKeysFp8x8, 4>(a, max_count, scores, ld, n_sms, stream, pdl);
    // Variants 22 / 23: the e4m3 kernel with the key loads one chunk ahead (kPf), 32-key chunks
    // at ≥ 2 CTAs an SM / 16-key chunks at ≥ 4.
    if (a.key_dtype == KvDtype::kFp8Index && variant == 22)
      return launch_decode<4, kKeysFp8x8, 2, true>(a, max_count, scores, ld, n_sms, stream, pdl);
    if (a.key_dtype == KvDtype::kFp8Index && variant == 23)
      return launch_decode<2, kKeysFp8x8, 4, true>(a, max_count, scores, ld, n_sms, stream, pdl);
    // Variants 24 / 25: q's codes and the key codes as exact f16 values on f16 tensor cores
    // (kKeysFp8h: one cvt per code pair; sm_90 has no e4m3 mma.sync — ptxas lowers 19–23's
    // m16n8k32.e4m3 to f16 unpacks of both operands plus two HMMA.16816 each), key loads one
    // chunk ahead, 32-key chunks at ≥ 2 CTAs an SM / 16-key chunks at ≥ 4 (26: 32-key at ≥ 3).
    if (a.key_dtype == KvDtype::kFp8Index && variant == 24)
      return launch_decode<4, kKeysFp8h, 2, true>(a, max_count, scores, ld, n_sms, stream, pdl);
    if (a.key_dtype == KvDtype::kFp8Index && variant == 25)
      return launch_decode<2, kKeysFp8h, 4, true>(a, max_count, scores, ld, n_sms, stream, pdl);
    if (a.key_dtype == KvDtype::kFp8Index && variant == 26)  // 24 at ≥ 3 CTAs an SM
      return launch_decode<4, kKeysFp8h, 3, true>(a, max_count, scores, ld, n_sms, stream, pdl);
    if (a.key_dtype == KvDtype::kFp8Index)
      return variant == 2 ? launch_decode<2, kKeysFp8>(a, max_count, scores, ld, n_sms, stream, pdl)
                          : launch_decode<4, kKeysFp8>(a, max_count, scores, ld, n_sms, stream, pdl);
    if (a.key_dtype == KvDtype::kBf16)
      return variant == 2 ? launch_decode<2, kKeysBf16>(a, max_count, scores, ld, n_sms, stream, pdl)
                          : launch_decode<4, kKeysBf16>(a, max_count, scores, ld, n_sms, stream, pdl);
    return variant == 3 ? launch_decode<4, kKeysF32>(a, max_count, scores, ld, n_sms, stream, pdl)
                        : launch_decode<2, kKeysF32>(a, max_count, scores, ld, n_sms, stream, pdl);
  }
  if (!indexer_tc_supported(a.n_heads, a.head_dim))
    return errorf(ErrorCode::kInvalidArgument, "indexer_scores_tc: nI={} dI={} unsupported",
                  a.n_heads, a.head_dim);
  // Decode-shaped calls (few rows, each its own candidate list) use one query row per group:
  // a quarter of the shared memory, so several blocks share an SM.
  if (a.key_dtype == KvDtype::kFp8Index)
    return a.n_rows <= 64 ? launch_tc<1, true>(a, max_count, scores, ld, n_sms, stream)
                          : launch_tc<4, true>(a, max_count, scores, ld, n_sms, stream);
  if (a.n_rows <= 64) return launch_tc<1, false>(a, max_count, scores, ld, n_sms, stream);
  return launch_tc<4, false>(a, max_count, scores, ld, n_sms, stream);
}

}  // namespace v4::cuda
