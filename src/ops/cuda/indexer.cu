#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// Tensor-core indexer scores over paged f32 keys (see indexer.h).
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>

#include "ops/cuda/indexer.h"

namespace v4::cuda {
namespace {

using namespace nvcuda;

constexpr int kKT = 64;       // keys per tile
constexpr int kThreads = 256;  // 8 warps
constexpr int kPad = 8;       // bf16 row padding (keeps WMMA pointers 32-byte aligned)

struct Layout {
  int nI, dI, ldq, ldk, ldc;
  size_t q_off, k_off, c_off, w_off, r_off, bytes;
};

__host__ __device__ inline size_t align128(size_t x) { return (x + 127) / 128 * 128; }

template <int kQB>
__host__ __device__ inline Layout make_layout(int nI, int dI) {
  Layout L;
  L.nI = nI;
  L.dI = dI;
  L.ldq = dI + kPad;
  L.ldk = dI + kPad;
  L.ldc = kKT + 4;
  L.q_off = 0;
  L.k_off = align128(L.q_off + size_t(kQB) * nI * L.ldq * 2);
  L.c_off = align128(L.k_off + size_t(kKT) * L.ldk * 2);
  L.w_off = align128(L.c_off + size_t(kQB) * nI * L.ldc * 4);
  L.r_off = align128(L.w_off + size_t(kQB) * nI * 4);
  L.bytes = align128(L.r_off + size_t(kKT) * 4);
  return L;
}

// kQB = query rows per block group (1 for decode-shaped calls, 4 for prefill chunks).
template <int kQB>
__global__ void __launch_bounds__(kThreads) indexer_tc_kernel(ops::IndexerArgs a,
                                                              float* __restrict__ scores,
                                                              int64_t ld) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Layout L = make_layout<kQB>(a.n_heads, a.head_dim);
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem + L.q_off);
  __nv_bfloat16* ks = reinterpret_cast<__nv_bfloat16*>(smem + L.k_off);
  float* cs = reinterpret_cast<float*>(smem + L.c_off);
  float* wsm = reinterpret_cast<float*>(smem + L.w_off);
  int32_t* rows_s = reinterpret_cast<int32_t*>(smem + L.r_off);
  const int nI = L.nI, dI = L.dI;
  const int warp = threadIdx.x / 32;
  const int64_t t0 = int64_t(blockIdx.y) * kQB;
  const int nq = int(min(int64_t(kQB), a.n_rows - t0));
  // Rows of the group share a candidate list when their map offsets are equal.
  bool shared = true;
  for (int i = 1; i < nq; ++i) shared &= a.cand.offset[t0 + i] == a.cand.offset[t0];
  const int passes = shared ? 1 : nq;
  const float wscale = rsqrtf(float(nI)) * rsqrtf(float(dI));
  for (int pass = 0; pass < passes; ++pass) {
    const int64_t tq0 = shared ? t0 : t0 + pass;  // first query row of this pass
    const int pq = shared ? nq : 1;               // query rows of this pass
    int maxc = 0;
    for (int i = 0; i < pq; ++i) maxc = max(maxc, a.cand.count[tq0 + i]);
    if (int64_t(blockIdx.x) * kKT >= maxc) continue;
    __syncthreads();  // previous pass done with qs / wsm
    // q rows (bf16) and head weights of the pass.
    for (int e = threadIdx.x; e < pq * nI * dI; e += kThreads) {
      const int r = e / dI, c = e - r * dI;  // r = qi·nI + h
      qs[r * L.ldq + c] = __float2bfloat16(a.q[(tq0 * nI) * int64_t(dI) + e]);
    }
    for (int e = threadIdx.x; e < pq * nI; e += kThreads)
      wsm[e] = a.weights[tq0 * nI + e] * wscale;
    const int32_t* cand = a.cand.rows + a.cand.offset[tq0];
    const int mt = pq * nI / 16, nt = kKT / 16;
    for (int tile = blockIdx.x; tile * kKT < maxc; tile += gridDim.x) {
      const int s0 = tile * kKT;
      __syncthreads();  // qs/wsm written; previous tile's cs consumed
      if (threadIdx.x < kKT) {
        const int s = s0 + threadIdx.x;
        rows_s[threadIdx.x] = s < maxc ? cand[s] : -1;
      }
      __syncthreads();
      const int w4 = dI / 4;
      for (int e = threadIdx.x; e < kKT * w4; e += kThreads) {
        const int key = e / w4, c4 = e - key * w4;
        const int32_t r = rows_s[key];
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r >= 0) v = __ldg(reinterpret_cast<const float4*>(a.key_pool + int64_t(r) * dI) + c4);
        __nv_bfloat16* dst = ks + key * L.ldk + 4 * c4;
        dst[0] = __float2bfloat16(v.x);
        dst[1] = __float2bfloat16(v.y);
        dst[2] = __float2bfloat16(v.z);
        dst[3] = __float2bfloat16(v.w);
      }
      __syncthreads();
      for (int tid = warp; tid < mt * nt; tid += kThreads / 32) {
        const int mi = tid / nt, ni = tid - mi * nt;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
        wmma::fill_fragment(fc, 0.f);
        for (int k = 0; k < dI; k += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
          wmma::load_matrix_sync(fa, qs + mi * 16 * L.ldq + k, L.ldq);
          wmma::load_matrix_sync(fb, ks + ni * 16 * L.ldk + k, L.ldk);
          wmma::mma_sync(fc, fa, fb, fc);
        }
        wmma::store_matrix_sync(cs + mi * 16 * L.ldc + ni * 16, fc, L.ldc, wmma::mem_row_major);
      }
      __syncthreads();
      // Head reduction: 4 lanes per (query, key), each summing every 4th head, then a fixed
      // shuffle tree (deterministic).
      for (int e = threadIdx.x; e < pq * kKT * 4; e += kThreads) {
        const int part = e & 3, pair = e >> 2;
        const int qi = pair / kKT, key = pair - qi * kKT;
        const float* col = cs + (qi * nI) * L.ldc + key;
        const float* w = wsm + qi * nI;
        float acc = 0.f;
        for (int h = part; h < nI; h += 4) acc += fmaxf(0.f, col[h * L.ldc]) * w[h];
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        const int s = s0 + key;
        const int64_t t = tq0 + qi;
        if (part == 0 && s < a.cand.count[t]) scores[t * ld + s] = acc;
      }
    }
  }
}

}  // namespace

