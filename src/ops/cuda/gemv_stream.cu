#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// Streaming GEMV over native weight bytes (see gemv_stream.h).
#include <algorithm>
#include <cstdlib>

#include "ops/cuda/gemv_stream.h"
#include "ops/cuda/wformat.cuh"

namespace v4::cuda {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kRows = 4;  // weight rows per warp

// Values per 16 stored bytes (one lane's share of a chunk).
template <WFormat F>
constexpr int kVals = F == WFormat::kF32        ? 4
                      : F == WFormat::kBF16     ? 8
                      : F == WFormat::kFP8Block ? 16
                                                : 32;

int vals16(WFormat f) {
  switch (f) {
    case WFormat::kF32:
      return 4;
    case WFormat::kBF16:
      return 8;
    case WFormat::kFP8Block:
      return 16;
    case WFormat::kMXFP4:
      return 32;
  }
  return 4;
}

// 16 weight bytes: read-only path, not allocated in L1 (each byte is used once; L1 keeps x).
__device__ __forceinline__ uint4 ld_weights16(const uint8_t* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

// Values 4g .. 4g+3 of 16 stored bytes as f32, in k order (FP8: e4m3 values, unscaled; MXFP4:
// e2m1·2^-14, unscaled; wformat.cuh). All conversions exact. g < V / 4.
template <WFormat F>
__device__ __forceinline__ void unpack4(const uint4& q, int g, float* f) {
  const uint32_t u[4] = {q.x, q.y, q.z, q.w};
  if constexpr (F == WFormat::kF32) {
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(u[i]);
  } else if constexpr (F == WFormat::kBF16) {
    f[0] = __uint_as_float(u[2 * g] << 16);
    f[1] = __uint_as_float(u[2 * g] & 0xffff0000u);
    f[2] = __uint_as_float(u[2 * g + 1] << 16);
    f[3] = __uint_as_float(u[2 * g + 1] & 0xffff0000u);
  } else if constexpr (F == WFormat::kFP8Block) {
    const float2 lo = e4m3x2_to_f32(u[g] & 0xffffu), hi = e4m3x2_to_f32(u[g] >> 16);
    f[0] = lo.x;
    f[1] = lo.y;
    f[2] = hi.x;
    f[3] = hi.y;
  } else {
    // Word g / 2 holds values 8·(g/2) .. +7 (low nibble first); half g % 2 of it is bytes
    // 2·(g%2), 2·(g%2)+1 = values 4·(g%2) .. +3 of the word (e2m1x8_to_f32_2m14's placement).
    const uint32_t a = __byte_perm(u[g / 2], 0u, (g & 1) ? 0x4342u : 0x4140u);  // [b, 0, b', 0]
    const uint32_t lo = ((a << 12) & 0x80008000u) | ((a << 9) & 0x0E000E00u);
    const uint32_t hi = ((a << 8) & 0x80008000u) | ((a << 5) & 0x0E000E00u);
    const float2 l = f16x2_bits_to_f32(lo), h = f16x2_bits_to_f32(hi);
    f[0] = l.x;
    f[1] = h.x;
    f[2] = l.y;
    f[3] = h.y;
  }
}

// One block = kWarps warps = kWarps / ks row groups × ks K-slices; row group g of block b owns
// outputs [(b·groups + g)·OPW, +OPW). See gemv_stream.h for the summation order.
// Resident blocks per SM the register cap aims for (ptxas, sm_90a): 1-row f32 / bf16 fit 80
// registers (3 blocks, 24 warps); 1-row FP8 / MXFP4 128 (2 blocks, 16 warps: 64 KiB of weight
// loads in flight per SM); more rows are uncapped (1 block).
template <WFormat F, int MT>
constexpr int kMinBlocks = MT != 1                                       ? 1
                           : (F == WFormat::kF32 || F == WFormat::kBF16) ? 3
                                                                         : 2;

template <WFormat F, int MT, bool SWIGLU>
__global__ void __launch_bounds__(kThreads, (kMinBlocks<F, MT>)) gemv_stream_kernel(GemvArgs a) {
  constexpr int V = kVals<F>;
  constexpr int R = kRows;
  constexpr int U = MT >= 4 ? 1 : 2;       // chunks per load batch (R·U 16-byte loads per lane)
  constexpr int OPW = SWIGLU ? R / 2 : R;  // outputs per warp
  __shared__ float red[kWarps][R][MT];
  const WeightView& w = a.w;
  const int64_t K = w.k;
  const int64_t nchunks = (K + 32 * V - 1) / (32 * V);
  const int ks = a.ks;
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  const int kslice = warp % ks, group = warp / ks, groups = kWarps / ks;
  const int64_t per_block = int64_t(groups) * OPW;  // outputs of one tile
  const int64_t ntiles = (a.n_out + per_block - 1) / per_block;

  int64_t e = 0, rbeg = 0, rcnt = a.rows;
  const int64_t grp = a.list ? 0 : int64_t(blockIdx.y);  // grouped plain form (GemvArgs)
  if (a.list) {
    if (int(blockIdx.y) >= *a.active_count) return;  // whole block
    e = a.active[blockIdx.y];
    rbeg = a.offset[e];
    rcnt = a.offset[e + 1] - rbeg;
  }
  const int64_t m_first = int64_t(blockIdx.z) * MT, pstride = int64_t(gridDim.z) * MT;
  if (m_first >= rcnt) return;  // whole block: no pass of x rows here
  const float* const X = a.x + grp * a.x_group_stride;
  float* const Y = a.y + grp * a.y_group_stride;
  const int64_t nb = grp * a.n_out;
  // Batches of this warp per (tile, pass): batch i = chunks kslice + (i·U + u)·ks, u < U.
  const int64_t cstep = int64_t(ks) * U;
  const int64_t nbat = kslice < nchunks ? (nchunks - kslice + cstep - 1) / cstep : 0;

  // The issue cursor (tile it, pass im, batch ii) walks the same sequence as the math below:
  // blocks take tiles blockIdx.x, + gridDim.x, ... (gemv_stream picks gridDim.x), passes of x
  // rows, then the warp's batches. View rows of the cursor's tile: slot r is output o0 + r
  // (SwiGLU: gate rows o0 + j in slots j < OPW, up rows n_out + o0 + j in slots OPW + j).
  int64_t it = blockIdx.x, im = m_first;
  int ii = 0;
  int32_t rn[R];  // view rows (the pointers are recomputed per batch: fewer live registers)
  bool rok_i[R];
  auto set_rows = [&](int64_t tile) {
    const int64_t o0 = (tile * groups + group) * OPW;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t out = o0 + (SWIGLU ? r % OPW : r);
      rok_i[r] = out < a.n_out;
      rn[r] = int32_t(nb + (rok_i[r] ? out + (SWIGLU ? int64_t(r / OPW) * a.n_out : 0) : 0));
    }
  };
  // Loads of the cursor's batch (zeros past the block's last tile), then the cursor moves on.
  auto issue = [&](uint4(&q)[U][R], float(&sc)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = kslice + (ii * U + u) * ks;
      const int64_t kk0 = c * 32 * V + int64_t(lane) * V;
      const bool in = it < ntiles && c < nchunks && kk0 < K;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        q[u][r] = make_uint4(0u, 0u, 0u, 0u);
        sc[u][r] = 0.f;
        if (in && rok_i[r]) {
          q[u][r] = ld_weights16(wrow(w, e, rn[r]) + wrow_bytes(F, kk0));
          if constexpr (F == WFormat::kFP8Block)
            sc[u][r] = __ldg(fp8_scale_row(w, e, rn[r]) + kk0 / 128);
          else if constexpr (F == WFormat::kMXFP4)
            sc[u][r] = ue8m0_to_f32(__ldg(mxfp4_scale_row(w, e, rn[r]) + kk0 / 32));
        }
      }
    }
    if (++ii < nbat) return;
    ii = 0;
    im += pstride;
    if (im < rcnt) return;
    im = m_first;
    it += gridDim.x;
    if (it < ntiles) set_rows(it);
  };
  set_rows(it);
  uint4 q[U][R];  // the batch being multiplied
  float sc[U][R];

  for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
    const int64_t o0 = (tile * groups + group) * OPW;  // first output of the warp
    bool rok[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rok[r] = o0 + (SWIGLU ? r % OPW : r) < a.n_out;

    // Passes of MT rows: block z takes passes z, z + gridDim.z, ... (plain forms with many rows,
    // e.g. a raised gemv_max_rows; a row's arithmetic does not depend on which block runs it).
    for (int64_t m0 = m_first; m0 < rcnt; m0 += pstride) {
      const int mc = int(rcnt - m0 < MT ? rcnt - m0 : MT);
      // x rows of this pass; slots m ≥ mc repeat the last row (computed, never written).
      const float* xr[MT];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const int64_t item = rbeg + m0 + (m < mc ? m : mc - 1);
        const int64_t xrow = a.list ? int64_t(a.list[item] / a.xdiv) : item;
        xr[m] = X + xrow * a.ldx;
      }
      float acc[R][MT];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[r][m] = 0.f;

      for (int64_t bi = 0; bi < nbat; ++bi) {
        issue(q, sc);  // all R·U loads of the batch in flight before its math
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t c = kslice + (bi * U + u) * ks;
          const int64_t kk0 = c * 32 * V + int64_t(lane) * V;
          if (c >= nchunks || kk0 >= K) continue;
          // One FMA chain per (row, x row) over the chunk's V values in k order, 4 at a time: the
          // float4 of x and the 4 unpacked weights are consumed at once (few live registers).
          float p[R][MT];
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < MT; ++m) p[r][m] = 0.f;
#pragma unroll
          for (int g = 0; g < V / 4; ++g) {
            float4 xg[MT];
#pragma unroll
            for (int m = 0; m < MT; ++m)
              xg[m] = __ldg(reinterpret_cast<const float4*>(xr[m] + kk0) + g);
#pragma unroll
            for (int r = 0; r < R; ++r) {
              if (!rok[r]) continue;
              float wv[4];
              unpack4<F>(q[u][r], g, wv);
#pragma unroll
              for (int m = 0; m < MT; ++m) {
                p[r][m] = fmaf(xg[m].x, wv[0], p[r][m]);
                p[r][m] = fmaf(xg[m].y, wv[1], p[r][m]);
                p[r][m] = fmaf(xg[m].z, wv[2], p[r][m]);
                p[r][m] = fmaf(xg[m].w, wv[3], p[r][m]);
              }
            }
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (!rok[r]) continue;
#pragma unroll
            for (int m = 0; m < MT; ++m) {
              if constexpr (F == WFormat::kF32 || F == WFormat::kBF16)
                acc[r][m] += p[r][m];
              else if constexpr (F == WFormat::kFP8Block)
                acc[r][m] = fmaf(p[r][m], sc[u][r], acc[r][m]);
              else  // e2m1 values carried 2^-14 (exact): restore before the group scale
                acc[r][m] = fmaf(p[r][m] * 16384.f, sc[u][r], acc[r][m]);
            }
          }
        }
      }
      // Lane butterfly (every lane ends with the same sum), then the K-slices in slice order.
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          float v = acc[r][m];
#pragma unroll
          for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
          acc[r][m] = v;
        }
      if (ks > 1) {
        if (lane == 0) {
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < MT; ++m) red[warp][r][m] = acc[r][m];
        }
        __syncthreads();
        if (lane == 0 && kslice == 0) {
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < MT; ++m) {
              float t = red[warp][r][m];
              for (int s = 1; s < ks; ++s) t += red[warp + s][r][m];
              acc[r][m] = t;
            }
        }
        __syncthreads();  // red is reused by the next pass
      }
      if (lane == 0 && kslice == 0) {
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          if (m >= mc) continue;
          const int64_t item = rbeg + m0 + m;
          const int64_t yr = a.list ? int64_t(a.list[item]) : item;
          float* yrow = Y + yr * a.ldy;
          if constexpr (SWIGLU) {
#pragma unroll
            for (int j = 0; j < OPW; ++j) {
              if (o0 + j >= a.n_out) continue;
              float g = acc[j][m], u = acc[OPW + j][m];
              if (a.limit > 0.f) {
                g = fminf(g, a.limit);
                u = fminf(fmaxf(u, -a.limit), a.limit);
              }
              yrow[o0 + j] = g / (1.f + expf(-g)) * u;
            }
          } else {
#pragma unroll
            for (int r = 0; r < R; ++r)
              if (o0 + r < a.n_out) yrow[o0 + r] = acc[r][m];
          }
        }
      }
    }
  }  // tiles
}

