#include "ops/cuda/cuda_common.h"
// (cuda_common.h first: see the FMT_CONSTEXPR note there)
#include <cooperative_groups.h>
#include <mma.h>

#include <cub/cub.cuh>

#include "ops/cuda/device_util.cuh"
#include "ops/cuda/topk.h"

namespace v4::cuda {
namespace {

namespace cg = cooperative_groups;

// ------------------------------------------------------------------------------------------------
// Indexer scores

constexpr int kWNI = 64, kWDI = 128, kWKeys = 64, kWTiles = 8, kWLd = kWDI + 8, kWScLd = kWKeys + 4;

// Tensor-core path for nI = 64, dI = 128: a block owns one query row and kWTiles tiles of 64 keys;
// 4 warps each compute a 64-head × 16-key slab of q·Kᵀ with bf16 WMMA (fp32 accumulate), the
// slab goes through shared memory and 64 threads reduce Σ_h w_h·ReLU(·) per key.
__global__ void __launch_bounds__(128) indexer_wmma_kernel(
    const __nv_bfloat16* __restrict__ q, const float* __restrict__ w,
    const __nv_bfloat16* __restrict__ keys, const int64_t* __restrict__ key_begin,
    const int32_t* __restrict__ n_keys, float scale, float* __restrict__ scores, int64_t ld) {
  using namespace nvcuda;
  __shared__ __align__(128) __nv_bfloat16 qs[kWNI * kWLd];
  __shared__ __align__(128) unsigned char kbuf[kWKeys * kWLd * 2];  // keys, then f32 scores
  __shared__ float ws[kWNI];
  __nv_bfloat16* ks = reinterpret_cast<__nv_bfloat16*>(kbuf);
  float* sc = reinterpret_cast<float*>(kbuf);
  static_assert(kWKeys * kWLd * 2 >= kWNI * kWScLd * 4, "score slab must fit the key buffer");

  const int64_t r = blockIdx.y;
  const int n = n_keys[r];
  const int64_t first = int64_t(blockIdx.x) * kWTiles * kWKeys;
  if (first >= n) return;
  const int tid = threadIdx.x, warp = tid >> 5;
  const __nv_bfloat16* qr = q + r * kWNI * kWDI;
  for (int i = tid; i < kWNI * kWDI / 8; i += 128) {
    int h = i / (kWDI / 8), c = i % (kWDI / 8);
    *reinterpret_cast<uint4*>(&qs[h * kWLd + c * 8]) = reinterpret_cast<const uint4*>(qr)[i];
  }
  if (tid < kWNI) ws[tid] = w[r * kWNI + tid];
  const __nv_bfloat16* kr = keys + key_begin[r] * kWDI;
  for (int tile = 0; tile < kWTiles; ++tile) {
    const int64_t k0 = first + int64_t(tile) * kWKeys;
    if (k0 >= n) break;
    __syncthreads();  // previous tile's slab fully consumed
    for (int i = tid; i < kWKeys * kWDI / 8; i += 128) {
      int j = i / (kWDI / 8), c = i % (kWDI / 8);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (k0 + j < n) v = reinterpret_cast<const uint4*>(kr + (k0 + j) * kWDI)[c];
      *reinterpret_cast<uint4*>(&ks[j * kWLd + c * 8]) = v;
    }
    __syncthreads();
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kWNI / 16];
#pragma unroll
    for (int hb = 0; hb < kWNI / 16; ++hb) wmma::fill_fragment(acc[hb], 0.f);
#pragma unroll
    for (int kk = 0; kk < kWDI / 16; ++kk) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
      wmma::load_matrix_sync(b, &ks[(warp * 16) * kWLd + kk * 16], kWLd);
#pragma unroll
      for (int hb = 0; hb < kWNI / 16; ++hb) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::load_matrix_sync(a, &qs[(hb * 16) * kWLd + kk * 16], kWLd);
        wmma::mma_sync(acc[hb], a, b, acc[hb]);
      }
    }
    __syncthreads();  // all warps done reading ks before it becomes the score slab
#pragma unroll
    for (int hb = 0; hb < kWNI / 16; ++hb)
      wmma::store_matrix_sync(&sc[(hb * 16) * kWScLd + warp * 16], acc[hb], kWScLd,
                              wmma::mem_row_major);
    __syncthreads();
    if (tid < kWKeys && k0 + tid < n) {
      float s = 0.f;
#pragma unroll 16
      for (int h = 0; h < kWNI; ++h) s += ws[h] * fmaxf(sc[h * kWScLd + tid], 0.f);
      scores[r * ld + k0 + tid] = s * scale;
    }
  }
}

