#include "model/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace v4::model {
namespace {

using nlohmann::json;

Status field_error(const std::string& src, const std::string& field, const std::string& what) {
  return make_error(ErrorCode::kInvalidArgument, "{}: field '{}' {}", src, field, what);
}

// Reads an optional integer field; wrong type is an error.
template <typename T>
Status get_int(const json& j, const char* key, T* out, const std::string& src) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  // Values outside T's range are an error (a float such as 1e30 would otherwise wrap).
  const auto lo = double(std::numeric_limits<T>::min()), hi = double(std::numeric_limits<T>::max());
  if (it->is_number_unsigned() || it->is_number_integer()) {
    const bool neg = it->is_number_integer() && it->get<int64_t>() < 0;
    const double v = neg ? double(it->get<int64_t>()) : double(it->get<uint64_t>());
    if (v < lo || v > hi || (!neg && it->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())))
      return field_error(src, key, fmt::format("is out of range, found {}", it->dump()));
    *out = T(it->get<int64_t>());
    return Status::Ok();
  }
  if (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>()) {
    const double v = it->get<double>();
    // 2^62: exactly representable and far above any real config value.
    if (v < lo || v > hi || std::fabs(v) > 0x1p62)
      return field_error(src, key, fmt::format("is out of range, found {}", it->dump()));
    *out = T(v);
    return Status::Ok();
  }
  return field_error(src, key, fmt::format("must be an integer, found {}", it->dump()));
}

// `path`: the field's name in messages when it is nested (e.g. "rope_parameters.main.factor");
// empty: `key`.
Status get_double(const json& j, const char* key, double* out, const std::string& src,
                  const std::string& path = {}) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number())
    return field_error(src, path.empty() ? std::string(key) : path,
                       fmt::format("must be a number, found {}", it->dump()));
  *out = it->get<double>();
  return Status::Ok();
}

Status get_string(const json& j, const char* key, std::string* out, const std::string& src) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_string())
    return field_error(src, key, fmt::format("must be a string, found {}", it->dump()));
  *out = it->get<std::string>();
  return Status::Ok();
}

Status get_bool(const json& j, const char* key, bool* out, const std::string& src) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean())
    return field_error(src, key, fmt::format("must be true/false, found {}", it->dump()));
  *out = it->get<bool>();
  return Status::Ok();
}

