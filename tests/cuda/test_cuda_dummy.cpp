// --load-format dummy on the GPU.
// - With f32 storage (policy.native off) the dummy weights are the CPU backend's bit for bit
//   (fill_random is counter-based), so the GPU forward must give the CPU forward's logits within
//   the fp32 tolerance of the golden tests (max|Δ| / max|logit| ≤ 1e-4) and the same greedy tokens.
// - In native formats (FP8 / MXFP4 / BF16 where the backend reads them) a tiny quantized config
//   and a three-layer V4-Flash-shaped model run prefill + decode with finite logits.
// - The weight-fit check: footprint estimate = allocation; a model over free memory is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "cuda_test_util.h"
#include "model/deepseek_v4.h"
#include "ops/cuda/cuda_ops.h"

namespace v4::model {
namespace {

std::string src(const std::string& p) {
  return std::string(V4_SOURCE_DIR) + "/" + p;
}

struct RunResult {
  std::vector<float> logits;  // prefill (all rows) then each decode step's row
  std::vector<int32_t> tokens;
};

RunResult run(DeepseekV4& m, int n_prompt, int n_decode, int64_t budget = int64_t(256) << 20) {
  RunResult r;
  auto kv = m.make_cache(budget, 1);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  if (!kv.ok()) return r;
  auto seq = (*kv)->create_sequence();
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> prompt;
  for (int i = 0; i < n_prompt; ++i) prompt.push_back(int32_t((i * 7919 + 3) % V));
  ForwardBatch b;
  b.slices.push_back({*seq, 0, prompt, true});
  auto out = m.forward(b, **kv);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  if (!out.ok()) return r;
  r.logits = out->logits;
  for (int i = 0; i < n_decode; ++i) {
    const float* last = out->logits.data() + out->logits.size() - V;
    const int32_t next = int32_t(std::max_element(last, last + V) - last);
    r.tokens.push_back(next);
    ForwardBatch d;
    d.slices.push_back({*seq, int64_t(n_prompt + i), {next}, false});
    out = m.forward(d, **kv);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    if (!out.ok()) return r;
    r.logits.insert(r.logits.end(), out->logits.begin(), out->logits.end());
  }
  return r;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double mx = 0, d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    mx = std::max(mx, std::fabs(double(b[i])));
    d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
  }
  return d / std::max(mx, 1e-30);
}

TEST(CudaDummy, F32DummyEqualsCpuDummy) {
  V4_REQUIRE_GPU();
  auto g = ops::make_cuda_ops();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto c = ops::make_cpu_ops();
  WeightFormatPolicy f32;
  f32.native = false;
  for (const char* fx : {"tiny-kinds-fp32", "tiny-fp8-mxfp4", "tiny-real-rates"}) {
    SCOPED_TRACE(fx);
    auto mg = DeepseekV4::load_dummy(src("tests/fixtures/") + fx, g->get(), f32, 0, 77);
    auto mc = DeepseekV4::load_dummy(src("tests/fixtures/") + fx, c.get(), f32, 0, 77);
    ASSERT_TRUE(mg.ok() && mc.ok()) << mg.status().to_string() << mc.status().to_string();
    RunResult rg = run(**mg, 300, 8), rc = run(**mc, 300, 8);
    ASSERT_EQ(rg.logits.size(), rc.logits.size());
    const double e = rel_err(rg.logits, rc.logits);
    std::printf("%s: GPU vs CPU dummy logits max|Δ|/max|logit| = %.3g\n", fx, e);
    EXPECT_LE(e, 1e-4);
    EXPECT_EQ(rg.tokens, rc.tokens);
  }
}

TEST(CudaDummy, NativeFormatsRun) {
  V4_REQUIRE_GPU();
  auto g = ops::make_cuda_ops();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto m = DeepseekV4::load_dummy(src("tests/fixtures/tiny-fp8-mxfp4"), g->get(), {}, 0, 3);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  for (const auto& [f, b] : (*m)->weights().bytes_by_format())
    std::printf("tiny-fp8-mxfp4 dummy on cuda: %s %lld bytes\n", f.c_str(), (long long)b);
  RunResult r = run(**m, 100, 4);
  ASSERT_FALSE(r.logits.empty());
  for (float x : r.logits) ASSERT_TRUE(std::isfinite(x));
}

TEST(CudaDummy, ThreeLayerFlashShape) {
  V4_REQUIRE_GPU();
  auto g = ops::make_cuda_ops();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto m = DeepseekV4::load_dummy(src("models/configs/v4-flash"), g->get(), {}, 3, 1);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  for (const auto& [f, b] : (*m)->weights().bytes_by_format())
    std::printf("v4-flash 3 layers dummy on cuda: %s %.2f GiB\n", f.c_str(), b / 1073741824.0);
  RunResult r = run(**m, 300, 2, int64_t(2) << 30);
  ASSERT_FALSE(r.logits.empty());
  double mx = 0;
  for (float x : r.logits) {
    ASSERT_TRUE(std::isfinite(x));
    mx = std::max(mx, std::fabs(double(x)));
  }
  std::printf("v4-flash 3 layers: max |logit| %.3f\n", mx);
  EXPECT_GT(mx, 0.01);
}

// The fit check on the GPU: estimate_weight_footprint equals what load_dummy allocates in native
// formats (a three-layer V4-Flash cut), and a model larger than the free device memory (the full
// V4-Flash when it does not fit) is refused up front — kResourceExhausted naming the bytes,
// without allocating.
TEST(CudaDummy, FootprintEstimateAndFitCheck) {
  V4_REQUIRE_GPU();
  auto g = ops::make_cuda_ops();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto cfg = ModelConfig::load(src("models/configs/v4-flash"));
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  ModelConfig cut = *cfg;
  ASSERT_TRUE(cut.truncate_layers(3).ok());
  const WeightFootprint est3 = estimate_weight_footprint(cut, **g);
  {
    auto m = DeepseekV4::load_dummy(src("models/configs/v4-flash"), g->get(), {}, 3, 1);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    int64_t actual = (*m)->weights().vector_bytes();
    for (const auto& [f, b] : (*m)->weights().bytes_by_format()) actual += b;
    EXPECT_EQ(est3.bytes, actual);
  }
  const WeightFootprint full = estimate_weight_footprint(*cfg, **g);
  const ops::MemoryInfo before = (*g)->memory_info();
  std::printf("v4-flash on cuda: weights %.2f GiB, free %.2f GiB\n", full.bytes / 1073741824.0,
              before.free_bytes / 1073741824.0);
  ASSERT_GT(before.free_bytes, 0);
  EXPECT_GT(full.bytes, 40 * est3.bytes / 3 / 2);  // 43 layers vs 3 (plus embeddings)
  if (full.bytes <= before.free_bytes) GTEST_SKIP() << "the full V4-Flash fits on this GPU";
  auto m = DeepseekV4::load_dummy(src("models/configs/v4-flash"), g->get(), {}, 0, 1);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(m.status().message().find(std::to_string(full.bytes) + " bytes"), std::string::npos)
      << m.status().message();
  const ops::MemoryInfo after = (*g)->memory_info();
  EXPECT_LT(std::llabs(after.free_bytes - before.free_bytes), int64_t(256) << 20)
      << "refused before allocating";
}

}  // namespace
}  // namespace v4::model
