#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// Grouped tensor-core GEMM of the routed experts (see gmoe_mma.h).
//
// CTA = W warps × 32 weight rows (two m16 tiles per warp; W = 8 by default, 4 = the first
// version, GmoeArgs::warps); grid (output tiles, tiles of the tile list). Gate/up (SWIGLU): a
// warp owns 16 gate rows + the 16 matching up rows → 16 act columns, 16·W per CTA. Down
// (plain): 32 rows per warp, 32·W outputs per CTA. A CTA takes tile y =
// (expert e, first item m0): up to 64 items of e. Per k-tile (KT = 128 FP8 / 256 MXFP4 stored
// values) every lane copies its own 16-byte weight chunks (+ one row's scales) and the CTA the
// chunk's bf16 x rows (already in the fragment's logical k order) into a 3-stage ring; one
// barrier per k-tile; each dequantized weight chunk is multiplied into the n8 token tiles that
// hold items (warp-uniform skip of the empty ones). Rows of the x tile past the chunk are not
// copied: an mma output column depends on its own x row only, and those columns are not stored.
#include <algorithm>
#include <type_traits>

#include "ops/cuda/gmoe_mma.h"
#include "ops/cuda/wfrag.cuh"
#include "ops/cuda/wformat.cuh"
#include "ops/cuda/wgmma.cuh"

namespace v4::cuda {
namespace {

using namespace wfrag;  // NOLINT: the shared fragment helpers

constexpr int kStages = 3;
constexpr int kNTok = kGmoeChunk;                 // items per CTA (mma N, 8 n8 tiles)
constexpr int kRowsW = 32;                        // weight rows per warp
constexpr int kRowBytes = kKC * 4 * 16;           // one row's weight bytes per k-tile
constexpr int kStageW = kRowsW * kRowBytes;       // per warp per stage
constexpr int kStageWS = kStageW + kRowsW * 8;    // + scales (8 bytes per row)
constexpr size_t kSmemLimit = 227 * 1024;

template <WFormat F>
constexpr int kXRow = kKT<F> * 2 + 16;  // bytes per staged x row (+16: no ldmatrix conflicts)

// W warps per CTA (GmoeArgs::warps: 8 = default, 4 = the first version): the x ring is
// shared by all warps, so 8 warps halve the x bytes per weight row and double the warps that
// hide the mma / dequantization latency (one CTA per SM either way: 153 / 205 KB for MXFP4).
template <WFormat F, int W>
constexpr size_t smem_bytes() {
  return size_t(kStages) * kNTok * kXRow<F> + size_t(W) * kStages * kStageWS;
}

__device__ __forceinline__ int logical_in_tile(int fmt, int q) {
  return fmt == int(WFormat::kMXFP4) ? x_logical<WFormat::kMXFP4>(q)
                                     : x_logical<WFormat::kFP8Block>(q);
}

// One warp: tiles of every active expert in active order (see gmoe_tiles).
__global__ void gmoe_tiles_kernel(const int32_t* __restrict__ offset,
                                  const int32_t* __restrict__ active,
                                  const int32_t* __restrict__ active_count,
                                  int32_t* __restrict__ tile_expert,
                                  int32_t* __restrict__ tile_item,
                                  int32_t* __restrict__ tile_count) {
  const int lane = threadIdx.x;
  const int na = *active_count;
  const int per = (na + 31) / 32;
  const int a0 = min(na, lane * per), a1 = min(na, a0 + per);
  int n = 0;
  for (int i = a0; i < a1; ++i) {
    const int e = active[i];
    n += (offset[e + 1] - offset[e] + kNTok - 1) / kNTok;
  }
  int inc = n;
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inc, off);
    if (lane >= off) inc += v;
  }
  int pos = inc - n;
  for (int i = a0; i < a1; ++i) {
    const int e = active[i];
    for (int r = offset[e]; r < offset[e + 1]; r += kNTok) {
      tile_expert[pos] = e;
      tile_item[pos] = r;
      ++pos;
    }
  }
  if (lane == 31) *tile_count = inc;
}

