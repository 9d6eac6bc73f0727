// --load-format dummy: Weights::dummy / DeepseekV4::load_dummy.
// - Every tensor Weights::load produces for a fixture's checkpoint exists in the dummy weights with
//   the same shape (compared tensor by tensor against the real load), and the parameter counts
//   agree.
// - On a backend that reads native formats (a CPU wrapper that claims FP8/MXFP4/BF16 support) a
//   quantized config gets FP8 blocks, MXFP4 experts and BF16 where a real checkpoint has them;
//   bytes per format follow wformat_bytes, and the dequantized values (base/dtype.h decoders, an
//   independent path) have standard deviation ≈ 1/√K.
// - A tiny config with dummy weights runs prefill + decode on the CPU: logits finite and O(1),
//   the same seed gives bit-identical logits, another seed different ones; --num-layers cuts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "model/deepseek_v4.h"
#include "ops/null_ops.h"
#include "model_test_util.h"

namespace v4::model {
namespace {

using ops::WFormat;

std::string fixture(const char* name) {
  return std::string(V4_SOURCE_DIR) + "/tests/fixtures/" + name;
}

// ---- shapes: dummy vs a real load --------------------------------------------------------------
void expect_same_shape(const WBuf& a, const WBuf& b, const std::string& what) {
  EXPECT_EQ(a.view.n, b.view.n) << what;
  EXPECT_EQ(a.view.k, b.view.k) << what;
  EXPECT_EQ(a.view.experts, b.view.experts) << what;
  EXPECT_EQ(a.view.rows_total, b.view.rows_total) << what;
  EXPECT_EQ(a.bytes(), b.bytes()) << what << " (both f32 on the CPU backend)";
}
void expect_same_size(const FBuf& a, const FBuf& b, const std::string& what) {
  EXPECT_EQ(a.size(), b.size()) << what;
}

TEST(DummyWeights, SameTensorsAndShapesAsARealLoad) {
  auto ops = ops::make_cpu_ops();
  for (const auto& dir : testing::fixture_dirs()) {
    SCOPED_TRACE(dir);
    auto real = DeepseekV4::load(dir, ops.get());
    ASSERT_TRUE(real.ok()) << real.status().to_string();
    auto dummy = DeepseekV4::load_dummy(dir, ops.get());
    ASSERT_TRUE(dummy.ok()) << dummy.status().to_string();
    const Weights& r = (*real)->weights();
    const Weights& d = (*dummy)->weights();
    expect_same_size(r.embed, d.embed, "embed");
    expect_same_shape(r.head, d.head, "head");
    for (auto [a, b, n] : {std::tuple{&r.norm, &d.norm, "norm"},
                           {&r.hc_head_fn, &d.hc_head_fn, "hc_head_fn"},
                           {&r.hc_head_base, &d.hc_head_base, "hc_head_base"},
                           {&r.hc_head_scale, &d.hc_head_scale, "hc_head_scale"}})
      expect_same_size(*a, *b, n);
    ASSERT_EQ(r.layers.size(), d.layers.size());
    for (size_t l = 0; l < r.layers.size(); ++l) {
      const LayerWeights& R = r.layers[l];
      const LayerWeights& Dl = d.layers[l];
      const std::string p = "layer " + std::to_string(l) + " ";
      EXPECT_EQ(R.kind, Dl.kind) << p;
      EXPECT_EQ(R.mlp, Dl.mlp) << p;
      const std::vector<std::pair<const FBuf*, const FBuf*>> fv = {
          {&R.attn_norm, &Dl.attn_norm},
          {&R.ffn_norm, &Dl.ffn_norm},
          {&R.hc_attn_fn, &Dl.hc_attn_fn},
          {&R.hc_attn_base, &Dl.hc_attn_base},
          {&R.hc_attn_scale, &Dl.hc_attn_scale},
          {&R.hc_ffn_fn, &Dl.hc_ffn_fn},
          {&R.hc_ffn_base, &Dl.hc_ffn_base},
          {&R.hc_ffn_scale, &Dl.hc_ffn_scale},
          {&R.attn.q_norm, &Dl.attn.q_norm},
          {&R.attn.kv_norm, &Dl.attn.kv_norm},
          {&R.attn.sinks, &Dl.attn.sinks},
          {&R.attn.compressor.ape, &Dl.attn.compressor.ape},
          {&R.attn.compressor.norm, &Dl.attn.compressor.norm},
          {&R.attn.index_compressor.ape, &Dl.attn.index_compressor.ape},
          {&R.attn.index_compressor.norm, &Dl.attn.index_compressor.norm},
          {&R.ffn.gate, &Dl.ffn.gate},
          {&R.ffn.bias, &Dl.ffn.bias}};
      for (size_t i = 0; i < fv.size(); ++i)
        expect_same_size(*fv[i].first, *fv[i].second, p + "vector " + std::to_string(i));
      EXPECT_EQ(R.ffn.tid2eid.size(), Dl.ffn.tid2eid.size()) << p << "tid2eid";
      const std::vector<std::tuple<const WBuf*, const WBuf*, const char*>> wm = {
          {&R.attn.wq_a, &Dl.attn.wq_a, "wq_a"},
          {&R.attn.wq_b, &Dl.attn.wq_b, "wq_b"},
          {&R.attn.wkv, &Dl.attn.wkv, "wkv"},
          {&R.attn.wo_a, &Dl.attn.wo_a, "wo_a"},
          {&R.attn.wo_b, &Dl.attn.wo_b, "wo_b"},
          {&R.attn.compressor.wkv, &Dl.attn.compressor.wkv, "compressor.wkv"},
          {&R.attn.compressor.wgate, &Dl.attn.compressor.wgate, "compressor.wgate"},
          {&R.attn.index_compressor.wkv, &Dl.attn.index_compressor.wkv, "index.wkv"},
          {&R.attn.index_compressor.wgate, &Dl.attn.index_compressor.wgate, "index.wgate"},
          {&R.attn.index_wq_b, &Dl.attn.index_wq_b, "index_wq_b"},
          {&R.attn.index_weights_proj, &Dl.attn.index_weights_proj, "weights_proj"},
          {&R.ffn.w13, &Dl.ffn.w13, "w13"},
          {&R.ffn.w2, &Dl.ffn.w2, "w2"},
          {&R.ffn.shared_w13, &Dl.ffn.shared_w13, "shared_w13"},
          {&R.ffn.shared_w2, &Dl.ffn.shared_w2, "shared_w2"}};
      for (auto [a, b, n] : wm) expect_same_shape(*a, *b, p + n);
    }
    ParamCounts rc = r.counts, dc = d.counts;
    rc.mtp = 0;  // MTP modules are not generated
    EXPECT_EQ(rc.embed, dc.embed);
    EXPECT_EQ(rc.head, dc.head);
    EXPECT_EQ(rc.attention, dc.attention);
    EXPECT_EQ(rc.compressor, dc.compressor);
    EXPECT_EQ(rc.indexer, dc.indexer);
    EXPECT_EQ(rc.routed_experts, dc.routed_experts);
    EXPECT_EQ(rc.shared_experts, dc.shared_experts);
    EXPECT_EQ(rc.router, dc.router);
    EXPECT_EQ(rc.norms_and_mhc, dc.norms_and_mhc);
    // Matrix bytes agree once the real checkpoint's MTP modules (not generated) are left out.
    std::map<std::string, int64_t> rb = r.bytes_by_format();
    for (const auto& m : r.mtp)
      for (const WBuf* b : {&m.block.attn.wq_a, &m.block.attn.wq_b, &m.block.attn.wkv,
                            &m.block.attn.wo_a, &m.block.attn.wo_b, &m.block.ffn.w13,
                            &m.block.ffn.w2, &m.block.ffn.shared_w13, &m.block.ffn.shared_w2})
        rb[ops::wformat_name(b->view.format)] -= b->bytes();
    EXPECT_EQ(rb, d.bytes_by_format());
  }
}

// ---- formats on a backend that reads native formats ---------------------------------------------

/// The CPU backend, but claiming to read every weight format (only Weights::dummy runs on it).
class NativeClaimingOps : public ops::NullOps {
 public:
  NativeClaimingOps() : o_(ops::make_cpu_ops()) {}
  std::string name() const override { return "native-claiming-cpu"; }
  bool supports(WFormat) const override { return true; }
  void* alloc(size_t b) override { return o_->alloc(b); }
  void free(void* p) override { o_->free(p); }
  void upload(void* d, const void* s, size_t b) override { o_->upload(d, s, b); }
  void download(void* d, const void* s, size_t b) override { o_->download(d, s, b); }
  void fill_random(void* d, int64_t n, ops::RandomFill k, float s, uint64_t seed) override {
    o_->fill_random(d, n, k, s, seed);
  }

