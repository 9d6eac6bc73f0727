#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// FlashCompressor (compressor.h). The pooled, normalised and roped rows never leave the SM; the
// window is split over CTAs (channel slices, one cluster per row) and threads (slot partitions,
// online softmax) by the plan of compress_split.h. fp32 results match the unfused CUDA sequence
// compress_pool → rmsnorm → rope_interleaved → store_rows up to summation order (the softmax
// partition merge and the Σx² tree differ; same rotation expression).
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/compress_split.h"
#include "ops/cuda/compressor.h"
#include "ops/cuda/device_util.cuh"

namespace v4::cuda {
namespace {

namespace cg = cooperative_groups;

// One closing window per cluster of pl.ctas CTAs (compress_split.h: CompressRowsPlan), grid
// n_out · pl.ctas. Each CTA owns a channel slice of the row; its threads split the window's slots
// into pl.parts contiguous partitions and read the kv / gate / bias rows of their slots with
// `VEC`-wide loads (all loads of a batch of 4 slots in flight), folding them into an online
// softmax state per channel (cs_fold_slots). Then, per CTA: partitions merged in order in shared
// memory (cs_merge) → pooled slice; sum of squares of the slice (block reduction, fixed order);
// the K slice sums added in rank order through distributed shared memory (every CTA of the
// cluster forms the same total); RMSNorm · norm; RoPE pairs (2i, 2i+1) on the trailing rope_dim
// channels (a pair never straddles a slice: slices are multiples of 4 channels on the vector path
// and whole rows on the scalar one); one `VEC`-wide store into pool[dst[r]].
// Stores VEC finished values o[0..VEC) at value index i of the pool (i % VEC == 0) in the pool's
// element type (a.pool_dtype: f32, or bf16 rounded to nearest even as the CPU backend does).
template <int VEC>
__device__ __forceinline__ void store_pool_values(const ops::CompressFusedArgs& a, int64_t i,
                                                  const float* o) {
  if (a.pool_dtype == KvDtype::kBf16) {
    uint16_t* p = static_cast<uint16_t*>(a.pool) + i;
    if constexpr (VEC == 4) {  // 8 bytes, 8-byte aligned (pool 16-aligned, i % 4 == 0)
      const uint2 u = make_uint2(
          uint32_t(kv_f32_to_bf16(o[0])) | (uint32_t(kv_f32_to_bf16(o[1])) << 16),
          uint32_t(kv_f32_to_bf16(o[2])) | (uint32_t(kv_f32_to_bf16(o[3])) << 16));
      *reinterpret_cast<uint2*>(p) = u;
    } else {
      p[0] = kv_f32_to_bf16(o[0]);
    }
    return;
  }
  float* p = static_cast<float*>(a.pool) + i;
  if constexpr (VEC == 4)
    *reinterpret_cast<float4*>(p) = make_float4(o[0], o[1], o[2], o[3]);
  else
    p[0] = o[0];
}

template <int VEC>
__global__ void __launch_bounds__(512)
    compress_fused_rows_kernel(ops::CompressFusedArgs a, CompressRowsPlan pl) {
  extern __shared__ float4 smem_f4[];
  __shared__ float red[32];
  __shared__ float slice_ss;
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem_f4);
  const int K = pl.ctas;
  const int64_t r = blockIdx.x / K;
  const int rank = int(blockIdx.x % K);
  const int32_t dst = a.dst[r];
  if (dst < 0) return;  // window not closing (device-planned decode rows): the whole cluster exits
  const int d = a.dim, ns = a.overlap * a.ratio, tid = threadIdx.x, nt = blockDim.x;
  const int g0 = rank * pl.gpc, g1 = min(pl.groups, g0 + pl.gpc);
  const int c0 = g0 * VEC, cw = max(0, g1 - g0) * VEC, cw_max = pl.gpc * VEC;
  const CompressRowsSmem lay = compress_rows_smem(ns, pl.parts, cw_max);
  int32_t* s_src = reinterpret_cast<int32_t*>(smem + lay.src);
  float* s_part = reinterpret_cast<float*>(smem + lay.part);  // [3][P][cw_max]
  float* s_row = reinterpret_cast<float*>(smem + lay.row);    // [cw_max]
  for (int j = tid; j < ns; j += nt) s_src[j] = a.src[r * ns + j];
  __syncthreads();

