#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
#include "ops/cuda/decode_plan.h"
#include "ops/decode_plan_rows.h"

#include <algorithm>

namespace v4::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) apply_page_deltas_kernel(ops::DecodePlanArgs a) {
  const int64_t r = blockIdx.x;
  if (r >= int64_t(*a.delta_count)) return;
  ops::plan::decode_plan_delta(a, r, threadIdx.x, blockDim.x);
}

__global__ void __launch_bounds__(kThreads) decode_plan_kernel(ops::DecodePlanArgs a) {
  const int64_t b = blockIdx.x;
  const int64_t first = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  const int64_t step = int64_t(gridDim.y) * blockDim.x;
  ops::plan::decode_plan_row(a, b, first, step);
}

}  // namespace

Status build_decode_plan(const ops::DecodePlanArgs& a, cudaStream_t stream) {
  if (a.n_rows <= 0) return Status::Ok();
  if (a.delta_cap > 0) {
    apply_page_deltas_kernel<<<unsigned(a.delta_cap), kThreads, 0, stream>>>(a);
    V4_CUDA_CHECK_LAUNCH("apply_page_deltas_kernel");
  }
  // The longest list of a row: W SWA rows, c·m sources or the candidate capacity.
  int64_t longest = a.window;
  for (int r = 0; r < a.n_rates; ++r) {
    longest = std::max<int64_t>(longest, int64_t(a.rates[r].overlap) * a.rates[r].ratio);
    longest = std::max<int64_t>(longest, a.rates[r].cand_stride);
  }
  // ~2 entries per thread, at most 1,024 blocks per row: each entry is a page-table load (L2) and
  // a store, and one thread's entries run one after another, so at batch 1 the list's latency is
  // the entries per thread × an L2 round trip (the previous 8 entries per thread and 64 blocks
  // gave 16 per thread at a 262,144-candidate bucket).
  // Batches: at most ~8,192 blocks in all (batch 64 at a 1M bucket: 128 a row, ~16 entries a
  // thread — many rows fill the GPU anyway).
  const int64_t y = std::min<int64_t>({int64_t(1024), std::max<int64_t>(1, 8192 / a.n_rows),
                                      std::max<int64_t>(1, longest / (kThreads * 2))});
  dim3 grid(unsigned(a.n_rows), unsigned(y));
  decode_plan_kernel<<<grid, kThreads, 0, stream>>>(a);
  V4_CUDA_CHECK_LAUNCH("decode_plan_kernel");
  return Status::Ok();
}

}  // namespace v4::cuda
