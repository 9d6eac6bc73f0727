#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// Routed-expert grouped GEMM on tensor cores (see moe_mma.h).
//
// Work split: grid (output tiles, expert slots); a CTA of 8 warps owns one expert. Each row
// group computes two m16 row tiles × 8 tokens: SwiGLU 16 gate rows + the 16 matching up rows
// (16 outputs), plain 32 rows. KS = 1: 8 row groups of one warp over the whole K; KS = 4 / 8
// (few CTAs, e.g. batch-1 decode): 2 / 1 row groups of 4 / 8 warps that split the k-tiles and
// add their partial sums through shared memory in a fixed order.
//
// Operand layout. mma.m16n8k16 wants lane (g = lane/4, t = lane%4) to hold, per k step of 16,
// A[g][2t, 2t+1], A[g+8][2t, 2t+1], A[g][2t+8, 2t+9], A[g+8][2t+8, 2t+9]. Instead of shuffling,
// the K axis is permuted: in a k-tile of KT = 4·KC·V stored values (V values per 16 bytes:
// 16 FP8 or 32 MXFP4), lane t's c-th chunk holds the stored values
//   c·4V + t·V + 4s + w  (s < V/4, w < 4)
// and they play the logical k positions  (c·V/4 + s)·16 + {2t, 2t+1, 2t+8, 2t+9}[w].
// Each lane thus dequantizes only the 16-byte chunks it copied itself. The x rows are staged in
// shared memory in the same logical order (bf16), so the B fragments come straight from
// ldmatrix. The dot product is the same sum over k, in a different order.
//
// Pipeline: each warp streams its 32 weight rows (KC 16-byte chunks per lane and row per k-tile,
// plus the rows' scales) through a private kStages-deep cp.async ring in shared memory; a lane
// waits for its own copies and a __syncwarp publishes the scale bytes copied by other lanes. No
// block barrier inside the K loop. Rows past the view are zero-filled (cp.async src-size 0).
// Tokens: xr per pass (x rows staged, ≤ NT = 8 or 16 mma columns); an expert with more items
// runs further passes (weights re-read). Configurations: moe_mma_choose (version 1 = the old
// kernel: xr = NT = 8).
//
// Version 2 also: the ring slot of tile i − 1 refilled before tile i is computed (one more
// tile in flight), x staging with 4 loads in flight per thread, and for MXFP4 a warp-uniform
// choice per k-tile of the dequantization without the second multiply when no scale of the
// k-tile is > 128 (the same operations otherwise, so the same bits).
//
// Dequantization: MXFP4 by bit placement — e2m1·2^-126 as bf16 bits, times 2^(s−1) in bf16
// (e2m1x8_to_bf16; exact: products of powers of two, subnormals included). FP8: e4m3·scale in
// f32, rounded once to bf16 (exact for power-of-two scales, as V4's ue8m0 block scales). The
// same operands as the cuBLASLt path's dequantized copy.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "ops/cuda/moe_mma.h"
#include "ops/cuda/wfrag.cuh"
#include "ops/cuda/wformat.cuh"