  // 1. Pooling of the slice.
  const CsInputs in{a.fresh_kv, a.fresh_gate, a.state_kv, a.state_gate, a.bias, a.ratio, a.overlap, d};
  const int x = tid % pl.gw, p = tid / pl.gw;
  if (p < pl.parts) {
    const int j0 = p * pl.spp, j1 = min(ns, j0 + pl.spp);
    for (int g = g0 + x; g < g1; g += pl.gw) {
      CsAcc st[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) st[i] = CsAcc{-INFINITY, 0.f, 0.f};
      cs_fold_slots<VEC>(in, s_src, j0, j1, g * VEC, st);
      const int l = (g - g0) * VEC;  // channel within the slice
      if (pl.parts == 1) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) s_row[l + i] = cs_merge(&st[i].mx, &st[i].sum, &st[i].acc, 1, 0);
      } else {
        const int64_t plane = int64_t(pl.parts) * cw_max;
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const int64_t o = int64_t(p) * cw_max + l + i;
          s_part[o] = st[i].mx;
          s_part[plane + o] = st[i].sum;
          s_part[2 * plane + o] = st[i].acc;
        }
      }
    }
  }
  __syncthreads();
  if (pl.parts > 1) {
    const int64_t plane = int64_t(pl.parts) * cw_max;
    for (int l = tid; l < cw; l += nt)
      s_row[l] = cs_merge(s_part + l, s_part + plane + l, s_part + 2 * plane + l, pl.parts, cw_max);
    __syncthreads();
  }

  // 2. RMSNorm: Σ x² of the slice (thread-strided, warp butterflies, warp sums in order), then
  // the slices of the cluster in rank order.
  float ss = 0.f;
  for (int l = tid; l < cw; l += nt) ss += s_row[l] * s_row[l];
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((tid & 31) == 0) red[tid >> 5] = ss;
  __syncthreads();
  if (tid < 32) {
    float v = tid < (nt >> 5) ? red[tid] : 0.f;
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (tid == 0) slice_ss = v;
  }
  float total;
  if (K > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every slice sum written and visible cluster-wide
    total = 0.f;
    for (int q = 0; q < K; ++q) total += *cluster.map_shared_rank(&slice_ss, q);
    cluster.sync();  // remote reads done before any CTA of the cluster may exit
  } else {
    __syncthreads();
    total = slice_ss;
  }
  const float inv = rsqrtf(total / float(int64_t(d)) + a.eps);

  // 3. Normalise + weight, RoPE, store (VEC channels per thread).
  const int rd = a.rope_dim, nope = d - rd;
  const float pos = rd > 0 ? float(a.positions[r]) : 0.f;
  const int64_t out = int64_t(dst) * d;  // value index of the row in the pool
  auto normed = [&](int ch) {  // channel ch of the row (inside this slice), normalised · norm
    float v = s_row[ch - c0] * inv;
    if (a.norm) v *= a.norm[ch];
    return v;
  };
  for (int l = tid * VEC; l < cw; l += nt * VEC) {
    const int ch0 = c0 + l;
    float o[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const int ch = ch0 + i;
      if (ch < nope) {
        o[i] = normed(ch);
        continue;
      }
      const int q = (ch - nope) >> 1;
      const float x0 = normed(nope + 2 * q), x1 = normed(nope + 2 * q + 1);
      const float ang = a.inv_freq[q] * pos;  // one fp32 product, as the rope kernel
      float sn, cs;
      sincosf(ang, &sn, &cs);
      sn *= a.attention_scaling;
      cs *= a.attention_scaling;
      o[i] = ((ch - nope) & 1) ? x0 * sn + x1 * cs : x0 * cs - x1 * sn;
    }
    store_pool_values<VEC>(a, out + ch0, o);
  }
}

