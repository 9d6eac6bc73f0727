// PrefixCache (ShadowRadix + KvCache, write-back binding) with the real forward:
//  - requirement 1: a request that hits at a branch point left by earlier requests produces
//    logits bit-identical to a cold prefill (cut points of every residue mod 4, around 128);
//  - requirement 4: under memory pressure (evictions and tombstones happen) concurrently running
//    requests still produce the greedy tokens they produce alone;
//  - requirement 6: turn n+1 of a chat reuses every computed token of turn n;
//  - invariants hold after every step.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <utility>
#include <vector>

#include "cache/radix_kv.h"
#include "model/deepseek_v4.h"
#include "ops/ops.h"

using namespace v4;

namespace {

struct Env {
  std::unique_ptr<ops::Ops> ops;
  std::unique_ptr<model::DeepseekV4> model;
  std::unique_ptr<cache::KvCache> kv;
  std::unique_ptr<cache::PrefixCache> pc;
  int64_t V = 0;
};

Env make_env(int32_t pages, int32_t swa_pages, int32_t snaps, int max_seqs = 8,
             KvDtype kv_dtype = KvDtype::kF32, IndexCacheDtype index = IndexCacheDtype::kAuto) {
  Env e;
  e.ops = ops::make_cpu_ops();
  const auto dir =
      (std::filesystem::path(V4_SOURCE_DIR) / "tests" / "fixtures" / "tiny-real-rates").string();
  auto m = model::DeepseekV4::load(dir, e.ops.get());
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return e;
  e.model = std::move(m).value();
  e.V = e.model->config().vocab_size;
  auto kv = e.model->make_cache(int64_t(256) << 20, max_seqs, 0, 0, kv_dtype, index);
  EXPECT_TRUE(kv.ok());
  e.kv = std::move(kv).value();
  cache::ShadowRadixConfig c;
  c.page_tokens = 128;
  c.swa_page_tokens = 32;
  c.n_pages = pages;
  c.n_swa_pages = swa_pages;
  c.n_snapshots = snaps;
  auto pc = cache::PrefixCache::create(*e.kv, c);
  EXPECT_TRUE(pc.ok()) << pc.status().to_string();
  e.pc = std::move(pc).value();
  return e;
}

std::vector<int32_t> toks(uint32_t seed, int64_t n, int64_t vocab) {
  std::mt19937 g(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = int32_t(g() % uint32_t(vocab));
  return v;
}
std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
int32_t argmax(const float* p, int64_t n) { return int32_t(std::max_element(p, p + n) - p); }

// One request driven like the scheduler does: prefill in chunks that end at snapshot points,
// then greedy decode. Several requests advance together, one batched forward per step.
struct Req {
  Req() = default;
  Req(std::vector<int32_t> p, int n) : prompt(std::move(p)), n_gen(n) {}
  std::vector<int32_t> prompt;
  int n_gen = 0;
  cache::PrefixSeq h;
  int64_t pos = 0;
  std::vector<float> logits;  // logits of prompt positions >= cached (logits_all)
  std::vector<int32_t> gen;
  std::vector<float> last;
  bool done = false;
};

void run_together(Env& e, std::vector<Req*> reqs, int64_t chunk) {
  for (Req* r : reqs) {
    auto h = e.pc->admit(*e.kv, r->prompt);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    r->h = *h;
    r->pos = h->cached_tokens;
  }
  while (true) {
    model::ForwardBatch b;
    std::vector<Req*> in;
    for (Req* r : reqs) {
      if (r->done) continue;
      const int64_t n_prompt = int64_t(r->prompt.size());
      model::SeqSlice sl;
      sl.seq = r->h.kv_seq;
      sl.start_pos = r->pos;
      if (r->pos < n_prompt) {
        int64_t n = std::min(chunk, n_prompt - r->pos);
        for (int64_t p : r->h.snapshot_points)
          if (p > r->pos && p < r->pos + n) n = p - r->pos;
        sl.tokens.assign(r->prompt.begin() + r->pos, r->prompt.begin() + r->pos + n);
        sl.logits_all = true;
      } else {
        sl.tokens = {r->gen.back()};
      }
      b.slices.push_back(sl);
      in.push_back(r);
    }
    if (in.empty()) break;
    auto out = e.model->forward(b, *e.kv);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    for (size_t i = 0; i < in.size(); ++i) {
      Req* r = in[i];
      const auto& sl = b.slices[i];
      const float* rows = out->logits.data() + out->row_begin[i] * e.V;
      const int64_t nrows = out->row_begin[i + 1] - out->row_begin[i];
      if (sl.logits_all) r->logits.insert(r->logits.end(), rows, rows + nrows * e.V);
      r->last.assign(rows + (nrows - 1) * e.V, rows + nrows * e.V);
      r->pos += int64_t(sl.tokens.size());
      ASSERT_TRUE(e.pc->on_step(*e.kv, r->h.kv_seq, sl.tokens).ok());
      if (r->pos >= int64_t(r->prompt.size())) {
        if (int(r->gen.size()) == r->n_gen) {
          auto fin = e.pc->finish(*e.kv, r->h.kv_seq, true);
          ASSERT_TRUE(fin.ok()) << fin.status().to_string();
          r->done = true;
        } else {
          r->gen.push_back(argmax(r->last.data(), e.V));
        }
      }
    }
    Status inv = e.pc->radix().check_invariants();
    ASSERT_TRUE(inv.ok()) << inv.to_string() << "\n" << e.pc->radix().debug_string();
  }
}

// Cold reference: the prompt alone in one chunk (no cache), logits at every position + greedy.
void cold(Env& e, const std::vector<int32_t>& prompt, int n_gen, std::vector<float>* logits,
          std::vector<int32_t>* gen) {
  auto s = e.kv->create_sequence();
  ASSERT_TRUE(s.ok());
  model::ForwardBatch b;
  b.slices.push_back({*s, 0, prompt, true});
  auto out = e.model->forward(b, *e.kv);
  ASSERT_TRUE(out.ok());
  *logits = out->logits;
  std::vector<float> last(out->logits.end() - e.V, out->logits.end());
  int64_t pos = int64_t(prompt.size());
  for (int i = 0; i <= n_gen; ++i) {
    const int32_t t = argmax(last.data(), e.V);
    if (i == n_gen) break;
    gen->push_back(t);
    if (i + 1 == n_gen) break;
    model::ForwardBatch d;
    d.slices.push_back({*s, pos++, {t}, false});
    auto o = e.model->forward(d, *e.kv);
    ASSERT_TRUE(o.ok());
    last = o->logits;
  }
  e.kv->free_sequence(*s);
}

}  // namespace

void branch_hits_are_bit_identical(KvDtype kv_dtype,
                                   IndexCacheDtype index = IndexCacheDtype::kAuto) {
  Env e = make_env(64, 128, 32, 8, kv_dtype, index);
  ASSERT_TRUE(e.pc);
  ASSERT_EQ(e.kv->index_dtype(), kv_index_dtype(kv_dtype, index));
  const auto S = toks(1, 420, e.V);
  for (int64_t cut : {3, 4, 5, 6, 127, 128, 129, 130, 258, 385}) {
    Req a{cat(S, toks(100 + uint32_t(cut), 40, e.V)), 2};
    run_together(e, {&a}, 512);
    Req b{cat(std::vector<int32_t>(S.begin(), S.begin() + cut), toks(200 + uint32_t(cut), 30, e.V)), 2};
    run_together(e, {&b}, 512);  // recomputes [0, cut), leaves a boundary at the branch point
    Req c{cat(std::vector<int32_t>(S.begin(), S.begin() + cut), toks(300 + uint32_t(cut), 25, e.V)), 3};
    run_together(e, {&c}, 97);
    EXPECT_EQ(c.h.cached_tokens, cut) << e.pc->radix().debug_string();
    std::vector<float> ref;
    std::vector<int32_t> ref_gen;
    cold(e, c.prompt, 3, &ref, &ref_gen);
    const int64_t from = c.h.cached_tokens;
    ASSERT_EQ(int64_t(c.logits.size()), (int64_t(c.prompt.size()) - from) * e.V);
    EXPECT_EQ(std::memcmp(c.logits.data(), ref.data() + from * e.V, c.logits.size() * sizeof(float)),
              0)
        << "hit at " << from << " is not bit-identical to cold";
    EXPECT_EQ(c.gen, ref_gen) << "cut " << cut;
  }
  auto st = e.pc->radix().stats();
  EXPECT_GT(st.hit_tokens, 0);
  EXPECT_GT(st.adopted_nodes, 0);
}

TEST(PrefixCache, BranchHitsAreBitIdentical) { branch_hits_are_bit_identical(KvDtype::kF32); }

// bf16 KV pools: the tree store holds bf16 rows too; hits stay bit-identical to cold runs.
TEST(PrefixCache, Bf16PoolsBranchHitsAreBitIdentical) {
  branch_hits_are_bit_identical(KvDtype::kBf16);
}

// fp8 KV pools: 608-byte-class rows (e4m3 + scales + bf16 rope) and fp8 indexer keys (codes +
// one scale + padding, kv_fp8_index_layout(index_dim).bytes) are
// copied as whole rows: hits stay bit-identical to cold runs.
TEST(PrefixCache, Fp8PoolsBranchHitsAreBitIdentical) {
  branch_hits_are_bit_identical(KvDtype::kFp8);
}

// bf16 KV pools with fp8 indexer keys (--index-cache-dtype fp8): the store holds 2-byte
// attention rows next to kFp8Index key rows; hits stay bit-identical to cold runs.
TEST(PrefixCache, Bf16PoolsFp8KeysBranchHitsAreBitIdentical) {
  branch_hits_are_bit_identical(KvDtype::kBf16, IndexCacheDtype::kFp8);
}

void eviction_under_pressure(KvDtype kv_dtype) {
  // A small tree store: 14 pages of 128 tokens for 4 concurrent requests of ~300-450 tokens
  // with shared prefixes, 3 waves. Evictions and tombstones must happen.
  Env e = make_env(14, 40, 10, 8, kv_dtype);
  ASSERT_TRUE(e.pc);
  const auto sys1 = toks(7, 200, e.V), sys2 = toks(8, 260, e.V);
  std::vector<Req> all;
  for (int wave = 0; wave < 3; ++wave)
    for (int i = 0; i < 4; ++i) {
      const auto& sys = (i % 2) ? sys1 : sys2;
      all.push_back(Req{cat(sys, toks(1000 + uint32_t(wave * 10 + i), 60 + 37 * i, e.V)), 5});
    }
  for (int wave = 0; wave < 3; ++wave) {
    std::vector<Req*> w;
    for (int i = 0; i < 4; ++i) w.push_back(&all[size_t(wave * 4 + i)]);
    run_together(e, w, 64);
  }
  int64_t hits = 0;
  for (auto& r : all) {
    std::vector<float> ref;
    std::vector<int32_t> ref_gen;
    cold(e, r.prompt, 5, &ref, &ref_gen);
    EXPECT_EQ(r.gen, ref_gen);
    hits += r.h.cached_tokens > 0;
  }
  auto st = e.pc->radix().stats();
  EXPECT_GT(hits, 0);
  EXPECT_GT(st.evicted_nodes + st.tombstoned_nodes, 0) << "no pressure: test proves nothing";
  std::printf("pressure: %lld hits of %zu, %lld evicted, %lld tombstoned, %lld adopted\n",
              (long long)hits, all.size(), (long long)st.evicted_nodes,
              (long long)st.tombstoned_nodes, (long long)st.adopted_nodes);
}

TEST(PrefixCache, EvictionUnderPressureKeepsGreedyTokens) {
  eviction_under_pressure(KvDtype::kF32);
}

TEST(PrefixCache, Bf16PoolsEvictionUnderPressureKeepsGreedyTokens) {
  eviction_under_pressure(KvDtype::kBf16);
}

TEST(PrefixCache, Fp8PoolsEvictionUnderPressureKeepsGreedyTokens) {
  eviction_under_pressure(KvDtype::kFp8);
}

TEST(PrefixCache, MultiTurnReusesWholeConversation) {
  Env e = make_env(64, 128, 32);
  ASSERT_TRUE(e.pc);
  std::vector<int32_t> convo = toks(50, 150, e.V);
  int64_t prev_computed = 0;
  for (int turn = 0; turn < 3; ++turn) {
    Req r{convo, 6};
    run_together(e, {&r}, 128);
    // Turn n+1 reuses everything turn n computed: its prompt and its reply (this driver feeds
    // every generated token back, so the reply is fully computed).
    EXPECT_EQ(r.h.cached_tokens, prev_computed) << "turn " << turn;
    convo.insert(convo.end(), r.gen.begin(), r.gen.end());
    prev_computed = int64_t(convo.size());
    auto user = toks(60 + uint32_t(turn), 20, e.V);
    convo.insert(convo.end(), user.begin(), user.end());
    // The continuation is still bit-identical to a cold run.
    std::vector<float> ref;
    std::vector<int32_t> ref_gen;
    cold(e, r.prompt, 6, &ref, &ref_gen);
    EXPECT_EQ(r.gen, ref_gen) << "turn " << turn;
  }
}

TEST(PrefixCache, SizedFromBudget) {
  Env e = make_env(8, 64, 8);
  ASSERT_TRUE(e.kv);
  const int64_t budget = int64_t(64) << 20;
  auto cfg = cache::PrefixCache::config_for_budget(*e.kv, budget);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto pc = cache::PrefixCache::create(*e.kv, *cfg);
  ASSERT_TRUE(pc.ok());
  EXPECT_LE((*pc)->store_bytes(), budget);
  EXPECT_GT((*pc)->store_bytes(), budget * 9 / 10);
  EXPECT_NE((*pc)->explain().find("prefix cache:"), std::string::npos);
  std::printf("%s\n", (*pc)->explain().c_str());
  auto tiny = cache::PrefixCache::config_for_budget(*e.kv, 1 << 16);
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("too small"), std::string::npos);
}

