// ModelConfig: config.json of a DeepSeek-V4 checkpoint (model_type "deepseek_v4"), parsed and
// normalized exactly like transformers 5.17.0 `DeepseekV4Config.__post_init__`
// (dsv4-model.md §1, pitfalls P13), then validated.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "ops/ops.h"

namespace v4::model {

/// Attention kind of one layer (config `layer_types`).
enum class LayerKind { kSliding, kCsa, kHca };
/// MoE routing kind of one layer (config `mlp_layer_types`).
enum class MlpKind { kHashMoe, kMoe };

const char* layer_kind_name(LayerKind k);  // "sliding_attention", ...
const char* mlp_kind_name(MlpKind k);      // "hash_moe", "moe"

/// One rope table (`rope_parameters.main` or `.compress`), dsv4-model.md §1.4 / §4 "RoPE".
struct RopeSpec {
  bool yarn = false;       // rope_type "yarn" (else "default")
  double theta = 10000.0;  // rope_theta (base)
  double partial_rotary_factor = 0.125;
  int rope_dim = 64;                            // rd = int(head_dim · partial_rotary_factor)
  double factor = 1.0;                          // yarn
  double original_max_position_embeddings = 0;  // yarn L0
  double beta_fast = 32, beta_slow = 1;         // yarn
  double attention_factor = 1.0;  // cos/sin multiplier (HF: derived when absent, see P13)

  /// inv_freq [rd/2] f32, as transformers computes it (default: base^-(2i/rd); yarn: ramp mix
  /// of extrapolation and interpolation frequencies, truncate=True).
  std::vector<float> inv_freq() const;
};

/// The parsed, normalized configuration. Field names follow DeepseekV4Config.
struct ModelConfig {
  std::string model_type;
  int64_t vocab_size = 129280;
  int hidden_size = 4096;        // D
  int num_hidden_layers = 43;    // L
  int num_attention_heads = 64;  // H
  int head_dim = 512;            // hd
  int q_lora_rank = 1024;        // Rq
  int o_groups = 8;              // G
  int o_lora_rank = 1024;        // R
  int sliding_window = 128;      // W
  int compress_rate_csa = 4;     // m
  int compress_rate_hca = 128;   // m'
  int index_n_heads = 64;        // nI
  int index_head_dim = 128;      // dI
  int index_topk = 512;
  int hc_mult = 4;  // n
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-6;
  int n_routed_experts = 256;   // E
  int num_experts_per_tok = 6;  // k
  int n_shared_experts = 1;
  int moe_intermediate_size = 2048;  // I
  std::string scoring_func = "sqrtsoftplus";
  ops::ScoringFunc scoring = ops::ScoringFunc::kSqrtSoftplus;
  double routed_scaling_factor = 1.5;
  double swiglu_limit = 10.0;
  std::string hidden_act = "silu";
  int num_nextn_predict_layers = 1;
  int64_t max_position_embeddings = 1048576;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = 0;
  std::vector<int64_t> eos_token_ids{1};
  std::string torch_dtype;  // "dtype"/"torch_dtype" as written (informational)
  bool has_quantization_config = false;
  std::string expert_dtype;              // official "expert_dtype" ("fp4"/"fp8"), may be empty
  std::vector<LayerKind> layer_types;    // [L]
  std::vector<MlpKind> mlp_layer_types;  // [L]
  RopeSpec rope_main;                    // sliding-only layers
  RopeSpec rope_compress;  // CSA / HCA layers (q, kv, compressed rows, indexer, de-rotation)

  int rope_dim() const { return rope_main.rope_dim; }
  /// Compression rate m of a layer kind (0 for sliding layers).
  int compress_rate(LayerKind k) const;
  /// The rope table a layer uses (P2: sliding → main; CSA/HCA → compress).
  const RopeSpec& rope_for(LayerKind k) const {
    return k == LayerKind::kSliding ? rope_main : rope_compress;
  }

  /// Parses a config.json text; `source` names it in errors. Errors (kInvalidArgument /
  /// kUnsupported): bad JSON, model_type other than deepseek_v4, wrong field type, invalid value,
  /// a per-layer list whose length disagrees with num_hidden_layers (layer_types and
  /// mlp_layer_types: L entries; compress_ratios: L + num_nextn_predict_layers, the MTP modules').
  static Result<ModelConfig> from_json_text(const std::string& text, const std::string& source);
  /// Parses an already-parsed JSON object.
  static Result<ModelConfig> from_json(const nlohmann::json& j, const std::string& source);
  /// Reads `<dir>/config.json`.
  static Result<ModelConfig> load(const std::string& dir);
  /// Reads `path` itself when it is a file, else `<path>/config.json` (shape-only configs,
  /// models/configs/*). Errors: as load.
  static Result<ModelConfig> load_path(const std::string& path);
  /// Checks cross-field consistency; one-line error naming the field.
  Status validate(const std::string& source) const;
  /// One-paragraph human summary (for `v4serve info`).
  std::string summary() const;
  /// Keeps the first `n` decoder layers (`--num-layers N`: a V4-Flash/Pro shaped model cut down
  /// to what one GPU holds): num_hidden_layers = n and layer_types / mlp_layer_types (which carry
  /// the compress ratios and hash layers) truncated to n. Every other field is unchanged.
  /// Errors (kInvalidArgument): n < 1 or n > num_hidden_layers.
  Status truncate_layers(int n);
  /// Whether KV pools of element type `d` can hold this model's rows (shape conditions only; the
  /// backend's own support is checked by DeepseekV4::make_cache). kFp8 needs one rope width for
  /// the main and compressor rows (the bf16 rope tail of an fp8 row) and, when a layer is CSA (an
  /// indexer stores keys), index_head_dim % 16 == 0 (fp8 indexer keys). Errors: kUnsupported, one
  /// line naming the field.
  Status check_kv_dtype(KvDtype d) const;
  /// Whether indexer-key pools as --index-cache-dtype `i` asks can hold this model's keys:
  /// kFp8 needs index_head_dim % 16 == 0 (kFp8Index rows) when a layer is CSA (no CSA layer: no
  /// indexer keys, nothing to check); kAuto is checked by check_kv_dtype.
  /// Errors: kUnsupported, one line naming the field.
  Status check_index_cache_dtype(IndexCacheDtype i) const;
};

}  // namespace v4::model
