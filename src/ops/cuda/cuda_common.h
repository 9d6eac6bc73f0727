// Shared helpers of the CUDA backend: CUDA/cuBLAS error -> v4::Status, RAII device buffers.
// Every CUDA runtime and library call in src/ops/cuda is checked through these macros.
#pragma once
// fmt 9 turns FMT_CONSTEXPR off under __NVCC__, after which g++'s C++20 host pass rejects its
// constexpr functions; every .cu file includes this header first so fmt keeps constexpr on.
#if defined(__NVCC__) && !defined(FMT_USE_CONSTEXPR)
#define FMT_USE_CONSTEXPR 1
#endif
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "base/status.h"

namespace v4::cuda {

/// Turns a CUDA runtime error into a Status naming the failed call (`what`).
Status cuda_status(cudaError_t err, const char* what);
/// Turns a cuBLAS status into a Status naming the failed call (`what`).
Status cublas_status(cublasStatus_t st, const char* what);

/// Status with a fmt-formatted message; the format is checked at run time (nvcc cannot evaluate
/// fmt's consteval format strings), so use this instead of make_error in .cu files.
template <typename... Args>
Status errorf(ErrorCode code, const char* format, const Args&... args) {
  return Status(code, fmt::format(fmt::runtime(format), args...));
}

/// Error of the last kernel launch (cudaGetLastError), or Ok.
inline Status check_launch(const char* kernel) { return cuda_status(cudaGetLastError(), kernel); }

/// Owning device allocation of `count` elements of T (cudaMalloc / cudaFree). Move-only.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  /// Allocates `count` elements (previous contents freed). Errors: kResourceExhausted.
  Status alloc(size_t count) {
    reset();
    if (count == 0) return Status::Ok();
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, count * sizeof(T));
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return Status(ErrorCode::kResourceExhausted,
                    "cudaMalloc of " + std::to_string(count * sizeof(T)) + " bytes failed: " +
                        cudaGetErrorString(e));
    }
    p_ = static_cast<T*>(p);
    n_ = count;
    return Status::Ok();
  }
  void reset() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace v4::cuda

/// Returns a Status from the enclosing function if the CUDA runtime call fails.
#define V4_CUDA_TRY(call)                                                         \
  do {                                                                            \
    cudaError_t _e = (call);                                                      \
    if (_e != cudaSuccess) return ::v4::cuda::cuda_status(_e, #call);             \
  } while (0)

/// Returns a Status from the enclosing function if the cuBLAS(Lt) call fails.
#define V4_CUBLAS_TRY(call)                                                       \
  do {                                                                            \
    cublasStatus_t _s = (call);                                                   \
    if (_s != CUBLAS_STATUS_SUCCESS) return ::v4::cuda::cublas_status(_s, #call); \
  } while (0)

/// Checks the last kernel launch; returns its error Status.
#define V4_CUDA_CHECK_LAUNCH(name) V4_RETURN_IF_ERROR(::v4::cuda::check_launch(name))
