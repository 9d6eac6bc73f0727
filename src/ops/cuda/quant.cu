#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
#include "ops/cuda/quant.h"

namespace v4::cuda {
namespace {

__device__ __forceinline__ float e4m3_to_f32(uint8_t v) {
  // e4m3fn: sign 1, exponent 4 (bias 7), mantissa 3; no inf, 0x7f/0xff NaN.
  uint32_t s = v >> 7, e = (v >> 3) & 0xf, m = v & 7;
  float r;
  if (e == 0xf && m == 7) {
    r = __int_as_float(0x7fc00000);
  } else if (e == 0) {
    r = ldexpf(float(m), -9);  // subnormal: m/8 · 2^-6
  } else {
    r = __int_as_float(int((e + 120) << 23 | m << 20));
  }
  return s ? -r : r;
}

__device__ __forceinline__ float ue8m0_to_f32(uint8_t b) {
  if (b == 0xff) return __int_as_float(0x7fc00000);
  if (b == 0) return ldexpf(1.f, -127);
  return __int_as_float(int(uint32_t(b) << 23));
}

__device__ __forceinline__ float e2m1_to_f32(uint32_t nib) {
  constexpr float lut[8] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  float r = lut[nib & 7];
  return (nib & 8) ? -r : r;
}

__global__ void fp8_block_kernel(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ sc,
                                 __nv_bfloat16* __restrict__ out, int64_t N, int64_t K) {
  int64_t kb = (K + 127) / 128;
  int64_t total = N * K;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = i / K, c = i - r * K;
    float s = ue8m0_to_f32(sc[(r / 128) * kb + c / 128]);
    out[i] = __float2bfloat16_rn(e4m3_to_f32(wq[i]) * s);
  }
}

__global__ void mxfp4_kernel(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ sc,
                             __nv_bfloat16* __restrict__ out, int64_t N, int64_t K) {
  int64_t total = N * (K / 2);  // one thread per packed byte -> two outputs
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = i / (K / 2), cb = i - r * (K / 2);
    float s = ue8m0_to_f32(sc[r * (K / 32) + (2 * cb) / 32]);
    uint32_t b = wq[i];
    __nv_bfloat162 v;
    v.x = __float2bfloat16_rn(e2m1_to_f32(b & 0xf) * s);
    v.y = __float2bfloat16_rn(e2m1_to_f32(b >> 4) * s);
    reinterpret_cast<__nv_bfloat162*>(out)[i] = v;
  }
}

__global__ void f32_to_bf16_kernel(const float* in, __nv_bfloat16* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}
__global__ void bf16_to_f32_kernel(const __nv_bfloat16* in, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}

int grid_for(int64_t n, int threads) {
  int64_t g = (n + threads - 1) / threads;
  return int(g < 1 ? 1 : (g > 65536 ? 65536 : g));
}

}  // namespace

Status dequant_fp8_block_to_bf16(const uint8_t* wq, const uint8_t* scale, __nv_bfloat16* out,
                                 int64_t N, int64_t K, cudaStream_t stream) {
  if (N < 1 || K < 1) return errorf(ErrorCode::kInvalidArgument, "fp8 dequant: bad shape [{}, {}]", N, K);
  fp8_block_kernel<<<grid_for(N * K, 256), 256, 0, stream>>>(wq, scale, out, N, K);
  V4_CUDA_CHECK_LAUNCH("fp8_block_kernel");
  return Status::Ok();
}

Status dequant_mxfp4_to_bf16(const uint8_t* wq, const uint8_t* scale, __nv_bfloat16* out, int64_t N,
                             int64_t K, cudaStream_t stream) {
  if (N < 1 || K < 32 || K % 32)
    return errorf(ErrorCode::kInvalidArgument,
                      "mxfp4 dequant: shape [{}, {}] needs K a positive multiple of 32", N, K);
  mxfp4_kernel<<<grid_for(N * K / 2, 256), 256, 0, stream>>>(wq, scale, out, N, K);
  V4_CUDA_CHECK_LAUNCH("mxfp4_kernel");
  return Status::Ok();
}

Status f32_to_bf16(const float* in, __nv_bfloat16* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return Status::Ok();
  f32_to_bf16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(in, out, n);
  V4_CUDA_CHECK_LAUNCH("f32_to_bf16_kernel");
  return Status::Ok();
}
Status bf16_to_f32(const __nv_bfloat16* in, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return Status::Ok();
  bf16_to_f32_kernel<<<grid_for(n, 256), 256, 0, stream>>>(in, out, n);
  V4_CUDA_CHECK_LAUNCH("bf16_to_f32_kernel");
  return Status::Ok();
}

}  // namespace v4::cuda
