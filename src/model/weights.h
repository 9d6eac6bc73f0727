// Weights: every parameter of a DeepSeek-V4 checkpoint in backend memory (dsv4-model.md §11 for
// names/shapes). Vectors (norms, biases, mHC, sinks, ape) and the router are f32. Matrices are
// `WBuf`s: on a backend that reads native formats (`Ops::supports`, the CUDA backend) they keep
// the checkpoint's format — BF16, FP8 e4m3 with 128×128 block scales, MXFP4 experts — and are
// dequantized inside the GEMM; otherwise (CPU backend) they are decoded once to f32 (4 bytes per
// parameter: a reference for small models). Routed experts are stored fused as in transformers:
// w13 [E, 2I, D] (rows [0,I) = w1/gate, [I,2I) = w3/up) and w2 [E, D, I].
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "ops/ops.h"

namespace v4::model {

using FBuf = ops::DeviceBuffer<float>;
using IBuf = ops::DeviceBuffer<int32_t>;

/// A weight matrix (or a stack of expert matrices) in backend memory, in the format `view` says.
struct WBuf {
  ops::DeviceBuffer<uint8_t> data;   // values / codes (ops::WeightView::data)
  ops::DeviceBuffer<uint8_t> scale;  // block or group scales (FP8 / MXFP4), else empty
  ops::WeightView view;
  const ops::WeightView& v() const { return view; }
  /// Bytes held on the backend.
  int64_t bytes() const { return data.size() + scale.size(); }
};

/// How matrices are stored (Weights::load and the dummy generator).
struct WeightFormatPolicy {
  /// Keep BF16 / FP8 / MXFP4 checkpoint tensors as stored when the backend supports the format
  /// (else decode to f32).
  bool native = true;
  /// Store f32/f16 checkpoint matrices as bf16 on backends that support it (halves their bytes;
  /// rounds the weights: the bf16 tolerance applies). Off = exact f32.
  bool f32_as_bf16 = false;
};

/// Progress of a weight load (Weights::load: checkpoint tensors read and uploaded, bytes as
/// stored in the safetensors files, scale tensors counted with their weight; Weights::dummy:
/// tensors generated, backend bytes).
struct LoadProgress {
  int64_t bytes_done = 0, bytes_total = 0;
  int64_t tensors_done = 0, tensors_total = 0;
  double elapsed_s = 0;  // since the load started
  bool finished = false;  // the last report of a successful load
};

/// What a load reports. Independently of `on_progress`, the load logs (info) one line with the
/// totals when it starts, a "bytes done / total, tensors done / total" line every
/// `log_interval_s` seconds (≤ 0: none), and a final line with bytes, tensors, seconds and GB/s
/// (none of these lines with `log` false).
struct LoadObserver {
  /// Called after every tensor (and once more with finished = true); may be empty.
  std::function<void(const LoadProgress&)> on_progress;
  double log_interval_s = 5.0;
  /// false: no log lines at all (e.g. `v4serve info`'s shape-only pass, which loads nothing).
  bool log = true;
};

/// Backend memory a set of weights takes.
struct WeightFootprint {
  int64_t bytes = 0;    // backend bytes (matrices in their resolved format, vectors f32/int32)
  int64_t tensors = 0;  // tensors (a WBuf with scales counts once)
};

/// The backend bytes and tensor count Weights::dummy(cfg, ops, policy) allocates, computed
/// without allocating anything (formats resolved through ops.supports as the generator does).
/// For Weights::load of a checkpoint that stores the formats `cfg` implies (dsv4-model.md §11.1)
/// this is the footprint less the MTP modules, i.e. a lower bound.
WeightFootprint estimate_weight_footprint(const ModelConfig& cfg, const ops::Ops& ops,
                                          WeightFormatPolicy policy = {});

/// Bytes, as stored in the safetensors files, of the tensors Weights::load reads for `cfg` (every
/// tensor but those of layers past cfg.num_hidden_layers and MTP modules past
/// num_nextn_predict_layers; scale tensors included). A lower bound of what the load allocates
/// on any backend (native formats keep their bytes, decoding only grows them).
int64_t checkpoint_load_bytes(const Checkpoint& ck, const ModelConfig& cfg);

/// Refuses up front a model whose weights cannot fit: kResourceExhausted, one line naming
/// `model_name`, the bytes needed and the bytes ops->memory_info() reports free (CPU:
/// /proc/meminfo MemAvailable; CUDA: cudaMemGetInfo), with a --num-layers hint. Needed =
/// estimate_weight_footprint, capped at `stored_bytes` (checkpoint_load_bytes; ≥ 0 for a real
/// checkpoint) on a backend that keeps any native format — there the checkpoint may store smaller
/// formats than its config implies, and a model that fits must never be refused. OK when they
/// fit or when the backend does not report its memory (free_bytes ≤ 0).
Status check_weights_fit(const std::string& model_name, const ModelConfig& cfg, ops::Ops* ops,
                         WeightFormatPolicy policy = {}, int64_t stored_bytes = -1);

/// One compressor (dsv4-model.md §5): c = 2 (CSA / indexer) or 1 (HCA), d = hd or dI.
struct CompressorWeights {
  WBuf wkv;    // [c·d, D]
  WBuf wgate;  // [c·d, D]
  FBuf ape;    // [m, c·d] position_bias
  FBuf norm;   // [d] kv_norm
};

struct AttentionWeights {
  WBuf wq_a;                     // [Rq, D]
  FBuf q_norm;                   // [Rq]
  WBuf wq_b;                     // [H·hd, Rq]
  WBuf wkv;                      // [hd, D]
  FBuf kv_norm;                  // [hd]
  WBuf wo_a;                     // [G·R, H·hd/G]
  WBuf wo_b;                     // [D, G·R]
  FBuf sinks;                    // [H]
  CompressorWeights compressor;  // CSA / HCA only
  // CSA indexer
  CompressorWeights index_compressor;  // c = 2, d = dI
  WBuf index_wq_b;                     // [nI·dI, Rq]
  WBuf index_weights_proj;             // [nI, D]
};

struct MoeWeights {
  FBuf gate;        // [E, D]
  FBuf bias;        // [E] e_score_correction_bias (score layers)
  IBuf tid2eid;     // [V, k] (hash layers)
  WBuf w13;         // [E, 2I, D]
  WBuf w2;          // [E, D, I]
  WBuf shared_w13;  // [2I, D]
  WBuf shared_w2;   // [D, I]
};

struct LayerWeights {
  LayerKind kind = LayerKind::kSliding;
  MlpKind mlp = MlpKind::kMoe;
  FBuf attn_norm, ffn_norm;                      // [D]
  FBuf hc_attn_fn, hc_attn_base, hc_attn_scale;  // [(2+n)n, nD], [(2+n)n], [3]
  FBuf hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  AttentionWeights attn;
  MoeWeights ffn;
};

/// MTP module `mtp.0` (dsv4-model.md §9), loaded when present (not run by the forward yet).
struct MtpWeights {
  FBuf e_proj, h_proj;      // [D, D]
  FBuf enorm, hnorm, norm;  // [D]
  FBuf hc_head_fn, hc_head_base, hc_head_scale;
  LayerWeights block;  // sliding attention + score MoE
};

/// Parameter counts by part (for `v4serve info`).
struct ParamCounts {
  int64_t embed = 0, head = 0, attention = 0, compressor = 0, indexer = 0, routed_experts = 0,
          shared_experts = 0, router = 0, norms_and_mhc = 0, mtp = 0;
  int64_t total() const {
    return embed + head + attention + compressor + indexer + routed_experts + shared_experts +
           router + norms_and_mhc + mtp;
  }
};

struct Weights {
  FBuf embed;                                    // [V, D]
  WBuf head;                                     // [V, D]
  FBuf norm;                                     // [D]
  FBuf hc_head_fn, hc_head_base, hc_head_scale;  // [n, nD], [n], [1]
  std::vector<LayerWeights> layers;
  std::vector<MtpWeights> mtp;
  ParamCounts counts;

