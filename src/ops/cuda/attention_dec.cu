#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// Decode sparse MQA attention, bf16 mma.sync (see attention_dec.h for the work split).
//
// v1 kernel (attn_dec_kernel: f32 pools always, bf16 pools with V4_ATTN_DEC=1).
// Shared memory (dynamic, 230,912 B of the 232,448 B a block may have):
//   qs     bf16 [64 heads][520]   Q of the block's heads (row stride 1040 B: ldmatrix rows fall
//                                 on distinct 16-byte bank groups)
//   kb     bf16 [32 keys][520]    the current key tile, converted from the staged rows
//   stage  2 × [32 keys][row bytes]  cp.async staging of the next two tiles (f32 pools: 2 KiB a
//                                 row; bf16 pools, --kv-cache-dtype bf16: 1 KiB, copied as is;
//                                 fp8 pools: the 608-byte row in a 640-byte slot, dequantized
//                                 by the conversion);
//                                 the stage just converted doubles as the S exchange buffer
//                                 ([8 warps][16][40] f32) until the tile after next is issued
// Split partials are merged by attn_dec_combine_kernel (one block per (row, head, 128 dims)).
// Per tile (it): wait for stage it%2 → sync → convert to kb → sync → QK, write partial S →
// sync → add the partner's partial S, online softmax, P·V → sync → issue tile it+2 into the
// freed stage. Every tile therefore has one other tile (64 KiB) in flight while it computes,
// two while the block waits.
// v2 kernel (attn_dec2_kernel, bf16 pools, default): qs as above, a ring of 4 bf16 key tiles
// [32][520] filled by cp.async straight from the pool (no staging copy), the S exchange in its
// own 20 KiB: 220,160 B; 2 barriers per tile (see the kernel). Both kernels share the per-tile
// math (tile_qk, tile_s_write, tile_softmax, tile_pv, store_out): with bf16 pools and the same
// split count they run the same operations in the same order (equal up to the compiler's FMA
// contraction choices; the tests bound the difference at 1e-5).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "base/kv_fp8.h"  // kvfp8::dequantize (fp8 KV pools)
#include "ops/cuda/attention.h"
#include "ops/cuda/attention_dec.h"
#include "ops/cuda/device_util.cuh"  // pdl_wait / pdl_trigger
#include "ops/cuda/wgmma.cuh"  // variants 7 … 13 (attention_dec_wg.cuh, attention_dec_ws.cuh)
#include "ops/cuda/tma.cuh"    // attention_gather_probe
#include "ops/cuda/tma.h"

namespace v4::cuda {
namespace {
namespace cg = cooperative_groups;

constexpr int kHd = 512;
constexpr int kHeads = 64;                  // heads per block
constexpr int kKT = kAttnDecTileKeys;       // keys per tile (32)
constexpr int kThreads = 256;               // 8 warps
constexpr int kLdB = kHd + 8;               // bf16 row stride of qs / kb (elements)
constexpr int kSxLd = 40;                   // f32 row stride of the S exchange (conflict-free)
constexpr int kMaxSplits = 256;             // the combine kernel's weight buffer

/// How key rows of a pool element type are staged and turned into bf16: a pool row is
/// kRowBytes bytes; it is copied as 16-byte chunks (cp.async) into a kStageRowBytes slot (chunks
/// past kRowBytes are zero-filled) and turned into kb's 512 bf16 values by kConvItems calls of
/// convert_item (one row's items are independent). The only place that knows the pool format.
template <typename T>
struct KeyPool;
/// Row-chunk conversions of the f32 and bf16 pools: item c = 16-byte chunk c → kElems values.
template <typename Self>
struct ChunkConvert {
  __device__ static __forceinline__ void convert_item(const unsigned char* row, int c,
                                                      __nv_bfloat16* kb_row) {
    Self::convert(row + 16 * c, kb_row + Self::kElems * c);
  }
};
template <>
struct KeyPool<float> : ChunkConvert<KeyPool<float>> {
  static constexpr int kRowBytes = kHd * 4;
  static constexpr int kStageRowBytes = kRowBytes;
  static constexpr int kElems = 4;  // per 16-byte chunk
  static constexpr int kConvItems = kRowBytes / 16;
  /// Converts chunk `c` of a staged row (16 bytes at src) into dst[0..3].
  __device__ static __forceinline__ void convert(const unsigned char* src,
                                                 __nv_bfloat16* dst) {
    const float4 v = *reinterpret_cast<const float4*>(src);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 u;
    u.x = *reinterpret_cast<const uint32_t*>(&lo);
    u.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(dst) = u;
  }
};
template <>
struct KeyPool<__nv_bfloat16> : ChunkConvert<KeyPool<__nv_bfloat16>> {
  // bf16 KV pools (--kv-cache-dtype bf16): staged bytes are kb's
  static constexpr int kRowBytes = kHd * 2;
  static constexpr int kStageRowBytes = kRowBytes;
  static constexpr int kElems = 8;  // per 16-byte chunk
  static constexpr int kConvItems = kRowBytes / 16;
  /// Copies chunk `c` of a staged row (8 bf16 at src) to dst[0..7] unchanged.
  __device__ static __forceinline__ void convert(const unsigned char* src,
                                                 __nv_bfloat16* dst) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  }
};
/// fp8 KV pools (--kv-cache-dtype fp8; KvFp8Layout of (512, 64), base/dtype.h): 448 e4m3 codes,
/// 7 f32 scales (one per 64 codes) + 4 bytes padding at 448, 64 bf16 rope values at 480; 608
/// bytes a row, staged in 640-byte slots (so a stage holds the S exchange; 40 chunks a row keep
/// the issue loop uniform). Items 0..27: 16 codes each → 16 bf16 (kvfp8::dequantize, then round
/// to bf16); items 28..35: 8 rope values each, copied.
struct KvFp8Row;  // tag: the kernel addresses rows in bytes
template <>
struct KeyPool<KvFp8Row> {
  // Scalars of kv_fp8_layout(512, 64) (plain ints: usable in device code).
  static constexpr int kNope = kv_fp8_layout(kHd, 64).nope;            // 448
  static constexpr int kScaleOff = kv_fp8_layout(kHd, 64).scale_off;   // 448
  static constexpr int kRopeOff = kv_fp8_layout(kHd, 64).rope_off;     // 480
  static constexpr int kRope = kv_fp8_layout(kHd, 64).rope;            // 64
  static constexpr int kRowBytes = kv_fp8_layout(kHd, 64).bytes;       // 608
  static constexpr int kStageRowBytes = 640;
  static constexpr int kNopeItems = kNope / 16;                        // 28
  static constexpr int kConvItems = kNopeItems + 2 * kRope / 16;       // 36
  static_assert(kNope == 448 && kScaleOff == 448 && kRopeOff == 480 && kRowBytes == 608 &&
                    KvFp8Layout::kBlock == 64 && kRowBytes <= kStageRowBytes,
                "fp8 row layout assumed below");
  __device__ static __forceinline__ void convert_item(const unsigned char* row, int c,
                                                      __nv_bfloat16* kb_row) {
    if (c < kNopeItems) {
      const float scale = *reinterpret_cast<const float*>(row + kScaleOff + 4 * (c >> 2));
      const uint4 codes = *reinterpret_cast<const uint4*>(row + 16 * c);
      const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
      uint32_t packed[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t word = w[i >> 1] >> (16 * (i & 1));  // codes 2i, 2i+1 (little endian)
        const __nv_bfloat162 v =
            __floats2bfloat162_rn(kvfp8::dequantize(uint8_t(word & 0xffu), scale),
                                  kvfp8::dequantize(uint8_t((word >> 8) & 0xffu), scale));
        packed[i] = *reinterpret_cast<const uint32_t*>(&v);
      }
      uint4* dst = reinterpret_cast<uint4*>(kb_row + 16 * c);
      dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
      dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
    } else {
      const int r = c - kNopeItems;  // rope values 8r .. 8r+7
      *reinterpret_cast<uint4*>(kb_row + kNope + 8 * r) =
          *reinterpret_cast<const uint4*>(row + kRopeOff + 16 * r);
    }
  }
};

constexpr size_t kQsBytes = size_t(kHeads) * kLdB * 2;  // 66,560
constexpr size_t kKbBytes = size_t(kKT) * kLdB * 2;     // 33,280
template <typename T>
constexpr size_t stage_bytes() {
  return size_t(kKT) * KeyPool<T>::kStageRowBytes;
}
template <typename T>
constexpr size_t smem_bytes() {
  return kQsBytes + kKbBytes + 2 * stage_bytes<T>();
}
static_assert(smem_bytes<float>() + 2 * kKT * 4 <= 232448, "shared memory over the 227 KiB limit");
static_assert(size_t(8) * 16 * kSxLd * 4 <= stage_bytes<float>(), "S exchange must fit a stage");
static_assert(size_t(8) * 16 * kSxLd * 4 <= stage_bytes<__nv_bfloat16>(),
              "S exchange must fit a bf16 stage");
static_assert(kKT * (KeyPool<__nv_bfloat16>::kRowBytes / 16) % kThreads == 0,
              "uniform bf16 issue loop");
static_assert(size_t(8) * 16 * kSxLd * 4 <= stage_bytes<KvFp8Row>(),
              "S exchange must fit an fp8 stage");
static_assert(smem_bytes<KvFp8Row>() <= smem_bytes<float>(), "fp8 smem within the f32 budget");
static_assert(kQsBytes % 16 == 0 && kKbBytes % 16 == 0, "cp.async / ldmatrix alignment");

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // 0 source bytes → zero fill
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// D = A·B + D, m16n8k16 bf16 (row.col), fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two floats as bf16x2: `lo` in the low half (the lower column index of an mma fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

/// Physical pool row of key j of row t (SWA keys first, then compressed keys); −1 = skip.
__device__ __forceinline__ int32_t key_row(const ops::AttentionArgs& a, int64_t t, int j,
                                           int n_swa) {
  if (j < n_swa) return a.swa.rows[a.swa.offset[t] + j];
  return a.comp.rows[a.comp.offset[t] + (j - n_swa)];
}

// Programmatic dependent launch (sm_90): the v2 path launches the combine kernel with
// programmatic stream serialization; the main kernel triggers at its start (the combine may be
// scheduled early) and the combine waits (griddepcontrol.wait: the main grid completed, its
// memory visible) before reading anything. Without the launch attribute both are no-ops
// (pdl_wait / pdl_trigger: device_util.cuh).

// ---- per-tile math shared by both kernels (warp = head group hg of 16 heads × dim half) ------
// qw = qs + (16·hg)·kLdB + 256·half, kw = key tile + 256·half (bf16, row stride kLdB).

/// Partial S over the warp's 256 dims: sacc[n-tile of 8 keys][c] for rows g, g+8 (mma layout).
__device__ __forceinline__ void tile_qk(const __nv_bfloat16* qw, const __nv_bfloat16* kw, int lane,
                                        float (&sacc)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < 256; kk += 16) {
    uint32_t af[4];
    ldmatrix_x4(af, qw + (lane & 15) * kLdB + kk + 8 * (lane >> 4));
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      uint32_t bf[4];
      ldmatrix_x4(bf, kw + (16 * np + (lane & 7) + 8 * (lane >> 4)) * kLdB + kk +
                          8 * ((lane >> 3) & 1));
      mma_bf16(sacc[2 * np], af, bf[0], bf[1]);
      mma_bf16(sacc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

/// Writes the warp's partial S to its slot of the exchange buffer sx ([8 warps][16][kSxLd] f32).
__device__ __forceinline__ void tile_s_write(float* sx, int warp, int g, int tq,
                                             const float (&sacc)[4][4]) {
  float* mine = sx + warp * (16 * kSxLd);
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    *reinterpret_cast<float2*>(mine + g * kSxLd + nt * 8 + 2 * tq) =
        make_float2(sacc[nt][0], sacc[nt][1]);
    *reinterpret_cast<float2*>(mine + (g + 8) * kSxLd + nt * 8 + 2 * tq) =
        make_float2(sacc[nt][2], sacc[nt][3]);
  }
}

/// After the exchange barrier: S = own + partner partial (both warps of a pair get identical S),
/// scaled, masked by rows[key] < 0; online softmax update of (m_r, l_r) and o; on return sv holds
/// the tile's p values (fp32, masked keys exactly 0).
__device__ __forceinline__ void tile_softmax(const float* sx, int warp, int g, int tq, float scale,
                                             const int32_t* rows, const float (&sacc)[4][4],
                                             float (&sv)[4][4], float (&m_r)[2], float (&l_r)[2],
                                             float (&o)[32][4]) {
  const float* other = sx + (warp ^ 1) * (16 * kSxLd);
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    const int c0 = nt * 8 + 2 * tq;
    const float2 lo = *reinterpret_cast<const float2*>(other + g * kSxLd + c0);
    const float2 hi = *reinterpret_cast<const float2*>(other + (g + 8) * kSxLd + c0);
    sv[nt][0] = (sacc[nt][0] + lo.x) * scale;
    sv[nt][1] = (sacc[nt][1] + lo.y) * scale;
    sv[nt][2] = (sacc[nt][2] + hi.x) * scale;
    sv[nt][3] = (sacc[nt][3] + hi.y) * scale;
    const bool v0 = rows[c0] >= 0, v1 = rows[c0 + 1] >= 0;
    if (!v0) sv[nt][0] = sv[nt][2] = -INFINITY;
    if (!v1) sv[nt][1] = sv[nt][3] = -INFINITY;
  }
  // Online softmax per row (r = 0: row g, r = 1: row g+8); a row's 32 values sit in the 4 lanes
  // of a quad. Masked logits never enter an exp (p = 0 explicitly).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) mx = fmaxf(mx, fmaxf(sv[nt][2 * r], sv[nt][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_r[r], mx);
    const float corr =
        m_new == -INFINITY ? 1.f : (m_r[r] == -INFINITY ? 0.f : __expf(m_r[r] - m_new));
    float psum = 0.f;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float v = sv[nt][2 * r + c];
        const float p = v == -INFINITY ? 0.f : __expf(v - m_new);
        sv[nt][2 * r + c] = p;
        psum += p;
      }
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    psum += __shfl_xor_sync(0xffffffffu, psum, 2);
    l_r[r] = l_r[r] * corr + psum;
    m_r[r] = m_new;
    // Rescale only when some row's max moved (× 1 is exact, so skipping changes nothing).
    if (__any_sync(0xffffffffu, corr != 1.f)) {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        o[i][2 * r] *= corr;
        o[i][2 * r + 1] *= corr;
      }
    }
  }
}

