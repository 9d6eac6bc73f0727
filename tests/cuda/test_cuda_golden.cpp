// Golden fixtures on the GPU: the unchanged DeepseekV4 forward over the CUDA backend vs the
// transformers 5.17.0 oracle (tests/fixtures/*), prefill, greedy decode through the cache and
// chunked prefill; plus a ragged mixed batch (each request gets the tokens it gets alone).
// Tolerance as the CPU golden tests (fp32 backend): max|Δlogit| / max|logit| ≤ 1e-4, same greedy
// tokens.
#include <gtest/gtest.h>

#include "../model/model_test_util.h"
#include "cuda_test_util.h"
#include "model/deepseek_v4.h"
#include "ops/cuda/cuda_ops.h"

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

Loaded load(const std::string& dir, ops::Precision precision = ops::Precision::kFp32) {
  Loaded l;
  ops::CudaOptions opt;
  opt.precision = precision;
  auto o = ops::make_cuda_ops(opt);
  EXPECT_TRUE(o.ok()) << o.status().to_string();
  if (!o.ok()) return l;
  l.ops = std::move(o).value();
  auto m = DeepseekV4::load(dir, l.ops.get());
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (m.ok()) l.model = std::move(m).value();
  auto g = load_golden(dir);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  if (g.ok()) l.golden = std::move(g).value();
  return l;
}

std::unique_ptr<cache::KvCache> make_cache(const DeepseekV4& m) {
  auto kv = m.make_cache(int64_t(512) << 20, 8);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  return kv.ok() ? std::move(kv).value() : nullptr;
}

TEST(CudaGolden, PrefillDecodeChunked) {
  V4_REQUIRE_GPU();
  ASSERT_FALSE(fixture_dirs().empty());
  for (const auto& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    Loaded l = load(dir);
    ASSERT_TRUE(l.model);
    const int64_t V = l.model->config().vocab_size;
    const auto& g = l.golden;
    // prefill (all logits)
    {
      auto kv = make_cache(*l.model);
      ASSERT_TRUE(kv);
      auto seq = kv->create_sequence();
      ASSERT_TRUE(seq.ok());
      ForwardBatch b;
      b.slices.push_back({*seq, 0, g.prompt_ids, true});
      auto out = l.model->forward(b, *kv);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      const int64_t T = int64_t(g.prompt_ids.size());
      ASSERT_EQ(out->logits.size(), size_t(T * V));
      const double err = rel_err(out->logits.data(), g.prefill_logits.data(), size_t(T * V));
      EXPECT_LE(err, kTol);
      int bad = 0;
      for (int64_t t = 0; t < T; ++t)
        bad += testing::argmax(&out->logits[t * V], V) != testing::argmax(&g.prefill_logits[t * V], V);
      EXPECT_EQ(bad, 0);
      std::printf("[cuda golden] %s prefill T=%lld rel_err=%.3g\n", dir.c_str(), (long long)T, err);
    }
    // greedy decode through the cache
    {
      auto kv = make_cache(*l.model);
      ASSERT_TRUE(kv);
      auto seq = kv->create_sequence();
      ASSERT_TRUE(seq.ok());
      const int64_t N = int64_t(g.tokens.size());
      ForwardBatch b;
      b.slices.push_back({*seq, 0, g.prompt_ids, false});
      auto out = l.model->forward(b, *kv);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      double worst = 0;
      int64_t pos = int64_t(g.prompt_ids.size());
      for (int64_t i = 0; i < N; ++i) {
        if (i > 0) {
          ForwardBatch d;
          d.slices.push_back({*seq, pos++, {g.tokens[i - 1]}, false});
          out = l.model->forward(d, *kv);
          ASSERT_TRUE(out.ok()) << out.status().to_string();
        }
        ASSERT_EQ(out->logits.size(), size_t(V));
        const double err = rel_err(out->logits.data(), &g.decode_logits[i * V], size_t(V));
        worst = std::max(worst, err);
        EXPECT_LE(err, kTol) << "decode step " << i;
        EXPECT_EQ(testing::argmax(out->logits.data(), V), g.tokens[i]) << "greedy token, step " << i;
      }
      std::printf("[cuda golden] %s decode N=%lld worst rel_err=%.3g\n", dir.c_str(), (long long)N, worst);
    }
    // chunked prefill
    {
      auto kv = make_cache(*l.model);
      ASSERT_TRUE(kv);
      auto seq = kv->create_sequence();
      ASSERT_TRUE(seq.ok());
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
      const double err = rel_err(all.data(), g.chunked_logits.data(), all.size());
      EXPECT_LE(err, kTol);
      std::printf("[cuda golden] %s chunked rel_err=%.3g\n", dir.c_str(), err);
    }
  }
}

