// DeepseekV4: the DeepSeek-V4 forward (dsv4-model.md §2–8), written once against ops::Ops, over a
// ragged ForwardBatch (prefill chunks and decode rows of many sequences in one step), with all
// per-request state in cache::KvCache pools.
//
// One step:
//   1. validate slices (start_pos == cached length), reserve pages, build the step's plans once
//      (SWA key maps, compressed-row maps per rate, compressor pooling plans, ring updates);
//   2. embed → for each layer: mHC pre → RMSNorm → attention → mHC post → mHC pre → RMSNorm →
//      MoE → mHC post;
//   3. HyperHead → final RMSNorm → lm_head on the rows that return logits;
//   4. commit the new lengths (frees SWA pages that left every window).
// Chunked prefill equals one-shot prefill because the compressor state (raw kv/gate of the open
// and the previous window) is carried in per-sequence rings across steps. On the CPU backend a
// request's logits are bit-identical whatever else shares the step (all ops are row-wise with fixed
// summation order; see src/ops/cpu).
#pragma once
#include <memory>
#include <string>

#include "base/status.h"
#include "cache/pools.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/weights.h"
#include "ops/ops.h"

namespace v4::model {

class DeepseekV4 {
 public:
  /// Loads config.json + safetensors from `dir` and decodes all weights through `ops`.
  /// Errors: see ModelConfig::load, Checkpoint::open, Weights::load.
  /// `policy`: how matrices are stored (native BF16/FP8/MXFP4 where the backend reads them).
  /// `num_layers` > 0 keeps only the first num_layers decoder layers (ModelConfig::
  /// truncate_layers; the other layers' tensors are not read).
  static Result<std::unique_ptr<DeepseekV4>> load(const std::string& dir, ops::Ops* ops,
                                                  WeightFormatPolicy policy = {},
                                                  int num_layers = 0);
  /// A model with random weights of the real shapes and formats ("--load-format dummy",
  /// Weights::dummy) for the config `config_path` (a config.json file or a directory holding
  /// one; no safetensors needed), generated on the backend. `num_layers` > 0 keeps the first
  /// num_layers layers (to fit a V4-Flash/Pro-shaped model on one GPU). checkpoint() is empty.
  /// Errors: ModelConfig::load_path, truncate_layers, Weights::dummy.
  static Result<std::unique_ptr<DeepseekV4>> load_dummy(const std::string& config_path,
                                                        ops::Ops* ops,
                                                        WeightFormatPolicy policy = {},
                                                        int num_layers = 0, uint64_t seed = 0);
  ~DeepseekV4();

  const ModelConfig& config() const { return cfg_; }
  const Weights& weights() const { return w_; }
  const Checkpoint& checkpoint() const { return ck_; }
  ops::Ops* ops() const { return ops_; }

  /// The cache layer table derived from the config (one row per layer).
  cache::CacheSpec cache_spec() const;
  /// A KV cache sized from a byte budget (`page_size` tokens per page; 0 → smallest valid size
  /// ≥ 256 that every compression rate divides), allocated through this model's ops.
  /// `max_chunk_tokens` > 0 (the largest slice a step will carry) lets the SWA pool be sized for
  /// live windows only (KvCache::options_from_budget).
  Result<std::unique_ptr<cache::KvCache>> make_cache(int64_t budget_bytes, int max_seqs,
                                                     int page_size = 0,
                                                     int64_t max_chunk_tokens = 0) const;

  /// Runs one step. Each slice must continue its sequence (start_pos == cache.length(seq)),
  /// a sequence may appear once per batch, token ids must be < vocab_size. Errors:
  /// kInvalidArgument (bad slice), kResourceExhausted (cache full; nothing computed).
  Result<ForwardOutput> forward(const ForwardBatch& batch, cache::KvCache& cache);

 private:
  DeepseekV4() = default;
  struct Step;
  struct RopeTable {
    ops::DeviceBuffer<float> inv_freq;
    int rope_dim = 0;
    float attention_scaling = 1.f;
  };
  const RopeTable& rope_for(LayerKind k) const {
    return k == LayerKind::kSliding ? rope_main_ : rope_compress_;
  }
  void init_rope();
  void attention(Step& st, int layer, const float* x, float* out);
  void moe(Step& st, int layer, const float* x, float* out);

  ModelConfig cfg_;
  Checkpoint ck_;
  Weights w_;
  ops::Ops* ops_ = nullptr;
  RopeTable rope_main_, rope_compress_;
};

}  // namespace v4::model
