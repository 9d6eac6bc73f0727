// Launch timing shared by the kernel benchmarks (bench_kernels.cpp and its table files).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace v4::bench {

/// Per-launch time of a benchmarked call in µs: median and 10th / 90th percentile over samples.
struct LaunchStats {
  double med_us = 0, p10_us = 0, p90_us = 0;
};

/// Benchmarks have no recovery: a CUDA error prints file:line and the error, and exits with 3.
inline void cuda_or_exit(cudaError_t e, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d CUDA error: %s\n", file, line, cudaGetErrorString(e));
  std::exit(3);
}

/// Times fn(i, stream) (i = launch index, for rotating inputs): `warmup` launches, then `samples`
/// samples of `inner` launches issued back to back on `stream` between two CUDA events — the GPU
/// stays busy, so the host's launch cost is hidden as it is under CUDA graphs. Per-launch time =
/// sample time / inner. samples ≥ 1.
inline LaunchStats time_launches(cudaStream_t stream,
                                 const std::function<void(int, cudaStream_t)>& fn, int samples,
                                 int inner = 10, int warmup = 20) {
  samples = std::max(samples, 1);
  int idx = 0;
  for (int i = 0; i < warmup; ++i) fn(idx++, stream);
  cuda_or_exit(cudaStreamSynchronize(stream), __FILE__, __LINE__);
  std::vector<cudaEvent_t> ev(2 * size_t(samples));
  for (auto& e : ev) cuda_or_exit(cudaEventCreate(&e), __FILE__, __LINE__);
  for (int s = 0; s < samples; ++s) {
    cuda_or_exit(cudaEventRecord(ev[2 * s], stream), __FILE__, __LINE__);
    for (int j = 0; j < inner; ++j) fn(idx++, stream);
    cuda_or_exit(cudaEventRecord(ev[2 * s + 1], stream), __FILE__, __LINE__);
  }
  cuda_or_exit(cudaStreamSynchronize(stream), __FILE__, __LINE__);
  std::vector<double> t(static_cast<size_t>(samples), 0.0);
  for (int s = 0; s < samples; ++s) {
    float ms = 0;
    cuda_or_exit(cudaEventElapsedTime(&ms, ev[2 * s], ev[2 * s + 1]), __FILE__, __LINE__);
    t[size_t(s)] = ms * 1000.0 / inner;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  LaunchStats r;
  r.med_us = t[size_t(samples) / 2];
  r.p10_us = t[size_t(samples) / 10];
  r.p90_us = t[size_t(samples) * 9 / 10];
  return r;
}

}  // namespace v4::bench