namespace v4::cuda {
namespace {

using namespace wfrag;  // NOLINT: the shared fragment helpers (wfrag.cuh)

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kRowsW = 32;  // weight rows per warp (two m16 tiles)
constexpr int kRowBytes = kKC * 4 * 16;                   // one row's bytes per k-tile (128)
constexpr int kStageW = kRowsW * kRowBytes;               // weight bytes per warp per stage
constexpr int kStageS = kRowsW * 8;                       // scale bytes per warp per stage
constexpr int kStageBytes = kStageW + kStageS;            // 4352
constexpr size_t kSmemLimit = 227 * 1024;
// Two CTAs per SM when each needs at most this much (228 KB per SM, 1 KB reserved per CTA).
constexpr size_t kSmemTwoPerSm = 113 * 1024;

constexpr size_t ring_bytes(int stages) { return size_t(kWarps) * stages * kStageBytes; }
// Dynamic shared memory of a launch: `xr` staged x rows of K bf16 (+16 bytes each) + the rings.
size_t smem_bytes(int64_t K, int xr, int stages) {
  return size_t(xr) * size_t(K + 8) * 2 + ring_bytes(stages);
}

// scale_over_128, e2m1x8_bf16_t, mx_scale_t: wfrag.cuh (shared with gmoe_mma's wgmma kernel).

// Kernel template:
//   KS  warps splitting K per row group (1, 4 or 8; kWarps / KS row groups per CTA);
//   NT  token columns per pass (8 or 16: two mma n-tiles share each dequantized A fragment);
//   ST  cp.async ring depth per warp; MINB  CTAs per SM the register budget allows.
// Runtime `xr` (1 ≤ xr ≤ NT): x rows staged per pass = items per pass; B rows ≥ xr read row
// xr − 1 (only columns < mc are stored). v1 (the old kernel) = <KS ∈ {1, 4}, 8, 3, 1>, xr = 8.
template <WFormat F, bool SWIGLU, int KS, int NT, int ST, int MINB, int VER>
__global__ void __launch_bounds__(kThreads, MINB) moe_mma_kernel(MoeMmaArgs a, int xr) {
  extern __shared__ __align__(128) unsigned char moe_smem[];
  static_assert(NT == 8 || NT == 16, "8 or 16 tokens per pass");
  static_assert(ST >= 2, "ring of at least two stages");
  constexpr int V = kV<F>, KT = kKT<F>;
  constexpr int kNTiles = NT / 8;
  constexpr int kGroups = kWarps / KS;  // row groups of the CTA; KS warps split K in each
  const WeightView& w = a.w;
  const int K = int(w.k);
  const int nkt = K / KT;
  const int xs_ld = K + 8;  // bf16 elements per staged x row (+16 bytes: no ldmatrix conflicts)
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(moe_smem);
  unsigned char* ring = moe_smem + size_t(xr) * xs_ld * 2;

  if (int(blockIdx.y) >= *a.active_count) return;
  const int64_t e = a.active[blockIdx.y];
  const int64_t rbeg = a.offset[e], rcnt = a.offset[e + 1] - rbeg;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = warp / KS, kslice = warp % KS;
  const int g = lane >> 2, t = lane & 3;
  constexpr int kOutW = SWIGLU ? 16 : 32;  // outputs per row group
  const int64_t o0 = (int64_t(blockIdx.x) * kGroups + group) * kOutW;
  unsigned char* wring = ring + size_t(warp) * ST * kStageBytes;

  // View row of warp row r < 32 (−1: past the view). SwiGLU: rows 0..15 gate, 16..31 up.
  auto view_row = [&](int r) -> int64_t {
    if constexpr (SWIGLU) {
      const int64_t o = o0 + (r & 15);
      if (o >= a.n_out) return -1;
      return r < 16 ? o : a.n_out + o;
    } else {
      const int64_t vr = o0 + r;
      return vr < w.n ? vr : -1;
    }
  };
  // The lane's 4 weight rows: tile h ∈ {0,1}, half j ∈ {0,1} → row 16h + 8j + g.
  const uint8_t* wp[4];
  bool wok[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t vr = view_row((i >> 1) * 16 + (i & 1) * 8 + g);
    wok[i] = vr >= 0;
    wp[i] = wrow(w, e, wok[i] ? vr : 0);
  }
  const int64_t my_vr = view_row(lane);  // each lane copies the scales of row `lane`
  const bool sok = my_vr >= 0;
  const uint8_t* sp;
  if constexpr (F == WFormat::kMXFP4)
    sp = mxfp4_scale_row(w, e, sok ? my_vr : 0);
  else
    sp = reinterpret_cast<const uint8_t*>(fp8_scale_row(w, e, sok ? my_vr : 0));

  // Shared-memory slot of (row r, chunk q): 128-byte rows, chunks XOR-swizzled by row parity so
  // the 8 lanes of an LDS.128 phase (rows g, g+1) hit 8 distinct bank groups.
  auto chunk_off = [](int r, int q) { return r * kRowBytes + ((q ^ ((r & 1) << 2)) << 4); };
  // k-tiles of this warp: kslice, kslice + KS, ...
  const int my_nkt = nkt > kslice ? (nkt - kslice + KS - 1) / KS : 0;
  auto issue = [&](int slot, int i) {  // the warp's i-th k-tile into ring slot `slot`
    const int kt = kslice + i * KS;
    unsigned char* st = wring + slot * kStageBytes;
#pragma unroll
    for (int r4 = 0; r4 < 4; ++r4) {
      const int r = (r4 >> 1) * 16 + (r4 & 1) * 8 + g;
#pragma unroll
      for (int c = 0; c < kKC; ++c) {
        const int q = c * 4 + t;
        // stored bytes of value kt·KT + q·V: MXFP4 2 values per byte, FP8 1
        const int64_t off = (int64_t(kt) * KT + int64_t(q) * V) / (F == WFormat::kMXFP4 ? 2 : 1);
        cp_async16(st + chunk_off(r, q), wp[r4] + off, wok[r4]);
      }
    }
    if constexpr (F == WFormat::kMXFP4)
      cp_async_small<8>(st + kStageW + lane * 8, sp + int64_t(kt) * (KT / 32), sok);
    else
      cp_async_small<4>(st + kStageW + lane * 8, sp + int64_t(kt) * 4, sok);
  };

  for (int64_t m0 = 0; m0 < rcnt; m0 += xr) {
    const int mc = int(rcnt - m0 < xr ? rcnt - m0 : xr);
    const bool tile1 = NT > 8 && mc > 8;  // CTA-uniform: the second n-tile has items
#pragma unroll
    for (int s = 0; s < ST - 1; ++s) {
      if (s < my_nkt) issue(s, s);
      cp_async_commit();
    }
    __syncthreads();  // every warp is done with the previous pass's xs (and partial sums)
    // Stage this pass's x rows into xs in the logical k order (bf16): 4 stored values per unit.
    // VER 1: one unit per thread at a time; 2: 4 units' loads in flight before their stores.
    {
      const int units = K / 4, total = mc * units;
      // A unit's raw bits: SwiGLU 4 f32 values, plain 4 bf16 values in r[0..1].
      auto load_unit = [&](int i, uint32_t (&r)[4]) {
        const int row = i / units, p = (i - row * units) * 4;
        const int64_t item = rbeg + m0 + row;
        if constexpr (SWIGLU) {
          const uint4 f = __ldg(reinterpret_cast<const uint4*>(
                                    a.x + int64_t(a.list[item] / a.xdiv) * a.ldx) +
                                p / 4);
          r[0] = f.x, r[1] = f.y, r[2] = f.z, r[3] = f.w;
        } else {
          const uint2 u = __ldg(reinterpret_cast<const uint2*>(a.xb + item * K) + p / 4);
          r[0] = u.x, r[1] = u.y, r[2] = r[3] = 0u;
        }
      };
      auto store_unit = [&](int i, const uint32_t (&r)[4]) {
        const int row = i / units, p = (i - row * units) * 4;
        float v[4];
        if constexpr (SWIGLU) {
#pragma unroll
          for (int j = 0; j < 4; ++j) v[j] = __uint_as_float(r[j]);
        } else {
          v[0] = __uint_as_float(r[0] << 16), v[1] = __uint_as_float(r[0] & 0xffff0000u);
          v[2] = __uint_as_float(r[1] << 16), v[3] = __uint_as_float(r[1] & 0xffff0000u);
        }
        const int kt = p / KT, q = p - kt * KT;
        __nv_bfloat16* dst = xs + int64_t(row) * xs_ld + kt * KT;
#pragma unroll
        for (int j = 0; j < 4; ++j) dst[x_logical<F>(q + j)] = __float2bfloat16_rn(v[j]);
      };
      if constexpr (VER == 1) {
        for (int i = threadIdx.x; i < total; i += kThreads) {
          uint32_t r[4];
          load_unit(i, r);
          store_unit(i, r);
        }
      } else {
        constexpr int kB = 4;
        for (int base = threadIdx.x; base < total; base += kB * kThreads) {
          uint32_t r[kB][4] = {};
#pragma unroll
          for (int u = 0; u < kB; ++u)
            if (base + u * kThreads < total) load_unit(base + u * kThreads, r[u]);
#pragma unroll
          for (int u = 0; u < kB; ++u)
            if (base + u * kThreads < total) store_unit(base + u * kThreads, r[u]);
        }
      }
    }
    __syncthreads();

    float acc[kNTiles][2][4] = {};
    // ldmatrix row address of this lane for n-tile n: token row 8n + lane%8 (clamped to the
    // staged rows), matrix lane/8 → (step + lane/16, k half (lane/8)%2).
    const __nv_bfloat16* xrow[kNTiles];
#pragma unroll
    for (int n = 0; n < kNTiles; ++n)
      xrow[n] = xs + min(8 * n + (lane & 7), xr - 1) * xs_ld +
                ((lane >> 4) * 16 + ((lane >> 3) & 1) * 8);

    // One k-tile from ring slot `st` (TWO: MXFP4 scales > 128 possible in it).
    auto tile = [&](const unsigned char* st, int kt, auto two_c) {
      [[maybe_unused]] constexpr bool TWO = decltype(two_c)::value;
      // VER 2 MXFP4: its own multipliers (TWO: with the second multiply); otherwise the shared
      // wfrag path (the old kernel's operations exactly).
      constexpr bool kFastMx = F == WFormat::kMXFP4 && VER == 2;
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
          if constexpr (kFastMx) {
            mx_scale_t<TWO>(st[kStageW + r * 8 + q], m1[r4], m2[r4]);
          } else {
            sc[r4] = chunk_scale<F>(st + kStageW + r * 8, q);
          }
        }
#pragma unroll
        for (int s2 = 0; s2 < V / 8; ++s2) {  // two k steps per iteration
          uint32_t b[kNTiles][4];
#pragma unroll
          for (int n = 0; n < kNTiles; ++n)
            if (n == 0 || tile1) ldmatrix_x4(b[n], xrow[n] + kt * KT + (c * (V / 4) + 2 * s2) * 16);
          uint32_t A[2][2][4];  // [row tile][k step][reg]
          if constexpr (kFastMx) {
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {  // row tile h2: rows g (chunk 2·h2), g + 8
              uint32_t oa[4], ob[4];
              e2m1x8_bf16_t<TWO>((&qw[2 * h2].x)[s2], m1[2 * h2], m2[2 * h2], oa);
              e2m1x8_bf16_t<TWO>((&qw[2 * h2 + 1].x)[s2], m1[2 * h2 + 1], m2[2 * h2 + 1], ob);
#pragma unroll
              for (int h = 0; h < 2; ++h) {  // as dequant_steps
                A[h2][h][0] = oa[2 * h];
                A[h2][h][1] = ob[2 * h];
                A[h2][h][2] = oa[2 * h + 1];
                A[h2][h][3] = ob[2 * h + 1];
              }
            }
          } else {
            dequant_steps<F>(qw[0], qw[1], s2, sc[0], sc[1], A[0]);
            dequant_steps<F>(qw[2], qw[3], s2, sc[2], sc[3], A[1]);
          }
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int n = 0; n < kNTiles; ++n) {
              if (n > 0 && !tile1) continue;
              mma_bf16(acc[n][0], A[0][h][0], A[0][h][1], A[0][h][2], A[0][h][3], b[n][2 * h],
                       b[n][2 * h + 1]);
              mma_bf16(acc[n][1], A[1][h][0], A[1][h][1], A[1][h][2], A[1][h][3], b[n][2 * h],
                       b[n][2 * h + 1]);
            }
        }
      }
    };