// yarn `get_mscale` of transformers' modeling_rope_utils.
double yarn_mscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// One nested rope dict (`main` or `compress`), taken verbatim as transformers does.
Status parse_rope_dict(const json& d, const std::string& src, const std::string& name, int head_dim,
                       int64_t max_pos, bool yarn_default_attention_factor, RopeSpec* out) {
  const std::string f = "rope_parameters." + name;
  if (!d.is_object()) return field_error(src, f, "must be an object");
  std::string type = "default";
  if (d.contains("rope_type") && d["rope_type"].is_string())
    type = d["rope_type"];
  else if (d.contains("type") && d["type"].is_string())
    type = d["type"];
  if (type != "default" && type != "yarn")
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: field '{}.rope_type' = \"{}\" is not supported "
                      "(expected \"default\" or \"yarn\")",
                      src, f, type);
  out->yarn = type == "yarn";
  if (!d.contains("rope_theta")) return field_error(src, f + ".rope_theta", "is missing");
  V4_RETURN_IF_ERROR(get_double(d, "rope_theta", &out->theta, src, f + ".rope_theta"));
  out->partial_rotary_factor = 1.0;  // transformers' default when the dict lacks it
  V4_RETURN_IF_ERROR(get_double(d, "partial_rotary_factor", &out->partial_rotary_factor, src,
                                f + ".partial_rotary_factor"));
  out->rope_dim = int(head_dim * out->partial_rotary_factor);
  out->attention_factor = 1.0;
  if (out->yarn) {
    if (!d.contains("original_max_position_embeddings"))
      return field_error(src, f + ".original_max_position_embeddings", "is missing for yarn");
    V4_RETURN_IF_ERROR(get_double(d, "original_max_position_embeddings",
                                  &out->original_max_position_embeddings, src,
                                  f + ".original_max_position_embeddings"));
    double factor = 0;
    if (d.contains("factor") && !d["factor"].is_null()) {
      V4_RETURN_IF_ERROR(get_double(d, "factor", &factor, src, f + ".factor"));
    } else {
      factor = double(max_pos) / out->original_max_position_embeddings;
    }
    out->factor = factor;
    out->beta_fast = 32;
    out->beta_slow = 1;
    V4_RETURN_IF_ERROR(get_double(d, "beta_fast", &out->beta_fast, src, f + ".beta_fast"));
    V4_RETURN_IF_ERROR(get_double(d, "beta_slow", &out->beta_slow, src, f + ".beta_slow"));
    if (out->beta_fast == 0) out->beta_fast = 32;  // HF: `get("beta_fast") or 32`
    if (out->beta_slow == 0) out->beta_slow = 1;
    if (d.contains("attention_factor") && !d["attention_factor"].is_null()) {
      V4_RETURN_IF_ERROR(
          get_double(d, "attention_factor", &out->attention_factor, src, f + ".attention_factor"));
    } else if (yarn_default_attention_factor) {
      out->attention_factor = 1.0;
    } else {
      // P13: a nested yarn dict without attention_factor gets YaRN's mscale on cos/sin.
      double mscale = 0, mscale_all = 0;
      V4_RETURN_IF_ERROR(get_double(d, "mscale", &mscale, src, f + ".mscale"));
      V4_RETURN_IF_ERROR(get_double(d, "mscale_all_dim", &mscale_all, src, f + ".mscale_all_dim"));
      if (mscale != 0 && mscale_all != 0)
        out->attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all);
      else
        out->attention_factor = yarn_mscale(factor, 1.0);
    }
  }
  return Status::Ok();
}

}  // namespace

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::kSliding:
      return "sliding_attention";
    case LayerKind::kCsa:
      return "compressed_sparse_attention";
    case LayerKind::kHca:
      return "heavily_compressed_attention";
  }
  return "?";
}

const char* mlp_kind_name(MlpKind k) {
  return k == MlpKind::kHashMoe ? "hash_moe" : "moe";
}

std::vector<float> RopeSpec::inv_freq() const {
  const int half = rope_dim / 2;
  std::vector<float> inv(half);
  // pos_freqs = base ** (arange(0, rd, 2).float() / rd), computed in f32 as torch does.
  std::vector<float> pos_freqs(half);
  for (int i = 0; i < half; ++i) {
    const float expo = float(2 * i) / float(rope_dim);
    pos_freqs[i] = float(std::pow(double(float(theta)), double(expo)));
  }
  if (!yarn) {
    for (int i = 0; i < half; ++i) inv[i] = 1.f / pos_freqs[i];
    return inv;
  }
  // YaRN (transformers `_compute_yarn_parameters`, truncate = True).
  auto correction_dim = [&](double rot) {
    return (rope_dim * std::log(original_max_position_embeddings / (rot * 2 * M_PI))) /
           (2 * std::log(theta));
  };
  double low = std::floor(correction_dim(beta_fast));
  double high = std::ceil(correction_dim(beta_slow));
  low = std::max(low, 0.0);
  high = std::min(high, double(rope_dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < half; ++i) {
    const float extra = 1.f / pos_freqs[i];
    const float inter = 1.f / (float(factor) * pos_freqs[i]);
    float ramp = (float(i) - float(low)) / float(high - low);
    ramp = std::min(1.f, std::max(0.f, ramp));
    const float extra_factor = 1.f - ramp;
    inv[i] = inter * (1.f - extra_factor) + extra * extra_factor;
  }
  return inv;
}

int ModelConfig::compress_rate(LayerKind k) const {
  switch (k) {
    case LayerKind::kSliding:
      return 0;
    case LayerKind::kCsa:
      return compress_rate_csa;
    case LayerKind::kHca:
      return compress_rate_hca;
  }
  return 0;
}

Result<ModelConfig> ModelConfig::from_json_text(const std::string& text,
                                                const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    for (auto& c : msg)
      if (c == '\n') c = ' ';
    return make_error(ErrorCode::kInvalidArgument, "{}: invalid JSON: {}", source, msg);
  }
  return from_json(j, source);
}

