#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// FlashCompressor's projection pass (compress_proj.h): [W_kv; W_g] · bf16(x)ᵀ for ≤ 64 rows of x
// with the compressor-state ring refreshed in the epilogue.
//
// CTA = 8 warps, ≤ ~108 KB of shared memory (2 CTAs per SM). Tile = `rows` consecutive weight
// rows of one matrix × a K slice of D / ks columns. The x slice (≤ 64 rows, f32 → bf16) sits in
// shared memory; the weight tile streams through a cp.async ring of 64-column chunks
// (the first ones issued before the PDL wait; 2–5 stages by token tiles); x loaded right after
// the wait (≤ 32 rows) or chunk by chunk during the previous chunk's MMA (64 rows). Rows padded by
// 16 bytes: conflict-free ldmatrix. Warps: min(8, rows/16) m16 tiles × 8/that K parts of each
// chunk; mma.sync m16n8k16 (A = weights via ldmatrix.x4, B = x rows via ldmatrix.x4 — two n8 token
// tiles per load), fp32 accumulators for every token tile across all chunks. Partials: the K parts
// of the CTA folded in order in shared memory, then the cluster's ks CTAs added in rank order
// through distributed shared memory; CTA `rank` finishes rows/ks rows of the tile and stores them
// to kc / zc and to the ring rows.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "ops/cuda/compress_proj.h"
#include "ops/cuda/device_util.cuh"
#include "ops/cuda/wformat.cuh"
#include "ops/cuda/wfrag.cuh"

