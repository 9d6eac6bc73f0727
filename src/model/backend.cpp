#include "model/backend.h"

#ifdef V4_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace v4::model {

Result<std::unique_ptr<ops::Ops>> make_backend(const std::string& device, ThreadPool* pool) {
  if (device == "cpu") return ops::make_cpu_ops(pool);
  if (device == "cuda") {
#ifdef V4_HAVE_CUDA
    return ops::make_cuda_ops();
#else
    return make_error(ErrorCode::kUnsupported,
                      "--device cuda: this binary was built without CUDA (configure with -DV4_CUDA=ON)");
#endif
  }
  return make_error(ErrorCode::kInvalidArgument, "--device '{}': expected cpu or cuda", device);
}

}  // namespace v4::model