/// O += P · V: the p values of n-tiles (2ks, 2ks+1) are the A fragment of k-step ks; V = the key
/// tile (K = V) read transposed by ldmatrix.
__device__ __forceinline__ void tile_pv(const __nv_bfloat16* kw, int lane, const float (&sv)[4][4],
                                        float (&o)[32][4]) {
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    uint32_t af[4];
    af[0] = pack_bf16(sv[2 * ks][0], sv[2 * ks][1]);
    af[1] = pack_bf16(sv[2 * ks][2], sv[2 * ks][3]);
    af[2] = pack_bf16(sv[2 * ks + 1][0], sv[2 * ks + 1][1]);
    af[3] = pack_bf16(sv[2 * ks + 1][2], sv[2 * ks + 1][3]);
    const __nv_bfloat16* vrow =
        kw + (16 * ks + (lane & 7) + 8 * ((lane >> 3) & 1)) * kLdB + 8 * (lane >> 4);
#pragma unroll
    for (int np = 0; np < 16; ++np) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, vrow + 16 * np);
      mma_bf16(o[2 * np], af, bf[0], bf[1]);
      mma_bf16(o[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

/// Q of heads hb .. hb+63 of row t → bf16 qs [64][kLdB] (rows ≥ H zero), all threads.
__device__ __forceinline__ void stage_q(const ops::AttentionArgs& a, int64_t t, int hb,
                                        __nv_bfloat16* qs) {
  const int H = a.n_heads;
#pragma unroll 16
  for (int i = 0; i < kHeads * (kHd / 4) / kThreads; ++i) {
    const int e = threadIdx.x + i * kThreads;
    const int h = e / (kHd / 4), c4 = e % (kHd / 4);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (hb + h < H)
      v = __ldg(reinterpret_cast<const float4*>(a.q + (t * H + hb + h) * int64_t(kHd)) + c4);
    uint2 u;
    u.x = pack_bf16(v.x, v.y);
    u.y = pack_bf16(v.z, v.w);
    *reinterpret_cast<uint2*>(qs + h * kLdB + 4 * c4) = u;
  }
}

/// stage_q in two halves for the v2 prologue: load half `part` (16 float4 per thread) into
/// registers (in flight while the key lists are looked up), convert and store them later.
constexpr int kQIters = kHeads * (kHd / 4) / kThreads;  // 32 float4 per thread
__device__ __forceinline__ void load_q_half(const ops::AttentionArgs& a, int64_t t, int hb,
                                            int part, float4 (&v)[kQIters / 2]) {
  const int H = a.n_heads;
#pragma unroll
  for (int j = 0; j < kQIters / 2; ++j) {
    const int e = threadIdx.x + (part * (kQIters / 2) + j) * kThreads;
    const int h = e / (kHd / 4), c4 = e % (kHd / 4);
    v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (hb + h < H)
      v[j] = __ldg(reinterpret_cast<const float4*>(a.q + (t * H + hb + h) * int64_t(kHd)) + c4);
  }
}
__device__ __forceinline__ void store_q_half(int part, const float4 (&v)[kQIters / 2],
                                             __nv_bfloat16* qs) {
#pragma unroll
  for (int j = 0; j < kQIters / 2; ++j) {
    const int e = threadIdx.x + (part * (kQIters / 2) + j) * kThreads;
    const int h = e / (kHd / 4), c4 = e % (kHd / 4);
    uint2 u;
    u.x = pack_bf16(v[j].x, v[j].y);
    u.y = pack_bf16(v[j].z, v[j].w);
    *reinterpret_cast<uint2*>(qs + h * kLdB + 4 * c4) = u;
  }
}

/// Output of the warp's rows g, g+8 (heads hb + 16·hg + g (+8)), dims 256·half + 8·nt + 2tq (+1):
/// normalized with the sink when n_splits == 1, else the (max, sum, unnormalized o) partial.
__device__ __forceinline__ void store_out(const ops::AttentionArgs& a, int64_t t, int s,
                                          int n_splits, int hb, int hg, int half, int g, int tq,
                                          const float (&m_r)[2], const float (&l_r)[2],
                                          const float (&o)[32][4], float* __restrict__ ws) {
  const int H = a.n_heads;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = hb + hg * 16 + g + 8 * r;
    if (h >= H) continue;
    if (n_splits == 1) {
      const float sink = a.sinks[h];
      const float M = fmaxf(m_r[r], sink);
      const float f = m_r[r] == -INFINITY ? 0.f : __expf(m_r[r] - M);  // no keys → sink only
      const float inv = f / (l_r[r] * f + __expf(sink - M));
      float* out = a.out + (t * H + h) * int64_t(kHd) + half * 256;
#pragma unroll
      for (int nt = 0; nt < 32; ++nt)
        *reinterpret_cast<float2*>(out + nt * 8 + 2 * tq) =
            make_float2(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv);
    } else {
      float* pwo = ws + ((t * H + h) * n_splits + s) * int64_t(kHd + 2);
      if (half == 0 && tq == 0) {
        pwo[0] = m_r[r];
        pwo[1] = l_r[r];
      }
#pragma unroll
      for (int nt = 0; nt < 32; ++nt)
        *reinterpret_cast<float2*>(pwo + 2 + half * 256 + nt * 8 + 2 * tq) =
            make_float2(o[nt][2 * r], o[nt][2 * r + 1]);
    }
  }
}

// v1 kernel (any pool type): two staging buffers of the pool's rows, converted per tile into
// one bf16 key tile; 4 barriers per tile. kTrigger: PDL trigger at the start (variant 2 with f32
// pools, whose combine is launched with PDL).
template <typename T, bool kTrigger>
__global__ void __launch_bounds__(kThreads, 1)
    attn_dec_kernel(ops::AttentionArgs a, const T* __restrict__ swa_pool,
                    const T* __restrict__ comp_pool, int n_splits, float* __restrict__ ws) {
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* kb = reinterpret_cast<__nv_bfloat16*>(smem + kQsBytes);
  unsigned char* stage0 = smem + kQsBytes + kKbBytes;
  constexpr size_t kStage = stage_bytes<T>();
  constexpr int kChunksPerRow = KeyPool<T>::kStageRowBytes / 16;  // issued per key
  constexpr int kConvItems = KeyPool<T>::kConvItems;
  __shared__ int32_t rows_s[2][kKT];  // pool row per key of the staged tiles (−1: masked)
  if constexpr (kTrigger) {  // PDL launch (variant 2): predecessor complete before any access
    pdl_wait();
    pdl_trigger();
  }

  const int64_t t = blockIdx.x / n_splits;
  const int s = int(blockIdx.x % n_splits);
  const int hb = blockIdx.y * kHeads;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int hg = warp >> 1, half = warp & 1;
  const int n_swa = (swa_pool && a.swa.count) ? a.swa.count[t] : 0;
  const int n_comp = (comp_pool && a.comp.count) ? a.comp.count[t] : 0;
  const int n = n_swa + n_comp;
  // Whole tiles per split: split s covers keys [k0, k1).
  const int tiles_all = (n + kKT - 1) / kKT;
  const int tiles_per = (tiles_all + n_splits - 1) / n_splits;
  const int k0 = min(n, s * tiles_per * kKT);
  const int k1 = min(n, k0 + tiles_per * kKT);
  const int n_tiles = (k1 - k0 + kKT - 1) / kKT;  // 0 for an empty split

  // Stages tile [kt0, kt0 + 32) into stage `buf`: lane L of every warp looks up the pool row of
  // key kt0 + L once; the 16-byte chunks then take their key's row by shuffle (kKT == 32).
  static_assert(kKT == 32, "one key per lane in issue()");
  constexpr int kIssueIters = kKT * kChunksPerRow / kThreads;
  static_assert(kKT * kChunksPerRow % kThreads == 0, "uniform issue loop (shuffles)");
  auto issue = [&](int kt0, int buf) {
    unsigned char* st = stage0 + buf * kStage;
    const int jl = kt0 + lane;
    const int32_t my_r = jl < k1 ? key_row(a, t, jl, n_swa) : -1;
#pragma unroll 4
    for (int i = 0; i < kIssueIters; ++i) {
      const int e = threadIdx.x + i * kThreads;
      const int key = e / kChunksPerRow, c = e % kChunksPerRow;
      const int32_t r = __shfl_sync(0xffffffffu, my_r, key);
      const T* pool = kt0 + key >= n_swa ? comp_pool : swa_pool;
      // Chunks past the pool row (fp8: 38, 39 of the 640-byte slot) are zero-filled, not read.
      const bool in_row = 16 * c < KeyPool<T>::kRowBytes;
      const void* src = r >= 0 && in_row
                            ? static_cast<const void*>(reinterpret_cast<const unsigned char*>(pool) +
                                                       int64_t(r) * KeyPool<T>::kRowBytes + 16 * c)
                            : static_cast<const void*>(a.q);
      cp_async16(st + size_t(key) * KeyPool<T>::kStageRowBytes + 16 * c, src, r >= 0 && in_row);
    }
    if (warp == 0) rows_s[buf][lane] = my_r;
    cp_async_commit();
  };

  float o[32][4];  // 32 n-tiles of 8 dims × (rows g, g+8)
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};  // rows g, g+8

  if (n_tiles > 0) {
    issue(k0, 0);
    if (n_tiles > 1) issue(k0 + kKT, 1);
    stage_q(a, t, hb, qs);  // while the first tiles are in flight
  }

  const __nv_bfloat16* qw = qs + (hg * 16) * kLdB + half * 256;
  const __nv_bfloat16* kw = kb + half * 256;
  for (int it = 0; it < n_tiles; ++it) {
    const int buf = it & 1;
    unsigned char* st = stage0 + buf * kStage;
    if (it + 1 < n_tiles) {
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // stage `buf` (and, on the first tile, qs) visible to every thread
    for (int e = threadIdx.x; e < kKT * kConvItems; e += kThreads) {
      const int key = e / kConvItems, c = e % kConvItems;
      KeyPool<T>::convert_item(st + size_t(key) * KeyPool<T>::kStageRowBytes, c,
                               kb + key * kLdB);
    }
    __syncthreads();  // kb complete; stage `buf` free (reused as the S exchange)

    float sacc[4][4], sv[4][4];
    tile_qk(qw, kw, lane, sacc);
    float* sx = reinterpret_cast<float*>(st);
    tile_s_write(sx, warp, g, tq, sacc);
    __syncthreads();
    tile_softmax(sx, warp, g, tq, a.scale, rows_s[buf], sacc, sv, m_r, l_r, o);
    tile_pv(kw, lane, sv, o);
    __syncthreads();  // kb, the S exchange and rows_s[buf] free for the next tiles
    if (it + 2 < n_tiles) issue(k0 + (it + 2) * kKT, buf);
  }
  store_out(a, t, s, n_splits, hb, hg, half, g, tq, m_r, l_r, o, ws);
}

// Cluster combine (v2, 2 ≤ n_splits ≤ kMaxClusterSplits): every CTA of the cluster (rank s =
// split s) writes its partial of the 64 heads — m, l and the unnormalized o, the values store_out
// would write to the workspace — into its own shared memory (the Q / ring space, free after the
// last tile): cp [64][512] f32 then cm[64], cl[64] (131,584 B); cluster barrier; CTA s then
// merges heads [s·hs, s·hs + hs) (hs = ⌈64 / n_splits⌉) over all ranks in rank order 0, 1, …
// (fixed order whatever the arrival order: deterministic) with the sink, reading the other
// CTAs' shared memory (DSMEM), and writes the output; a second cluster barrier keeps every
// CTA's shared memory alive until all reads are done.
// Cluster merge weights of one head hl over the splits of a cluster (ranks 0 … n_splits − 1,
// n_splits ≤ kMax): w[q] = e^(m_q − M) / (Σ_q l_q·e^(m_q − M) + e^(sink − M)), M = max(sink, m_q),
// sums in rank order (the combine kernel's formula); a rank with m_q = −inf (no keys) and every
// q ≥ n_splits get w[q] = 0, and no keys anywhere gives all-zero weights (output 0). cm / cl: the
// calling CTA's [heads] m (nats) and l arrays in shared memory, read on every rank through
// distributed shared memory (all loads issued together: the loop is unrolled over kMax).
template <int kMax>
__device__ __forceinline__ void cluster_merge_weights(const cg::cluster_group& cluster,
                                                      const float* cm, const float* cl, int hl,
                                                      int n_splits, float sink, float* w) {
  float mq[kMax], lq[kMax];
#pragma unroll
  for (int q = 0; q < kMax; ++q) {
    mq[q] = q < n_splits ? *cluster.map_shared_rank(cm + hl, unsigned(q)) : -INFINITY;
    lq[q] = q < n_splits ? *cluster.map_shared_rank(cl + hl, unsigned(q)) : 0.f;
  }
  float M = sink;
#pragma unroll
  for (int q = 0; q < kMax; ++q) M = fmaxf(M, mq[q]);
  float L = 0.f;
#pragma unroll
  for (int q = 0; q < kMax; ++q) {
    mq[q] = mq[q] == -INFINITY ? 0.f : __expf(mq[q] - M);  // now the factor f_q
    L = fmaf(lq[q], mq[q], L);
  }
  const float inv = 1.f / (__expf(sink - M) + L);
#pragma unroll
  for (int q = 0; q < kMax; ++q) w[q] = mq[q] * inv;
}

constexpr int kMaxClusterSplits = 8;  // portable cluster size
constexpr size_t kCpBytes = size_t(kHeads) * kHd * 4;  // 131,072
__device__ __forceinline__ void cluster_combine(const ops::AttentionArgs& a, int64_t t, int s,
                                                int n_splits, int hb, int hg, int half, int g,
                                                int tq, const float (&m_r)[2],
                                                const float (&l_r)[2], const float (&o)[32][4],
                                                unsigned char* smem) {
  float* cp = reinterpret_cast<float*>(smem);
  float* cm = reinterpret_cast<float*>(smem + kCpBytes);
  float* cl = cm + kHeads;
  __syncthreads();  // every warp is done with qs and the ring (the last tile's P·V)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int hl = hg * 16 + g + 8 * r;  // head within the block
    if (half == 0 && tq == 0) {
      cm[hl] = m_r[r];
      cl[hl] = l_r[r];
    }
    float* row = cp + hl * kHd + half * 256;
#pragma unroll
    for (int nt = 0; nt < 32; ++nt)
      *reinterpret_cast<float2*>(row + nt * 8 + 2 * tq) = make_float2(o[nt][2 * r], o[nt][2 * r + 1]);
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every rank's partial written and visible cluster-wide
  const int H = a.n_heads;
  const int hs = (kHeads + n_splits - 1) / n_splits;
  const int h_lo = s * hs, h_hi = min(min(kHeads, h_lo + hs), H - hb);  // my heads [h_lo, h_hi)
  // 1. One thread per head of my slice: the merge weights w[q] = exp(m_q − M) / (Σ_q l_q ·
  //    exp(m_q − M) + exp(sink − M)), M = max(sink, m_q), summed in rank order (loads of all
  //    ranks issued together: the loop is unrolled over kMaxClusterSplits with a guard).
  __shared__ float wts[kHeads][kMaxClusterSplits];
  if (int(threadIdx.x) < h_hi - h_lo) {  // h_hi < h_lo: no heads left for this rank
    const int hl = h_lo + int(threadIdx.x);
    cluster_merge_weights<kMaxClusterSplits>(cluster, cm, cl, hl, n_splits, a.sinks[hb + hl],
                                             wts[hl - h_lo]);
  }
  __syncthreads();  // wts ready
  // 2. out[h][d] = Σ_q o_q[h][d] · w[q] in rank order; thread = dims d, d + 256 of every head.
  const int d0 = threadIdx.x, d1 = threadIdx.x + kThreads;  // kThreads · 2 == kHd
#pragma unroll 2
  for (int hl = h_lo; hl < h_hi; ++hl) {
    float acc0 = 0.f, acc1 = 0.f;
#pragma unroll
    for (int q = 0; q < kMaxClusterSplits; ++q) {
      if (q < n_splits) {
        const float* prow = cluster.map_shared_rank(cp + hl * kHd, q);
        const float w = wts[hl - h_lo][q];
        acc0 = fmaf(prow[d0], w, acc0);
        acc1 = fmaf(prow[d1], w, acc1);
      }
    }
    float* out = a.out + (t * H + hb + hl) * int64_t(kHd);
    out[d0] = acc0;
    out[d1] = acc1;
  }
  cluster.sync();  // keep this CTA's shared memory until every rank has read it
}
static_assert(kThreads * 2 == kHd, "cluster_combine: two dims per thread");

// v2 kernel (bf16 pools, issue 7): key rows go by cp.async straight into a ring of kStages2
// bf16 tiles in the padded ldmatrix layout (no staging copy, no conversion pass), kStages2 − 1
// tiles in flight while one computes, and a separate S exchange buffer, so a tile takes 2
// barriers (v1: 4):
//   wait(tile it) → barrier A → QK, write partial S → barrier B → issue tile it + kStages2 − 1
//   into the ring slot of tile it − 1 → partner S, softmax, P·V.
// Hazards: the slot written after B(it) was last read by tile it − 1 (QK and P·V), which every
// warp finished before A(it); the S exchange written after A(it + 1) was last read after B(it)
// by warps that have all reached A(it + 1); rows_s likewise lives one slot per ring tile.
// Math and output layout: identical to v1 (tile_qk / tile_softmax / tile_pv / store_out).
constexpr int kStages2 = 4;
constexpr size_t kSxBytes = size_t(8) * 16 * kSxLd * 4;                     // 20,480
constexpr size_t kSmem2 = kQsBytes + size_t(kStages2) * kKbBytes + kSxBytes;  // 220,160
static_assert(kSmem2 + size_t(kStages2) * kKT * 4 + size_t(kHeads) * 8 * 4 <= 232448,
              "v2 shared memory (dynamic + rows_s + the cluster merge weights) over 227 KiB");
static_assert((kLdB * 2) % 16 == 0, "cp.async 16-byte chunks into padded rows");
static_assert(kCpBytes + 2 * kHeads * 4 <= kSmem2, "cluster partial must fit the v2 smem");

// kCluster: the n_splits CTAs of a (row, head group) form one thread-block cluster (launched
// with cluster dims (n_splits, 1, 1), n_splits in [2, kMaxClusterSplits]) and merge their
// partials through distributed shared memory instead of the workspace and the combine kernel.
template <typename T, bool kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    attn_dec2_kernel(ops::AttentionArgs a, const T* __restrict__ swa_pool,
                     const T* __restrict__ comp_pool, int n_splits, float* __restrict__ ws) {
  static_assert(KeyPool<T>::kElems == 8 && KeyPool<T>::kRowBytes == kHd * 2,
                "v2 stages pool rows that are already bf16 rows");
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  unsigned char* ring = smem + kQsBytes;
  float* sx = reinterpret_cast<float*>(smem + kQsBytes + size_t(kStages2) * kKbBytes);
  __shared__ int32_t rows_s[kStages2][kKT];  // pool row per key of the ring tiles (−1: masked)
  // PDL launch: wait for the previous kernel of the stream (it may write q, the key lists or the
  // workspace a previous combine still reads) before any global access; then let the combine
  // (PDL) be scheduled: it waits for this grid to complete before reading the partials.
  pdl_wait();
  pdl_trigger();

  const int64_t t = blockIdx.x / n_splits;
  const int s = int(blockIdx.x % n_splits);
  const int hb = blockIdx.y * kHeads;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int hg = warp >> 1, half = warp & 1;
  const int n_swa = (swa_pool && a.swa.count) ? a.swa.count[t] : 0;
  const int n_comp = (comp_pool && a.comp.count) ? a.comp.count[t] : 0;
  const int n = n_swa + n_comp;
  const int tiles_all = (n + kKT - 1) / kKT;
  const int tiles_per = (tiles_all + n_splits - 1) / n_splits;
  const int k0 = min(n, s * tiles_per * kKT);
  const int k1 = min(n, k0 + tiles_per * kKT);
  const int n_tiles = (k1 - k0 + kKT - 1) / kKT;

  constexpr int kChunksPerRow = KeyPool<T>::kRowBytes / 16;  // 64
  constexpr int kIssueIters = kKT * kChunksPerRow / kThreads;  // 8
  static_assert(kKT == 32 && kKT * kChunksPerRow % kThreads == 0, "uniform issue loop");
  // Pool row of key k0 + 32·tile + lane (−1: past the split, or a masked entry). The loop asks
  // for tile it + kStages2 right after issuing tile it + kStages2 − 1, so this load's latency
  // hides behind a whole tile of math instead of stalling the issue.
  const int64_t swa_off = n_swa > 0 ? a.swa.offset[t] : 0;
  const int64_t comp_off = n_comp > 0 ? a.comp.offset[t] : 0;
  auto lookup = [&](int tile) -> int32_t {
    const int j = k0 + tile * kKT + lane;
    if (tile >= n_tiles || j >= k1) return -1;
    return j < n_swa ? a.swa.rows[swa_off + j] : a.comp.rows[comp_off + (j - n_swa)];
  };
  // Issues split tile `tile` (if it exists; my_r = lookup(tile)) into ring slot tile % kStages2
  // and always commits one cp.async group, so that "groups committed" counts tiles for
  // cp_async_wait.
  auto issue = [&](int tile, int32_t my_r) {
    if (tile < n_tiles) {
      const int buf = tile % kStages2;
      unsigned char* dst = ring + size_t(buf) * kKbBytes;
      const int kt0 = k0 + tile * kKT;
#pragma unroll
      for (int i = 0; i < kIssueIters; ++i) {
        const int e = threadIdx.x + i * kThreads;
        const int key = e / kChunksPerRow, c = e % kChunksPerRow;  // key warp-uniform
        const int32_t r = __shfl_sync(0xffffffffu, my_r, key);
        const T* pool = kt0 + key >= n_swa ? comp_pool : swa_pool;
        const void* src = r >= 0 ? static_cast<const void*>(
                                       reinterpret_cast<const unsigned char*>(pool + int64_t(r) * kHd) +
                                       16 * c)
                                 : static_cast<const void*>(a.q);
        cp_async16(dst + size_t(key) * (kLdB * 2) + 16 * c, src, r >= 0);  // −1 → zeros
      }
      if (warp == 0) rows_s[buf][lane] = my_r;
    }
    cp_async_commit();
  };

  float o[32][4];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};

  int32_t next_r = -1;  // lookup(it + kStages2 − 1), loaded one tile ahead
  if (n_tiles > 0) {
    // All of Q (32 float4 per thread, in registers: o is not live yet) is requested before the
    // key-list lookups of the first tiles (a chain of dependent loads): the latencies overlap.
    float4 qv[kQIters / 2], qv1[kQIters / 2];
    load_q_half(a, t, hb, 0, qv);
    load_q_half(a, t, hb, 1, qv1);
#pragma unroll
    for (int p = 0; p < kStages2 - 1; ++p) issue(p, lookup(p));
    next_r = lookup(kStages2 - 1);
    store_q_half(0, qv, qs);
    store_q_half(1, qv1, qs);
  }
  const __nv_bfloat16* qw = qs + (hg * 16) * kLdB + half * 256;
  for (int it = 0; it < n_tiles; ++it) {
    const int buf = it % kStages2;
    // Groups committed so far: kStages2 − 1 + it (one per tile it' < it + kStages2 − 1); at most
    // kStages2 − 2 pending → tiles 0 .. it landed (this thread's copies).
    cp_async_wait<kStages2 - 2>();
    __syncthreads();  // A: tile it (and on it == 0, qs) visible to every thread
    const __nv_bfloat16* kw =
        reinterpret_cast<const __nv_bfloat16*>(ring + size_t(buf) * kKbBytes) + half * 256;
    float sacc[4][4], sv[4][4];
    tile_qk(qw, kw, lane, sacc);
    tile_s_write(sx, warp, g, tq, sacc);
    __syncthreads();  // B: partial S visible; every warp is past tile it − 1
    issue(it + kStages2 - 1, next_r);
    next_r = lookup(it + kStages2);
    tile_softmax(sx, warp, g, tq, a.scale, rows_s[buf], sacc, sv, m_r, l_r, o);
    tile_pv(kw, lane, sv, o);
  }
  cp_async_wait<0>();  // only empty groups can remain; nothing in flight at exit
  if constexpr (kCluster) {
    cluster_combine(a, t, s, n_splits, hb, hg, half, g, tq, m_r, l_r, o, smem);
  } else {
    store_out(a, t, s, n_splits, hb, hg, half, g, tq, m_r, l_r, o, ws);
  }
}

