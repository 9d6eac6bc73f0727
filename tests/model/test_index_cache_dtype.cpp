// --index-cache-dtype (IndexCacheDtype): fp8 indexer keys (KvDtype::kFp8Index) next to f32 / bf16
// KV pools, on the CPU backend:
//  - parsing and the resolved element type (kv_index_dtype(kv, index));
//  - pool sizing: index_row_bytes / index_dtype() of CacheSpec and KvCache, page bytes, buffers;
//  - layer 0 of a prefill: attention rows equal the auto run's bit for bit, indexer keys are
//    quantize_index_row of the f32 run's keys;
//  - the golden fixtures with f32 KV + fp8 keys: logits differ from the f32 run (the keys really
//    are quantized) and stay within the fp8 KV bounds (test_kv_fp8.cpp);
//  - decode_step_bytes counts the fp8 key rows;
//  - the CLI: accepted by generate / bench (logs and report name the key type), bad values and
//    shapes fp8 keys cannot hold refused with one line naming the option.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>

#include "base/dtype.h"
#include "base/kv_fp8.h"
#include "cache/pools.h"
#include "model/deepseek_v4.h"
#include "model/step_cost.h"
#include "model_test_util.h"
#include "ops/ops.h"
#include "../shell_run.h"

using v4::testing::run_command;

