// ModelConfig: the real DeepSeek-V4-Pro config.json (legacy keys), normalization traps (P13),
// defaults, and one-line errors for bad configs.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/config.h"

namespace v4::model {
namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

// The real DeepSeek-V4-Pro config.json (copied from /work/shared/data/dsv4-reference, MIT).
json pro_config() {
  return read_json(std::string(V4_SOURCE_DIR) + "/tests/model/data/v4-pro-config.json");
}

TEST(Config, RealProConfig) {
  auto c = ModelConfig::from_json(pro_config(), "v4-pro-config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->num_hidden_layers, 61);
  ASSERT_EQ(c->layer_types.size(), 61u);  // 62 compress_ratios entries truncated (MTP)
  EXPECT_EQ(c->layer_types[0], LayerKind::kHca);
  EXPECT_EQ(c->layer_types[1], LayerKind::kHca);
  EXPECT_EQ(c->layer_types[2], LayerKind::kCsa);
  EXPECT_EQ(c->layer_types[3], LayerKind::kHca);
  EXPECT_EQ(c->layer_types[60], LayerKind::kCsa);
  int n_csa = 0, n_hca = 0;
  for (auto k : c->layer_types) (k == LayerKind::kCsa ? n_csa : n_hca)++;
  EXPECT_EQ(n_csa, 30);
  EXPECT_EQ(n_hca, 31);
  ASSERT_EQ(c->mlp_layer_types.size(), 61u);
  EXPECT_EQ(c->mlp_layer_types[2], MlpKind::kHashMoe);
  EXPECT_EQ(c->mlp_layer_types[3], MlpKind::kMoe);
  EXPECT_EQ(c->rope_main.rope_dim, 64);
  EXPECT_FALSE(c->rope_main.yarn);
  EXPECT_DOUBLE_EQ(c->rope_main.theta, 10000);
  EXPECT_TRUE(c->rope_compress.yarn);
  EXPECT_DOUBLE_EQ(c->rope_compress.theta, 160000);
  EXPECT_DOUBLE_EQ(c->rope_compress.factor, 16);
  EXPECT_DOUBLE_EQ(c->rope_compress.attention_factor, 1.0);  // forced when HF builds the dict
  EXPECT_EQ(c->index_topk, 1024);
  EXPECT_EQ(c->n_routed_experts, 384);
  EXPECT_DOUBLE_EQ(c->routed_scaling_factor, 2.5);
  EXPECT_TRUE(c->has_quantization_config);
  EXPECT_EQ(c->expert_dtype, "fp4");
}

TEST(Config, InvFreqMatchesDeviceCheckedValues) {
  auto c = ModelConfig::from_json(pro_config(), "pro");
  ASSERT_TRUE(c.ok());
  // dsv4-model.md §4: values checked against transformers on the device.
  const auto main = c->rope_main.inv_freq();
  const auto comp = c->rope_compress.inv_freq();
  ASSERT_EQ(main.size(), 32u);
  EXPECT_NEAR(main[1], 0.74989420f, 1e-7);
  EXPECT_NEAR(comp[1], 0.68765604f, 1e-7);
  EXPECT_NEAR(comp[16], 2.2656249e-3f, 1e-9);
  EXPECT_NEAR(comp[31], 5.6805294e-7f, 1e-12);
}

TEST(Config, NestedYarnWithoutAttentionFactorGetsMscale) {
  json j = pro_config();
  j.erase("rope_scaling");
  j["rope_parameters"] = {
      {"main", {{"rope_type", "default"}, {"rope_theta", 10000}, {"partial_rotary_factor", 0.125}}},
      {"compress",
       {{"rope_type", "yarn"},
        {"rope_theta", 160000},
        {"factor", 16},
        {"original_max_position_embeddings", 65536},
        {"partial_rotary_factor", 0.125}}}};
  auto c = ModelConfig::from_json(j, "nested");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_NEAR(c->rope_compress.attention_factor, 0.1 * std::log(16.0) + 1.0, 1e-12);  // P13: 1.277
  j["rope_parameters"]["compress"]["attention_factor"] = 1.0;
  c = ModelConfig::from_json(j, "nested");
  ASSERT_TRUE(c.ok());
  EXPECT_DOUBLE_EQ(c->rope_compress.attention_factor, 1.0);
  // A nested number of the wrong type is named with its full path.
  j["rope_parameters"]["compress"]["factor"] = "x";
  c = ModelConfig::from_json(j, "nested");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("field 'rope_parameters.compress.factor' must be a number"),
            std::string::npos)
      << c.status().message();
}

TEST(Config, NoRopeScalingMeansPlainCompressRope) {
  json j = pro_config();
  j.erase("rope_scaling");
  auto c = ModelConfig::from_json(j, "plain");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->rope_compress.yarn);
  EXPECT_DOUBLE_EQ(c->rope_compress.theta, 160000);
}

