// KvCache pools (src/cache/pools.h) as the engine uses them: sizing from a byte budget, sequence
// slots, page exhaustion with a clear error, addressing by slot / ratio.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "cache/pools.h"
#include "model/deepseek_v4.h"
#include "model_test_util.h"
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

std::unique_ptr<KvCache> make(const KvCacheOptions& o) {
  auto kv = KvCache::create(
      spec(), o, [](size_t b) { return std::calloc(1, b); }, [](void* p) { std::free(p); });
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  return kv.ok() ? std::move(kv).value() : nullptr;
}

TEST(Pools, BudgetSizing) {
  const int64_t vpage = KvCache::virtual_page_bytes(spec(), 128);
  const int64_t swa = KvCache::swa_page_bytes(spec(), 128);
  const int64_t state = KvCache::state_slot_bytes(spec());
  // CSA: 128/4 rows × (32 + 16) f32; HCA: 128/16 rows × 32 f32.
  EXPECT_EQ(vpage, (32 * 48 + 8 * 32) * 4);
  EXPECT_EQ(swa, 3 * 128 * 32 * 4);
  // CSA main ring 2·4 rows × 64 (kv + gate), indexer 2·4 × 32 (kv + gate), HCA 16 × 32 (kv + gate).
  EXPECT_EQ(state, (2 * 8 * 64 + 2 * 8 * 32 + 2 * 16 * 32) * 4);
  auto o = KvCache::options_from_budget(spec(), state * 2 + 5 * (vpage + swa) + 7, 128, 2);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->n_pages, 5);
  EXPECT_EQ(o->n_swa_pages, 5);
  // With a chunk bound, SWA pages cover only live windows and the rest becomes virtual pages:
  // 2 sequences × (ceil((100 + 7) / 128) + 1) = 4 SWA pages.
  auto o2 = KvCache::options_from_budget(spec(), state * 2 + 20 * (vpage + swa), 128, 2, 100);
  ASSERT_TRUE(o2.ok());
  EXPECT_EQ(o2->n_swa_pages, 4);
  EXPECT_EQ(o2->n_pages, (20 * (vpage + swa) - 4 * swa) / vpage);
  EXPECT_GT(o2->n_pages, 20);
  auto too_small = KvCache::options_from_budget(spec(), state * 2, 128, 2);
  ASSERT_FALSE(too_small.ok());
  EXPECT_EQ(too_small.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(too_small.status().message().find("too small"), std::string::npos);
  // page size must be a multiple of 128 and of every rate
  KvCacheOptions bad{100, 4, 4, 1};
  EXPECT_FALSE(
      KvCache::create(
          spec(), bad, [](size_t b) { return std::calloc(1, b); }, [](void* p) { std::free(p); })
          .ok());
}

TEST(Pools, SequencesPagesAndAddressing) {
  auto kv = make({128, 4, 4, 2});
  ASSERT_TRUE(kv);
  auto a = kv->create_sequence(), b = kv->create_sequence();
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = kv->create_sequence();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kResourceExhausted);
  ASSERT_TRUE(kv->reserve(*a, 300).ok());  // 3 pages
  auto r = kv->reserve(*b, 200);           // needs 2, only 1 left
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(r.message().find("needs 2 more pages"), std::string::npos) << r.message();
  ASSERT_TRUE(kv->reserve(*b, 100).ok());
  // Distinct sequences never share a compressed row or SWA row.
  std::set<int32_t> c4, swa;
  for (int32_t s : {*a, *b})
    for (int64_t p = 0; p < (s == *a ? 300 : 100); ++p) {
      EXPECT_TRUE(swa.insert(kv->swa_row(s, p)).second);
      if (p % 4 == 0) {
        EXPECT_TRUE(c4.insert(kv->compressed_row(s, p / 4, 4)).second);
      }
    }
  // Rows of consecutive entries inside a page are consecutive (slot / ratio).
  EXPECT_EQ(kv->compressed_row(*a, 1, 4), kv->compressed_row(*a, 0, 4) + 1);
  kv->commit(*a, 300);
  auto used = [&](const char* n) {
    for (auto& u : kv->usage())
      if (u.name == n) return u.used;
    return int64_t(-1);
  };
  EXPECT_EQ(used("virtual_pages"), 4);
  EXPECT_EQ(used("swa_pages"), 2);  // a's pages 0 and 1 are out of every window (300 - 7 > 256)
  kv->free_sequence(*a);
  EXPECT_EQ(used("virtual_pages"), 1);
  EXPECT_EQ(used("swa_pages"), 1);
  EXPECT_EQ(used("state_slots"), 1);
  auto d = kv->create_sequence();
  EXPECT_TRUE(d.ok());
}

