#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// Tensor-core (TF32 mma.sync) sparse MQA attention with sink for head_dim 512 (see attention.h).
//
// Block = one query row t × 64 heads × one key split; 8 warps: warp w owns heads
// 16·(w/2) .. +15 and output dims 256·(w%2) .. +255. Per tile of 16 keys (f32 rows gathered by
// cp.async into a double-buffered shared tile):
//   1. S_half = Q[16 heads, my 256 dims] · K[16 keys, my 256 dims]ᵀ  (32 k-steps × 2 n-tiles of
//      m16n8k8 TF32 mma), the two dim halves add their partial S through shared memory in a fixed
//      order (both warps of a head group get the same S);
//   2. online softmax per head row on the accumulator layout (rows g and g+8 of each lane);
//   3. O[16 heads, my 256 dims] += P[16, 16 keys] · V[16 keys, my 256 dims] (P re-read from
//      shared memory in the A-operand layout; 2 k-steps × 32 n-tiles).
// TF32 keeps 10 mantissa bits of q, k and p (fp32 accumulate): results are within ~1e-3 of the
// fp32 op, so the backend uses this kernel only when batch invariance / fp32 are not required.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "ops/cuda/attention.h"

namespace v4::cuda {
namespace {

constexpr int kHd = 512;
constexpr int kHeads = 64;     // heads per block
constexpr int kKT = 16;        // keys per tile
constexpr int kLd = kHd + 4;   // padded row stride (floats) of Q and K tiles
constexpr int kThreads = 256;  // 8 warps

constexpr size_t kQBytes = size_t(kHeads) * kLd * 4;
constexpr size_t kKBytes = size_t(kKT) * kLd * 4;
constexpr size_t kXBytes = size_t(8) * 16 * 16 * 4;  // per-warp 16×16 exchange (S partials, P)
constexpr size_t kSmem = kQBytes + 2 * kKBytes + 2 * kXBytes;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // 0 source bytes → zero fill
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// D = A·B + D, m16n8k8 TF32 (row.col), fp32 accumulate.
__device__ __forceinline__ void mma_tf32(float* d, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ int32_t key_row(const ops::AttentionArgs& a, int64_t t, int j,
                                           int n_swa) {
  if (j < n_swa) return a.swa.rows[a.swa.offset[t] + j];
  return a.comp.rows[a.comp.offset[t] + (j - n_swa)];
}

__global__ void __launch_bounds__(kThreads, 1) attn_mma_kernel(ops::AttentionArgs a, int n_splits,
                                                               float* __restrict__ ws) {
  extern __shared__ __align__(128) unsigned char smem[];
  float* qs = reinterpret_cast<float*>(smem);
  float* ks0 = reinterpret_cast<float*>(smem + kQBytes);
  float* xs = reinterpret_cast<float*>(smem + kQBytes + 2 * kKBytes);  // [8 warps][16][16]
  float* ps = xs + 8 * 256;                                            // [8 warps][16][16]
  __shared__ int32_t rows_s[2][kKT];

  const int64_t t = blockIdx.z;
  const int s = blockIdx.x;
  const int H = a.n_heads;
  const int hb = blockIdx.y * kHeads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, tq = lane & 3;
  const int hg = warp >> 1, half = warp & 1;
  const int n_swa = (a.swa_pool && a.swa.count) ? a.swa.count[t] : 0;
  const int n_comp = (a.comp_pool && a.comp.count) ? a.comp.count[t] : 0;
  const int n = n_swa + n_comp;
  const int per_split = (n + n_splits - 1) / n_splits;
  const int k0 = s * per_split;
  const int k1 = min(n, k0 + per_split);

  // Q of the block's 64 heads (f32, unscaled; the scale is applied to the logits), copied with
  // cp.async in the same group as the first key tile so both loads overlap.
  for (int e = threadIdx.x; e < kHeads * (kHd / 4); e += kThreads) {
    const int h = e / (kHd / 4), c4 = e % (kHd / 4);
    const bool ok = hb + h < H;
    cp_async16(qs + h * kLd + 4 * c4, ok ? a.q + (t * H + hb + h) * kHd + 4 * c4 : a.q, ok);
  }
  auto issue_tile = [&](int kb, int buf) {
    float* ks = ks0 + buf * (kKT * kLd);
    // 16 keys × 128 chunks of 16 bytes = 2048 chunks, 8 per thread.
    for (int e = threadIdx.x; e < kKT * (kHd / 4); e += kThreads) {
      const int key = e / (kHd / 4), c4 = e % (kHd / 4);
      const int j = kb + key;
      int32_t r = -1;
      // f32 pools only (the host function refuses others): rows staged as f32 with cp.async.
      const float* pool = static_cast<const float*>(a.swa_pool);
      if (j < k1) {
        r = key_row(a, t, j, n_swa);
        pool = static_cast<const float*>(j >= n_swa ? a.comp_pool : a.swa_pool);
      }
      const float* src = r >= 0 ? pool + int64_t(r) * kHd + 4 * c4 : a.q;
      cp_async16(ks + key * kLd + 4 * c4, src, r >= 0);
    }
    if (threadIdx.x < kKT) {
      const int j = kb + threadIdx.x;
      rows_s[buf][threadIdx.x] = j < k1 ? key_row(a, t, j, n_swa) : -1;
    }
    cp_async_commit();
  };

  float o[32][4];  // 32 n-tiles of 8 dims × (rows g, g+8)
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};  // rows g, g+8

  const float* qw = qs + (hg * 16) * kLd + half * 256;
  float* xw = xs + warp * 256;
  float* xp = xs + (warp ^ 1) * 256;  // partner (other dim half of the same head group)
  float* pw = ps + warp * 256;
  int buf = 0;
  if (k0 < k1) {
    issue_tile(k0, 0);  // commits the Q copies with tile 0
  } else {
    cp_async_commit();
    cp_async_wait<0>();
  }
  for (int kb = k0; kb < k1; kb += kKT, buf ^= 1) {
    if (kb + kKT < k1) {
      issue_tile(kb + kKT, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* kt = ks0 + buf * (kKT * kLd) + half * 256;
    // 1. partial S over my 256 dims: 2 n-tiles (keys 0-7, 8-15).
    float sacc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll 8
    for (int kk = 0; kk < 256; kk += 8) {
      uint32_t af[4];
      af[0] = tf32(qw[g * kLd + kk + tq]);
      af[1] = tf32(qw[(g + 8) * kLd + kk + tq]);
      af[2] = tf32(qw[g * kLd + kk + tq + 4]);
      af[3] = tf32(qw[(g + 8) * kLd + kk + tq + 4]);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        uint32_t bf[2];
        bf[0] = tf32(kt[(nt * 8 + g) * kLd + kk + tq]);
        bf[1] = tf32(kt[(nt * 8 + g) * kLd + kk + tq + 4]);
        mma_tf32(sacc[nt], af, bf);
      }
    }
    // Exchange partial S with the partner warp; S = S_half0 + S_half1 in that order.
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      xw[g * 16 + nt * 8 + 2 * tq] = sacc[nt][0];
      xw[g * 16 + nt * 8 + 2 * tq + 1] = sacc[nt][1];
      xw[(g + 8) * 16 + nt * 8 + 2 * tq] = sacc[nt][2];
      xw[(g + 8) * 16 + nt * 8 + 2 * tq + 1] = sacc[nt][3];
    }
    __syncthreads();
    float sv[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int c0 = nt * 8 + 2 * tq;
      const float* first = half == 0 ? xw : xp;
      const float* second = half == 0 ? xp : xw;
      sv[nt][0] = (first[g * 16 + c0] + second[g * 16 + c0]) * a.scale;
      sv[nt][1] = (first[g * 16 + c0 + 1] + second[g * 16 + c0 + 1]) * a.scale;
      sv[nt][2] = (first[(g + 8) * 16 + c0] + second[(g + 8) * 16 + c0]) * a.scale;
      sv[nt][3] = (first[(g + 8) * 16 + c0 + 1] + second[(g + 8) * 16 + c0 + 1]) * a.scale;
      const bool v0 = rows_s[buf][c0] >= 0, v1 = rows_s[buf][c0 + 1] >= 0;
      if (!v0) sv[nt][0] = sv[nt][2] = -INFINITY;
      if (!v1) sv[nt][1] = sv[nt][3] = -INFINITY;
    }
    // 2. online softmax per row (r = 0: row g, r = 1: row g+8); a row's 16 values sit in the
    // 4 lanes of a quad.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = fmaxf(fmaxf(sv[0][2 * r], sv[0][2 * r + 1]), fmaxf(sv[1][2 * r], sv[1][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_r[r], mx);
      const float corr = m_new == -INFINITY ? 1.f : __expf(m_r[r] - m_new);
      float psum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float v = sv[nt][2 * r + c];
          const float p = v == -INFINITY ? 0.f : __expf(v - m_new);
          sv[nt][2 * r + c] = p;
          psum += p;
        }
      psum += __shfl_xor_sync(0xffffffffu, psum, 1);
      psum += __shfl_xor_sync(0xffffffffu, psum, 2);
      l_r[r] = l_r[r] * corr + psum;
      m_r[r] = m_new;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        o[i][2 * r] *= corr;
        o[i][2 * r + 1] *= corr;
      }
    }
    // P to shared memory (row-major 16×16) for the A-operand layout.
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      pw[g * 16 + nt * 8 + 2 * tq] = sv[nt][0];
      pw[g * 16 + nt * 8 + 2 * tq + 1] = sv[nt][1];
      pw[(g + 8) * 16 + nt * 8 + 2 * tq] = sv[nt][2];
      pw[(g + 8) * 16 + nt * 8 + 2 * tq + 1] = sv[nt][3];
    }
    __syncwarp();
    // 3. O += P · V over 2 k-steps of 8 keys, 32 n-tiles of 8 dims.
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      uint32_t af[4];
      af[0] = tf32(pw[g * 16 + ks * 8 + tq]);
      af[1] = tf32(pw[(g + 8) * 16 + ks * 8 + tq]);
      af[2] = tf32(pw[g * 16 + ks * 8 + tq + 4]);
      af[3] = tf32(pw[(g + 8) * 16 + ks * 8 + tq + 4]);
