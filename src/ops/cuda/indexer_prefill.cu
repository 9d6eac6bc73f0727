#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// Prefill indexer scores on warpgroup MMA (indexer.h: indexer_prefill_wg; variant 27 of
// indexer_scores_tc, auto for prefill chunks of more than kIndexerDecodeMaxRows rows).
//
// Shape: nI = 64 heads, dI = 128 (the V4 indexer), bf16 or fp8 (kFp8Index) key pools.
// CTA = 2 warpgroups = 4 query rows (kQB); warpgroup w owns rows 2w, 2w + 1. Per 64-key tile:
//   D[64 keys × 128 (2 rows × 64 heads)] = K_tile[64 × 128 dims] · Q_wᵀ
// as 8 wgmma.m64n128k16 (A = the key tile, B = the warpgroup's two Q rows, both bf16 K-major in
// the 128-byte-swizzle layout of wgmma.cuh), then per key Σ_h ReLU(D)·w_h in registers: a thread
// holds heads 8j + 2t + e of keys g and g + 8 of its warp's 16 — 16 products per (key, row),
// then two xor shuffles over t (a fixed order: the same bits for a row whatever the grid).
// Rows of one sequence's prefill chunk share the candidate list (same RowMap offset), so a key
// tile is read once for 4 rows (the WMMA kernel it replaces read it once per 4 rows too, but
// converted it with scalar code and multiplied with 16×16 WMMA fragments — ~18 TFLOP/s at
// 900K context, bench/results/bench-v4flash-20l-profile-s13.md). A group whose rows have
// different lists (a sequence boundary, or decode-shaped calls forced to this kernel) runs
// one pass per distinct list (the other rows' products are computed and discarded).
//
// Invalid candidates (−1) score 0 (zero key rows), as in the other kernels.
// Key tiles stream by cp.async through a ring (bf16: 2 stages of the bf16 tile, 100 KB a CTA;
// fp8: 3 stages of raw 128-byte code rows + the row scales, converted in shared memory to the bf16
// tile — e4m3 values are exact in bf16 — 108 KB), so 2 CTAs share an SM and one CTA's epilogue
// overlaps the other's MMA. fp8: q is quantized per head as kvfp8::index_query_fp8 (codes staged as
// their exact bf16 values, the head weight times the head's scale) and the key scale multiplies
// the head sum — the WMMA kernel's arithmetic, in another summation order. The e4m3 mode (opt-in)
// copies the codes straight into the swizzled operand (4 stages of 8 KB) and multiplies q's codes
// by them on e4m3 wgmma (m64n128k32): no conversion pass, twice the tensor rate, but the fp8
// tensor-core accumulation is not fp32 (relative errors ~1e-2 of a score against the exact sum in
// CudaIndexerPrefillWg; DeepSeek's and SGLang's fp8 indexer paths accumulate the same way).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/device_util.cuh"
#include "ops/cuda/indexer.h"
#include "ops/cuda/wfrag.cuh"
#include "ops/cuda/wgmma.cuh"

