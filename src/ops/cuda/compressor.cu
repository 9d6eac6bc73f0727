#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// FlashCompressor (compressor.h). Math per element as the unfused CUDA sequence compress_pool →
// rmsnorm → rope_interleaved → store_rows, so fp32 results match it (same pooling function, same
// sum-of-squares order, same rotation expression); the intermediate rows never leave the SM.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/compress_pool.cuh"
#include "ops/cuda/compressor.h"
#include "ops/cuda/device_util.cuh"

namespace v4::cuda {
namespace {

// The rmsnorm kernel (norm_rope.cu) reduces with 256 threads, thread t summing channels t, t+256,
// ... in order, then a butterfly within each warp and over the 8 warp sums. kNormThreads mirrors it.
constexpr int kNormThreads = 256;

// One CTA per output row; blockDim = min(1024, d rounded up to 32), one channel per thread (a
// strided loop for d > 1024). Dynamic shared memory: d floats (the row).
__global__ void compress_fused_rows_kernel(ops::CompressArgs pa, ops::CompressFusedArgs a) {
  extern __shared__ float row[];
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const int32_t dst = a.dst[r];
  if (dst < 0) return;  // window not closing (device-planned decode rows): nothing to store
  const int d = a.dim, tid = threadIdx.x;
  // 1. Pooling: softmax over the window per channel, weighted sum (never written to HBM).
  for (int ch = tid; ch < d; ch += blockDim.x) row[ch] = compress_pool_channel(pa, r, ch);
  __syncthreads();
  // 2. RMSNorm: the sum of squares in the rmsnorm kernel's order (threads < 256, stride 256).
  float ss = 0.f;
  if (tid < kNormThreads)
    for (int i = tid; i < d; i += kNormThreads) {
      const float v = row[i];
      ss += v * v;
    }
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const int nwarps = min(int(blockDim.x), kNormThreads) >> 5;  // ≥ 1: blockDim is a multiple of 32
  if ((tid & 31) == 0 && (tid >> 5) < nwarps) red[tid >> 5] = ss;
  __syncthreads();
  if (tid < 32) {
    float v = tid < nwarps ? red[tid] : 0.f;
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (tid == 0) red[0] = v;
  }
  __syncthreads();
  const float inv = rsqrtf(red[0] / float(int64_t(d)) + a.eps);
  for (int ch = tid; ch < d; ch += blockDim.x) {
    float v = row[ch] * inv;
    if (a.norm) v *= a.norm[ch];
    row[ch] = v;
  }
  __syncthreads();
  // 3. RoPE on the trailing rd channels (pairs 2i, 2i+1), then one store of the finished row.
  const int rd = a.rope_dim, nope = d - rd;
  float* out = a.pool + int64_t(dst) * d;
  const float pos = rd > 0 ? float(a.positions[r]) : 0.f;
  for (int ch = tid; ch < d; ch += blockDim.x) {
    if (ch < nope) {
      out[ch] = row[ch];
      continue;
    }
    const int p = (ch - nope) >> 1;
    const float x0 = row[nope + 2 * p], x1 = row[nope + 2 * p + 1];
    const float ang = a.inv_freq[p] * pos;  // one fp32 product, as the rope kernel
    float s, c;
    sincosf(ang, &s, &c);
    s *= a.attention_scaling;
    c *= a.attention_scaling;
    out[ch] = ((ch - nope) & 1) ? x0 * s + x1 * c : x0 * c - x1 * s;
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
    const int threads = std::min(1024, (d + 31) / 32 * 32);
    compress_fused_rows_kernel<<<unsigned(a.n_out), threads, size_t(d) * sizeof(float), stream>>>(
        a.pool_args(nullptr), a);
    V4_CUDA_CHECK_LAUNCH("compress_fused_rows_kernel");
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
