// step_cost (the floors of `v4serve bench`): the decode byte count and the prefill FLOP count of
// a tiny config, checked against independent counts: KV rows and attention keys by brute force
// over positions (which rows are visible to which query), parameter counts from the generated
// weights' stored shapes, expert coverage from the closed form at B = 1 and a Monte-Carlo
// estimate of distinct experts under uniform routing.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "model/deepseek_v4.h"
#include "model/step_cost.h"

namespace v4::model {
namespace {

std::unique_ptr<DeepseekV4> tiny(ops::Ops* ops) {
  auto m =
      DeepseekV4::load_dummy(std::string(V4_SOURCE_DIR) + "/tests/fixtures/tiny-kinds-fp32", ops);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

// Visible compressed rows of a query at position t for rate m, by brute force: row w closes at
// position (w+1)·m − 1.
int64_t visible_rows(int64_t t, int m) {
  int64_t n = 0;
  for (int64_t w = 0; (w + 1) * m - 1 <= t; ++w) ++n;
  return n;
}
int64_t window_keys(int64_t t, int W) {
  int64_t n = 0;
  for (int64_t p = 0; p <= t; ++p) n += p > t - W;
  return n;
}

TEST(StepCost, DecodeBytesOfTheTinyConfig) {
  auto ops = ops::make_cpu_ops();
  auto m = tiny(ops.get());
  const ModelConfig& c = m->config();
  const Weights& w = m->weights();
  for (int64_t L : {0, 5, 100, 1000}) {
    for (int64_t B : {1, 3, 64}) {
      const DecodeBytes d = decode_step_bytes(c, w, B, L, KvDtype::kF32);
      // KV: brute force over layers and positions.
      int64_t values = 0;
      for (LayerKind k : c.layer_types) {
        values += window_keys(L, c.sliding_window) * c.head_dim;
        if (k == LayerKind::kCsa) {
          const int64_t rows = visible_rows(L, c.compress_rate_csa);
          values += std::min<int64_t>(rows, c.index_topk) * c.head_dim + rows * c.index_head_dim;
        } else if (k == LayerKind::kHca) {
          values += visible_rows(L, c.compress_rate_hca) * c.head_dim;
        }
      }
      EXPECT_DOUBLE_EQ(d.kv, double(values * 4 * B)) << "L " << L << " B " << B;
      EXPECT_DOUBLE_EQ(d.head, double(c.vocab_size * c.hidden_size * 4));
      // Experts: all layers' routed expert bytes × expected fraction touched.
      double expert_bytes = 0;
      for (const auto& Lw : w.layers)
        expert_bytes += double(Lw.ffn.w13.bytes() + Lw.ffn.w2.bytes());
      EXPECT_NEAR(d.experts, expert_bytes * d.expected_experts_per_layer / c.n_routed_experts,
                  1e-6);
    }
  }
  // Closed form at B = 1: exactly k experts; Monte-Carlo check of E·(1 − (1 − k/E)^B) for the
  // V4-Flash numbers (E = 256, k = 6) — B·k independent uniform picks.
  EXPECT_NEAR(decode_step_bytes(c, w, 1, 10, KvDtype::kF32).expected_experts_per_layer, c.num_experts_per_tok,
              1e-12);
  std::mt19937_64 g(5);
  for (int B : {1, 16, 64, 256}) {
    double mean = 0;
    const int trials = 400;
    for (int t = 0; t < trials; ++t) {
      std::set<int> seen;
      for (int i = 0; i < B * 6; ++i) seen.insert(int(g() % 256));
      mean += double(seen.size()) / trials;
    }
    const double closed = 256.0 * (1 - std::pow(1 - 6.0 / 256, B));
    EXPECT_NEAR(mean, closed, 0.02 * closed + 0.5) << "B " << B;
  }
}

TEST(StepCost, PrefillFlopsOfTheTinyConfig) {
  auto ops = ops::make_cpu_ops();
  auto m = tiny(ops.get());
  const ModelConfig& c = m->config();
  const Weights& w = m->weights();
  // Active matrix parameters per token from the generated weights' shapes.
  double params = 0;
  for (const auto& Lw : w.layers) {
    const auto& a = Lw.attn;
    for (const WBuf* b :
         {&a.wq_a, &a.wq_b, &a.wkv, &a.wo_a, &a.wo_b, &a.compressor.wkv, &a.compressor.wgate,
          &a.index_compressor.wkv, &a.index_compressor.wgate, &a.index_wq_b, &a.index_weights_proj,
          &Lw.ffn.shared_w13, &Lw.ffn.shared_w2})
      if (b->data.size() > 0) params += double(b->view.n * b->view.k * b->view.experts);
    params += double(Lw.ffn.gate.size() + Lw.hc_attn_fn.size() + Lw.hc_ffn_fn.size());
    params += double(c.num_experts_per_tok) *
              double(Lw.ffn.w13.view.n * Lw.ffn.w13.view.k + Lw.ffn.w2.view.n * Lw.ffn.w2.view.k);
  }
  for (auto [start, chunk] : {std::pair<int64_t, int64_t>{0, 1}, {0, 37}, {100, 50}}) {
    const PrefillFlops f = prefill_step_flops(c, start, chunk);
    EXPECT_NEAR(f.matmul, 2 * double(chunk) * params + 2.0 * c.vocab_size * c.hidden_size,
                1e-9 * f.matmul)
        << start << "+" << chunk;
    double att = 0, idx = 0;
    for (int64_t t = start; t < start + chunk; ++t)
      for (LayerKind k : c.layer_types) {
        int64_t keys = window_keys(t, c.sliding_window);
        if (k == LayerKind::kCsa) {
          keys += std::min<int64_t>(c.index_topk, visible_rows(t, c.compress_rate_csa));
          idx += 2.0 * c.index_n_heads * c.index_head_dim * visible_rows(t, c.compress_rate_csa);
        } else if (k == LayerKind::kHca) {
          keys += visible_rows(t, c.compress_rate_hca);
        }
        att += 4.0 * c.num_attention_heads * c.head_dim * double(keys);
      }
    EXPECT_DOUBLE_EQ(f.attention, att);
    EXPECT_DOUBLE_EQ(f.indexer, idx);
  }
}

}  // namespace
}  // namespace v4::model
