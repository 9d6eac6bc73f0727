#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "cache/shadow_radix.h"
#include "sim_store.h"

using namespace v4;
using namespace v4::cache;
using v4::cache::testing::SimStore;

namespace {

std::unique_ptr<ShadowRadix> make(int32_t pages, int32_t swa, int32_t snaps, int64_t P = 128,
                                  int64_t Ps = 32, int64_t W = 48) {
  ShadowRadixConfig c;
  c.page_tokens = P;
  c.swa_page_tokens = Ps;
  c.window_tokens = W;
  c.n_pages = pages;
  c.n_swa_pages = swa;
  c.n_snapshots = snaps;
  auto r = ShadowRadix::create(c);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

std::vector<int32_t> seq_tokens(uint32_t seed, int64_t n, int vocab = 50) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(g() % uint32_t(vocab));
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

#define CHECK_INV(r) ASSERT_TRUE((r).check_invariants().ok()) << (r).check_invariants().to_string() \
                                                              << "\n" << (r).debug_string()

}  // namespace

TEST(ShadowRadix, ColdThenHitAtEnd) {
  auto r = make(64, 64, 16);
  SimStore s(*r);
  auto prompt = seq_tokens(1, 300);
  int64_t R = -1;
  int32_t a = s.admit(prompt, 299, &R);
  ASSERT_GE(a, 0);
  EXPECT_EQ(R, 0);
  // 20 tokens generated; the last one was sampled but never fed back: 319 tokens computed.
  ASSERT_TRUE(s.run(a, 19));
  CHECK_INV(*r);
  EXPECT_EQ(s.finish(a), 319);
  CHECK_INV(*r);
  // Turn 2: previous prompt + reply + new text reuses all 319 computed tokens.
  std::vector<int32_t> turn2(prompt);
  for (int64_t p = 300; p < 319; ++p) turn2.push_back(int32_t(p % 7));
  turn2 = concat(turn2, seq_tokens(2, 50));
  auto m = r->match(turn2, int64_t(turn2.size()) - 1);
  EXPECT_EQ(m.cached_tokens, 319);
  int32_t b = s.admit(turn2, int64_t(turn2.size()) - 1, &R);
  ASSERT_GE(b, 0);
  EXPECT_EQ(R, 319);
  ASSERT_TRUE(s.run(b, 5));
  CHECK_INV(*r);
  s.finish(b);
  CHECK_INV(*r);
  EXPECT_EQ(r->stats().hit_tokens, 319);
}

// snapshot_interval: admit asks for boundaries at every multiple inside the prompt (sorted, once
// each, merged with the prompt end), so a request sharing 290 tokens resumes at 256.
TEST(ShadowRadix, SnapshotIntervalAddsPeriodicBoundaries) {
  ShadowRadixConfig c;
  c.page_tokens = 128;
  c.swa_page_tokens = 32;
  c.window_tokens = 48;
  c.n_pages = 64;
  c.n_swa_pages = 96;
  c.n_snapshots = 32;
  c.snapshot_interval = 128;
  auto rr = ShadowRadix::create(c);
  ASSERT_TRUE(rr.ok());
  ShadowRadix& r = **rr;
  SimStore s(r);
  auto shared = seq_tokens(7, 290);
  auto pa = concat(shared, seq_tokens(100, 110, 1000));
  auto pb = concat(shared, seq_tokens(200, 60, 1000));
  auto plan = r.admit(pa, int64_t(pa.size()) - 1);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->snapshot_points, (std::vector<int64_t>{128, 256, 384, 399, 400}));
  ASSERT_TRUE(r.finish(plan->seq, /*insert=*/false).ok());
  int32_t a = s.admit(pa, int64_t(pa.size()) - 1);
  ASSERT_GE(a, 0);
  ASSERT_TRUE(s.run(a));
  s.finish(a);
  CHECK_INV(r);
  int64_t R = -1;
  int32_t b = s.admit(pb, int64_t(pb.size()) - 1, &R);
  ASSERT_GE(b, 0);
  EXPECT_EQ(R, 256) << r.debug_string();
  ASSERT_TRUE(s.run(b, 2));
  s.finish(b);
  CHECK_INV(r);
}

