// Invariance tests of our engine against itself (testing.md layer 3), exact equality:
// chunked vs one-shot prefill for chunk sizes {1, 3, 4, 127, 128, 129, large}, and a request
// alone vs inside mixed batches (prefill chunks and decode rows of other requests).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "model/deepseek_v4.h"
#include "model_test_util.h"
#include "ops/ops.h"

namespace v4::model {
namespace {

struct Env {
  std::unique_ptr<ops::Ops> ops;
  std::unique_ptr<DeepseekV4> model;
  std::unique_ptr<cache::KvCache> kv;
};

// `max_chunk` > 0 sizes the SWA pool for live windows only (pages must really be recycled).
Env make_env(const std::string& dir, int64_t max_chunk = 0) {
  Env e;
  e.ops = ops::make_cpu_ops();
  auto m = DeepseekV4::load(dir, e.ops.get());
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return e;
  e.model = std::move(m).value();
  auto kv = e.model->make_cache(int64_t(128) << 20, 8, 0, max_chunk);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  if (kv.ok()) e.kv = std::move(kv).value();
  return e;
}

std::vector<int32_t> random_prompt(int64_t vocab, int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab) - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Runs `prompt` alone in chunks of `chunk` tokens (logits at every position), then `n_decode`
// greedy decode steps; returns all logits rows concatenated.
std::vector<float> run_alone(Env& e, const std::vector<int32_t>& prompt, int64_t chunk,
                             int n_decode, std::vector<int32_t>* greedy = nullptr) {
  auto seq = e.kv->create_sequence();
  EXPECT_TRUE(seq.ok());
  const int64_t V = e.model->config().vocab_size;
  std::vector<float> all;
  int64_t pos = 0;
  while (pos < int64_t(prompt.size())) {
    const int64_t n = std::min<int64_t>(chunk, int64_t(prompt.size()) - pos);
    ForwardBatch b;
    b.slices.push_back(
        {*seq, pos, std::vector<int32_t>(prompt.begin() + pos, prompt.begin() + pos + n), true});
    auto out = e.model->forward(b, *e.kv);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    if (!out.ok()) return {};
    all.insert(all.end(), out->logits.begin(), out->logits.end());
    pos += n;
  }
  for (int i = 0; i < n_decode; ++i) {
    const int32_t next = testing::argmax(&all[all.size() - V], V);
    if (greedy) greedy->push_back(next);
    ForwardBatch b;
    b.slices.push_back({*seq, pos, {next}, false});
    auto out = e.model->forward(b, *e.kv);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    if (!out.ok()) return {};
    all.insert(all.end(), out->logits.begin(), out->logits.end());
    ++pos;
  }
  e.kv->free_sequence(*seq);
  return all;
}

TEST(Invariance, ChunkSizesEqualOneShotExactly) {
  const auto dirs = testing::fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir);
    Env e = make_env(dir);
    ASSERT_TRUE(e.kv);
    const auto prompt = random_prompt(e.model->config().vocab_size, 300, 7);
    const auto ref = run_alone(e, prompt, 100000, 6);
    ASSERT_FALSE(ref.empty());
    for (int64_t chunk : {1, 3, 4, 127, 128, 129, 299}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      const auto got = run_alone(e, prompt, chunk, 6);
      ASSERT_EQ(got.size(), ref.size());
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0)
          << "rel err " << testing::rel_err(got.data(), ref.data(), ref.size());
    }
  }
}

