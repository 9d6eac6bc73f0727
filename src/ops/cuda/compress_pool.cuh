// The per-channel compressor pooling (dsv4-model.md §5, ops.h CompressArgs) as one device function,
// shared by compress_pool_kernel (cuda_ops.cu) and the FlashCompressor kernel (compressor.cu) so the
// two give bit-identical pooled values (internal header).
#pragma once
#include <cstdint>

#include "ops/ops.h"

namespace v4::cuda {

/// Pooled value of output row r, channel ch < d: softmax over the row's non-empty slots of
/// gate + bias (fp32, max-subtracted, expf), weighted sum of kv. Three passes over the slots (max,
/// sum, weighted sum), slot order 0..c·m−1. An all-empty row gives 0.
__device__ __forceinline__ float compress_pool_channel(const ops::CompressArgs& a, int64_t r,
                                                       int ch) {
  const int m = a.ratio, c = a.overlap, d = a.dim, n_slots = c * m;
  const int64_t width = int64_t(c) * d;
  const int32_t* src = a.src + r * n_slots;
  float mx = -INFINITY;
  for (int j = 0; j < n_slots; ++j) {
    const int32_t v = src[j];
    if (v == -1) continue;
    const int ch0 = (c == 2 && j >= m) ? d : 0;
    const int brow = (c == 2 && j >= m) ? j - m : j;
    const float* g = v >= 0 ? a.fresh_gate + int64_t(v) * width : a.state_gate + int64_t(-v - 2) * width;
    mx = fmaxf(mx, g[ch0 + ch] + a.bias[int64_t(brow) * width + ch0 + ch]);
  }
  float sum = 0.f;
  for (int j = 0; j < n_slots; ++j) {
    const int32_t v = src[j];
    if (v == -1) continue;
    const int ch0 = (c == 2 && j >= m) ? d : 0;
    const int brow = (c == 2 && j >= m) ? j - m : j;
    const float* g = v >= 0 ? a.fresh_gate + int64_t(v) * width : a.state_gate + int64_t(-v - 2) * width;
    sum += expf(g[ch0 + ch] + a.bias[int64_t(brow) * width + ch0 + ch] - mx);
  }
  float acc = 0.f;
  for (int j = 0; j < n_slots; ++j) {
    const int32_t v = src[j];
    if (v == -1) continue;
    const int ch0 = (c == 2 && j >= m) ? d : 0;
    const int brow = (c == 2 && j >= m) ? j - m : j;
    const bool fresh = v >= 0;
    const int64_t row = fresh ? v : (-v - 2);
    const float* g = (fresh ? a.fresh_gate : a.state_gate) + row * width;
    const float* kv = (fresh ? a.fresh_kv : a.state_kv) + row * width;
    const float p = expf(g[ch0 + ch] + a.bias[int64_t(brow) * width + ch0 + ch] - mx) / sum;
    acc += kv[ch0 + ch] * p;
  }
  return acc;
}

}  // namespace v4::cuda