// A prompt with more multiples of the interval than the store keeps gets its periodic points at
// interval·2^k (at most interval_point_cap() of them), so the points of a long prompt nest in
// those of a short one; the prompt end and n − 1 are always asked for.
TEST(ShadowRadix, SnapshotIntervalIsThinnedToTheStore) {
  EXPECT_EQ(thinned_snapshot_interval(0, 0, 1000, 8), 0);
  EXPECT_EQ(thinned_snapshot_interval(100, 0, 1000, 9), 100);   // 9 multiples in (0, 1000)
  EXPECT_EQ(thinned_snapshot_interval(100, 0, 1000, 8), 200);   // 4 of 200
  EXPECT_EQ(thinned_snapshot_interval(100, 0, 1001, 4), 400);   // 5 multiples of 200 > 4
  EXPECT_EQ(thinned_snapshot_interval(100, 0, 1001, 5), 200);
  EXPECT_EQ(thinned_snapshot_interval(1, 0, 1000, 16), 64);     // 15 multiples of 64
  EXPECT_EQ(thinned_snapshot_interval(1, 900, 1000, 16), 8);    // 12 multiples of 8 in (900, 1000)
  EXPECT_EQ(thinned_snapshot_interval(1000, 0, 1000, 4), 0);    // no multiple inside the prompt
  EXPECT_EQ(thinned_snapshot_interval(int64_t(1) << 62, 0, 1000, 4), 0);
  EXPECT_EQ(thinned_snapshot_interval(INT64_MAX, 5, 7, 1), 0);  // no overflow
  EXPECT_EQ(thinned_snapshot_interval(3, 998, 1000, 1), 3);      // 999
  EXPECT_EQ(thinned_snapshot_interval(4, 998, 1000, 1), 0);      // no multiple in (998, 1000)

  ShadowRadixConfig c;
  c.page_tokens = 128;
  c.swa_page_tokens = 32;
  c.window_tokens = 48;
  c.n_pages = 64;
  c.n_swa_pages = 96;
  c.n_snapshots = 32;
  c.snapshot_interval = 2;
  auto rr = ShadowRadix::create(c);
  ASSERT_TRUE(rr.ok());
  ShadowRadix& r = **rr;
  EXPECT_EQ(r.interval_point_cap(), 8);  // n_snapshots / 4
  auto pa = seq_tokens(7, 1000);
  auto plan = r.admit(pa, int64_t(pa.size()) - 1);
  ASSERT_TRUE(plan.ok());
  // 499 multiples of 2 → of 128: 7 of them, then n − 1 and n.
  EXPECT_EQ(plan->snapshot_points,
            (std::vector<int64_t>{128, 256, 384, 512, 640, 768, 896, 999, 1000}));
  ASSERT_TRUE(r.finish(plan->seq, /*insert=*/false).ok());
  CHECK_INV(r);
}