// Three requests of different lengths, interleaved: prefill chunks and decode rows share steps.
TEST(Invariance, MixedBatchEqualsAloneBitExact) {
  const auto dirs = testing::fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir);
    Env e = make_env(dir, 90);
    ASSERT_TRUE(e.kv);
    const int64_t V = e.model->config().vocab_size;
    const std::vector<std::vector<int32_t>> prompts = {
        random_prompt(V, 37, 1), random_prompt(V, 90, 2), random_prompt(V, 5, 3)};
    const int n_decode = 8;
    // Alone: one-shot prefill + greedy decode.
    std::vector<std::vector<float>> alone;
    std::vector<std::vector<int32_t>> alone_tokens(prompts.size());
    for (size_t r = 0; r < prompts.size(); ++r)
      alone.push_back(run_alone(e, prompts[r], 100000, n_decode, &alone_tokens[r]));

    // Mixed: request r's prompt is fed in chunks of size chunk[r]; each step packs the next chunk
    // (or decode token) of every live request, in a rotating order.
    const int64_t chunk[3] = {20, 90, 2};
    struct St {
      int32_t seq;
      int64_t pos = 0;
      int decoded = 0;
      std::vector<float> logits;
    };
    std::vector<St> st;
    for (size_t r = 0; r < prompts.size(); ++r) {
      auto s = e.kv->create_sequence();
      ASSERT_TRUE(s.ok());
      st.push_back({*s, 0, 0, {}});
    }
    for (int step = 0; step < 100; ++step) {
      ForwardBatch b;
      std::vector<size_t> who;
      for (size_t k = 0; k < prompts.size(); ++k) {
        const size_t r = (k + step) % prompts.size();
        St& s = st[r];
        const int64_t P = int64_t(prompts[r].size());
        if (s.pos < P) {
          const int64_t n = std::min(chunk[r], P - s.pos);
          b.slices.push_back(
              {s.seq, s.pos,
               std::vector<int32_t>(prompts[r].begin() + s.pos, prompts[r].begin() + s.pos + n),
               true});
        } else if (s.decoded < n_decode) {
          const int32_t next = testing::argmax(&s.logits[s.logits.size() - V], V);
          b.slices.push_back({s.seq, s.pos, {next}, false});
          s.decoded++;
        } else {
          continue;
        }
        who.push_back(r);
      }
      if (b.slices.empty()) break;
      auto out = e.model->forward(b, *e.kv);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      for (size_t i = 0; i < who.size(); ++i) {
        St& s = st[who[i]];
        s.pos += int64_t(b.slices[i].tokens.size());
        s.logits.insert(s.logits.end(), out->logits.begin() + out->row_begin[i] * V,
                        out->logits.begin() + out->row_begin[i + 1] * V);
      }
    }
    for (size_t r = 0; r < prompts.size(); ++r) {
      SCOPED_TRACE("request " + std::to_string(r));
      ASSERT_EQ(st[r].logits.size(), alone[r].size());
      EXPECT_EQ(std::memcmp(st[r].logits.data(), alone[r].data(), alone[r].size() * sizeof(float)),
                0)
          << "rel err " << testing::rel_err(st[r].logits.data(), alone[r].data(), alone[r].size());
    }
  }
}

TEST(Invariance, FreeReturnsPagesAndSwaPagesAreReleased) {
  const auto dirs = testing::fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  Env e = make_env(dirs[0]);
  ASSERT_TRUE(e.kv);
  auto used = [&](const char* name) {
    for (auto& u : e.kv->usage())
      if (u.name == name) return u.used;
    return int64_t(-1);
  };
  EXPECT_EQ(used("virtual_pages"), 0);
  auto seq = e.kv->create_sequence();
  ASSERT_TRUE(seq.ok());
  const int page = e.kv->options().page_size;
  const auto prompt = random_prompt(e.model->config().vocab_size, 2 * page + 10, 5);
  ForwardBatch b;
  b.slices.push_back({*seq, 0, prompt, false});
  ASSERT_TRUE(e.model->forward(b, *e.kv).ok());
  EXPECT_EQ(used("virtual_pages"), 3);
  // Window is tiny compared to a page: only the last page keeps SWA rows.
  EXPECT_LT(used("swa_pages"), 3);
  EXPECT_EQ(used("state_slots"), 1);
  e.kv->free_sequence(*seq);
  EXPECT_EQ(used("virtual_pages"), 0);
  EXPECT_EQ(used("swa_pages"), 0);
  EXPECT_EQ(used("state_slots"), 0);
}

TEST(Invariance, BadSlicesAreRejected) {
  const auto dirs = testing::fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  Env e = make_env(dirs[0]);
  ASSERT_TRUE(e.kv);
  auto seq = e.kv->create_sequence();
  ASSERT_TRUE(seq.ok());
  ForwardBatch b;
  b.slices.push_back({*seq, 3, {1, 2}, false});
  auto r = e.model->forward(b, *e.kv);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("start_pos 3"), std::string::npos) << r.status().message();
  b.slices = {{*seq, 0, {int32_t(e.model->config().vocab_size)}, false}};
  r = e.model->forward(b, *e.kv);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("outside the vocabulary"), std::string::npos);
  b.slices = {{*seq, 0, {1}, false}, {*seq, 0, {2}, false}};
  r = e.model->forward(b, *e.kv);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("twice"), std::string::npos);
  b.slices = {{12345, 0, {1}, false}};
  EXPECT_FALSE(e.model->forward(b, *e.kv).ok());
}

}  // namespace
}  // namespace v4::model
