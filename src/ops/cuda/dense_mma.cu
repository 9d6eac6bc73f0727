#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// Dense weight GEMM on tensor cores for decode batches (see dense_mma.h).
//
// CTA = 4 warps × 32 weight rows (two m16 tiles each) = 128 output columns of y, for up to NTOK
// (32 or 64) rows of x; grid (N / 128, K splits). Per k-tile (KT = 128 FP8 / 256 MXFP4 stored
// values) every lane copies its own 16-byte weight chunks and one row's scales (wfrag.cuh
// layout, as moe_mma), and the CTA copies the NTOK × KT bf16 x tile, already in the fragment's
// logical k order (x_to_logical_bf16), into a 3-stage ring; one barrier per k-tile. A weight
// chunk is dequantized once and multiplied into NTOK / 8 n8 tiles.
#include <algorithm>

#include "ops/cuda/dense_mma.h"
#include "ops/cuda/wfrag.cuh"
#include "ops/cuda/wformat.cuh"

namespace v4::cuda {
namespace {

using namespace wfrag;  // NOLINT: the shared fragment helpers

constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kStages = 3;
constexpr int kRowsW = 32;                        // weight rows per warp
constexpr int kRowBytes = kKC * 4 * 16;           // one row's weight bytes per k-tile
constexpr int kStageW = kRowsW * kRowBytes;       // per warp per stage
constexpr int kStageWS = kStageW + kRowsW * 8;    // + scales (8 bytes per row)
constexpr int kRowsCta = kWarps * kRowsW;         // 128
constexpr int kMaxTok = 64;                       // x rows per launch
constexpr size_t kSmemLimit = 227 * 1024;

template <WFormat F>
constexpr int kXRow = kKT<F> * 2 + 16;  // bytes per staged x row (+16: no ldmatrix conflicts)

template <WFormat F, int NTOK>
constexpr size_t smem_bytes() {
  return size_t(kStages) * NTOK * kXRow<F> + size_t(kWarps) * kStages * kStageWS;
}

struct DenseArgs {
  WeightView w;
  const __nv_bfloat16* xb = nullptr;  // [M, K] logical order
  int M = 0;                          // rows of x in this launch (≤ NTOK)
  float* out = nullptr;               // split s writes out + s·split_stride
  int64_t ldo = 0;
  int64_t split_stride = 0;
  int tiles_per_split = 0;
};

// xb[m, kt·KT + x_logical(q)] = bf16(x[m, kt·KT + q]).
template <WFormat F>
__global__ void x_to_logical_bf16_kernel(const float* __restrict__ x, int64_t ldx, int64_t M,
                                         int64_t K, __nv_bfloat16* __restrict__ xb) {
  constexpr int KT = kKT<F>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < M * K;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / K, p = i - m * K;
    const int64_t kt = p / KT;
    xb[m * K + kt * KT + x_logical<F>(int(p - kt * KT))] = __float2bfloat16_rn(x[m * ldx + p]);
  }
}

// y[m, n] = Σ_s ws[s, m, n] in s order.
__global__ void split_sum_kernel(const float* __restrict__ ws, int splits, int64_t split_stride,
                                 int64_t M, int64_t N, float* __restrict__ y, int64_t ldy) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < M * N;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / N, n = i - m * N;
    float s = 0.f;
    for (int k = 0; k < splits; ++k) s += ws[k * split_stride + m * N + n];
    y[m * ldy + n] = s;
  }
}