// Merges the split partials of (t, h) with the sink (the attention.h partial layout), spread
// over (t·H + h, dim quarter) blocks of 128 threads so that batch 1 still fills the GPU: every
// block recomputes the split weights (max, then exp(m_s − M) and L, fixed reduction order) and
// sums its 128 output dims over the splits.
constexpr int kCombThreads = 128;
__device__ __forceinline__ float block_reduce(float v, bool is_max, float* red) {
#pragma unroll
  for (int off = 16; off; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = red[0];
#pragma unroll
  for (int w = 1; w < kCombThreads / 32; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  __syncthreads();  // red reusable
  return r;
}
__global__ void __launch_bounds__(kCombThreads) attn_dec_combine_kernel(ops::AttentionArgs a,
                                                                       int n_splits,
                                                                       const float* __restrict__ ws) {
  __shared__ float fs[kMaxSplits];
  __shared__ float red[kCombThreads / 32];
  pdl_wait();  // PDL launch (v2): the main grid's partials complete and visible
  const int64_t th = blockIdx.x;
  const int h = int(th % a.n_heads);
  const float* p = ws + th * n_splits * int64_t(kHd + 2);
  const float sink = a.sinks[h];
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < n_splits; s += kCombThreads) mx = fmaxf(mx, p[s * int64_t(kHd + 2)]);
  const float M = fmaxf(sink, block_reduce(mx, true, red));
  float ls = 0.f;
  for (int s = threadIdx.x; s < n_splits; s += kCombThreads) {
    const float m = p[s * int64_t(kHd + 2)];
    const float f = m == -INFINITY ? 0.f : __expf(m - M);
    fs[s] = f;
    ls += p[s * int64_t(kHd + 2) + 1] * f;
  }
  const float inv = 1.f / (__expf(sink - M) + block_reduce(ls, false, red));  // syncs: fs ready
  const int d = blockIdx.y * kCombThreads + threadIdx.x;
  float acc = 0.f;
#pragma unroll 8
  for (int s = 0; s < n_splits; ++s) acc = fmaf(p[s * int64_t(kHd + 2) + 2 + d], fs[s], acc);
  a.out[th * kHd + d] = acc * inv;
}


// Combine of variants 3 / 4: the same merge (same grid, same fixed order over the splits) with
// fewer dependent L2 round trips: every split's m and l are read in one pass (thread s holds
// split s), and the output sum keeps 32 partial loads in flight (unroll 32: one round trip per
// 32 splits; attn_dec_combine_kernel above waits once per 8 and reads m twice).
__global__ void __launch_bounds__(kCombThreads) attn_dec_combine3_kernel(
    ops::AttentionArgs a, int n_splits, const float* __restrict__ ws) {
  __shared__ float fs[kMaxSplits];
  __shared__ float red[kCombThreads / 32];
  pdl_wait();  // the main grid's partials complete and visible
  const int64_t th = blockIdx.x;
  const int h = int(th % a.n_heads);
  const float* p = ws + th * n_splits * int64_t(kHd + 2);
  const float sink = a.sinks[h];
  constexpr int kPer = kMaxSplits / kCombThreads;  // splits per thread (2)
  float mq[kPer], lq[kPer];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int sp = threadIdx.x + i * kCombThreads;
    mq[i] = sp < n_splits ? p[sp * int64_t(kHd + 2)] : -INFINITY;
    lq[i] = sp < n_splits ? p[sp * int64_t(kHd + 2) + 1] : 0.f;
    mx = fmaxf(mx, mq[i]);
  }
  const float M = fmaxf(sink, block_reduce(mx, true, red));
  float ls = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int sp = threadIdx.x + i * kCombThreads;
    const float f = mq[i] == -INFINITY ? 0.f : __expf(mq[i] - M);
    if (sp < n_splits) fs[sp] = f;
    ls += lq[i] * f;
  }
  const float inv = 1.f / (__expf(sink - M) + block_reduce(ls, false, red));  // syncs: fs ready
  const int d = blockIdx.y * kCombThreads + threadIdx.x;
  const float* pd = p + 2 + d;
  float acc = 0.f;
  int sp = 0;
  for (; sp + 32 <= n_splits; sp += 32) {
    float v[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = pd[(sp + j) * int64_t(kHd + 2)];
#pragma unroll
    for (int j = 0; j < 32; ++j) acc = fmaf(v[j], fs[sp + j], acc);
  }
  for (; sp < n_splits; ++sp) acc = fmaf(pd[sp * int64_t(kHd + 2)], fs[sp], acc);
  a.out[th * kHd + d] = acc * inv;
}
static_assert(kMaxSplits % kCombThreads == 0, "combine3: whole splits per thread");

// ---- variant 3 / 4 (issue 7: the batch-1 fixed cost) ----------------------------------------
// attn_dec3_kernel<T, kHC>: the v2 ring kernel with kHC = 32 (variant 3) or 16 (variant 4)
// heads per CTA instead of 64, so that batch 1 spreads its keys over 2× / 4× more CTAs with a
// quarter / half of the per-CTA work: Q staging kHC × 512 (32 / 16 KiB of f32 per CTA instead
// of 128), a tile's math, the O registers and the partial write all shrink by 64 / kHC. The
// 8 warps form kHG = kHC / 16 head groups of 16 heads; the kDP = 8 / kHG warps of a group split
// the 512 dims into parts of kDW = 512 / kDP (128 / 64): QK gives a partial S over the warp's
// dims, the group's kDP partials are summed through the S exchange in part order 0 .. kDP−1
// (every warp of the group reads all of them, its own included, so all hold bit-identical S and
// softmax state), P·V covers the warp's kDW dims. Output and split partials: the attention.h
// layout (the combine kernel above merges them, PDL-launched). bf16 pools: cp.async into the
// 4-tile ring as in v2; f32 pools: the issuing threads load the rows (16 float4 each per tile,
// plain loads, so the issue blocks for their latency) and store them converted to bf16 into the
// same ring slot — the same slot hazards as v2 (the slot is free after barrier B; the stores
// are visible after barrier A of the tile that reads them).
constexpr int kStages3 = 4;
template <int kHC>
constexpr size_t smem3_bytes() {
  return size_t(kHC) * kLdB * 2 + size_t(kStages3) * kKbBytes + kSxBytes;
}
static_assert(smem3_bytes<32>() + size_t(kStages3) * kKT * 4 <= 232448, "v3 shared memory");

