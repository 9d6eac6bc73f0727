// bench_kernels --only-gemv: the bf16 mode's decode GEMV (wgemv) over the V4-Flash weight
// shapes, the shared-memory kernel ("old", GemvArgs::use_stream_kernel = false) vs the streaming
// kernel ("new", gemv_stream.h), each next to a same-size device copy.
#ifdef V4_HAVE_CUDA  // CPU builds compile bench_kernels.cpp's stub main only
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "ops/cuda/gemv_stream.h"
#include "ops/cuda/wgemm.h"
#include "ops/ops.h"

namespace {

using v4::ops::WFormat;

#define GB_CHECK(x) v4::bench::cuda_or_exit((x), __FILE__, __LINE__)
#define GB_OK(x)                                                        \
  do {                                                                  \
    const v4::Status st_ = (x);                                         \
    if (!st_.ok()) {                                                    \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, st_.to_string().c_str()); \
      std::exit(3);                                                     \
    }                                                                   \
  } while (0)

// `copies` device copies of random weights [rows, K] in format f (finite values, FP8 scales
// 2^-8, MXFP4 scales 2^-7), rotated through so that repeated launches read HBM, not L2.
struct Weights {
  uint8_t* data = nullptr;
  uint8_t* scale = nullptr;
  size_t data_bytes = 0, scale_bytes = 0;  // per copy (multiples of 16 for every shape here)
  int copies = 1;
  v4::ops::WeightView view;
  Weights(WFormat f, int64_t rows, int64_t K, int copies_) : copies(copies_) {
    const int64_t n = rows * K;
    data_bytes = size_t(v4::ops::wformat_bytes(f, rows, K));
    scale_bytes = f == WFormat::kFP8Block ? size_t((rows + 127) / 128 * ((K + 127) / 128) * 4)
                  : f == WFormat::kMXFP4  ? size_t(rows * (K / 32))
                                          : 0;
    scale_bytes = (scale_bytes + 15) / 16 * 16;
    std::vector<uint8_t> h(data_bytes);
    uint64_t s = 0x1234567ull;
    for (size_t i = 0; i < h.size(); i += 8) {
      uint64_t z = (s += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      for (size_t b = 0; b < 8 && i + b < h.size(); ++b, z >>= 8) h[i + b] = uint8_t(z);
    }
    if (f == WFormat::kFP8Block)
      for (auto& b : h)
        if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN
    if (f == WFormat::kBF16 || f == WFormat::kF32) {  // finite, modest values
      const size_t step = f == WFormat::kBF16 ? 2 : 4;
      for (size_t i = step - 1; i < h.size(); i += step) h[i] = uint8_t((h[i] & 0x80) | 0x3c);
    }
    (void)n;
    GB_CHECK(cudaMalloc(&data, data_bytes * size_t(copies)));
    for (int c = 0; c < copies; ++c)
      GB_CHECK(cudaMemcpy(data + size_t(c) * data_bytes, h.data(), data_bytes, cudaMemcpyHostToDevice));
    if (scale_bytes) {
      std::vector<uint8_t> sh(scale_bytes);
      if (f == WFormat::kFP8Block) {
        const float sv = 1.f / 256.f;
        for (size_t i = 0; i + 4 <= scale_bytes; i += 4) std::memcpy(&sh[i], &sv, 4);
      } else {
        std::fill(sh.begin(), sh.end(), uint8_t(120));
      }
      GB_CHECK(cudaMalloc(&scale, scale_bytes * size_t(copies)));
      for (int c = 0; c < copies; ++c)
        GB_CHECK(cudaMemcpy(scale + size_t(c) * scale_bytes, sh.data(), scale_bytes, cudaMemcpyHostToDevice));
    }
    view.data = data;
    view.scale = scale;
    view.format = f;
    view.n = rows;
    view.k = K;
    view.experts = 1;
    view.rows_total = rows;
  }
  v4::ops::WeightView copy(int i) const {
    v4::ops::WeightView v = view;
    v.data = data + size_t(i % copies) * data_bytes;
    v.scale = scale ? scale + size_t(i % copies) * scale_bytes : nullptr;
    return v;
  }
  ~Weights() {
    cudaFree(data);
    if (scale) cudaFree(scale);
  }
};

}  // namespace