// Plain path (any nI, dI with nI·dI ≤ 12288): one thread per key, q row in shared memory (f32).
__global__ void indexer_plain_kernel(const __nv_bfloat16* __restrict__ q, const float* __restrict__ w,
                                     const __nv_bfloat16* __restrict__ keys,
                                     const int64_t* __restrict__ key_begin,
                                     const int32_t* __restrict__ n_keys, int nI, int dI,
                                     float scale, float* __restrict__ scores, int64_t ld) {
  extern __shared__ float qsf[];  // [nI*dI] then w [nI]
  const int64_t r = blockIdx.y;
  const int n = n_keys[r];
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (int64_t(blockIdx.x) * blockDim.x >= n) return;
  for (int i = threadIdx.x; i < nI * dI; i += blockDim.x)
    qsf[i] = __bfloat162float(q[r * nI * dI + i]);
  for (int i = threadIdx.x; i < nI; i += blockDim.x) qsf[nI * dI + i] = w[r * nI + i];
  __syncthreads();
  if (s >= n) return;
  const __nv_bfloat16* kp = keys + (key_begin[r] + s) * dI;
  float acc = 0.f;
  for (int h = 0; h < nI; ++h) {
    float d = 0.f;
    for (int c = 0; c < dI; ++c) d += qsf[h * dI + c] * __bfloat162float(kp[c]);
    acc += qsf[nI * dI + h] * fmaxf(d, 0.f);
  }
  scores[r * ld + s] = acc * scale;
}

// ------------------------------------------------------------------------------------------------
// Top-k radix select

template <int C, int THREADS, int ITEMS, bool AGG>
__global__ void __launch_bounds__(THREADS, 1)
    topk_kernel(const float* __restrict__ scores, int64_t ld, const int32_t* __restrict__ nrows,
                int k, int32_t* __restrict__ out, int32_t* __restrict__ out_len) {
  static_assert(ITEMS % 4 == 0, "ITEMS must be a multiple of 4");
  using ScanI = cub::BlockScan<int, THREADS>;
  using ScanL = cub::BlockScan<unsigned long long, THREADS>;
  __shared__ uint32_t hist[2][4096];
  __shared__ union {
    typename ScanI::TempStorage i;
    typename ScanL::TempStorage l;
  } tmp;
  __shared__ int s_digit, s_above;
  __shared__ unsigned long long s_tot;

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const int64_t r = blockIdx.y;
  const int n = max(nrows[r], 0);
  const float* row = scores + r * ld;
  int32_t* orow = out + r * int64_t(k);
  const int tid = threadIdx.x, lane = tid & 31;

  if (n <= k) {  // short row: everything, in index order, then −1 padding (cluster-uniform)
    for (int i = rank * THREADS + tid; i < k; i += C * THREADS) orow[i] = i < n ? i : -1;
    if (out_len && rank == 0 && tid == 0) out_len[r] = n;
    return;
  }

  // This thread's contiguous slice [start, start + cnt) of the row, as order keys.
  int P = (n + C * THREADS - 1) / (C * THREADS);
  P = (P + 3) & ~3;
  const int64_t start = int64_t(rank * THREADS + tid) * P;
  const int64_t left = int64_t(n) - start;
  const int cnt = left <= 0 ? 0 : (left < P ? int(left) : P);
  const bool vec = (reinterpret_cast<uintptr_t>(row) & 15) == 0;
  uint32_t key[ITEMS];
#pragma unroll
  for (int i = 0; i < ITEMS; i += 4) {
    if (i < P) {
      if (vec && i + 4 <= cnt) {
        float4 v = __ldg(reinterpret_cast<const float4*>(row + start + i));
        key[i] = order_key(v.x);
        key[i + 1] = order_key(v.y);
        key[i + 2] = order_key(v.z);
        key[i + 3] = order_key(v.w);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) key[i + j] = (i + j < cnt) ? order_key(row[start + i + j]) : 0u;
      }
    }
  }

  uint32_t prefix = 0;
  int krem = k;