    // Ring: tile j is cp.async group j of the pass (ST − 1 in the prologue, one per iteration),
    // in slot j % ST. Iteration i waits for tile i (≤ ST − 2 newer groups pending). Version 2
    // then refills slot (i − 1) % ST — free: every lane finished tile i − 1 before the
    // __syncwarp that ended iteration i − 1 — with tile i + ST − 1 *before* computing tile i,
    // so ST − 1 tiles are in flight during the compute (version 1 issued after it: ST − 2, none
    // for a 2-deep ring).
    for (int i = 0; i < my_nkt; ++i) {
      const int kt = kslice + i * KS;
      cp_async_wait<ST - 2>();
      __syncwarp();
      if constexpr (VER >= 2) {
        if (i + ST - 1 < my_nkt) issue((i + ST - 1) % ST, i + ST - 1);
        cp_async_commit();
      }
      const unsigned char* st = wring + (i % ST) * kStageBytes;
      if constexpr (F == WFormat::kMXFP4 && VER == 2) {
        // Warp-uniform: the slow form (second multiply) only for k-tiles with a scale > 128.
        const uint2 sw = *reinterpret_cast<const uint2*>(st + kStageW + lane * 8);
        if (__any_sync(0xffffffffu, scale_over_128(sw.x, sw.y)))
          tile(st, kt, std::true_type{});
        else
          tile(st, kt, std::false_type{});
      } else {
        tile(st, kt, std::false_type{});
      }
      __syncwarp();  // every lane is done with this slot before it is refilled
      if constexpr (VER == 1) {
        if (i + ST - 1 < my_nkt) issue((i + ST - 1) % ST, i + ST - 1);
        cp_async_commit();
      }
    }