// xb[i, kt·KT + x_logical(q)] = bf16(x[list[i] / xdiv, kt·KT + q]). A thread converts U stored
// values (MXFP4 8, FP8 4) whose logical positions pair up: x_logical(q + h + U/2) =
// x_logical(q + h) + 1 with x_logical(q + h) even (h < U/2; wfrag.cuh's map: MXFP4 i and i + 4,
// FP8 i and i + 2 land on positions 2t and 2t + 1), so it writes U/2 bf16x2 words instead of U
// scattered 2-byte stores (same values; 106 µs for 2,048 tokens × 6 rows of 4,096 with 2-byte
// stores, ncu-kernels-s19.md).
template <WFormat F>
__global__ void gmoe_gather_kernel(const float* __restrict__ x, int64_t ldx, int xdiv,
                                   const int32_t* __restrict__ list,
                                   const int32_t* __restrict__ total, int64_t P, int64_t K,
                                   __nv_bfloat16* __restrict__ xb) {
  constexpr int KT = kKT<F>;
  constexpr int U = F == WFormat::kMXFP4 ? 8 : 4, H = U / 2;
  const int64_t tot = *total;
  const int64_t n = P < tot ? P : tot;
  const int64_t units = K / U;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * units;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / units, p = (i - r * units) * U;
    const float4* src = reinterpret_cast<const float4*>(x + int64_t(list[r] / xdiv) * ldx + p);
    float v[U];
#pragma unroll
    for (int u = 0; u < U / 4; ++u) {
      const float4 f = __ldg(src + u);
      v[4 * u] = f.x;
      v[4 * u + 1] = f.y;
      v[4 * u + 2] = f.z;
      v[4 * u + 3] = f.w;
    }
    const int64_t kt = p / KT;
    const int q = int(p - kt * KT);
    __nv_bfloat16* dst = xb + r * K + kt * KT;
#pragma unroll
    for (int h = 0; h < H; ++h)
      *reinterpret_cast<__nv_bfloat162*>(dst + x_logical<F>(q + h)) =
          __floats2bfloat162_rn(v[h], v[h + H]);
  }
}
// The pairing the kernel relies on, checked for every position of a k-tile.
template <WFormat F>
constexpr bool gather_pairs_ok() {
  constexpr int U = F == WFormat::kMXFP4 ? 8 : 4, H = U / 2;
  for (int q = 0; q < kKT<F>; q += U)
    for (int h = 0; h < H; ++h)
      if (x_logical<F>(q + h) % 2 != 0 || x_logical<F>(q + h + H) != x_logical<F>(q + h) + 1)
        return false;
  return true;
}
static_assert(gather_pairs_ok<WFormat::kMXFP4>() && gather_pairs_ok<WFormat::kFP8Block>(),
              "gmoe_gather_kernel: stored values q + h and q + h + U/2 must be logical neighbours");