/// tile_qk over kDW dims (qw, kw already offset to the warp's first dim).
template <int kDW>
__device__ __forceinline__ void tile_qk_w(const __nv_bfloat16* qw, const __nv_bfloat16* kw,
                                          int lane, float (&sacc)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kDW; kk += 16) {
    uint32_t af[4];
    ldmatrix_x4(af, qw + (lane & 15) * kLdB + kk + 8 * (lane >> 4));
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      uint32_t bf[4];
      ldmatrix_x4(bf, kw + (16 * np + (lane & 7) + 8 * (lane >> 4)) * kLdB + kk +
                          8 * ((lane >> 3) & 1));
      mma_bf16(sacc[2 * np], af, bf[0], bf[1]);
      mma_bf16(sacc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

/// After the exchange barrier: S = Σ_p partial_p (p = 0 .. kDP−1 in order: the kDP warps of head
/// group hg hold identical S), scaled and masked as tile_softmax; online softmax update of
/// (m_r, l_r) and o ([kDW / 8] n-tiles); on return sv holds the tile's p values.
template <int kDP, int kDW>
__device__ __forceinline__ void tile_softmax_w(const float* sx, int hg, int g, int tq, float scale,
                                               const int32_t* rows, float (&sv)[4][4],
                                               float (&m_r)[2], float (&l_r)[2],
                                               float (&o)[kDW / 8][4]) {
  const float* grp = sx + hg * kDP * (16 * kSxLd);
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    const int c0 = nt * 8 + 2 * tq;
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma unroll
    for (int p = 0; p < kDP; ++p) {
      const float* w = grp + p * (16 * kSxLd);
      const float2 lo = *reinterpret_cast<const float2*>(w + g * kSxLd + c0);
      const float2 hi = *reinterpret_cast<const float2*>(w + (g + 8) * kSxLd + c0);
      s0 += lo.x;
      s1 += lo.y;
      s2 += hi.x;
      s3 += hi.y;
    }
    sv[nt][0] = s0 * scale;
    sv[nt][1] = s1 * scale;
    sv[nt][2] = s2 * scale;
    sv[nt][3] = s3 * scale;
    const bool v0 = rows[c0] >= 0, v1 = rows[c0 + 1] >= 0;
    if (!v0) sv[nt][0] = sv[nt][2] = -INFINITY;
    if (!v1) sv[nt][1] = sv[nt][3] = -INFINITY;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) mx = fmaxf(mx, fmaxf(sv[nt][2 * r], sv[nt][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_r[r], mx);
    const float corr =
        m_new == -INFINITY ? 1.f : (m_r[r] == -INFINITY ? 0.f : __expf(m_r[r] - m_new));
    float psum = 0.f;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float v = sv[nt][2 * r + c];
        const float p = v == -INFINITY ? 0.f : __expf(v - m_new);
        sv[nt][2 * r + c] = p;
        psum += p;
      }
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    psum += __shfl_xor_sync(0xffffffffu, psum, 2);
    l_r[r] = l_r[r] * corr + psum;
    m_r[r] = m_new;
    if (__any_sync(0xffffffffu, corr != 1.f)) {
#pragma unroll
      for (int i = 0; i < kDW / 8; ++i) {
        o[i][2 * r] *= corr;
        o[i][2 * r + 1] *= corr;
      }
    }
  }
}

/// O[16 heads, kDW dims] += P · V (kw offset to the warp's first dim), as tile_pv.
template <int kDW>
__device__ __forceinline__ void tile_pv_w(const __nv_bfloat16* kw, int lane,
                                          const float (&sv)[4][4], float (&o)[kDW / 8][4]) {
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    uint32_t af[4];
    af[0] = pack_bf16(sv[2 * ks][0], sv[2 * ks][1]);
    af[1] = pack_bf16(sv[2 * ks][2], sv[2 * ks][3]);
    af[2] = pack_bf16(sv[2 * ks + 1][0], sv[2 * ks + 1][1]);
    af[3] = pack_bf16(sv[2 * ks + 1][2], sv[2 * ks + 1][3]);
    const __nv_bfloat16* vrow =
        kw + (16 * ks + (lane & 7) + 8 * ((lane >> 3) & 1)) * kLdB + 8 * (lane >> 4);
#pragma unroll
    for (int np = 0; np < kDW / 16; ++np) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, vrow + 16 * np);
      mma_bf16(o[2 * np], af, bf[0], bf[1]);
      mma_bf16(o[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

/// store_out for a warp of head group hg (heads hb + 16·hg + g (+8)) and dims part·kDW + 8·nt
/// + 2tq (+1): the normalized output (n_splits == 1) or the split partial.
template <int kDW>
__device__ __forceinline__ void store_out_w(const ops::AttentionArgs& a, int64_t t, int s,
                                            int n_splits, int hb, int hg, int part, int g, int tq,
                                            const float (&m_r)[2], const float (&l_r)[2],
                                            const float (&o)[kDW / 8][4], float* __restrict__ ws) {
  const int H = a.n_heads;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = hb + hg * 16 + g + 8 * r;
    if (h >= H) continue;
    if (n_splits == 1) {
      const float sink = a.sinks[h];
      const float M = fmaxf(m_r[r], sink);
      const float f = m_r[r] == -INFINITY ? 0.f : __expf(m_r[r] - M);
      const float inv = f / (l_r[r] * f + __expf(sink - M));
      float* out = a.out + (t * H + h) * int64_t(kHd) + part * kDW;
#pragma unroll
      for (int nt = 0; nt < kDW / 8; ++nt)
        *reinterpret_cast<float2*>(out + nt * 8 + 2 * tq) =
            make_float2(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv);
    } else {
      float* pwo = ws + ((t * H + h) * n_splits + s) * int64_t(kHd + 2);
      if (part == 0 && tq == 0) {
        pwo[0] = m_r[r];
        pwo[1] = l_r[r];
      }
#pragma unroll
      for (int nt = 0; nt < kDW / 8; ++nt)
        *reinterpret_cast<float2*>(pwo + 2 + part * kDW + nt * 8 + 2 * tq) =
            make_float2(o[nt][2 * r], o[nt][2 * r + 1]);
    }
  }
}

template <typename T, int kHC>
__global__ void __launch_bounds__(kThreads, 1)
    attn_dec3_kernel(ops::AttentionArgs a, const T* __restrict__ swa_pool,
                     const T* __restrict__ comp_pool, int n_splits, float* __restrict__ ws) {
  static_assert(kHC == 16 || kHC == 32, "16 or 32 heads per CTA");
  constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  static_assert(kBf16 || std::is_same<T, float>::value, "bf16 or f32 pools");
  constexpr int kHG = kHC / 16;    // head groups of 16
  constexpr int kDP = 8 / kHG;     // warps (dim parts) per head group
  constexpr int kDW = kHd / kDP;   // dims per warp: 128 (kHC 32) / 64 (kHC 16)
  static_assert(kHG * kDP * 32 == kThreads && kDW % 16 == 0, "warp layout");
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  unsigned char* ring = smem + size_t(kHC) * kLdB * 2;
  float* sx = reinterpret_cast<float*>(ring + size_t(kStages3) * kKbBytes);
  __shared__ int32_t rows_s[kStages3][kKT];
  pdl_wait();  // PDL launch: as attn_dec2_kernel
  pdl_trigger();

  const int64_t t = blockIdx.x / n_splits;
  const int s = int(blockIdx.x % n_splits);
  const int hb = blockIdx.y * kHC;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int hg = warp / kDP, part = warp % kDP;
  const int H = a.n_heads;
  // Counts and offsets loaded together (v2 loads the offsets after the counts: one dependent
  // round trip fewer on the batch-1 critical path; offset[t] exists wherever count[t] does).
  const bool has_swa = swa_pool && a.swa.count, has_comp = comp_pool && a.comp.count;
  const int64_t swa_off = has_swa ? a.swa.offset[t] : 0;
  const int64_t comp_off = has_comp ? a.comp.offset[t] : 0;
  const int n_swa = has_swa ? a.swa.count[t] : 0;
  const int n_comp = has_comp ? a.comp.count[t] : 0;
  const int n = n_swa + n_comp;
  const int tiles_all = (n + kKT - 1) / kKT;
  const int tiles_per = (tiles_all + n_splits - 1) / n_splits;
  const int k0 = min(n, s * tiles_per * kKT);
  const int k1 = min(n, k0 + tiles_per * kKT);
  const int n_tiles = (k1 - k0 + kKT - 1) / kKT;

  auto lookup = [&](int tile) -> int32_t {
    const int j = k0 + tile * kKT + lane;
    if (tile >= n_tiles || j >= k1) return -1;
    return j < n_swa ? a.swa.rows[swa_off + j] : a.comp.rows[comp_off + (j - n_swa)];
  };
  static_assert(kKT == 32, "one key per lane");
  auto issue = [&](int tile, int32_t my_r) {
    if (tile < n_tiles) {  // block-uniform
      const int buf = tile % kStages3;
      unsigned char* dst = ring + size_t(buf) * kKbBytes;
      const int kt0 = k0 + tile * kKT;
      if constexpr (kBf16) {
        constexpr int kChunks = kHd * 2 / 16;             // 64 per row
        constexpr int kIt = kKT * kChunks / kThreads;     // 8
#pragma unroll
        for (int i = 0; i < kIt; ++i) {
          const int e = threadIdx.x + i * kThreads;
          const int key = e / kChunks, c = e % kChunks;  // key warp-uniform
          const int32_t r = __shfl_sync(0xffffffffu, my_r, key);
          const T* pool = kt0 + key >= n_swa ? comp_pool : swa_pool;
          const void* src =
              r >= 0 ? static_cast<const void*>(
                           reinterpret_cast<const unsigned char*>(pool + int64_t(r) * kHd) + 16 * c)
                     : static_cast<const void*>(a.q);
          cp_async16(dst + size_t(key) * (kLdB * 2) + 16 * c, src, r >= 0);
        }
      } else {
        constexpr int kChunks = kHd / 4;                  // 128 float4 per row
        constexpr int kIt = kKT * kChunks / kThreads;     // 16
        float4 v[kIt];
#pragma unroll
        for (int i = 0; i < kIt; ++i) {
          const int e = threadIdx.x + i * kThreads;
          const int key = e / kChunks, c = e % kChunks;  // key warp-uniform
          const int32_t r = __shfl_sync(0xffffffffu, my_r, key);
          const float* pool =
              reinterpret_cast<const float*>(kt0 + key >= n_swa ? comp_pool : swa_pool);
          v[i] = r >= 0 ? __ldg(reinterpret_cast<const float4*>(pool + int64_t(r) * kHd) + c)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        __nv_bfloat16* kb = reinterpret_cast<__nv_bfloat16*>(dst);
#pragma unroll
        for (int i = 0; i < kIt; ++i) {
          const int e = threadIdx.x + i * kThreads;
          const int key = e / kChunks, c = e % kChunks;
          uint2 u;
          u.x = pack_bf16(v[i].x, v[i].y);
          u.y = pack_bf16(v[i].z, v[i].w);
          *reinterpret_cast<uint2*>(kb + key * kLdB + 4 * c) = u;
        }
      }
      if (warp == 0) rows_s[buf][lane] = my_r;
    }
    cp_async_commit();  // one group per tile (empty for f32 pools): cp_async_wait counts tiles
  };

  float o[kDW / 8][4];
#pragma unroll
  for (int i = 0; i < kDW / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};

  int32_t next_r = -1;
  if (n_tiles > 0) {
    // Q of the kHC heads (kHC / 2 float4 per thread) requested before the key-list lookups.
    constexpr int kQ = kHC * (kHd / 4) / kThreads;
    float4 qv[kQ];
#pragma unroll
    for (int j = 0; j < kQ; ++j) {
      const int e = threadIdx.x + j * kThreads;
      const int h = e / (kHd / 4), c4 = e % (kHd / 4);
      qv[j] = hb + h < H
                  ? __ldg(reinterpret_cast<const float4*>(a.q + (t * H + hb + h) * int64_t(kHd)) + c4)
                  : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int p = 0; p < kStages3 - 1; ++p) issue(p, lookup(p));
    next_r = lookup(kStages3 - 1);
#pragma unroll
    for (int j = 0; j < kQ; ++j) {
      const int e = threadIdx.x + j * kThreads;
      const int h = e / (kHd / 4), c4 = e % (kHd / 4);
      uint2 u;
      u.x = pack_bf16(qv[j].x, qv[j].y);
      u.y = pack_bf16(qv[j].z, qv[j].w);
      *reinterpret_cast<uint2*>(qs + h * kLdB + 4 * c4) = u;
    }
  }
  const __nv_bfloat16* qw = qs + (hg * 16) * kLdB + part * kDW;
  for (int it = 0; it < n_tiles; ++it) {
    const int buf = it % kStages3;
    cp_async_wait<kStages3 - 2>();  // as v2: tiles 0 .. it landed (this thread's copies)
    __syncthreads();                // A: tile it (on it == 0 also qs) visible
    const __nv_bfloat16* kw =
        reinterpret_cast<const __nv_bfloat16*>(ring + size_t(buf) * kKbBytes) + part * kDW;
    float sacc[4][4], sv[4][4];
    tile_qk_w<kDW>(qw, kw, lane, sacc);
    tile_s_write(sx, warp, g, tq, sacc);
    __syncthreads();  // B: partial S visible; every warp is past tile it − 1
    issue(it + kStages3 - 1, next_r);
    next_r = lookup(it + kStages3);
    tile_softmax_w<kDP, kDW>(sx, hg, g, tq, a.scale, rows_s[buf], sv, m_r, l_r, o);
    tile_pv_w<kDW>(kw, lane, sv, o);
  }
  cp_async_wait<0>();
  store_out_w<kDW>(a, t, s, n_splits, hb, hg, part, g, tq, m_r, l_r, o, ws);
}


// ---- variant 5 (issue 7: batch-1 per-tile latency and fixed cost) ---------------------------
// attn_dec5_kernel<T, kCluster>: 16 heads per CTA (as variant 4) with three changes on the
// batch-1 critical path:
//  1. Key rows up front: after the counts / offsets, the CTA loads the pool rows of its split's
//     first kPre5 tiles (≤ 1,024 keys) into shared memory in one coalesced pass (4 independent
//     loads per thread, together with Q), so the prologue issues tiles 0..2 without a dependent
//     global load, and the loop's look-ahead reads shared memory; tiles ≥ kPre5 fall back to the
//     v3 / v4 global lookup one tile ahead.
//  2. QK split by keys, not by dims: warp w computes S[16 heads][keys 8·(w/2) .. +7] over dims
//     256·(w%2) .. +255 with Q in registers (16 A fragments, loaded once), 4 accumulators of 4
//     k-steps each (short mma chains), summed in a fixed order. The S exchange is then 8 slots
//     of 16 × 8 f32 (4 KiB written, every warp reads 2 slots per 8-key n-tile: 32 KiB a tile,
//     v4: 16 KiB written, 128 KiB read; and no Q reads from shared memory: v4 16 KiB a tile).
//     S[h][key] = slot(2·nt)[h][key'] + slot(2·nt + 1)[h][key'] (dim half 0 + half 1, fixed
//     order): all 8 warps hold bit-identical S and softmax state. P·V as variant 4 (warp w:
//     dims 64·w .. +63, all 32 keys).
//  3. kCluster (2 ≤ n_splits ≤ kMaxCluster5 = 16, non-portable cluster size above 8): the splits
//     of a (row, 16-head group) form one cluster and merge their partials through distributed
//     shared memory (no workspace, no combine launch): every CTA writes (m, l, unnormalized o) of
//     its 16 heads (32 KiB) into its own shared memory, cluster barrier, every CTA computes the
//     merge weights of the 16 heads (rank order), then sums its share of the 32 half-rows of
//     256 outputs (half-row c goes to rank c % n) over the ranks in rank order (deterministic),
//     second cluster barrier. Otherwise the attention.h partials + attn_dec_combine3_kernel.
// Ring, barriers and hazards: as attn_dec3_kernel (4 slots, 3 tiles in flight, barriers A / B).
constexpr int kHC5 = 16;            // heads per CTA
constexpr int kPre5 = 32;           // tiles whose key rows are preloaded (1,024 keys)
constexpr int kMaxCluster5 = 16;    // non-portable cluster size limit (sm_90)
constexpr int kSx5Ld = 8;           // f32 row stride of an S slot (16 × 8; conflict-free float2)
constexpr size_t kQs5Bytes = size_t(kHC5) * kLdB * 2;                    // 16,640
constexpr size_t kSx5Bytes = size_t(8) * 16 * kSx5Ld * 4;                // 4,096
constexpr size_t kSmem5 = kQs5Bytes + size_t(kStages3) * kKbBytes + kSx5Bytes;  // 153,856
constexpr size_t kCp5Bytes = size_t(kHC5) * kHd * 4;                      // 32,768
static_assert(kCp5Bytes + 2 * kHC5 * 4 <= kSmem5, "v5 cluster partial must fit the smem");
static_assert(kSmem5 + size_t(kStages3) * kKT * 4 + size_t(kPre5) * kKT * 4 +
                      size_t(kHC5) * kMaxCluster5 * 4 <= 232448,
              "v5 shared memory over 227 KiB");
static_assert(kQs5Bytes % 16 == 0 && (kQs5Bytes + size_t(kStages3) * kKbBytes) % 16 == 0,
              "v5 alignment");

/// S = Q[16 heads, 256 dims of half dh] · K[8 keys of n-tile kn, same dims]ᵀ: qf = Q fragments
/// of the 16 k-steps (registers), kw = key tile + (8·kn)·kLdB + 256·dh. Returns the warp's
/// 16 × 8 partial in mma C layout (c[0..1]: row g, keys 2tq, 2tq+1; c[2..3]: row g + 8).
__device__ __forceinline__ void tile_qk5(const uint32_t (&qf)[16][4], const __nv_bfloat16* kw,
                                         int lane, float (&c)[4]) {
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  // ldmatrix x4: lanes 8m .. 8m+7 address keys (lane & 7), dims 32j + 8m: matrices 0 / 1 are
  // b0 / b1 of k-step 2j, matrices 2 / 3 those of k-step 2j + 1.
  const __nv_bfloat16* krow = kw + (lane & 7) * kLdB + 8 * (lane >> 3);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t bf[4];
    ldmatrix_x4(bf, krow + 32 * j);
    mma_bf16(acc[(2 * j) & 3], qf[2 * j], bf[0], bf[1]);
    mma_bf16(acc[(2 * j + 1) & 3], qf[2 * j + 1], bf[2], bf[3]);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) c[e] = (acc[0][e] + acc[1][e]) + (acc[2][e] + acc[3][e]);
}

/// Online softmax update of (m_r, l_r) and o[kNO][4] with the scaled, masked logits sv (−inf:
/// masked); on return sv holds the p values. Same arithmetic as tile_softmax_w.
template <int kNO>
__device__ __forceinline__ void softmax_update5(float (&sv)[4][4], float (&m_r)[2],
                                                float (&l_r)[2], float (&o)[kNO][4]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) mx = fmaxf(mx, fmaxf(sv[nt][2 * r], sv[nt][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_r[r], mx);
    const float corr =
        m_new == -INFINITY ? 1.f : (m_r[r] == -INFINITY ? 0.f : __expf(m_r[r] - m_new));
    float psum = 0.f;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float v = sv[nt][2 * r + c];
        const float p = v == -INFINITY ? 0.f : __expf(v - m_new);
        sv[nt][2 * r + c] = p;
        psum += p;
      }
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    psum += __shfl_xor_sync(0xffffffffu, psum, 2);
    l_r[r] = l_r[r] * corr + psum;
    m_r[r] = m_new;
    if (__any_sync(0xffffffffu, corr != 1.f)) {
#pragma unroll
      for (int i = 0; i < kNO; ++i) {
        o[i][2 * r] *= corr;
        o[i][2 * r + 1] *= corr;
      }
    }
  }
}

// ---- variant 6 (issue 7: fewer instructions per tile; attn_dec5_kernel<T, kCluster, true>) ----
// ncu of variant 5 at HCA 1M (batch 1, 33 splits): ~750 warp instructions per 32-key tile, 4 %
// of them mma; the rest softmax bookkeeping (__expf's denormal range fix-up: ~9 instructions an
// exp, 16 exps a thread a tile), per-element −inf tests, the O rescale on ~85 % of the tiles
// (some head's max grows in most of the first tiles of a split), the per-tile quad sums of l,
// the mask read from shared memory, and the issue's per-chunk address math (~25 instructions a
// cp.async). Variant 6 keeps variant 5's data flow (ring, barriers, S exchange, P·V, merge) and
// changes only that bookkeeping:
//  - logits in log2 units: p = ex2.approx.ftz(s · c2 − m2) (one FFMA + one MUFU), c2 = scale ·
//    log2 e, m2 = the running reference max in log2 units (converted back to natural units,
//    m = m2 · ln 2, for the partial / output: the same (m, l, o) contract as variant 5);
//  - lazy rescale: the reference max m2 only moves when a row's tile max exceeds it by more than
//    kTau6 = 8 (log2 units; warp-uniform vote on the thread's own 8 logits per row, no shuffles
//    on the fast path), so p ≤ 2^8 and the O / l rescale runs on a few tiles a split. Exact: p, l
//    and o share the reference, the result differs from variant 5 only by f32 / bf16 rounding
//    (p ≤ 256 keeps bf16's relative precision; l ≤ 256 · keys, far from f32 overflow);
//  - l on the tensor cores: P · ones (one more mma per 16 keys, the P fragments P·V packs
//    anyway) accumulates Σ p of each row in mma C layout, already summed over the quad — no
//    per-tile FADDs or shuffles for l; it sums the bf16-rounded p that P·V multiplies (variant 5:
//    the fp32 p), so numerator and denominator see the same weights;
//  - the key mask is a ballot of the tile's pool rows taken at issue time (registers, 3 tiles
//    ahead, identical in every warp), applied only to tiles with a masked key (uniform branch);
//    a tile with no valid key is skipped (no softmax, no P·V);
//  - bf16 issue: warp w copies keys 4w .. 4w+3 (two 512-byte half rows each per instruction), the
//    source pointer of key k computed once by lane k and shuffled (64-bit), shared addresses
//    from one base plus immediates. f32 pools keep variant 5's issue.
constexpr float kTau6 = 8.f;  // lazy-rescale threshold (log2 units: p ≤ 2^8)

__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// cp.async of 16 bytes to a shared address (bytes: 16, or 0 = zero fill).
__device__ __forceinline__ void cp_async16_sa(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

/// Variant 6 softmax update of a tile: sv = raw S (unscaled, −inf: masked; every row has at least
/// one finite value — the caller skips tiles without a valid key), m2 = reference max in log2
/// units (−inf: none yet), lacc = Σ p of rows g (lacc[0..1]) and g + 8 (lacc[2..3]) in mma C
/// layout (tile_pv6 adds to it). Rescales o and lacc only when some row's tile max exceeds m2 by
/// more than kTau6 (warp vote). On return sv holds p = 2^(s·c2 − m2) (masked: 0).
template <int kNO>
__device__ __forceinline__ void softmax_lean6(float (&sv)[4][4], float c2, float (&m2)[2],
                                              float (&lacc)[4], float (&o)[kNO][4]) {
  float mx[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(sv[0][2 * r], sv[0][2 * r + 1]);
#pragma unroll
    for (int nt = 1; nt < 4; ++nt) mx[r] = fmaxf(mx[r], fmaxf(sv[nt][2 * r], sv[nt][2 * r + 1]));
  }
  const bool grow = mx[0] * c2 > m2[0] + kTau6 || mx[1] * c2 > m2[1] + kTau6;
  if (__any_sync(0xffffffffu, grow)) {  // warp-uniform; rare after a split's first tile
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float q = mx[r];
      q = fmaxf(q, __shfl_xor_sync(0xffffffffu, q, 1));
      q = fmaxf(q, __shfl_xor_sync(0xffffffffu, q, 2));  // the row's tile max (its quad)
      const float m_new = fmaxf(m2[r], q * c2);
      const float corr = m_new == -INFINITY ? 1.f : ex2_ftz(m2[r] - m_new);  // m2 = −inf: 0
      lacc[2 * r] *= corr;
      lacc[2 * r + 1] *= corr;
#pragma unroll
      for (int i = 0; i < kNO; ++i) {
        o[i][2 * r] *= corr;
        o[i][2 * r + 1] *= corr;
      }
      m2[r] = m_new;
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float nm = m2[r] == -INFINITY ? 0.f : -m2[r];  // guard: never −inf + inf
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        sv[nt][2 * r + c] = ex2_ftz(fmaf(sv[nt][2 * r + c], c2, nm));  // s = −inf → 0
  }
}

/// tile_pv_w<64> plus l: O[16 heads, 64 dims] += P · V as tile_pv_w, and lacc += P · ones (B =
/// all-ones bf16: every column of the 16 × 8 result is the row's Σ_k p over the tile's 32 keys,
/// in mma C layout: lacc[0..1] row g, lacc[2..3] row g + 8).
template <int kDW>
__device__ __forceinline__ void tile_pv6(const __nv_bfloat16* kw, int lane, const float (&sv)[4][4],
                                         float (&o)[kDW / 8][4], float (&lacc)[4]) {
  constexpr uint32_t kOnes = 0x3F803F80u;  // bf16x2 (1, 1)
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    uint32_t af[4];
    af[0] = pack_bf16(sv[2 * ks][0], sv[2 * ks][1]);
    af[1] = pack_bf16(sv[2 * ks][2], sv[2 * ks][3]);
    af[2] = pack_bf16(sv[2 * ks + 1][0], sv[2 * ks + 1][1]);
    af[3] = pack_bf16(sv[2 * ks + 1][2], sv[2 * ks + 1][3]);
    const __nv_bfloat16* vrow =
        kw + (16 * ks + (lane & 7) + 8 * ((lane >> 3) & 1)) * kLdB + 8 * (lane >> 4);
#pragma unroll
    for (int np = 0; np < kDW / 16; ++np) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, vrow + 16 * np);
      mma_bf16(o[2 * np], af, bf[0], bf[1]);
      mma_bf16(o[2 * np + 1], af, bf[2], bf[3]);
    }
    mma_bf16(lacc, af, kOnes, kOnes);
  }
}

