// --mem-fraction: engine::kv_budget_from_mem_fraction (F · total − used − reserve, errors) on a
// backend reporting chosen memory numbers, and engine::workspace_reserve_bytes for the V4-Flash
// shape computed by hand from its formula (model_executor.h).
#include <gtest/gtest.h>

#include "engine/model_executor.h"
#include "model/config.h"
#include "ops/null_ops.h"

namespace v4::engine {
namespace {

/// Runs no op; reports the memory it is told to.
class MemOps : public ops::NullOps {
 public:
  MemOps(int64_t free_b, int64_t total_b) : m_{free_b, total_b} {}
  std::string name() const override { return "mem"; }
  ops::MemoryInfo memory_info() override { return m_; }

 private:
  ops::MemoryInfo m_;
};

constexpr int64_t GiB = int64_t(1) << 30;

TEST(MemFraction, BudgetArithmetic) {
  MemOps o(100 * GiB, 140 * GiB);  // 40 GiB in use (weights, context)
  std::string why;
  auto b = kv_budget_from_mem_fraction(o, 0.9, 6 * GiB, &why);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(*b, int64_t(0.9 * double(140 * GiB)) - 40 * GiB - 6 * GiB);
  EXPECT_NE(why.find("40.00 GiB in use"), std::string::npos) << why;
  EXPECT_NE(why.find("6.00 GiB workspace reserve"), std::string::npos) << why;
  auto none = kv_budget_from_mem_fraction(o, 0.3, 6 * GiB);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(none.status().message().find("--mem-fraction"), std::string::npos);
  for (double bad : {0.0, -0.5, 1.5})
    EXPECT_EQ(kv_budget_from_mem_fraction(o, bad, 0).status().code(), ErrorCode::kInvalidArgument)
        << bad;
  MemOps unknown(0, 0);
  EXPECT_EQ(kv_budget_from_mem_fraction(unknown, 0.5, 0).status().code(), ErrorCode::kUnsupported);
}

TEST(MemFraction, WorkspaceReserveForTheFlashShape) {
  auto c = model::ModelConfig::load(std::string(V4_SOURCE_DIR) + "/models/configs/v4-flash");
  ASSERT_TRUE(c.ok());
  // Per token (f32 values): 2·4·4096 + 4·4096 + 4 + 16 + 3·64·512 + 512 + 1024 + 8·1024 + 4·512
  // + 4·128 + 64·128 + 64 + 512 + ctx/4 + 256 + 12 + 6·(3·2048 + 4096).
  auto per_token = [](int64_t ctx) {
    return 32768 + 16384 + 4 + 16 + 98304 + 512 + 1024 + 8192 + 2048 + 512 + 8192 + 64 + 512 +
           ctx / 4 + 256 + 12 + 6 * (6144 + 4096);
  };
  for (auto [chunk, ctx] : {std::pair<int64_t, int64_t>{4096, 1048576}, {256, 4096}, {1, 1}})
    EXPECT_EQ(workspace_reserve_bytes(*c, chunk, ctx),
              512 * (int64_t(1) << 20) + 5 * chunk * per_token(ctx) * 4 / 4)
        << chunk << " " << ctx;
  // At 1M context the indexer scores (262,144 f32 per token) dominate: > 5 GiB for 4096 tokens.
  EXPECT_GT(workspace_reserve_bytes(*c, 4096, 1048576), 5 * GiB);
}

}  // namespace
}  // namespace v4::engine
