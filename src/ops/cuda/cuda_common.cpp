#include "ops/cuda/cuda_common.h"

namespace v4::cuda {

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  // Clear a non-sticky error (e.g. a rejected launch configuration) so it is not reported again
  // by the next, unrelated launch check; sticky errors stay set anyway.
  (void)cudaGetLastError();
  ErrorCode code = err == cudaErrorMemoryAllocation ? ErrorCode::kResourceExhausted
                                                    : ErrorCode::kInternal;
  return Status(code, std::string("CUDA error in ") + what + ": " + cudaGetErrorName(err) + " (" +
                          cudaGetErrorString(err) + ")");
}

Status cublas_status(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  ErrorCode code = st == CUBLAS_STATUS_NOT_SUPPORTED ? ErrorCode::kUnsupported
                   : st == CUBLAS_STATUS_ALLOC_FAILED ? ErrorCode::kResourceExhausted
                                                      : ErrorCode::kInternal;
  return Status(code, std::string("cuBLAS error in ") + what + ": status " +
                          std::to_string(int(st)));
}

}  // namespace v4::cuda