    if constexpr (KS > 1) {
      // Split-K: slices 1..KS−1 leave their partial sums in their own ring (free after the
      // loop); slice 0 adds them in slice order (deterministic).
      static_assert(kNTiles * 8 * 32 * 4 <= ST * kStageBytes, "partials fit a warp's ring");
      cp_async_wait<0>();
      float* part = reinterpret_cast<float*>(wring);
      if (kslice > 0) {
#pragma unroll
        for (int n = 0; n < kNTiles; ++n)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < 4; ++j) part[((n * 2 + h) * 4 + j) * 32 + lane] = acc[n][h][j];
      }
      __syncthreads();
      if (kslice == 0) {
        for (int ks = 1; ks < KS; ++ks) {
          const float* op =
              reinterpret_cast<const float*>(ring + size_t(warp + ks) * ST * kStageBytes);
#pragma unroll
          for (int n = 0; n < kNTiles; ++n)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int j = 0; j < 4; ++j) acc[n][h][j] += op[((n * 2 + h) * 4 + j) * 32 + lane];
        }
      }
      __syncthreads();  // the partials are read before any ring is refilled by the next pass
    }

    // Epilogue (slice 0): acc[n][h][0..1] = (row g, tokens 8n + 2t, +1), [2..3] = (row g + 8).
    if (kslice == 0) {
#pragma unroll
      for (int n = 0; n < kNTiles; ++n)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int tok = 8 * n + 2 * t + j;
          if (tok >= mc) continue;
          const int64_t item = rbeg + m0 + tok;
          if constexpr (SWIGLU) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int64_t o = o0 + g + 8 * half;
              if (o < a.n_out)
                a.act[item * a.n_out + o] = __float2bfloat16_rn(
                    swiglu_f(acc[n][0][2 * half + j], acc[n][1][2 * half + j], a.limit));
            }
          } else {
            float* yrow = a.y + int64_t(a.list[item]) * a.ldy;
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                const int64_t o = o0 + 16 * h + g + 8 * half;
                if (o < a.n_out) yrow[o] = acc[n][h][2 * half + j];
              }
          }
        }
    }
  }
}