namespace v4::cuda {
namespace {

constexpr int kNI = 64, kDI = 128;  // heads, head dim
constexpr int kQB = 4;              // query rows per CTA (2 per warpgroup: wgmma N = 128)
constexpr int kTK = 64;             // keys per tile (wgmma M)
constexpr int kThreads = 256;
constexpr int kQBytes = kQB * kNI * kDI * 2;  // Q, bf16: 64 KB (32 KB per warpgroup)
constexpr int kTileBytes = kTK * kDI * 2;     // a bf16 key tile: 2 blocks of 64 rows × 128 B
constexpr int kRawFp8 = kTK * kDI;            // a raw fp8 tile: 64 code rows × 128 B

// Kernel modes: bf16 keys (bf16 wgmma); fp8 keys with the codes converted to their exact bf16
// values in shared memory (bf16 wgmma: products exact, fp32 sums — the default for fp8 keys);
// fp8 keys on e4m3 wgmma (q's codes × the key codes, no conversion, 2.7× faster, but the tensor
// cores' fp8 accumulation keeps fewer bits than fp32: variant 28 / V4_INDEXER_PREFILL_FP8=e4m3).
enum PfMode : int { kPfBf16 = 0, kPfFp8Conv = 1, kPfFp8 = 2, kPfFp8Reg = 3 };
// kPfFp8Reg (variant 29, auto's fp8 mode): fp8 codes loaded into registers one tile ahead,
// converted and stored into the other of two bf16 tile slots while the current tile's wgmma runs —
// no raw staging, one barrier a tile instead of two (2,048 × 230,400 keys: 15.2 vs 17.5 ms).

// Shared-memory layout (byte offsets from a 1024-aligned base). Q: bf16 modes 2 blocks of 64 dims
// per warpgroup (32 KB), e4m3 one block of 128 dims (16 KB).
template <int M>
struct PfLayout {
  static constexpr bool kFp8 = M != kPfBf16, kNative = M == kPfFp8;
  static constexpr int kQ = kNative ? kQBytes / 2 : kQBytes;
  static constexpr int kQWg = kQ / 2;                           // a warpgroup's B operand
  static constexpr int kStages = M == kPfBf16 || M == kPfFp8Reg ? 2 : M == kPfFp8Conv ? 3 : 4;
  static constexpr int kSlot = kFp8 && M != kPfFp8Reg ? kRawFp8 : kTileBytes;
  static constexpr int kRing = kQ;                                     // kStages slots
  static constexpr int kConv = kRing + kStages * kSlot;                // conv: the bf16 tile
  static constexpr int kScale = kConv + (M == kPfFp8Conv ? kTileBytes : 0);  // fp8: [kStages][kTK]
  static constexpr int kW = kScale + (kFp8 ? kStages * kTK * 4 : 0);  // [kQB][kNI] f32 weights
  static constexpr int kBytes = kW + kQB * kNI * 4;
  static constexpr int kAlloc = kBytes + 1024;  // + slack to align the base
};

// Byte offset of 16-byte chunk c (0..7) of row r in a 128-byte-swizzle block of 128-byte rows
// (8-row atoms of 1,024 bytes; chunk c of row r stored at chunk c ^ (r % 8)).
__device__ __forceinline__ uint32_t sw128_off(int r, int c) {
  return uint32_t(r * 128 + ((c ^ (r & 7)) << 4));
}

template <int M>
__global__ void __launch_bounds__(kThreads, 2)
    indexer_prefill_wg_kernel(ops::IndexerArgs a, float* __restrict__ scores, int64_t ld) {
  using L = PfLayout<M>;
  constexpr bool kFp8 = L::kFp8, kNative = L::kNative;
  constexpr int S = L::kStages;
  extern __shared__ __align__(128) unsigned char pf_smem_raw[];
  const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(pf_smem_raw));
  const uint32_t base_s = (raw_s + 1023u) & ~1023u;
  unsigned char* const smem = pf_smem_raw + (base_s - raw_s);
  float* const s_scale = reinterpret_cast<float*>(smem + L::kScale);
  float* const s_w = reinterpret_cast<float*>(smem + L::kW);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wq = warp & 3;  // warpgroup, warp within it
  const int g = lane >> 2, t = lane & 3;
  const int64_t t0 = int64_t(blockIdx.y) * kQB;
  const int nq = int(min(int64_t(kQB), a.n_rows - t0));
  const int gx = int(gridDim.x);
  const int64_t row_bytes = kFp8 ? kv_fp8_index_layout(kDI).bytes : int64_t(kDI) * 2;
  const unsigned char* const pool = static_cast<const unsigned char*>(a.key_pool);