// The startup line names the flag, the value and, when the store cannot keep every multiple of a
// context-length prompt, the cap, the store size, from which length it thins and the smallest
// interval that never thins; an interval not below the context is flagged as having no effect.
TEST(ShadowRadix, SnapshotIntervalStartupLine) {
  bool warn = true;
  std::string l = describe_snapshot_interval(0, 20, 80, 4096, &warn);
  EXPECT_FALSE(warn);
  EXPECT_NE(l.find("--prefix-snapshot-interval 0"), std::string::npos) << l;
  l = describe_snapshot_interval(256, 20, 80, 4096, &warn);  // 15 points: fits
  EXPECT_FALSE(warn) << l;
  EXPECT_NE(l.find("--prefix-snapshot-interval 256: a boundary every 256"), std::string::npos) << l;
  l = describe_snapshot_interval(2, 20, 80, 4096, &warn);
  EXPECT_TRUE(warn);
  for (const char* want : {"--prefix-snapshot-interval 2:", "4096 tokens", "ask for 2047 ",
                           "at most 20 ", "store's 80 ", "longer than 42 tokens",
                           "interval >= 196 "})
    EXPECT_NE(l.find(want), std::string::npos) << want << " in: " << l;
  // 196 is the smallest interval that is not thinned for a 4096-token prompt.
  EXPECT_EQ(thinned_snapshot_interval(196, 0, 4096, 20), 196);
  EXPECT_EQ(thinned_snapshot_interval(195, 0, 4096, 20), 390);
  l = describe_snapshot_interval(4096, 20, 80, 4096, &warn);
  EXPECT_TRUE(warn);
  EXPECT_NE(l.find("no effect"), std::string::npos) << l;
}

// A hit resumes at any node boundary: cut points of every residue mod 4 and around multiples of
// 128 (the index side of requirement 1; the model side lives in the model tests).
TEST(ShadowRadix, BranchPointsAtEveryResidue) {
  for (int64_t cut : {1, 2, 3, 4, 5, 6, 7, 126, 127, 128, 129, 130, 131, 255, 256, 257, 383, 384,
                      385, 386}) {
    auto r = make(64, 96, 32);
    SimStore s(*r);
    auto shared = seq_tokens(7, cut);
    auto pa = concat(shared, seq_tokens(100, 200, 1000));
    auto pb = concat(shared, seq_tokens(200, 150, 1000));
    auto pc = concat(shared, seq_tokens(300, 90, 1000));
    int32_t a = s.admit(pa, int64_t(pa.size()) - 1);
    ASSERT_GE(a, 0);
    ASSERT_TRUE(s.run(a));
    s.finish(a);
    // B matches `cut` tokens but there is no boundary there yet: it recomputes them and saves
    // a snapshot at the branch point.
    int64_t R = -1;
    auto m = r->match(pb, int64_t(pb.size()) - 1);
    EXPECT_EQ(m.matched_tokens, cut);
    EXPECT_EQ(m.cached_tokens, 0);
    int32_t b = s.admit(pb, int64_t(pb.size()) - 1, &R);
    ASSERT_GE(b, 0);
    ASSERT_TRUE(s.run(b));
    s.finish(b);
    CHECK_INV(*r);
    // C resumes exactly at the branch point.
    int32_t c = s.admit(pc, int64_t(pc.size()) - 1, &R);
    ASSERT_GE(c, 0);
    EXPECT_EQ(R, cut) << "cut " << cut << "\n" << r->debug_string();
    ASSERT_TRUE(s.run(c, 3));
    CHECK_INV(*r);
    s.finish(c);
    CHECK_INV(*r);
    ASSERT_FALSE(::testing::Test::HasFailure()) << "cut " << cut;
  }
}

TEST(ShadowRadix, ImpossibleRequestRefusedAtOnce) {
  auto r = make(8, 16, 4);  // 8 pages x 128 = 1024 tokens
  Status st = r->check_fits(5000, 512);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("5000 tokens"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("8 pages"), std::string::npos) << st.message();
  EXPECT_TRUE(r->check_fits(500, 64).ok());
  Status sw = r->check_fits(800, 800);  // chunk needs (48+800)/32+1 = 28 SWA pages > 16
  ASSERT_FALSE(sw.ok());
  EXPECT_NE(sw.message().find("SWA"), std::string::npos) << sw.message();
}

TEST(ShadowRadix, ConfigValidation) {
  ShadowRadixConfig c;
  c.page_tokens = 100;
  EXPECT_FALSE(ShadowRadix::create(c).ok());
  c.page_tokens = 256;
  c.swa_page_tokens = 100;
  EXPECT_FALSE(ShadowRadix::create(c).ok());
  c.swa_page_tokens = 64;
  c.window_tokens = 300;
  EXPECT_FALSE(ShadowRadix::create(c).ok());
}

