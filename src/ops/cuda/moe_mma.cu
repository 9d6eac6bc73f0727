#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// Routed-expert grouped GEMM on tensor cores (see moe_mma.h).
//
// Work split: grid (output tiles, expert slots); a CTA of 8 warps owns one expert. Each row
// group computes two m16 row tiles × 8 tokens: SwiGLU 16 gate rows + the 16 matching up rows
// (16 outputs), plain 32 rows. KS = 1: 8 row groups of one warp over the whole K; KS = 4 (few
// CTAs, e.g. batch-1 decode): 2 row groups of 4 warps that split the k-tiles and add their
// partial sums through shared memory in a fixed order.
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
// Tokens: 8 per pass; an expert with more than 8 items runs further passes (weights re-read).
//
// Dequantization: MXFP4 by bit placement — e2m1·2^-126 as bf16 bits, times 2^(s−1) in bf16
// (e2m1x8_to_bf16; exact: products of powers of two, subnormals included). FP8: e4m3·scale in
// f32, rounded once to bf16 (exact for power-of-two scales, as V4's ue8m0 block scales). The
// same operands as the cuBLASLt path's dequantized copy.
#include <algorithm>

#include "ops/cuda/moe_mma.h"
#include "ops/cuda/wfrag.cuh"
#include "ops/cuda/wformat.cuh"

namespace v4::cuda {
namespace {

using namespace wfrag;  // NOLINT: the shared fragment helpers (wfrag.cuh)

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kNT = 8;      // tokens per pass (mma N)
constexpr int kStages = 3;  // cp.async ring depth per warp
constexpr int kRowsW = 32;  // weight rows per warp (two m16 tiles)
constexpr int kRowBytes = kKC * 4 * 16;                   // one row's bytes per k-tile (128)
constexpr int kStageW = kRowsW * kRowBytes;               // weight bytes per warp per stage
constexpr int kStageS = kRowsW * 8;                       // scale bytes per warp per stage
constexpr int kStageBytes = kStageW + kStageS;            // 4352
constexpr int kRingBytes = kWarps * kStages * kStageBytes;
constexpr size_t kSmemLimit = 227 * 1024;

template <WFormat F, bool SWIGLU, int KS>
__global__ void __launch_bounds__(kThreads, 1) moe_mma_kernel(MoeMmaArgs a) {
  extern __shared__ __align__(128) unsigned char moe_smem[];
  constexpr int V = kV<F>, KT = kKT<F>;
  constexpr int kGroups = kWarps / KS;  // row groups of the CTA; KS warps split K in each
  const WeightView& w = a.w;
  const int K = int(w.k);
  const int nkt = K / KT;
  const int xs_ld = K + 8;  // bf16 elements per staged x row (+16 bytes: no ldmatrix conflicts)
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(moe_smem);
  unsigned char* ring = moe_smem + size_t(kNT) * xs_ld * 2;

  if (int(blockIdx.y) >= *a.active_count) return;
  const int64_t e = a.active[blockIdx.y];
  const int64_t rbeg = a.offset[e], rcnt = a.offset[e + 1] - rbeg;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = warp / KS, kslice = warp % KS;
  const int g = lane >> 2, t = lane & 3;
  constexpr int kOutW = SWIGLU ? 16 : 32;  // outputs per row group
  const int64_t o0 = (int64_t(blockIdx.x) * kGroups + group) * kOutW;
  unsigned char* wring = ring + size_t(warp) * kStages * kStageBytes;

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

  for (int64_t m0 = 0; m0 < rcnt; m0 += kNT) {
    const int mc = int(rcnt - m0 < kNT ? rcnt - m0 : kNT);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < my_nkt) issue(s, s);
      cp_async_commit();
    }
    __syncthreads();  // every warp is done with the previous pass's xs (and partial sums)
    // Stage this pass's x rows into xs in the logical k order (bf16): 4 stored values per unit.
    {
      const int units = K / 4;
      for (int i = threadIdx.x; i < mc * units; i += kThreads) {
        const int row = i / units, p = (i - row * units) * 4;
        const int64_t item = rbeg + m0 + row;
        float v[4];
        if constexpr (SWIGLU) {
          const float4 f = __ldg(reinterpret_cast<const float4*>(
                                     a.x + int64_t(a.list[item] / a.xdiv) * a.ldx) +
                                 p / 4);
          v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
        } else {
          const uint2 u = __ldg(reinterpret_cast<const uint2*>(a.xb + item * K) + p / 4);
          v[0] = __uint_as_float(u.x << 16), v[1] = __uint_as_float(u.x & 0xffff0000u);
          v[2] = __uint_as_float(u.y << 16), v[3] = __uint_as_float(u.y & 0xffff0000u);
        }
        const int kt = p / KT, q = p - kt * KT;
        __nv_bfloat16* dst = xs + int64_t(row) * xs_ld + kt * KT;
#pragma unroll
        for (int j = 0; j < 4; ++j) dst[x_logical<F>(q + j)] = __float2bfloat16_rn(v[j]);
      }
    }
    __syncthreads();

