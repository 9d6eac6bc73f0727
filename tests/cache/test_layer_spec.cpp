#include <gtest/gtest.h>

#include "cache/layer_spec.h"

using namespace v4;
using namespace v4::cache;

namespace {
CacheDims flash_dims() {
  CacheDims d;
  d.compress_ratios = {0, 0};
  for (int i = 0; i < 20; ++i) {
    d.compress_ratios.push_back(4);
    d.compress_ratios.push_back(128);
  }
  d.compress_ratios.push_back(4);
  return d;
}
}  // namespace

TEST(LayerSpec, FlashBytesPerToken) {
  auto spec = LayerSpecTable::from_dims(flash_dims());
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->layers.size(), 43u);
  EXPECT_EQ(spec->n_layers_of_ratio(0), 2);
  EXPECT_EQ(spec->n_layers_of_ratio(4), 21);
  EXPECT_EQ(spec->n_layers_of_ratio(128), 20);
  // dsv4-model.md §12: CSA 320 B/token/layer (bf16), HCA 8 B/token/layer -> 6880 B/token.
  EXPECT_EQ(spec->csa_bytes_per_128_tokens() / 128, 21 * 320);
  EXPECT_EQ(spec->hca_bytes_per_128_tokens() / 128, 20 * 8);
  EXPECT_EQ(spec->n_csa_layers(), 21);
  EXPECT_EQ(spec->compressed_bytes_per_page(256) / 256, 6880);
  EXPECT_EQ(spec->swa_bytes_per_token(), 43 * 512 * 2);
  // C4 ring (attention 64 KiB + indexer 16 KiB), C128 online accumulator 6 KiB (fp32).
  EXPECT_EQ(spec->layers[2].state, StateKind::kOverlapRing);
  EXPECT_EQ(spec->layers[2].state_bytes, 64 * 1024 + 16 * 1024);
  EXPECT_EQ(spec->layers[3].state, StateKind::kOnlineAccum);
  EXPECT_EQ(spec->layers[3].state_bytes, 3 * 512 * 4);
  EXPECT_EQ(spec->layers[0].state, StateKind::kNone);
  EXPECT_EQ(spec->snapshot_bytes(), 21 * 80 * 1024 + 20 * 6 * 1024);
  auto raw = flash_dims();
  raw.c128_online_accum = false;
  auto spec2 = LayerSpecTable::from_dims(raw);
  ASSERT_TRUE(spec2.ok());
  EXPECT_EQ(spec2->layers[3].state_bytes, 2 * 128 * 512 * 4);  // 512 KiB (§12)
}

TEST(LayerSpec, RejectsBadRatio) {
  CacheDims d;
  d.compress_ratios = {0, 12};
  auto s = LayerSpecTable::from_dims(d);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("ratio 12"), std::string::npos);
  d.compress_ratios = {0, 4, 16};  // the embedded model's HCA ratio
  auto t = LayerSpecTable::from_dims(d);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->layers[1].csa);
  EXPECT_FALSE(t->layers[2].csa);
  EXPECT_EQ(t->hca_bytes_per_128_tokens(), 8 * 512 * 2);
  d.compress_ratios = {};
  EXPECT_FALSE(LayerSpecTable::from_dims(d).ok());
}

TEST(LayerSpec, PlanFromBudgetExplains) {
  auto spec = LayerSpecTable::from_dims(flash_dims());
  ASSERT_TRUE(spec.ok());
  PoolPlanOptions o;
  o.budget_bytes = int64_t(8) << 30;
  o.max_running = 8;
  o.chunk_tokens = 1024;
  auto plan = plan_pools(*spec, o);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_GT(plan->n_pages, 0);
  EXPECT_EQ(plan->capacity_tokens, plan->n_pages * 256);
  EXPECT_LE(plan->bytes_compressed + plan->bytes_swa + plan->bytes_snapshots, o.budget_bytes);
  // Everything left after SWA and snapshots goes to pages: less than one page is unused.
  EXPECT_LT(o.budget_bytes - (plan->bytes_compressed + plan->bytes_swa + plan->bytes_snapshots),
            spec->compressed_bytes_per_page(256));
  EXPECT_NE(plan->explanation.find("6880.0 B/token"), std::string::npos) << plan->explanation;
  EXPECT_NE(plan->explanation.find("44032 B/token"), std::string::npos) << plan->explanation;
}

TEST(LayerSpec, PlanRefusesTinyBudgetAndBadPages) {
  auto spec = LayerSpecTable::from_dims(flash_dims());
  ASSERT_TRUE(spec.ok());
  PoolPlanOptions o;
  o.budget_bytes = 1 << 20;
  auto plan = plan_pools(*spec, o);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("too small"), std::string::npos);
  o.budget_bytes = int64_t(8) << 30;
  o.page_tokens = 200;
  EXPECT_FALSE(plan_pools(*spec, o).ok());
  o.page_tokens = 256;
  o.swa_page_tokens = 48;
  EXPECT_FALSE(plan_pools(*spec, o).ok());
}