namespace v4::cuda {
namespace {

namespace cg = cooperative_groups;
using namespace wfrag;  // NOLINT: cp.async, ldmatrix, mma helpers

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kPad = 8;  // bf16 of padding per staged row (16 bytes)
constexpr int kMaxTok = int(kCompressProjMaxRows);
// Dynamic shared memory budget: the 227 KiB per block less the kernel's static arrays (ring
// indices, 512 B) and headroom.
constexpr size_t kSmemLimit = 226 * 1024;

// Weight columns per pipeline stage (one cp.async group).
constexpr int kChunk = 64;
// Stages of the weight ring for NT token tiles: as many as ~110 KB of shared memory holds next
// to the x slice at the 128-row tile (2 CTAs per SM). Timing only: the sums do not depend on it.
__host__ __device__ constexpr int stages_for(int nt) {
  return nt >= 8 ? 2 : nt >= 4 ? 4 : 5;
}
constexpr int kTokTiles[] = {2, 4, 8};    // the kernel instances (NT)
constexpr int kChunkRow = kChunk + kPad;  // bf16 per staged weight row

// Shared-memory layout of a plan (rows R, K slice ksl, ks CTAs) for `tok` padded x rows:
//   [x slice: tok × (ksl + kPad) bf16][weight ring: stages_for(tok / 8) × R × kChunkRow bf16]
// overlaid after the last MMA by the K-part partials [wk][R][tok] f32, then at `fin` the
// finished rows [R/ks][tok] f32.
struct ProjSmem {
  size_t ring = 0, fin = 0, total = 0;
};
// Row stride (floats) of the K-part partials [wk][R][tok]: tok + 8, so the 8 row groups of an
// mma fragment store (rows g = 0 … 7, 4 column pairs) fall in 4 bank octets, not one (at tok = 64
// an unpadded 256-byte stride put all 8 rows on the same banks: 8-way conflicts).
__host__ __device__ constexpr int part_ld(int tok) {
  return tok + 8;
}
__host__ __device__ inline ProjSmem proj_smem(int R, int64_t ksl, int ks, int tok) {
  const int wm = R / 16 < kWarps ? R / 16 : kWarps, wk = kWarps / wm;
  ProjSmem l;
  l.ring = size_t(tok) * size_t(ksl + kPad) * 2;
  const size_t stage = l.ring + size_t(stages_for(tok / 8)) * R * kChunkRow * 2;
  const size_t part = size_t(wk) * R * part_ld(tok) * 4;
  l.fin = ((stage > part ? stage : part) + 127) / 128 * 128;
  l.total = l.fin + size_t(R / ks) * tok * 4;
  return l;
}

struct ProjArgs {
  const float* x = nullptr;
  int64_t ldx = 0;
  int S = 0;
  const uint16_t* w[2] = {nullptr, nullptr};  // bf16 bits of row 0 of W_kv, W_g (row stride K)
  int64_t K = 0;
  int N = 0;                             // c·d
  float* out[2] = {nullptr, nullptr};    // kc, zc [S, N]
  float* state[2] = {nullptr, nullptr};  // ring kv, gate [rows, N]
  const int32_t* ring_src = nullptr;
  const int32_t* ring_dst = nullptr;
  int n_ring = 0;
  bool no_x = false;  // diagnostic (V4_CPROJ_XDIAG=1): x is never loaded (zeros); outputs wrong
};

// NT: n8 token tiles (even; NT·8 ≥ S).
template <int NT>
__global__ void __launch_bounds__(kThreads, 2)
    compress_proj_kernel(ProjArgs a, CompressProjPlan p) {
  extern __shared__ __align__(128) unsigned char proj_smem_raw[];
  constexpr int TP = NT * 8;  // padded token rows
  constexpr int kStages = stages_for(NT);
  __shared__ int32_t s_rsrc[kMaxTok], s_rdst[kMaxTok];
  const int R = p.rows, KS = p.ks, KSL = p.kslice, RE = KSL + kPad, NC = KSL / kChunk;
  const ProjSmem lay = proj_smem(R, KSL, KS, TP);
  uint16_t* sX = reinterpret_cast<uint16_t*>(proj_smem_raw);             // [TP][RE]
  uint16_t* sW = reinterpret_cast<uint16_t*>(proj_smem_raw + lay.ring);  // [kStages][R][kChunkRow]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const int tile = int(blockIdx.x) / KS;
  const int g0 = tile * R, arr = g0 / a.N, r0 = g0 - arr * a.N;
  const int64_t k0 = int64_t(rank) * KSL;
  const uint16_t* W = (arr ? a.w[1] : a.w[0]) + int64_t(r0) * a.K + k0;

  // Weight chunk c (columns [c·64, c·64 + 64) of the slice, all R rows) into stage c % kStages:
  // R·8 16-byte copies, one cp.async group per chunk (empty past the last chunk, so that the
  // group count stays uniform for cp_async_wait).
  auto issue_w = [&](int c) {
    if (c < NC) {
      uint16_t* dst = sW + size_t(c % kStages) * R * kChunkRow;
      const uint16_t* src = W + c * kChunk;
      for (int i = tid; i < R * (kChunk / 8); i += kThreads) {
        const int r = i / (kChunk / 8), q = i - r * (kChunk / 8);
        cp_async16(dst + r * kChunkRow + q * 8, src + int64_t(r) * a.K + q * 8, true);
      }
    }
    cp_async_commit();
  };
  // 1. The first weight chunks: never written by a kernel of this stream, so copied before the
  // PDL wait (overlapping the predecessor's tail); the ring indices (plan arrays, same rule).
  for (int c = 0; c < kStages; ++c) issue_w(c);
  for (int i = tid; i < a.n_ring; i += kThreads) {
    s_rsrc[i] = __ldg(a.ring_src + i);
    s_rdst[i] = __ldg(a.ring_dst + i);
  }
  pdl_wait();  // x (and the ring rows written below) may belong to the predecessor
  pdl_trigger();

  // x's K slice as bf16 (round to nearest even), rows ≥ S zero. Measured both ways on the H200
  // (bench/results/cuda-compressor-proj.md): up to 32 rows (NT ≤ 4) the whole slice right after
  // the wait, every load of a thread in flight (one or two L2 round trips before the first MMA);
  // at 64 rows (128 KB of f32 per CTA) chunk by chunk, chunk c + 1 loaded into registers during
  // chunk c's MMA (the loads overlap the weight stream; up front cost 2.5 µs more).
  constexpr bool kXByChunk = NT >= 8;
  constexpr int kXU = kXByChunk ? TP * (kChunk / 4) / kThreads : 16;  // float4 per thread per batch
  float4 xr[kXU];
  auto load_x = [&](int c) {  // chunk c into registers (kXByChunk)
#pragma unroll
    for (int u = 0; u < kXU; ++u) {
      const int i = tid + u * kThreads, t = i / (kChunk / 4), q = i - t * (kChunk / 4);
      xr[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (t < a.S && !a.no_x)
        xr[u] =
            __ldg(reinterpret_cast<const float4*>(a.x + int64_t(t) * a.ldx + k0 + c * kChunk) + q);
    }
  };
  auto store_x = [&](int c) {  // registers into sX (kXByChunk)
#pragma unroll
    for (int u = 0; u < kXU; ++u) {
      const int i = tid + u * kThreads, t = i / (kChunk / 4), q = i - t * (kChunk / 4);
      *reinterpret_cast<uint2*>(sX + size_t(t) * RE + c * kChunk + q * 4) =
          make_uint2(pack_bf16(xr[u].x, xr[u].y), pack_bf16(xr[u].z, xr[u].w));
    }
  };
  if constexpr (kXByChunk) {
    static_assert(TP * (kChunk / 4) % kThreads == 0, "x chunk split");
    load_x(0);
    store_x(0);
  } else {
    const int c4 = KSL / 4, total = TP * c4;
    for (int base = tid; base < total; base += kThreads * kXU) {
#pragma unroll
      for (int u = 0; u < kXU; ++u) {
        const int i = base + u * kThreads, t = i / c4, q = i - t * c4;
        xr[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < total && t < a.S && !a.no_x)
          xr[u] = __ldg(reinterpret_cast<const float4*>(a.x + int64_t(t) * a.ldx + k0) + q);
      }
#pragma unroll
      for (int u = 0; u < kXU; ++u) {
        const int i = base + u * kThreads, t = i / c4, q = i - t * c4;
        if (i < total)
          *reinterpret_cast<uint2*>(sX + size_t(t) * RE + q * 4) =
              make_uint2(pack_bf16(xr[u].x, xr[u].y), pack_bf16(xr[u].z, xr[u].w));
      }
    }
  }

  // 2. The K loop over chunks: warp → (m16 tile mt, part kq of each chunk's 64 columns); weight
  // chunk c + kStages is issued once every warp is done with chunk c's stage.
  const int wm = min(kWarps, R / 16), wk = kWarps / wm;
  const int mt = warp % wm, kq = warp / wm, kspan = kChunk / wk;
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const int a_off = (mt * 16 + (lane & 15)) * kChunkRow + (lane >> 4) * 8 + kq * kspan;
  const uint16_t* bx =
      sX + size_t((lane & 7) + ((lane >> 4) << 3)) * RE + ((lane >> 3) & 1) * 8 + kq * kspan;
  for (int c = 0; c < NC; ++c) {
    if constexpr (kXByChunk)
      if (c + 1 < NC) load_x(c + 1);
    cp_async_wait<kStages - 1>();  // this thread's copies of chunk c landed
    __syncthreads();               // everyone's copies of chunk c and x chunk c visible
    const uint16_t* aw = sW + size_t(c % kStages) * R * kChunkRow + a_off;
    const uint16_t* bc = bx + c * kChunk;
    for (int kk = 0; kk < kspan; kk += 16) {
      uint32_t af[4];
      ldmatrix_x4(af, aw + kk);
#pragma unroll
      for (int j = 0; j < NT; j += 2) {
        uint32_t bf[4];
        ldmatrix_x4(bf, bc + size_t(j * 8) * RE + kk);
        mma_bf16(acc[j], af[0], af[1], af[2], af[3], bf[0], bf[1]);
        mma_bf16(acc[j + 1], af[0], af[1], af[2], af[3], bf[2], bf[3]);
      }
    }
    if constexpr (kXByChunk)
      if (c + 1 < NC) store_x(c + 1);  // read from the next iteration on (after its barrier)
    __syncthreads();                   // every warp is done with this stage
    issue_w(c + kStages);
  }
  cp_async_wait<0>();  // only empty groups remain

  // 3. Partials [wk][R][TP] (over the x / ring region, free now), folded over the K parts in
  // order into part 0.
  float* sP = reinterpret_cast<float*>(proj_smem_raw);
  {
    constexpr int PL = part_ld(TP);
    float* P = sP + size_t(kq) * R * PL;
    const int g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int row = mt * 16 + g, col = j * 8 + t2;
      *reinterpret_cast<float2*>(P + row * PL + col) = make_float2(acc[j][0], acc[j][1]);
      *reinterpret_cast<float2*>(P + (row + 8) * PL + col) = make_float2(acc[j][2], acc[j][3]);
    }
  }
  __syncthreads();
  constexpr int PL = part_ld(TP);
  if (wk > 1)
    for (int i = tid; i < R * TP; i += kThreads) {
      const int o = (i / TP) * PL + i % TP;
      float s = sP[o];
      for (int q = 1; q < wk; ++q) s += sP[size_t(q) * R * PL + o];
      sP[o] = s;
    }
  cluster.sync();  // every CTA's folded partials written and visible cluster-wide

  // 4. This CTA's rows [rank·rpc, (rank + 1)·rpc) of the tile: the cluster's K slices added in
  // rank order (the same order for every token and every batch).
  const int rpc = R / KS;
  float* sV = reinterpret_cast<float*>(proj_smem_raw + lay.fin);  // [rpc][TP]
  // Every rank's value of an output is loaded before any is added (the loop over ranks is
  // unrolled to the largest cluster, 8, with a guard), two outputs per thread at a time; the sum
  // stays in rank order.
#pragma unroll 2
  for (int i = tid; i < rpc * TP; i += kThreads) {
    const int lr = i / TP, t = i - lr * TP;
    float* src = sP + (rank * rpc + lr) * PL + t;
    float v[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) v[q] = q < KS ? *cluster.map_shared_rank(src, unsigned(q)) : 0.f;
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < 8; ++q)
      if (q < KS) s += v[q];
    sV[i] = s;
  }
  cluster.sync();  // remote reads done before any CTA exits; sV complete