#pragma unroll
      for (int nt = 0; nt < 32; ++nt) {
        uint32_t bf[2];
        bf[0] = tf32(kt[(ks * 8 + tq) * kLd + nt * 8 + g]);
        bf[1] = tf32(kt[(ks * 8 + tq + 4) * kLd + nt * 8 + g]);
        mma_tf32(o[nt], af, bf);
      }
    }
    __syncthreads();  // tile buffer and exchange buffers free for the next tile
  }
  // Output: rows g and g+8 of head group hg, dims half·256 + nt·8 + 2tq (+1).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = hb + hg * 16 + g + 8 * r;
    if (h >= H) continue;
    if (n_splits == 1) {
      const float sink = a.sinks[h];
      const float M = fmaxf(m_r[r], sink);
      const float f = m_r[r] == -INFINITY ? 0.f : __expf(m_r[r] - M);
      const float inv = f / (l_r[r] * f + __expf(sink - M));
      float* out = a.out + (t * H + h) * kHd + half * 256;
#pragma unroll
      for (int nt = 0; nt < 32; ++nt) {
        out[nt * 8 + 2 * tq] = o[nt][2 * r] * inv;
        out[nt * 8 + 2 * tq + 1] = o[nt][2 * r + 1] * inv;
      }
    } else {
      float* pwo = ws + ((t * H + h) * n_splits + s) * int64_t(kHd + 2);
      if (half == 0 && tq == 0) {
        pwo[0] = m_r[r];
        pwo[1] = l_r[r];
      }
#pragma unroll
      for (int nt = 0; nt < 32; ++nt) {
        pwo[2 + half * 256 + nt * 8 + 2 * tq] = o[nt][2 * r];
        pwo[2 + half * 256 + nt * 8 + 2 * tq + 1] = o[nt][2 * r + 1];
      }
    }
  }
}

}  // namespace