template <WFormat F, bool SWIGLU, int KS, int NT, int ST, int MINB, int VER>
Status launch(const MoeMmaArgs& a, int slots, int xr, cudaStream_t stream) {
  const int64_t per_cta = int64_t(kWarps / KS) * (SWIGLU ? 16 : 32);
  const dim3 grid(unsigned((a.n_out + per_cta - 1) / per_cta), unsigned(slots));
  moe_mma_kernel<F, SWIGLU, KS, NT, ST, MINB, VER>
      <<<grid, kThreads, smem_bytes(a.w.k, xr, ST), stream>>>(a, xr);
  return check_launch("moe_mma_kernel");
}

// The instantiated configurations (ks, nt, st, minb, ver): version 1 = the old kernel (split K
// or not); version 2: the same two, 16-token passes (2- or 3-deep ring), and the two-CTAs-per-SM
// forms for few staged rows.
#define V4_MOE_MMA_CONFIGS(X) \
  X(1, 8, 3, 1, 1)            \
  X(4, 8, 3, 1, 1)            \
  X(1, 8, 3, 1, 2)            \
  X(4, 8, 3, 1, 2)            \
  X(1, 16, 2, 1, 2)           \
  X(1, 16, 3, 1, 2)           \
  X(1, 8, 3, 2, 2)            \
  X(4, 8, 3, 2, 2)            \
  X(8, 8, 3, 2, 2)            \
  X(1, 8, 2, 2, 2)            \
  X(1, 8, 6, 1, 2)            \
  X(2, 8, 4, 1, 2)            \
  X(2, 8, 3, 2, 2)            \
  X(4, 8, 4, 1, 2)

