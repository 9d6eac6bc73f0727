#include "model/backend.h"

#ifdef V4_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace v4::model {

Result<std::unique_ptr<ops::Ops>> make_backend(const std::string& device, ThreadPool* pool,
                                               const BackendOptions& options) {
  const std::string& p = options.precision;
  if (p != "auto" && p != "fp32" && p != "bf16")
    return make_error(ErrorCode::kInvalidArgument, "precision '{}': expected fp32, bf16 or auto",
                      p);
  if (device == "cpu") {
    if (p == "bf16")
      return make_error(ErrorCode::kInvalidArgument,
                        "precision bf16: the cpu backend computes in fp32 only (use fp32 or auto)");
    return ops::make_cpu_ops(pool);
  }
  if (device == "cuda") {
#ifdef V4_HAVE_CUDA
    ops::CudaOptions o;
    o.precision = p == "fp32" ? ops::Precision::kFp32 : ops::Precision::kBf16;
    return ops::make_cuda_ops(o);
#else
    return make_error(
        ErrorCode::kUnsupported,
        "--device cuda: this binary was built without CUDA (configure with -DV4_CUDA=ON)");
#endif
  }
  return make_error(ErrorCode::kInvalidArgument, "--device '{}': expected cpu or cuda", device);
}

}  // namespace v4::model