Result<ModelConfig> ModelConfig::load(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in)
    return make_error(ErrorCode::kNotFound, "{}: cannot open (is --model a checkpoint directory?)",
                      path);
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json_text(ss.str(), path);
}

Status ModelConfig::check_kv_dtype(KvDtype d) const {
  if (d == KvDtype::kFp8 && rope_main.rope_dim != rope_compress.rope_dim)
    return make_error(ErrorCode::kUnsupported,
                      "fp8 KV pools need one rope width (main {}, compressor {})",
                      rope_main.rope_dim, rope_compress.rope_dim);
  const bool indexer = std::find(layer_types.begin(), layer_types.end(), LayerKind::kCsa) !=
                       layer_types.end();  // no CSA layer: no indexer keys are stored
  if (d == KvDtype::kFp8 && indexer && index_head_dim % 16 != 0)
    return make_error(ErrorCode::kUnsupported,
                      "fp8 KV pools need index_head_dim % 16 == 0 (fp8 indexer keys), got {}",
                      index_head_dim);
  return Status::Ok();
}

Status ModelConfig::check_index_cache_dtype(IndexCacheDtype i) const {
  const bool indexer = std::find(layer_types.begin(), layer_types.end(), LayerKind::kCsa) !=
                       layer_types.end();  // no CSA layer: no indexer keys are stored
  if (i == IndexCacheDtype::kFp8 && indexer && index_head_dim % 16 != 0)
    return make_error(ErrorCode::kUnsupported,
                      "fp8 indexer keys need index_head_dim % 16 == 0, got {}", index_head_dim);
  return Status::Ok();
}