  /// Decodes every tensor the config requires from `ck` (errors name the tensor, file, expected
  /// vs found shape/dtype) and uploads it through `ops`. MTP modules are loaded when `mtp.0.*`
  /// tensors are present.
  /// Progress goes to `obs` (LoadObserver; totals from the checkpoint's tensor headers: every
  /// tensor of the kept layers, the MTP modules the config names, and the globals).
  static Result<Weights> load(const Checkpoint& ck, const ModelConfig& cfg, ops::Ops* ops,
                              WeightFormatPolicy policy = {}, const LoadObserver& obs = {});
  /// Random weights ("--load-format dummy") of every tensor `load` produces for `cfg` (MTP
  /// modules excepted: the forward does not run them), generated on the backend with
  /// Ops::fill_random (no host copy of a large tensor). Formats are those a real checkpoint
  /// of `cfg` stores (dsv4-model.md §11.1), subject to the backend like `load`:
  /// - with `quantization_config`: attention wq_a/wq_b/wkv/wo_a/wo_b, indexer wq_b and the
  ///   shared expert FP8 e4m3 with 128×128 block scales; routed experts MXFP4 (e2m1 + ue8m0 per
  ///   32) when `expert_dtype` is "fp4" (and the input dims are multiples of 32), else FP8;
  ///   compressor / indexer-compressor wkv/wgate, indexer weights_proj and lm_head BF16;
  /// - without: every matrix in the config's dtype (bf16 → BF16, otherwise f32);
  /// - a format the backend does not read (`Ops::supports`, or policy.native off) becomes f32
  ///   (bf16 with policy.f32_as_bf16 where supported): on the CPU backend everything is f32,
  ///   drawn from the same distributions.
  /// Values (so activations stay finite and O(1) through any number of layers): a matrix
  /// [N, K] ≈ N(0, 1/K) (FP8: e4m3 codes ≈ N(0, (σ/b)²) times a power-of-two block scale b;
  /// MXFP4: uniform e2m1 codes times ue8m0 scales 2^(round(log2 s) ± 1) with s chosen so the
  /// product's standard deviation ≈ 1/√K); norm weights 1; embeddings N(0, 1); mHC fn
  /// N(0, 0.01/(n·D)), base N(0, 0.01), scale 1; router gate N(0, 1/D), bias N(0, 1e-4);
  /// hash tables tid2eid uniform in [0, E); sinks N(0, 1); position biases N(0, 0.01).
  /// Routing over random weights is roughly uniform over the experts. Same `seed` → the same
  /// weights on any backend (fill_random is counter-based). Errors: kResourceExhausted when
  /// the backend cannot allocate. Progress goes to `obs` (totals: estimate_weight_footprint).
  static Result<Weights> dummy(const ModelConfig& cfg, ops::Ops* ops,
                               WeightFormatPolicy policy = {}, uint64_t seed = 0,
                               const LoadObserver& obs = {});
  /// Backend bytes of all matrices by format name ("f32", "bf16", "fp8-block", "mxfp4").
  std::map<std::string, int64_t> bytes_by_format() const;
  /// Backend bytes of everything else (f32 embedding, norms, mHC, router, biases, sinks, ape;
  /// int32 hash tables), MTP modules included.
  int64_t vector_bytes() const;
};

/// An ops backend that allocates nothing (placeholder addresses, never dereferenced), claims to
/// read every weight format and runs no op: Weights::dummy on it yields the tensors, formats and
/// byte counts a model would have on a native-format backend without any memory (for `v4serve
/// info --load-format dummy` and memory planning). Calling a compute op is a no-op.
std::unique_ptr<ops::Ops> make_shape_only_ops();

}  // namespace v4::model
