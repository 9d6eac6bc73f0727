// bf16 KV cache pools (--kv-cache-dtype bf16, cache::CacheSpec::kv_dtype) on the CPU backend:
//  - byte accounting halves for the KV pools (rings stay f32), the budget holds ~2× the pages;
//  - store_rows_kv / compress_fused store exactly f32_to_bf16 (round-to-nearest-even) of the
//    f32 row; attention and the indexer read a bf16 pool exactly as an f32 pool holding the
//    widened values (bit-identical outputs);
//  - a prefill stores, in layer 0 (whose inputs do not depend on earlier pool reads), exactly
//    the bf16 rounding of what the f32 path stores;
//  - the golden fixtures with bf16 pools: logits within kTolBf16 of the transformers oracle and
//    of the f32-pool run, greedy tokens agreeing at ≥ 90% of positions (these random tiny models
//    flip near-tied indexer top-k choices: see kTolBf16).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "base/dtype.h"
#include "cache/pools.h"
#include "compressor_cases.h"
#include "model/deepseek_v4.h"
#include "model_test_util.h"
#include "ops/ops.h"

namespace v4::model {
namespace {

using testing::fixture_dirs;
using testing::rel_err;

/// Logit tolerance (max|Δlogit| / max|logit|) of bf16 pools against the f32 oracle and f32 pools.
/// KV rows lose 8 mantissa bits (relative error ≤ 2^-9 per value), but the random tiny fixtures
/// are chaotic: a rounded indexer key flips near-tied top-k choices, which changes the attended
/// rows, so single logits move a lot. Measured on CPU (max over prefill / decode positions):
/// tiny-bf16 0.38 / 0.12, tiny-fp8-base 0.23 / 0.11, tiny-fp8-mxfp4 0.27 / 0.08, tiny-kinds-fp32
/// 0.06 / 0.16, tiny-real-rates 0.28 / 0.03, tiny-sigmoid 0.002 / 0.06 (the fixture whose
/// selections do not flip: plain rounding noise). Greedy agreement with the oracle over prefill +
/// decode positions: 172/182 (94.5%, tiny-bf16), 302/304, 318/324, 192/192, 1546/1560, 144/144.
/// Bounds: 0.5 as the CUDA bf16-mode golden test (test_cuda_golden.cpp; a broken row format gives
/// ≥ 1) and ≥ 90% greedy agreement (that test asks 95% of a different noise source).
constexpr double kTolBf16 = 0.5;
constexpr double kMinAgree = 0.90;

std::string fixture(const std::string& name) {
  return std::string(V4_SOURCE_DIR) + "/tests/fixtures/" + name;
}

std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

TEST(KvBf16, ParseNames) {
  KvDtype d = KvDtype::kBf16;
  EXPECT_TRUE(parse_kv_dtype("auto", &d));
  EXPECT_EQ(d, KvDtype::kF32);  // auto = f32 until bf16 is measured on the GPU
  EXPECT_TRUE(parse_kv_dtype("bf16", &d));
  EXPECT_EQ(d, KvDtype::kBf16);
  EXPECT_TRUE(parse_kv_dtype("f32", &d));
  EXPECT_EQ(d, KvDtype::kF32);
  EXPECT_FALSE(parse_kv_dtype("fp9", &d));
  EXPECT_EQ(kv_dtype_size(KvDtype::kBf16), 2);
  EXPECT_EQ(kv_dtype_size(KvDtype::kF32), 4);
}

TEST(KvBf16, PoolBytesHalveRingsStayF32) {
  auto ops = ops::make_cpu_ops();
  auto m = DeepseekV4::load(fixture("tiny-real-rates"), ops.get());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const auto f = (*m)->cache_spec(KvDtype::kF32), b = (*m)->cache_spec(KvDtype::kBf16);
  EXPECT_EQ(2 * cache::KvCache::virtual_page_bytes(b, 256),
            cache::KvCache::virtual_page_bytes(f, 256));
  EXPECT_EQ(2 * cache::KvCache::swa_page_bytes(b, 256), cache::KvCache::swa_page_bytes(f, 256));
  EXPECT_EQ(cache::KvCache::state_slot_bytes(b), cache::KvCache::state_slot_bytes(f));
  const auto tf = cache::KvCache::bytes_per_token(f), tb = cache::KvCache::bytes_per_token(b);
  ASSERT_EQ(tf.size(), tb.size());
  for (size_t i = 0; i < tf.size(); ++i) EXPECT_DOUBLE_EQ(2 * tb[i].second, tf[i].second);

  const int64_t budget = int64_t(64) << 20;
  auto kf = (*m)->make_cache(budget, 2, 256, 0, KvDtype::kF32);
  auto kb = (*m)->make_cache(budget, 2, 256, 0, KvDtype::kBf16);
  ASSERT_TRUE(kf.ok() && kb.ok());
  EXPECT_EQ((*kb)->kv_dtype(), KvDtype::kBf16);
  EXPECT_EQ((*kb)->kv_value_bytes(), 2);
  // The fixed state slots are f32 in both, so bf16 holds at least twice the pages.
  EXPECT_GE((*kb)->options().n_pages, 2 * (*kf)->options().n_pages);
  for (const auto& u : (*kb)->usage())
    if (u.name != "state_slots") {
      int64_t fu = 0;
      for (const auto& v : (*kf)->usage())
        if (v.name == u.name) fu = v.bytes_per_unit;
      EXPECT_EQ(2 * u.bytes_per_unit, fu) << u.name;
    }
  int n_kv = 0, n_ring = 0;
  for (const auto& buf : (*kb)->buffers()) {
    const bool ring = buf.name.find("ring") != std::string::npos;
    EXPECT_EQ(buf.dtype, ring ? KvDtype::kF32 : KvDtype::kBf16) << buf.name;
    (ring ? n_ring : n_kv)++;
  }
  EXPECT_GT(n_kv, 0);
  EXPECT_GT(n_ring, 0);
}

TEST(KvBf16, StoreRowsKvRoundsToNearestEven) {
  auto ops = ops::make_cpu_ops();
  const int64_t width = 8, pool_rows = 5;
  // Source row 0 → pool row 3: exact halfway cases (1 + 2^-8 → 1, 1 + 3·2^-8 → 1 + 2^-6: ties
  // to even), a denormal and a mix of magnitudes; source row 1 → row −1 (skipped).
  std::vector<float> src = {1.f + 0x1p-8f, 1.f + 3 * 0x1p-8f, -1.f - 0x1p-8f, 0x1p-130f,
                            3.14159265f,   -65504.5f,         1e-3f,          0.f};
  const auto r = random_floats(width, 5);
  src.insert(src.end(), r.begin(), r.end());
  const std::vector<int32_t> rows = {3, -1};
  std::vector<uint16_t> pool(size_t(pool_rows * width), 0xBEEF);
  ops->store_rows_kv(pool.data(), KvDtype::kBf16, rows.data(), 2, width, src.data());
  for (int64_t c = 0; c < width; ++c) EXPECT_EQ(pool[size_t(3 * width + c)], f32_to_bf16(src[size_t(c)]));
  EXPECT_EQ(f32_to_bf16(1.f + 0x1p-8f), 0x3f80);        // tie → even (down)
  EXPECT_EQ(f32_to_bf16(1.f + 3 * 0x1p-8f), 0x3f82);    // tie → even (up)
  for (int64_t i = 0; i < pool_rows * width; ++i) {
    if (i / width != 3) {
      EXPECT_EQ(pool[size_t(i)], 0xBEEF) << "row -1 or other rows written";
    }
  }
  // f32 pools through the same entry point: a plain copy.
  std::vector<float> fpool(size_t(pool_rows * width), -7.f);
  ops->store_rows_kv(fpool.data(), KvDtype::kF32, rows.data(), 2, width, src.data());
  EXPECT_EQ(std::memcmp(&fpool[size_t(3 * width)], src.data(), width * sizeof(float)), 0);
}

// Random pools: bf16 bits vs an f32 pool holding the widened values → bit-identical outputs.
TEST(KvBf16, AttentionAndIndexerReadBf16AsWidenedF32) {
  auto ops = ops::make_cpu_ops();
  const int S = 3, H = 4, hd = 64, nI = 4, dI = 32, topk = 5;
  const int64_t swa_rows = 40, comp_rows = 30;
  auto swa_f = random_floats(size_t(swa_rows * hd), 1), comp_f = random_floats(size_t(comp_rows * hd), 2);
  auto key_f = random_floats(size_t(comp_rows * dI), 3);
  std::vector<uint16_t> swa_b(swa_f.size()), comp_b(comp_f.size()), key_b(key_f.size());
  for (size_t i = 0; i < swa_f.size(); ++i) swa_f[i] = bf16_to_f32(swa_b[i] = f32_to_bf16(swa_f[i]));
  for (size_t i = 0; i < comp_f.size(); ++i)
    comp_f[i] = bf16_to_f32(comp_b[i] = f32_to_bf16(comp_f[i]));
  for (size_t i = 0; i < key_f.size(); ++i) key_f[i] = bf16_to_f32(key_b[i] = f32_to_bf16(key_f[i]));
  // Row maps: query t reads SWA rows {5t .. 5t+7} (one −1) and comp rows {0 .. 10+5t}.
  std::vector<int32_t> swa_rows_v, comp_rows_v;
  std::vector<int64_t> swa_off, comp_off;
  std::vector<int32_t> swa_cnt, comp_cnt;
  for (int t = 0; t < S; ++t) {
    swa_off.push_back(int64_t(swa_rows_v.size()));
    for (int j = 0; j < 8; ++j) swa_rows_v.push_back(j == 3 ? -1 : 5 * t + j);
    swa_cnt.push_back(8);
    comp_off.push_back(int64_t(comp_rows_v.size()));
    for (int j = 0; j < 11 + 5 * t; ++j) comp_rows_v.push_back(j);
    comp_cnt.push_back(11 + 5 * t);
  }
  const auto q = random_floats(size_t(S * H * hd), 4), sinks = random_floats(H, 5);
  std::vector<float> out_f(size_t(S * H * hd)), out_b(out_f.size(), 1.f);
  ops::AttentionArgs a;
  a.q = q.data();
  a.sinks = sinks.data();
  a.swa = {swa_rows_v.data(), swa_off.data(), swa_cnt.data()};
  a.comp = {comp_rows_v.data(), comp_off.data(), comp_cnt.data()};
  a.n_rows = S;
  a.n_heads = H;
  a.head_dim = hd;
  a.scale = 1.f / std::sqrt(float(hd));
  a.swa_pool = swa_f.data();
  a.comp_pool = comp_f.data();
  a.out = out_f.data();
  ops->sparse_attention(a);
  a.swa_pool = swa_b.data();
  a.comp_pool = comp_b.data();
  a.kv_dtype = KvDtype::kBf16;
  a.out = out_b.data();
  ops->sparse_attention(a);
  EXPECT_EQ(std::memcmp(out_f.data(), out_b.data(), out_f.size() * sizeof(float)), 0);

  const auto qi = random_floats(size_t(S * nI * dI), 6), wi = random_floats(size_t(S * nI), 7);
  std::vector<int32_t> rows_f(size_t(S * topk)), rows_b(rows_f.size(), 99), cnt_f(S), cnt_b(S, 99);
  ops::IndexerArgs ia;
  ia.q = qi.data();
  ia.weights = wi.data();
  ia.cand = a.comp;
  ia.n_rows = S;
  ia.n_heads = nI;
  ia.head_dim = dI;
  ia.topk = topk;
  ia.max_count = 21;
  ia.key_pool = key_f.data();
  ia.out_rows = rows_f.data();
  ia.out_count = cnt_f.data();
  ops->indexer_topk(ia);
  ia.key_pool = key_b.data();
  ia.key_dtype = KvDtype::kBf16;
  ia.out_rows = rows_b.data();
  ia.out_count = cnt_b.data();
  ops->indexer_topk(ia);
  EXPECT_EQ(rows_f, rows_b);
  EXPECT_EQ(cnt_f, cnt_b);
}

// compress_fused into a bf16 pool: each stored row is f32_to_bf16 of the f32 path's row; the
// rings (f32 in both) are identical.
TEST(KvBf16, CompressFusedStoresBf16Rounding) {
  auto ops = ops::make_cpu_ops();
  for (int c : {1, 2}) {
    SCOPED_TRACE(c);
    const int m = c == 2 ? 4 : 8, d = 64, rd = 16;
    auto k = v4::testing::prefill_case(m, c, d, rd, {{0, 0, 4 * m + 3}, {1, 5, 2 * m}}, 11 + c);
    ASSERT_GT(k.n_out(), 0);
    auto ring_kv_f = k.ring_kv, ring_gate_f = k.ring_gate;
    auto ring_kv_b = k.ring_kv, ring_gate_b = k.ring_gate;
    std::vector<float> pool_f(size_t(k.pool_rows * d), 0.f);
    std::vector<uint16_t> pool_b(pool_f.size(), 0);
    auto af = v4::testing::host_args(k, pool_f.data(), ring_kv_f.data(), ring_gate_f.data(),
                                     nullptr, 1e-6f, 1.f);
    ops->compress_fused(af);
    auto ab = v4::testing::host_args(k, nullptr, ring_kv_b.data(), ring_gate_b.data(), nullptr,
                                     1e-6f, 1.f);
    ab.pool = pool_b.data();
    ab.pool_dtype = KvDtype::kBf16;
    ops->compress_fused(ab);
    for (size_t i = 0; i < pool_f.size(); ++i)
      ASSERT_EQ(pool_b[i], f32_to_bf16(pool_f[i])) << "value " << i;
    EXPECT_EQ(ring_kv_f, ring_kv_b);
    EXPECT_EQ(ring_gate_f, ring_gate_b);
  }
}

// Layer 0 reads no pool before it stores (its input is the embedding), so its SWA rows,
// compressed rows and indexer keys with bf16 pools are exactly the bf16 rounding of the f32 run's.
TEST(KvBf16, Layer0PoolRowsAreBf16RoundingOfF32Rows) {
  for (const char* name : {"tiny-bf16", "tiny-sigmoid", "tiny-real-rates"}) {
    SCOPED_TRACE(name);
    auto ops = ops::make_cpu_ops();
    auto m = DeepseekV4::load(fixture(name), ops.get());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const auto& cfg = (*m)->config();
    auto kf = (*m)->make_cache(int64_t(32) << 20, 1, 0, 0, KvDtype::kF32);
    auto kb = (*m)->make_cache(int64_t(32) << 20, 1, 0, 0, KvDtype::kBf16);
    ASSERT_TRUE(kf.ok() && kb.ok());
    std::mt19937 g(3);
    std::vector<int32_t> prompt(300);
    for (auto& t : prompt) t = int32_t(g() % uint32_t(cfg.vocab_size));
    int32_t sf = *(*kf)->create_sequence(), sb = *(*kb)->create_sequence();
    for (auto [kv, s] : {std::pair{kf->get(), sf}, std::pair{kb->get(), sb}}) {
      ForwardBatch b;
      b.slices.push_back({s, 0, prompt, false});
      ASSERT_TRUE((*m)->forward(b, *kv).ok());
    }
    const auto& L = (*kf)->spec().layers[0];
    const int64_t T = int64_t(prompt.size()), W = (*kf)->spec().sliding_window;
    int64_t checked = 0;
    auto check = [&](const void* pf, int64_t rf, const void* pb, int64_t rb, int64_t dim,
                     const char* what, int64_t idx) {
      const float* f = static_cast<const float*>(pf) + rf * dim;
      const uint16_t* bb = static_cast<const uint16_t*>(pb) + rb * dim;
      for (int64_t i = 0; i < dim; ++i)
        ASSERT_EQ(bb[i], f32_to_bf16(f[i])) << what << " " << idx << " channel " << i;
      ++checked;
    };
    for (int64_t p = std::max<int64_t>(0, T - (W - 1)); p < T; ++p)
      check((*kf)->swa_pool(0), (*kf)->swa_row(sf, p), (*kb)->swa_pool(0), (*kb)->swa_row(sb, p),
            L.kv_dim, "SWA position", p);
    if (L.kind != cache::AttnKind::kSliding)
      for (int64_t e = 0; e < T / L.ratio; ++e) {
        check((*kf)->comp_pool(0), (*kf)->compressed_row(sf, e, L.ratio), (*kb)->comp_pool(0),
              (*kb)->compressed_row(sb, e, L.ratio), L.kv_dim, "compressed entry", e);
        if (L.kind == cache::AttnKind::kCsa)
          check((*kf)->index_pool(0), (*kf)->compressed_row(sf, e, L.ratio),
                (*kb)->index_pool(0), (*kb)->compressed_row(sb, e, L.ratio), L.index_dim,
                "indexer key", e);
      }
    EXPECT_GT(checked, W - 2);
  }
}

// The transformers oracle fixtures with bf16 pools: prefill and teacher-forced decode logits
// within kTolBf16 of the oracle and of the f32-pool run; greedy tokens equal.
TEST(KvBf16, GoldenFixturesWithBf16Pools) {
  for (const auto& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    auto ops = ops::make_cpu_ops();
    auto m = DeepseekV4::load(dir, ops.get());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    auto g = testing::load_golden(dir);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    const int64_t V = (*m)->config().vocab_size;
    std::vector<float> pf, df, pb, db;
    ASSERT_TRUE(testing::golden_logits(**m, *g, KvDtype::kF32, &pf, &df).ok());
    ASSERT_TRUE(testing::golden_logits(**m, *g, KvDtype::kBf16, &pb, &db).ok());
    ASSERT_EQ(pb.size(), g->prefill_logits.size());
    ASSERT_EQ(db.size(), g->decode_logits.size());
    const double e_oracle = rel_err(pb.data(), g->prefill_logits.data(), pb.size());
    const double e_f32 = rel_err(pb.data(), pf.data(), pb.size());
    EXPECT_LE(e_oracle, kTolBf16);
    EXPECT_LE(e_f32, kTolBf16);
    EXPECT_GT(e_f32, 0.0) << "bf16 pools gave the f32 logits bit for bit: rows not rounded?";
    // The f32-pool run is the reference path itself (Golden.* holds it to 1e-4 of the oracle).
    EXPECT_LE(rel_err(pf.data(), g->prefill_logits.data(), pf.size()), 1e-4);
    const int64_t T = int64_t(g->prompt_ids.size()), N = int64_t(g->tokens.size());
    int64_t same = 0;
    for (int64_t t = 0; t < T; ++t)
      same += testing::argmax(&pb[size_t(t * V)], V) ==
              testing::argmax(&g->prefill_logits[size_t(t * V)], V);
    double worst_oracle = 0, worst_f32 = 0;
    for (int64_t i = 0; i < N; ++i) {
      const float* lb = &db[size_t(i * V)];
      worst_oracle = std::max(worst_oracle, rel_err(lb, &g->decode_logits[size_t(i * V)], size_t(V)));
      worst_f32 = std::max(worst_f32, rel_err(lb, &df[size_t(i * V)], size_t(V)));
      same += testing::argmax(lb, V) == g->tokens[size_t(i)];
    }
    EXPECT_LE(worst_oracle, kTolBf16);
    EXPECT_LE(worst_f32, kTolBf16);
    EXPECT_GE(double(same), kMinAgree * double(T + N)) << "greedy agreement with the oracle";
    std::printf("[kv-bf16] %s prefill rel_err vs oracle %.3g vs f32 pools %.3g; decode worst %.3g "
                "/ %.3g; greedy equal %lld/%lld\n",
                dir.c_str(), e_oracle, e_f32, worst_oracle, worst_f32, (long long)same,
                (long long)(T + N));
  }
}

}  // namespace
}  // namespace v4::model