    float acc[2][4] = {};
    // ldmatrix row address of this lane: token row lane%8, matrix lane/8 → (step + lane/16,
    // k half (lane/8)%2).
    const __nv_bfloat16* xrow =
        xs + (lane & 7) * xs_ld + ((lane >> 4) * 16 + ((lane >> 3) & 1) * 8);
    for (int i = 0; i < my_nkt; ++i) {
      const int kt = kslice + i * KS;
      cp_async_wait<kStages - 2>();
      __syncwarp();
      const unsigned char* st = wring + (i % kStages) * kStageBytes;
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
        for (int s2 = 0; s2 < V / 8; ++s2) {  // two k steps per iteration
          uint32_t b[4];
          ldmatrix_x4(b, xrow + kt * KT + (c * (V / 4) + 2 * s2) * 16);
          uint32_t A0[2][4], A1[2][4];
          dequant_steps<F>(qw[0], qw[1], s2, sc[0], sc[1], A0);
          dequant_steps<F>(qw[2], qw[3], s2, sc[2], sc[3], A1);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            mma_bf16(acc[0], A0[h][0], A0[h][1], A0[h][2], A0[h][3], b[2 * h], b[2 * h + 1]);
            mma_bf16(acc[1], A1[h][0], A1[h][1], A1[h][2], A1[h][3], b[2 * h], b[2 * h + 1]);
          }
        }
      }
      __syncwarp();  // every lane is done with this slot before it is refilled
      if (i + kStages - 1 < my_nkt) issue((i + kStages - 1) % kStages, i + kStages - 1);
      cp_async_commit();
    }

    if constexpr (KS > 1) {
      // Split-K: slices 1..KS−1 leave their partial sums in their own ring (free after the
      // loop); slice 0 adds them in slice order (deterministic).
      cp_async_wait<0>();
      float* part = reinterpret_cast<float*>(wring);
      if (kslice > 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int j = 0; j < 4; ++j) part[(h * 4 + j) * 32 + lane] = acc[h][j];
      }
      __syncthreads();
      if (kslice == 0) {
        for (int ks = 1; ks < KS; ++ks) {
          const float* op = reinterpret_cast<const float*>(
              ring + size_t(warp + ks) * kStages * kStageBytes);
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[h][j] += op[(h * 4 + j) * 32 + lane];
        }
      }
      __syncthreads();  // the partials are read before any ring is refilled by the next pass
    }

    // Epilogue (slice 0): acc[h][0..1] = (row g, tokens 2t, 2t+1), acc[h][2..3] = (row g + 8).
    if (kslice == 0) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int tok = 2 * t + j;
        if (tok >= mc) continue;
        const int64_t item = rbeg + m0 + tok;
        if constexpr (SWIGLU) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int64_t o = o0 + g + 8 * half;
            if (o < a.n_out)
              a.act[item * a.n_out + o] = __float2bfloat16_rn(
                  swiglu_f(acc[0][2 * half + j], acc[1][2 * half + j], a.limit));
          }
        } else {
          float* yrow = a.y + int64_t(a.list[item]) * a.ldy;
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int64_t o = o0 + 16 * h + g + 8 * half;
              if (o < a.n_out) yrow[o] = acc[h][2 * half + j];
            }
        }
      }
    }
  }
}

size_t smem_bytes(int64_t K) { return size_t(kNT) * size_t(K + 8) * 2 + size_t(kRingBytes); }

template <WFormat F, bool SWIGLU, int KS>
Status launch(const MoeMmaArgs& a, int slots, cudaStream_t stream) {
  const int64_t per_cta = int64_t(kWarps / KS) * (SWIGLU ? 16 : 32);
  const dim3 grid(unsigned((a.n_out + per_cta - 1) / per_cta), unsigned(slots));
  moe_mma_kernel<F, SWIGLU, KS><<<grid, kThreads, smem_bytes(a.w.k), stream>>>(a);
  return check_launch("moe_mma_kernel");
}

template <WFormat F, int KS>
Status prepare_one() {
  const int lim = int(kSmemLimit);
  V4_CUDA_TRY(cudaFuncSetAttribute(moe_mma_kernel<F, true, KS>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, lim));
  V4_CUDA_TRY(cudaFuncSetAttribute(moe_mma_kernel<F, false, KS>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, lim));
  return Status::Ok();
}

template <WFormat F>
Status dispatch(const MoeMmaArgs& a, int slots, int ks, cudaStream_t stream) {
  if (ks >= 4)
    return a.swiglu ? launch<F, true, 4>(a, slots, stream) : launch<F, false, 4>(a, slots, stream);
  return a.swiglu ? launch<F, true, 1>(a, slots, stream) : launch<F, false, 1>(a, slots, stream);
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
  return smem_bytes(w.k) <= kSmemLimit;
}

Status moe_mma_prepare() {
  V4_RETURN_IF_ERROR((prepare_one<WFormat::kMXFP4, 1>()));
  V4_RETURN_IF_ERROR((prepare_one<WFormat::kMXFP4, 4>()));
  V4_RETURN_IF_ERROR((prepare_one<WFormat::kFP8Block, 1>()));
  return prepare_one<WFormat::kFP8Block, 4>();
}

Status moe_mma(const MoeMmaArgs& a, int slots, int num_sms, cudaStream_t stream) {
  if (slots <= 0 || a.n_out <= 0) return Status::Ok();
  if (!moe_mma_supported(a.w))
    return errorf(ErrorCode::kUnsupported, "moe_mma: {} view k={} not supported",
                  ops::wformat_name(a.w.format), a.w.k);
  // Split K over 4 warps of a CTA when the grid would not fill the GPU twice (few experts,
  // decode at small batch), so more weight bytes are in flight.
  const int64_t per_cta = int64_t(kWarps) * (a.swiglu ? 16 : 32);
  const int64_t ctas = (a.n_out + per_cta - 1) / per_cta * int64_t(slots);
  const int nkt = int(a.w.k / (a.w.format == WFormat::kMXFP4 ? kKT<WFormat::kMXFP4>
                                                               : kKT<WFormat::kFP8Block>));
  const int ks = ctas < 2 * int64_t(num_sms) && nkt >= 8 ? 4 : 1;
  if (a.w.format == WFormat::kMXFP4) return dispatch<WFormat::kMXFP4>(a, slots, ks, stream);
  return dispatch<WFormat::kFP8Block>(a, slots, ks, stream);
}

}  // namespace v4::cuda
