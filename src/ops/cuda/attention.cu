#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// Split-KV sparse MQA attention with sink (see attention.h).
#include <algorithm>
#include <cmath>

#include "ops/cuda/attention.h"
#include "ops/cuda/device_util.cuh"  // kv_row_load, kv_row_load4 (f32, bf16 or fp8 pools)

namespace v4::cuda {
namespace {

constexpr int kWarps = 8;               // warps per block
constexpr int kHeadsPerWarp = 2;        // heads per warp
constexpr int kHeadsPerBlock = kWarps * kHeadsPerWarp;
constexpr int kTileKeys = 16;           // keys per shared-memory tile (= 32 / kHeadsPerWarp)
static_assert(kTileKeys * kHeadsPerWarp == 32, "one (head, key) logit per lane after the reduction");

/// Physical pool row of key j of row t (SWA keys first, then compressed keys), −1 = skip.
__device__ __forceinline__ int32_t key_row(const ops::AttentionArgs& a, int64_t t, int j,
                                           int n_swa) {
  if (j < n_swa) return a.swa.rows[a.swa.offset[t] + j];
  return a.comp.rows[a.comp.offset[t] + (j - n_swa)];
}

// One step of the reduce-scatter: lanes pair up across `off`, each keeps half of its 2·off values.
template <int OFF>
__device__ __forceinline__ void reduce_scatter_step(float* v, int lane) {
  const bool upper = lane & OFF;
#pragma unroll
  for (int k = 0; k < OFF; ++k) {
    const float send = upper ? v[k] : v[k + OFF];
    const float keep = upper ? v[k + OFF] : v[k];
    v[k] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
  }
}

// PER = values per lane per head (hd ≤ 32·PER). Per tile of 16 keys a warp forms the 32 partial
// dot products (2 heads × 16 keys) of its lane's dims, reduce-scatters them so lane L holds the
// full logit of (head L/16, key L%16), does one online-softmax update per head for the tile, and
// accumulates p·key into its output dims. All orders are fixed (deterministic).
template <int PER>
__global__ void __launch_bounds__(kWarps * 32) attn_split_kernel(ops::AttentionArgs a,
                                                                 int n_splits,
                                                                 float* __restrict__ ws) {
  extern __shared__ float tile[];  // [kTileKeys][hd]
  __shared__ int32_t rows_s[kTileKeys];
  __shared__ int8_t comp_s[kTileKeys];
  const int64_t t = blockIdx.z;
  const int s = blockIdx.x;
  const int H = a.n_heads, hd = a.head_dim;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_swa = (a.swa_pool && a.swa.count) ? a.swa.count[t] : 0;
  const int n_comp = (a.comp_pool && a.comp.count) ? a.comp.count[t] : 0;
  const int n = n_swa + n_comp;
  const int per_split = (n + n_splits - 1) / n_splits;
  const int k0 = s * per_split;
  const int k1 = min(n, k0 + per_split);

  const int h0 = blockIdx.y * kHeadsPerBlock + warp * kHeadsPerWarp;
  float q[kHeadsPerWarp][PER], o[kHeadsPerWarp][PER], m[kHeadsPerWarp], l[kHeadsPerWarp];
#pragma unroll
  for (int i = 0; i < kHeadsPerWarp; ++i) {
    const int h = h0 + i;
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int c = lane + 32 * j;
      q[i][j] = (h < H && c < hd) ? a.q[(t * H + h) * hd + c] * a.scale : 0.f;
      o[i][j] = 0.f;
    }
  }
  const bool vec4 = (hd % 4) == 0;
  const int my_head = lane / kTileKeys, my_key = lane % kTileKeys;
  // Software pipeline (vec4 path): the next tile's float4s are loaded into registers while the
  // current tile is computed from shared memory.
  constexpr int kLoads = (kTileKeys * 8 * PER + kWarps * 32 - 1) / (kWarps * 32);  // float4/thread
  const int w4 = hd / 4;
  float4 pre[kLoads];
  auto load_tile = [&](int kb) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int e = threadIdx.x + i * kWarps * 32;
      pre[i] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (e < kTileKeys * w4) {
        const int key = e / w4, c4 = e - key * w4;
        const int j = kb + key;
        if (j < k1) {
          const int32_t r = key_row(a, t, j, n_swa);
          if (r >= 0) {
            const void* pool = j >= n_swa ? a.comp_pool : a.swa_pool;
            pre[i] = kv_row_load4(pool, a.kv_dtype, r, hd, 4 * c4, a.rope_dim);
          }
        }
      }
    }
  };
  if (vec4 && k0 < k1) load_tile(k0);
  for (int kb = k0; kb < k1; kb += kTileKeys) {
    const int nk = min(kTileKeys, k1 - kb);
    if (threadIdx.x < kTileKeys) {
      const int j = kb + threadIdx.x;
      rows_s[threadIdx.x] = threadIdx.x < nk ? key_row(a, t, j, n_swa) : -1;
      comp_s[threadIdx.x] = j >= n_swa;
    }
    if (vec4) {
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int e = threadIdx.x + i * kWarps * 32;
        if (e < kTileKeys * w4) reinterpret_cast<float4*>(tile)[e] = pre[i];
      }
      __syncthreads();
      if (kb + kTileKeys < k1) load_tile(kb + kTileKeys);
    } else {
      __syncthreads();
      for (int e = threadIdx.x; e < kTileKeys * hd; e += blockDim.x) {
        const int key = e / hd, c = e - key * hd;
        const int32_t r = rows_s[key];
        const void* pool = comp_s[key] ? a.comp_pool : a.swa_pool;
        tile[key * hd + c] = r >= 0 ? kv_row_load(pool, a.kv_dtype, r, hd, c, a.rope_dim) : 0.f;
      }
      __syncthreads();
    }
    // Partial logits of this lane's dims: v[i·16 + key].
    float v[32];