// kLean = false: variant 5; true: variant 6 (above).
template <typename T, bool kCluster, bool kLean>
__global__ void __launch_bounds__(kThreads, 1)
    attn_dec5_kernel(ops::AttentionArgs a, const T* __restrict__ swa_pool,
                     const T* __restrict__ comp_pool, int n_splits, float* __restrict__ ws) {
  constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  static_assert(kBf16 || std::is_same<T, float>::value, "bf16 or f32 pools");
  constexpr int kDW = kHd / 8;  // P·V dims per warp (64)
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  unsigned char* ring = smem + kQs5Bytes;
  float* sx = reinterpret_cast<float*>(ring + size_t(kStages3) * kKbBytes);
  __shared__ int32_t rows_s[kStages3][kKT];  // pool row per key of the ring tiles (−1: masked)
  __shared__ int32_t rows_pre[kPre5 * kKT];  // pool rows of the split's first kPre5 tiles
  pdl_wait();  // PDL launch: as attn_dec2_kernel
  pdl_trigger();

  const int64_t t = blockIdx.x / n_splits;
  const int s = int(blockIdx.x % n_splits);  // = the cluster rank with kCluster
  const int hb = blockIdx.y * kHC5;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int H = a.n_heads;
  const bool has_swa = swa_pool && a.swa.count, has_comp = comp_pool && a.comp.count;
  const int64_t swa_off = has_swa ? a.swa.offset[t] : 0;
  const int64_t comp_off = has_comp ? a.comp.offset[t] : 0;
  const int n_swa = has_swa ? a.swa.count[t] : 0;
  const int n_comp = has_comp ? a.comp.count[t] : 0;
  const int n = n_swa + n_comp;
  const int tiles_all = (n + kKT - 1) / kKT;
  const int tiles_per = (tiles_all + n_splits - 1) / n_splits;
  const int k0 = min(n, s * tiles_per * kKT);
  const int k1 = min(n, k0 + tiles_per * kKT);
  const int n_tiles = (k1 - k0 + kKT - 1) / kKT;

  // Pool row of split key k0 + i (−1 past the split or for a masked entry), from global memory.
  auto key_at = [&](int i) -> int32_t {
    const int j = k0 + i;
    if (j >= k1) return -1;
    return j < n_swa ? a.swa.rows[swa_off + j] : a.comp.rows[comp_off + (j - n_swa)];
  };
  // Pool row of key k0 + 32·tile + lane: shared memory for tile < kPre5 (after the prologue
  // barrier), else a global load (made one tile ahead by the loop, as attn_dec3_kernel).
  auto lookup = [&](int tile) -> int32_t {
    if (tile >= n_tiles) return -1;
    if (tile < kPre5) return rows_pre[tile * kKT + lane];
    return key_at(tile * kKT + lane);
  };
  static_assert(kKT == 32, "one key per lane");
  // Issues tile `tile` (my_r: the pool row of its key `lane`, −1 masked) into its ring slot;
  // returns (variant 6) the tile's valid-key mask, bit k = key k has a pool row (0 past the end).
  auto issue = [&](int tile, int32_t my_r) -> uint32_t {
    uint32_t vm = 0;
    if (tile < n_tiles) {  // block-uniform
      const int buf = tile % kStages3;
      unsigned char* dst = ring + size_t(buf) * kKbBytes;
      const int kt0 = k0 + tile * kKT;
      if constexpr (kLean) vm = __ballot_sync(0xffffffffu, my_r >= 0);
      if constexpr (kLean && kBf16) {
        // Warp w copies keys 4w .. 4w+3: per key two instructions of 32 × 16 bytes (the row's
        // halves); lane k computed key k's source pointer (a.q when masked: a zero fill reads
        // nothing) and the warp shuffles it.
        static_assert(kThreads / 32 * 4 == kKT && kHd * 2 == 2 * 32 * 16, "v6 issue layout");
        const T* pool = kt0 + lane >= n_swa ? comp_pool : swa_pool;
        const unsigned char* mine =
            my_r >= 0 ? reinterpret_cast<const unsigned char*>(pool + int64_t(my_r) * kHd)
                      : reinterpret_cast<const unsigned char*>(a.q);
        const uint32_t d0 = smem_addr(dst) + uint32_t(4 * warp * (kLdB * 2) + 16 * lane);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int key = 4 * warp + k;  // warp-uniform
          const unsigned char* src =
              reinterpret_cast<const unsigned char*>(__shfl_sync(
                  0xffffffffu, reinterpret_cast<unsigned long long>(mine), key)) +
              16 * lane;
          const int bytes = (vm >> key) & 1u ? 16 : 0;
          cp_async16_sa(d0 + uint32_t(k * (kLdB * 2)), src, bytes);
          cp_async16_sa(d0 + uint32_t(k * (kLdB * 2) + 512), src + 512, bytes);
        }
      } else if constexpr (kBf16) {
        constexpr int kChunks = kHd * 2 / 16;             // 64 per row
        constexpr int kIt = kKT * kChunks / kThreads;     // 8
#pragma unroll
        for (int i = 0; i < kIt; ++i) {
          const int e = threadIdx.x + i * kThreads;
          const int key = e / kChunks, c = e % kChunks;  // key warp-uniform
          const int32_t r = __shfl_sync(0xffffffffu, my_r, key);
          const T* pool = kt0 + key >= n_swa ? comp_pool : swa_pool;
          const void* src =
              r >= 0 ? static_cast<const void*>(
                           reinterpret_cast<const unsigned char*>(pool + int64_t(r) * kHd) + 16 * c)
                     : static_cast<const void*>(a.q);
          cp_async16(dst + size_t(key) * (kLdB * 2) + 16 * c, src, r >= 0);
        }
      } else {
        constexpr int kChunks = kHd / 4;                  // 128 float4 per row
        constexpr int kIt = kKT * kChunks / kThreads;     // 16
        float4 v[kIt];
#pragma unroll
        for (int i = 0; i < kIt; ++i) {
          const int e = threadIdx.x + i * kThreads;
          const int key = e / kChunks, c = e % kChunks;  // key warp-uniform
          const int32_t r = __shfl_sync(0xffffffffu, my_r, key);
          const float* pool =
              reinterpret_cast<const float*>(kt0 + key >= n_swa ? comp_pool : swa_pool);
          v[i] = r >= 0 ? __ldg(reinterpret_cast<const float4*>(pool + int64_t(r) * kHd) + c)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        __nv_bfloat16* kb = reinterpret_cast<__nv_bfloat16*>(dst);
#pragma unroll
        for (int i = 0; i < kIt; ++i) {
          const int e = threadIdx.x + i * kThreads;
          const int key = e / kChunks, c = e % kChunks;
          uint2 u;
          u.x = pack_bf16(v[i].x, v[i].y);
          u.y = pack_bf16(v[i].z, v[i].w);
          *reinterpret_cast<uint2*>(kb + key * kLdB + 4 * c) = u;
        }
      }
      if (!kLean && warp == 0) rows_s[buf][lane] = my_r;
    }
    cp_async_commit();  // one group per tile (empty for f32 pools): cp_async_wait counts tiles
    return vm;
  };

  float o[kDW / 8][4];
#pragma unroll
  for (int i = 0; i < kDW / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  // (m, l) of rows g, g+8 (natural units, quad-uniform). Variant 6 during the loop: m_r = the
  // reference max in log2 units and lacc = Σ p in mma C layout (converted after the loop).
  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
  float lacc[4] = {0.f, 0.f, 0.f, 0.f};
  const float c2 = a.scale * 1.4426950408889634f;  // variant 6: logit scale in log2 units
  uint32_t vm0 = 0, vm1 = 0, vm2 = 0;  // variant 6: valid-key masks of tiles it, it+1, it+2
  uint32_t qf[16][4];  // Q A-fragments of k-steps 0..15 over the warp's dim half (QK)
  const int kn = warp >> 1, dh = warp & 1;  // QK: keys 8·kn .. +7, dims 256·dh .. +255

  int32_t next_r = -1;
  if (n_tiles > 0) {  // block-uniform
    // Q (8 float4 per thread) and the preloaded key rows (4 per thread) in one round trip.
    constexpr int kQ = kHC5 * (kHd / 4) / kThreads;  // 8
    constexpr int kP = kPre5 * kKT / kThreads;       // 4
    const int n_pre = min(n_tiles, kPre5) * kKT;
    float4 qv[kQ];
    int32_t pv[kP];
#pragma unroll
    for (int j = 0; j < kQ; ++j) {
      const int e = threadIdx.x + j * kThreads;
      const int h = e / (kHd / 4), c4 = e % (kHd / 4);
      qv[j] = hb + h < H
                  ? __ldg(reinterpret_cast<const float4*>(a.q + (t * H + hb + h) * int64_t(kHd)) + c4)
                  : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kP; ++j) {
      const int i = threadIdx.x + j * kThreads;
      pv[j] = i < n_pre ? key_at(i) : -1;
    }
#pragma unroll
    for (int j = 0; j < kP; ++j) rows_pre[threadIdx.x + j * kThreads] = pv[j];
#pragma unroll
    for (int j = 0; j < kQ; ++j) {
      const int e = threadIdx.x + j * kThreads;
      const int h = e / (kHd / 4), c4 = e % (kHd / 4);
      uint2 u;
      u.x = pack_bf16(qv[j].x, qv[j].y);
      u.y = pack_bf16(qv[j].z, qv[j].w);
      *reinterpret_cast<uint2*>(qs + h * kLdB + 4 * c4) = u;
    }
    __syncthreads();  // rows_pre and qs visible to every thread
    static_assert(kStages3 == 4, "three tiles in flight (vm0..vm2)");
    vm0 = issue(0, lookup(0));
    vm1 = issue(1, lookup(1));
    vm2 = issue(2, lookup(2));
    next_r = lookup(kStages3 - 1);
    const __nv_bfloat16* qw = qs + dh * 256;
#pragma unroll
    for (int i = 0; i < 16; ++i)
      ldmatrix_x4(qf[i], qw + (lane & 15) * kLdB + 16 * i + 8 * (lane >> 4));
  }
  for (int it = 0; it < n_tiles; ++it) {
    const int buf = it % kStages3;
    cp_async_wait<kStages3 - 2>();  // as v2: tiles 0 .. it landed (this thread's copies)
    __syncthreads();                // A: tile it visible; every warp is past tile it − 1's S reads
    const __nv_bfloat16* kt = reinterpret_cast<const __nv_bfloat16*>(ring + size_t(buf) * kKbBytes);
    float c[4];
    tile_qk5(qf, kt + (8 * kn) * kLdB + 256 * dh, lane, c);
    {
      float* mine = sx + warp * (16 * kSx5Ld);
      *reinterpret_cast<float2*>(mine + g * kSx5Ld + 2 * tq) = make_float2(c[0], c[1]);
      *reinterpret_cast<float2*>(mine + (g + 8) * kSx5Ld + 2 * tq) = make_float2(c[2], c[3]);
    }
    __syncthreads();  // B: the 8 partial-S slots visible; every warp is past tile it − 1
    const uint32_t vm = vm0;  // variant 6: tile it's valid keys
    {
      const uint32_t vn = issue(it + kStages3 - 1, next_r);
      vm0 = vm1;
      vm1 = vm2;
      vm2 = vn;
    }
    next_r = lookup(it + kStages3);
    if constexpr (kLean) {
      if (vm == 0u) continue;  // no valid key (block-uniform): nothing to add
      float sv[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const float* s0 = sx + (2 * nt) * (16 * kSx5Ld);      // keys 8nt.., dims 0..255
        const float* s1 = sx + (2 * nt + 1) * (16 * kSx5Ld);  // same keys, dims 256..511
        const float2 a0 = *reinterpret_cast<const float2*>(s0 + g * kSx5Ld + 2 * tq);
        const float2 b0 = *reinterpret_cast<const float2*>(s1 + g * kSx5Ld + 2 * tq);
        const float2 a1 = *reinterpret_cast<const float2*>(s0 + (g + 8) * kSx5Ld + 2 * tq);
        const float2 b1 = *reinterpret_cast<const float2*>(s1 + (g + 8) * kSx5Ld + 2 * tq);
        sv[nt][0] = a0.x + b0.x;  // raw S; the scale is folded into softmax_lean6's FFMA
        sv[nt][1] = a0.y + b0.y;
        sv[nt][2] = a1.x + b1.x;
        sv[nt][3] = a1.y + b1.y;
      }
      if (vm != 0xffffffffu) {  // block-uniform: only tiles with a masked key
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int c0 = nt * 8 + 2 * tq;
          if (!((vm >> c0) & 1u)) sv[nt][0] = sv[nt][2] = -INFINITY;
          if (!((vm >> (c0 + 1)) & 1u)) sv[nt][1] = sv[nt][3] = -INFINITY;
        }
      }
      softmax_lean6<kDW / 8>(sv, c2, m_r, lacc, o);
      tile_pv6<kDW>(kt + warp * kDW, lane, sv, o, lacc);
      continue;
    }
    float sv[4][4];

    const int32_t* rows = rows_s[buf];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const float* s0 = sx + (2 * nt) * (16 * kSx5Ld);      // keys 8nt.., dims 0..255
      const float* s1 = sx + (2 * nt + 1) * (16 * kSx5Ld);  // same keys, dims 256..511
      const float2 a0 = *reinterpret_cast<const float2*>(s0 + g * kSx5Ld + 2 * tq);
      const float2 b0 = *reinterpret_cast<const float2*>(s1 + g * kSx5Ld + 2 * tq);
      const float2 a1 = *reinterpret_cast<const float2*>(s0 + (g + 8) * kSx5Ld + 2 * tq);
      const float2 b1 = *reinterpret_cast<const float2*>(s1 + (g + 8) * kSx5Ld + 2 * tq);
      sv[nt][0] = (a0.x + b0.x) * a.scale;
      sv[nt][1] = (a0.y + b0.y) * a.scale;
      sv[nt][2] = (a1.x + b1.x) * a.scale;
      sv[nt][3] = (a1.y + b1.y) * a.scale;
      const int c0 = nt * 8 + 2 * tq;
      if (rows[c0] < 0) sv[nt][0] = sv[nt][2] = -INFINITY;
      if (rows[c0 + 1] < 0) sv[nt][1] = sv[nt][3] = -INFINITY;
    }
    softmax_update5<kDW / 8>(sv, m_r, l_r, o);
    tile_pv_w<kDW>(kt + warp * kDW, lane, sv, o);
  }
  cp_async_wait<0>();
  if constexpr (kLean) {  // back to variant 5's (m, l): natural units
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_r[r] = lacc[2 * r];                   // = lacc[2r + 1]: every column holds the row sum
      m_r[r] = m_r[r] * 0.6931471805599453f;  // −inf stays −inf
    }
  }
  if constexpr (!kCluster) {
    store_out_w<kDW>(a, t, s, n_splits, hb, 0, warp, g, tq, m_r, l_r, o, ws);
  } else {
    // Cluster merge. cp [16 heads][512] f32, cm[16], cl[16] over the (now free) Q / ring space.
    float* cp = reinterpret_cast<float*>(smem);
    float* cm = reinterpret_cast<float*>(smem + kCp5Bytes);
    float* cl = cm + kHC5;
    __shared__ float wts[kHC5][kMaxCluster5];
    __syncthreads();  // every warp is done with qs, the ring and sx
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int hl = g + 8 * r;  // head within the CTA
      if (warp == 0 && tq == 0) {  // every warp holds the same (m, l)
        cm[hl] = m_r[r];
        cl[hl] = l_r[r];
      }
      float* row = cp + hl * kHd + warp * kDW;
#pragma unroll
      for (int nt = 0; nt < kDW / 8; ++nt)
        *reinterpret_cast<float2*>(row + nt * 8 + 2 * tq) =
            make_float2(o[nt][2 * r], o[nt][2 * r + 1]);
    }
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every rank's partial written and visible cluster-wide
    // 1. Merge weights of the 16 heads (every CTA; thread hl < 16): w[q] = exp(m_q − M) /
    //    (Σ_q l_q · exp(m_q − M) + exp(sink − M)), M = max(sink, m_q), sums in rank order.
    if (int(threadIdx.x) < kHC5) {
      const int hl = int(threadIdx.x);
      cluster_merge_weights<kMaxCluster5>(cluster, cm, cl, hl, n_splits,
                                          hb + hl < H ? a.sinks[hb + hl] : 0.f, wts[hl]);
    }
    __syncthreads();  // wts ready
    // 2. Half-rows c = 0 .. 31 (head c / 2, dims 256·(c % 2) + thread) of rank c % n_splits:
    //    out = Σ_q o_q · w[q] over the ranks in order.
    constexpr int kHalfRows = kHC5 * 2;
    static_assert(kThreads * 2 == kHd, "two half-rows of 256 dims per head");
    for (int hr = s; hr < kHalfRows; hr += n_splits) {
      const int hl = hr >> 1;
      if (hb + hl >= H) continue;  // block-uniform
      const int d = (hr & 1) * kThreads + int(threadIdx.x);
      float v[kMaxCluster5];
#pragma unroll
      for (int q = 0; q < kMaxCluster5; ++q)
        v[q] = q < n_splits ? *cluster.map_shared_rank(cp + hl * kHd + d, q) : 0.f;
      float acc = 0.f;
#pragma unroll
      for (int q = 0; q < kMaxCluster5; ++q)
        if (q < n_splits) acc = fmaf(v[q], wts[hl][q], acc);
      a.out[(t * H + hb + hl) * int64_t(kHd) + d] = acc;
    }
    cluster.sync();  // keep this CTA's shared memory until every rank has read it
  }
}