  // Rows of the group share a candidate list when their map offsets are equal: one pass per
  // distinct list, led by the first row with that offset, over the rows that share it.
  // pass_rows(p): bit i set when row i reads row p's list; bit 31 when an earlier row leads it.
  int64_t offs[kQB];
#pragma unroll
  for (int i = 0; i < kQB; ++i) offs[i] = i < nq ? a.cand.offset[t0 + i] : -1;
  auto pass_rows = [&](int p) {
    const int64_t op = a.cand.offset[t0 + p];
    unsigned m = 0;
#pragma unroll
    for (int j = 0; j < kQB; ++j)
      if (j < nq && offs[j] == op) m |= (j < p ? 0x80000000u : 0u) | (1u << j);
    return m;
  };
  auto pass_count = [&](unsigned m) {  // the longest count of the rows in mask m
    int c = 0;
#pragma unroll
    for (int j = 0; j < kQB; ++j)
      if ((m >> j) & 1u) c = max(c, a.cand.count[t0 + j]);
    return c;
  };
  // A CTA with no tile below any of its passes' counts exits before staging q (uniform).
  {
    bool work = false;
    for (int p = 0; p < nq; ++p) {
      const unsigned m = pass_rows(p);
      if (!(m & 0x80000000u)) work |= int(blockIdx.x) * kTK < pass_count(m);
    }
    if (!work) return;
  }

  // Q of the 4 rows (bf16; fp8 keys: the per-head e4m3 codes — as bytes on e4m3 wgmma, as their
  // exact bf16 values with conversion) in the swizzled operand layout — warpgroup w's B operand:
  // rows n = (qi % 2)·64 + h, 2 blocks of 64 bf16 dims or 1 block of 128 codes — and the head
  // weights · nI^-1/2 · dI^-1/2 (fp8: · the head's q scale). One warp per (row, head), lane l:
  // dims 4l … 4l + 3. Rows past the call: zeros.
  const float wscale = rsqrtf(float(kNI)) * rsqrtf(float(kDI));
  for (int r = warp; r < kQB * kNI; r += kThreads / 32) {
    const int qi = r / kNI, h = r - qi * kNI;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    [[maybe_unused]] uint32_t codes = 0;  // kNative: the 4 e4m3 codes
    float wv = 0.f;
    if (qi < nq) {
      const int64_t trow = t0 + qi;
      v = __ldg(reinterpret_cast<const float4*>(a.q + (trow * kNI + h) * kDI) + lane);
      wv = __ldg(a.weights + trow * kNI + h) * wscale;
      if constexpr (kFp8) {
        float amax = fmaxf(fmaxf(kvfp8::abs_finite(v.x), kvfp8::abs_finite(v.y)),
                           fmaxf(kvfp8::abs_finite(v.z), kvfp8::abs_finite(v.w)));
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float sc = kvfp8::block_scale(amax), inv = kvfp8::index_query_inv(sc);
        if constexpr (kNative) {
          codes = uint32_t(kvfp8::e4m3_encode(kvfp8::mul_rn(v.x, inv))) |
                  uint32_t(kvfp8::e4m3_encode(kvfp8::mul_rn(v.y, inv))) << 8 |
                  uint32_t(kvfp8::e4m3_encode(kvfp8::mul_rn(v.z, inv))) << 16 |
                  uint32_t(kvfp8::e4m3_encode(kvfp8::mul_rn(v.w, inv))) << 24;
        } else {
          auto code_value = [&](float x) {
            return kvfp8::e4m3_decode(kvfp8::e4m3_encode(kvfp8::mul_rn(x, inv)));
          };
          v = make_float4(code_value(v.x), code_value(v.y), code_value(v.z), code_value(v.w));
        }
        wv *= sc;
      }
    }
    const int n = (qi & 1) * kNI + h, d0 = 4 * lane;
    if constexpr (kNative) {  // 4 codes at byte d0 of row n (chunk d0 / 16)
      const uint32_t off = uint32_t((qi >> 1) * L::kQWg) + sw128_off(n, d0 >> 4) + uint32_t(d0 & 15);
      *reinterpret_cast<uint32_t*>(smem + off) = codes;
    } else {
      const uint32_t off = uint32_t((qi >> 1) * L::kQWg + (d0 >> 6) * (L::kQWg / 2)) +
                           sw128_off(n, (d0 & 63) >> 3) + uint32_t((d0 & 7) * 2);
      *reinterpret_cast<uint2*>(smem + off) =
          make_uint2(wfrag::pack_bf16(v.x, v.y), wfrag::pack_bf16(v.z, v.w));
    }
    if (lane == 0) s_w[r] = wv;
  }

