// models/configs/{v4-flash,v4-pro}: the shape-only configs parse to the published layer schedules
// (dsv4-model.md §1.2/§1.3), and ModelConfig::truncate_layers keeps exactly the first N layers.
#include <gtest/gtest.h>

#include "model/config.h"

namespace v4::model {
namespace {

std::string cfg_dir(const char* name) {
  return std::string(V4_SOURCE_DIR) + "/models/configs/" + name;
}

struct Counts {
  int swa = 0, csa = 0, hca = 0, hash = 0;
};
Counts count(const ModelConfig& c) {
  Counts n;
  for (auto k : c.layer_types)
    (k == LayerKind::kSliding ? n.swa : k == LayerKind::kCsa ? n.csa : n.hca)++;
  for (auto k : c.mlp_layer_types) n.hash += k == MlpKind::kHashMoe;
  return n;
}

TEST(ShapeConfigs, FlashHasThePublishedShape) {
  auto c = ModelConfig::load(cfg_dir("v4-flash"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->num_hidden_layers, 43);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->num_attention_heads, 64);
  EXPECT_EQ(c->head_dim, 512);
  EXPECT_EQ(c->rope_dim(), 64);
  EXPECT_EQ(c->q_lora_rank, 1024);
  EXPECT_EQ(c->o_groups, 8);
  EXPECT_EQ(c->o_lora_rank, 1024);
  EXPECT_EQ(c->n_routed_experts, 256);
  EXPECT_EQ(c->num_experts_per_tok, 6);
  EXPECT_EQ(c->moe_intermediate_size, 2048);
  EXPECT_EQ(c->index_n_heads, 64);
  EXPECT_EQ(c->index_head_dim, 128);
  EXPECT_EQ(c->index_topk, 512);
  EXPECT_EQ(c->sliding_window, 128);
  EXPECT_EQ(c->vocab_size, 129280);
  EXPECT_EQ(c->max_position_embeddings, 1048576);
  EXPECT_TRUE(c->has_quantization_config);
  EXPECT_EQ(c->expert_dtype, "fp4");
  EXPECT_TRUE(c->rope_compress.yarn);
  EXPECT_DOUBLE_EQ(c->rope_compress.theta, 160000);
  // Layers 0,1 sliding; i >= 2 even -> CSA, odd -> HCA (dsv4-model.md §1.3).
  for (int i = 0; i < 43; ++i) {
    const LayerKind want = i < 2        ? LayerKind::kSliding
                           : i % 2 == 0 ? LayerKind::kCsa
                                        : LayerKind::kHca;
    EXPECT_EQ(c->layer_types[i], want) << "layer " << i;
  }
  const Counts n = count(*c);
  EXPECT_EQ(n.swa, 2);
  EXPECT_EQ(n.csa, 21);
  EXPECT_EQ(n.hca, 20);
  EXPECT_EQ(n.hash, 3);
}

TEST(ShapeConfigs, ProIsThePublishedFile) {
  auto c = ModelConfig::load(cfg_dir("v4-pro"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->num_hidden_layers, 61);
  const Counts n = count(*c);
  EXPECT_EQ(n.swa, 0);
  EXPECT_EQ(n.csa, 30);
  EXPECT_EQ(n.hca, 31);
  EXPECT_EQ(c->index_topk, 1024);
}

TEST(ShapeConfigs, TruncateKeepsTheFirstLayers) {
  auto full = ModelConfig::load(cfg_dir("v4-flash"));
  ASSERT_TRUE(full.ok());
  for (int n : {1, 2, 3, 4, 7, 20, 43}) {
    ModelConfig c = *full;
    ASSERT_TRUE(c.truncate_layers(n).ok()) << n;
    EXPECT_EQ(c.num_hidden_layers, n);
    ASSERT_EQ(int(c.layer_types.size()), n);
    ASSERT_EQ(int(c.mlp_layer_types.size()), n);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(c.layer_types[i], full->layer_types[i]) << "n " << n << " layer " << i;
      EXPECT_EQ(c.mlp_layer_types[i], full->mlp_layer_types[i]) << "n " << n << " layer " << i;
    }
    EXPECT_EQ(count(c).hash, std::min(n, 3));
    EXPECT_TRUE(c.validate("truncated").ok()) << n;
    // Other fields untouched.
    EXPECT_EQ(c.hidden_size, full->hidden_size);
    EXPECT_EQ(c.n_routed_experts, full->n_routed_experts);
    EXPECT_EQ(c.vocab_size, full->vocab_size);
  }
  ModelConfig c = *full;
  ASSERT_TRUE(c.truncate_layers(20).ok());
  const Counts n = count(c);  // layers 0..19: 2 sliding, CSA 2,4,..,18 (9), HCA 3,..,19 (9)
  EXPECT_EQ(n.swa, 2);
  EXPECT_EQ(n.csa, 9);
  EXPECT_EQ(n.hca, 9);
}

TEST(ShapeConfigs, TruncateRejectsOutOfRange) {
  auto full = ModelConfig::load(cfg_dir("v4-flash"));
  ASSERT_TRUE(full.ok());
  for (int n : {0, -1, 44, 1000}) {
    ModelConfig c = *full;
    Status st = c.truncate_layers(n);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << n;
    EXPECT_NE(st.message().find("--num-layers"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("[1, 43]"), std::string::npos) << st.message();
    EXPECT_EQ(c.num_hidden_layers, 43) << "unchanged on error";
  }
}

}  // namespace
}  // namespace v4::model