#pragma unroll
    for (int key = 0; key < kTileKeys; ++key) {
      float d0 = 0.f, d1 = 0.f;
#pragma unroll
      for (int j = 0; j < PER; ++j) {
        const int c = lane + 32 * j;
        const float kv = c < hd ? tile[key * hd + c] : 0.f;
        d0 = fmaf(q[0][j], kv, d0);
        d1 = fmaf(q[1][j], kv, d1);
      }
      v[key] = d0;
      v[kTileKeys + key] = d1;
    }
    reduce_scatter_step<16>(v, lane);
    reduce_scatter_step<8>(v, lane);
    reduce_scatter_step<4>(v, lane);
    reduce_scatter_step<2>(v, lane);
    reduce_scatter_step<1>(v, lane);
    // Lane L holds the logit of (head L/16, key L%16).
    const float logit = rows_s[my_key] >= 0 ? v[0] : -INFINITY;
    float tmax = logit;
#pragma unroll
    for (int off = 8; off; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
    const float m_old = my_head == 0 ? m[0] : m[1];
    const float m_new = fmaxf(m_old, tmax);
    const float p = m_new == -INFINITY ? 0.f : __expf(logit - m_new);
    float psum = p;
#pragma unroll
    for (int off = 8; off; off >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
    float corr_h[kHeadsPerWarp], mnew_h[kHeadsPerWarp];
#pragma unroll
    for (int i = 0; i < kHeadsPerWarp; ++i) {
      mnew_h[i] = __shfl_sync(0xffffffffu, m_new, i * kTileKeys);
      const float ps = __shfl_sync(0xffffffffu, psum, i * kTileKeys);
      corr_h[i] = mnew_h[i] == -INFINITY ? 1.f : __expf(m[i] - mnew_h[i]);
      l[i] = l[i] * corr_h[i] + ps;
      m[i] = mnew_h[i];
#pragma unroll
      for (int j = 0; j < PER; ++j) o[i][j] *= corr_h[i];
    }
#pragma unroll
    for (int key = 0; key < kTileKeys; ++key) {
      const float p0 = __shfl_sync(0xffffffffu, p, key);
      const float p1 = __shfl_sync(0xffffffffu, p, kTileKeys + key);
#pragma unroll
      for (int j = 0; j < PER; ++j) {
        const int c = lane + 32 * j;
        const float kv = c < hd ? tile[key * hd + c] : 0.f;
        o[0][j] = fmaf(p0, kv, o[0][j]);
        o[1][j] = fmaf(p1, kv, o[1][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kHeadsPerWarp; ++i) {
    const int h = h0 + i;
    if (h >= H) continue;
    if (n_splits == 1) {
      const float sink = a.sinks[h];
      const float M = fmaxf(m[i], sink);
      const float f = m[i] == -INFINITY ? 0.f : __expf(m[i] - M);  // no keys → sink only
      const float inv = 1.f / (l[i] * f + __expf(sink - M));
      float* out = a.out + (t * H + h) * hd;
#pragma unroll
      for (int j = 0; j < PER; ++j) {
        const int c = lane + 32 * j;
        if (c < hd) out[c] = o[i][j] * f * inv;
      }
    } else {
      float* pw = ws + ((t * H + h) * n_splits + s) * int64_t(hd + 2);
      if (lane == 0) {
        pw[0] = m[i];
        pw[1] = l[i];
      }
#pragma unroll
      for (int j = 0; j < PER; ++j) {
        const int c = lane + 32 * j;
        if (c < hd) pw[2 + c] = o[i][j];
      }
    }
  }
}

// Merges the n_splits partials of (t, h) with the sink: one block per (t, h). The split weights
// exp(m_s − M) / L are computed once into shared memory; each thread then sums its output
// channels over the splits with independent loads.
constexpr int kMaxCombineSplits = 256;
__global__ void attn_combine_kernel(ops::AttentionArgs a, int n_splits,
                                    const float* __restrict__ ws) {
  __shared__ float fs[kMaxCombineSplits];
  __shared__ float red[32];
  const int64_t th = blockIdx.x;
  const int H = a.n_heads, hd = a.head_dim;
  const int h = int(th % H);
  const float* p = ws + th * n_splits * int64_t(hd + 2);
  const float sink = a.sinks[h];
  // M = max(sink, m_s) (fixed order), then L = exp(sink − M) + Σ l_s exp(m_s − M).
  float M = sink;
  for (int s = 0; s < n_splits; ++s) M = fmaxf(M, p[s * int64_t(hd + 2)]);
  for (int s = threadIdx.x; s < n_splits; s += blockDim.x) {
    const float m = p[s * int64_t(hd + 2)];
    fs[s] = m == -INFINITY ? 0.f : __expf(m - M);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float L = __expf(sink - M);
    for (int s = 0; s < n_splits; ++s) L += p[s * int64_t(hd + 2) + 1] * fs[s];
    red[0] = 1.f / L;
  }
  __syncthreads();
  const float inv = red[0];
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    float acc = 0.f;
#pragma unroll 8
    for (int s = 0; s < n_splits; ++s) acc = fmaf(p[s * int64_t(hd + 2) + 2 + c], fs[s], acc);
    a.out[th * hd + c] = acc * inv;
  }
}

template <int PER>
Status launch(const ops::AttentionArgs& a, int n_splits, float* ws, cudaStream_t stream) {
  const size_t smem = size_t(kTileKeys) * a.head_dim * sizeof(float);
  dim3 grid(unsigned(n_splits), unsigned((a.n_heads + kHeadsPerBlock - 1) / kHeadsPerBlock),
            unsigned(a.n_rows));
  attn_split_kernel<PER><<<grid, kWarps * 32, smem, stream>>>(a, n_splits, ws);
  V4_RETURN_IF_ERROR(check_launch("attn_split_kernel"));
  if (n_splits > 1) return attention_combine(a, n_splits, ws, stream);
  return Status::Ok();
}

}  // namespace

Status attention_combine(const ops::AttentionArgs& a, int n_splits, const float* workspace,
                         cudaStream_t stream) {
  if (n_splits > kMaxCombineSplits)
    return errorf(ErrorCode::kInvalidArgument, "attention_combine: {} splits > {}", n_splits,
                  kMaxCombineSplits);
  attn_combine_kernel<<<unsigned(a.n_rows * a.n_heads), 256, 0, stream>>>(a, n_splits, workspace);
  return check_launch("attn_combine_kernel");
}

int64_t attention_workspace_floats(int64_t S, int H, int hd, int n_splits) {
  return n_splits > 1 ? S * H * int64_t(n_splits) * (hd + 2) : 0;
}

int attention_auto_splits(int64_t S, int H, int64_t max_keys, int n_sms, int heads_per_block) {
  const int64_t blocks = S * ((H + heads_per_block - 1) / heads_per_block);
  const int64_t want = 2 * int64_t(n_sms);
  if (blocks >= want || max_keys <= 64) return 1;
  const int64_t by_fill = (want + blocks - 1) / blocks;
  const int64_t by_keys = std::max<int64_t>(1, max_keys / 64);
  return int(std::max<int64_t>(1, std::min<int64_t>({by_fill, by_keys, 128})));
}

Status sparse_attention_split(const ops::AttentionArgs& a, int n_splits, float* workspace,
                              cudaStream_t stream) {
  if (a.n_rows <= 0) return Status::Ok();
  if (a.head_dim > kAttnSplitMaxHd || a.head_dim <= 0)
    return errorf(ErrorCode::kInvalidArgument, "sparse_attention_split: head_dim {} not in [1, {}]",
                  a.head_dim, kAttnSplitMaxHd);
  if (n_splits < 1 || n_splits > kMaxCombineSplits || (n_splits > 1 && !workspace))
    return errorf(ErrorCode::kInvalidArgument, "sparse_attention_split: n_splits {} (workspace {})",
                  n_splits, workspace ? "set" : "missing");
  if (a.kv_dtype == KvDtype::kFp8 &&
      (a.rope_dim < 0 || a.rope_dim > a.head_dim || (a.head_dim - a.rope_dim) % 4 != 0))
    return errorf(ErrorCode::kInvalidArgument,
                  "sparse_attention_split: fp8 rows need (head_dim − rope_dim) % 4 == 0 "
                  "(head_dim {}, rope_dim {})",
                  a.head_dim, a.rope_dim);
  const int per = (a.head_dim + 31) / 32;
  if (per <= 1) return launch<1>(a, n_splits, workspace, stream);
  if (per <= 2) return launch<2>(a, n_splits, workspace, stream);
  if (per <= 4) return launch<4>(a, n_splits, workspace, stream);
  if (per <= 8) return launch<8>(a, n_splits, workspace, stream);
  return launch<16>(a, n_splits, workspace, stream);
}

}  // namespace v4::cuda