bool attention_mma_supported(int n_heads, int head_dim) {
  return head_dim == kHd && n_heads > 0 && n_heads % 16 == 0;
}

Status sparse_attention_mma(const ops::AttentionArgs& a, int n_splits, float* workspace,
                            cudaStream_t stream) {
  if (a.n_rows <= 0) return Status::Ok();
  if (!attention_mma_supported(a.n_heads, a.head_dim))
    return errorf(ErrorCode::kInvalidArgument, "sparse_attention_mma: H={} hd={} unsupported",
                  a.n_heads, a.head_dim);
  if (n_splits < 1 || (n_splits > 1 && !workspace))
    return errorf(ErrorCode::kInvalidArgument, "sparse_attention_mma: n_splits {}", n_splits);
  if (a.kv_dtype != KvDtype::kF32)
    return errorf(ErrorCode::kUnsupported,
                  "sparse_attention_mma: {} KV pools unsupported (f32 only; bf16 pools use the "
                  "split or decode kernel)",
                  kv_dtype_name(a.kv_dtype));
  static bool attr = false;
  if (!attr) {
    cudaError_t e = cudaFuncSetAttribute(attn_mma_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem));
    if (e != cudaSuccess) return cuda_status(e, "attn_mma smem attribute");
    attr = true;
  }
  const dim3 grid{unsigned(n_splits), unsigned((a.n_heads + kHeads - 1) / kHeads),
                  unsigned(a.n_rows)};
  attn_mma_kernel<<<grid, kThreads, kSmem, stream>>>(a, n_splits, workspace);
  V4_RETURN_IF_ERROR(check_launch("attn_mma_kernel"));
  if (n_splits > 1) return attention_combine(a, n_splits, workspace, stream);
  return Status::Ok();
}

}  // namespace v4::cuda