#pragma unroll
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 20 : (pass == 1 ? 8 : 0);
    const int nb = pass == 2 ? 256 : 4096;
    const uint32_t hi_mask = pass == 0 ? 0u : (pass == 1 ? 0xfff00000u : 0xffffff00u);
    uint32_t* h = hist[pass & 1];
    for (int b = tid; b < nb; b += THREADS) h[b] = 0;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      if (i < P) {
        const bool act = i < cnt && (key[i] & hi_mask) == prefix;
        const uint32_t d = (key[i] >> shift) & uint32_t(nb - 1);
        if constexpr (AGG) {
          const unsigned am = __ballot_sync(0xffffffffu, act);
          if (act) {
            const unsigned peers = __match_any_sync(am, d);
            if (lane == __ffs(peers) - 1) atomicAdd(&h[d], uint32_t(__popc(peers)));
          }
        } else {
          if (act) atomicAdd(&h[d], 1u);
        }
      }
    }
    cluster.sync();  // every CTA's histogram complete and visible cluster-wide
    constexpr int kBptWide = 4096 / THREADS > 0 ? 4096 / THREADS : 1;
    const int bpt = pass == 2 ? (256 / THREADS > 0 ? 256 / THREADS : 1) : kBptWide;
    int c[kBptWide];
    int sum = 0;
#pragma unroll
    for (int j = 0; j < kBptWide; ++j) {
      c[j] = 0;
      const int b = nb - 1 - (tid * bpt + j);
      if (j < bpt && b >= 0) {
#pragma unroll
        for (int q = 0; q < C; ++q) c[j] += int(cluster.map_shared_rank(h, q)[b]);
      }
      sum += c[j];
    }
    int excl;
    ScanI(tmp.i).ExclusiveSum(sum, excl);
#pragma unroll
    for (int j = 0; j < kBptWide; ++j) {
      const int b = nb - 1 - (tid * bpt + j);
      if (j < bpt && b >= 0 && excl < krem && excl + c[j] >= krem) {
        s_digit = b;
        s_above = excl;
      }
      excl += c[j];
    }
    __syncthreads();
    prefix |= uint32_t(s_digit) << shift;
    krem -= s_above;
    __syncthreads();
  }

  // prefix is now the k-th key T; krem = how many keys equal to T are taken (lowest index first).
  const uint32_t T = prefix;
  int gt = 0, eq = 0;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i)
    if (i < cnt) {
      gt += key[i] > T;
      eq += key[i] == T;
    }
  unsigned long long packed = (static_cast<unsigned long long>(gt) << 32) | unsigned(eq), excl, agg;
  ScanL(tmp.l).ExclusiveSum(packed, excl, agg);
  if (tid == 0) s_tot = agg;
  cluster.sync();
  unsigned long long before = 0;
  for (int q = 0; q < rank; ++q) before += *cluster.map_shared_rank(&s_tot, q);
  cluster.sync();  // remote reads done before any CTA of the cluster exits
  excl += before;
  int gt_b = int(excl >> 32), eq_b = int(excl & 0xffffffffu);
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (i < cnt) {
      const uint32_t kk = key[i];
      if (kk > T) {
        orow[gt_b + min(eq_b, krem)] = int32_t(start + i);
        ++gt_b;
      } else if (kk == T) {
        if (eq_b < krem) orow[gt_b + eq_b] = int32_t(start + i);
        ++eq_b;
      }
    }
  }
  if (out_len && rank == 0 && tid == 0) out_len[r] = k;
}

template <int C, int THREADS, int ITEMS, bool AGG>
Status launch_topk(const float* scores, int64_t ld, const int32_t* n, int64_t R, int k,
                   int32_t* out, int32_t* out_len, cudaStream_t stream) {
  auto kern = topk_kernel<C, THREADS, ITEMS, AGG>;
  if constexpr (C > 8) {
    static bool attr_set = false;
    if (!attr_set) {
      V4_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
      attr_set = true;
    }
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(C, unsigned(R), 1);
  cfg.blockDim = dim3(THREADS, 1, 1);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = C;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  V4_CUDA_TRY(cudaLaunchKernelEx(&cfg, kern, scores, ld, n, k, out, out_len));
  return Status::Ok();
}

__global__ void iota_rows_kernel(int32_t* idx, int64_t R, int64_t n, int* offsets) {
  int64_t total = R * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    idx[i] = int32_t(i % n);
  }
  if (blockIdx.x == 0)
    for (int64_t i = threadIdx.x; i <= R; i += blockDim.x) offsets[i] = int(i * n);
}

}  // namespace

