// DeepseekV4: the DeepSeek-V4 forward (dsv4-model.md §2–8), written once against ops::Ops, over a
// ragged ForwardBatch (prefill chunks and decode rows of many sequences in one step), with all
// per-request state in cache::KvCache pools.
//
// One step:
//   1. validate slices (start_pos == cached length), reserve pages, build the step's plans once
//      (SWA key maps, compressed-row maps per rate, compressor pooling plans, ring updates) —
//      on the host (model/step_plan.h), or for decode-only batches on the backend
//      (Ops::build_decode_plan) from raw batch state, optionally replayed as a CUDA graph per
//      batch bucket (docs/model.md §Decode plans and graphs);
//   2. embed → for each layer: mHC pre → RMSNorm → attention → mHC post → mHC pre → RMSNorm →
//      MoE → mHC post;
//   3. HyperHead → final RMSNorm → lm_head on the rows that return logits;
//   4. commit the new lengths (frees SWA pages that left every window).
// Chunked prefill equals one-shot prefill because the compressor state (raw kv/gate of the open
// and the previous window) is carried in per-sequence rings across steps. On the CPU backend a
// request's logits are bit-identical whatever else shares the step (all ops are row-wise with fixed
// summation order; see src/ops/cpu).
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

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
  /// Errors: see ModelConfig::load, Checkpoint::open, Weights::load; kResourceExhausted before
  /// reading any weight when they cannot fit in the backend's free memory (check_weights_fit).
  /// Progress (bytes and tensors loaded / total) is logged every 5 s (LoadObserver).
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
  /// Errors: ModelConfig::load_path, truncate_layers, check_weights_fit (refused before any
  /// allocation when the weights cannot fit), Weights::dummy.
  static Result<std::unique_ptr<DeepseekV4>> load_dummy(const std::string& config_path,
                                                        ops::Ops* ops,
                                                        WeightFormatPolicy policy = {},
                                                        int num_layers = 0, uint64_t seed = 0);
  ~DeepseekV4();

  const ModelConfig& config() const { return cfg_; }
  const Weights& weights() const { return w_; }
  const Checkpoint& checkpoint() const { return ck_; }
  ops::Ops* ops() const { return ops_; }

  /// The cache layer table derived from the config (one row per layer), with KV pools of
  /// `kv_dtype` (kF32 default; kBf16 halves the KV bytes, kFp8 stores 608-byte V4 rows,
  /// --kv-cache-dtype) and indexer-key pools as `index` asks (--index-cache-dtype: kAuto follows
  /// kv_dtype, kFp8 stores kFp8Index keys whatever kv_dtype is).
  cache::CacheSpec cache_spec(KvDtype kv_dtype = KvDtype::kF32,
                              IndexCacheDtype index = IndexCacheDtype::kAuto) const;
  /// A KV cache sized from a byte budget (`page_size` tokens per page; 0 → smallest valid size
  /// ≥ 256 that every compression rate divides), allocated through this model's ops.
  /// `max_chunk_tokens` > 0 (the largest slice a step will carry) lets the SWA pool be sized for
  /// live windows only (KvCache::options_from_budget). `kv_dtype`, `index`: element types of the
  /// KV and indexer-key pools (cache_spec); errors kUnsupported when the backend cannot store
  /// them or the model's shapes do not fit them (ModelConfig::check_kv_dtype /
  /// check_index_cache_dtype).
  Result<std::unique_ptr<cache::KvCache>> make_cache(
      int64_t budget_bytes, int max_seqs, int page_size = 0, int64_t max_chunk_tokens = 0,
      KvDtype kv_dtype = KvDtype::kF32, IndexCacheDtype index = IndexCacheDtype::kAuto) const;

  /// Runs one step. Each slice must continue its sequence (start_pos == cache.length(seq)),
  /// a sequence may appear once per batch, token ids must be < vocab_size. Errors:
  /// kInvalidArgument (bad slice), kResourceExhausted (cache full; nothing computed).
  Result<ForwardOutput> forward(const ForwardBatch& batch, cache::KvCache& cache);

  // ---- decode fast path (docs/model.md §Decode plans and graphs) ----------------------------
  /// How decode-only batches (every slice one token, no logits_all, ≤ 256 slices) run.
  struct DecodeOptions {
    /// Replay a graph per (batch bucket, context bucket), captured after one eager warm-up step
    /// (backend must support graphs). Default: on where the backend supports graphs, unless the
    /// environment sets V4_DECODE_GRAPHS=0.
    bool graphs = false;
    /// Without graphs: still build the plan with Ops::build_decode_plan (eager, padded to the
    /// bucket) instead of the host planner. For tests: the CPU backend runs the plan-op path.
    bool device_plan = false;
    /// Smallest context bucket (tokens). A decode step's candidate maps have a fixed per-row
    /// capacity ctx/m with ctx = max(min_context, next power of two ≥ longest row's position+1);
    /// each context bucket is its own graph.
    int64_t min_context = 1024;
  };
  /// Drops the decode fast path's graphs and device tables (the next decode step restages and
  /// captures again), e.g. after a backend setting that captured graphs bake in changed
  /// (Ops::set_multi_stream).
  void reset_decode_graphs();
  /// Turns graph replay on/off (decode results are unchanged either way).
  void set_decode_graphs(bool on) { decode_opt_.graphs = on; }
  void set_decode_options(const DecodeOptions& o) { decode_opt_ = o; }
  const DecodeOptions& decode_options() const { return decode_opt_; }

  /// Counters of the decode fast path since load.
  struct DecodeStats {
    int64_t host_plan_steps = 0;    // steps planned on the host (any batch)
    int64_t device_plan_steps = 0;  // decode steps run eagerly with the plan op
    int64_t graph_replays = 0;      // decode steps run by replaying a graph
    int64_t captures = 0;           // graphs captured
    int64_t capture_failures = 0;   // captures that failed (that key then stays eager)
    int64_t page_rows_sent = 0;     // page-table rows staged (changed addressing)
    /// Replays per (batch bucket B, context bucket) graph.
    std::map<std::pair<int64_t, int64_t>, int64_t> replays;
  };
  const DecodeStats& decode_stats() const { return decode_stats_; }

 private:
  DeepseekV4() = default;
  struct Step;
  struct DecodeState;
  struct RopeTable {
    ops::DeviceBuffer<float> inv_freq;
    int rope_dim = 0;
    float attention_scaling = 1.f;
  };
  const RopeTable& rope_for(LayerKind k) const {
    return k == LayerKind::kSliding ? rope_main_ : rope_compress_;
  }
  /// Rope tables and the decode fast path's constant arrays (after the weights are in place).
  void init_tables();
  void attention(Step& st, int layer, const float* x, float* out);
  /// MoE of one layer: out = routed(x) + shared(x); with `h` set, then the mHC post of the FFN
  /// site on h (Ops::hc_post_add: the add and the post in one op; out is scratch then).
  void moe(Step& st, int layer, const float* x, float* out, float* h = nullptr,
           const float* post = nullptr, const float* comb = nullptr);
  /// Embedding and every layer over st.S rows; returns h [S, n, D] (step memory).
  float* run_layers(Step& st);
  /// HyperHead → norm → lm_head on R rows of h (rows `sel`, or rows 0..R−1 when sel is null);
  /// returns logits [R, vocab] (step memory).
  float* head(Step& st, const float* h, const int32_t* sel, int64_t R);
  Result<ForwardOutput> forward_host_plan(const ForwardBatch& batch, cache::KvCache& kv);
  Result<ForwardOutput> forward_decode(const ForwardBatch& batch, cache::KvCache& kv);
  bool decode_fast_path(const ForwardBatch& batch, const cache::KvCache& kv) const;
  DecodeState& decode_state(cache::KvCache& kv);
  /// Plans a decode step of bucket B on the backend from the staged raw state (st.mem memory).
  void plan_on_device(Step& st, DecodeState& ds, int64_t B, int64_t ctx);
  /// Graph body and warm-up: plan on the backend + layers + head; returns logits [B, vocab].
  float* decode_body(Step& st, DecodeState& ds, int64_t B, int64_t ctx);

  ModelConfig cfg_;
  Checkpoint ck_;
  Weights w_;
  ops::Ops* ops_ = nullptr;
  /// When the current forward call started (Ops::note_host_prep before step_begin).
  std::chrono::steady_clock::time_point forward_t0_{};
  RopeTable rope_main_, rope_compress_;
  /// Shared-expert routing constants (expert 0, weight 1) for up to kMaxDecodeRows rows.
  ops::DeviceBuffer<int32_t> shared_idx_;
  ops::DeviceBuffer<float> shared_w_;
  DecodeOptions decode_opt_;
  DecodeStats decode_stats_;
  std::unique_ptr<DecodeState> decode_;
};

}  // namespace v4::model