// Token-by-token decode commits free each SWA page once, as it leaves the window (commit keeps a
// watermark of the freed prefix instead of rescanning every page each step), and the addressing
// version changes exactly when a page is freed or appended.
TEST(Pools, DecodeCommitsFreeSwaPagesAsTheWindowPasses) {
  auto kv = make({128, 12, 12, 1});
  ASSERT_TRUE(kv);
  auto a = kv->create_sequence();
  ASSERT_TRUE(a.ok());
  auto used_swa = [&] {
    for (auto& u : kv->usage())
      if (u.name == "swa_pages") return u.used;
    return int64_t(-1);
  };
  const int W = spec().sliding_window;
  for (int64_t len = 1; len <= 12 * 128; ++len) {
    ASSERT_TRUE(kv->reserve(*a, len).ok());
    const uint64_t v0 = kv->addressing_version(*a);
    kv->commit(*a, len);
    const int64_t pages = (len + 127) / 128;
    const int64_t dead = std::max<int64_t>(0, len - (W - 1)) / 128;
    ASSERT_EQ(used_swa(), pages - dead) << "length " << len;
    const bool freed_now = dead > 0 && std::max<int64_t>(0, len - 1 - (W - 1)) / 128 < dead;
    EXPECT_EQ(kv->addressing_version(*a) != v0, freed_now) << "length " << len;
    for (int64_t p = std::max<int64_t>(0, len - (W - 1)); p < len; ++p)  // still read
      ASSERT_GE(kv->swa_row(*a, p), 0) << "length " << len << " token " << p;
  }
  kv->commit(*a, 12 * 128);  // a repeated commit frees nothing more
  EXPECT_EQ(used_swa(), 12 - (12 * 128 - (W - 1)) / 128);
  kv->free_sequence(*a);
  EXPECT_EQ(used_swa(), 0);
  // The slot reused by a new sequence starts with no freed prefix: its first pages are freed
  // again as its window passes them.
  auto b = kv->create_sequence();
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(kv->reserve(*b, 3 * 128).ok());
  kv->commit(*b, 3 * 128);
  EXPECT_EQ(used_swa(), 3 - (3 * 128 - (W - 1)) / 128);
  for (int64_t p = 3 * 128 - (W - 1); p < 3 * 128; ++p) EXPECT_GE(kv->swa_row(*b, p), 0);
  kv->free_sequence(*b);
  // fast_forward (no SWA pages below the window), then decode commits across a page boundary.
  auto c = kv->create_sequence();
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(kv->fast_forward(*c, 5 * 128 + 3).ok());
  const int64_t ff_used = used_swa();
  for (int64_t len = 5 * 128 + 4; len <= 6 * 128 + 20; ++len) {
    ASSERT_TRUE(kv->reserve(*c, len).ok());
    kv->commit(*c, len);
    const int64_t pages = (len + 127) / 128;
    const int64_t dead = (len - (W - 1)) / 128;
    ASSERT_EQ(used_swa(), pages - dead) << "length " << len << " (after fast_forward: " << ff_used
                                        << ")";
    for (int64_t p = len - (W - 1); p < len; ++p) ASSERT_GE(kv->swa_row(*c, p), 0) << "length " << len;
  }
}

TEST(Pools, ForwardReportsFullCacheWithoutComputing) {
  const auto dirs = model::testing::fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  auto ops = ops::make_cpu_ops();
  auto m = model::DeepseekV4::load(dirs[0], ops.get());
  ASSERT_TRUE(m.ok());
  const auto sp = (*m)->cache_spec();
  const int64_t budget = KvCache::state_slot_bytes(sp) + 2 * (KvCache::virtual_page_bytes(sp, 256) +
                                                              KvCache::swa_page_bytes(sp, 256));
  auto kv = (*m)->make_cache(budget, 1, 256);
  ASSERT_TRUE(kv.ok()) << kv.status().to_string();
  auto seq = (*kv)->create_sequence();
  ASSERT_TRUE(seq.ok());
  model::ForwardBatch b;
  b.slices.push_back({*seq, 0, std::vector<int32_t>(600, 1), false});
  auto out = (*m)->forward(b, **kv);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ((*kv)->length(*seq), 0);
  b.slices[0].tokens.resize(500);
  EXPECT_TRUE((*m)->forward(b, **kv).ok());
  EXPECT_EQ((*kv)->length(*seq), 500);
}

}  // namespace
}  // namespace v4::cache