  // 5. Stores: kc / zc rows (rpc consecutive columns per token) and the ring rows.
  const int col0 = r0 + rank * rpc;
  float* out = arr ? a.out[1] : a.out[0];
  for (int i = tid; i < a.S * rpc; i += kThreads) {
    const int t = i / rpc, lr = i - t * rpc;
    out[int64_t(t) * a.N + col0 + lr] = sV[lr * TP + t];
  }
  float* state = arr ? a.state[1] : a.state[0];
  for (int i = tid; i < a.n_ring * rpc; i += kThreads) {
    const int e = i / rpc, lr = i - e * rpc;
    const int dst = s_rdst[e], src = s_rsrc[e];
    if (dst >= 0 && src >= 0 && src < a.S)
      state[int64_t(dst) * a.N + col0 + lr] = sV[lr * TP + src];
  }
}

using Kern = void (*)(ProjArgs, CompressProjPlan);

Kern kernel_for(int64_t S) {
  if (S <= 16) return compress_proj_kernel<2>;
  if (S <= 32) return compress_proj_kernel<4>;
  return compress_proj_kernel<8>;
}

std::atomic<int64_t> g_launches{0};

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

}  // namespace

CompressProjPlan plan_compress_proj(int64_t n, int64_t k, int num_sms) {
  CompressProjPlan fallback;
  if (n <= 0 || n % 32 != 0 || k <= 0 || n > (int64_t(1) << 28)) return fallback;
  for (int ks : {8, 4, 2, 1}) {
    if (k % (int64_t(ks) * kChunk) != 0) continue;
    const int64_t ksl = k / ks;
    // Smallest tile that keeps the grid within one wave; ≥ 32 rows (a warp's K part of a chunk
    // is ≥ one k16 step).
    for (int R : {32, 64, 128}) {  // ≥ 32: a warp's K part of a chunk (64 / wk) is ≥ one k16 step
      if (n % R != 0 || R % ks != 0) continue;
      size_t smem = 0;
      for (int nt : kTokTiles) smem = std::max(smem, proj_smem(R, ksl, ks, nt * 8).total);
      if (smem > kSmemLimit) continue;
      CompressProjPlan p;
      p.ks = ks;
      p.rows = R;
      p.kslice = int(ksl);
      p.tiles = int(2 * n / R);
      p.smem = smem;
      if (int64_t(p.tiles) * ks <= num_sms) return p;
      fallback = p;  // the largest fitting tile so far: several waves
    }
    if (fallback.ks) return fallback;
  }
  return fallback;
}