// Resident blocks per SM of one kernel instance (cudaOccupancyMaxActiveBlocksPerMultiprocessor,
// queried once per instance and process; 1 when the query fails).
template <WFormat F, int MT, bool SWIGLU>
int blocks_per_sm() {
  static const int n = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, gemv_stream_kernel<F, MT, SWIGLU>,
                                                      kThreads, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      b = 1;
    }
    return std::max(b, 1);
  }();
  return n;
}

// grid.x of a launch: `tiles` tiles of outputs; with a.persist and 1 … 4 waves of tiles, about one
// wave of blocks (the resident blocks per SM × SMs over the grid's y·z extent), each taking an
// equal share of tiles; otherwise one block per tile.
template <WFormat F, int MT, bool SWIGLU>
dim3 persistent_grid(const GemvArgs& a, dim3 grid, int num_sms) {
  if (!a.persist) return grid;
  const int64_t tiles = grid.x;
  const int64_t yz = int64_t(grid.y) * grid.z;
  const int64_t wave = int64_t(blocks_per_sm<F, MT, SWIGLU>()) * std::max(num_sms, 1);
  const int64_t gx = std::max<int64_t>(1, wave / yz);
  // Past 4 waves of tiles (the bf16 head: ~10) the hardware's dynamic block placement balances
  // better than equal static shares: the head took 264 µs persistent against 258 (H200,
  // bench/results/cuda-gemv-s27.md).
  if (gx >= tiles || tiles > 4 * gx) return grid;
  const int64_t per = (tiles + gx - 1) / gx;  // tiles per block
  grid.x = unsigned((tiles + per - 1) / per);
  return grid;
}

