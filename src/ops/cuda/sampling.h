// Sampling on the device (issue 6): ops::Ops::sample for the CUDA backend. One token per row of
// logits with the exact rules of the CPU sampler (engine/sampler.h, ops.h SampleArgs), so only
// token ids (and logprobs when asked) leave the GPU instead of a 517 KB logits row per sequence.
//
// Kernels (one stream, in this order; every kernel handles a row with one block, so a row's
// result never depends on the other rows):
//  1. greedy: argmax over V per row (float4 loads, packed (order key, ~id) max → lowest id on
//     ties, NaN lowest). Rows with temperature > 0 return at once. Up to 64 rows of a large
//     vocabulary spread each row over chunks of ≥ 4,096 logits (about two blocks per SM), the
//     row's last block taking the max of the chunks' (the same packed max: the same token).
//  2. (unless all_greedy) per chunk of rows, rows with top-k or top-p only:
//     prep — max x, then a 2048-bin histogram of the order key of x (counts and fixed-point
//       masses) picks the highest bin boundary whose upper part surely holds the kept set
//       (count ≥ top-k, or mass ≥ top_p · total as a lower bound); the entries above it are
//       compacted in id order (keys = ~order_key(x), values = ids). Without a safe cut, or when
//       the max is not finite, the whole row is written ("full sort").
//     sort — cub::DeviceSegmentedRadixSort (stable: ties keep id order) of those segments.
//     draw — top-k / top-p / min-p / draw over the sorted prefix; rows with neither top-k nor
//       top-p walk their logits in id order instead (three passes, no sort).
//  3. logprobs (when asked): raw log-softmax (f64 sum), chosen token, top-n by repeated block
//     max.
// Weights are f32(exp(f64(x − mx))) (the correctly rounded value the CPU's expf gives in all
// but pathological cases), summed in f64 with a fixed block scan, so tokens equal the CPU
// sampler's except when a draw or a top-p / min-p threshold falls within rounding of a boundary.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "ops/cuda/cuda_common.h"
#include "ops/ops.h"

namespace v4::cuda {

/// Owns the sampler's scratch: sort buffers of 16 bytes per entry of a chunk of rows (265 MB for
/// 128 rows of V = 129,280), allocated whole at the first call that sorts, so a fixed vocabulary
/// never grows it again. Grown-out buffers are kept until destruction (a captured graph may
/// still point at them). Not thread-safe; one per stream.
class DeviceSampler {
 public:
  /// `chunk_rows`: rows sorted per pass (bounds the scratch; larger R loops over chunks).
  explicit DeviceSampler(int64_t chunk_rows = 128) : chunk_rows_(chunk_rows < 1 ? 1 : chunk_rows) {}
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  /// Samples `a` (ops.h SampleArgs) on `stream`, asynchronously. The first call of a larger
  /// shape allocates scratch (synchronizing the stream); a call whose shape is not larger only
  /// launches kernels, so it can be captured in a CUDA graph (growing during a capture is an
  /// error). Errors: kInvalidArgument (V < 1 or ≥ 2^31, top_n outside [0, 20], missing
  /// pointers), kResourceExhausted (scratch allocation), kInternal (CUDA errors).
  Status run(const ops::SampleArgs& a, cudaStream_t stream);

  /// Tests and benchmarks: false sorts every top-k/top-p row in full instead of the histogram
  /// cut (the results must be identical).
  void set_prefilter(bool on) { prefilter_ = on; }
  /// Bytes of device scratch held now.
  size_t scratch_bytes() const;

 private:
  Status reserve(int64_t rows, int64_t vocab, cudaStream_t stream);
  Status reserve_temp(size_t bytes, cudaStream_t stream);

  int64_t chunk_rows_;
  bool prefilter_ = true;
  // Views into arena_ (sized for arena_rows_ × arena_vocab_).
  int64_t arena_rows_ = 0, arena_vocab_ = 0;
  uint32_t *keys_a_ = nullptr, *keys_b_ = nullptr;
  int32_t *vals_a_ = nullptr, *vals_b_ = nullptr;
  int32_t *seg_begin_ = nullptr, *seg_end_ = nullptr;
  double* row_sum_ = nullptr;
  DeviceBuffer<unsigned char> arena_, temp_;
  DeviceBuffer<unsigned char> greedy_part_;  // chunked greedy: partials + row counters (fixed size)
  int n_sms_ = 0;
  std::vector<DeviceBuffer<unsigned char>> retired_;  // grown-out buffers, freed at destruction
};

}  // namespace v4::cuda
