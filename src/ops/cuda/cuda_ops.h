// The CUDA backend of ops::Ops (ops.h): every op of the forward on the device, fp32 activations
// and weights (the same contract as the CPU reference), so the model runs on the GPU unchanged.
// This is the correctness-first backend of issue 6: plain kernels with fixed summation order
// (a row's result does not depend on the other rows of the batch), cuBLAS-free fp32 GEMM, one
// stream. The bf16/FP8 fast paths (ops/cuda/gemm.h, quant.h, topk.h) are the building blocks of
// the next step. See docs/cuda.md.
#pragma once
#include <memory>

#include "base/status.h"
#include "ops/ops.h"

namespace v4::ops {

/// Creates the CUDA backend on the current device (cudaSetDevice before). Errors:
/// kUnsupported when no CUDA device is present, kInternal for CUDA failures.
/// Ops methods cannot return errors (ops.h); a failing CUDA call is recorded, logged, and thrown
/// as std::runtime_error from the next synchronize()/download(); alloc throws std::bad_alloc.
Result<std::unique_ptr<Ops>> make_cuda_ops();

}  // namespace v4::ops
