// Weight GEMMs of the CUDA backend over ops::WeightView matrices in their stored format
// (f32, bf16, FP8 128×128 blocks, MXFP4), dequantized inside the kernels (wformat.cuh).
//   wgemm_fp32      fp32 mode: 64×64 tiles, the weight tile dequantized into shared memory; each
//                   output one sequential FMA chain over k = 0..K−1 (batch-invariant).
//   wgemv           bf16 mode, small M (decode) and the grouped MoE GEMV: streams native weight
//                   bytes with 16-byte loads, fp32 math on f32 x staged in shared memory, split-K
//                   across the warps of a block with a fixed reduction order (a row's result does
//                   not depend on M). By default wgemv hands aligned calls to gemv_stream
//                   (gemv_stream.h: no shared-memory staging, 8 × 16-byte loads in flight per lane).
//   dequant_view_bf16 / rows_to_bf16   bf16 operands for the tensor-core (cuBLASLt) path.
// Y[M, N] = X[M, K] · W[N, K]ᵀ; x rows stride ldx, y rows stride ldy (elements).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "ops/cuda/gemm.h"
#include "ops/ops.h"

namespace v4::cuda {

/// y[i, :] = x[i, :] · dequant(W_e)ᵀ for i < M, W_e = expert `e` of `w` (w.n rows, w.k cols).
/// fp32 FMA chain per output in k order. Errors: kInvalidArgument for a bad view.
Status wgemm_fp32(const float* x, int64_t ldx, const ops::WeightView& w, int64_t e, int64_t M,
                  float* y, int64_t ldy, cudaStream_t stream);

/// Arguments of the weight-streaming GEMV. Plain form (list == nullptr): rows i < rows of x/y,
/// expert 0. Grouped form (MoE): block row blockIdx.y handles active expert slot y: expert
/// e = active[y] (y < *active_count), whose rows are list[offset[e] .. offset[e+1]); item i reads
/// x row list[i] / xdiv and writes y row list[i].
/// swiglu: w has 2·n_out rows ([0, n_out) gate, [n_out, 2·n_out) up) and the output is
/// silu(min(g, limit))·clamp(u, −limit, limit) (limit ≤ 0: no clamp), dsv4-model.md §8.
struct GemvArgs {
  ops::WeightView w;
  const float* x = nullptr;
  int64_t ldx = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t rows = 0;   // plain form: M
  int64_t n_out = 0;  // outputs per row: w.n, or w.n / 2 with swiglu
  bool swiglu = false;
  float limit = 0.f;
  const int32_t* list = nullptr;
  const int32_t* offset = nullptr;        // [E + 1]
  const int32_t* active = nullptr;        // [E] active experts, ascending
  const int32_t* active_count = nullptr;  // [1]
  int xdiv = 1;
  /// Grouped form: an expected bound on rows per expert (e.g. the token count S when a token's
  /// experts are distinct); picks the kernel's rows-per-pass template (1, 2 or 8). Any value is
  /// correct — more rows run in further passes —; 0 = unknown (8).
  int64_t rows_hint = 0;
  /// Grouped plain form (list == nullptr, grid_y = groups): group g = blockIdx.y reads x from
  /// x + g·x_group_stride, weight rows from g·n_out and writes y + g·y_group_stride.
  int64_t x_group_stride = 0, y_group_stride = 0;
  /// Let wgemv run the streaming kernel (gemv_stream.h) where it applies (aligned rows); false:
  /// the shared-memory kernel below (A/B runs: CudaOptions::gemv_stream, env V4_GEMV_STREAM=0).
  bool use_stream_kernel = true;
  /// gemv_stream only: with 1 … 4 waves of output tiles, about one wave of blocks, each looping
  /// over an equal share of the tiles (default); false (or env V4_GEMV_PERSIST=0, A/B): one block
  /// per tile. The same bits either way.
  bool persist = true;
  // Filled by wgemv: warps splitting K, rows of x per shared-memory pass, row capacity per pass.
  int ks = 1, mc = 1;
};

/// Runs the GEMV over `grid_y` expert slots (1 for the plain form). `num_sms` sizes the grid.
/// With a.use_stream_kernel (default), env V4_GEMV_STREAM ≠ 0 and gemv_stream_supported(a) it
/// runs gemv_stream (gemv_stream.h: streaming loads, x from global, no shared-memory staging);
/// otherwise the shared-memory kernel described above. Both: fp32 math, batch-invariant.
/// Errors: kUnsupported when a row of x does not fit in shared memory (K > ~48K) or an MXFP4
/// view is not 16-byte aligned (callers fall back to wgemm_fp32).
Status wgemv(GemvArgs a, int grid_y, int num_sms, cudaStream_t stream);

/// Fused tensor-core GEMM over native weight bytes (wmma_gemm.cu), same arguments as wgemv
/// (plain, grouped and SwiGLU forms): 64 × 64 tiles, x rounded to bf16, weight tiles dequantized
/// to bf16 in shared memory (exact for bf16 / ue8m0 FP8 / MXFP4), WMMA with fp32 accumulation.
/// Needs K % 64 == 0, 16-byte aligned weight rows and x rows; f32 weights are not handled.
Status wmma_gemm(const GemvArgs& a, int grid_y, int num_sms, cudaStream_t stream);
bool wmma_gemm_supported(const ops::WeightView& w, const float* x, int64_t ldx);

/// Sets the kernels' shared-memory attributes (once per device, before any wgemv call; the
/// backend calls it at creation so no attribute call happens inside a graph capture).
Status wgemv_prepare();

/// Whether wgemv can run this view (K fits shared memory, MXFP4 alignment).
bool wgemv_supported(const ops::WeightView& w);

/// out[n, k] = bf16(dequant(W_e)[n, k]) for the view's n rows (contiguous [n, K]).
Status dequant_view_bf16(const ops::WeightView& w, int64_t e, __nv_bfloat16* out,
                         cudaStream_t stream);

/// out[i, k] = bf16(x[i·ldx + k]) for i < M, k < K (contiguous [M, K]), round to nearest even.
Status rows_to_bf16(const float* x, int64_t ldx, int64_t M, int64_t K, __nv_bfloat16* out,
                    cudaStream_t stream);

/// Scratch slots of the CUDA backend (grow-only buffers, CudaOps::scratch). One buffer per slot
/// for all streams: between Ops::fork and join a stream that takes a slot another stream used
/// last waits for that stream first (CudaOps::scratch "handoff"), so concurrent branches never
/// share one; the model's decode branches take none at their sizes (docs/cuda.md §Multi-stream).
enum ScratchSlot : int {
  kSlotIndexerScores = 0,
  kSlotIndexerSel = 1,
  kSlotRoute = 2,
  kSlotF32A = 3,        // MoE gate/up (f32) or act (f32)
  kSlotF32B = 4,        // MoE act (fp32 mode)
  kSlotF32C = 5,        // MoE per-pair down (f32)
  kSlotXBf16 = 6,       // tensor-core paths: x as bf16
  kSlotWBf16 = 7,       // tensor-core paths: one dequantized weight matrix / expert as bf16
  kSlotMoeInts = 8,     // MoE routing: offsets, active experts, pair lists
  kSlotActBf16 = 9,     // MoE tensor-core paths: act as bf16
  kSlotAttention = 10,  // sparse_attention split-KV workspace (attention.h)
  kSlotMhc = 11,        // mHC partial sums (mhc.h mhc_fused_work_floats)
  kSlotMhcCount = 12,   // mHC finishing counters (mhc_fused_counters; zeroed when grown)
  kNumScratchSlots = 13,
};

/// Device context of the bf16-mode paths: the backend's stream, cuBLASLt handle and scratch.
struct KernelContext {
  cudaStream_t stream = nullptr;
  Gemm* gemm = nullptr;
  int num_sms = 132;
  int64_t gemv_max_rows = 1;        // CudaOptions::gemv_max_rows
  int64_t sync_min_pairs = 4096;    // CudaOptions::moe_sync_min_pairs
  bool fused_tc = false;            // CudaOptions::fused_tensor_cores
  int64_t fused_moe_min_rows = 16;  // CudaOptions::moe_fused_min_rows
  bool moe_mma = true;              // CudaOptions::moe_mma
  /// moe_mma kernel configurations (MoeMmaArgs::version): 2 = default, 1 = the old 8-token
  /// kernel, 3 = experimental (CudaOps: env V4_MOE_MMA_VERSION=1|3; A/B runs).
  int moe_mma_version = 2;
  /// gmoe_mma warps per CTA (GmoeArgs::warps): 8 = default, 4 = the first version (CudaOps: env
  /// V4_GMOE_WARPS=4; A/B runs).
  int gmoe_warps = 8;
  /// gmoe_mma on warpgroup MMA (GmoeArgs::wgmma; default) or on the mma.sync kernel with
  /// gmoe_warps warps (CudaOps: env V4_GMOE_WGMMA=0; A/B runs).
  bool gmoe_wgmma = true;
  /// GmoeArgs::wg_variant (CudaOps: env V4_GMOE_WG_VARIANT=0…4; A/B runs).
  int gmoe_wg_variant = 0;
  bool dense_mma = true;            // CudaOptions::dense_mma
  bool gemv_stream = true;          // CudaOptions::gemv_stream
  bool grouped_moe = true;          // CudaOptions::moe_grouped_mma
  /// > 0: MoE calls below sync_min_pairs with S ≥ this many rows also take the grouped
  /// tensor-core path (CudaOps: env V4_MOE_GROUPED_MIN_ROWS; decode A/B runs). 0: off.
  int64_t grouped_min_rows = 0;
  /// Grow-only scratch buffer `slot` of at least `bytes` (may throw, see cuda_ops.h).
  void* (*scratch)(void* self, int slot, size_t bytes) = nullptr;
  void* self = nullptr;
  void* get(int slot, size_t bytes) const { return scratch(self, slot, bytes); }
};

/// bf16-mode linear_w: y[i, :] = x[i, :] · dequant(W)ᵀ (expert 0). M ≤ c.gemv_max_rows: wgemv
/// (fp32 math on native bytes); larger M: with c.fused_tc the fused wmma_gemm where supported,
/// else x and W rounded to bf16 (W dequantized into scratch unless stored as bf16), cuBLASLt
/// with fp32 accumulation and f32 output; f32 weights always run wgemm_fp32 above the GEMV range.
/// bf16-mode Ops::linear_w_grouped: all groups in one grouped wgemv launch when the GEMV takes
/// M rows (linear_bf16_uses_gemv), else linear_w_bf16 per group. Errors: kInvalidArgument when
/// w.n % groups != 0.
Status linear_w_grouped_bf16(const float* x, int64_t ldx, const ops::WeightView& w, int groups,
                             int64_t M, float* y, int64_t ldy, const KernelContext& c);
Status linear_w_bf16(const float* x, int64_t ldx, const ops::WeightView& w, int64_t M, float* y,
                     int64_t ldy, const KernelContext& c);

/// Rows of x one wgemv pass holds in shared memory for a view with w.k columns (≥ 1).
int64_t wgemv_pass_rows(const ops::WeightView& w);

/// Whether linear_w_bf16 runs M rows through wgemv (fp32 math, batch-invariant) rather than
/// tensor cores: M ≤ gemv_max_rows and wgemv supports the view; for bf16-stored weights also
/// M ≤ wgemv_pass_rows (cuBLASLt reads bf16 weights in place, while every further GEMV pass would
/// read them again).
bool linear_bf16_uses_gemv(const ops::WeightView& w, int64_t M, int64_t gemv_max_rows);
/// f32-stored weights use the GEMV up to this many rows whatever gemv_max_rows says; above it,
/// cuBLASLt in fp32 (Gemm::f32_strided). The GEMV re-reads the weight every 8 rows: the MoE router
/// ([256, 4096] f32) took 126 µs per layer at batch 64 on the H200 (bench-v4flash-20l-kvbf16.md).
constexpr int64_t kF32GemvMaxRows = 8;

/// Scratch bytes per slot linear_w_bf16 needs for M rows of an n × K view (`bf16_weight`: stored
/// as bf16, no dequantized copy), maxed into bytes[kNumScratchSlots].
void linear_scratch_bytes(int64_t M, int64_t n, int64_t K, bool bf16_weight, const KernelContext& c,
                          size_t* bytes);

}  // namespace v4::cuda
