// Device side of Ops::fill_random / device_info (ops.h): the same element generator as the CPU
// backend (src/ops/fill_random.h), so both write identical bytes for the same seed.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "base/status.h"
#include "ops/fill_random.h"

namespace v4::cuda {

/// Writes units [0, n) of the call `p` (fill_random.h) to device memory `dst` on `stream`.
/// Errors: the launch error, if any.
Status fill_random(void* dst, int64_t n, const ops::fill::FillParams& p, cudaStream_t stream);

/// "NVIDIA H200 (132 SMs, 139.8 GiB), driver 580.159.04 (API 13.0), CUDA runtime 13.0" for the
/// current device; names what failed if a query fails.
std::string device_info();

}  // namespace v4::cuda