template <WFormat F, bool SWIGLU, int W>
__global__ void __launch_bounds__(W * 32) gmoe_mma_kernel(GmoeArgs a) {
  constexpr int kWarps = W, kThreads = W * 32;
  extern __shared__ __align__(128) unsigned char gmoe_smem[];
  constexpr int V = kV<F>, KT = kKT<F>, NJ = kNTok / 8, XROW = kXRow<F>;
  constexpr int XSTAGE = kNTok * XROW;
  constexpr int XCH = KT / 8;  // 16-byte chunks per x row per k-tile
  if (int(blockIdx.y) >= *a.tile_count) return;
  const int64_t e = a.tile_expert[blockIdx.y];
  const int64_t m0 = a.tile_item[blockIdx.y];
  const int64_t left = int64_t(a.offset[e + 1]) - m0;
  const int mc = int(left < kNTok ? left : kNTok);
  const WeightView& w = a.w;
  const int64_t K = w.k;
  const int nkt = int(K / KT);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  constexpr int kOutW = SWIGLU ? 16 : 32;  // outputs per warp
  const int64_t o0 = (int64_t(blockIdx.x) * kWarps + warp) * kOutW;
  unsigned char* xring = gmoe_smem;
  unsigned char* wring = gmoe_smem + size_t(kStages) * XSTAGE + size_t(warp) * kStages * kStageWS;

  // View row of warp row r < 32 (−1: past the outputs). SwiGLU: rows 0..15 gate, 16..31 up.
  auto view_row = [&](int r) -> int64_t {
    if constexpr (SWIGLU) {
      const int64_t o = o0 + (r & 15);
      if (o >= a.n_out) return -1;
      return r < 16 ? o : a.n_out + o;
    } else {
      const int64_t vr = o0 + r;
      return vr < a.n_out && vr < w.n ? vr : -1;
    }
  };
  const uint8_t* wp[4];
  bool wok[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t vr = view_row((i >> 1) * 16 + (i & 1) * 8 + g);
    wok[i] = vr >= 0;
    wp[i] = wrow(w, e, wok[i] ? vr : 0);
  }
  const int64_t my_vr = view_row(lane);
  const bool sok = my_vr >= 0;
  const uint8_t* sp;
  if constexpr (F == WFormat::kMXFP4)
    sp = mxfp4_scale_row(w, e, sok ? my_vr : 0);
  else
    sp = reinterpret_cast<const uint8_t*>(fp8_scale_row(w, e, sok ? my_vr : 0));
  auto chunk_off = [](int r, int q) { return r * kRowBytes + ((q ^ ((r & 1) << 2)) << 4); };
  const __nv_bfloat16* xbase = a.xb + m0 * K;

  auto issue = [&](int slot, int kt) {
    unsigned char* st = wring + slot * kStageWS;
#pragma unroll
    for (int r4 = 0; r4 < 4; ++r4) {
      const int r = (r4 >> 1) * 16 + (r4 & 1) * 8 + g;
#pragma unroll
      for (int c = 0; c < kKC; ++c) {
        const int q = c * 4 + t;
        const int64_t off = (int64_t(kt) * KT + int64_t(q) * V) / (F == WFormat::kMXFP4 ? 2 : 1);
        cp_async16(st + chunk_off(r, q), wp[r4] + off, wok[r4]);
      }
    }
    if constexpr (F == WFormat::kMXFP4)
      cp_async_small<8>(st + kStageW + lane * 8, sp + int64_t(kt) * (KT / 32), sok);
    else
      cp_async_small<4>(st + kStageW + lane * 8, sp + int64_t(kt) * 4, sok);
    unsigned char* xs = xring + slot * XSTAGE;
    for (int ch = threadIdx.x; ch < mc * XCH; ch += kThreads) {
      const int row = ch / XCH, col = ch - row * XCH;
      cp_async16(xs + row * XROW + col * 16, xbase + int64_t(row) * K + int64_t(kt) * KT + col * 8,
                 true);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nkt) issue(s, s);
    cp_async_commit();
  }
  float acc[2][NJ][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[h][j][q] = 0.f;

  for (int i = 0; i < nkt; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile i landed for every thread; everyone is done with tile i − 1
    if (i + kStages - 1 < nkt) issue((i + kStages - 1) % kStages, i + kStages - 1);
    cp_async_commit();
    const unsigned char* st = wring + (i % kStages) * kStageWS;
    const unsigned char* xs = xring + (i % kStages) * XSTAGE + (lane & 7) * XROW +
                              ((lane >> 4) * 16 + ((lane >> 3) & 1) * 8) * 2;
#pragma unroll
    for (int c = 0; c < kKC; ++c) {
      const int q = c * 4 + t;
      uint4 qw[4];
      ChunkScale<F> sc[4];
#pragma unroll
      for (int r4 = 0; r4 < 4; ++r4) {
        const int r = (r4 >> 1) * 16 + (r4 & 1) * 8 + g;
        qw[r4] = *reinterpret_cast<const uint4*>(st + chunk_off(r, q));
        sc[r4] = chunk_scale<F>(st + kStageW + r * 8, q);
      }
#pragma unroll
      for (int s2 = 0; s2 < V / 8; ++s2) {
        uint32_t A0[2][4], A1[2][4];
        dequant_steps<F>(qw[0], qw[1], s2, sc[0], sc[1], A0);
        dequant_steps<F>(qw[2], qw[3], s2, sc[2], sc[3], A1);
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          if (8 * j < mc) {  // warp-uniform: n8 tiles without items are skipped
            uint32_t b[4];
            ldmatrix_x4(b, xs + j * 8 * XROW + (c * (V / 4) + 2 * s2) * 16 * 2);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              mma_bf16(acc[0][j], A0[h][0], A0[h][1], A0[h][2], A0[h][3], b[2 * h], b[2 * h + 1]);
              mma_bf16(acc[1][j], A1[h][0], A1[h][1], A1[h][2], A1[h][3], b[2 * h], b[2 * h + 1]);
            }
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  // acc[h][j][0..1] = (warp row 16h + g, items 8j + 2t, +1); [2..3] = warp row + 8.
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    if (8 * j >= mc) continue;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int tok = 8 * j + 2 * t + (q & 1);
      if (tok >= mc) continue;
      const int64_t item = m0 + tok;
      if constexpr (SWIGLU) {
        const int64_t o = o0 + g + 8 * (q >> 1);
        if (o >= a.n_out) continue;
        int64_t col = o;
        if (a.act_format == WFormat::kMXFP4 || a.act_format == WFormat::kFP8Block) {
          const int akt = a.act_format == WFormat::kMXFP4 ? kKT<WFormat::kMXFP4>
                                                          : kKT<WFormat::kFP8Block>;
          col = (o / akt) * akt + logical_in_tile(int(a.act_format), int(o % akt));
        }
        a.act[item * a.n_out + col] =
            __float2bfloat16_rn(swiglu_f(acc[0][j][q], acc[1][j][q], a.limit));
      } else {
        float* yrow = a.y + int64_t(a.list[item]) * a.ldy;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t o = o0 + 16 * h + g + 8 * (q >> 1);
          if (o < a.n_out && o < w.n) yrow[o] = acc[h][j][q];
        }
      }
    }
  }
}

// ---- warpgroup-MMA form (GmoeArgs::wgmma, the default) ----
// The same CTA (8 warps × 32 weight rows, 64 items), weight ring and dequantization as above;
// the products run on wgmma.m64n64k16 with A = the dequantized fragments in registers (a warp's
// 16 rows of the warpgroup's 64) and B = the x tile in shared memory. Warpgroup h = warps 4h ..
// 4h + 3; per logical k16 step each warpgroup issues two wgmmas — SwiGLU: the gate rows and the
// up rows of its 64 act columns; plain: the first and the second m16 row tile of each warp —
// into two accumulators laid out as the mma.sync ones (d[4j + q] = n8 tile j, register q), so
// the epilogue is the same. The x stage holds the 64 items' k-tile as KT / 64 blocks of 64 rows
// × 128 bytes in the 128-byte-swizzle layout (chunk j of row r at j ^ (r % 8)), K-major B.
template <WFormat F>
constexpr int kXBlk = kNTok * 128;  // one 64-k block of the x stage (8 KB)
template <WFormat F>
constexpr int kXStageWg = kKT<F> / 64 * kXBlk<F>;  // MXFP4 32 KB, FP8 16 KB
template <WFormat F>
constexpr size_t smem_bytes_wg() {
  return size_t(kStages) * kXStageWg<F> + size_t(8) * kStages * kStageWS + 1024;  // + alignment
}

// One CTA's tile with N item columns (mc ≤ N: the smallest width of the variant's set holding mc,
// see gmoe_wg_kernel); FAST: MXFP4 k-tiles without a scale > 128 skip the second multiply; SPG:
// logical step pairs per wgmma commit group (0: one group per step).
template <WFormat F, bool SWIGLU, int N, bool FAST, int SPG>
__device__ __forceinline__ void gmoe_wg_tile(const GmoeArgs& a, int64_t e, int64_t m0, int mc,
                                             unsigned char* base) {
  constexpr int kThreads = 256;
  constexpr int V = kV<F>, KT = kKT<F>, NJ = N / 8;
  constexpr int XBLK = kXBlk<F>, XSTAGE = kXStageWg<F>;
  constexpr int XCH = KT / 8;  // 16-byte chunks per x row per k-tile
  const WeightView& w = a.w;
  const int64_t K = w.k;
  const int nkt = int(K / KT);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  constexpr int kOutW = SWIGLU ? 16 : 32;  // outputs per warp
  const int64_t o0 = (int64_t(blockIdx.x) * 8 + warp) * kOutW;
  unsigned char* xring = base;
  unsigned char* wring = base + size_t(kStages) * XSTAGE + size_t(warp) * kStages * kStageWS;
  const uint32_t xring_s = smem_u32(xring);

  auto view_row = [&](int r) -> int64_t {
    if constexpr (SWIGLU) {
      const int64_t o = o0 + (r & 15);
      if (o >= a.n_out) return -1;
      return r < 16 ? o : a.n_out + o;
    } else {
      const int64_t vr = o0 + r;
      return vr < a.n_out && vr < w.n ? vr : -1;
    }
  };
  const uint8_t* wp[4];
  bool wok[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t vr = view_row((i >> 1) * 16 + (i & 1) * 8 + g);
    wok[i] = vr >= 0;
    wp[i] = wrow(w, e, wok[i] ? vr : 0);
  }
  const int64_t my_vr = view_row(lane);
  const bool sok = my_vr >= 0;
  const uint8_t* sp;
  if constexpr (F == WFormat::kMXFP4)
    sp = mxfp4_scale_row(w, e, sok ? my_vr : 0);
  else
    sp = reinterpret_cast<const uint8_t*>(fp8_scale_row(w, e, sok ? my_vr : 0));
  auto chunk_off = [](int r, int q) { return r * kRowBytes + ((q ^ ((r & 1) << 2)) << 4); };
  const __nv_bfloat16* xbase = a.xb + m0 * K;

  auto issue = [&](int slot, int kt) {
    unsigned char* st = wring + slot * kStageWS;
#pragma unroll
    for (int r4 = 0; r4 < 4; ++r4) {
      const int r = (r4 >> 1) * 16 + (r4 & 1) * 8 + g;
#pragma unroll
      for (int c = 0; c < kKC; ++c) {
        const int q = c * 4 + t;
        const int64_t off = (int64_t(kt) * KT + int64_t(q) * V) / (F == WFormat::kMXFP4 ? 2 : 1);
        cp_async16(st + chunk_off(r, q), wp[r4] + off, wok[r4]);
      }
    }
    if constexpr (F == WFormat::kMXFP4)
      cp_async_small<8>(st + kStageW + lane * 8, sp + int64_t(kt) * (KT / 32), sok);
    else
      cp_async_small<4>(st + kStageW + lane * 8, sp + int64_t(kt) * 4, sok);
    unsigned char* xs = xring + slot * XSTAGE;
    // Rows ≥ mc are not copied: they only feed output columns that are not stored.
    for (int ch = threadIdx.x; ch < mc * XCH; ch += kThreads) {
      const int row = ch / XCH, col = ch - row * XCH;
      const int blk = col >> 3, j = col & 7;
      cp_async16(xs + blk * XBLK + row * 128 + ((j ^ (row & 7)) << 4),
                 xbase + int64_t(row) * K + int64_t(kt) * KT + col * 8, true);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nkt) issue(s, s);
    cp_async_commit();
  }
  float acc0[N / 2], acc1[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc0[i] = acc1[i] = 0.f;

  // One k-tile from weight slot `st` and x stage `xs` (TWO: MXFP4 scales > 128 possible in it;
  // FAST: MXFP4 through e2m1x8_bf16_t — the same bf16 operations as dequant_steps, so the same
  // bits — with the second multiply only in TWO k-tiles).
  auto ktile = [&](const unsigned char* st, uint32_t xs, auto two_c) {
    [[maybe_unused]] constexpr bool TWO = decltype(two_c)::value;
    constexpr bool kFast = F == WFormat::kMXFP4 && FAST;
#pragma unroll
    for (int c = 0; c < kKC; ++c) {
      const int q = c * 4 + t;
      uint4 qw[4];
      [[maybe_unused]] uint32_t m1[4], m2[4];
      [[maybe_unused]] ChunkScale<F> sc[4];
#pragma unroll
      for (int r4 = 0; r4 < 4; ++r4) {
        const int r = (r4 >> 1) * 16 + (r4 & 1) * 8 + g;
        qw[r4] = *reinterpret_cast<const uint4*>(st + chunk_off(r, q));
        if constexpr (kFast)
          mx_scale_t<TWO>(st[kStageW + r * 8 + q], m1[r4], m2[r4]);
        else
          sc[r4] = chunk_scale<F>(st + kStageW + r * 8, q);
      }
      // Dequantizes logical step pair s2 (steps 2·s2, 2·s2 + 1) into A0 / A1 [2][4].
      auto dequant = [&](int s2, uint32_t (&A0)[2][4], uint32_t (&A1)[2][4]) {
        if constexpr (kFast) {
          uint32_t o[4][4];
#pragma unroll
          for (int r4 = 0; r4 < 4; ++r4)
            e2m1x8_bf16_t<TWO>((&qw[r4].x)[s2], m1[r4], m2[r4], o[r4]);
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // as dequant_steps: rows g (r4 0 / 2), g + 8 (1 / 3)
            A0[h][0] = o[0][2 * h], A0[h][1] = o[1][2 * h];
            A0[h][2] = o[0][2 * h + 1], A0[h][3] = o[1][2 * h + 1];
            A1[h][0] = o[2][2 * h], A1[h][1] = o[3][2 * h];
            A1[h][2] = o[2][2 * h + 1], A1[h][3] = o[3][2 * h + 1];
          }
        } else {
          dequant_steps<F>(qw[0], qw[1], s2, sc[0], sc[1], A0);
          dequant_steps<F>(qw[2], qw[3], s2, sc[2], sc[3], A1);
        }
      };
      auto mma_step = [&](int step, const uint32_t (&a0)[4], const uint32_t (&a1)[4]) {
        const uint64_t bd =
            wgmma_desc_sw128(xs + uint32_t((step >> 2) * XBLK + (step & 3) * 32), 16, 1024);
        wgmma_rs_k16<N>(acc0, a0, bd);
        wgmma_rs_k16<N>(acc1, a1, bd);
      };
      if constexpr (SPG == 0) {
        // One commit group per logical k16 step.
#pragma unroll
        for (int s2 = 0; s2 < V / 8; ++s2) {
          uint32_t A0[2][4], A1[2][4];
          dequant(s2, A0, A1);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            wgmma_fence();
            mma_step(c * (V / 4) + 2 * s2 + h, A0[h], A1[h]);
            wgmma_commit();
            wgmma_wait<1>();  // the step before is done: its A registers are free
          }
        }
      } else {
        // SPG step pairs dequantized in one burst (independent conversions in flight), then
        // their 2·SPG steps' wgmmas as one commit group.
        static_assert((V / 8) % SPG == 0, "step pairs per group divide the chunk");
#pragma unroll
        for (int g0 = 0; g0 < V / 8; g0 += SPG) {
          uint32_t A0[SPG][2][4], A1[SPG][2][4];
#pragma unroll
          for (int u = 0; u < SPG; ++u) dequant(g0 + u, A0[u], A1[u]);
          wgmma_fence();
#pragma unroll
          for (int u = 0; u < SPG; ++u)
#pragma unroll
            for (int h = 0; h < 2; ++h) mma_step(c * (V / 4) + 2 * (g0 + u) + h, A0[u][h], A1[u][h]);
          wgmma_commit();
          wgmma_wait<1>();  // the group before is done: its A registers are free
        }
      }
    }
  };

  for (int i = 0; i < nkt; ++i) {
    cp_async_wait<kStages - 2>();
    fence_proxy_async_smem();  // this thread's x copies → the async proxy (wgmma)
    __syncthreads();  // tile i landed for every thread; every wgmma of tile i − 1 completed
    if (i + kStages - 1 < nkt) issue((i + kStages - 1) % kStages, i + kStages - 1);
    cp_async_commit();
    const unsigned char* st = wring + (i % kStages) * kStageWS;
    const uint32_t xs = xring_s + uint32_t((i % kStages) * XSTAGE);
    if constexpr (F == WFormat::kMXFP4 && FAST) {
      // Warp-uniform: the second multiply only for k-tiles with a scale > 128 in the warp's rows.
      const uint2 sw = *reinterpret_cast<const uint2*>(st + kStageW + lane * 8);
      if (__any_sync(0xffffffffu, scale_over_128(sw.x, sw.y)))
        ktile(st, xs, std::true_type{});
      else
        ktile(st, xs, std::false_type{});
    } else {
      ktile(st, xs, std::false_type{});
    }
    wgmma_wait<0>();  // tile i's x slot is refilled after the next barrier
  }
  wgmma_fence_acc(acc0);
  wgmma_fence_acc(acc1);
  cp_async_wait<0>();

  // acc0 / acc1 [4j + q] = (warp row 16h + g (+8 for q ≥ 2), items 8j + 2t (+1 for odd q)),
  // h = 0 / 1 (SwiGLU: gate / up).
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    if (8 * j >= mc) continue;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int tok = 8 * j + 2 * t + (q & 1);
      if (tok >= mc) continue;
      const int64_t item = m0 + tok;
      if constexpr (SWIGLU) {
        const int64_t o = o0 + g + 8 * (q >> 1);
        if (o >= a.n_out) continue;
        int64_t col = o;
        if (a.act_format == WFormat::kMXFP4 || a.act_format == WFormat::kFP8Block) {
          const int akt = a.act_format == WFormat::kMXFP4 ? kKT<WFormat::kMXFP4>
                                                          : kKT<WFormat::kFP8Block>;
          col = (o / akt) * akt + logical_in_tile(int(a.act_format), int(o % akt));
        }
        a.act[item * a.n_out + col] =
            __float2bfloat16_rn(swiglu_f(acc0[4 * j + q], acc1[4 * j + q], a.limit));
      } else {
        float* yrow = a.y + int64_t(a.list[item]) * a.ldy;
        const int64_t o = o0 + g + 8 * (q >> 1);
        if (o < a.n_out && o < w.n) yrow[o] = acc0[4 * j + q];
        if (o + 16 < a.n_out && o + 16 < w.n) yrow[o + 16] = acc1[4 * j + q];
      }
    }
  }
}