namespace {
// Whether a cluster of plan `p` can be placed at all on this device (a partitioned device may not
// hold ks CTAs of p.smem in one GPC): cudaOccupancyMaxActiveClusters > 0, cached per plan.
bool plan_fits_clusters(const CompressProjPlan& p) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int, size_t>, bool> cache;
  const auto key = std::make_tuple(p.ks, p.rows, p.kslice, p.smem);
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const bool ok = compress_proj_max_active_clusters(p) > 0;
  cache.emplace(key, ok);
  return ok;
}
}  // namespace

bool compress_proj_supported(const ops::CompressProjectArgs& a, int num_sms) {
  const ops::CompressFusedArgs& s = a.step;
  const int64_t n = int64_t(s.overlap) * s.dim;
  const auto view_ok = [&](const ops::WeightView& w) {
    return w.format == WFormat::kBF16 && w.experts == 1 && w.n == n && w.k > 0 &&
           w.data != nullptr && aligned16(w.data) && (w.k * 2) % 16 == 0 &&
           w.rows_total >= w.row0 + w.n;
  };
  // The step's own checks (those compress_fused would refuse after kernel 1 already wrote kc / zc
  // and the ring): a step the pooling kernel refuses takes the composed path, which fails first.
  const bool step_ok = s.dim >= 1 && s.ratio >= 1 && (s.overlap == 1 || s.overlap == 2) &&
                       s.rope_dim >= 0 && s.rope_dim % 2 == 0 && s.rope_dim <= s.dim &&
                       s.n_out >= 0 && s.n_ring >= 0 &&
                       (s.pool_dtype == KvDtype::kF32 || s.pool_dtype == KvDtype::kBf16 ||
                        s.pool_dtype == KvDtype::kFp8 || s.pool_dtype == KvDtype::kFp8Index);
  if (!step_ok || a.n_fresh < 1 || a.n_fresh > kCompressProjMaxRows ||
      s.n_ring > kCompressProjMaxRows || !s.ring_disjoint || !view_ok(a.wkv) || !view_ok(a.wgate) ||
      a.wkv.k != a.wgate.k || !a.x || !aligned16(a.x) || a.ldx % 4 != 0 || a.ldx < a.wkv.k ||
      !a.kc || !a.zc || (s.n_ring > 0 && (!s.state_kv || !s.state_gate)))
    return false;
  const CompressProjPlan p = plan_compress_proj(n, a.wkv.k, num_sms);
  return p.ks > 0 && plan_fits_clusters(p);
}