  for (int pass = 0; pass < nq; ++pass) {
    const unsigned rows_m = pass_rows(pass);
    if (rows_m & 0x80000000u) continue;  // an earlier row leads this list (uniform)
    const int maxc = pass_count(rows_m);
    const int32_t* cand = a.cand.rows + a.cand.offset[t0 + pass];
    const int tile0 = int(blockIdx.x);
    if (tile0 * kTK >= maxc) continue;  // uniform over the CTA

    // Tile `tile` into ring slot `slot` (nothing past the list: the commit group stays uniform).
    auto issue = [&](int tile, int slot) {
      const int s0 = tile * kTK;
      if (s0 < maxc) {
        if constexpr (kFp8) {
          // 64 rows × 8 pieces of 16 codes (2 a thread): plain 128-byte rows (conversion) or
          // straight into the swizzled e4m3 operand (kNative); the row's scale with piece 0.
          unsigned char* dst = smem + L::kRing + slot * L::kSlot;
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int i = tid + u * kThreads, r = i >> 3, c = i & 7;
            const int s = s0 + r;
            const int32_t cr = s < maxc ? cand[s] : -1;  // −1: past the list or an invalid entry
            const bool ok = cr >= 0;
            const unsigned char* src = pool + (ok ? int64_t(cr) : 0) * row_bytes;
            wfrag::cp_async16(dst + (kNative ? sw128_off(r, c) : uint32_t(r * 128 + c * 16)),
                              src + c * 16, ok);
            if (c == 0)
              wfrag::cp_async_small<4>(s_scale + slot * kTK + r, src + kDI, ok);
          }
        } else {
          // 64 rows × 16 pieces of 8 dims (4 a thread) into the swizzled bf16 tile.
          unsigned char* dst = smem + L::kRing + slot * L::kSlot;
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int i = tid + u * kThreads, r = i >> 4, p = i & 15;
            const int s = s0 + r;
            const int32_t cr = s < maxc ? cand[s] : -1;
            const bool ok = cr >= 0;
            wfrag::cp_async16(dst + (p >> 3) * (kTileBytes / 2) + sw128_off(r, p & 7),
                              pool + (ok ? int64_t(cr) : 0) * row_bytes + p * 16, ok);
          }
        }
      }
      wfrag::cp_async_commit();
    };

