// Weights: every parameter of a DeepSeek-V4 checkpoint decoded once at load to f32 backend
// buffers (dsv4-model.md §11 for names/shapes). Memory cost on the CPU backend: 4 bytes per
// parameter (e.g. the tiny fixtures: < 2 MB; V4-Flash would need ~1.1 TB — the CPU backend is a
// reference for small models). Routed experts are stored fused as in transformers:
// w13 [E, 2I, D] (rows [0,I) = w1/gate, [I,2I) = w3/up) and w2 [E, D, I].
#pragma once
#include <cstdint>
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

/// One compressor (dsv4-model.md §5): c = 2 (CSA / indexer) or 1 (HCA), d = hd or dI.
struct CompressorWeights {
  FBuf wkv;    // [c·d, D]
  FBuf wgate;  // [c·d, D]
  FBuf ape;    // [m, c·d] position_bias
  FBuf norm;   // [d] kv_norm
};

struct AttentionWeights {
  FBuf wq_a;                     // [Rq, D]
  FBuf q_norm;                   // [Rq]
  FBuf wq_b;                     // [H·hd, Rq]
  FBuf wkv;                      // [hd, D]
  FBuf kv_norm;                  // [hd]
  FBuf wo_a;                     // [G·R, H·hd/G]
  FBuf wo_b;                     // [D, G·R]
  FBuf sinks;                    // [H]
  CompressorWeights compressor;  // CSA / HCA only
  // CSA indexer
  CompressorWeights index_compressor;  // c = 2, d = dI
  FBuf index_wq_b;                     // [nI·dI, Rq]
  FBuf index_weights_proj;             // [nI, D]
};

struct MoeWeights {
  FBuf gate;        // [E, D]
  FBuf bias;        // [E] e_score_correction_bias (score layers)
  IBuf tid2eid;     // [V, k] (hash layers)
  FBuf w13;         // [E, 2I, D]
  FBuf w2;          // [E, D, I]
  FBuf shared_w13;  // [2I, D]
  FBuf shared_w2;   // [D, I]
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
  FBuf head;                                     // [V, D]
  FBuf norm;                                     // [D]
  FBuf hc_head_fn, hc_head_base, hc_head_scale;  // [n, nD], [n], [1]
  std::vector<LayerWeights> layers;
  std::vector<MtpWeights> mtp;
  ParamCounts counts;

  /// Decodes every tensor the config requires from `ck` (errors name the tensor, file, expected
  /// vs found shape/dtype) and uploads it through `ops`. MTP modules are loaded when `mtp.0.*`
  /// tensors are present.
  static Result<Weights> load(const Checkpoint& ck, const ModelConfig& cfg, ops::Ops* ops);
};

}  // namespace v4::model