namespace v4::model {
namespace {

using testing::fixture_dirs;
using testing::rel_err;

std::string fixture(const std::string& name) {
  return std::string(V4_SOURCE_DIR) + "/tests/fixtures/" + name;
}


// A temporary directory holding tiny-kinds-fp32's config.json with index_head_dim = `dI`.
std::string config_with_index_dim(int dI) {
  std::ifstream in(fixture("tiny-kinds-fp32") + "/config.json");
  EXPECT_TRUE(in.good());
  auto j = nlohmann::json::parse(in);
  j["index_head_dim"] = dI;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("v4-idx" + std::to_string(dI) + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << j.dump();
  return dir.string();
}

TEST(IndexCacheDtype, ParseAndResolve) {
  IndexCacheDtype i = IndexCacheDtype::kFp8;
  EXPECT_TRUE(parse_index_cache_dtype("auto", &i));
  EXPECT_EQ(i, IndexCacheDtype::kAuto);
  EXPECT_TRUE(parse_index_cache_dtype("fp8", &i));
  EXPECT_EQ(i, IndexCacheDtype::kFp8);
  for (const char* bad : {"bogus", "", "bf16", "f32", "fp8_index", "FP8"})
    EXPECT_FALSE(parse_index_cache_dtype(bad, &i)) << bad;
  EXPECT_STREQ(index_cache_dtype_name(IndexCacheDtype::kAuto), "auto");
  EXPECT_STREQ(index_cache_dtype_name(IndexCacheDtype::kFp8), "fp8");
  // auto: today's rule; fp8: kFp8Index whatever the KV dtype.
  for (KvDtype kv : {KvDtype::kF32, KvDtype::kBf16, KvDtype::kFp8}) {
    EXPECT_EQ(kv_index_dtype(kv, IndexCacheDtype::kAuto), kv_index_dtype(kv));
    EXPECT_EQ(kv_index_dtype(kv, IndexCacheDtype::kFp8), KvDtype::kFp8Index);
  }
}

// A V4-shaped table (hd 512, rope 64, dI 128): fp8 keys are 144-byte rows with f32 and bf16 KV
// pools alike; attention rows, SWA pages and the compressor state do not change.
TEST(IndexCacheDtype, PoolSizing) {
  cache::CacheSpec s;
  s.rope_dim = 64;
  s.layers = {{cache::AttnKind::kSliding, 0, 512, 0},
              {cache::AttnKind::kCsa, 4, 512, 128},
              {cache::AttnKind::kHca, 128, 512, 0}};
  const auto& csa = s.layers[1];
  ASSERT_EQ(kv_row_bytes(KvDtype::kFp8Index, 128, 0), 144);
  for (KvDtype kv : {KvDtype::kF32, KvDtype::kBf16}) {
    SCOPED_TRACE(kv_dtype_name(kv));
    cache::CacheSpec a = s, q = s;
    a.kv_dtype = q.kv_dtype = kv;
    q.index_cache_dtype = IndexCacheDtype::kFp8;
    EXPECT_EQ(a.index_dtype(), kv);
    EXPECT_EQ(a.index_row_bytes(csa), 128 * kv_dtype_size(kv));
    EXPECT_EQ(q.index_dtype(), KvDtype::kFp8Index);
    EXPECT_EQ(q.index_row_bytes(csa), kv_row_bytes(KvDtype::kFp8Index, 128, 0));
    EXPECT_EQ(q.index_row_bytes(csa), 144);
    for (const auto& l : s.layers) EXPECT_EQ(q.attn_row_bytes(l), a.attn_row_bytes(l));
    EXPECT_EQ(cache::KvCache::swa_page_bytes(q, 256), cache::KvCache::swa_page_bytes(a, 256));
    EXPECT_EQ(cache::KvCache::virtual_page_bytes(a, 256) - cache::KvCache::virtual_page_bytes(q, 256),
              256 / 4 * (128 * kv_dtype_size(kv) - 144));
    EXPECT_EQ(cache::KvCache::state_slot_bytes(q), cache::KvCache::state_slot_bytes(a));
    for (const auto& [pool, b] : cache::KvCache::bytes_per_token(q))
      if (pool == "c4_index") {
        EXPECT_DOUBLE_EQ(b, 144.0 / 4);
      }

    // The pools themselves: the indexer-key buffer is kFp8Index of 144-byte rows, the rest as
    // the KV dtype.
    const cache::KvCacheOptions opt{256, 3, 2, 2};
    auto kv_r = cache::KvCache::create(
        q, opt, [](size_t n) { return std::calloc(n, 1); }, [](void* p) { std::free(p); });
    ASSERT_TRUE(kv_r.ok()) << kv_r.status().to_string();
    const auto& c = **kv_r;
    EXPECT_EQ(c.kv_dtype(), kv);
    EXPECT_EQ(c.index_dtype(), KvDtype::kFp8Index);
    EXPECT_EQ(c.index_row_bytes(1), 144);
    EXPECT_EQ(c.attn_row_bytes(1), a.attn_row_bytes(csa));
    int seen = 0;
    for (const auto& buf : c.buffers()) {
      if (buf.name.find("ring") != std::string::npos) {
        EXPECT_EQ(buf.dtype, KvDtype::kF32) << buf.name;
      } else if (buf.name == "c4_index") {
        EXPECT_EQ(buf.dtype, KvDtype::kFp8Index);
        EXPECT_EQ(buf.values, opt.n_pages * 256 / 4 * 144);  // one "value" per byte
        ++seen;
      } else {
        EXPECT_EQ(buf.dtype, kv) << buf.name;
      }
    }
    EXPECT_EQ(seen, 1);
  }
  // fp8 KV pools already have fp8 keys: the option changes nothing.
  cache::CacheSpec a = s, q = s;
  a.kv_dtype = q.kv_dtype = KvDtype::kFp8;
  q.index_cache_dtype = IndexCacheDtype::kFp8;
  EXPECT_EQ(q.index_dtype(), a.index_dtype());
  EXPECT_EQ(cache::KvCache::virtual_page_bytes(q, 256), cache::KvCache::virtual_page_bytes(a, 256));
}

// DeepseekV4::cache_spec / make_cache carry the option into the pools.
TEST(IndexCacheDtype, ModelCacheCarriesTheOption) {
  auto ops = ops::make_cpu_ops();
  auto m = DeepseekV4::load(fixture("tiny-real-rates"), ops.get());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->cache_spec(KvDtype::kBf16).index_dtype(), KvDtype::kBf16);
  EXPECT_EQ((*m)->cache_spec(KvDtype::kBf16, IndexCacheDtype::kFp8).index_dtype(),
            KvDtype::kFp8Index);
  for (KvDtype kv : {KvDtype::kF32, KvDtype::kBf16}) {
    auto c = (*m)->make_cache(int64_t(32) << 20, 2, 256, 0, kv, IndexCacheDtype::kFp8);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ((*c)->kv_dtype(), kv);
    EXPECT_EQ((*c)->index_dtype(), KvDtype::kFp8Index);
    const int dI = (*m)->config().index_head_dim;
    for (int l = 0; l < int((*c)->spec().layers.size()); ++l)
      if ((*c)->spec().layers[size_t(l)].kind == cache::AttnKind::kCsa) {
        EXPECT_EQ((*c)->index_row_bytes(l), kv_row_bytes(KvDtype::kFp8Index, dI, 0));
      }
    auto d = (*m)->make_cache(int64_t(32) << 20, 2, 256, 0, kv);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ((*d)->index_dtype(), kv);
  }
}

// Layer 0 reads no pool before it stores: with fp8 keys its attention rows equal the auto run's
// bit for bit (same KV dtype) and its indexer keys are quantize_index_row of the f32 run's keys.
TEST(IndexCacheDtype, Layer0RowsWithFp8Keys) {
  for (const char* name : {"tiny-bf16", "tiny-real-rates"}) {
    SCOPED_TRACE(name);
    auto ops = ops::make_cpu_ops();
    auto m = DeepseekV4::load(fixture(name), ops.get());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const auto& cfg = (*m)->config();
    std::mt19937 g(5);
    std::vector<int32_t> prompt(300);
    for (auto& t : prompt) t = int32_t(g() % uint32_t(cfg.vocab_size));
    struct Run {
      std::unique_ptr<cache::KvCache> kv;
      int32_t seq = -1;
    };
    auto run_one = [&](KvDtype kv, IndexCacheDtype idx) {
      Run r;
      auto c = (*m)->make_cache(int64_t(32) << 20, 1, 0, 0, kv, idx);
      EXPECT_TRUE(c.ok()) << c.status().to_string();
      if (!c.ok()) return r;
      r.kv = std::move(c).value();
      r.seq = *r.kv->create_sequence();
      ForwardBatch b;
      b.slices.push_back({r.seq, 0, prompt, false});
      EXPECT_TRUE((*m)->forward(b, *r.kv).ok());
      return r;
    };
    const Run f32 = run_one(KvDtype::kF32, IndexCacheDtype::kAuto);
    const Run f32q = run_one(KvDtype::kF32, IndexCacheDtype::kFp8);
    const Run b16 = run_one(KvDtype::kBf16, IndexCacheDtype::kAuto);
    const Run b16q = run_one(KvDtype::kBf16, IndexCacheDtype::kFp8);
    ASSERT_TRUE(f32.kv && f32q.kv && b16.kv && b16q.kv);
    const auto& L = f32.kv->spec().layers[0];
    ASSERT_EQ(L.kind, cache::AttnKind::kCsa) << "layer 0 must have an indexer for this test";
    const int64_t T = int64_t(prompt.size()), W = f32.kv->spec().sliding_window;
    const KvFp8IndexLayout I = kv_fp8_index_layout(L.index_dim);
    std::vector<uint8_t> want(static_cast<size_t>(I.bytes));
    int64_t keys = 0, rows = 0;
    for (const auto* pair : {&f32, &b16}) {
      const Run& a = *pair;
      const Run& q = pair == &f32 ? f32q : b16q;
      const int64_t rb = a.kv->attn_row_bytes(0);
      ASSERT_EQ(q.kv->attn_row_bytes(0), rb);
      auto same = [&](const void* pa, int64_t ra, const void* pq, int64_t rq) {
        return std::memcmp(static_cast<const uint8_t*>(pa) + ra * rb,
                           static_cast<const uint8_t*>(pq) + rq * rb, size_t(rb)) == 0;
      };
      for (int64_t p = std::max<int64_t>(0, T - (W - 1)); p < T; ++p, ++rows)
        ASSERT_TRUE(same(a.kv->swa_pool(0), a.kv->swa_row(a.seq, p), q.kv->swa_pool(0),
                         q.kv->swa_row(q.seq, p)))
            << kv_dtype_name(a.kv->kv_dtype()) << " SWA position " << p;
      for (int64_t e = 0; e < T / L.ratio; ++e, ++rows) {
        ASSERT_TRUE(same(a.kv->comp_pool(0), a.kv->compressed_row(a.seq, e, L.ratio),
                         q.kv->comp_pool(0), q.kv->compressed_row(q.seq, e, L.ratio)))
            << kv_dtype_name(a.kv->kv_dtype()) << " compressed entry " << e;
        const float* fk = static_cast<const float*>(f32.kv->index_pool(0)) +
                          int64_t(f32.kv->compressed_row(f32.seq, e, L.ratio)) * L.index_dim;
        const uint8_t* qk = static_cast<const uint8_t*>(q.kv->index_pool(0)) +
                            int64_t(q.kv->compressed_row(q.seq, e, L.ratio)) * I.bytes;
        kvfp8::quantize_index_row(fk, I, want.data());
        ASSERT_EQ(std::memcmp(qk, want.data(), size_t(I.bytes)), 0)
            << kv_dtype_name(a.kv->kv_dtype()) << " KV: indexer key " << e;
        // The f32 key is not representable exactly in e4m3 (the keys really are quantized).
        std::vector<float> back(static_cast<size_t>(L.index_dim));
        kvfp8::dequantize_index_row(qk, I, back.data());
        keys += std::memcmp(back.data(), fk, back.size() * sizeof(float)) != 0;
      }
    }
    EXPECT_GT(rows, W);
    EXPECT_GT(keys, 0) << "no fp8 key differs from its f32 value";
  }
}

/// Bounds: those of fp8 KV pools (kTolFp8, kMinAgreeFp8 in test_kv_fp8.cpp), whose indexer runs
/// the same fp8 keys and per-head quantized q. Only the indexer's top-k picks change (near-tied
/// picks flip on the chaotic tiny fixtures), so single logits still move a lot. Measured on CPU
/// (max|Δlogit|/max|logit| vs the f32-pool run, prefill / worst decode step; greedy agreement
/// with the oracle over prefill + decode positions; the [idx-fp8] lines): tiny-bf16 0.54 / 0.93,
/// 162/182 (89.0%, the lowest); tiny-fp8-base 0.35 / 0.32, 278/304; tiny-fp8-mxfp4 0.35 / 0.54,
/// 306/324; tiny-kinds-fp32 0.34 / 0.21, 177/192; tiny-real-rates 0.42 / 0.30, 1516/1560;
/// tiny-sigmoid 0.20 / 0.16, 141/144.
constexpr double kTolIdxFp8 = 1.0;
constexpr double kMinAgreeIdxFp8 = 0.85;

// f32 KV + fp8 keys against f32 KV: the logits move (the indexer picks from quantized keys) but
// stay within the fp8 bounds; greedy tokens mostly agree with the oracle.
TEST(IndexCacheDtype, GoldenFixturesF32KvFp8Keys) {
  int differ = 0, n = 0;
  for (const auto& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    auto ops = ops::make_cpu_ops();
    auto m = DeepseekV4::load(dir, ops.get());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    auto g = testing::load_golden(dir);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    const int64_t V = (*m)->config().vocab_size;
    std::vector<float> pf, df, pq, dq;
    ASSERT_TRUE(testing::golden_logits(**m, *g, KvDtype::kF32, &pf, &df).ok());
    ASSERT_TRUE(
        testing::golden_logits(**m, *g, KvDtype::kF32, &pq, &dq, IndexCacheDtype::kFp8).ok());
    ASSERT_EQ(pq.size(), pf.size());
    ASSERT_EQ(dq.size(), df.size());
    for (float v : pq) ASSERT_TRUE(std::isfinite(v));
    for (float v : dq) ASSERT_TRUE(std::isfinite(v));
    const double e_f32 = rel_err(pq.data(), pf.data(), pq.size());
    const double e_oracle = rel_err(pq.data(), g->prefill_logits.data(), pq.size());
    EXPECT_LE(e_f32, kTolIdxFp8);
    EXPECT_LE(e_oracle, kTolIdxFp8);
    const int64_t T = int64_t(g->prompt_ids.size()), N = int64_t(g->tokens.size());
    int64_t same = 0;
    for (int64_t t = 0; t < T; ++t)
      same += testing::argmax(&pq[size_t(t * V)], V) ==
              testing::argmax(&g->prefill_logits[size_t(t * V)], V);
    double worst_f32 = 0;
    for (int64_t i = 0; i < N; ++i) {
      const float* lq = &dq[size_t(i * V)];
      worst_f32 = std::max(worst_f32, rel_err(lq, &df[size_t(i * V)], size_t(V)));
      same += testing::argmax(lq, V) == g->tokens[size_t(i)];
    }
    EXPECT_LE(worst_f32, kTolIdxFp8);
    EXPECT_GE(double(same), kMinAgreeIdxFp8 * double(T + N)) << "greedy agreement with the oracle";
    differ += e_f32 > 0 || worst_f32 > 0;
    ++n;
    std::printf("[idx-fp8] %s prefill rel_err vs f32 pools %.3g vs oracle %.3g; decode worst vs "
                "f32 %.3g; greedy equal %lld/%lld\n",
                dir.c_str(), e_f32, e_oracle, worst_f32, (long long)same, (long long)(T + N));
  }
  ASSERT_GT(n, 0);
  EXPECT_EQ(differ, n) << "fp8 keys gave the f32 logits bit for bit: keys not quantized?";
}

// The byte floor counts kFp8Index key rows: with dI 128 a key is 144 bytes instead of bf16's 256,
// so a long-context decode step reads fewer bytes; with fp8 KV the option changes nothing.
TEST(IndexCacheDtype, DecodeStepBytesCountFp8Keys) {
  const std::string dir = config_with_index_dim(128);
  auto ops = ops::make_cpu_ops();
  auto m = DeepseekV4::load_dummy(dir, ops.get());
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const auto& c = (*m)->config();
  const auto& w = (*m)->weights();
  ASSERT_EQ(c.index_head_dim, 128);
  const int64_t B = 2, L = 100000;
  int64_t n_csa = 0;
  for (LayerKind k : c.layer_types) n_csa += k == LayerKind::kCsa;
  ASSERT_GT(n_csa, 0);
  const int64_t keys = (L + 1) / c.compress_rate_csa;
  for (KvDtype kv : {KvDtype::kBf16, KvDtype::kF32}) {
    SCOPED_TRACE(kv_dtype_name(kv));
    const DecodeBytes a = decode_step_bytes(c, w, B, L, kv);
    const DecodeBytes q = decode_step_bytes(c, w, B, L, kv, IndexCacheDtype::kFp8);
    EXPECT_LT(q.kv, a.kv);
    EXPECT_LT(q.total(), a.total());
    EXPECT_DOUBLE_EQ(a.kv - q.kv, double(B * n_csa * keys * (128 * kv_dtype_size(kv) - 144)));
    EXPECT_DOUBLE_EQ(q.dense, a.dense);
    EXPECT_EQ(decode_step_bytes(c, w, B, L, kv, IndexCacheDtype::kAuto).kv, a.kv);
  }
  EXPECT_DOUBLE_EQ(decode_step_bytes(c, w, B, L, KvDtype::kFp8, IndexCacheDtype::kFp8).kv,
                   decode_step_bytes(c, w, B, L, KvDtype::kFp8).kv);
}

// generate accepts --index-cache-dtype fp8 with bf16 and f32 KV and logs the key type; serve,
// generate and bench refuse a bad value with one line naming the option.
TEST(IndexCacheDtype, CliAcceptsFp8AndRefusesBadValues) {
  const std::string bin = V4_BINARY, dir = fixture("tiny-kinds-fp32");
  for (const char* kv : {"bf16", "f32"}) {
    auto [rc, out] = run_command(bin + " generate --model " + dir +
                         " --prompt-ids 1,2,3,4,5,6,7,8,9 --max-new-tokens 2 --ignore-eos "
                         "--threads 2 --kv-budget-mb 64 --kv-cache-dtype " +
                         kv + " --index-cache-dtype fp8");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find(std::string("KV cache ") + kv + ", indexer keys fp8"),
              std::string::npos)
        << out;
  }
  auto [rc, out] = run_command(bin + " generate --model " + dir +
                       " --prompt-ids 1,2,3 --max-new-tokens 1 --threads 2 --kv-budget-mb 64 "
                       "--kv-cache-dtype bf16");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("KV cache bf16, indexer keys bf16"), std::string::npos) << out;
  for (const char* cmd : {"serve", "generate", "bench"}) {
    std::tie(rc, out) =
        run_command(bin + " " + cmd + " --model " + dir + " --index-cache-dtype bogus");
    EXPECT_NE(rc, 0) << cmd << ": " << out;
    EXPECT_NE(out.find("--index-cache-dtype: bogus not in {auto,fp8}"), std::string::npos)
        << cmd << ": " << out;
    std::stringstream ss(out);
    std::string line;
    int lines = 0;
    while (std::getline(ss, line))
      lines += !line.empty() && line.rfind("Run with --help", 0) != 0;
    EXPECT_EQ(lines, 1) << cmd << ": " << out;
  }
}