Status compress_proj(const ops::CompressProjectArgs& a, int num_sms, cudaStream_t stream) {
  if (!compress_proj_supported(a, num_sms))
    return errorf(ErrorCode::kUnsupported, "compress_proj: unsupported arguments");
  const ops::CompressFusedArgs& s = a.step;
  const CompressProjPlan p = plan_compress_proj(int64_t(s.overlap) * s.dim, a.wkv.k, num_sms);
  ProjArgs k;
  k.x = a.x;
  k.ldx = a.ldx;
  k.S = int(a.n_fresh);
  k.w[0] = reinterpret_cast<const uint16_t*>(wrow(a.wkv, 0, 0));
  k.w[1] = reinterpret_cast<const uint16_t*>(wrow(a.wgate, 0, 0));
  k.K = a.wkv.k;
  k.N = int(int64_t(s.overlap) * s.dim);
  k.out[0] = a.kc;
  k.out[1] = a.zc;
  k.state[0] = s.state_kv;
  k.state[1] = s.state_gate;
  k.ring_src = s.ring_src;
  k.ring_dst = s.ring_dst;
  k.n_ring = int(s.n_ring);
  {
    // Timing diagnostic for benchmarks: V4_CPROJ_XDIAG=1 skips every x load (results wrong), to
    // split the 64-row calls' time between the x slice and the weight stream.
    const char* e = std::getenv("V4_CPROJ_XDIAG");
    k.no_x = e && e[0] == '1';
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(p.tiles * p.ks), 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = p.smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int na = 0;
  attr[na].id = cudaLaunchAttributeClusterDimension;
  attr[na].val.clusterDim.x = unsigned(p.ks);
  attr[na].val.clusterDim.y = 1;
  attr[na].val.clusterDim.z = 1;
  ++na;
  const char* e = std::getenv("V4_COMPRESS_PDL");  // compressor.cu's switch (A/B runs)
  if (!(e && e[0] == '0')) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = attr;
  cfg.numAttrs = na;
  V4_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel_for(a.n_fresh), k, p));
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

int64_t compress_proj_launches() {
  return g_launches.load(std::memory_order_relaxed);
}

Status compress_proj_prepare() {
  for (Kern f : {compress_proj_kernel<2>, compress_proj_kernel<4>, compress_proj_kernel<8>})
    V4_CUDA_TRY(
        cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemLimit)));
  return Status::Ok();
}

int compress_proj_max_active_clusters(const CompressProjPlan& p) {
  if (p.ks <= 0) return -1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(p.tiles * p.ks), 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = p.smem;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(p.ks);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = -1;
  if (cudaOccupancyMaxActiveClusters(&n, compress_proj_kernel<8>, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return n;
}

}  // namespace v4::cuda