template <WFormat F, int NTOK>
__global__ void __launch_bounds__(kThreads) dense_mma_kernel(DenseArgs a) {
  extern __shared__ __align__(128) unsigned char dense_smem[];
  constexpr int V = kV<F>, KT = kKT<F>, NJ = NTOK / 8, XROW = kXRow<F>;
  constexpr int XSTAGE = NTOK * XROW;
  constexpr int XCH = KT / 8;  // 16-byte chunks per x row per k-tile
  const WeightView& w = a.w;
  const int64_t K = w.k;
  const int nkt = int(K / KT);
  const int kt0 = int(blockIdx.y) * a.tiles_per_split;
  const int n_my = min(nkt, kt0 + a.tiles_per_split) - kt0;
  if (n_my <= 0) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t r0 = (int64_t(blockIdx.x) * kWarps + warp) * kRowsW;
  unsigned char* xring = dense_smem;
  unsigned char* wring = dense_smem + size_t(kStages) * XSTAGE + size_t(warp) * kStages * kStageWS;

  const uint8_t* wp[4];
  bool wok[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t vr = r0 + (i >> 1) * 16 + (i & 1) * 8 + g;
    wok[i] = vr < w.n;
    wp[i] = wrow(w, 0, wok[i] ? vr : 0);
  }
  const bool sok = r0 + lane < w.n;
  const uint8_t* sp;
  if constexpr (F == WFormat::kMXFP4)
    sp = mxfp4_scale_row(w, 0, sok ? r0 + lane : 0);
  else
    sp = reinterpret_cast<const uint8_t*>(fp8_scale_row(w, 0, sok ? r0 + lane : 0));
  auto chunk_off = [](int r, int q) { return r * kRowBytes + ((q ^ ((r & 1) << 2)) << 4); };

  auto issue = [&](int slot, int i) {
    const int kt = kt0 + i;
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
    for (int ch = threadIdx.x; ch < NTOK * XCH; ch += kThreads) {
      const int row = ch / XCH, col = ch - row * XCH;
      const bool ok = row < a.M;
      cp_async16(xs + row * XROW + col * 16,
                 a.xb + (ok ? int64_t(row) * K + int64_t(kt) * KT + col * 8 : 0), ok);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_my) issue(s, s);
    cp_async_commit();
  }
  float acc[2][NJ][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[h][j][e] = 0.f;

  for (int i = 0; i < n_my; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile i landed for every thread; everyone is done with tile i − 1
    if (i + kStages - 1 < n_my) issue((i + kStages - 1) % kStages, i + kStages - 1);
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

  // acc[h][j][0..1] = (weight row r0 + 16h + g, x rows 8j + 2t, +1); [2..3] = row + 8.
  float* out = a.out + int64_t(blockIdx.y) * a.split_stride;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = 8 * j + 2 * t + (e & 1);
        const int64_t n = r0 + 16 * h + g + 8 * (e >> 1);
        if (tok < a.M && n < w.n) out[int64_t(tok) * a.ldo + n] = acc[h][j][e];
      }
}

int kt_values(WFormat f) { return f == WFormat::kMXFP4 ? kKT<WFormat::kMXFP4> : kKT<WFormat::kFP8Block>; }

// K splits for an [n, K] view: enough CTAs for two per SM, each split ≥ 2 k-tiles, no empty split.
int dense_splits(int64_t n, int nkt, int num_sms, int* tiles_per_split) {
  const int64_t ctas_n = (n + kRowsCta - 1) / kRowsCta;
  int ks = int(std::clamp<int64_t>(2 * int64_t(num_sms) / std::max<int64_t>(ctas_n, 1), 1,
                                   std::max(1, nkt / 2)));
  const int tiles = (nkt + ks - 1) / ks;
  *tiles_per_split = tiles;
  return (nkt + tiles - 1) / tiles;
}

template <WFormat F, int NTOK>
Status launch(const DenseArgs& a, int splits, cudaStream_t stream) {
  const dim3 grid(unsigned((a.w.n + kRowsCta - 1) / kRowsCta), unsigned(splits));
  dense_mma_kernel<F, NTOK><<<grid, kThreads, smem_bytes<F, NTOK>(), stream>>>(a);
  return check_launch("dense_mma_kernel");
}

template <WFormat F, int NTOK>
Status prepare_one() {
  static_assert(smem_bytes<F, NTOK>() <= kSmemLimit, "dense_mma tile fits shared memory");
  V4_CUDA_TRY(cudaFuncSetAttribute(dense_mma_kernel<F, NTOK>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(smem_bytes<F, NTOK>())));
  return Status::Ok();
}

}  // namespace

bool dense_mma_supported(const WeightView& w, const float* x, int64_t ldx, int64_t M) {
  if (!w.data || !w.scale || w.n <= 0 || w.k <= 0 || M < 1 || M > kDenseMmaMaxRows) return false;
  if (w.format == WFormat::kMXFP4) {
    if (w.k % 256) return false;
  } else if (w.format == WFormat::kFP8Block) {
    if (w.k % 128) return false;
  } else {
    return false;
  }
  if (reinterpret_cast<uintptr_t>(w.data) % 16 || reinterpret_cast<uintptr_t>(w.scale) % 8)
    return false;
  return reinterpret_cast<uintptr_t>(x) % 16 == 0 && ldx % 4 == 0;
}