    // D = K_tile · Q_wgᵀ for the key tile at shared address `ktile`: issued and committed
    // (mma_wait completes it; mma_tile = both).
    auto mma_issue = [&](uint32_t ktile, float(&d)[64]) {
      // bf16: 8 k-steps of 16 dims (+ 32 bytes inside a 128-byte line, + a block — K: 8 KB,
      // Q: 16 KB — every 4 steps); e4m3: 4 k-steps of 32 codes (+ 32 bytes).
      const uint32_t qb = base_s + uint32_t(wg * L::kQWg);
      wgmma_fence();
      wgmma_fence_acc(d);
      if constexpr (kNative) {
#pragma unroll
        for (int kk = 0; kk < kDI / 32; ++kk)
          wgmma_ss_m64n128k32_e4m3(d, wgmma_desc_sw128(ktile + uint32_t(kk * 32), 16, 1024),
                                   wgmma_desc_sw128(qb + uint32_t(kk * 32), 16, 1024), kk > 0);
      } else {
#pragma unroll
        for (int kk = 0; kk < kDI / 16; ++kk) {
          const uint64_t ad = wgmma_desc_sw128(ktile + uint32_t((kk >> 2) * (kTileBytes / 2) + (kk & 3) * 32), 16, 1024);
          const uint64_t bd = wgmma_desc_sw128(qb + uint32_t((kk >> 2) * (L::kQWg / 2) + (kk & 3) * 32), 16, 1024);
          wgmma_ss_m64n128k16(d, ad, bd, kk > 0);
        }
      }
      wgmma_commit();
    };
    auto mma_wait = [&](float(&d)[64]) {
      wgmma_wait0();
      wgmma_fence_acc(d);
    };
    auto mma_tile = [&](uint32_t ktile, float(&d)[64]) {
      mma_issue(ktile, d);
      mma_wait(d);
    };
    // Scores of tile `tile` from D (fp8: times the key scales of ring slot `slot`).
    auto epilogue = [&](int tile, int slot, const float(&d)[64]) {
      // Σ_h ReLU · w for keys m = 16·wq + g (v[·][0]) and m + 8 (v[·][1]) of rows ql = 0, 1: this
      // thread's heads 8jj + 2t + e, then the 4 lanes t (xor 1, 2) — a reduce-scatter: lane t
      // ends with the sum of (ql = t & 1, half = t >> 1).
      float v[4];  // index 2·ql + half
#pragma unroll
      for (int ql = 0; ql < 2; ++ql) {
        const float* wr = s_w + (2 * wg + ql) * kNI + 2 * t;
        float lo = 0.f, hi = 0.f;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const int j = 8 * ql + jj;
          const float2 w = *reinterpret_cast<const float2*>(wr + 8 * jj);
          lo += fmaxf(d[4 * j], 0.f) * w.x;
          lo += fmaxf(d[4 * j + 1], 0.f) * w.y;
          hi += fmaxf(d[4 * j + 2], 0.f) * w.x;
          hi += fmaxf(d[4 * j + 3], 0.f) * w.y;
        }
        v[2 * ql] = lo;
        v[2 * ql + 1] = hi;
      }
      // xor 1: lanes with t & 1 keep ql = 1 (v[2], v[3]), the others ql = 0.
      {
        const bool odd = t & 1;
        const float k0 = odd ? v[2] : v[0], k1 = odd ? v[3] : v[1];
        const float s0 = odd ? v[0] : v[2], s1 = odd ? v[1] : v[3];
        v[0] = k0 + __shfl_xor_sync(0xffffffffu, s0, 1);
        v[1] = k1 + __shfl_xor_sync(0xffffffffu, s1, 1);
      }
      // xor 2: lanes with t & 2 keep half = 1.
      const bool up = (t >> 1) & 1;
      const float mine = (up ? v[1] : v[0]) + __shfl_xor_sync(0xffffffffu, up ? v[0] : v[1], 2);
      {
        const int ql = t & 1, m = 16 * wq + g + 8 * int(up);
        const int qi = 2 * wg + ql;
        const int s = tile * kTK + m;
        if ((rows_m >> qi) & 1u) {
          const int64_t trow = t0 + qi;
          if (s < a.cand.count[trow]) {
            float out = mine;
            if constexpr (kFp8) out *= s_scale[slot * kTK + m];
            scores[trow * ld + s] = out;
          }
        }
      }
    };

    __syncthreads();  // Q / weights staged; the previous pass is done with the ring
    if constexpr (M == kPfFp8Reg) {
      // This thread's 2 pieces (16 codes each; row r = i / 8, piece c = i % 8) of a tile and, for
      // c = 0, the rows' scales, in registers.
      uint4 raw[2];
      float rsc[2];
      auto load_tile = [&](int tile) {
        const int s0 = tile * kTK;
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int i = tid + u * kThreads, r = i >> 3, c = i & 7;
          const int s = s0 + r;
          const int32_t cr = s < maxc ? cand[s] : -1;  // −1: past the list or an invalid entry
          raw[u] = make_uint4(0u, 0u, 0u, 0u);
          rsc[u] = 0.f;
          if (cr >= 0) {
            const unsigned char* src = pool + int64_t(cr) * row_bytes;
            raw[u] = __ldg(reinterpret_cast<const uint4*>(src + c * 16));
            if (c == 0) rsc[u] = __ldg(reinterpret_cast<const float*>(src + kDI));
          }
        }
      };
      // The registers → bf16 slot `slot` (exact codes; zeros stay zeros) and its scales.
      auto store_tile = [&](int slot) {
        unsigned char* dst = smem + L::kRing + slot * L::kSlot;
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int i = tid + u * kThreads, r = i >> 3, c = i & 7;
          const uint32_t wv[4] = {raw[u].x, raw[u].y, raw[u].z, raw[u].w};
          uint32_t o[8];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const uint2 p = e4m3x4_to_bf16x4_fast(wv[k]);
            o[2 * k] = p.x;
            o[2 * k + 1] = p.y;
          }
          unsigned char* blk = dst + (c >> 2) * (kTileBytes / 2);
          *reinterpret_cast<uint4*>(blk + sw128_off(r, (2 * c) & 7)) = make_uint4(o[0], o[1], o[2], o[3]);
          *reinterpret_cast<uint4*>(blk + sw128_off(r, (2 * c + 1) & 7)) =
              make_uint4(o[4], o[5], o[6], o[7]);
          if (c == 0) s_scale[slot * kTK + r] = rsc[u];
        }
      };
      float d[64];