// NSET: the item-column widths a CTA picks from (the smallest holding its items): 0 = {64},
// 1 = {16, 64}, 2 = {16, 32, 64}, 3 = {16, 32, 48, 64}.
template <WFormat F, bool SWIGLU, int NSET, bool FAST, int SPG>
__global__ void __launch_bounds__(256, 1) gmoe_wg_kernel(GmoeArgs a) {
  extern __shared__ __align__(128) unsigned char gmoe_wg_smem[];
  if (int(blockIdx.y) >= *a.tile_count) return;
  const int64_t e = a.tile_expert[blockIdx.y];
  const int64_t m0 = a.tile_item[blockIdx.y];
  const int64_t left = int64_t(a.offset[e + 1]) - m0;
  const int mc = int(left < kNTok ? left : kNTok);
  const uint32_t raw_s = smem_u32(gmoe_wg_smem);
  unsigned char* base = gmoe_wg_smem + (((raw_s + 1023u) & ~1023u) - raw_s);
  if constexpr (NSET >= 1) {
    if (mc <= 16) return gmoe_wg_tile<F, SWIGLU, 16, FAST, SPG>(a, e, m0, mc, base);
  }
  if constexpr (NSET >= 2) {
    if (mc <= 32) return gmoe_wg_tile<F, SWIGLU, 32, FAST, SPG>(a, e, m0, mc, base);
  }
  if constexpr (NSET >= 3) {
    if (mc <= 48) return gmoe_wg_tile<F, SWIGLU, 48, FAST, SPG>(a, e, m0, mc, base);
  }
  gmoe_wg_tile<F, SWIGLU, 64, FAST, SPG>(a, e, m0, mc, base);
}