// bf16 mode over whole fixtures (native weights: bf16 / FP8 / MXFP4): decode-sized calls run the
// fp32-math GEMV, prompts longer than 32 tokens the bf16 tensor-core path; attention uses TF32 and
// the indexer bf16 tensor cores. Measured on the H200 (bench/results/cuda-op-tests.log): the
// indexer's bf16 scores flip near-tied top-k choices of these random tiny models, which changes
// the attended keys, so single logits move by up to ~0.4 of max |logit| while greedy tokens agree
// at 96–100% of positions. Asserted: every logit finite, max error ≤ 0.5 of max |logit| (garbage
// or a broken kernel gives ≥ 1), greedy agreement ≥ 95% over prefill + decode positions.
TEST(CudaGolden, Bf16ModeWithinTolerance) {
  V4_REQUIRE_GPU();
  ASSERT_FALSE(fixture_dirs().empty());
  constexpr double kTolBf16 = 0.5;
  constexpr double kMinAgree = 0.95;
  for (const auto& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    Loaded l = load(dir, ops::Precision::kBf16);
    ASSERT_TRUE(l.model);
    const int64_t V = l.model->config().vocab_size;
    const auto& g = l.golden;
    auto kv = make_cache(*l.model);
    ASSERT_TRUE(kv);
    auto seq = kv->create_sequence();
    ASSERT_TRUE(seq.ok());
    ForwardBatch b;
    b.slices.push_back({*seq, 0, g.prompt_ids, true});
    auto out = l.model->forward(b, *kv);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const int64_t T = int64_t(g.prompt_ids.size());
    ASSERT_EQ(out->logits.size(), size_t(T * V));
    const double err = rel_err(out->logits.data(), g.prefill_logits.data(), size_t(T * V));
    EXPECT_LE(err, kTolBf16) << "prefill";
    int same = 0;
    for (int64_t t = 0; t < T; ++t)
      same += testing::argmax(&out->logits[t * V], V) == testing::argmax(&g.prefill_logits[t * V], V);
    // decode through the cache, fed the oracle's tokens
    double worst = 0;
    int64_t pos = T;
    const int64_t N = int64_t(g.tokens.size());
    int dsame = 0;
    for (int64_t i = 1; i < N; ++i) {
      ForwardBatch d;
      d.slices.push_back({*seq, pos++, {g.tokens[i - 1]}, false});
      auto o = l.model->forward(d, *kv);
      ASSERT_TRUE(o.ok()) << o.status().to_string();
      const double e = rel_err(o->logits.data(), &g.decode_logits[i * V], size_t(V));
      worst = std::max(worst, e);
      EXPECT_LE(e, kTolBf16) << "decode step " << i;
      dsame += testing::argmax(o->logits.data(), V) == g.tokens[i];
    }
    std::printf("[cuda golden bf16] %s prefill T=%lld rel_err=%.3g (greedy equal %d/%lld), decode "
                "worst rel_err=%.3g (greedy equal %d/%lld)\n",
                dir.c_str(), (long long)T, err, same, (long long)T, worst, dsame,
                (long long)(N > 0 ? N - 1 : 0));
    EXPECT_GE(double(same + dsame), kMinAgree * double(T + std::max<int64_t>(0, N - 1)))
        << "greedy agreement with the oracle";
  }
}

// A ragged mixed batch (one prefill chunk + decode rows of other sequences) gives every request
// the same greedy tokens as running alone.
TEST(CudaGolden, MixedBatchMatchesAlone) {
  V4_REQUIRE_GPU();
  for (const auto& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    Loaded l = load(dir);
    ASSERT_TRUE(l.model);
    const int64_t V = l.model->config().vocab_size;
    const auto& p = l.golden.prompt_ids;
    const int steps = 6;
    auto run_alone = [&](const std::vector<int32_t>& prompt) {
      auto kv = make_cache(*l.model);
      auto seq = kv->create_sequence();
      std::vector<int32_t> toks;
      ForwardBatch b;
      b.slices.push_back({*seq, 0, prompt, false});
      auto out = l.model->forward(b, *kv);
      EXPECT_TRUE(out.ok());
      int64_t pos = int64_t(prompt.size());
      for (int i = 0; i < steps && out.ok(); ++i) {
        toks.push_back(testing::argmax(out->logits.data(), V));
        ForwardBatch d;
        d.slices.push_back({*seq, pos++, {toks.back()}, false});
        out = l.model->forward(d, *kv);
      }
      return toks;
    };
    std::vector<std::vector<int32_t>> prompts = {
        p, std::vector<int32_t>(p.begin(), p.begin() + p.size() / 2),
        std::vector<int32_t>(p.rbegin(), p.rbegin() + 9)};
    std::vector<std::vector<int32_t>> alone;
    for (auto& pr : prompts) alone.push_back(run_alone(pr));
    // together: request 0 and 1 start first; request 2's prefill joins the decode steps later.
    auto kv = make_cache(*l.model);
    std::vector<int32_t> seqs;
    for (size_t r = 0; r < prompts.size(); ++r) seqs.push_back(*kv->create_sequence());
    std::vector<std::vector<int32_t>> got(prompts.size());
    std::vector<int64_t> pos(prompts.size(), 0);
    std::vector<bool> started(prompts.size(), false);
    for (int step = 0; step <= steps + 2; ++step) {
      ForwardBatch b;
      std::vector<size_t> who;
      for (size_t r = 0; r < prompts.size(); ++r) {
        if (int(got[r].size()) >= steps) continue;
        if (!started[r]) {
          if (r == 2 && step < 2) continue;
          b.slices.push_back({seqs[r], 0, prompts[r], false});
          pos[r] = int64_t(prompts[r].size());
          started[r] = true;
        } else {
          b.slices.push_back({seqs[r], pos[r]++, {got[r].back()}, false});
        }
        who.push_back(r);
      }
      if (who.empty()) break;
      auto out = l.model->forward(b, *kv);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      for (size_t i = 0; i < who.size(); ++i)
        got[who[i]].push_back(testing::argmax(&out->logits[out->row_begin[i] * V], V));
    }
    for (size_t r = 0; r < prompts.size(); ++r) EXPECT_EQ(got[r], alone[r]) << "request " << r;
  }
}

}  // namespace
}  // namespace v4::model