Result<ModelConfig> ModelConfig::load_path(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return load(path);
  std::ifstream in(path);
  if (!in) return make_error(ErrorCode::kNotFound, "{}: cannot open", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json_text(ss.str(), path);
}

Result<ModelConfig> ModelConfig::from_json(const json& j, const std::string& src) {
  if (!j.is_object())
    return make_error(ErrorCode::kInvalidArgument, "{}: top level must be a JSON object", src);
  ModelConfig c;
  V4_RETURN_IF_ERROR(get_string(j, "model_type", &c.model_type, src));
  if (c.model_type != "deepseek_v4")
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: model_type \"{}\" is not supported (expected \"deepseek_v4\")", src,
                      c.model_type);
  V4_RETURN_IF_ERROR(get_int(j, "vocab_size", &c.vocab_size, src));
  V4_RETURN_IF_ERROR(get_int(j, "hidden_size", &c.hidden_size, src));
  V4_RETURN_IF_ERROR(get_int(j, "num_hidden_layers", &c.num_hidden_layers, src));
  V4_RETURN_IF_ERROR(get_int(j, "num_attention_heads", &c.num_attention_heads, src));
  V4_RETURN_IF_ERROR(get_int(j, "head_dim", &c.head_dim, src));
  V4_RETURN_IF_ERROR(get_int(j, "q_lora_rank", &c.q_lora_rank, src));
  V4_RETURN_IF_ERROR(get_int(j, "o_groups", &c.o_groups, src));
  V4_RETURN_IF_ERROR(get_int(j, "o_lora_rank", &c.o_lora_rank, src));
  V4_RETURN_IF_ERROR(get_int(j, "sliding_window", &c.sliding_window, src));
  V4_RETURN_IF_ERROR(get_int(j, "index_n_heads", &c.index_n_heads, src));
  V4_RETURN_IF_ERROR(get_int(j, "index_head_dim", &c.index_head_dim, src));
  V4_RETURN_IF_ERROR(get_int(j, "index_topk", &c.index_topk, src));
  V4_RETURN_IF_ERROR(get_int(j, "hc_mult", &c.hc_mult, src));
  V4_RETURN_IF_ERROR(get_int(j, "hc_sinkhorn_iters", &c.hc_sinkhorn_iters, src));
  V4_RETURN_IF_ERROR(get_double(j, "hc_eps", &c.hc_eps, src));
  V4_RETURN_IF_ERROR(get_double(j, "rms_norm_eps", &c.rms_norm_eps, src));
  V4_RETURN_IF_ERROR(get_int(j, "num_local_experts", &c.n_routed_experts, src));
  V4_RETURN_IF_ERROR(get_int(j, "n_routed_experts", &c.n_routed_experts, src));
  V4_RETURN_IF_ERROR(get_int(j, "num_experts_per_tok", &c.num_experts_per_tok, src));
  V4_RETURN_IF_ERROR(get_int(j, "n_shared_experts", &c.n_shared_experts, src));
  V4_RETURN_IF_ERROR(get_int(j, "intermediate_size", &c.moe_intermediate_size, src));
  V4_RETURN_IF_ERROR(get_int(j, "moe_intermediate_size", &c.moe_intermediate_size, src));
  V4_RETURN_IF_ERROR(get_string(j, "scoring_func", &c.scoring_func, src));
  V4_RETURN_IF_ERROR(get_double(j, "routed_scaling_factor", &c.routed_scaling_factor, src));
  V4_RETURN_IF_ERROR(get_double(j, "swiglu_limit", &c.swiglu_limit, src));
  V4_RETURN_IF_ERROR(get_string(j, "hidden_act", &c.hidden_act, src));
  V4_RETURN_IF_ERROR(get_int(j, "num_nextn_predict_layers", &c.num_nextn_predict_layers, src));
  V4_RETURN_IF_ERROR(get_int(j, "max_position_embeddings", &c.max_position_embeddings, src));
  V4_RETURN_IF_ERROR(get_bool(j, "tie_word_embeddings", &c.tie_word_embeddings, src));
  V4_RETURN_IF_ERROR(get_int(j, "bos_token_id", &c.bos_token_id, src));
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    c.eos_token_ids.clear();
    if (it->is_array()) {
      for (auto& v : *it) {
        if (!v.is_number_integer())
          return field_error(src, "eos_token_id", "entries must be integers");
        c.eos_token_ids.push_back(v.get<int64_t>());
      }
    } else if (it->is_number_integer()) {
      c.eos_token_ids.push_back(it->get<int64_t>());
    } else {
      return field_error(src, "eos_token_id",
                         fmt::format("must be an integer or a list, found {}", it->dump()));
    }
  }
  V4_RETURN_IF_ERROR(get_string(j, "torch_dtype", &c.torch_dtype, src));
  V4_RETURN_IF_ERROR(get_string(j, "dtype", &c.torch_dtype, src));
  V4_RETURN_IF_ERROR(get_string(j, "expert_dtype", &c.expert_dtype, src));
  c.has_quantization_config =
      j.contains("quantization_config") && !j["quantization_config"].is_null();

  if (c.scoring_func == "sqrtsoftplus")
    c.scoring = ops::ScoringFunc::kSqrtSoftplus;
  else if (c.scoring_func == "softmax")
    c.scoring = ops::ScoringFunc::kSoftmax;
  else if (c.scoring_func == "sigmoid")
    c.scoring = ops::ScoringFunc::kSigmoid;
  else
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: field 'scoring_func' = \"{}\" is not supported "
                      "(expected sqrtsoftplus, softmax or sigmoid)",
                      src, c.scoring_func);
  if (c.num_hidden_layers <= 0) return field_error(src, "num_hidden_layers", "must be > 0");
  if (c.num_nextn_predict_layers < 0)
    return field_error(src, "num_nextn_predict_layers",
                       fmt::format("must be >= 0, found {}", c.num_nextn_predict_layers));
  const int L = c.num_hidden_layers;
  // Per-layer list lengths: layer_types / mlp_layer_types have L entries (transformers);
  // the official compress_ratios also lists the MTP modules: L + num_nextn_predict_layers.
  const int n_ratios = L + c.num_nextn_predict_layers;
  // A config without num_hidden_layers gets the V4-Flash default; when its per-layer lists say
  // otherwise, name the missing field rather than the default the user never wrote.
  if (!j.contains("num_hidden_layers")) {
    for (const char* list : {"layer_types", "mlp_layer_types", "compress_ratios"}) {
      const int want = std::string(list) == "compress_ratios" ? n_ratios : L;
      if (auto it = j.find(list); it != j.end() && it->is_array() && int(it->size()) != want)
        return field_error(src, "num_hidden_layers",
                           fmt::format("is missing (its default {} does not match the {} entries of "
                                       "'{}')",
                                       L, it->size(), list));
    }
  }

  // compress_rates: dict, then legacy scalar overrides.
  if (auto it = j.find("compress_rates"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return field_error(src, "compress_rates", "must be an object");
    V4_RETURN_IF_ERROR(get_int(*it, "compressed_sparse_attention", &c.compress_rate_csa, src));
    V4_RETURN_IF_ERROR(get_int(*it, "heavily_compressed_attention", &c.compress_rate_hca, src));
  }
  V4_RETURN_IF_ERROR(get_int(j, "compress_rate_csa", &c.compress_rate_csa, src));
  V4_RETURN_IF_ERROR(get_int(j, "compress_rate_hca", &c.compress_rate_hca, src));

  // layer_types: explicit > legacy compress_ratios (0/4/128; L + MTP entries, cut to L) > default schedule.
  auto lt = j.find("layer_types");
  auto cr = j.find("compress_ratios");
  if (lt != j.end() && !lt->is_null()) {
    if (!lt->is_array()) return field_error(src, "layer_types", "must be a list");
    for (auto& v : *lt) {
      const std::string s = v.is_string() ? v.get<std::string>() : v.dump();
      if (s == "sliding_attention")
        c.layer_types.push_back(LayerKind::kSliding);
      else if (s == "compressed_sparse_attention")
        c.layer_types.push_back(LayerKind::kCsa);
      else if (s == "heavily_compressed_attention")
        c.layer_types.push_back(LayerKind::kHca);
      else
        return field_error(
            src, "layer_types",
            fmt::format(
                "has unknown entry {} (expected "
                "sliding_attention, compressed_sparse_attention or heavily_compressed_attention)",
                s));
    }
  } else if (cr != j.end() && !cr->is_null()) {
    if (!cr->is_array()) return field_error(src, "compress_ratios", "must be a list");
    for (auto& v : *cr) {
      if (!v.is_number_integer())
        return field_error(src, "compress_ratios", "entries must be integers");
      const int64_t r = v.get<int64_t>();
      if (r == 0)
        c.layer_types.push_back(LayerKind::kSliding);
      else if (r == 4 || r == c.compress_rate_csa)
        c.layer_types.push_back(LayerKind::kCsa);
      else if (r == 128 || r == c.compress_rate_hca)
        c.layer_types.push_back(LayerKind::kHca);
      else
        return field_error(src, "compress_ratios",
                           fmt::format("has unknown ratio {} (expected 0, 4 or 128)", r));
    }
    if (int(c.layer_types.size()) != n_ratios)
      return field_error(src, "compress_ratios",
                         fmt::format("has {} entries but num_hidden_layers + "
                                     "num_nextn_predict_layers = {} + {} = {}",
                                     c.layer_types.size(), L, c.num_nextn_predict_layers,
                                     n_ratios));
    c.layer_types.resize(L);  // drop the MTP modules' entries
  } else {
    for (int i = 0; i < L; ++i)
      c.layer_types.push_back(i < 2 || i % 2 == 0 ? LayerKind::kHca : LayerKind::kCsa);
  }

  // mlp_layer_types: explicit > first num_hash_layers (default 3) hash_moe.
  if (auto it = j.find("mlp_layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return field_error(src, "mlp_layer_types", "must be a list");
    for (auto& v : *it) {
      const std::string s = v.is_string() ? v.get<std::string>() : v.dump();
      if (s == "hash_moe")
        c.mlp_layer_types.push_back(MlpKind::kHashMoe);
      else if (s == "moe")
        c.mlp_layer_types.push_back(MlpKind::kMoe);
      else
        return field_error(src, "mlp_layer_types",
                           fmt::format("has unknown entry {} (expected hash_moe or moe)", s));
    }
  } else {
    int n_hash = 3;
    V4_RETURN_IF_ERROR(get_int(j, "num_hash_layers", &n_hash, src));
    for (int i = 0; i < L; ++i)
      c.mlp_layer_types.push_back(i < n_hash ? MlpKind::kHashMoe : MlpKind::kMoe);
  }

  // partial_rotary_factor: explicit > legacy qk_rope_head_dim / head_dim > 64/512.
  double prf = 64.0 / 512.0;
  if (j.contains("partial_rotary_factor") && !j["partial_rotary_factor"].is_null()) {
    V4_RETURN_IF_ERROR(get_double(j, "partial_rotary_factor", &prf, src));
  } else if (j.contains("qk_rope_head_dim") && !j["qk_rope_head_dim"].is_null()) {
    int qk = 0;
    V4_RETURN_IF_ERROR(get_int(j, "qk_rope_head_dim", &qk, src));
    if (c.head_dim <= 0) return field_error(src, "head_dim", "must be > 0");
    prf = double(qk) / c.head_dim;
  }

  // rope_parameters (dsv4-model.md §1.4): nested {main, compress} taken verbatim; otherwise
  // built from rope_theta / compress_rope_theta and a flat rope_parameters / rope_scaling dict.
  double rope_theta = 10000.0, compress_theta = 160000.0;
  V4_RETURN_IF_ERROR(get_double(j, "compress_rope_theta", &compress_theta, src));
  json rp = json::object();
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
    rp = j["rope_parameters"];
  else if (j.contains("rope_scaling") && j["rope_scaling"].is_object())
    rp = j["rope_scaling"];
  else if (j.contains("rope_parameters") && !j["rope_parameters"].is_null())
    return field_error(src, "rope_parameters", "must be an object");
  if (rp.contains("rope_theta")) V4_RETURN_IF_ERROR(get_double(rp, "rope_theta", &rope_theta, src));
  V4_RETURN_IF_ERROR(get_double(j, "rope_theta", &rope_theta, src));
  if (rp.contains("main") && rp["main"].is_object() && rp.contains("compress") &&
      rp["compress"].is_object()) {
    V4_RETURN_IF_ERROR(parse_rope_dict(rp["main"], src, "main", c.head_dim,
                                       c.max_position_embeddings, false, &c.rope_main));
    V4_RETURN_IF_ERROR(parse_rope_dict(rp["compress"], src, "compress", c.head_dim,
                                       c.max_position_embeddings, false, &c.rope_compress));
  } else {
    json main = {
        {"rope_type", "default"}, {"rope_theta", rope_theta}, {"partial_rotary_factor", prf}};
    json comp = json::object();
    for (auto& [k, v] : rp.items())
      if (k != "main" && k != "compress") comp[k] = v;
    comp["rope_theta"] = compress_theta;
    comp["partial_rotary_factor"] = prf;
    if (!comp.contains("rope_type"))
      comp["rope_type"] = comp.contains("type") ? comp["type"] : json("default");
    V4_RETURN_IF_ERROR(parse_rope_dict(main, src, "main", c.head_dim, c.max_position_embeddings,
                                       true, &c.rope_main));
    V4_RETURN_IF_ERROR(parse_rope_dict(comp, src, "compress", c.head_dim, c.max_position_embeddings,
                                       true, &c.rope_compress));
  }
  V4_RETURN_IF_ERROR(c.validate(src));
  return c;
}

Status ModelConfig::validate(const std::string& src) const {
  auto positive = [&](const char* name, int64_t v) -> Status {
    if (v <= 0) return field_error(src, name, fmt::format("must be > 0, found {}", v));
    return Status::Ok();
  };
  V4_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  V4_RETURN_IF_ERROR(positive("max_position_embeddings", max_position_embeddings));
  if (bos_token_id < 0 || bos_token_id >= vocab_size)
    return field_error(src, "bos_token_id",
                       fmt::format("must be in [0, vocab_size {}), found {}", vocab_size,
                                   bos_token_id));
  for (int64_t e : eos_token_ids)
    if (e < 0 || e >= vocab_size)
      return field_error(src, "eos_token_id",
                         fmt::format("must be in [0, vocab_size {}), found {}", vocab_size, e));
  V4_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  // Epsilons inside square roots / divisions: a value ≤ 0 (or NaN / inf) gives NaN or ±inf
  // activations, which surface as a stream of BOS tokens rather than an error.
  for (const auto& [name, v] : {std::pair<const char*, double>{"rms_norm_eps", rms_norm_eps},
                                std::pair<const char*, double>{"hc_eps", hc_eps}})
    if (!(v > 0) || !std::isfinite(v))
      return field_error(src, name, fmt::format("must be a finite number > 0, found {}", v));
  V4_RETURN_IF_ERROR(positive("num_hidden_layers", num_hidden_layers));
  V4_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
  V4_RETURN_IF_ERROR(positive("head_dim", head_dim));
  V4_RETURN_IF_ERROR(positive("q_lora_rank", q_lora_rank));
  V4_RETURN_IF_ERROR(positive("o_groups", o_groups));
  V4_RETURN_IF_ERROR(positive("o_lora_rank", o_lora_rank));
  V4_RETURN_IF_ERROR(positive("sliding_window", sliding_window));
  V4_RETURN_IF_ERROR(positive("hc_mult", hc_mult));
  V4_RETURN_IF_ERROR(positive("hc_sinkhorn_iters", hc_sinkhorn_iters));
  V4_RETURN_IF_ERROR(positive("n_routed_experts", n_routed_experts));
  V4_RETURN_IF_ERROR(positive("num_experts_per_tok", num_experts_per_tok));
  V4_RETURN_IF_ERROR(positive("moe_intermediate_size", moe_intermediate_size));
  if (hc_mult > 16)
    return field_error(src, "hc_mult",
                       fmt::format("= {} exceeds the supported maximum 16", hc_mult));
  if (num_experts_per_tok > n_routed_experts)
    return field_error(
        src, "num_experts_per_tok",
        fmt::format("= {} exceeds n_routed_experts = {}", num_experts_per_tok, n_routed_experts));
  if (n_shared_experts != 1)
    return field_error(src, "n_shared_experts",
                       fmt::format("must be 1, found {}", n_shared_experts));
  if (hidden_act != "silu")
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: field 'hidden_act' = \"{}\" is not supported (expected silu)", src,
                      hidden_act);
  if (int64_t(num_attention_heads) * head_dim % o_groups != 0)
    return field_error(src, "o_groups",
                       fmt::format("= {} must divide num_attention_heads·head_dim = {}", o_groups,
                                   int64_t(num_attention_heads) * head_dim));
  if (int(layer_types.size()) != num_hidden_layers)
    return field_error(src, "layer_types",
                       fmt::format("has {} entries but num_hidden_layers = {}", layer_types.size(),
                                   num_hidden_layers));
  if (int(mlp_layer_types.size()) != num_hidden_layers)
    return field_error(src, "mlp_layer_types",
                       fmt::format("has {} entries but num_hidden_layers = {}",
                                   mlp_layer_types.size(), num_hidden_layers));
  bool has_csa = false, has_hca = false;
  for (auto k : layer_types) {
    has_csa |= k == LayerKind::kCsa;
    has_hca |= k == LayerKind::kHca;
  }
  if (has_csa) {
    V4_RETURN_IF_ERROR(positive("compress_rates.compressed_sparse_attention", compress_rate_csa));
    V4_RETURN_IF_ERROR(positive("index_n_heads", index_n_heads));
    V4_RETURN_IF_ERROR(positive("index_head_dim", index_head_dim));
    V4_RETURN_IF_ERROR(positive("index_topk", index_topk));
  }
  if (has_hca)
    V4_RETURN_IF_ERROR(positive("compress_rates.heavily_compressed_attention", compress_rate_hca));
  for (const auto* r : {&rope_main, &rope_compress}) {
    const char* name = r == &rope_main ? "rope_parameters.main" : "rope_parameters.compress";
    if (r->rope_dim <= 0 || r->rope_dim % 2 != 0 || r->rope_dim > head_dim)
      return field_error(src, name,
                         fmt::format("gives rope dims {} (head_dim {} · partial_rotary_factor {}); "
                                     "must be even and in (0, head_dim]",
                                     r->rope_dim, head_dim, r->partial_rotary_factor));
    if (has_csa && r == &rope_compress && r->rope_dim > index_head_dim)
      return field_error(
          src, name,
          fmt::format("rope dims {} exceed index_head_dim {}", r->rope_dim, index_head_dim));
    if (r->theta <= 0) return field_error(src, std::string(name) + ".rope_theta", "must be > 0");
    if (r->yarn && (r->original_max_position_embeddings <= 0 || r->factor <= 0))
      return field_error(src, name,
                         "yarn needs factor > 0 and original_max_position_embeddings > 0");
  }
  return Status::Ok();
}

