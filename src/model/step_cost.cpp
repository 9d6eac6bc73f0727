#include "model/step_cost.h"

#include <algorithm>
#include <cmath>

namespace v4::model {

DecodeBytes decode_step_bytes(const ModelConfig& c, const Weights& w, int64_t B, int64_t L,
                              KvDtype kv_dtype, IndexCacheDtype index_cache) {
  DecodeBytes r;
  const double E = c.n_routed_experts, k = c.num_experts_per_tok;
  r.expected_experts_per_layer = E * (1.0 - std::pow(1.0 - k / E, double(B)));
  const int64_t n = c.hc_mult, D = c.hidden_size;
  auto f32 = [](const FBuf& b) { return double(b.size()) * 4.0; };
  for (const LayerWeights& Lw : w.layers) {
    const auto& a = Lw.attn;
    for (const WBuf* m :
         {&a.wq_a, &a.wq_b, &a.wkv, &a.wo_a, &a.wo_b, &a.compressor.wkv, &a.compressor.wgate,
          &a.index_compressor.wkv, &a.index_compressor.wgate, &a.index_wq_b, &a.index_weights_proj,
          &Lw.ffn.shared_w13, &Lw.ffn.shared_w2})
      r.dense += double(m->bytes());
    r.dense += f32(Lw.ffn.gate) + f32(Lw.hc_attn_fn) + f32(Lw.hc_ffn_fn);
    r.experts += r.expected_experts_per_layer * double(Lw.ffn.w13.bytes() + Lw.ffn.w2.bytes()) / E;
  }
  r.dense += double(n * n * D) * 4.0 + double(B * D) * 4.0;  // HyperHead fn, embedding rows
  r.head = double(w.head.bytes());
  const int64_t W = c.sliding_window;
  // Row sizes in bytes (kFp8: 608 for V4's 512 = 448 + 64; indexer keys 144 = 128 e4m3 + scale + padding).
  const int64_t hd = kv_row_bytes(kv_dtype, c.head_dim, c.rope_dim());
  const int64_t dI = kv_row_bytes(kv_index_dtype(kv_dtype, index_cache), c.index_head_dim, 0);
  double per_seq = 0;
  for (LayerKind kind : c.layer_types) {
    per_seq += double(std::min<int64_t>(W, L + 1) * hd);
    if (kind == LayerKind::kCsa) {
      const int64_t rows = (L + 1) / c.compress_rate_csa;
      per_seq += double(std::min<int64_t>(c.index_topk, rows) * hd + rows * dI);
    } else if (kind == LayerKind::kHca) {
      per_seq += double((L + 1) / c.compress_rate_hca * hd);
    }
  }
  r.kv = per_seq * double(B);
  return r;
}

PrefillFlops prefill_step_flops(const ModelConfig& c, int64_t start, int64_t chunk) {
  PrefillFlops r;
  const double D = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim, Rq = c.q_lora_rank;
  const double G = c.o_groups, R = c.o_lora_rank, E = c.n_routed_experts;
  const double k = c.num_experts_per_tok, I = c.moe_intermediate_size, n = c.hc_mult;
  const double nI = c.index_n_heads, dI = c.index_head_dim, V = double(c.vocab_size);
  double params = 0;  // active matrix parameters per token
  for (LayerKind kind : c.layer_types) {
    params += Rq * D + H * hd * Rq + hd * D + G * R * (H * hd / G) + D * G * R;  // attention
    if (kind != LayerKind::kSliding) {
      const double cc = kind == LayerKind::kCsa ? 2 : 1;
      params += 2 * cc * hd * D;  // compressor wkv + wgate
      if (kind == LayerKind::kCsa)
        params += 2 * 2 * dI * D + nI * dI * Rq + nI * D;  // indexer compressor, wq_b, weights
    }
    params += E * D + 3 * I * D + k * 3 * I * D;  // router, shared expert, routed experts
    params += 2 * (2 + n) * n * n * D;            // mHC fn (attention and FFN sites)
  }
  const double tokens = double(chunk);
  r.matmul = 2 * tokens * params + 2 * V * D;
  const int64_t W = c.sliding_window;
  for (int64_t t = start; t < start + chunk; ++t) {
    for (LayerKind kind : c.layer_types) {
      double keys = double(std::min<int64_t>(W, t + 1));
      if (kind == LayerKind::kCsa) {
        const int64_t rows = (t + 1) / c.compress_rate_csa;
        keys += double(std::min<int64_t>(c.index_topk, rows));
        r.indexer += 2 * nI * dI * double(rows);
      } else if (kind == LayerKind::kHca) {
        keys += double((t + 1) / c.compress_rate_hca);
      }
      r.attention += 4 * H * hd * keys;
    }
  }
  return r;
}

}  // namespace v4::model