// index_head_dim 24 cannot be stored as kFp8Index rows (n % 16): generate refuses
// --index-cache-dtype fp8 before any weight is generated, info says n/a; auto still runs.
TEST(IndexCacheDtype, CliRefusesShapesFp8KeysCannotHold) {
  const std::string bin = V4_BINARY, d = config_with_index_dim(24);
  auto [rc, out] = run_command(bin + " generate --model " + d +
                       " --load-format dummy --kv-cache-dtype bf16 --index-cache-dtype fp8 "
                       "--prompt-ids 1,2,3 --max-new-tokens 1");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("--index-cache-dtype fp8: fp8 indexer keys need index_head_dim % 16 == 0, "
                     "got 24"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("generating dummy weights"), std::string::npos) << "refused after loading:\n"
                                                                     << out;
  std::tie(rc, out) = run_command(bin + " info --model " + d + " --load-format dummy");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("--index-cache-dtype fp8: n/a for this model"), std::string::npos) << out;
  std::tie(rc, out) = run_command(bin + " generate --model " + d +
                          " --load-format dummy --kv-cache-dtype bf16 --index-cache-dtype auto "
                          "--prompt-ids 1,2,3 --max-new-tokens 1");
  EXPECT_EQ(rc, 0) << out;
  std::filesystem::remove_all(d);
}