void dense_mma_scratch_bytes(int64_t M, int64_t n, int64_t K, int num_sms, size_t* bytes) {
  if (M <= 0 || n <= 0 || K <= 0) return;
  bytes[kSlotXBf16] = std::max(bytes[kSlotXBf16], size_t(M * K) * 2);
  // The split-K partials of one 64-row chunk: splits · n ≤ max(2·SMs, N tiles) · 128 whatever K
  // (dense_splits), so this bound — monotonic in n — also covers every smaller view a graph's
  // reserve (largest n, largest K) stands for.
  const int64_t ctas_n = (n + kRowsCta - 1) / kRowsCta;
  const size_t ws = size_t(std::min<int64_t>(M, kMaxTok)) *
                    size_t(std::max<int64_t>(2 * int64_t(num_sms), ctas_n)) * kRowsCta * 4;
  bytes[kSlotWBf16] = std::max(bytes[kSlotWBf16], ws);
}

Status dense_mma_prepare() {
  V4_RETURN_IF_ERROR((prepare_one<WFormat::kFP8Block, 32>()));
  V4_RETURN_IF_ERROR((prepare_one<WFormat::kFP8Block, 64>()));
  V4_RETURN_IF_ERROR((prepare_one<WFormat::kMXFP4, 32>()));
  return prepare_one<WFormat::kMXFP4, 64>();
}

Status dense_mma(const float* x, int64_t ldx, const WeightView& w, int64_t M, float* y,
                 int64_t ldy, const KernelContext& c) {
  if (M <= 0 || w.n <= 0) return Status::Ok();
  if (!dense_mma_supported(w, x, ldx, M))
    return errorf(ErrorCode::kUnsupported, "dense_mma: {} view k={} M={} not supported",
                  ops::wformat_name(w.format), w.k, M);
  size_t need[kNumScratchSlots] = {};
  dense_mma_scratch_bytes(M, w.n, w.k, c.num_sms, need);
  auto* xb = static_cast<__nv_bfloat16*>(c.get(kSlotXBf16, need[kSlotXBf16]));
  const bool fp4 = w.format == WFormat::kMXFP4;
  const int64_t K = w.k;
  const int grid_x = int(std::min<int64_t>((M * K + 255) / 256, 4096));
  if (fp4)
    x_to_logical_bf16_kernel<WFormat::kMXFP4><<<grid_x, 256, 0, c.stream>>>(x, ldx, M, K, xb);
  else
    x_to_logical_bf16_kernel<WFormat::kFP8Block><<<grid_x, 256, 0, c.stream>>>(x, ldx, M, K, xb);
  V4_RETURN_IF_ERROR(check_launch("x_to_logical_bf16_kernel"));
  int tiles = 0;
  const int splits = dense_splits(w.n, int(K / kt_values(w.format)), c.num_sms, &tiles);
  float* ws = splits > 1 ? static_cast<float*>(c.get(kSlotWBf16, need[kSlotWBf16])) : nullptr;
  for (int64_t m0 = 0; m0 < M; m0 += kMaxTok) {
    DenseArgs a;
    a.w = w;
    a.w.experts = 1;
    a.xb = xb + m0 * K;
    a.M = int(std::min<int64_t>(kMaxTok, M - m0));
    a.tiles_per_split = tiles;
    if (splits > 1) {
      a.out = ws;
      a.ldo = w.n;
      a.split_stride = int64_t(a.M) * w.n;
    } else {
      a.out = y + m0 * ldy;
      a.ldo = ldy;
    }
    if (fp4 && a.M <= 32)
      V4_RETURN_IF_ERROR((launch<WFormat::kMXFP4, 32>(a, splits, c.stream)));
    else if (fp4)
      V4_RETURN_IF_ERROR((launch<WFormat::kMXFP4, 64>(a, splits, c.stream)));
    else if (a.M <= 32)
      V4_RETURN_IF_ERROR((launch<WFormat::kFP8Block, 32>(a, splits, c.stream)));
    else
      V4_RETURN_IF_ERROR((launch<WFormat::kFP8Block, 64>(a, splits, c.stream)));
    if (splits > 1) {
      const int64_t total = int64_t(a.M) * w.n;
      split_sum_kernel<<<int(std::min<int64_t>((total + 255) / 256, 4096)), 256, 0, c.stream>>>(
          ws, splits, a.split_stride, a.M, w.n, y + m0 * ldy, ldy);
      V4_RETURN_IF_ERROR(check_launch("split_sum_kernel"));
    }
  }
  return Status::Ok();
}

}  // namespace v4::cuda