template <WFormat F, int MT>
Status launch(const GemvArgs& a, dim3 grid, int num_sms, cudaStream_t stream) {
  if (a.swiglu)
    gemv_stream_kernel<F, MT, true>
        <<<persistent_grid<F, MT, true>(a, grid, num_sms), kThreads, 0, stream>>>(a);
  else
    gemv_stream_kernel<F, MT, false>
        <<<persistent_grid<F, MT, false>(a, grid, num_sms), kThreads, 0, stream>>>(a);
  return check_launch("gemv_stream_kernel");
}

template <WFormat F>
Status dispatch(const GemvArgs& a, dim3 grid, int num_sms, cudaStream_t stream) {
  if (a.mc == 1) return launch<F, 1>(a, grid, num_sms, stream);
  if (a.mc == 2 || F == WFormat::kMXFP4)
    return launch<F, 2>(a, grid, num_sms, stream);  // MXFP4: ≤ 2
  if constexpr (F != WFormat::kMXFP4) return launch<F, 4>(a, grid, num_sms, stream);
  return Status::Ok();
}

}  // namespace

bool gemv_stream_env_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("V4_GEMV_STREAM");
    return !(e && e[0] == '0');
  }();
  return on;
}

bool gemv_stream_persist_env() {
  static const bool on = [] {
    const char* e = std::getenv("V4_GEMV_PERSIST");
    return !(e && e[0] == '0');
  }();
  return on;
}