// The index_head_dim % 16 condition applies only where an indexer stores keys: a model without
// CSA layers takes fp8 keys (and fp8 KV pools) at any index_head_dim; with one CSA layer it is
// refused, naming the field. Log names: kFp8Index keys print as "fp8", the value users pass.
TEST(IndexCacheDtype, Fp8KeyShapeCheckOnlyWithAnIndexer) {
  const std::string d = config_with_index_dim(24);
  auto cfg = model::ModelConfig::load_path(d);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  model::ModelConfig c = std::move(cfg).value();
  ASSERT_NE(std::find(c.layer_types.begin(), c.layer_types.end(), model::LayerKind::kCsa),
            c.layer_types.end()) << "fixture needs a CSA layer";
  EXPECT_FALSE(c.check_index_cache_dtype(IndexCacheDtype::kFp8).ok());
  EXPECT_NE(c.check_index_cache_dtype(IndexCacheDtype::kFp8).message().find("index_head_dim"),
            std::string::npos);
  EXPECT_TRUE(c.check_index_cache_dtype(IndexCacheDtype::kAuto).ok());
  for (auto& k : c.layer_types)
    if (k == model::LayerKind::kCsa) k = model::LayerKind::kHca;
  EXPECT_TRUE(c.check_index_cache_dtype(IndexCacheDtype::kFp8).ok());
  if (c.rope_main.rope_dim == c.rope_compress.rope_dim) {
    EXPECT_TRUE(c.check_kv_dtype(KvDtype::kFp8).ok());
  }
  std::filesystem::remove_all(d);
  EXPECT_STREQ(index_key_dtype_name(KvDtype::kFp8Index), "fp8");
  EXPECT_STREQ(index_key_dtype_name(KvDtype::kBf16), "bf16");
}