template <WFormat F, bool SWIGLU>
Status launch_cfg(const MoeMmaArgs& a, int slots, const MoeMmaChoice& c, cudaStream_t stream) {
#define V4_MOE_MMA_CASE(KS, NT, ST, MINB, VER)                                       \
  if (c.ks == KS && c.nt == NT && c.st == ST && c.minb == MINB && c.version == VER) \
    return launch<F, SWIGLU, KS, NT, ST, MINB, VER>(a, slots, c.xr, stream);
  V4_MOE_MMA_CONFIGS(V4_MOE_MMA_CASE)
#undef V4_MOE_MMA_CASE
  return errorf(ErrorCode::kInvalidArgument,
                "moe_mma: no kernel for ks={} nt={} st={} minb={} version={}", c.ks, c.nt, c.st,
                c.minb, c.version);
}

template <WFormat F, bool SWIGLU>
int ctas_per_sm_cfg(const MoeMmaArgs& a, const MoeMmaChoice& c) {
  int n = -1;
#define V4_MOE_MMA_OCC(KS, NT, ST, MINB, VER)                                               \
  if (c.ks == KS && c.nt == NT && c.st == ST && c.minb == MINB && c.version == VER) {      \
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(                                     \
            &n, moe_mma_kernel<F, SWIGLU, KS, NT, ST, MINB, VER>, kThreads,                \
            smem_bytes(a.w.k, c.xr, ST)) != cudaSuccess)                                   \
      return -1;                                                                           \
    return n;                                                                              \
  }
  V4_MOE_MMA_CONFIGS(V4_MOE_MMA_OCC)
#undef V4_MOE_MMA_OCC
  return n;
}

template <WFormat F>
Status prepare_format() {
  const int lim = int(kSmemLimit);
  // Every form needs most of an SM's shared memory (the two-CTAs-per-SM forms: two × ≤ 113 KB):
  // ask for the largest carveout, so the driver does not pick one that holds a single CTA.
#define V4_MOE_MMA_PREP(KS, NT, ST, MINB, VER)                                               \
  V4_CUDA_TRY(cudaFuncSetAttribute(moe_mma_kernel<F, true, KS, NT, ST, MINB, VER>,           \
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, lim));       \
  V4_CUDA_TRY(cudaFuncSetAttribute(moe_mma_kernel<F, false, KS, NT, ST, MINB, VER>,          \
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, lim));       \
  V4_CUDA_TRY(cudaFuncSetAttribute(moe_mma_kernel<F, true, KS, NT, ST, MINB, VER>,           \
                                   cudaFuncAttributePreferredSharedMemoryCarveout,           \
                                   int(cudaSharedmemCarveoutMaxShared)));                    \
  V4_CUDA_TRY(cudaFuncSetAttribute(moe_mma_kernel<F, false, KS, NT, ST, MINB, VER>,          \
                                   cudaFuncAttributePreferredSharedMemoryCarveout,           \
                                   int(cudaSharedmemCarveoutMaxShared)));
  V4_MOE_MMA_CONFIGS(V4_MOE_MMA_PREP)
#undef V4_MOE_MMA_PREP
  return Status::Ok();
}

int k_tiles(const WeightView& w) {
  return int(w.k / (w.format == WFormat::kMXFP4 ? kKT<WFormat::kMXFP4> : kKT<WFormat::kFP8Block>));
}

}  // namespace

bool moe_mma_supported(const WeightView& w) {
  if (!w.data || !w.scale || w.n <= 0 || w.k <= 0) return false;
  if (w.format == WFormat::kMXFP4) {
    if (w.k % 256) return false;
  } else if (w.format == WFormat::kFP8Block) {
    if (w.k % 128) return false;
  } else {
    return false;
  }
  if (reinterpret_cast<uintptr_t>(w.data) % 16 || reinterpret_cast<uintptr_t>(w.scale) % 8)
    return false;
  return smem_bytes(w.k, 8, 3) <= kSmemLimit;
}