#pragma unroll
      for (int k = 0; k < 64; ++k) d[k] = 0.f;
      load_tile(tile0);
      store_tile(0);
      fence_proxy_async_smem();  // the tile and the Q stores → the async proxy
      load_tile(tile0 + gx);
      int i = 0;
      for (int tile = tile0; tile * kTK < maxc; tile += gx, ++i) {
        const int slot = i & 1;
        // Slot `slot` stored and fenced by every thread; every warpgroup done with tile i − 1
        // (slot ^ 1 and its scales), which the stores below overwrite.
        __syncthreads();
        mma_issue(base_s + uint32_t(L::kRing + slot * L::kSlot), d);
        if ((tile + gx) * kTK < maxc) store_tile(slot ^ 1);  // tile i + 1, loaded last iteration
        fence_proxy_async_smem();
        load_tile(tile + 2 * gx);
        mma_wait(d);
        epilogue(tile, slot, d);
      }
    } else {
#pragma unroll
      for (int p = 0; p < S - 1; ++p) issue(tile0 + p * gx, p);

      float d[64];
#pragma unroll
      for (int k = 0; k < 64; ++k) d[k] = 0.f;
      int i = 0;
      for (int tile = tile0; tile * kTK < maxc; tile += gx, ++i) {
        const int slot = i % S;
        wfrag::cp_async_wait<S - 2>();  // this thread's copies of `tile` landed
        fence_proxy_async_smem();       // … visible to wgmma (with the Q stores)
        __syncthreads();                // everyone's; every warpgroup done with tile i − 1's slot
        issue(tile + (S - 1) * gx, (i + S - 1) % S);
        uint32_t ktile = base_s + uint32_t(L::kRing + slot * L::kSlot);
        if constexpr (M == kPfFp8Conv) {
          // Codes → bf16 tile (exact): piece (r, c) = dims 16c … 16c + 15 of row r → chunks 2c, 2c + 1
          // (mod 8) of block c / 4.
          const unsigned char* raw = smem + L::kRing + slot * L::kSlot;
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int idx = tid + u * kThreads, r = idx >> 3, c = idx & 7;
            const uint4 w = *reinterpret_cast<const uint4*>(raw + r * 128 + c * 16);
            const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
            uint32_t o[8];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const uint2 p = e4m3x4_to_bf16x4_fast(wv[k]);
              o[2 * k] = p.x;
              o[2 * k + 1] = p.y;
            }
            unsigned char* blk = smem + L::kConv + (c >> 2) * (kTileBytes / 2);
            *reinterpret_cast<uint4*>(blk + sw128_off(r, (2 * c) & 7)) = make_uint4(o[0], o[1], o[2], o[3]);
            *reinterpret_cast<uint4*>(blk + sw128_off(r, (2 * c + 1) & 7)) =
                make_uint4(o[4], o[5], o[6], o[7]);
          }
          fence_proxy_async_smem();
          __syncthreads();
          ktile = base_s + uint32_t(L::kConv);
        }
        mma_tile(ktile, d);
        epilogue(tile, slot, d);
      }
      wfrag::cp_async_wait<0>();  // only empty groups can remain
    }
  }
}