template <WFormat F, bool SWIGLU, int NSET, bool FAST, int SPG>
Status launch_wg_v(const GmoeArgs& a, int64_t max_tiles, cudaStream_t stream) {
  const int64_t per_cta = 8 * (SWIGLU ? 16 : 32);
  const dim3 grid(unsigned((a.n_out + per_cta - 1) / per_cta), unsigned(max_tiles));
  gmoe_wg_kernel<F, SWIGLU, NSET, FAST, SPG><<<grid, 256, smem_bytes_wg<F>(), stream>>>(a);
  return check_launch("gmoe_wg_kernel");
}

template <WFormat F, bool SWIGLU>
Status launch_wg(const GmoeArgs& a, int64_t max_tiles, cudaStream_t stream) {
  switch (a.wg_variant) {
    case 1: return launch_wg_v<F, SWIGLU, 1, true, 2>(a, max_tiles, stream);
    case 2: return launch_wg_v<F, SWIGLU, 0, true, 0>(a, max_tiles, stream);
    case 3: return launch_wg_v<F, SWIGLU, 2, true, 2>(a, max_tiles, stream);
    case 4: return launch_wg_v<F, SWIGLU, 0, false, 0>(a, max_tiles, stream);
    default: return launch_wg_v<F, SWIGLU, 1, true, 0>(a, max_tiles, stream);
  }
}