Status ModelConfig::truncate_layers(int n) {
  if (n < 1 || n > num_hidden_layers)
    return make_error(ErrorCode::kInvalidArgument,
                      "--num-layers {}: must be in [1, {}] (the config's num_hidden_layers)", n,
                      num_hidden_layers);
  num_hidden_layers = n;
  layer_types.resize(size_t(n));
  mlp_layer_types.resize(size_t(n));
  return Status::Ok();
}

std::string ModelConfig::summary() const {
  int n_swa = 0, n_csa = 0, n_hca = 0, n_hash = 0;
  for (auto k : layer_types)
    (k == LayerKind::kSliding ? n_swa : k == LayerKind::kCsa ? n_csa : n_hca)++;
  for (auto k : mlp_layer_types) n_hash += k == MlpKind::kHashMoe;
  auto rope_str = [](const RopeSpec& r) {
    if (!r.yarn) return fmt::format("default θ={} rd={}", r.theta, r.rope_dim);
    return fmt::format("yarn θ={} rd={} factor={} L0={} β={}/{} attention_factor={}", r.theta,
                       r.rope_dim, r.factor, r.original_max_position_embeddings, r.beta_fast,
                       r.beta_slow, r.attention_factor);
  };
  std::string s;
  s += fmt::format("model_type       {}\n", model_type);
  s += fmt::format(
      "layers           {} (sliding {}, CSA {}, HCA {}; hash-MoE {}, MoE {}); MTP modules {}\n",
      num_hidden_layers, n_swa, n_csa, n_hca, n_hash, num_hidden_layers - n_hash,
      num_nextn_predict_layers);
  s += fmt::format("hidden           D={} vocab={} hc_mult={} sinkhorn={}\n", hidden_size,
                   vocab_size, hc_mult, hc_sinkhorn_iters);
  s += fmt::format(
      "attention        H={} hd={} q_lora={} o_groups={}×{} window={} rates CSA {} / HCA {}\n",
      num_attention_heads, head_dim, q_lora_rank, o_groups, o_lora_rank, sliding_window,
      compress_rate_csa, compress_rate_hca);
  s += fmt::format("indexer          {} heads × {} dims, top-k {}\n", index_n_heads, index_head_dim,
                   index_topk);
  s +=
      fmt::format("moe              E={} k={} I={} shared={} scoring={} scale={} swiglu_limit={}\n",
                  n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts,
                  scoring_func, routed_scaling_factor, swiglu_limit);
  s += fmt::format("rope main        {}\n", rope_str(rope_main));
  s += fmt::format("rope compress    {}\n", rope_str(rope_compress));
  return s;
}

}  // namespace v4::model
