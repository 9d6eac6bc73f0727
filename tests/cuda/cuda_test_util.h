// Helpers for the GPU op tests: fresh random inputs each run (seed printed), device buffers,
// poisoned outputs, error measures. Every test compares a CUDA result with a CPU result computed
// from the same inputs; outputs are filled with NaN (0xff bytes) before each run so an output that
// is never written fails the comparison.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace v4::cuda::testing {

/// A fresh seed per process (printed once), so every run sees new inputs; set V4_TEST_SEED to
/// reproduce a failure.
inline uint64_t test_seed() {
  static uint64_t seed = [] {
    const char* env = std::getenv("V4_TEST_SEED");
    uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}() * 2654435761ull;
    std::printf("[cuda tests] V4_TEST_SEED=%llu\n", (unsigned long long)s);
    return s;
  }();
  return seed;
}

inline std::mt19937_64& rng() {
  static std::mt19937_64 g(test_seed());
  return g;
}

inline std::vector<float> randn(size_t n, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng());
  return v;
}

inline int rand_int(int lo, int hi) {  // inclusive
  return std::uniform_int_distribution<int>(lo, hi)(rng());
}

/// Device copy of a host vector (cudaMalloc; freed by the destructor).
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  Dev() = default;
  explicit Dev(size_t count) : n(count) {
    if (n) {
      EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    }
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
    if (n) {
      EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
      // The backends run on non-blocking streams, which do not wait for the legacy default
      // stream: finish the upload before a kernel may read it.
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
  }
  ~Dev() {
    if (p) cudaFree(p);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  /// Fills with 0xff bytes (NaN for floats, −1 for ints), finished before it returns:
  /// cudaMemset is asynchronous on the legacy default stream, and a backend's non-blocking stream
  /// does not wait for it (under GPU contention the memset landed after a kernel's output:
  /// CudaOps.RmsNorm and CudaSampling.* failed in a sharded run).
  void poison() {
    if (n) {
      EXPECT_EQ(cudaMemset(p, 0xff, n * sizeof(T)), cudaSuccess);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
  }
  std::vector<T> host() const {
    std::vector<T> h(n);
    if (n) {
      EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return h;
  }
};

/// max |a − b| / max(max |b|, tiny); NaN anywhere → +inf.
inline double rel_err(const float* a, const float* b, size_t n) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return num / den;
}
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  return rel_err(a.data(), b.data(), std::min(a.size(), b.size()));
}

inline bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// Sets (value non-null) or unsets (null) environment variable `name` for a scope and restores
/// its previous state (set to the old value, or unset) when the scope ends — for the backends'
/// A/B switches, which are read at every call.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1);
    else unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

}  // namespace v4::cuda::testing

/// Skips when no GPU is present (a build machine), but FAILS when the environment sets
/// V4_REQUIRE_GPU=1 (scripts/device/run_gpu.sh does), so a GPU run can never pass by skipping.
#define V4_REQUIRE_GPU()                                                          \
  do {                                                                            \
    if (!::v4::cuda::testing::has_gpu()) {                                        \
      if (std::getenv("V4_REQUIRE_GPU")) FAIL() << "no CUDA GPU but V4_REQUIRE_GPU"; \
      GTEST_SKIP() << "no CUDA GPU";                                              \
    }                                                                             \
  } while (0)