template <WFormat F, bool SWIGLU, int W>
Status launch(const GmoeArgs& a, int64_t max_tiles, cudaStream_t stream) {
  const int64_t per_cta = int64_t(W) * (SWIGLU ? 16 : 32);
  const dim3 grid(unsigned((a.n_out + per_cta - 1) / per_cta), unsigned(max_tiles));
  gmoe_mma_kernel<F, SWIGLU, W><<<grid, W * 32, smem_bytes<F, W>(), stream>>>(a);
  return check_launch("gmoe_mma_kernel");
}

template <WFormat F, bool SWIGLU>
Status launch_w(const GmoeArgs& a, int64_t max_tiles, cudaStream_t stream) {
  if (a.wgmma) return launch_wg<F, SWIGLU>(a, max_tiles, stream);
  return a.warps == 4 ? launch<F, SWIGLU, 4>(a, max_tiles, stream)
                      : launch<F, SWIGLU, 8>(a, max_tiles, stream);
}

template <WFormat F, int W>
Status prepare_one() {
  static_assert(smem_bytes<F, W>() <= kSmemLimit, "gmoe_mma tile fits shared memory");
  V4_CUDA_TRY(cudaFuncSetAttribute(gmoe_mma_kernel<F, true, W>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(smem_bytes<F, W>())));
  V4_CUDA_TRY(cudaFuncSetAttribute(gmoe_mma_kernel<F, false, W>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(smem_bytes<F, W>())));
  return Status::Ok();
}