TEST(Config, DefaultsWithoutLayerTypes) {
  json j = {{"model_type", "deepseek_v4"}, {"num_hidden_layers", 6}};
  auto c = ModelConfig::from_json(j, "min");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // HF fallback: [HCA, HCA] then HCA, CSA, HCA, CSA.
  const std::vector<LayerKind> want = {LayerKind::kHca, LayerKind::kHca, LayerKind::kHca,
                                       LayerKind::kCsa, LayerKind::kHca, LayerKind::kCsa};
  EXPECT_EQ(c->layer_types, want);
  EXPECT_EQ(c->mlp_layer_types[2], MlpKind::kHashMoe);
  EXPECT_EQ(c->mlp_layer_types[3], MlpKind::kMoe);
  EXPECT_EQ(c->rope_main.rope_dim, 64);  // 512 · 64/512
  EXPECT_EQ(c->n_routed_experts, 256);
}

// A config that omits num_hidden_layers but lists 2 layers: the error names the missing field
// (not "num_hidden_layers = 43", a default the file never wrote).
TEST(Config, MissingLayerCountIsNamed) {
  json j = {{"model_type", "deepseek_v4"},
            {"layer_types", {"compressed_sparse_attention", "heavily_compressed_attention"}}};
  auto c = ModelConfig::from_json(j, "cfg.json");
  ASSERT_FALSE(c.ok());
  const std::string m = c.status().message();
  EXPECT_NE(m.find("cfg.json"), std::string::npos) << m;
  EXPECT_NE(m.find("num_hidden_layers"), std::string::npos) << m;
  EXPECT_NE(m.find("missing"), std::string::npos) << m;
  EXPECT_NE(m.find("2 entries of 'layer_types'"), std::string::npos) << m;
  j["num_hidden_layers"] = 2;  // with it, the same lists load
  EXPECT_TRUE(ModelConfig::from_json(j, "cfg.json").ok());
}

TEST(Config, LegacyScalarRatesAndAliases) {
  json j = {{"model_type", "deepseek_v4"},
            {"num_hidden_layers", 2},
            {"layer_types", {"compressed_sparse_attention", "heavily_compressed_attention"}},
            {"compress_rate_hca", 16},
            {"num_local_experts", 8},
            {"intermediate_size", 96},
            {"eos_token_id", json::array({1, 2})}};
  auto c = ModelConfig::from_json(j, "legacy");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->compress_rate_hca, 16);
  EXPECT_EQ(c->compress_rate_csa, 4);
  EXPECT_EQ(c->n_routed_experts, 8);
  EXPECT_EQ(c->moe_intermediate_size, 96);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{1, 2}));
}

/// A patch of the Pro config and a piece of the one-line error it must give.
struct ConfigErrorCase {
  json patch;
  std::string expect;
};

/// Each patched config (layer_types patches drop compress_ratios) is refused with one line that
/// starts with the file name and contains the case's expected text.
void expect_refused(const std::vector<ConfigErrorCase>& cases) {
  for (const auto& cs : cases) {
    json j = pro_config();
    for (auto& [k, v] : cs.patch.items()) j[k] = v;
    if (cs.patch.contains("layer_types")) j.erase("compress_ratios");
    auto c = ModelConfig::from_json(j, "config.json");
    ASSERT_FALSE(c.ok()) << "accepted patch " << cs.patch.dump();
    const std::string msg = c.status().message();
    EXPECT_NE(msg.find(cs.expect), std::string::npos)
        << "patch " << cs.patch.dump() << " gave: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind("config.json", 0), 0u) << "error must name the file: " << msg;
  }
}

// Each bad config gives one line naming the field.
TEST(Config, BadConfigsGiveOneLineErrors) {
  using Case = ConfigErrorCase;
  const std::vector<Case> cases = {
      {{{"model_type", "llama"}}, "model_type \"llama\" is not supported"},
      {{{"hidden_size", "big"}}, "field 'hidden_size' must be an integer"},
      {{{"hidden_size", -4}}, "field 'hidden_size' must be > 0"},
      {{{"layer_types", {"sliding_attention"}}},
       "field 'layer_types' has 1 entries but num_hidden_layers = 61"},
      {{{"layer_types", json::array()}}, "field 'layer_types' has 0 entries"},
      {{{"compress_ratios", {0, 7}}}, "field 'compress_ratios' has unknown ratio 7"},
      {{{"mlp_layer_types", {"dense"}}}, "field 'mlp_layer_types' has unknown entry dense"},
      {{{"scoring_func", "tanh"}}, "field 'scoring_func' = \"tanh\" is not supported"},
      {{{"num_experts_per_tok", 999}},
       "field 'num_experts_per_tok' = 999 exceeds n_routed_experts = 384"},
      {{{"o_groups", 7}}, "field 'o_groups' = 7 must divide"},
      {{{"n_shared_experts", 2}}, "field 'n_shared_experts' must be 1"},
      {{{"qk_rope_head_dim", 7}}, "rope dims 7"},
      {{{"rope_scaling", {{"type", "longrope"}}}}, "rope_type' = \"longrope\" is not supported"},
      {{{"rope_scaling", {{"type", "yarn"}, {"factor", 4}}}},
       "original_max_position_embeddings' is missing"},
      {{{"hidden_act", "gelu"}}, "field 'hidden_act' = \"gelu\" is not supported"},
      // Integers beyond the field's type (a float 1e30 used to wrap to INT64_MIN), zero context,
      // token ids outside the vocabulary.
      {{{"max_position_embeddings", 1e30}}, "field 'max_position_embeddings' is out of range"},
      {{{"max_position_embeddings", 0}}, "field 'max_position_embeddings' must be > 0"},
      {{{"hidden_size", 4294967296LL}}, "field 'hidden_size' is out of range"},
      {{{"eos_token_id", 999999999}}, "field 'eos_token_id' must be in [0, vocab_size"},
      {{{"bos_token_id", -1}}, "field 'bos_token_id' must be in [0, vocab_size"},
      // Epsilons ≤ 0 turned every activation into NaN (generate printed BOS tokens, rc 0).
      {{{"rms_norm_eps", -1}}, "field 'rms_norm_eps' must be a finite number > 0"},
      {{{"rms_norm_eps", 0}}, "field 'rms_norm_eps' must be a finite number > 0"},
      {{{"hc_eps", -1e-6}}, "field 'hc_eps' must be a finite number > 0"},
  };
  expect_refused(cases);
}