// Preemption by recompute: the preempted sequence is inserted; when the request comes back with
// prompt + generated tokens it resumes exactly where it stopped and continues the same tokens.
TEST(PrefixCache, PreemptedRequestResumesWhereItStopped) {
  Env e = make_env(64, 128, 32);
  ASSERT_TRUE(e.pc);
  const auto prompt = toks(70, 300, e.V);
  std::vector<float> ref;
  std::vector<int32_t> ref_gen;
  cold(e, prompt, 12, &ref, &ref_gen);
  Req a{prompt, 5};
  run_together(e, {&a}, 64);  // "preempted" after 5 fed tokens: 305 computed, inserted
  std::vector<int32_t> so_far = a.gen;
  so_far.push_back(argmax(a.last.data(), e.V));  // sampled, not yet fed
  Req b{cat(prompt, so_far), 6};
  run_together(e, {&b}, 64);
  EXPECT_EQ(b.h.cached_tokens, 305);
  so_far.insert(so_far.end(), b.gen.begin(), b.gen.end());
  EXPECT_EQ(so_far, ref_gen);
}

// Many branches over three system prompts under memory pressure: every output is correct and
// the hit rate stays high wave after wave (hot system prompts survive LRU eviction).
TEST(PrefixCache, ManyBranchesUnderPressureStableHitRate) {
  Env e = make_env(16, 48, 12);
  ASSERT_TRUE(e.pc);
  const std::vector<std::vector<int32_t>> sys = {toks(81, 150, e.V), toks(82, 190, e.V),
                                                 toks(83, 230, e.V)};
  std::vector<double> rate;
  for (int wave = 0; wave < 6; ++wave) {
    std::vector<Req> reqs;
    for (int i = 0; i < 4; ++i)
      reqs.push_back(Req{cat(sys[size_t((wave + i) % 3)], toks(900 + uint32_t(wave * 4 + i),
                                                               40 + 11 * i, e.V)),
                         3});
    std::vector<Req*> ptrs;
    for (auto& r : reqs) ptrs.push_back(&r);
    run_together(e, ptrs, 96);
    int64_t hit = 0, sys_tokens = 0;
    for (int i = 0; i < 4; ++i) {
      std::vector<float> ref;
      std::vector<int32_t> ref_gen;
      cold(e, reqs[size_t(i)].prompt, 3, &ref, &ref_gen);
      EXPECT_EQ(reqs[size_t(i)].gen, ref_gen) << "wave " << wave << " request " << i;
      hit += reqs[size_t(i)].h.cached_tokens;
      sys_tokens += int64_t(sys[size_t((wave + i) % 3)].size());
    }
    rate.push_back(double(hit) / double(sys_tokens));
  }
  auto st = e.pc->radix().stats();
  EXPECT_GT(st.evicted_nodes + st.tombstoned_nodes, 0) << "no pressure: test proves nothing";
  for (size_t w = 2; w < rate.size(); ++w)
    EXPECT_GE(rate[w], 0.5) << "wave " << w << " hit rate of the system prompts";
  std::printf("hit rate of system-prompt tokens per wave:");
  for (double r : rate) std::printf(" %.2f", r);
  std::printf("; evicted %lld, tombstoned %lld\n", (long long)st.evicted_nodes,
              (long long)st.tombstoned_nodes);
}