// ---- variants 7 … 10 (issue 7: warpgroup MMA, 64 heads per CTA) -------------------------------
#include "ops/cuda/attention_dec_wg.cuh"
// ---- variants 11 / 12 (issue 7: warp-specialized warpgroup MMA) --------------------------------
#include "ops/cuda/attention_dec_ws.cuh"
// ---- variant 14 (issue 7: whole-row bulk copies, transposed products) ---------------------------
#include "ops/cuda/attention_dec_tr.cuh"
// ---- the key-row gather probe (issue 7, bench only) -------------------------------------------
#include "ops/cuda/attention_gather_probe.cuh"
}  // namespace

bool attention_dec_supported(int n_heads, int head_dim) {
  return head_dim == kHd && n_heads > 0;
}

int attention_dec_splits(int64_t S, int H, int64_t max_keys, int n_sms, int kv_bytes) {
  if (S <= 0 || H <= 0 || max_keys <= kKT || n_sms <= 0) return 1;
  if (kv_bytes != 2) kv_bytes = 4;
  // Costs in KiB moved at one SM's fair share of the bandwidth (32 GB/s on an H200).
  const double kTile = kKT * kHd * kv_bytes / 1024.0;  // one key tile: 64 (f32) / 32 (bf16)
  const double kQ = kHeads * kHd * 4 / 1024.0;  // 128: q of 64 heads (f32), also out / partial
  // One SM runs ≤ 1.25× its fair bandwidth share when fewer blocks than SMs run (its tile math,
  // ~32 mma per key, takes about as long as a fair-share tile read; the calibration knob: see
  // the split sweep of bench_kernels --only-attention).
  const double kBoost = 1.25;
  // A tile's math (QK + softmax + P·V) takes about as long as reading 48 KiB at the fair share
  // (from the f32 calibration above: ≤ 64 / 1.25). It does not shrink with the pool's bytes, so
  // bf16 blocks are math-bound and the model spreads them over more SMs than f32 blocks.
  const double kTileMath = 48;
  const double kWaveLatency = 48;  // ~1.5 µs of latency per wave (and per extra launch)
  const int64_t groups = S * ((H + kHeads - 1) / kHeads);
  const int64_t tiles = (max_keys + kKT - 1) / kKT;
  int best = 1;
  double best_cost = 0;
  for (int64_t sp = 1; sp <= std::min<int64_t>(tiles, 128); ++sp) {
    const int64_t per = (tiles + sp - 1) / sp;
    const int64_t used = (tiles + per - 1) / per;  // splits that get keys
    if (used != sp) continue;
    const int64_t ctas = groups * sp;
    // Split: the partial write here, the combine's read of it (spread over all SMs) below.
    const double per_cta = double(per) * kTile + kQ + kQ;
    const int64_t waves = (ctas + n_sms - 1) / n_sms;
    const double active = double(std::min<int64_t>(ctas, n_sms));
    const double per_cta_time =
        std::max(per_cta * std::max(active, n_sms / kBoost) / n_sms, double(per) * kTileMath);
    const double cost = double(waves) * (per_cta_time + kWaveLatency) +
                        (sp > 1 ? kWaveLatency + double(groups) * kQ * double(sp) / n_sms : 0);
    if (sp == 1 || cost < best_cost) {
      best = int(sp);
      best_cost = cost;
    }
  }
  return best;
}

int attention_dec3_splits(int64_t S, int H, int64_t max_keys, int n_sms, int heads_per_cta) {
  if (S <= 0 || H <= 0 || max_keys <= kKT || n_sms <= 0 || heads_per_cta <= 0) return 1;
  const int64_t groups = S * ((H + heads_per_cta - 1) / heads_per_cta);
  const int64_t tiles = (max_keys + kKT - 1) / kKT;
  int64_t sp = std::max<int64_t>(1, n_sms / groups);  // one CTA per SM: a single wave
  sp = std::min<int64_t>(std::min<int64_t>(sp, tiles), 128);
  const int64_t per = (tiles + sp - 1) / sp;  // whole tiles per split, every split non-empty
  return int((tiles + per - 1) / per);
}

namespace {
// The whole-tile split count sp in [1, min(tiles, 128)] — only counts whose every split gets
// keys — with the least cost(sp, tiles per split, waves of groups · sp CTAs on n_sms SMs); ties
// keep the smaller count.
template <typename Cost>
int least_cost_splits(int64_t tiles, int64_t groups, int n_sms, Cost cost) {
  int best = 1;
  double best_cost = 0;
  for (int64_t sp = 1; sp <= std::min<int64_t>(tiles, 128); ++sp) {
    const int64_t per = (tiles + sp - 1) / sp;
    if ((tiles + per - 1) / per != sp) continue;  // every split gets keys
    const int64_t waves = (groups * sp + n_sms - 1) / n_sms;
    const double c = cost(sp, per, waves);
    if (sp == 1 || c < best_cost) {
      best = int(sp);
      best_cost = c;
    }
  }
  return best;
}
}  // namespace

