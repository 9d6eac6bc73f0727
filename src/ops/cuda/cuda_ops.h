// The CUDA backend of ops::Ops (ops.h): every op of the forward on the device with f32
// activations (the same contract as the CPU reference), so the model runs on the GPU unchanged.
// Weights are read in their checkpoint format (WFormat: f32, bf16, FP8 128×128 blocks, MXFP4) and
// dequantized inside the GEMM / MoE kernels (never a dequantized copy of the model). Two precision
// modes (CudaOptions::precision), see docs/cuda.md "Precision modes":
//   kFp32 — reference: every output is one fp32 FMA chain over k of x·dequant(W) in a fixed order
//           (batch-invariant; golden fixtures match the CPU backend's tolerance).
//   kBf16 — speed: one-row linears (M ≤ gemv_max_rows = 1) run the weight-streaming GEMV with
//           fp32 math on native bytes (≤ 1e-5 of the fp32 result); larger calls round x to bf16
//           and use tensor cores on the native FP8 / MXFP4 bytes (dense_mma, moe_mma, gmoe_mma;
//           cuBLASLt for bf16 weights), ≤ 2e-2 of a row's max |y|; attention and the indexer
//           run bf16 tensor-core kernels with batch-dependent splits.
// One main stream, plus side streams for the multi-stream branches (CudaOptions::multi_stream,
// ops.h fork/branch/join); ops given the same shapes again neither allocate nor synchronize (grow-only scratch
// sized on first use or by reserve_cuda_scratch), so decode steps can be captured in CUDA graphs.
#pragma once
#include <cstdint>
#include <memory>

#include "base/status.h"
#include "ops/ops.h"