// Per-layer lists must agree with num_hidden_layers: compress_ratios (official layout) has
// L + num_nextn_predict_layers entries, layer_types / mlp_layer_types have L. A mismatch in
// either direction is one line naming the file, the field and both lengths (it used to be cut
// to L, or silently accepted when longer).
TEST(Config, PerLayerListLengthsMustMatchLayerCount) {
  using Case = ConfigErrorCase;
  const std::string three_kinds = R"(["compressed_sparse_attention", "heavily_compressed_attention",
                                    "sliding_attention"])";
  const std::vector<Case> cases = {
      {{{"num_hidden_layers", 60}},
       "field 'compress_ratios' has 62 entries but num_hidden_layers + num_nextn_predict_layers "
       "= 60 + 1 = 61"},
      {{{"num_hidden_layers", 62}},
       "field 'compress_ratios' has 62 entries but num_hidden_layers + num_nextn_predict_layers "
       "= 62 + 1 = 63"},
      {{{"num_nextn_predict_layers", 0}}, "field 'compress_ratios' has 62 entries"},
      {{{"num_nextn_predict_layers", -1}}, "field 'num_nextn_predict_layers' must be >= 0"},
      {{{"num_hidden_layers", 2}, {"layer_types", json::parse(three_kinds)}},
       "field 'layer_types' has 3 entries but num_hidden_layers = 2"},
      {{{"num_hidden_layers", 2},
        {"layer_types", {"sliding_attention", "sliding_attention"}},
        {"mlp_layer_types", {"hash_moe", "moe", "moe"}}},
       "field 'mlp_layer_types' has 3 entries but num_hidden_layers = 2"},
      {{{"num_hidden_layers", 4},
        {"layer_types", {"sliding_attention", "sliding_attention"}},
        {"mlp_layer_types", {"hash_moe", "moe"}}},
       "field 'layer_types' has 2 entries but num_hidden_layers = 4"},
  };
  expect_refused(cases);
  // The consistent forms load: L + 1 ratios, and L + 0 when the config has no MTP module.
  json j = pro_config();
  j["compress_ratios"] = {4, 128, 0};
  j["num_hidden_layers"] = 2;
  auto c = ModelConfig::from_json(j, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->layer_types, (std::vector<LayerKind>{LayerKind::kCsa, LayerKind::kHca}));
  j["num_hidden_layers"] = 3;
  j["num_nextn_predict_layers"] = 0;
  c = ModelConfig::from_json(j, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->layer_types.size(), 3u);
}

// Every config the repository ships (and the reference data, where present) keeps loading.
TEST(Config, ShippedConfigsLoad) {
  const std::string root = V4_SOURCE_DIR;
  std::vector<std::string> paths = {
      root + "/models/configs/v4-flash/config.json", root + "/models/configs/v4-pro/config.json",
      root + "/models/default/config.json", root + "/tests/model/data/v4-pro-config.json"};
  for (const char* fx : {"tiny-bf16", "tiny-kinds-fp32", "tiny-sigmoid", "tiny-fp8-base",
                         "tiny-real-rates", "tiny-fp8-mxfp4"})
    paths.push_back(root + "/tests/fixtures/" + fx + "/config.json");
  const std::string ref = root + "/../shared/data/dsv4-reference/v4-pro-config.json";
  if (std::ifstream(ref).good()) paths.push_back(ref);
  for (const auto& p : paths) {
    auto c = ModelConfig::load_path(p);
    EXPECT_TRUE(c.ok()) << p << ": " << c.status().to_string();
  }
}

TEST(Config, BadJsonText) {
  auto c = ModelConfig::from_json_text("{\"model_type\": \"deepseek_v4\",", "dir/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("dir/config.json: invalid JSON"), std::string::npos);
  EXPECT_EQ(c.status().message().find('\n'), std::string::npos);
  auto missing = ModelConfig::load("/nonexistent-dir");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent-dir/config.json"), std::string::npos);
}

}  // namespace
}  // namespace v4::model