// The worked example of docs/cache.md: A and B share a prefix, B is evicted, A's path is resumed.
TEST(ShadowRadix, WorkedExampleEvictAndResume) {
  auto r = make(16, 40, 8, 128, 32, 48);
  SimStore s(*r);
  auto sys = seq_tokens(11, 200);
  auto pa = concat(sys, seq_tokens(12, 100, 1000));
  auto pb = concat(sys, seq_tokens(13, 60, 1000));
  int32_t a = s.admit(pa, 299);
  ASSERT_TRUE(s.run(a, 10));
  s.finish(a);  // tree: [0,310) with a boundary at 300 (prompt end) and 310
  int32_t b = s.admit(pb, 259);
  ASSERT_TRUE(s.run(b, 10));
  s.finish(b);  // B recomputed [0,200), adopted it: boundary at 200, branch [200,270)
  CHECK_INV(*r);
  auto st = r->stats();
  EXPECT_GE(st.resumable, 3);
  // Pressure: evict until all pages except a few are free: B's branch (older) goes first.
  ASSERT_TRUE(r->evict({st.pages_total - st.pages_used + 1, 0, 0}));
  CHECK_INV(*r);
  EXPECT_GT(r->stats().evicted_nodes, 0);
  // Phase 1 only: free all SWA windows -> tombstones, compressed pages kept.
  ASSERT_TRUE(r->evict({0, r->stats().swa_total, 0}));
  CHECK_INV(*r);
  EXPECT_EQ(r->stats().resumable, 0);
  EXPECT_GT(r->stats().tombstones, 0);
  EXPECT_EQ(r->match(pa, 299).cached_tokens, 0);  // tombstones are never returned
  // Recompute A: it adopts the tombstoned nodes again and they become resumable.
  int32_t a2 = s.admit(pa, 299);
  ASSERT_TRUE(s.run(a2));
  s.finish(a2);
  CHECK_INV(*r);
  int64_t R = -1;
  auto pc = concat(sys, seq_tokens(14, 30, 1000));
  int32_t c = s.admit(pc, int64_t(pc.size()) - 1, &R);
  EXPECT_EQ(R, 200);
  ASSERT_TRUE(s.run(c));
  s.finish(c);
  CHECK_INV(*r);
}

TEST(ShadowRadix, LockedStateSurvivesEviction) {
  auto r = make(12, 40, 8);
  SimStore s(*r);
  auto p = seq_tokens(21, 400);
  int32_t a = s.admit(p, 399);
  ASSERT_TRUE(s.run(a));
  s.finish(a);
  auto p2 = concat(p, seq_tokens(22, 100, 1000));
  int64_t R = -1;
  int32_t b = s.admit(p2, 499, &R);
  EXPECT_EQ(R, 400);
  // Everything the running request uses is locked: eviction cannot reach it.
  EXPECT_FALSE(r->evict({r->stats().pages_total, r->stats().swa_total, 0}));
  CHECK_INV(*r);
  ASSERT_TRUE(s.run(b, 30));  // SimStore checks every read
  s.finish(b, false);
  CHECK_INV(*r);
  // Now nothing is locked: everything can go.
  EXPECT_TRUE(r->evict({r->stats().pages_total, r->stats().swa_total, 8}));
  CHECK_INV(*r);
  EXPECT_EQ(r->stats().nodes, 0);
  EXPECT_EQ(r->stats().pages_used, 0);
  EXPECT_EQ(r->stats().swa_used, 0);
}