namespace v4::ops {

/// Arithmetic of the weight GEMMs and MoE experts (activations stay f32 in the op interface).
enum class Precision {
  kFp32,  // "fp32": fp32 FMA chains over dequantized weights, fixed order (reference)
  kBf16,  // "bf16": native-byte GEMV for small M (fp32 math); bf16 tensor cores for large M
};

/// Options of the CUDA backend.
struct CudaOptions {
  Precision precision = Precision::kFp32;
  /// kBf16: linear_w with M ≤ this many rows runs the weight-streaming GEMV (fp32 math, ≤ 1e-5);
  /// larger M runs the tensor-core dense_mma on FP8 / MXFP4 bytes (else x→bf16, W→bf16 and
  /// cuBLASLt). 1: at 8 rows dense_mma takes 12–23 µs where the GEMV takes 35–141 µs (FP8 wq_a,
  /// wq_b, wo_b; bench/results/cuda-wformat.md, H200), i.e. about the GEMV's 1-row time.
  /// (f32-stored weights use the GEMV up to kF32GemvMaxRows whatever this says.)
  int64_t gemv_max_rows = 1;
  /// kBf16 moe_experts: with S·k ≥ this many (token, expert) pairs (prefill) the per-expert counts
  /// are read back (one host sync) and every active expert runs cuBLASLt GEMMs on a bf16 copy of
  /// that expert; below it (decode, up to 256 rows × k = 6) the grouped GEMV runs without any sync
  /// or allocation, so it can be graph-captured. The shared-expert form (E = 1) with more than
  /// gemv_max_rows rows runs dense tensor-core GEMMs (no sync).
  int64_t moe_sync_min_pairs = 4096;
  /// kBf16: use the fused tensor-core kernel (wgemm.h wmma_gemm: native weight bytes dequantized
  /// to bf16 tiles in shared memory, WMMA, no scratch, no sync) for linear_w above the GEMV range
  /// and for moe_experts with S ≥ moe_fused_min_rows (all its forms, prefill included).
  /// Off until validated on the device (CudaWFormat.Fused* tests); then it replaces the
  /// dequantize-to-scratch + cuBLASLt paths.
  bool fused_tensor_cores = false;
  int64_t moe_fused_min_rows = 16;
  /// kBf16 moe_experts below moe_sync_min_pairs with E > 1 (routed experts) and FP8 / MXFP4
  /// weights that moe_mma supports: the tensor-core grouped GEMM (moe_mma.h: native weight
  /// bytes → bf16 A fragments, 8 tokens per mma, one read of each active expert per 8 of its
  /// pairs) instead of the fp32-math grouped GEMV. Off: the GEMV (for A/B measurements).
  bool moe_mma = true;
  /// kBf16 linear_w with gemv_max_rows < M ≤ 256 on FP8 / MXFP4 weights: the tensor-core dense
  /// GEMM over native bytes (dense_mma.h) instead of dequantize-to-scratch + cuBLASLt.
  bool dense_mma = true;
  /// kBf16 GEMV range (linear_w, linear_w_grouped, the f32 router linear): the streaming GEMV
  /// (gemv_stream.h: 16-byte non-L1 weight loads, x read from global, 8 loads in flight per
  /// lane) where rows and x are 16-byte aligned, else the shared-memory wgemv kernel. Off: always
  /// the shared-memory kernel (A/B runs). The environment V4_GEMV_STREAM=0 turns it off for every
  /// wgemv call (the MoE grouped GEMV included). Same precision class (fp32 math, ≤ 1e-5).
  bool gemv_stream = true;
  /// kBf16 moe_experts at or above moe_sync_min_pairs with E > 1 and FP8 / MXFP4 weights that
  /// gmoe_mma supports: device routing + the grouped tensor-core GEMM over native bytes
  /// (gmoe_mma.h: 64 items per CTA, SwiGLU fused, no host sync, no allocation, graph-capturable)
  /// instead of one sync + per-expert dequantize + cuBLASLt. Off: the sync path (A/B runs).
  /// The env knob V4_MOE_GROUPED_MIN_ROWS=N (N ≥ 1, e.g. 128) also sends calls below
  /// moe_sync_min_pairs with S ≥ N rows to it (instead of moe_mma), for decode A/B benchmarks.
  bool moe_grouped_mma = true;
  /// Runs the branches of Ops::fork / branch / join (the model's independent attention chains:
  /// SWA store, compressor, indexer compressor) on side streams, concurrently with the main
  /// stream, eagerly and inside graph captures (docs/cuda.md §Multi-stream). Off: every branch
  /// runs on the main stream in issue order (bit-identical results either way: branches touch
  /// disjoint buffers). Overridden by the environment: V4_MULTI_STREAM=1 / 0. Also off while the
  /// region profile is on (its markers time the main stream), and for forks of more than
  /// multi_stream_max_rows rows.
  bool multi_stream = true;
  /// Forks of more query rows than this run in issue order even with multi_stream on (0 = no
  /// limit). Measured on the H200 (bench-v4flash-20l-mstream.md, 20 layers, 4K): on vs off at
  /// batch 1: 6.96 vs 7.12 ms per decode step (−2.2%); at batch 64: 43.4 vs 41.5 ms (+4.6%).
  /// 1 (batch-1 decode only): from 2 rows the branches' linears run dense_mma, whose scratch
  /// slots are one per backend, so the branches hand slots over and serialize anyway.
  int64_t multi_stream_max_rows = 1;
  /// The side stream of fork branch 3 (the indexer compressor, then the indexer top-k: the
  /// critical path of a CSA layer at long context) is created with the device's highest stream
  /// priority, the others with the default, so the chain's CTAs are scheduled ahead of the other
  /// branches' when they compete for SMs. Environment override: V4_STREAM_PRIORITY=1 / 0 (read
  /// at backend creation; streams are created once).
  bool indexer_stream_priority = true;
  /// kBf16 sparse_attention with head_dim 512 and n_rows ≤ attention_dec_max_rows: the decode
  /// kernel (attention_dec.h: bf16 mma.sync, 64 heads per block, cp.async-staged 32-key tiles,
  /// cost-model split-KV) instead of the TF32 kernel (attention_mma). Off: attention_mma for
  /// every bf16 call (the A/B baseline). Environment override: V4_ATTN_DEC=0 (off) / 1 (on,
  /// variant 1) / 2 (on, variant 2) / 3 … 10 (on, variants 3 … 10).
  bool attention_dec = true;
  /// Decode kernel variant (attention_dec.h): 0 (default, auto: attention_dec_auto_variant),
  /// 2 (bf16 pools stream into a 4-deep ring of bf16 tiles, PDL launches, 2–8 splits merged in
  /// a thread block cluster), 1 (the session-5 kernel, for A/B), 3 / 4 (32 / 16 heads per block,
  /// one wave of splits from attention_dec3_splits; fp8 pools run variant 2), 5 (16 heads per
  /// block, preloaded key rows, key-split QK, 2–16 splits merged in a cluster;
  /// attention_dec5_splits), 6 (variant 5 with fewer instructions per tile: ex2 of log2-unit
  /// logits, lazy rescale, register key masks; attention_dec5_splits(..., 6)), 7 / 8 (warpgroup
  /// MMA, 64 heads per CTA, 64- / 32-key tiles, bf16 pools only; attention_dec7_splits), 9 / 10
  /// (7 / 8 with 128-byte-swizzled operands), 11 / 12 (warp-specialized: one warpgroup QK +
  /// softmax, the other the copies into an mbarrier ring; 64- / 32-key tiles), 13 (11 with 48-key
  /// tiles in 3 slots), 14 (whole-row bulk copies into 1,040-byte rows, K / V as the ldmatrix
  /// register operand of transposed products).
  int attention_dec_variant = 0;
  /// Auto (attention_dec_variant 0) takes variant 6 for calls of ≤ 4 rows (off: variant 5 for
  /// > 4,096 keys, else 4); more rows take variant 11. Environment
  /// override: V4_ATTN_DEC_LEAN=1 (on) / 0 (off).
  bool attention_dec_lean = true;
  /// Prefill-sized calls (more rows) with f32 pools keep attention_mma until the decode kernel
  /// is measured there (it is correct for any row count); bf16 pools take it at any row count.
  int64_t attention_dec_max_rows = 256;
  /// indexer_topk launches its chain (decode scores kernel → Lightning TopK → finalize) with
  /// programmatic dependent launch: each kernel waits for its predecessor (griddepcontrol.wait)
  /// before its first global access and triggers its dependents at its start, so the next
  /// launch overlaps the running kernel (the top-k in its PDL form where the auto choice has one:
  /// topk.h variants 43 / 33). Same results bit for bit. Off: plain launches (A/B).
  /// Environment override at backend creation: V4_INDEXER_PDL=0 (off) / 1 (on).
  bool indexer_pdl = true;
  /// indexer_pdl applies to calls of at most this many query rows (batch 1 gains 1.5–3.6 µs a
  /// chain on the H200; batch 64 loses 2–9 µs: bench/results/cuda-indexer.md).
  int64_t indexer_pdl_max_rows = 4;
  /// ... and at most this many candidates per row (max_count): with PDL the chain at batch 1 took
  /// 2.0–2.4 µs less at 1K / 32K candidates but 2.3 / 4.6 µs more at 230,400 / 262,144 (graph
  /// replay, bench/results/cuda-indexer.md chain table, after the finalize lost its sort); the
  /// threshold sits between the measured sizes (a 256K-token context).
  /// Environment override at backend creation: V4_INDEXER_PDL_MAX_COUNT=N.
  int64_t indexer_pdl_max_count = 65536;
  /// indexer_topk calls of at least this many candidates per row (max_count) whose chain is not
  /// PDL-launched (above indexer_pdl_max_count) honour IndexerArgs::after_scores_branch in
  /// multi-stream steps: that branch's later ops (the
  /// model's q tail) wait for the scores kernel, so they run beside the latency-bound top-k
  /// instead of sharing HBM with the scores pass. 0 = never (A/B). H200, V4-Flash 20 layers,
  /// batch 1, bf16 KV + fp8 indexer keys, three A/B pairs at 900K: 5.29 / 5.34 / 5.29 ms with
  /// the gate at 65,536 vs 5.33 / 5.31 / 5.31 without (mean −10 µs, inside the run-to-run
  /// spread; 4K unchanged; bench/results/bench-v4flash-20l-ratio-ab-s13.md). Off (0) since
  /// session 28: with the faster linears (gemv_stream's persistent grid) the gate cost the 900K
  /// step time — 5.35 / 5.38 / 5.37 ms with it vs 5.32 / 5.31 / 5.32 without, 4K unchanged
  /// (bench/results/bench-v4flash-20l-moe-small-s28.md): the q tail now runs beside the scores.
  /// Environment override at backend creation: V4_INDEXER_GATE_MIN_COUNT=N.
  int64_t indexer_gate_min_count = 0;
  /// `cuda::indexer_scores_tc` variant of bf16-mode indexer_topk calls the decode kernel serves
  /// (≤ cuda::kIndexerDecodeMaxRows rows, nI = 64, dI = 128; other calls keep auto): 0 auto (the
  /// decode kernel), 2 / 3 the decode kernel with 16 / 32-key chunks, 4–7 the pipelined decode
  /// kernel (indexer.h: cp.async ring of 3 / 2 / 4 chunk slots per warp; 7 = 4 with the old fp8
  /// conversion), 8 / 9 the warpgroup-MMA (wgmma) decode kernel for bf16 keys (ring of 4 / 3
  /// 64-key tiles; fp8 / f32 keys: the default), 1 the WMMA kernel. Same scores bit for bit
  /// across 0 and 2–7 for bf16 keys (f32 keys: 0 = 2 = 4–9; fp8 keys: 3 = 4–12 = 13–18, while 0
  /// runs the e4m3 kernel); 8 / 9 equal them up to fp32 rounding; 10–12 wgmma with keys on M, 13 / 14 the decode
  /// kernel at ≥ 4 / 5 blocks an SM, 15–18 the pipelined kernel copying whole key rows, 19–21 the
  /// e4m3 mma.sync kernel for fp8 keys, 22 / 23 the same with the key loads one chunk ahead,
  /// 24–26 fp8 keys as exact f16 values on f16 tensor cores (auto for fp8 keys = 24; 19–26 equal
  /// 3 up to fp32 rounding) (indexer.h).
  /// Environment override at backend creation: V4_INDEXER_DEC=N (0–26).
  int indexer_scores_variant = 0;
};

/// Counters of the multi-stream branches of a CUDA backend since creation: forks that ran on
/// side streams, and scratch-slot handoffs between streams inside a fork (each serializes the
/// two branches involved; 0 at the model's decode sizes, docs/cuda.md §Multi-stream).
/// All zero for a backend that is not CUDA.
struct CudaStreamStats {
  int64_t forks = 0;
  int64_t scratch_handoffs = 0;
};
CudaStreamStats cuda_stream_stats(const Ops* ops);

/// "fp32" or "bf16".
const char* precision_name(Precision p);

/// Creates the CUDA backend on the current device (cudaSetDevice before). Errors:
/// kUnsupported when no CUDA device is present, kInternal for CUDA failures.
/// Ops methods cannot return errors (ops.h); a failing CUDA call is recorded, logged, and thrown
/// as std::runtime_error from the next synchronize()/download(); alloc throws std::bad_alloc.
/// A grow-only scratch buffer that would have to grow during Ops::capture fails that capture
/// (capture returns nullptr; run the shapes eagerly first, or reserve_cuda_scratch).
Result<std::unique_ptr<Ops>> make_cuda_ops(CudaOptions options = {});

/// Upper bounds of the op calls a CUDA graph will capture (per call, not summed), so that every
/// grow-only scratch buffer of the CUDA backend can be sized before capture.
struct CudaScratchBounds {
  int64_t max_rows = 0;  // M of linear_w, S of moe_experts / route
  int64_t max_n = 0;     // largest linear_w view: rows (N) ...
  int64_t max_k = 0;     // ... and columns (K)
  int hidden = 0;        // moe_experts D
  int inter = 0;         // moe_experts I
  int experts = 0;       // moe_experts / route E
  int topk = 0;          // moe_experts k
};

/// Grows the scratch buffers of a backend made by make_cuda_ops to what calls within `b` need
/// (in its precision mode). Errors: kInvalidArgument when `ops` is not a CUDA backend,
/// kResourceExhausted when device memory runs out.
Status reserve_cuda_scratch(Ops* ops, const CudaScratchBounds& b);

}  // namespace v4::ops