Status moe_mma_prepare() {
  V4_RETURN_IF_ERROR(prepare_format<WFormat::kMXFP4>());
  return prepare_format<WFormat::kFP8Block>();
}

// A/B of the small-batch configuration (issue 7, batch-1 decode): V4_MOE_MMA_SMALL="ks/nt/st/
// minb/version" (any non-digit separates) replaces moe_mma_choose's pick for calls of 1..8 tokens (x rows staged = tokens);
// unset or malformed: nothing replaced. Read once.
const MoeMmaChoice* small_override() {
  static const std::optional<MoeMmaChoice> o = []() -> std::optional<MoeMmaChoice> {
    const char* e = std::getenv("V4_MOE_MMA_SMALL");
    MoeMmaChoice c;
    if (!e) return std::nullopt;
    std::string v = e;  // any non-digit separates the five numbers ("4,8,3,1,2", "4/8/3/1/2")
    for (char& ch : v)
      if (ch < '0' || ch > '9') ch = ' ';
    if (std::sscanf(v.c_str(), "%d %d %d %d %d", &c.ks, &c.nt, &c.st, &c.minb, &c.version) != 5)
      return std::nullopt;
    return c;
  }();
  return o ? &*o : nullptr;
}

MoeMmaChoice moe_mma_choose(const MoeMmaArgs& a, int slots, int num_sms) {
  MoeMmaChoice c;
  if (const MoeMmaChoice* f = small_override(); f && a.tokens >= 1 && a.tokens <= 8) {
    c = *f;
    c.xr = int(std::min<int64_t>(a.tokens, c.nt));
    return c;
  }
  const int64_t K = a.w.k;
  const int nkt = k_tiles(a.w);
  const int outw = a.swiglu ? 16 : 32;
  auto ctas = [&](int ks) {
    const int64_t per_cta = int64_t(kWarps / ks) * outw;
    return (a.n_out + per_cta - 1) / per_cta * int64_t(slots);
  };
  // v1: 8 tokens per pass; 4 warps split K when the grid would not fill the GPU twice.
  c.ks = ctas(1) < 2 * int64_t(num_sms) && nkt >= 8 ? 4 : 1;
  c.version = a.version < 2 ? 1 : 2;
  if (c.version == 1) return c;
  const int64_t S = a.tokens > 0 ? a.tokens : int64_t(1) << 30;  // unknown: many
  if (S <= 8) {
    // At most S items per expert (top-k picks distinct experts; more only with repeated ids,
    // which run further passes): stage S x rows. Small enough for two CTAs per SM (batch-1
    // decode): more CTAs resident, and the K split chosen for the fuller last wave.
    c.xr = int(S);
    if (smem_bytes(K, c.xr, 3) > kSmemTwoPerSm) return c;
    c.minb = 2;
    const int64_t cap = 2 * int64_t(num_sms);
    if (ctas(1) >= 2 * cap) {
      c.ks = 1;
      return c;
    }
    auto fill = [&](int ks) {
      const int64_t n = ctas(ks), waves = (n + cap - 1) / cap;
      return double(n) / double(waves * cap);
    };
    // Below 8 tokens 4 K slices whatever the fill (moe.cu runs this form at S = 1 only): at
    // batch 1 (V4-Flash, 6 experts) 8 slices fill the last wave better, but each warp then has
    // 2 k-tiles and the per-CTA fixed cost dominates (served 20-layer step: ks 4 4.91–4.96 ms,
    // ks 8 5.04–5.10, the old kernel v1 4.99–5.03; bench-v4flash-20l-moe-small-s28.md).
    // 8 tokens keep the fill rule.
    c.ks = S < 8 ? (nkt >= 8 ? 4 : 1)
                 : nkt >= 16 && fill(8) > fill(4) + 0.05 ? 8 : nkt >= 8 ? 4 : 1;
    return c;
  }
  // Version 3 (experimental, A/B): 2 ≤ S ≤ 128 with many CTAs — two CTAs per SM with 2-deep
  // rings (16 warps per SM, the same bytes in flight as 8 warps × 2 stages) and 8 staged rows,
  // or 4 where 8 do not fit (K = 4096: experts with > 4 items take further passes).
  if (a.version >= 3 && S >= 2 && S <= 128 && ctas(1) >= 2 * int64_t(num_sms)) {
    for (int xr : {8, 4}) {
      if (smem_bytes(K, xr, 2) <= kSmemTwoPerSm) {
        c.ks = 1, c.nt = 8, c.st = 2, c.minb = 2, c.xr = xr;
        return c;
      }
    }
  }
  // S > 8: 16 tokens per pass (an expert with 9..16 items reads its weights once) where the
  // x tile leaves room for the 3-deep ring (K ≤ 2048: down). The 2-deep ring that fits at
  // K = 4096 (gate/up) only in version 3, and only when the mean items per expert make 9+ item
  // experts common (P ≥ 4·slots; saves ~13% of the passes at S = 256, but halves the bytes in
  // flight per warp).
  if (ctas(1) < 2 * int64_t(num_sms)) return c;  // few CTAs: v1's split K
  const bool st3 = smem_bytes(K, 16, 3) <= kSmemLimit;
  const bool st2 = smem_bytes(K, 16, 2) <= kSmemLimit;
  const int64_t pairs = a.tokens > 0 ? a.tokens * a.xdiv : 0;
  if (st3) {
    c.nt = 16, c.xr = 16, c.st = 3, c.ks = 1;
  } else if (a.version >= 3 && st2 && pairs >= 4 * int64_t(slots) && slots > 0) {
    c.nt = 16, c.xr = 16, c.st = 2, c.ks = 1;
  }
  return c;
}