 private:
  std::unique_ptr<ops::Ops> o_;
};

/// A V4-Flash-like config small enough for a unit test (keeps quantization_config, fp4 experts).
ModelConfig small_quantized_config() {
  std::ifstream in(std::string(V4_SOURCE_DIR) + "/models/configs/v4-flash/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["hidden_size"] = 256;
  j["num_attention_heads"] = 4;
  j["head_dim"] = 128;
  j["qk_rope_head_dim"] = 32;
  j["q_lora_rank"] = 160;  // not a multiple of 128: partial FP8 blocks
  j["o_groups"] = 2;
  j["o_lora_rank"] = 96;
  j["n_routed_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 192;
  j["index_n_heads"] = 4;
  j["index_head_dim"] = 64;
  j["vocab_size"] = 1000;
  j["num_hidden_layers"] = 4;
  auto& ratios = j["compress_ratios"];  // 4 layers + the MTP module's entry
  ratios.erase(ratios.begin() + 4, ratios.end() - 1);
  auto c = ModelConfig::from_json(j, "small");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

template <typename T>
std::vector<T> host(ops::Ops& o, const void* p, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  o.download(v.data(), p, size_t(n) * sizeof(T));
  return v;
}

// Dequantized values of a stored matrix (expert 0..E-1), with base/dtype.h's decoders.
std::vector<float> dequant(ops::Ops& o, const WBuf& w) {
  const auto& v = w.view;
  const int64_t E = v.experts, N = v.rows_total, K = v.k;
  std::vector<float> out(size_t(E * N * K));
  if (v.format == WFormat::kBF16) {
    auto d = host<uint16_t>(o, v.data, E * N * K);
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(d[i]);
  } else if (v.format == WFormat::kFP8Block) {
    auto d = host<uint8_t>(o, v.data, E * N * K);
    const int64_t bn = (N + 127) / 128, bk = (K + 127) / 128;
    auto s = host<float>(o, v.scale, E * bn * bk);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const int64_t i = (e * N + n) * K + k;
          out[i] = fp8e4m3_to_f32(d[i]) * s[(e * bn + n / 128) * bk + k / 128];
        }
  } else if (v.format == WFormat::kMXFP4) {
    auto d = host<uint8_t>(o, v.data, E * N * K / 2);
    auto s = host<uint8_t>(o, v.scale, E * N * K / 32);
    for (int64_t r = 0; r < E * N; ++r)
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t b = d[(r * K + k) / 2];
        const uint8_t nib = k % 2 == 0 ? b & 0xf : b >> 4;
        out[r * K + k] = fp4e2m1_to_f32(nib) * ue8m0_to_f32(s[r * (K / 32) + k / 32]);
      }
  } else {
    out = host<float>(o, v.data, E * N * K);
  }
  return out;
}

TEST(DummyWeights, NativeFormatsWhereTheBackendReadsThem) {
  NativeClaimingOps ops;
  const ModelConfig c = small_quantized_config();
  auto w = Weights::dummy(c, &ops, {}, 5);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const LayerWeights& L2 = w->layers[2];  // CSA layer: every matrix kind
  ASSERT_EQ(L2.kind, LayerKind::kCsa);
  EXPECT_EQ(L2.attn.wq_a.view.format, WFormat::kFP8Block);
  EXPECT_EQ(L2.attn.wq_b.view.format, WFormat::kFP8Block);
  EXPECT_EQ(L2.attn.wkv.view.format, WFormat::kFP8Block);
  EXPECT_EQ(L2.attn.wo_a.view.format, WFormat::kFP8Block);
  EXPECT_EQ(L2.attn.wo_b.view.format, WFormat::kFP8Block);
  EXPECT_EQ(L2.attn.index_wq_b.view.format, WFormat::kFP8Block);
  EXPECT_EQ(L2.ffn.shared_w13.view.format, WFormat::kFP8Block);
  EXPECT_EQ(L2.attn.compressor.wkv.view.format, WFormat::kBF16);
  EXPECT_EQ(L2.attn.index_compressor.wgate.view.format, WFormat::kBF16);
  EXPECT_EQ(L2.attn.index_weights_proj.view.format, WFormat::kBF16);
  EXPECT_EQ(L2.ffn.w13.view.format, WFormat::kMXFP4);
  EXPECT_EQ(L2.ffn.w2.view.format, WFormat::kMXFP4);
  EXPECT_EQ(w->head.view.format, WFormat::kBF16);
  // Bytes per format = Σ wformat_bytes over the stored matrices.
  const auto bytes = w->bytes_by_format();
  int64_t want_mx = 0;
  for (size_t l = 0; l < w->layers.size(); ++l)
    want_mx += 8 * (ops::wformat_bytes(WFormat::kMXFP4, 2 * 192, 256) +
                    ops::wformat_bytes(WFormat::kMXFP4, 256, 192));
  EXPECT_EQ(bytes.at("mxfp4"), want_mx);
  EXPECT_EQ(L2.attn.wq_b.bytes(), ops::wformat_bytes(WFormat::kFP8Block, 4 * 128, 160));
  EXPECT_EQ(bytes.count("f32"), 0u) << "no matrix left in f32";
  // Dequantized values: mean 0, standard deviation ≈ 1/√K, finite.
  for (auto [m, name] : {std::pair{&L2.attn.wq_b, "wq_b fp8"},
                         {&L2.ffn.w13, "w13 mxfp4"},
                         {&L2.ffn.w2, "w2 mxfp4"},
                         {&L2.attn.compressor.wkv, "compressor bf16"},
                         {&w->head, "head bf16"}}) {
    auto v = dequant(ops, *m);
    double s = 0, s2 = 0;
    for (float x : v) {
      ASSERT_TRUE(std::isfinite(x)) << name;
      s += x;
      s2 += double(x) * x;
    }
    const double mean = s / v.size(), sd = std::sqrt(s2 / v.size() - mean * mean);
    const double want = 1.0 / std::sqrt(double(m->view.k));
    EXPECT_NEAR(sd / want, 1.0, 0.45) << name << ": std " << sd << " want " << want;
    EXPECT_NEAR(mean, 0.0, 0.05 * want) << name;
  }
  // Hash table entries are expert ids; norms are 1.
  auto t = host<int32_t>(ops, w->layers[0].ffn.tid2eid.data(), w->layers[0].ffn.tid2eid.size());
  std::vector<int> seen(8);
  for (int32_t e : t) {
    ASSERT_GE(e, 0);
    ASSERT_LT(e, 8);
    seen[e] = 1;
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 8);
  auto nw = host<float>(ops, L2.attn_norm.data(), L2.attn_norm.size());
  for (float x : nw) ASSERT_EQ(x, 1.f);
}

TEST(DummyWeights, NonQuantizedConfigsKeepTheirDtypeAndPolicyFallsBackToF32) {
  NativeClaimingOps ops;
  auto bf = ModelConfig::load(fixture("tiny-bf16"));
  ASSERT_TRUE(bf.ok());
  ASSERT_FALSE(bf->has_quantization_config);
  auto w = Weights::dummy(*bf, &ops);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->layers[0].attn.wq_a.view.format, WFormat::kBF16);
  EXPECT_EQ(w->layers[0].ffn.w13.view.format, WFormat::kBF16);
  WeightFormatPolicy off;
  off.native = false;
  auto f = Weights::dummy(small_quantized_config(), &ops, off);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->bytes_by_format().size(), 1u);
  EXPECT_EQ(f->bytes_by_format().count("f32"), 1u);
}

// ---- the forward over dummy weights
// --------------------------------------------------------------
struct RunOut {
  std::vector<float> prefill, decode;
};
RunOut run(DeepseekV4& m, int n_prompt, int n_decode) {
  auto kv = m.make_cache(int64_t(64) << 20, 1);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  auto seq = (*kv)->create_sequence();
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> prompt;
  for (int i = 0; i < n_prompt; ++i) prompt.push_back(int32_t((i * 37 + 11) % V));
  ForwardBatch b;
  b.slices.push_back({*seq, 0, prompt, true});
  auto out = m.forward(b, **kv);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  RunOut r;
  r.prefill = out->logits;
  int32_t next = 0;
  for (int i = 0; i < n_decode; ++i) {
    const float* last = out->logits.data() + out->logits.size() - V;
    next = int32_t(std::max_element(last, last + V) - last);
    ForwardBatch d;
    d.slices.push_back({*seq, int64_t(n_prompt + i), {next}, false});
    out = m.forward(d, **kv);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    r.decode.insert(r.decode.end(), out->logits.begin(), out->logits.end());
  }
  return r;
}

TEST(DummyWeights, TinyModelRunsDeterministically) {
  auto ops = ops::make_cpu_ops();
  for (const char* name : {"tiny-kinds-fp32", "tiny-fp8-mxfp4", "tiny-real-rates"}) {
    SCOPED_TRACE(name);
    auto a = DeepseekV4::load_dummy(fixture(name), ops.get(), {}, 0, 1);
    auto b = DeepseekV4::load_dummy(fixture(name) + "/config.json", ops.get(), {}, 0, 1);
    auto c = DeepseekV4::load_dummy(fixture(name), ops.get(), {}, 0, 2);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status().to_string();
    EXPECT_TRUE((*a)->checkpoint().tensors().empty());
    const int n_prompt = 300, n_decode = 6;  // crosses window, C4 and C128/C16 boundaries
    RunOut ra = run(**a, n_prompt, n_decode);
    RunOut rb = run(**b, n_prompt, n_decode);
    RunOut rc = run(**c, n_prompt, n_decode);
    ASSERT_EQ(ra.prefill.size(), size_t(n_prompt * (*a)->config().vocab_size));
    double mx = 0;
    for (float x : ra.prefill) {
      ASSERT_TRUE(std::isfinite(x));
      mx = std::max(mx, std::fabs(double(x)));
    }
    for (float x : ra.decode) ASSERT_TRUE(std::isfinite(x));
    EXPECT_GT(mx, 0.1) << "logits are not all ~0";
    EXPECT_LT(mx, 100.0) << "logits stay O(1)-O(10)";
    EXPECT_EQ(ra.prefill, rb.prefill) << "same seed: bit-identical logits";
    EXPECT_EQ(ra.decode, rb.decode);
    EXPECT_NE(ra.prefill, rc.prefill) << "another seed: other weights";
  }
}

TEST(DummyWeights, NumLayersCutsTheModel) {
  auto ops = ops::make_cpu_ops();
  auto m = DeepseekV4::load_dummy(fixture("tiny-kinds-fp32"), ops.get(), {}, 2, 1);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->config().num_hidden_layers, 2);
  EXPECT_EQ((*m)->weights().layers.size(), 2u);
  RunOut r = run(**m, 20, 2);
  for (float x : r.decode) ASSERT_TRUE(std::isfinite(x));
  auto bad = DeepseekV4::load_dummy(fixture("tiny-kinds-fp32"), ops.get(), {}, 5, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--num-layers 5"), std::string::npos)
      << bad.status().message();
  auto missing = DeepseekV4::load_dummy("/nonexistent", ops.get());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/config.json"), std::string::npos);
  // A real checkpoint cut the same way keeps layers 0..1 and their real weights.
  auto real = DeepseekV4::load(fixture("tiny-kinds-fp32"), ops.get(), {}, 2);
  ASSERT_TRUE(real.ok()) << real.status().to_string();
  EXPECT_EQ((*real)->weights().layers.size(), 2u);
}

}  // namespace
}  // namespace v4::model