bool gemv_stream_supported(const GemvArgs& a) {
  const WeightView& w = a.w;
  if (!w.data || w.k <= 0) return false;
  if (w.format == WFormat::kMXFP4 && w.k % 32) return false;
  if (wrow_bytes(w.format, w.k) % 16 || reinterpret_cast<uintptr_t>(w.data) % 16) return false;
  if (!a.x || reinterpret_cast<uintptr_t>(a.x) % 16 || a.ldx % 4 || a.x_group_stride % 4)
    return false;
  return true;
}

int gemv_stream_kslices(const GemvArgs& a, int grid_y, int num_sms) {
  const int V = vals16(a.w.format);
  const int64_t nchunks = (a.w.k + 32 * V - 1) / (32 * V);
  const int opw = a.swiglu ? kRows / 2 : kRows;
  // The grouped-by-expert form counts one slot: its slot count follows the batch, and ks must
  // not (batch invariance).
  const int64_t gy = a.list ? 1 : std::max(grid_y, 1);
  const int64_t row_groups = (a.n_out + opw - 1) / opw * gy;
  const int64_t target = 32 * int64_t(std::max(num_sms, 1));  // warps: ~2 waves of 16 per SM
  int ks = 1;
  while (ks < kWarps && 2 * ks <= nchunks && row_groups * ks < target) ks *= 2;
  return ks;
}