Status indexer_scores(const __nv_bfloat16* q, const float* w, const __nv_bfloat16* keys,
                      const int64_t* key_begin, const int32_t* n_keys, int64_t R, int nI, int dI,
                      float scale, float* scores, int64_t ld, int64_t max_keys,
                      cudaStream_t stream) {
  if (R <= 0 || max_keys <= 0) return Status::Ok();
  if (nI < 1 || dI < 1 || R > 65535 || ld < max_keys)
    return errorf(ErrorCode::kInvalidArgument,
                      "indexer_scores: R={} nI={} dI={} ld={} max_keys={}", R, nI, dI, ld, max_keys);
  if (nI == kWNI && dI == kWDI) {
    int64_t per = int64_t(kWTiles) * kWKeys;
    dim3 grid(unsigned((max_keys + per - 1) / per), unsigned(R));
    indexer_wmma_kernel<<<grid, 128, 0, stream>>>(q, w, keys, key_begin, n_keys, scale, scores, ld);
    V4_CUDA_CHECK_LAUNCH("indexer_wmma_kernel");
    return Status::Ok();
  }
  if (int64_t(nI) * dI > 12288)
    return errorf(ErrorCode::kUnsupported,
                      "indexer_scores: nI·dI = {} too large for the plain path", nI * dI);
  dim3 grid(unsigned((max_keys + 255) / 256), unsigned(R));
  size_t smem = size_t(nI * dI + nI) * sizeof(float);
  indexer_plain_kernel<<<grid, 256, smem, stream>>>(q, w, keys, key_begin, n_keys, nI, dI, scale,
                                                    scores, ld);
  V4_CUDA_CHECK_LAUNCH("indexer_plain_kernel");
  return Status::Ok();
}

Status topk_rows(const float* scores, int64_t ld, const int32_t* n, int64_t R, int k,
                 int64_t max_n, int32_t* out_idx, int32_t* out_len, cudaStream_t stream,
                 int variant) {
  if (R <= 0) return Status::Ok();
  if (k < 1 || R > 65535 || max_n > kTopkMaxRow || max_n > ld)
    return errorf(ErrorCode::kInvalidArgument, "topk_rows: k={} R={} max_n={} ld={}", k, R,
                      max_n, ld);
  if (variant == 0) {
    variant = max_n <= 8192 ? 1 : max_n <= 32768 ? 2 : max_n <= 262144 ? 3 : 5;
  }
  constexpr int T = 512;
  switch (variant) {
    case 1:
      if (max_n > 1 * T * 16) break;
      return launch_topk<1, T, 16, true>(scores, ld, n, R, k, out_idx, out_len, stream);
    case 2:
      if (max_n > 1 * T * 64) break;
      return launch_topk<1, T, 64, true>(scores, ld, n, R, k, out_idx, out_len, stream);
    case 3:
      if (max_n > 8 * T * 64) break;
      return launch_topk<8, T, 64, true>(scores, ld, n, R, k, out_idx, out_len, stream);
    case 4:
      if (max_n > 16 * T * 32) break;
      return launch_topk<16, T, 32, true>(scores, ld, n, R, k, out_idx, out_len, stream);
    case 5:
      if (max_n > 16 * T * 64) break;
      return launch_topk<16, T, 64, true>(scores, ld, n, R, k, out_idx, out_len, stream);
    case 6:  // cluster 8×64 without warp-aggregated atomics (benchmark comparison)
      if (max_n > 8 * T * 64) break;
      return launch_topk<8, T, 64, false>(scores, ld, n, R, k, out_idx, out_len, stream);
    default:
      break;
  }
  return errorf(ErrorCode::kInvalidArgument, "topk_rows: variant {} cannot take rows of {}",
                    variant, max_n);
}

Status topk_cub_sort_baseline(const float* scores, int64_t R, int64_t n, float* keys_tmp,
                              int32_t* idx_in, int32_t* idx_sorted, void* temp,
                              size_t* temp_bytes, cudaStream_t stream) {
  const size_t off_bytes = ((size_t(R) + 1) * sizeof(int) + 255) / 256 * 256;
  size_t cub_bytes = 0;
  int* offsets = temp ? static_cast<int*>(temp) : nullptr;
  V4_CUDA_TRY(cub::DeviceSegmentedSort::SortPairsDescending(
      nullptr, cub_bytes, scores, keys_tmp, idx_in, idx_sorted, R * n, R, offsets,
      offsets ? offsets + 1 : nullptr, stream));
  if (!temp) {
    *temp_bytes = off_bytes + cub_bytes;
    return Status::Ok();
  }
  if (*temp_bytes < off_bytes + cub_bytes)
    return errorf(ErrorCode::kInvalidArgument, "topk_cub_sort_baseline: temp too small");
  iota_rows_kernel<<<1024, 256, 0, stream>>>(idx_in, R, n, offsets);
  V4_CUDA_CHECK_LAUNCH("iota_rows_kernel");
  V4_CUDA_TRY(cub::DeviceSegmentedSort::SortPairsDescending(
      static_cast<char*>(temp) + off_bytes, cub_bytes, scores, keys_tmp, idx_in, idx_sorted, R * n,
      R, offsets, offsets + 1, stream));
  return Status::Ok();
}

}  // namespace v4::cuda