template <WFormat F, int NSET, bool FAST, int SPG>
Status prepare_wg_v() {
  static_assert(smem_bytes_wg<F>() <= kSmemLimit, "gmoe_wg tile fits shared memory");
  V4_CUDA_TRY(cudaFuncSetAttribute(gmoe_wg_kernel<F, true, NSET, FAST, SPG>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(smem_bytes_wg<F>())));
  V4_CUDA_TRY(cudaFuncSetAttribute(gmoe_wg_kernel<F, false, NSET, FAST, SPG>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(smem_bytes_wg<F>())));
  return Status::Ok();
}
template <WFormat F>
Status prepare_wg() {
  V4_RETURN_IF_ERROR((prepare_wg_v<F, 1, true, 2>()));
  V4_RETURN_IF_ERROR((prepare_wg_v<F, 1, true, 0>()));
  V4_RETURN_IF_ERROR((prepare_wg_v<F, 0, true, 0>()));
  V4_RETURN_IF_ERROR((prepare_wg_v<F, 2, true, 2>()));
  return prepare_wg_v<F, 0, false, 0>();
}

int kt_of(WFormat f) {
  return f == WFormat::kMXFP4 ? kKT<WFormat::kMXFP4>
         : f == WFormat::kFP8Block ? kKT<WFormat::kFP8Block>
                                   : 0;
}

}  // namespace

int64_t gmoe_max_tiles(int64_t P, int E) {
  if (P <= 0 || E <= 0) return 0;
  return P / kNTok + std::min<int64_t>(E, P);
}

bool gmoe_supported(const WeightView& w) {
  if (!w.data || !w.scale || w.n <= 0 || w.k <= 0) return false;
  const int kt = kt_of(w.format);
  if (kt == 0 || w.k % kt) return false;
  return reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w.scale) % 8 == 0;
}