// state[ring_dst[i]] = fresh[ring_src[i]] for kv (blockIdx.y = 0) and gate (blockIdx.y = 1);
// `vec` values per element (4: float4, 1: float). Grid-stride over n_ring · width / vec.
template <int kVec>
__global__ void compress_ring_kernel(ops::CompressFusedArgs a, int64_t width) {
  using V = typename std::conditional<kVec == 4, float4, float>::type;
  const V* src = reinterpret_cast<const V*>(blockIdx.y ? a.fresh_gate : a.fresh_kv);
  V* dst = reinterpret_cast<V*>(blockIdx.y ? a.state_gate : a.state_kv);
  const int64_t w = width / kVec, total = a.n_ring * w;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = i / w, c = i - k * w;
    const int32_t to = a.ring_dst[k];
    if (to >= 0) dst[int64_t(to) * w + c] = src[int64_t(a.ring_src[k]) * w + c];
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

Status compress_fused(const ops::CompressFusedArgs& a, cudaStream_t stream) {
  const int d = a.dim;
  if (d < 1 || a.ratio < 1 || (a.overlap != 1 && a.overlap != 2) || a.rope_dim < 0 ||
      a.rope_dim % 2 || a.rope_dim > d)
    return errorf(ErrorCode::kInvalidArgument,
                  "compress_fused: dim={} ratio={} overlap={} rope_dim={}", d, a.ratio, a.overlap,
                  a.rope_dim);
  if (a.n_out > 0x7fffffff)
    return errorf(ErrorCode::kInvalidArgument, "compress_fused: {} output rows", a.n_out);
  if (a.n_out > 0) {
    const bool vec_ok = d % 4 == 0 && aligned16(a.fresh_kv) && aligned16(a.fresh_gate) &&
                        aligned16(a.state_kv) && aligned16(a.state_gate) && aligned16(a.bias) &&
                        aligned16(a.pool);
    const CompressRowsPlan pl = plan_compress_rows(a.ratio, a.overlap, d, vec_ok);
    if (pl.threads == 0)
      return errorf(ErrorCode::kInvalidArgument, "compress_fused: dim {} too large", d);
    if (a.n_out * pl.ctas > 0x7fffffff)
      return errorf(ErrorCode::kInvalidArgument, "compress_fused: {} output rows", a.n_out);
    auto kern = pl.vec == 4 ? compress_fused_rows_kernel<4> : compress_fused_rows_kernel<1>;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(a.n_out * pl.ctas), 1, 1);
    cfg.blockDim = dim3(unsigned(pl.threads), 1, 1);
    cfg.dynamicSmemBytes = pl.smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(pl.ctas);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pl.ctas > 1 ? 1 : 0;
    V4_CUDA_TRY(cudaLaunchKernelEx(&cfg, kern, a, pl));
  }
  if (a.n_ring > 0) {
    const int64_t width = int64_t(a.overlap) * d;
    const bool vec = width % 4 == 0 && aligned16(a.fresh_kv) && aligned16(a.fresh_gate) &&
                     aligned16(a.state_kv) && aligned16(a.state_gate);
    const int64_t items = a.n_ring * (vec ? width / 4 : width);
    const dim3 grid(grid_for(items, 256), 2);
    if (vec)
      compress_ring_kernel<4><<<grid, 256, 0, stream>>>(a, width);
    else
      compress_ring_kernel<1><<<grid, 256, 0, stream>>>(a, width);
    V4_CUDA_CHECK_LAUNCH("compress_ring_kernel");
  }
  return Status::Ok();
}

}  // namespace v4::cuda
