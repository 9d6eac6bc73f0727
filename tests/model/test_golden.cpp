// Golden tests: our CPU forward vs the transformers 5.17.0 oracle fixtures in tests/fixtures/*.
// Tolerance (testing.md): max|Δlogit| / max|logit| ≤ 1e-4 and identical greedy tokens.
#include <gtest/gtest.h>

#include "model/deepseek_v4.h"
#include "model_test_util.h"
#include "ops/ops.h"

namespace v4::model {
namespace {

using testing::fixture_dirs;
using testing::Golden;
using testing::load_golden;
using testing::rel_err;

constexpr double kTol = 1e-4;

struct Loaded {
  std::unique_ptr<ops::Ops> ops;
  std::unique_ptr<DeepseekV4> model;
  Golden golden;
};

Loaded load(const std::string& dir) {
  Loaded l;
  l.ops = ops::make_cpu_ops();
  auto m = DeepseekV4::load(dir, l.ops.get());
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (m.ok()) l.model = std::move(m).value();
  auto g = load_golden(dir);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  if (g.ok()) l.golden = std::move(g).value();
  return l;
}

std::unique_ptr<cache::KvCache> make_cache(const DeepseekV4& m) {
  auto kv = m.make_cache(int64_t(96) << 20, 4);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  return kv.ok() ? std::move(kv).value() : nullptr;
}

TEST(Golden, FixturesExist) {
  ASSERT_FALSE(fixture_dirs().empty()) << "no tests/fixtures/*/golden.safetensors";
}

TEST(Golden, PrefillLogits) {
  for (const auto& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    Loaded l = load(dir);
    ASSERT_TRUE(l.model);
    const int64_t V = l.model->config().vocab_size;
    ASSERT_EQ(V, l.golden.vocab);
    auto kv = make_cache(*l.model);
    ASSERT_TRUE(kv);
    auto seq = kv->create_sequence();
    ASSERT_TRUE(seq.ok());
    ForwardBatch b;
    b.slices.push_back({*seq, 0, l.golden.prompt_ids, true});
    auto out = l.model->forward(b, *kv);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const int64_t T = int64_t(l.golden.prompt_ids.size());
    ASSERT_EQ(out->logits.size(), size_t(T * V));
    const double err = rel_err(out->logits.data(), l.golden.prefill_logits.data(), size_t(T * V));
    EXPECT_LE(err, kTol) << "prefill rel err " << err;
    int mismatched_argmax = 0;
    for (int64_t t = 0; t < T; ++t)
      mismatched_argmax += testing::argmax(&out->logits[t * V], V) !=
                           testing::argmax(&l.golden.prefill_logits[t * V], V);
    EXPECT_EQ(mismatched_argmax, 0);
    std::printf("[golden] %s prefill T=%lld rel_err=%.3g\n", dir.c_str(), (long long)T, err);
  }
}

TEST(Golden, GreedyDecodeThroughCache) {
  for (const auto& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    Loaded l = load(dir);
    ASSERT_TRUE(l.model);
    const int64_t V = l.model->config().vocab_size;
    auto kv = make_cache(*l.model);
    ASSERT_TRUE(kv);
    auto seq = kv->create_sequence();
    ASSERT_TRUE(seq.ok());
    const auto& g = l.golden;
    const int64_t N = int64_t(g.tokens.size());
    ASSERT_GE(N, 24);
    ForwardBatch b;
    b.slices.push_back({*seq, 0, g.prompt_ids, false});
    auto out = l.model->forward(b, *kv);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    double worst = 0;
    int64_t pos = int64_t(g.prompt_ids.size());
    for (int64_t i = 0; i < N; ++i) {
      if (i > 0) {
        ForwardBatch d;
        d.slices.push_back({*seq, pos, {g.tokens[i - 1]}, false});
        out = l.model->forward(d, *kv);
        ASSERT_TRUE(out.ok()) << out.status().to_string();
        ++pos;
      }
      ASSERT_EQ(out->logits.size(), size_t(V));
      const double err = rel_err(out->logits.data(), &g.decode_logits[i * V], size_t(V));
      worst = std::max(worst, err);
      EXPECT_LE(err, kTol) << "decode step " << i;
      EXPECT_EQ(testing::argmax(out->logits.data(), V), g.tokens[i])
          << "greedy token at step " << i;
    }
    std::printf("[golden] %s decode N=%lld worst rel_err=%.3g\n", dir.c_str(), (long long)N, worst);
  }
}

TEST(Golden, ChunkedPrefill) {
  for (const auto& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    Loaded l = load(dir);
    ASSERT_TRUE(l.model);
    auto kv = make_cache(*l.model);
    ASSERT_TRUE(kv);
    auto seq = kv->create_sequence();
    ASSERT_TRUE(seq.ok());
    const auto& g = l.golden;
    std::vector<float> all;
    int64_t pos = 0;
    for (int32_t cs : g.chunk_sizes) {
      ForwardBatch b;
      std::vector<int32_t> toks(g.prompt_ids.begin() + pos, g.prompt_ids.begin() + pos + cs);
      b.slices.push_back({*seq, pos, toks, true});
      auto out = l.model->forward(b, *kv);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      all.insert(all.end(), out->logits.begin(), out->logits.end());
      pos += cs;
    }
    ASSERT_EQ(pos, int64_t(g.prompt_ids.size()));
    const double err = rel_err(all.data(), g.chunked_logits.data(), all.size());
    EXPECT_LE(err, kTol) << "chunked rel err " << err;
    std::printf("[golden] %s chunked rel_err=%.3g\n", dir.c_str(), err);
  }
}

}  // namespace
}  // namespace v4::model