/// Markdown table: per shape and M, old vs new wgemv µs (median of `samples` samples of 10
/// back-to-back launches, weights cold in L2), bytes moved, the new kernel's GB/s and its time as
/// a share of a same-traffic device copy (cudaMemcpyAsync D2D of bytes/2: bytes/2 read + bytes/2
/// written, rotated over 256 MiB). `bw` = the 1 GiB copy bandwidth (GB/s) for the floor column.
std::string bench_gemv(double bw, int samples) {
  int sms = 0;
  GB_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  GB_OK(v4::cuda::wgemv_prepare());
  const size_t kRotate = size_t(256) << 20;
  struct Sh {
    const char* name;
    WFormat f;
    int groups;
    int64_t n_out, K;
    bool swiglu;
  };
  const Sh shapes[] = {
      {"wq_a", WFormat::kFP8Block, 1, 1024, 4096, false},
      {"wq_b", WFormat::kFP8Block, 1, 32768, 1024, false},
      {"wkv", WFormat::kFP8Block, 1, 512, 4096, false},
      {"wo_a (8 groups, one launch)", WFormat::kFP8Block, 8, 1024, 4096, false},
      {"wo_b", WFormat::kFP8Block, 1, 4096, 8192, false},
      {"indexer wq_b", WFormat::kFP8Block, 1, 8192, 1024, false},
      {"shared w13 (SwiGLU)", WFormat::kFP8Block, 1, 2048, 4096, true},
      {"shared w2", WFormat::kFP8Block, 1, 4096, 2048, false},
      {"router (f32)", WFormat::kF32, 1, 256, 4096, false},
      {"compressor wkv", WFormat::kBF16, 1, 1024, 4096, false},
      {"head", WFormat::kBF16, 1, 129280, 4096, false},
  };
  std::ostringstream t;
  t << "## Batch-1 GEMV: shared-memory wgemv (old) vs streaming gemv_stream (new)\n\n"
    << "Bytes = weights + scales + x + y. Weights rotate over copies totalling ≥ 256 MiB (cold in "
       "L2) except the 1 GB head. Copy µs = cudaMemcpyAsync D2D of bytes / 2 (the same bytes of "
       "traffic), rotated the same way; % of copy = copy µs / new µs. Floor µs = bytes / the 1 GiB "
       "copy bandwidth. Median of "
    << samples << " samples of 10 back-to-back launches.\n\n"
    << "| weight | format | M | ks | MB | old µs | new µs | old / new | new GB/s | floor µs | copy µs | % of copy |\n"
    << "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const Sh& sh : shapes) {
    const int64_t rows = int64_t(sh.groups) * sh.n_out * (sh.swiglu ? 2 : 1);
    const size_t one = size_t(v4::ops::wformat_bytes(sh.f, rows, sh.K));
    const int copies = one > (size_t(512) << 20)
                           ? 1
                           : int(std::max<size_t>(1, std::min<size_t>(64, (kRotate + one - 1) / one)));
    Weights w(sh.f, rows, sh.K, copies);
    const int64_t Mmax = 4, xlen = int64_t(sh.groups) * sh.K, ylen = int64_t(sh.groups) * sh.n_out;
    float *x = nullptr, *y = nullptr;
    GB_CHECK(cudaMalloc(&x, size_t(Mmax * xlen) * 4));
    GB_CHECK(cudaMalloc(&y, size_t(Mmax * ylen) * 4));
    {
      std::vector<float> xh(size_t(Mmax * xlen));
      for (size_t i = 0; i < xh.size(); ++i) xh[i] = float(int((i * 2654435761u) % 2001) - 1000) * 1e-3f;
      GB_CHECK(cudaMemcpy(x, xh.data(), xh.size() * 4, cudaMemcpyHostToDevice));
    }
    // Same-traffic copy buffers, rotated over ≥ 256 MiB.
    for (int64_t M : {int64_t(1), int64_t(2), int64_t(4)}) {
      if (sh.f == WFormat::kBF16 && sh.n_out > 100000 && M > 2) continue;  // head: 1 and 2 rows
      auto args = [&](int i, bool stream_kernel) {
        v4::cuda::GemvArgs a;
        a.w = w.copy(i);
        a.x = x;
        a.ldx = xlen;
        a.y = y;
        a.ldy = ylen;
        a.rows = M;
        a.n_out = sh.n_out;
        a.swiglu = sh.swiglu;
        a.x_group_stride = sh.groups > 1 ? sh.K : 0;
        a.y_group_stride = sh.groups > 1 ? sh.n_out : 0;
        a.use_stream_kernel = stream_kernel;
        return a;
      };
      const auto old_st = v4::bench::time_launches(
          nullptr, [&](int i, cudaStream_t s) { GB_OK(v4::cuda::wgemv(args(i, false), sh.groups, sms, s)); },
          samples);
      const auto new_st = v4::bench::time_launches(
          nullptr, [&](int i, cudaStream_t s) { GB_OK(v4::cuda::wgemv(args(i, true), sh.groups, sms, s)); },
          samples);
      const double bytes = double(w.data_bytes + w.scale_bytes) + double(M * xlen) * 4 + double(M * ylen) * 4;
      // Copy of the same traffic: bytes/2 read + bytes/2 written.
      const size_t half = (size_t(bytes / 2) + 255) / 256 * 256;
      const int ccopies = int(std::max<size_t>(2, std::min<size_t>(64, (kRotate + half - 1) / half)));
      char *src = nullptr, *dst = nullptr;
      GB_CHECK(cudaMalloc(&src, half * size_t(ccopies)));
      GB_CHECK(cudaMalloc(&dst, half * size_t(ccopies)));
      GB_CHECK(cudaMemset(src, 1, half * size_t(ccopies)));
      const auto copy_st = v4::bench::time_launches(
          nullptr,
          [&](int i, cudaStream_t s) {
            const size_t o = size_t(i % ccopies) * half;
            GB_CHECK(cudaMemcpyAsync(dst + o, src + o, half, cudaMemcpyDeviceToDevice, s));
          },
          samples);
      cudaFree(src);
      cudaFree(dst);
      const int ks = v4::cuda::gemv_stream_kslices(args(0, true), sh.groups, sms);
      const double floor_us = bytes / (bw * 1e9) * 1e6;
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    "| %s | %s | %lld | %d | %.1f | %.2f | %.2f | %.2f× | %.0f | %.2f | %.2f | %.0f%% |\n",
                    sh.name, v4::ops::wformat_name(sh.f), (long long)M, ks, bytes / 1e6, old_st.med_us,
                    new_st.med_us, old_st.med_us / new_st.med_us, bytes / (new_st.med_us * 1e3), floor_us,
                    copy_st.med_us, 100.0 * copy_st.med_us / new_st.med_us);
      t << buf;
      std::printf("gemv %s %s M=%lld: old %.2f us, new %.2f us, copy %.2f us (%.0f%% of copy)\n", sh.name,
                  v4::ops::wformat_name(sh.f), (long long)M, old_st.med_us, new_st.med_us, copy_st.med_us,
                  100.0 * copy_st.med_us / new_st.med_us);
    }
    cudaFree(x);
    cudaFree(y);
  }
  return t.str();
}
#endif  // V4_HAVE_CUDA
