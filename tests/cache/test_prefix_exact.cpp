// Requirement 1 of cache.md with the real forward: a sequence that resumes at a cut point L from
// exactly the state a radix boundary keeps (compressed entries < L, the SWA window before L and a
// compressor-state snapshot taken at L) produces logits bit-identical to a cold prefill, for cut
// points of every residue mod 4 and around multiples of 128. Also: greedy decode after the hit
// equals cold greedy decode.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "cache/radix_kv.h"
#include "model/deepseek_v4.h"
#include "ops/ops.h"

using namespace v4;

namespace {

std::string fixture(const std::string& name) {
  return (std::filesystem::path(V4_SOURCE_DIR) / "tests" / "fixtures" / name).string();
}

struct Env {
  std::unique_ptr<ops::Ops> ops;
  std::unique_ptr<model::DeepseekV4> model;
  std::unique_ptr<cache::KvCache> kv;
  std::unique_ptr<cache::StateSnapshots> snaps;
  bool ok = false;
};

Env make_env(const std::string& dir, KvDtype kv_dtype = KvDtype::kF32,
             IndexCacheDtype index = IndexCacheDtype::kAuto) {
  Env e;
  e.ops = ops::make_cpu_ops();
  auto m = model::DeepseekV4::load(dir, e.ops.get());
  if (!m.ok()) {
    ADD_FAILURE() << m.status().to_string();
    return e;
  }
  e.model = std::move(m).value();
  auto kv = e.model->make_cache(int64_t(256) << 20, 8, 0, 0, kv_dtype, index);
  if (!kv.ok()) {
    ADD_FAILURE() << kv.status().to_string();
    return e;
  }
  e.kv = std::move(kv).value();
  auto sn = cache::StateSnapshots::create(*e.kv, 4);
  EXPECT_TRUE(sn.ok());
  e.snaps = std::move(sn).value();
  e.ok = true;
  return e;
}

// Feeds tokens[from, to) to `seq` in one chunk; returns logits of every new position.
std::vector<float> prefill(Env& e, int32_t seq, const std::vector<int32_t>& t, int64_t from,
                           int64_t to) {
  model::ForwardBatch b;
  b.slices.push_back({seq, from, std::vector<int32_t>(t.begin() + from, t.begin() + to), true});
  auto out = e.model->forward(b, *e.kv);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? out->logits : std::vector<float>{};
}

std::vector<int32_t> greedy(Env& e, int32_t seq, int64_t pos, std::vector<float> last, int n) {
  const int64_t V = e.model->config().vocab_size;
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t next =
        int32_t(std::max_element(last.end() - V, last.end()) - (last.end() - V));
    out.push_back(next);
    model::ForwardBatch b;
    b.slices.push_back({seq, pos++, {next}, false});
    auto o = e.model->forward(b, *e.kv);
    EXPECT_TRUE(o.ok());
    if (!o.ok()) break;
    last = o->logits;
  }
  return out;
}

void run_cuts(const std::string& name, int64_t T, const std::vector<int64_t>& cuts,
              KvDtype kv_dtype = KvDtype::kF32, IndexCacheDtype index = IndexCacheDtype::kAuto) {
  Env e = make_env(fixture(name), kv_dtype, index);
  ASSERT_TRUE(e.ok);
  const int64_t V = e.model->config().vocab_size;
  std::mt19937 g(42);
  std::vector<int32_t> prompt(static_cast<size_t>(T));
  for (auto& x : prompt) x = int32_t(g() % uint32_t(V));
  // Cold: one-shot prefill of the whole prompt, then greedy decode.
  auto cold_seq = e.kv->create_sequence();
  ASSERT_TRUE(cold_seq.ok());
  auto cold = prefill(e, *cold_seq, prompt, 0, T);
  ASSERT_EQ(int64_t(cold.size()), T * V);
  auto cold_gen = greedy(e, *cold_seq, T, cold, 6);
  e.kv->free_sequence(*cold_seq);
  for (int64_t L : cuts) {
    ASSERT_LT(L, T);
    // The request that left the boundary: prefilled [0, L), snapshot at L.
    auto a = e.kv->create_sequence();
    ASSERT_TRUE(a.ok());
    prefill(e, *a, prompt, 0, L);
    ASSERT_TRUE(e.snaps->save(*e.kv, *a, 0).ok());
    // The hit: a fresh sequence that gets only the boundary state, then computes [L, T).
    auto b = e.kv->create_sequence();
    ASSERT_TRUE(b.ok());
    ASSERT_TRUE(e.kv->reserve(*b, L).ok());
    Status st = cache::copy_prefix_state(*e.kv, *a, *b, L);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE(e.snaps->load(*e.kv, 0, *b).ok());
    e.kv->commit(*b, L);
    e.kv->free_sequence(*a);  // nothing of A is read any more
    auto warm = prefill(e, *b, prompt, L, T);
    ASSERT_EQ(int64_t(warm.size()), (T - L) * V);
    const bool same =
        std::memcmp(warm.data(), cold.data() + L * V, warm.size() * sizeof(float)) == 0;
    EXPECT_TRUE(same) << name << ": logits after a hit at " << L << " differ from cold";
    if (!same) {
      for (int64_t i = 0; i < int64_t(warm.size()); ++i)
        if (warm[size_t(i)] != cold[size_t(L * V + i)]) {
          ADD_FAILURE() << "first difference at position " << L + i / V << " vocab " << i % V
                        << ": " << warm[size_t(i)] << " vs " << cold[size_t(L * V + i)];
          break;
        }
    }
    EXPECT_EQ(greedy(e, *b, T, warm, 6), cold_gen) << name << ": greedy after a hit at " << L;
    e.kv->free_sequence(*b);
  }
}

}  // namespace