// bench names fp8 keys in the report's header (the KV cache line and the KV pools line) and
// runs the decode cell through them.
TEST(IndexCacheDtype, BenchReportNamesFp8Keys) {
  auto report = [](const std::string& index) {
    const auto r = v4::testing::run_bench_report(
        V4_BINARY,
        std::string("--model ") + V4_SOURCE_DIR +
            "/tests/fixtures/tiny-kinds-fp32 --load-format dummy --batch 1 --context 256 "
            "--steps 1 --warmup 0 --prefill-steps 1 --prefill-warmup 0 --prefill-chunk 64 "
            "--threads 2 --kv-cache-bytes 33554432 --kv-cache-dtype bf16 --index-cache-dtype " +
            index,
        "idx-" + index);
    EXPECT_EQ(r.rc, 0) << r.out;
    return r.report;
  };
  const std::string q = report("fp8"), a = report("auto");
  EXPECT_NE(q.find("KV cache bf16 (indexer keys fp8)"), std::string::npos) << q;
  EXPECT_NE(q.find("bf16 KV values (--kv-cache-dtype), fp8 indexer keys (--index-cache-dtype)"),
            std::string::npos)
      << q;
  EXPECT_NE(a.find("KV cache bf16\n"), std::string::npos) << a;
  EXPECT_EQ(a.find("indexer keys fp8"), std::string::npos) << a;
  const size_t at = q.find("\n| decode |");
  ASSERT_NE(at, std::string::npos) << q;
  const std::string row = q.substr(at + 1, q.find('\n', at + 1) - at - 1);
  EXPECT_EQ(row.find("does not fit"), std::string::npos) << row;
}

}  // namespace
}  // namespace v4::model