int64_t gmoe_logical_col(WFormat f, int64_t col) {
  const int kt = kt_of(f);
  if (kt == 0) return col;
  const int q = int(col % kt);
  return col - q +
         (f == WFormat::kMXFP4 ? x_logical<WFormat::kMXFP4>(q) : x_logical<WFormat::kFP8Block>(q));
}

Status gmoe_tiles(const int32_t* offset, const int32_t* active, const int32_t* active_count,
                  int32_t* tile_expert, int32_t* tile_item, int32_t* tile_count,
                  cudaStream_t stream) {
  gmoe_tiles_kernel<<<1, 32, 0, stream>>>(offset, active, active_count, tile_expert, tile_item,
                                          tile_count);
  return check_launch("gmoe_tiles_kernel");
}

Status gmoe_gather(const float* x, int64_t ldx, int xdiv, const int32_t* list,
                   const int32_t* total, int64_t P, int64_t K, WFormat f, __nv_bfloat16* xb,
                   cudaStream_t stream) {
  const int kt = kt_of(f);
  if (kt == 0 || K % kt || ldx % 4 || reinterpret_cast<uintptr_t>(x) % 16 ||
      reinterpret_cast<uintptr_t>(xb) % 4)
    return errorf(ErrorCode::kUnsupported, "gmoe_gather: {} K={} ldx={} not supported",
                  ops::wformat_name(f), K, ldx);
  if (P <= 0) return Status::Ok();
  const int64_t per = f == WFormat::kMXFP4 ? 8 : 4;  // values a thread (gmoe_gather_kernel U)
  const int grid = int(std::min<int64_t>((P * (K / per) + 255) / 256, 8192));
  if (f == WFormat::kMXFP4)
    gmoe_gather_kernel<WFormat::kMXFP4><<<grid, 256, 0, stream>>>(x, ldx, xdiv, list, total, P, K,
                                                                  xb);
  else
    gmoe_gather_kernel<WFormat::kFP8Block><<<grid, 256, 0, stream>>>(x, ldx, xdiv, list, total, P,
                                                                     K, xb);
  return check_launch("gmoe_gather_kernel");
}

Status gmoe_mma(const GmoeArgs& a, int64_t max_tiles, cudaStream_t stream) {
  if (max_tiles <= 0 || a.n_out <= 0) return Status::Ok();
  if (!gmoe_supported(a.w))
    return errorf(ErrorCode::kUnsupported, "gmoe_mma: {} view k={} not supported",
                  ops::wformat_name(a.w.format), a.w.k);
  if (max_tiles > 65535)
    return errorf(ErrorCode::kUnsupported, "gmoe_mma: {} tiles > 65535", max_tiles);
  if (a.swiglu) {
    const int akt = kt_of(a.act_format);
    if (akt && a.n_out % akt)
      return errorf(ErrorCode::kUnsupported, "gmoe_mma: act width {} not a multiple of {}",
                    a.n_out, akt);
    if (a.w.n < 2 * a.n_out)
      return errorf(ErrorCode::kInvalidArgument, "gmoe_mma: {} rows < 2·{}", a.w.n, a.n_out);
  }
  if (!a.wgmma && a.warps != 4 && a.warps != 8)
    return errorf(ErrorCode::kInvalidArgument, "gmoe_mma: warps {} (4 or 8)", a.warps);
  if (a.wgmma && (a.wg_variant < 0 || a.wg_variant > 4))
    return errorf(ErrorCode::kInvalidArgument, "gmoe_mma: wg_variant {} (0 … 4)", a.wg_variant);
  if (a.w.format == WFormat::kMXFP4)
    return a.swiglu ? launch_w<WFormat::kMXFP4, true>(a, max_tiles, stream)
                    : launch_w<WFormat::kMXFP4, false>(a, max_tiles, stream);
  return a.swiglu ? launch_w<WFormat::kFP8Block, true>(a, max_tiles, stream)
                  : launch_w<WFormat::kFP8Block, false>(a, max_tiles, stream);
}

Status gmoe_mma_prepare() {
  V4_RETURN_IF_ERROR((prepare_one<WFormat::kMXFP4, 4>()));
  V4_RETURN_IF_ERROR((prepare_one<WFormat::kMXFP4, 8>()));
  V4_RETURN_IF_ERROR((prepare_one<WFormat::kFP8Block, 4>()));
  V4_RETURN_IF_ERROR((prepare_one<WFormat::kFP8Block, 8>()));
  V4_RETURN_IF_ERROR(prepare_wg<WFormat::kMXFP4>());
  return prepare_wg<WFormat::kFP8Block>();
}

}  // namespace v4::cuda