int attention_dec5_splits(int64_t S, int H, int64_t max_keys, int n_sms, int max_cluster,
                          int variant) {
  if (S <= 0 || H <= 0 || max_keys <= kKT || n_sms <= 0) return 1;
  // Critical-path model in µs (H200, session 7 probes of variant 4; per-tile time of variant 5
  // expected, to be re-fit from the bench's v5 sweep): a CTA's tiles after the first cost
  // kTileUs each, per wave of CTAs; a split row adds the combine launch (kCombineUs, measured:
  // 0 keys at 20 splits − 1 split ≈ 4.5 µs) plus its partial reads, or, merged inside a
  // cluster (2 ≤ splits ≤ max_cluster), two cluster barriers and the DSMEM sums (kClusterUs).
  // Variant 6: re-fit on the H200 from bench/results/cuda-attention.md (309d01f, bf16 pools,
  // batch 1): ~1.4 µs a tile after the first (HCA 1M: 33 splits × 8 tiles 18.7 µs vs 0 keys at
  // 33 splits ≈ 7), and the combine only ~1.5 µs dearer than a cluster merge (CSA 640 keys: 20
  // splits × 1 tile + combine 8.70 µs vs a cluster of 10 × 2 tiles 9.22; HCA 128K: 20 splits
  // 9.97 vs a cluster of 12 × 3 tiles 10.53). The session-8 guess (0.6 µs a tile, combine 4.5)
  // made the step's HCA rows at 900K (224 tiles) take a 16-CTA cluster of 14 tiles each (27.4
  // µs a layer, bench-v4flash-20l-ratio-ab.md call 4) instead of one wave of 32 × 7.
  const bool v6 = variant == 6;
  const double kCombineUs = v6 ? 1.5 : 4.5, kPerSplitUs = 0.03, kClusterUs = v6 ? 0.0 : 0.6;
  const double kTileUs = v6 ? 1.4 : 1.0;
  const int64_t groups = S * ((H + kHC5 - 1) / kHC5);
  const int64_t tiles = (max_keys + kKT - 1) / kKT;
  return least_cost_splits(tiles, groups, n_sms, [&](int64_t sp, int64_t per, int64_t waves) {
    const bool cluster = sp >= 2 && sp <= std::min(max_cluster, kMaxCluster5);
    return double(waves) * double(per) * kTileUs +
           (sp == 1 ? 0.0 : cluster ? kClusterUs : kCombineUs + kPerSplitUs * double(sp));
  });
}

int attention_dec_auto_variant(int64_t rows, int64_t max_keys, bool lean) {
  if (rows > 4) return 11;
  if (lean) return 6;
  return max_keys > 4096 ? 5 : 4;
}

int attention_dec7_tile_keys(int variant) {
  return variant == 13 ? 48 : (variant == 8 || variant == 10 || variant == 12) ? 32 : 64;
}

int attention_dec7_splits(int64_t S, int H, int64_t max_keys, int n_sms, int keys_per_tile,
                          int max_cluster) {
  if (keys_per_tile != 32 && keys_per_tile != 48) keys_per_tile = 64;
  if (S <= 0 || H <= 0 || max_keys <= keys_per_tile || n_sms <= 0) return 1;
  // Critical-path model in µs: a CTA's tiles cost kTileUs each (64 keys: ~1 µs of tensor work,
  // the same as a 64 KiB read at one SM's fair share of HBM), per wave; split rows add the
  // combine launch, the partial write of a CTA (128 KiB) and the combine's read of all partials
  // (~3 TB/s). Against the H200 split sweep (bench/results/cuda-attention-wg.md, e659806) it
  // picks the fastest count in 11 of 12 rows for 64-key tiles (9 of 12 for 32-key tiles; the
  // misses within 15%). The measured tile takes ~5.5 µs, not 1 (the kernel is latency-bound per
  // CTA, docs/cuda.md §Variants 7 / 8); a re-fit with that tile time would shift the picks
  // (batch-64 CSA to 2 splits, batch-1 HCA 160 keys to 3) and has not been measured.
  const double kTileUs = keys_per_tile == 64 ? 1.0 : keys_per_tile == 48 ? 0.78 : 0.55;
  const double kCombineUs = 2.0, kPartialWriteUs = 1.0, kPartialReadUs = 0.131072 / 3.0;
  const int64_t groups = S * ((H + 63) / 64);
  const int64_t tiles = (max_keys + keys_per_tile - 1) / keys_per_tile;
  // Cluster merge (variants 11 … 13, 2 ≤ splits ≤ max_cluster): two cluster barriers and the
  // DSMEM sums, no combine launch. kClusterUs = 1.5 from the H200 split sweep
  // (bench/results/cuda-attention-wg-s21.md): batch 64 CSA (10 tiles) runs 29.6 µs at 2 splits
  // against 36.1 at 1 (the merge < 5 tiles), HCA 4K (3 tiles) 18.5 µs at 1 split and slower at
  // 2 (the merge > 1 tile).
  const double kClusterUs = 1.5;
  return least_cost_splits(tiles, groups, n_sms, [&](int64_t sp, int64_t per, int64_t waves) {
    const bool cluster = sp >= 2 && sp <= max_cluster;
    return double(waves) * double(per) * kTileUs +
           (sp == 1    ? 0.0
            : cluster ? kClusterUs
                      : kCombineUs + kPartialWriteUs + double(groups * sp) * kPartialReadUs);
  });
}

namespace {

// Launches kern<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization
// (PDL, when pdl: it may be scheduled while the previous kernel of the stream runs; every kernel
// launched this way calls pdl_wait before touching global memory) and, when cluster > 1, thread
// block clusters of (cluster, 1, 1).
template <typename... P, typename... Args>
Status launch_ex(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                 bool pdl, unsigned cluster, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  V4_CUDA_TRY(cudaLaunchKernelEx(&cfg, kern, args...));
  return Status::Ok();
}

// V4_ATTN_DEC_CLUSTER=0: variant 2 merges 2..8 splits with the combine kernel too (A/B).
bool attn_cluster_enabled() {
  const char* e = std::getenv("V4_ATTN_DEC_CLUSTER");
  return !(e && e[0] == '0');
}

// V4_ATTN_DEC_PDL=0: variant 2 launches without PDL too (A/B, or a driver that refuses the
// attribute); read per call like the compressor's V4_COMPRESS_PDL.
bool attn_pdl_enabled() {
  const char* e = std::getenv("V4_ATTN_DEC_PDL");
  return !(e && e[0] == '0');
}

// Raises a kernel's dynamic shared memory limit once per process (one device); kId tells the
// kernels apart (each instantiation has its own flag).
template <int kId>
Status smem_attr_once(const void* kern, size_t bytes, const char* what) {
  static bool done = false;
  if (!done) {
    const cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (e != cudaSuccess) return cuda_status(e, what);
    done = true;
  }
  return Status::Ok();
}

// Clusters of n CTAs (threads each, smem bytes of dynamic shared memory) of `kern` that can be
// resident at once (cudaOccupancyMaxActiveClusters); 0 when the query is refused (the error is
// cleared: a refused query is not a launch error). The caller sets the kernel's shared-memory
// (and non-portable cluster) attributes first.
int max_active_clusters(const void* kern, int n, int threads, size_t smem) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(n), 1, 1);
  cfg.blockDim = dim3(unsigned(threads), 1, 1);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(n);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int count = 0;
  if (cudaOccupancyMaxActiveClusters(&count, kern, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

// Whether clusters of n (2..kMaxClusterSplits) CTAs of attn_dec2_kernel<bf16, true> can be
// resident on this device (max_active_clusters > 0); asked once per n and process.
bool cluster_fits(int n) {
  static int fits[kMaxClusterSplits + 1] = {};  // 0 unknown, 1 yes, −1 no
  if (n < 2 || n > kMaxClusterSplits) return false;
  if (fits[n] == 0) {
    const void* kern = reinterpret_cast<const void*>(attn_dec2_kernel<__nv_bfloat16, true>);
    const bool ok =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem2)) ==
        cudaSuccess;
    if (!ok) (void)cudaGetLastError();
    fits[n] = ok && max_active_clusters(kern, n, kThreads, kSmem2) > 0 ? 1 : -1;
  }
  return fits[n] > 0;
}

// Whether clusters of n (2..kMaxCluster5) CTAs of attn_dec5_kernel<T, true, kLean> (variant 5 /
// 6) can be resident (max_active_clusters > 0); allows non-portable sizes (> 8) and sets the
// shared memory limit on the way; asked once per (T, kLean, n) and process.
template <typename T, bool kLean>
bool cluster5_fits(int n) {
  static int fits[kMaxCluster5 + 1] = {};  // 0 unknown, 1 yes, −1 no
  if (n < 2 || n > kMaxCluster5) return false;
  if (fits[n] == 0) {
    const void* kern = reinterpret_cast<const void*>(attn_dec5_kernel<T, true, kLean>);
    const bool ok =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem5)) ==
            cudaSuccess &&
        cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
            cudaSuccess;
    if (!ok) (void)cudaGetLastError();
    fits[n] = ok && max_active_clusters(kern, n, kThreads, kSmem5) > 0 ? 1 : -1;
  }
  return fits[n] > 0;
}
// Launches the main kernel `kern` (dynamic smem `smem`, attribute slot kId) on pools of type T;
// pdl: with programmatic stream serialization (the kernel must pdl_wait before any access);
// cluster > 1: clusters of (cluster, 1, 1) CTAs (the kernel must be a kCluster instantiation).
template <int kId, typename T>
Status launch_main(void (*kern)(ops::AttentionArgs, const T*, const T*, int, float*),
                   size_t smem, const ops::AttentionArgs& a, int n_splits, float* ws, dim3 grid,
                   bool pdl, cudaStream_t stream, unsigned cluster = 1, int threads = kThreads) {
  V4_RETURN_IF_ERROR(smem_attr_once<kId>(reinterpret_cast<const void*>(kern), smem,
                                         "attn_dec smem attribute"));
  const T* swa = static_cast<const T*>(a.swa_pool);
  const T* comp = static_cast<const T*>(a.comp_pool);
  if (!pdl && cluster <= 1) {
    kern<<<grid, threads, smem, stream>>>(a, swa, comp, n_splits, ws);
    return check_launch("attn_dec_kernel");
  }
  V4_RETURN_IF_ERROR(launch_ex(kern, grid, dim3(unsigned(threads), 1, 1), smem, stream, pdl,
                               cluster, a, swa, comp, n_splits, ws));
  return check_launch("attn_dec_kernel (PDL / cluster)");
}

// Whether clusters of n (2..kMaxCluster11) CTAs of attn_dec11_kernel<kN, kS, true> can be
// resident (cudaOccupancyMaxActiveClusters > 0: one 200+ KiB CTA per SM, n SMs of one GPC);
// every size is asked on the first call (cached per instance and process), so a later launch of
// any split count needs no device query (e.g. inside a graph capture).
// The variant-11 … 14 kernel instance (kTr: variant 14, whose tiles are always 64 keys in 2
// slots) and its dynamic shared memory.
template <int kN, int kS, bool kTr, bool kCl>
constexpr auto ws_kernel() {
  if constexpr (kTr)
    return attn_dec14_kernel<kCl>;
  else
    return attn_dec11_kernel<kN, kS, kCl>;
}
template <int kN, int kS, bool kTr>
constexpr size_t ws_smem() {
  return kTr ? Tr14Shape::kSmem : Ws11Shape<kN, kS>::kSmem;
}

template <int kN, int kS, bool kTr = false>
bool cluster11_fits(int n) {
  static int fits[kMaxCluster11 + 1] = {};  // 0 unknown, 1 yes, −1 no
  if (n < 2 || n > kMaxCluster11) return false;
  if (fits[2] == 0) {
    const void* kern = reinterpret_cast<const void*>(ws_kernel<kN, kS, kTr, true>());
    const size_t smem = ws_smem<kN, kS, kTr>();
    const bool attr = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(smem)) == cudaSuccess;
    if (!attr) (void)cudaGetLastError();
    for (int c = 2; c <= kMaxCluster11; ++c)
      fits[c] = attr && max_active_clusters(kern, c, kWs11Threads, smem) > 0 ? 1 : -1;
  }
  return fits[n] > 0;
}

// Variants 11 … 14 (kN-key tiles in kS slots, kTr: variant 14; launch id kId, cluster instance
// kIdCl): the splits merged in a cluster when 2 ≤ n_splits ≤ kMaxCluster11 and it can be
// resident (unless V4_ATTN_DEC_CLUSTER=0), else the workspace partials (*merged = false: the
// combine kernel runs).
template <int kId, int kIdCl, int kN, int kS, bool kTr = false>
Status launch_ws11(const ops::AttentionArgs& a, int n_splits, float* workspace, dim3 grid, bool pdl,
                   cudaStream_t stream, bool* merged) {
  using B = __nv_bfloat16;
  *merged = false;
  constexpr size_t smem = ws_smem<kN, kS, kTr>();
  if (n_splits >= 2 && n_splits <= kMaxCluster11 && attn_cluster_enabled() &&
      cluster11_fits<kN, kS, kTr>(n_splits)) {
    V4_RETURN_IF_ERROR((launch_main<kIdCl, B>(ws_kernel<kN, kS, kTr, true>(), smem, a, n_splits,
                                               workspace, grid, pdl, stream, unsigned(n_splits),
                                               kWs11Threads)));
    *merged = true;
    return Status::Ok();
  }
  return launch_main<kId, B>(ws_kernel<kN, kS, kTr, false>(), smem, a, n_splits, workspace, grid,
                             pdl, stream, 1, kWs11Threads);
}

}  // namespace

int attention_dec11_max_cluster(int variant) {
  if (variant < 11 || variant > 14 || !attn_cluster_enabled()) return 0;
  int largest = 0;
  for (int n = 2; n <= kMaxCluster11; ++n) {
    const bool fits = variant == 11   ? cluster11_fits<64, 2>(n)
                      : variant == 13 ? cluster11_fits<48, 3>(n)
                      : variant == 14 ? cluster11_fits<64, 2, true>(n)
                                      : cluster11_fits<32, 4>(n);
    if (fits) largest = n;
  }
  return largest;
}

int attention_dec5_max_cluster(KvDtype kv_dtype, int variant) {
  if (!attn_cluster_enabled()) return 0;
  if (kv_dtype != KvDtype::kBf16 && kv_dtype != KvDtype::kF32) return 0;
  // Every size is asked (cached) on the first call, so that a later launch of any split count
  // finds its answer without a device query (e.g. inside a graph capture).
  const bool b16 = kv_dtype == KvDtype::kBf16, lean = variant == 6;
  int largest = 0;
  for (int n = 2; n <= kMaxCluster5; ++n) {
    const bool fits = lean ? (b16 ? cluster5_fits<__nv_bfloat16, true>(n)
                                  : cluster5_fits<float, true>(n))
                           : (b16 ? cluster5_fits<__nv_bfloat16, false>(n)
                                  : cluster5_fits<float, false>(n));
    if (fits) largest = n;
  }
  return largest;
}

Status set_attention_dec7_diag(int mode) {
  if (mode < 0 || mode > 2)
    return errorf(ErrorCode::kInvalidArgument, "set_attention_dec7_diag: mode {}", mode);
  return cuda_status(cudaMemcpyToSymbol(c_attn7_diag, &mode, sizeof mode),
                     "set_attention_dec7_diag");
}