Status moe_mma_run(const MoeMmaArgs& a, int slots, const MoeMmaChoice& ch,
                   cudaStream_t stream) {
  if (slots <= 0 || a.n_out <= 0) return Status::Ok();
  if (!moe_mma_supported(a.w))
    return errorf(ErrorCode::kUnsupported, "moe_mma: {} view k={} not supported",
                  ops::wformat_name(a.w.format), a.w.k);
  const MoeMmaChoice& c = ch;
  const size_t smem = smem_bytes(a.w.k, c.xr, c.st);
  if (c.xr < 1 || c.xr > c.nt || smem > kSmemLimit || (c.minb == 2 && smem > kSmemTwoPerSm))
    return errorf(ErrorCode::kInvalidArgument,
                  "moe_mma: configuration xr={} nt={} st={} minb={} does not fit (K={})", c.xr,
                  c.nt, c.st, c.minb, a.w.k);
  if (a.w.format == WFormat::kMXFP4)
    return a.swiglu ? launch_cfg<WFormat::kMXFP4, true>(a, slots, c, stream)
                    : launch_cfg<WFormat::kMXFP4, false>(a, slots, c, stream);
  return a.swiglu ? launch_cfg<WFormat::kFP8Block, true>(a, slots, c, stream)
                  : launch_cfg<WFormat::kFP8Block, false>(a, slots, c, stream);
}

int moe_mma_ctas_per_sm(const MoeMmaArgs& a, const MoeMmaChoice& c) {
  if (a.w.format == WFormat::kMXFP4)
    return a.swiglu ? ctas_per_sm_cfg<WFormat::kMXFP4, true>(a, c)
                    : ctas_per_sm_cfg<WFormat::kMXFP4, false>(a, c);
  if (a.w.format == WFormat::kFP8Block)
    return a.swiglu ? ctas_per_sm_cfg<WFormat::kFP8Block, true>(a, c)
                    : ctas_per_sm_cfg<WFormat::kFP8Block, false>(a, c);
  return -1;
}

Status moe_mma(const MoeMmaArgs& a, int slots, int num_sms, cudaStream_t stream) {
  if (slots <= 0 || a.n_out <= 0) return Status::Ok();
  if (!moe_mma_supported(a.w))
    return errorf(ErrorCode::kUnsupported, "moe_mma: {} view k={} not supported",
                  ops::wformat_name(a.w.format), a.w.k);
  return moe_mma_run(a, slots, moe_mma_choose(a, slots, num_sms), stream);
}

}  // namespace v4::cuda