TEST(ShadowRadix, DisabledPrefixCacheNeverHits) {
  ShadowRadixConfig c;
  c.n_pages = 16;
  c.n_swa_pages = 32;
  c.n_snapshots = 4;
  c.enable_prefix_cache = false;
  auto r = std::move(ShadowRadix::create(c)).value();
  SimStore s(*r);
  auto p = seq_tokens(5, 300);
  int32_t a = s.admit(p, 299);
  ASSERT_TRUE(s.run(a));
  s.finish(a);
  int64_t R = -1;
  int32_t b = s.admit(p, 299, &R);
  EXPECT_EQ(R, 0);
  s.finish(b);
  EXPECT_EQ(r->stats().nodes, 0);
  CHECK_INV(*r);
}

// Requirement 5: >= 100,000 random insert/match/lock/unlock/evict operations, invariants checked
// after every one, and every read of the fake model verified (SimStore).
TEST(ShadowRadixFuzz, HundredThousandOps) {
  const auto t0 = std::chrono::steady_clock::now();
  struct Cfg {
    int32_t pages, swa, snaps;
    int64_t P, Ps, W;
    bool write_back;  // SWA rows reach the pages only for the last W positions of each step
  };
  const Cfg cfgs[] = {{24, 48, 12, 128, 32, 48, false},
                      {14, 40, 6, 256, 64, 128, false},
                      {40, 64, 20, 128, 16, 127, true}};
  int64_t ops = 0, hits = 0, admits = 0, adopted = 0, tomb = 0, evicted = 0;
  for (int ci = 0; ci < 3; ++ci) {
    const Cfg& cf = cfgs[ci];
    auto r = make(cf.pages, cf.swa, cf.snaps, cf.P, cf.Ps, cf.W);
    SimStore s(*r, cf.write_back ? cf.W : -1);
    std::mt19937 g(1234 + ci);
    std::vector<std::vector<int32_t>> corpus;  // prompts seen so far (to share prefixes)
    auto rnd = [&](int64_t n) { return int64_t(g() % uint64_t(n)); };
    for (int it = 0; it < 34000; ++it, ++ops) {
      const int op = int(rnd(100));
      auto& seqs = s.seqs();
      if (op < 18 && seqs.size() < 4) {
        // New request: often a prefix of an old prompt plus a fresh tail.
        std::vector<int32_t> p;
        if (!corpus.empty() && rnd(4) != 0) {
          const auto& base = corpus[size_t(rnd(int64_t(corpus.size())))];
          p.assign(base.begin(), base.begin() + rnd(int64_t(base.size())) + 1);
        }
        auto tail = seq_tokens(uint32_t(g()), rnd(200) + 1, rnd(3) == 0 ? 3 : 1000);
        p = concat(p, tail);
        if (int64_t(p.size()) > 600) p.resize(600);
        if (!r->check_fits(int64_t(p.size()) + 64, 64).ok()) continue;
        int64_t R = 0;
        int32_t id = s.admit(p, int64_t(p.size()) - 1, &R);
        if (id >= 0) {
          ++admits;
          hits += R > 0;
          corpus.push_back(p);
          if (corpus.size() > 40) corpus.erase(corpus.begin());
        }
      } else if (op < 70 && !seqs.empty()) {
        auto itr = seqs.begin();
        std::advance(itr, rnd(int64_t(seqs.size())));
        const int32_t id = itr->first;
        const int64_t limit = int64_t(itr->second.prompt.size()) + 64;
        const int64_t n = std::min<int64_t>(rnd(3) == 0 ? rnd(130) + 1 : rnd(8) + 1,
                                            limit - int64_t(itr->second.tokens.size()));
        if (n <= 0) {
          s.finish(id, true);
        } else if (s.step(id, n) < 0) {
          s.finish(id, rnd(2) == 0);  // preempted under pressure (with or without insert)
        }
      } else if (op < 80 && !seqs.empty()) {
        auto itr = seqs.begin();
        std::advance(itr, rnd(int64_t(seqs.size())));
        s.finish(itr->first, rnd(5) != 0, rnd(3) != 0);
      } else if (op < 85 && !seqs.empty()) {
        auto itr = seqs.begin();
        std::advance(itr, rnd(int64_t(seqs.size())));
        s.snapshot(itr->first);  // an extra boundary at an arbitrary point
      } else if (op < 93) {
        EvictNeed need{int32_t(rnd(cf.pages / 2)), int32_t(rnd(cf.swa / 2)),
                       int32_t(rnd(cf.snaps / 2))};
        r->evict(need);
      } else if (!corpus.empty()) {
        const auto& p = corpus[size_t(rnd(int64_t(corpus.size())))];
        auto m = r->match(p, int64_t(p.size()) - 1);
        EXPECT_LE(m.cached_tokens, m.matched_tokens);
      }
      Status st = r->check_invariants();
      ASSERT_TRUE(st.ok()) << "config " << ci << " op " << it << ": " << st.to_string() << "\n"
                           << r->debug_string();
      ASSERT_FALSE(::testing::Test::HasFailure()) << "config " << ci << " op " << it;
    }
    while (!s.seqs().empty()) s.finish(s.seqs().begin()->first, true);
    CHECK_INV(*r);
    auto st = r->stats();
    adopted += st.adopted_nodes;
    tomb += st.tombstoned_nodes;
    evicted += st.evicted_nodes;
    // Empty the cache completely: accounting returns to zero.
    EXPECT_TRUE(r->evict({cf.pages, cf.swa, cf.snaps}));
    CHECK_INV(*r);
    EXPECT_EQ(r->stats().pages_used, 0);
    EXPECT_EQ(r->stats().swa_used, 0);
    EXPECT_EQ(r->stats().snapshots_used, 0);
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(ops, 100000);
  // The run must exercise every mechanism, or it proves little.
  EXPECT_GT(hits, 100);
  EXPECT_GT(adopted, 10);
  EXPECT_GT(tomb, 10);
  EXPECT_GT(evicted, 10);
  std::printf("fuzz: %lld ops, %lld admits, %lld hits, %lld adopted, %lld tombstoned, %lld evicted, %.2f s\n",
              (long long)ops, (long long)admits, (long long)hits, (long long)adopted,
              (long long)tomb, (long long)evicted, secs);
}

// Write-back bindings write only the last window of each step. A sequence that recomputed a
// node (B) holds a mapped SWA page whose rows are only partly written; the tree must not move
// another node's window (C's, at 100) onto those rows when B is inserted.
TEST(ShadowRadix, AdoptionNeverUsesUnwrittenRows) {
  auto r = make(32, 64, 16, 128, 64, 16);
  SimStore s(*r, /*swa_tail=*/16);
  auto S = seq_tokens(31, 300);
  auto pa = S;
  int32_t a = s.admit(pa, 299);
  ASSERT_TRUE(s.run(a));
  s.finish(a);
  auto pb = concat(std::vector<int32_t>(S.begin(), S.begin() + 200), seq_tokens(32, 200, 1000));
  int32_t b = s.admit(pb, 399);
  ASSERT_EQ(s.step(b, 112), 112);
  ASSERT_TRUE(s.snapshot(b));  // B keeps [96, 112): SWA page [64, 128) stays mapped
  auto pc = concat(std::vector<int32_t>(S.begin(), S.begin() + 100), seq_tokens(33, 50, 1000));
  int32_t c = s.admit(pc, 149);
  ASSERT_TRUE(s.run(c));
  s.finish(c);  // boundary at 100 (C's pages)
  CHECK_INV(*r);
  ASSERT_TRUE(s.run(b));
  s.finish(b);  // B recomputed [0, 200): must not adopt onto rows 84..95 it never wrote back
  CHECK_INV(*r);
  auto pd = concat(std::vector<int32_t>(S.begin(), S.begin() + 100), seq_tokens(34, 20, 1000));
  int64_t R = -1;
  int32_t d = s.admit(pd, 119, &R);  // SimStore checks rows [84, 100)
  EXPECT_EQ(R, 100);
  ASSERT_TRUE(s.run(d));
  s.finish(d);
  CHECK_INV(*r);
}