Status set_attention_dec11_prefetch(int tiles) {
  if (tiles < 0 || tiles > 2)
    return errorf(ErrorCode::kInvalidArgument, "set_attention_dec11_prefetch: {} tiles", tiles);
  return cuda_status(cudaMemcpyToSymbol(c_attn11_prefetch, &tiles, sizeof tiles),
                     "set_attention_dec11_prefetch");
}

Status attention_gather_probe(const void* pool, int64_t pool_rows, const int32_t* rows,
                              int64_t n_tiles, int mode, int stages, int ctas, uint32_t* sink,
                              bool check, cudaStream_t stream) {
  if (!pool || !rows || pool_rows < 1 || n_tiles < 1 || mode < 0 || mode > 4 ||
      (stages != 2 && stages != 3) || ctas < 1 || (check && !sink))
    return errorf(ErrorCode::kInvalidArgument,
                  "attention_gather_probe: mode {} stages {} ctas {} tiles {} (sink {})", mode,
                  stages, ctas, n_tiles, sink ? "set" : "missing");
  // One tensor map per (pool, rows, mode): encoding is a driver call; the bench calls this in a
  // loop.
  static thread_local const void* map_pool = nullptr;
  static thread_local int64_t map_rows = 0;
  static thread_local int map_mode = -1;
  static thread_local CUtensorMap map{};
  if (mode == 1 || mode == 2 || mode == 4) {
    if (map_pool != pool || map_rows != pool_rows || map_mode != mode) {
      PoolMapOptions o;
      o.l2_promotion = mode == 2 ? 0 : 256;
      V4_RETURN_IF_ERROR(mode == 4 ? encode_pool_map_rows(&map, pool, pool_rows, kHd, o)
                                   : encode_pool_map_2d(&map, pool, pool_rows, kHd, 64, o));
      map_pool = pool;
      map_rows = pool_rows;
      map_mode = mode;
    }
  }
  using K = void (*)(const __nv_bfloat16*, const int32_t*, int64_t, const CUtensorMap, uint32_t*,
                     int);
  static const K kernels[5][2] = {
      {attn_gather_probe_kernel<0, 2>, attn_gather_probe_kernel<0, 3>},
      {attn_gather_probe_kernel<1, 2>, attn_gather_probe_kernel<1, 3>},
      {attn_gather_probe_kernel<2, 2>, attn_gather_probe_kernel<2, 3>},
      {attn_gather_probe_kernel<3, 2>, attn_gather_probe_kernel<3, 3>},
      {attn_gather_probe_kernel<4, 2>, attn_gather_probe_kernel<4, 3>}};
  const K k = kernels[mode][stages - 2];
  const size_t smem = size_t(stages) * kGpTileBytes + 16 * size_t(stages) + 1024;
  V4_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
      "attention_gather_probe: smem attribute"));
  k<<<ctas, 256, smem, stream>>>(static_cast<const __nv_bfloat16*>(pool), rows, n_tiles, map,
                                 sink, check ? 1 : 0);
  return check_launch("attn_gather_probe_kernel");
}

Status sparse_attention_dec(const ops::AttentionArgs& a, int n_splits, float* workspace,
                            cudaStream_t stream, int variant) {
  if (a.n_rows <= 0) return Status::Ok();
  if (!attention_dec_supported(a.n_heads, a.head_dim))
    return errorf(ErrorCode::kInvalidArgument, "sparse_attention_dec: H={} hd={} unsupported",
                  a.n_heads, a.head_dim);
  if (n_splits < 1 || n_splits > kMaxSplits || (n_splits > 1 && !workspace))
    return errorf(ErrorCode::kInvalidArgument, "sparse_attention_dec: n_splits {} (workspace {})",
                  n_splits, workspace ? "set" : "missing");
  if (variant < 1 || variant > 14)
    return errorf(ErrorCode::kInvalidArgument, "sparse_attention_dec: variant {}", variant);
  if (a.n_rows * n_splits > int64_t(0x7fffffff) || a.n_rows * a.n_heads > int64_t(0x7fffffff) ||
      (a.n_heads + 15) / 16 > 65535)
    return errorf(ErrorCode::kInvalidArgument, "sparse_attention_dec: grid {} × {} too large",
                  a.n_rows, n_splits);
  const dim3 grid{unsigned(a.n_rows * n_splits), unsigned((a.n_heads + kHeads - 1) / kHeads), 1};
  if (variant >= 3 && a.kv_dtype == KvDtype::kFp8) variant = 2;  // no fp8 body in v3 .. v13
  if (variant >= 7 && a.kv_dtype != KvDtype::kBf16) variant = 2;  // v7 … v13: bf16 pools only
  using B = __nv_bfloat16;
  // PDL launches only for kernels that pdl_wait before any global access (attn_dec2_kernel,
  // attn_dec_kernel<T, true>); another pool format (FP8: a KeyPool specialization) takes the
  // v1 body: attn_dec_kernel<T, true> with pdl, attn_dec_kernel<T, false> without.
  const bool pdl = variant >= 2 && attn_pdl_enabled();
  if (variant >= 11) {
    // Variants 11 … 13: warp-specialized (attention_dec_ws.cuh); 2..8 splits merged inside a
    // cluster (launch_ws11), else the combine below when split.
    bool merged = false;
    if (variant == 11)
      V4_RETURN_IF_ERROR((launch_ws11<23, 26, 64, 2>(a, n_splits, workspace, grid, pdl, stream,
                                                     &merged)));
    else if (variant == 13)
      V4_RETURN_IF_ERROR((launch_ws11<25, 28, 48, 3>(a, n_splits, workspace, grid, pdl, stream,
                                                     &merged)));
    else if (variant == 14)
      V4_RETURN_IF_ERROR((launch_ws11<29, 30, 64, 2, true>(a, n_splits, workspace, grid, pdl,
                                                           stream, &merged)));
    else
      V4_RETURN_IF_ERROR((launch_ws11<24, 27, 32, 4>(a, n_splits, workspace, grid, pdl, stream,
                                                     &merged)));
    if (merged) return Status::Ok();
  } else if (variant >= 7) {
    // Variants 7 … 10: warpgroup MMA, 64 heads per CTA, 64- / 32-key tiles, operands without
    // swizzle (7 / 8) or 128-byte-swizzled (9 / 10) (attention_dec_wg.cuh); the combine below
    // when split.
    if (variant == 7)
      V4_RETURN_IF_ERROR((launch_main<19, B>(attn_dec7_kernel<64, false>, Wg7Shape<64>::kSmem,
                                              a, n_splits, workspace, grid, pdl, stream)));
    else if (variant == 8)
      V4_RETURN_IF_ERROR((launch_main<20, B>(attn_dec7_kernel<32, false>, Wg7Shape<32>::kSmem,
                                              a, n_splits, workspace, grid, pdl, stream)));
    else if (variant == 9)
      V4_RETURN_IF_ERROR((launch_main<21, B>(attn_dec7_kernel<64, true>, Wg7Shape<64>::kSmem,
                                              a, n_splits, workspace, grid, pdl, stream)));
    else
      V4_RETURN_IF_ERROR((launch_main<22, B>(attn_dec7_kernel<32, true>, Wg7Shape<32>::kSmem,
                                              a, n_splits, workspace, grid, pdl, stream)));
  } else if ((variant == 5 || variant == 6) &&
      (a.kv_dtype == KvDtype::kBf16 || a.kv_dtype == KvDtype::kF32)) {
    // Variants 5 / 6: 16 heads per CTA, preloaded key rows, key-split QK (attn_dec5_kernel; 6:
    // the lean per-tile bookkeeping); 2..16 splits merged inside a cluster when it can be
    // resident, else the combine below.
    const dim3 grid5{unsigned(a.n_rows * n_splits), unsigned((a.n_heads + kHC5 - 1) / kHC5), 1};
    const bool b16 = a.kv_dtype == KvDtype::kBf16, lean = variant == 6;
    const bool cl = n_splits >= 2 && n_splits <= kMaxCluster5 && attn_cluster_enabled() &&
                    (lean ? (b16 ? cluster5_fits<B, true>(n_splits)
                                 : cluster5_fits<float, true>(n_splits))
                          : (b16 ? cluster5_fits<B, false>(n_splits)
                                 : cluster5_fits<float, false>(n_splits)));
    const unsigned cn = unsigned(n_splits);
    if (cl) {  // cluster5_fits allowed the non-portable size and set the smem limit
      if (!lean && b16)
        V4_RETURN_IF_ERROR((launch_main<11, B>(attn_dec5_kernel<B, true, false>, kSmem5, a,
                                                n_splits, workspace, grid5, pdl, stream, cn)));
      else if (!lean)
        V4_RETURN_IF_ERROR((launch_main<12, float>(attn_dec5_kernel<float, true, false>, kSmem5,
                                                    a, n_splits, workspace, grid5, pdl, stream,
                                                    cn)));
      else if (b16)
        V4_RETURN_IF_ERROR((launch_main<15, B>(attn_dec5_kernel<B, true, true>, kSmem5, a,
                                                n_splits, workspace, grid5, pdl, stream, cn)));
      else
        V4_RETURN_IF_ERROR((launch_main<16, float>(attn_dec5_kernel<float, true, true>, kSmem5,
                                                    a, n_splits, workspace, grid5, pdl, stream,
                                                    cn)));
      return Status::Ok();
    }
    if (!lean && b16)
      V4_RETURN_IF_ERROR((launch_main<13, B>(attn_dec5_kernel<B, false, false>, kSmem5, a,
                                              n_splits, workspace, grid5, pdl, stream)));
    else if (!lean)
      V4_RETURN_IF_ERROR((launch_main<14, float>(attn_dec5_kernel<float, false, false>, kSmem5,
                                                  a, n_splits, workspace, grid5, pdl, stream)));
    else if (b16)
      V4_RETURN_IF_ERROR((launch_main<17, B>(attn_dec5_kernel<B, false, true>, kSmem5, a,
                                              n_splits, workspace, grid5, pdl, stream)));
    else
      V4_RETURN_IF_ERROR((launch_main<18, float>(attn_dec5_kernel<float, false, true>, kSmem5,
                                                  a, n_splits, workspace, grid5, pdl, stream)));
  } else if (variant >= 3 && (a.kv_dtype == KvDtype::kBf16 || a.kv_dtype == KvDtype::kF32)) {
    // Variants 3 / 4: 32 / 16 heads per CTA (attn_dec3_kernel), combine below when split.
    const int hc = variant == 3 ? 32 : 16;
    const dim3 grid3{unsigned(a.n_rows * n_splits), unsigned((a.n_heads + hc - 1) / hc), 1};
    if (a.kv_dtype == KvDtype::kBf16) {
      if (hc == 32)
        V4_RETURN_IF_ERROR((launch_main<7, B>(attn_dec3_kernel<B, 32>, smem3_bytes<32>(), a,
                                               n_splits, workspace, grid3, pdl, stream)));
      else
        V4_RETURN_IF_ERROR((launch_main<8, B>(attn_dec3_kernel<B, 16>, smem3_bytes<16>(), a,
                                               n_splits, workspace, grid3, pdl, stream)));
    } else {
      if (hc == 32)
        V4_RETURN_IF_ERROR((launch_main<9, float>(attn_dec3_kernel<float, 32>, smem3_bytes<32>(),
                                                   a, n_splits, workspace, grid3, pdl, stream)));
      else
        V4_RETURN_IF_ERROR((launch_main<10, float>(attn_dec3_kernel<float, 16>,
                                                    smem3_bytes<16>(), a, n_splits, workspace,
                                                    grid3, pdl, stream)));
    }
  } else if (a.kv_dtype == KvDtype::kBf16) {  // bf16 pools: rows staged as they are (half the bytes)
    if (variant == 2 && n_splits >= 2 && n_splits <= kMaxClusterSplits &&
        attn_cluster_enabled() && cluster_fits(n_splits)) {  // merged in the cluster: no combine
      V4_RETURN_IF_ERROR((launch_main<4, B>(attn_dec2_kernel<B, true>, kSmem2, a, n_splits,
                                             workspace, grid, pdl, stream, unsigned(n_splits))));
      return Status::Ok();
    }
    if (variant == 2)
      V4_RETURN_IF_ERROR((launch_main<0, B>(attn_dec2_kernel<B, false>, kSmem2, a, n_splits,
                                             workspace, grid, pdl, stream)));
    else
      V4_RETURN_IF_ERROR((launch_main<1, B>(attn_dec_kernel<B, false>, smem_bytes<B>(), a,
                                             n_splits, workspace, grid, false, stream)));
  } else if (a.kv_dtype == KvDtype::kFp8) {  // fp8 pools: 608-byte rows, dequantized to kb (v1 body)
    if (a.rope_dim != 64)
      return errorf(ErrorCode::kUnsupported, "sparse_attention_dec: fp8 rows need rope_dim 64 "
                    "(got {})", a.rope_dim);
    using F8 = KvFp8Row;
    if (variant == 2)
      V4_RETURN_IF_ERROR((launch_main<5, F8>(attn_dec_kernel<F8, true>, smem_bytes<F8>(), a,
                                              n_splits, workspace, grid, pdl, stream)));
    else
      V4_RETURN_IF_ERROR((launch_main<6, F8>(attn_dec_kernel<F8, false>, smem_bytes<F8>(), a,
                                              n_splits, workspace, grid, false, stream)));
  } else if (a.kv_dtype == KvDtype::kF32) {  // v2 has no f32 ring (smem): v1 + PDL combine
    if (variant == 2)
      V4_RETURN_IF_ERROR((launch_main<2, float>(attn_dec_kernel<float, true>, smem_bytes<float>(),
                                                 a, n_splits, workspace, grid, pdl, stream)));
    else
      V4_RETURN_IF_ERROR((launch_main<3, float>(attn_dec_kernel<float, false>,
                                                 smem_bytes<float>(), a, n_splits, workspace, grid,
                                                 false, stream)));
  } else {
    return errorf(ErrorCode::kUnsupported, "sparse_attention_dec: KV dtype {}",
                  kv_dtype_name(a.kv_dtype));
  }
  if (n_splits == 1) return Status::Ok();
  const dim3 cgrid{unsigned(a.n_rows * a.n_heads), unsigned(kHd / kCombThreads), 1};
  if (variant >= 3) {  // v3 … v13 (fp8 pools were sent to variant 2 above)
    if (!pdl) {
      attn_dec_combine3_kernel<<<cgrid, kCombThreads, 0, stream>>>(a, n_splits, workspace);
      return check_launch("attn_dec_combine3_kernel");
    }
    const float* ws3 = workspace;
    V4_RETURN_IF_ERROR(launch_ex(attn_dec_combine3_kernel, cgrid, dim3(kCombThreads, 1, 1), 0,
                                 stream, true, 1u, a, n_splits, ws3));
    return check_launch("attn_dec_combine3_kernel (PDL)");
  }
  if (!pdl) {
    attn_dec_combine_kernel<<<cgrid, kCombThreads, 0, stream>>>(a, n_splits, workspace);
    return check_launch("attn_dec_combine_kernel");
  }
  // PDL: the main kernel triggered at its start; the combine's griddepcontrol.wait orders it
  // after the main grid's completion (also inside graphs: a programmatic edge).
  const float* ws_c = workspace;
  V4_RETURN_IF_ERROR(launch_ex(attn_dec_combine_kernel, cgrid, dim3(kCombThreads, 1, 1), 0,
                               stream, true, 1u, a, n_splits, ws_c));
  return check_launch("attn_dec_combine_kernel (PDL)");
}

}  // namespace v4::cuda
