// Decode plans built on the device (ops.h `Ops::build_decode_plan`, DecodePlanArgs): two kernels,
// no host work, so a CUDA graph can capture them (docs/cuda.md §Graphs).
#pragma once
#include <cuda_runtime.h>

#include "base/status.h"
#include "ops/ops.h"

namespace v4::cuda {

/// Applies the page-table deltas (one block per delta row, rows ≥ *delta_count exit at once),
/// then writes every row's plan (grid B × Y blocks; the Y blocks of a row split its lists).
/// The arithmetic is ops/decode_plan_rows.h, shared with the CPU reference. All pointers are
/// device memory. Errors: launch failures.
Status build_decode_plan(const ops::DecodePlanArgs& a, cudaStream_t stream);

}  // namespace v4::cuda