// A long hit must not need SWA pages for the whole prefix at once: admission reserves the
// prefix page by page. KvCache here has only 4 SWA pages of 128 tokens for a 1100-token hit.
TEST(PrefixCache, LongHitWithFewSwaPages) {
  Env e = make_env(64, 128, 16);
  ASSERT_TRUE(e.model);
  const auto p1 = toks(91, 1100, e.V);
  const auto p2 = cat(p1, toks(92, 30, e.V));
  std::vector<float> ref;
  std::vector<int32_t> ref_gen;
  cold(e, p2, 3, &ref, &ref_gen);  // reference on the default (large) KvCache
  cache::KvCacheOptions o;
  o.page_size = 128;
  o.n_pages = 40;
  o.n_swa_pages = 4;
  o.max_seqs = 2;
  auto kv = cache::KvCache::create(
      e.model->cache_spec(), o, [](size_t n) { return std::calloc(n, 1); },
      [](void* p) { std::free(p); });
  ASSERT_TRUE(kv.ok()) << kv.status().to_string();
  e.pc.reset();
  e.kv = std::move(kv).value();
  cache::ShadowRadixConfig c;
  c.page_tokens = 128;
  c.swa_page_tokens = 32;
  c.n_pages = 64;
  c.n_swa_pages = 128;
  c.n_snapshots = 16;
  e.pc = std::move(cache::PrefixCache::create(*e.kv, c).value());
  Req a{p1, 1};
  run_together(e, {&a}, 64);
  Req b{p2, 3};
  run_together(e, {&b}, 64);
  EXPECT_EQ(b.h.cached_tokens, 1100);  // a's prompt end is a boundary
  EXPECT_EQ(b.gen, ref_gen);
}

// A store too small for a request: it is detached (runs uncached, counted) and its tokens are
// still those of a cold run; nothing hangs, nothing is inserted.
TEST(PrefixCache, TooSmallStoreDetachesAndStillRuns) {
  Env e = make_env(3, 40, 4);
  ASSERT_TRUE(e.pc);
  const auto p = toks(95, 600, e.V);
  std::vector<float> ref;
  std::vector<int32_t> ref_gen;
  cold(e, p, 4, &ref, &ref_gen);
  Req a{p, 4};
  run_together(e, {&a}, 128);
  EXPECT_EQ(a.gen, ref_gen);
  EXPECT_EQ(e.pc->detached_total(), 1);
  EXPECT_EQ(e.pc->radix().stats().nodes, 0);
  EXPECT_EQ(e.pc->radix().stats().pages_used, 0);
}