Status gemv_stream(GemvArgs a, int grid_y, int num_sms, cudaStream_t stream) {
  const WeightView& w = a.w;
  if (a.n_out <= 0 || (!a.list && a.rows <= 0) || grid_y <= 0) return Status::Ok();
  if (!gemv_stream_supported(a))
    return errorf(ErrorCode::kUnsupported, "gemv_stream: {} view k={} (or x) not 16-byte aligned",
                  ops::wformat_name(w.format), w.k);
  if (w.n < 0 || w.rows_total < w.row0 + w.n ||
      ((w.format == WFormat::kFP8Block || w.format == WFormat::kMXFP4) && !w.scale))
    return errorf(ErrorCode::kInvalidArgument, "gemv_stream: bad weight view ({} n={} k={})",
                  ops::wformat_name(w.format), w.n, w.k);
  if (grid_y > 65535)
    return errorf(ErrorCode::kInvalidArgument, "gemv_stream: {} slots > 65535", grid_y);
  const int64_t rows_per_item = a.list ? (a.rows_hint > 0 ? a.rows_hint : 4) : a.rows;
  a.mc = rows_per_item <= 1 ? 1 : rows_per_item <= 2 || w.format == WFormat::kMXFP4 ? 2 : 4;
  a.ks = gemv_stream_kslices(a, grid_y, num_sms);
  a.persist = a.persist && gemv_stream_persist_env();
  const int opw = a.swiglu ? kRows / 2 : kRows;
  const int64_t per_block = int64_t(kWarps / a.ks) * opw;
  const int64_t ntiles = (a.n_out + per_block - 1) / per_block;
  if (ntiles > int64_t(0x7fffffff))
    return errorf(ErrorCode::kInvalidArgument, "gemv_stream: {} outputs", a.n_out);
  // Many rows (plain forms): spread the passes over grid.z while the grid is small.
  const int64_t passes = a.list ? 1 : (a.rows + a.mc - 1) / a.mc;
  const int64_t blocks = ntiles * grid_y, want = 4 * int64_t(std::max(num_sms, 1));
  const int64_t gz =
      blocks >= want ? 1 : std::min<int64_t>({passes, (want + blocks - 1) / blocks, 65535});
  const dim3 grid{unsigned(ntiles), unsigned(grid_y), unsigned(gz)};
  switch (w.format) {
    case WFormat::kF32:
      return dispatch<WFormat::kF32>(a, grid, num_sms, stream);
    case WFormat::kBF16:
      return dispatch<WFormat::kBF16>(a, grid, num_sms, stream);
    case WFormat::kFP8Block:
      return dispatch<WFormat::kFP8Block>(a, grid, num_sms, stream);
    case WFormat::kMXFP4:
      return dispatch<WFormat::kMXFP4>(a, grid, num_sms, stream);
  }
  return Status::Ok();
}

}  // namespace v4::cuda