bool prefill_wg_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("V4_INDEXER_PREFILL_WG");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}
template <int M>
Status launch_prefill_wg(const ops::IndexerArgs& a, int64_t max_count, float* scores, int64_t ld,
                         int n_sms, cudaStream_t stream) {
  using L = PfLayout<M>;
  static const cudaError_t attr = cudaFuncSetAttribute(
      indexer_prefill_wg_kernel<M>, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kAlloc);
  if (attr != cudaSuccess) return cuda_status(attr, "indexer_prefill_wg smem attribute");
  const int64_t groups = (a.n_rows + kQB - 1) / kQB;
  const int64_t tiles = (max_count + kTK - 1) / kTK;
  // About 4 CTAs per SM over the call (2 resident): a group's tiles split over gx CTAs when there
  // are few groups (short chunks over long contexts), one CTA per group otherwise.
  const int64_t want = 4 * int64_t(std::max(1, n_sms));
  const int64_t gx = std::max<int64_t>(1, std::min<int64_t>(tiles, (want + groups - 1) / groups));
  const dim3 grid{unsigned(gx), unsigned(groups), 1u};
  indexer_prefill_wg_kernel<M><<<grid, kThreads, L::kAlloc, stream>>>(a, scores, ld);
  return check_launch("indexer_prefill_wg_kernel");
}

}  // namespace

bool indexer_prefill_wg_supported(const ops::IndexerArgs& a) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.n_heads == kNI && a.head_dim == kDI && a.n_rows > 0 &&
         (a.n_rows + kQB - 1) / kQB <= 65535 &&
         (a.key_dtype == KvDtype::kBf16 || a.key_dtype == KvDtype::kFp8Index) && aligned16(a.q) &&
         aligned16(a.key_pool);
}

bool indexer_prefill_wg_auto_e4m3() {
  static const bool on = [] {
    const char* e = std::getenv("V4_INDEXER_PREFILL_FP8");
    return e && std::strcmp(e, "e4m3") == 0;
  }();
  return on;
}

bool indexer_prefill_wg_auto(const ops::IndexerArgs& a) {
  return a.n_rows > kIndexerDecodeMaxRows && prefill_wg_enabled() &&
         indexer_prefill_wg_supported(a);
}

Status indexer_prefill_wg(const ops::IndexerArgs& a, int64_t max_count, float* scores, int64_t ld,
                          int n_sms, cudaStream_t stream, int fp8_mode) {
  if (a.n_rows <= 0 || max_count <= 0) return Status::Ok();
  if (!indexer_prefill_wg_supported(a))
    return errorf(ErrorCode::kInvalidArgument,
                  "indexer_prefill_wg: needs nI={} dI={} (got {}, {}), bf16 or fp8 index keys, "
                  "16-byte aligned q and keys",
                  kNI, kDI, a.n_heads, a.head_dim);
  if (a.key_dtype != KvDtype::kFp8Index)
    return launch_prefill_wg<kPfBf16>(a, max_count, scores, ld, n_sms, stream);
  if (fp8_mode == kPrefillFp8E4m3)
    return launch_prefill_wg<kPfFp8>(a, max_count, scores, ld, n_sms, stream);
  if (fp8_mode == kPrefillFp8Registers)
    return launch_prefill_wg<kPfFp8Reg>(a, max_count, scores, ld, n_sms, stream);
  return launch_prefill_wg<kPfFp8Conv>(a, max_count, scores, ld, n_sms, stream);
}

}  // namespace v4::cuda
