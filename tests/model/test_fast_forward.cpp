// KvCache::fast_forward (benchmarks: a sequence at length L without computing L tokens) leaves
// the pools exactly as a computed sequence of length L would: the same virtual and SWA page
// counts as reserve(L) + commit(L) (the engine's path), SWA rows for the last W − 1 positions,
// compressed rows for every closed entry; errors for non-empty sequences and short pools. Then
// a model decodes on a fast-forwarded sequence whose pools were filled with random values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "cache/pools.h"
#include "model/deepseek_v4.h"
#include "ops/ops.h"

namespace v4::cache {
namespace {

CacheSpec spec() {
  CacheSpec s;
  s.sliding_window = 8;
  s.layers = {
      {AttnKind::kSliding, 0, 32, 0}, {AttnKind::kCsa, 4, 32, 16}, {AttnKind::kHca, 16, 32, 0}};
  return s;
}

std::unique_ptr<KvCache> make(int64_t pages, int64_t swa_pages, int seqs = 2) {
  KvCacheOptions o{128, pages, swa_pages, seqs};
  auto kv = KvCache::create(
      spec(), o, [](size_t b) { return std::calloc(1, b); }, [](void* p) { std::free(p); });
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  return kv.ok() ? std::move(kv).value() : nullptr;
}

TEST(FastForward, SamePoolsAsAComputedSequence) {
  for (int64_t L : {0, 1, 6, 7, 8, 127, 128, 129, 134, 135, 136, 255, 256, 1000, 1024, 1031}) {
    SCOPED_TRACE(L);
    auto a = make(20, 20), b = make(20, 20);
    const int32_t sa = *a->create_sequence(), sb = *b->create_sequence();
    ASSERT_TRUE(a->reserve(sa, L).ok());
    a->commit(sa, L);
    ASSERT_TRUE(b->fast_forward(sb, L).ok());
    EXPECT_EQ(b->length(sb), L);
    const auto ua = a->usage(), ub = b->usage();
    for (size_t i = 0; i < ua.size(); ++i) EXPECT_EQ(ua[i].used, ub[i].used) << ua[i].name;
    EXPECT_EQ(b->fast_forward_pages(L).first, ub[0].used);
    EXPECT_EQ(b->fast_forward_pages(L).second, ub[1].used);
    for (int64_t p = std::max<int64_t>(0, L - 7); p < L; ++p) EXPECT_GE(b->swa_row(sb, p), 0) << p;
    for (int64_t e = 0; e < L / 4; ++e) EXPECT_GE(b->compressed_row(sb, e, 4), 0);
    // The next decode step reserves like the engine's would.
    ASSERT_TRUE(b->reserve(sb, L + 1).ok());
    EXPECT_GE(b->swa_row(sb, L), 0);
  }
}

TEST(FastForward, Errors) {
  auto kv = make(4, 4);
  const int32_t s = *kv->create_sequence();
  EXPECT_EQ(kv->fast_forward(s + 1, 10).code(), ErrorCode::kInvalidArgument);
  const Status full = kv->fast_forward(s, 128 * 5);
  EXPECT_EQ(full.code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(full.message().find("needs 5 virtual"), std::string::npos) << full.message();
  EXPECT_EQ(kv->usage()[0].used, 0) << "nothing allocated on failure";
  ASSERT_TRUE(kv->fast_forward(s, 300).ok());
  EXPECT_EQ(kv->fast_forward(s, 10).code(), ErrorCode::kInvalidArgument) << "not empty";
  kv->free_sequence(s);
  EXPECT_EQ(kv->usage()[0].used, 0);
  EXPECT_EQ(kv->usage()[1].used, 0);
}

TEST(FastForward, BuffersListEveryPool) {
  auto kv = make(3, 2, 2);
  int64_t values = 0;
  for (const auto& b : kv->buffers()) {
    EXPECT_NE(b.data, nullptr) << b.name;
    values += b.values;
  }
  // SWA 3 layers × 2 pages × 128 × 32; CSA: c4 3·32 rows × 32, index 3·32 × 16, rings
  // 2 seqs × 8 rows × 64 (kv, gate), index rings 2 × 8 × 32 (kv, gate); HCA: 3·8 rows × 32,
  // rings 2 × 16 × 32 (kv, gate).
  const int64_t want = 3 * 2 * 128 * 32 + 96 * 32 + 96 * 16 + 2 * (2 * 8 * 64) + 2 * (2 * 8 * 32) +
                       24 * 32 + 2 * (2 * 16 * 32);
  EXPECT_EQ(values, want);
}

TEST(FastForward, ModelDecodesOnAFastForwardedSequence) {
  auto ops = ops::make_cpu_ops();
  auto m = model::DeepseekV4::load_dummy(
      std::string(V4_SOURCE_DIR) + "/tests/fixtures/tiny-kinds-fp32", ops.get(), {}, 0, 9);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto kv = (*m)->make_cache(int64_t(32) << 20, 2);
  ASSERT_TRUE(kv.ok());
  for (const auto& b : (*kv)->buffers())
    ops->fill_random(b.data, b.values, ops::RandomFill::kF32Normal, 1.f, 1234);
  const int32_t s = *(*kv)->create_sequence();
  const int64_t L = 1000;
  ASSERT_TRUE((*kv)->fast_forward(s, L).ok());
  for (int i = 0; i < 3; ++i) {
    model::ForwardBatch d;
    d.slices.push_back({s, L + i, {int32_t(7 + i)}, false});
    auto out = (*m)->forward(d, **kv);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    for (float x : out->logits) ASSERT_TRUE(std::isfinite(x));
  }
  EXPECT_EQ((*kv)->length(s), L + 3);
}

// The decode fast path keeps a mirror of the page tables keyed by addressing_version: a
// fast-forwarded batch decoded with the plan op (device_plan, as graphs use it) must give the host
// planner's logits bit for bit (a stale mirror would read other rows).
TEST(FastForward, PlanOpDecodeEqualsHostPlanner) {
  auto ops = ops::make_cpu_ops();
  const std::string fx = std::string(V4_SOURCE_DIR) + "/tests/fixtures/tiny-kinds-fp32";
  std::vector<std::vector<float>> logits[2];
  for (int device_plan = 0; device_plan < 2; ++device_plan) {
    auto m = model::DeepseekV4::load_dummy(fx, ops.get(), {}, 0, 9);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model::DeepseekV4::DecodeOptions o = (*m)->decode_options();
    o.graphs = false;
    o.device_plan = device_plan == 1;
    (*m)->set_decode_options(o);
    auto kv = (*m)->make_cache(int64_t(32) << 20, 4);
    ASSERT_TRUE(kv.ok());
    for (const auto& b : (*kv)->buffers())
      ops->fill_random(b.data, b.values, ops::RandomFill::kF32Normal, 1.f, 77);
    // Sequences created, fast-forwarded, one freed and re-created longer (pages change).
    std::vector<int64_t> lens = {300, 1000, 17};
    std::vector<int32_t> seqs;
    for (int64_t L : lens) {
      seqs.push_back(*(*kv)->create_sequence());
      ASSERT_TRUE((*kv)->fast_forward(seqs.back(), L).ok());
    }
    for (int step = 0; step < 4; ++step) {
      if (step == 2) {
        (*kv)->free_sequence(seqs[0]);
        seqs[0] = *(*kv)->create_sequence();
        lens[0] = 700;
        ASSERT_TRUE((*kv)->fast_forward(seqs[0], lens[0]).ok());
      }
      model::ForwardBatch d;
      for (size_t i = 0; i < seqs.size(); ++i)
        d.slices.push_back({seqs[i], lens[i], {int32_t(3 + step + 5 * i)}, false});
      auto out = (*m)->forward(d, **kv);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      logits[device_plan].push_back(out->logits);
      for (auto& L : lens) ++L;
    }
    if (device_plan) {
      EXPECT_GT((*m)->decode_stats().device_plan_steps, 0);
    }
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  for (size_t s = 0; s < logits[0].size(); ++s)
    EXPECT_EQ(logits[0][s], logits[1][s]) << "step " << s;
}

TEST(FastForward, ChangesTheAddressingVersion) {
  auto kv = make(20, 20);
  const int32_t s = *kv->create_sequence();
  const uint64_t v0 = kv->addressing_version(s);
  ASSERT_TRUE(kv->fast_forward(s, 600).ok());
  EXPECT_NE(kv->addressing_version(s), v0);
}

}  // namespace
}  // namespace v4::cache