// ratios 4 and 128 (CSA with indexer top-k, HCA), window 128.
TEST(PrefixExact, RealRatesEveryResidueAndAround128) {
  run_cuts("tiny-real-rates", 560,
           {1, 2, 3, 4, 5, 6, 7, 126, 127, 128, 129, 130, 131, 255, 256, 257, 258, 383, 384,
            385, 386, 511, 512, 513, 514});
}

TEST(PrefixExact, KindsFixture) {
  run_cuts("tiny-kinds-fp32", 300, {1, 3, 4, 5, 6, 127, 128, 129, 130, 255, 256, 257, 258});
}

// bf16 KV pools (--kv-cache-dtype bf16): copying 2-byte rows must be as exact as f32 rows.
TEST(PrefixExact, Bf16PoolsRealRates) {
  run_cuts("tiny-real-rates", 560, {1, 3, 4, 5, 127, 128, 129, 130, 255, 256, 257, 385, 513},
           KvDtype::kBf16);
}

// fp8 KV pools (--kv-cache-dtype fp8): rows of two byte sizes (attention rows, fp8 indexer keys
// of kv_fp8_index_layout(index_dim).bytes).
TEST(PrefixExact, Fp8PoolsRealRates) {
  run_cuts("tiny-real-rates", 560, {1, 3, 4, 5, 127, 128, 129, 130, 255, 256, 257, 385, 513},
           KvDtype::kFp8);
}

TEST(PrefixExact, Fp8PoolsKindsFixture) {
  run_cuts("tiny-kinds-fp32", 300, {1, 4, 5, 127, 128, 129, 257}, KvDtype::kFp8);
}

// bf16 KV pools with fp8 indexer keys (--index-cache-dtype fp8): attention rows and key rows of
// different formats, copied as whole rows.
TEST(PrefixExact, Bf16PoolsFp8KeysRealRates) {
  run_cuts("tiny-real-rates", 560, {1, 3, 4, 5, 127, 128, 129, 130, 257, 385, 513},
           KvDtype::kBf16, IndexCacheDtype::kFp8);
}

TEST(PrefixExact, Bf16PoolsKindsFixture) {
  run_cuts("tiny-kinds-fp32", 300, {1, 4, 5, 127, 128, 129, 257}, KvDtype::kBf16);
}

// A snapshot taken at the wrong length must give different logits (the test can fail).
TEST(PrefixExact, WrongSnapshotIsDetected) {
  Env e = make_env(fixture("tiny-real-rates"));
  ASSERT_TRUE(e.ok);
  const int64_t V = e.model->config().vocab_size, T = 300, L = 130;
  std::mt19937 g(7);
  std::vector<int32_t> prompt(static_cast<size_t>(T));
  for (auto& x : prompt) x = int32_t(g() % uint32_t(V));
  auto c = e.kv->create_sequence();
  auto cold = prefill(e, *c, prompt, 0, T);
  e.kv->free_sequence(*c);
  auto a = e.kv->create_sequence();
  prefill(e, *a, prompt, 0, L - 1);
  ASSERT_TRUE(e.snaps->save(*e.kv, *a, 0).ok());  // one token early: stale ring
  prefill(e, *a, prompt, L - 1, L);
  auto b = e.kv->create_sequence();
  ASSERT_TRUE(e.kv->reserve(*b, L).ok());
  ASSERT_TRUE(cache::copy_prefix_state(*e.kv, *a, *b, L).ok());
  ASSERT_TRUE(e.snaps->load(*e.kv, 0, *b).ok());
  e.kv->commit(*b, L);
  auto warm = prefill(e, *b, prompt, L, T);
  EXPECT_NE(std::memcmp(warm.data(), cold.data() + L * V, warm.size() * sizeof(float)), 0);
}