bool indexer_tc_supported(int n_heads, int head_dim) {
  return n_heads > 0 && head_dim > 0 && n_heads % 16 == 0 && head_dim % 16 == 0 &&
         n_heads <= 128 && head_dim <= 256 && make_layout<4>(n_heads, head_dim).bytes <= 227 * 1024;
}

namespace {
template <int kQB>
Status launch_tc(const ops::IndexerArgs& a, int64_t max_count, float* scores, int64_t ld,
                 int n_sms, cudaStream_t stream) {
  const Layout L = make_layout<kQB>(a.n_heads, a.head_dim);
  static bool attr_set = false;  // process-wide attribute per instantiation (largest layout)
  if (!attr_set) {
    cudaError_t e = cudaFuncSetAttribute(indexer_tc_kernel<kQB>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
    if (e != cudaSuccess) return cuda_status(e, "indexer_tc smem attribute");
    attr_set = true;
  }
  const int64_t groups = (a.n_rows + kQB - 1) / kQB;
  const int64_t tiles = (max_count + kKT - 1) / kKT;
  const int64_t want = 8 * int64_t(n_sms);
  const int64_t gx = std::max<int64_t>(1, std::min<int64_t>(tiles, (want + groups - 1) / groups));
  const dim3 grid{unsigned(gx), unsigned(groups), 1u};
  indexer_tc_kernel<kQB><<<grid, kThreads, L.bytes, stream>>>(a, scores, ld);
  return check_launch("indexer_tc_kernel");
}
}  // namespace

Status indexer_scores_tc(const ops::IndexerArgs& a, int64_t max_count, float* scores, int64_t ld,
                         int n_sms, cudaStream_t stream) {
  if (a.n_rows <= 0 || max_count <= 0) return Status::Ok();
  if (!indexer_tc_supported(a.n_heads, a.head_dim))
    return errorf(ErrorCode::kInvalidArgument, "indexer_scores_tc: nI={} dI={} unsupported",
                  a.n_heads, a.head_dim);
  // Decode-shaped calls (few rows, each its own candidate list) use one query row per group:
  // a quarter of the shared memory, so several blocks share an SM.
  if (a.n_rows <= 64) return launch_tc<1>(a, max_count, scores, ld, n_sms, stream);
  return launch_tc<4>(a, max_count, scores, ld, n_sms, stream);
}

}  // namespace v4::cuda
