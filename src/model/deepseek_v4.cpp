#include "model/deepseek_v4.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

namespace v4::model {

using ops::DeviceBuffer;

namespace {

template <typename T>
DeviceBuffer<T> upload_vec(ops::Ops* ops, const std::vector<T>& v) {
  DeviceBuffer<T> b(ops, int64_t(v.size()));
  if (!v.empty()) ops->upload(b.data(), v.data(), v.size() * sizeof(T));
  return b;
}

cache::AttnKind to_cache_kind(LayerKind k) {
  switch (k) {
    case LayerKind::kSliding:
      return cache::AttnKind::kSliding;
    case LayerKind::kCsa:
      return cache::AttnKind::kCsa;
    case LayerKind::kHca:
      return cache::AttnKind::kHca;
  }
  return cache::AttnKind::kSliding;
}

/// A RowMap with its device arrays.
struct DeviceRowMap {
  DeviceBuffer<int32_t> rows;
  DeviceBuffer<int64_t> offset;
  DeviceBuffer<int32_t> count;
  ops::RowMap view() const { return {rows.data(), offset.data(), count.data()}; }
};

struct HostRowMap {
  std::vector<int32_t> rows;
  std::vector<int64_t> offset;
  std::vector<int32_t> count;
  DeviceRowMap upload(ops::Ops* ops) const {
    return {upload_vec(ops, rows), upload_vec(ops, offset), upload_vec(ops, count)};
  }
};

/// Compressor plan for one (rate m, overlap c): which rows close in this step, their sources,
/// and the ring rows to refresh afterwards (dsv4-model.md §5).
struct CompressPlan {
  int ratio = 0, overlap = 1;
  int64_t n_out = 0;
  DeviceBuffer<int32_t> src;        // [n_out, c·m]
  DeviceBuffer<int64_t> positions;  // [n_out] rope position w·m
  DeviceBuffer<int32_t> dst;        // [n_out] physical compressed-pool rows
  int64_t n_ring = 0;
  DeviceBuffer<int32_t> ring_src;  // [n_ring] batch rows
  DeviceBuffer<int32_t> ring_dst;  // [n_ring] ring rows
  DeviceRowMap cand;               // per query: all causal compressed rows (w < (t+1)/m)
  int64_t max_cand = 0;            // max over queries of cand.count
};

}  // namespace

/// Everything one step computes once and every layer reuses ("plan, then run").
struct DeepseekV4::Step {
  cache::KvCache* kv = nullptr;
  int64_t S = 0;
  std::vector<int32_t> ids_host;
  std::vector<int64_t> pos_host;
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<int64_t> pos;
  DeviceBuffer<int32_t> swa_dst;      // [S] SWA row of each new token
  DeviceRowMap swa;                   // per query: window keys
  CompressPlan csa, hca;              // by layer kind
  DeviceBuffer<int64_t> topk_offset;  // [S] t·index_topk
};

DeepseekV4::~DeepseekV4() = default;

Result<std::unique_ptr<DeepseekV4>> DeepseekV4::load(const std::string& dir, ops::Ops* ops,
                                                     WeightFormatPolicy policy, int num_layers) {
  std::unique_ptr<DeepseekV4> m(new DeepseekV4());
  m->ops_ = ops;
  V4_ASSIGN_OR_RETURN(m->cfg_, ModelConfig::load(dir));
  if (num_layers > 0) V4_RETURN_IF_ERROR(m->cfg_.truncate_layers(num_layers));
  V4_ASSIGN_OR_RETURN(m->ck_, Checkpoint::open(dir));
  V4_ASSIGN_OR_RETURN(m->w_, Weights::load(m->ck_, m->cfg_, ops, policy));
  m->init_rope();
  return m;
}

Result<std::unique_ptr<DeepseekV4>> DeepseekV4::load_dummy(const std::string& config_path,
                                                           ops::Ops* ops,
                                                           WeightFormatPolicy policy,
                                                           int num_layers, uint64_t seed) {
  std::unique_ptr<DeepseekV4> m(new DeepseekV4());
  m->ops_ = ops;
  V4_ASSIGN_OR_RETURN(m->cfg_, ModelConfig::load_path(config_path));
  if (num_layers > 0) V4_RETURN_IF_ERROR(m->cfg_.truncate_layers(num_layers));
  V4_ASSIGN_OR_RETURN(m->w_, Weights::dummy(m->cfg_, ops, policy, seed));
  m->init_rope();
  return m;
}

void DeepseekV4::init_rope() {
  auto make_rope = [&](const RopeSpec& r, RopeTable* t) {
    t->inv_freq = upload_vec(ops_, r.inv_freq());
    t->rope_dim = r.rope_dim;
    t->attention_scaling = float(r.attention_factor);
  };
  make_rope(cfg_.rope_main, &rope_main_);
  make_rope(cfg_.rope_compress, &rope_compress_);
}

cache::CacheSpec DeepseekV4::cache_spec() const {
  cache::CacheSpec s;
  s.sliding_window = cfg_.sliding_window;
  for (auto k : cfg_.layer_types) {
    cache::LayerCacheSpec l;
    l.kind = to_cache_kind(k);
    l.ratio = cfg_.compress_rate(k);
    l.kv_dim = cfg_.head_dim;
    l.index_dim = k == LayerKind::kCsa ? cfg_.index_head_dim : 0;
    s.layers.push_back(l);
  }
  return s;
}

Result<std::unique_ptr<cache::KvCache>> DeepseekV4::make_cache(int64_t budget_bytes, int max_seqs,
                                                               int page_size,
                                                               int64_t max_chunk_tokens) const {
  const auto spec = cache_spec();
  if (page_size <= 0) {
    page_size = 256;
    for (;;) {
      bool ok = page_size % 128 == 0;
      for (auto& l : spec.layers) ok &= l.ratio == 0 || page_size % l.ratio == 0;
      if (ok) break;
      page_size += 128;
      if (page_size > (1 << 20))
        return make_error(ErrorCode::kInvalidArgument,
                          "no page size ≤ 1M tokens fits the compression rates");
    }
  }
  V4_ASSIGN_OR_RETURN(auto opt, cache::KvCache::options_from_budget(spec, budget_bytes, page_size,
                                                                    max_seqs, max_chunk_tokens));
  ops::Ops* ops = ops_;
  return cache::KvCache::create(
      spec, opt, [ops](size_t b) { return ops->alloc(b); }, [ops](void* p) { ops->free(p); });
}

Result<ForwardOutput> DeepseekV4::forward(const ForwardBatch& batch, cache::KvCache& kv) {
  const ModelConfig& c = cfg_;
  ops::Ops& o = *ops_;
  // ---- 1. validate and reserve ----------------------------------------------------------
  std::set<int32_t> seen;
  int64_t S = 0;
  for (size_t i = 0; i < batch.slices.size(); ++i) {
    const SeqSlice& sl = batch.slices[i];
    if (!kv.valid(sl.seq))
      return make_error(ErrorCode::kInvalidArgument, "forward: slice {}: unknown sequence {}", i,
                        sl.seq);
    if (!seen.insert(sl.seq).second)
      return make_error(ErrorCode::kInvalidArgument,
                        "forward: sequence {} appears twice in one batch", sl.seq);
    if (sl.tokens.empty())
      return make_error(ErrorCode::kInvalidArgument, "forward: slice {} has no tokens", i);
    if (sl.start_pos != kv.length(sl.seq))
      return make_error(ErrorCode::kInvalidArgument,
                        "forward: slice {}: start_pos {} but sequence {} holds {} tokens", i,
                        sl.start_pos, sl.seq, kv.length(sl.seq));
    if (sl.start_pos + int64_t(sl.tokens.size()) > c.max_position_embeddings)
      return make_error(ErrorCode::kInvalidArgument,
                        "forward: slice {} exceeds max_position_embeddings {}", i,
                        c.max_position_embeddings);
    for (int32_t t : sl.tokens)
      if (t < 0 || t >= c.vocab_size)
        return make_error(ErrorCode::kInvalidArgument,
                          "forward: token id {} outside the vocabulary [0, {})", t, c.vocab_size);
    S += int64_t(sl.tokens.size());
  }
  for (const SeqSlice& sl : batch.slices)
    V4_RETURN_IF_ERROR(kv.reserve(sl.seq, sl.start_pos + int64_t(sl.tokens.size())));

  // ---- 2. plans ---------------------------------------------------------------------------
  Step st;
  st.kv = &kv;
  st.S = S;
  std::vector<int64_t> row0(batch.slices.size() + 1, 0);
  std::vector<int32_t> swa_dst;
  HostRowMap swa;
  const int W = c.sliding_window;
  for (size_t i = 0; i < batch.slices.size(); ++i) {
    const SeqSlice& sl = batch.slices[i];
    const int64_t s0 = sl.start_pos, n = int64_t(sl.tokens.size());
    row0[i + 1] = row0[i] + n;
    const int64_t lo = std::max<int64_t>(0, s0 - W + 1);
    const int64_t base = int64_t(swa.rows.size());
    for (int64_t p = lo; p < s0 + n; ++p) swa.rows.push_back(kv.swa_row(sl.seq, p));
    for (int64_t j = 0; j < n; ++j) {
      const int64_t t = s0 + j;
      st.ids_host.push_back(sl.tokens[j]);
      st.pos_host.push_back(t);
      swa_dst.push_back(kv.swa_row(sl.seq, t));
      const int64_t first = std::max<int64_t>(0, t - W + 1);
      swa.offset.push_back(base + (first - lo));
      swa.count.push_back(int32_t(t - first + 1));
    }
  }
  st.ids = upload_vec(ops_, st.ids_host);
  st.pos = upload_vec(ops_, st.pos_host);
  st.swa_dst = upload_vec(ops_, swa_dst);
  st.swa = swa.upload(ops_);

  auto build_compress = [&](int m, int cc, CompressPlan* plan) {
    plan->ratio = m;
    plan->overlap = cc;
    const int ring_rows = cc * m;
    std::vector<int32_t> src, dst, ring_src, ring_dst;
    std::vector<int64_t> positions;
    HostRowMap cand;
    for (size_t i = 0; i < batch.slices.size(); ++i) {
      const SeqSlice& sl = batch.slices[i];
      const int64_t s0 = sl.start_pos, n = int64_t(sl.tokens.size()), end = s0 + n;
      // Source slot of token p: fresh batch row, or its ring row in the sequence's state.
      auto source = [&](int64_t p) -> int32_t {
        if (p < 0) return -1;
        if (p >= s0) return int32_t(row0[i] + (p - s0));
        return -(kv.ring_row(sl.seq, p, ring_rows) + 2);
      };
      for (int64_t w = s0 / m; w < end / m; ++w) {
        if (cc == 2)
          for (int j = 0; j < m; ++j) src.push_back(w == 0 ? -1 : source((w - 1) * m + j));
        for (int j = 0; j < m; ++j) src.push_back(source(w * m + j));
        positions.push_back(w * m);
        dst.push_back(kv.compressed_row(sl.seq, w, m));
      }
      for (int64_t p = std::max(s0, end - ring_rows); p < end; ++p) {
        ring_src.push_back(int32_t(row0[i] + (p - s0)));
        ring_dst.push_back(kv.ring_row(sl.seq, p, ring_rows));
      }
      const int64_t base = int64_t(cand.rows.size());
      for (int64_t e = 0; e < end / m; ++e) cand.rows.push_back(kv.compressed_row(sl.seq, e, m));
      for (int64_t j = 0; j < n; ++j) {
        cand.offset.push_back(base);
        cand.count.push_back(int32_t((s0 + j + 1) / m));
        plan->max_cand = std::max<int64_t>(plan->max_cand, (s0 + j + 1) / m);
      }
    }
    plan->n_out = int64_t(dst.size());
    plan->src = upload_vec(ops_, src);
    plan->positions = upload_vec(ops_, positions);
    plan->dst = upload_vec(ops_, dst);
    plan->n_ring = int64_t(ring_dst.size());
    plan->ring_src = upload_vec(ops_, ring_src);
    plan->ring_dst = upload_vec(ops_, ring_dst);
    plan->cand = cand.upload(ops_);
  };
  bool has_csa = false, has_hca = false;
  for (auto k : c.layer_types) {
    has_csa |= k == LayerKind::kCsa;
    has_hca |= k == LayerKind::kHca;
  }
  if (has_csa) {
    build_compress(c.compress_rate_csa, 2, &st.csa);
    std::vector<int64_t> off(S);
    for (int64_t t = 0; t < S; ++t) off[t] = t * c.index_topk;
    st.topk_offset = upload_vec(ops_, off);
  }
  if (has_hca) build_compress(c.compress_rate_hca, 1, &st.hca);

  // ---- 3. layers -------------------------------------------------------------------------
  const int n = c.hc_mult, D = c.hidden_size;
  DeviceBuffer<float> h(ops_, S * n * D), collapsed(ops_, S * D), x(ops_, S * D), f(ops_, S * D);
  DeviceBuffer<float> post(ops_, S * n), comb(ops_, S * n * n);
  o.embed(w_.embed.data(), st.ids.data(), S, D, n, h.data());
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    ops::HcArgs hc;
    hc.h = h.data();
    hc.n_rows = S;
    hc.n_streams = n;
    hc.hidden = D;
    hc.rms_eps = float(c.rms_norm_eps);
    hc.hc_eps = float(c.hc_eps);
    hc.sinkhorn_iters = c.hc_sinkhorn_iters;
    hc.collapsed = collapsed.data();
    hc.post = post.data();
    hc.comb = comb.data();
    hc.fn = L.hc_attn_fn.data();
    hc.base = L.hc_attn_base.data();
    hc.scale = L.hc_attn_scale.data();
    o.hc_pre(hc);
    o.rms_norm(collapsed.data(), L.attn_norm.data(), S, D, float(c.rms_norm_eps), x.data());
    attention(st, l, x.data(), f.data());
    o.hc_post(h.data(), f.data(), post.data(), comb.data(), S, n, D);

    hc.fn = L.hc_ffn_fn.data();
    hc.base = L.hc_ffn_base.data();
    hc.scale = L.hc_ffn_scale.data();
    o.hc_pre(hc);
    o.rms_norm(collapsed.data(), L.ffn_norm.data(), S, D, float(c.rms_norm_eps), x.data());
    moe(st, l, x.data(), f.data());
    o.hc_post(h.data(), f.data(), post.data(), comb.data(), S, n, D);
  }

  // ---- 4. head on the rows that return logits ----------------------------------------------
  ForwardOutput out;
  out.vocab = c.vocab_size;
  out.row_begin.push_back(0);
  std::vector<int32_t> sel;
  for (size_t i = 0; i < batch.slices.size(); ++i) {
    if (batch.slices[i].logits_all)
      for (int64_t r = row0[i]; r < row0[i + 1]; ++r) sel.push_back(int32_t(r));
    else
      sel.push_back(int32_t(row0[i + 1] - 1));
    out.row_begin.push_back(int64_t(sel.size()));
  }
  const int64_t R = int64_t(sel.size());
  auto sel_dev = upload_vec(ops_, sel);
  DeviceBuffer<float> hs(ops_, R * n * D), y(ops_, R * D), logits(ops_, R * c.vocab_size);
  o.gather_rows(h.data(), sel_dev.data(), R, int64_t(n) * D, hs.data());
  o.hc_head(hs.data(), w_.hc_head_fn.data(), w_.hc_head_base.data(), w_.hc_head_scale.data(), R, n,
            D, float(c.rms_norm_eps), float(c.hc_eps), y.data());
  o.rms_norm(y.data(), w_.norm.data(), R, D, float(c.rms_norm_eps), y.data());
  o.linear_w(y.data(), D, w_.head.v(), R, logits.data(), c.vocab_size);
  out.logits.resize(size_t(R * c.vocab_size));
  o.download(out.logits.data(), logits.data(), out.logits.size() * sizeof(float));

  for (const SeqSlice& sl : batch.slices)
    kv.commit(sl.seq, sl.start_pos + int64_t(sl.tokens.size()));
  return out;
}

void DeepseekV4::attention(Step& st, int l, const float* x, float* out) {
  const ModelConfig& c = cfg_;
  const AttentionWeights& a = w_.layers[l].attn;
  const LayerKind kind = c.layer_types[l];
  const RopeTable& rope = rope_for(kind);
  ops::Ops& o = *ops_;
  const int64_t S = st.S;
  const int D = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim, Rq = c.q_lora_rank;
  const float eps = float(c.rms_norm_eps);

  // Q path: low-rank q, q_norm, per-head unweighted RMS norm, RoPE (dsv4-model.md §4).
  DeviceBuffer<float> cq(ops_, S * Rq), q(ops_, S * H * hd), kvv(ops_, S * hd);
  o.linear_w(x, D, a.wq_a.v(), S, cq.data(), Rq);
  o.rms_norm(cq.data(), a.q_norm.data(), S, Rq, eps, cq.data());
  o.linear_w(cq.data(), Rq, a.wq_b.v(), S, q.data(), int64_t(H) * hd);
  o.rms_norm(q.data(), nullptr, S * H, hd, eps, q.data());
  o.rope(q.data(), S, H, hd, rope.rope_dim, st.pos.data(), rope.inv_freq.data(),
         rope.attention_scaling, false);
  // K = V path: kv_norm then RoPE, stored into the SWA pool.
  o.linear_w(x, D, a.wkv.v(), S, kvv.data(), hd);
  o.rms_norm(kvv.data(), a.kv_norm.data(), S, hd, eps, kvv.data());
  o.rope(kvv.data(), S, 1, hd, rope.rope_dim, st.pos.data(), rope.inv_freq.data(),
         rope.attention_scaling, false);
  o.store_rows(st.kv->swa_pool(l), st.swa_dst.data(), S, hd, kvv.data());

  // Compressor: pool the rows that close in this step, norm + rope at w·m, store; refresh rings.
  auto compress = [&](const CompressorWeights& w, const CompressPlan& plan, int d, float* pool,
                      float* ring_kv, float* ring_gate) {
    const int cd = plan.overlap * d;
    DeviceBuffer<float> kc(ops_, S * cd), zc(ops_, S * cd);
    o.linear_w(x, D, w.wkv.v(), S, kc.data(), cd);
    o.linear_w(x, D, w.wgate.v(), S, zc.data(), cd);
    if (plan.n_out > 0) {
      DeviceBuffer<float> rows(ops_, plan.n_out * d);
      ops::CompressArgs ca;
      ca.fresh_kv = kc.data();
      ca.fresh_gate = zc.data();
      ca.state_kv = ring_kv;
      ca.state_gate = ring_gate;
      ca.bias = w.ape.data();
      ca.src = plan.src.data();
      ca.n_out = plan.n_out;
      ca.ratio = plan.ratio;
      ca.overlap = plan.overlap;
      ca.dim = d;
      ca.out = rows.data();
      o.compress_pool(ca);
      o.rms_norm(rows.data(), w.norm.data(), plan.n_out, d, eps, rows.data());
      o.rope(rows.data(), plan.n_out, 1, d, rope.rope_dim, plan.positions.data(),
             rope.inv_freq.data(), rope.attention_scaling, false);
      o.store_rows(pool, plan.dst.data(), plan.n_out, d, rows.data());
    }
    if (plan.n_ring > 0) {
      DeviceBuffer<float> tmp(ops_, plan.n_ring * cd);
      o.gather_rows(kc.data(), plan.ring_src.data(), plan.n_ring, cd, tmp.data());
      o.store_rows(ring_kv, plan.ring_dst.data(), plan.n_ring, cd, tmp.data());
      o.gather_rows(zc.data(), plan.ring_src.data(), plan.n_ring, cd, tmp.data());
      o.store_rows(ring_gate, plan.ring_dst.data(), plan.n_ring, cd, tmp.data());
    }
  };

  ops::AttentionArgs aa;
  aa.q = q.data();
  aa.sinks = a.sinks.data();
  aa.swa_pool = st.kv->swa_pool(l);
  aa.swa = st.swa.view();
  aa.n_rows = S;
  aa.n_heads = H;
  aa.head_dim = hd;
  aa.scale = 1.f / std::sqrt(float(hd));
  DeviceBuffer<int32_t> sel_rows, sel_count;
  if (kind == LayerKind::kHca) {
    compress(a.compressor, st.hca, hd, st.kv->comp_pool(l), st.kv->ring_kv(l, 0),
             st.kv->ring_gate(l, 0));
    aa.comp_pool = st.kv->comp_pool(l);
    aa.comp = st.hca.cand.view();
  } else if (kind == LayerKind::kCsa) {
    const int nI = c.index_n_heads, dI = c.index_head_dim, k = c.index_topk;
    compress(a.compressor, st.csa, hd, st.kv->comp_pool(l), st.kv->ring_kv(l, 0),
             st.kv->ring_gate(l, 0));
    compress(a.index_compressor, st.csa, dI, st.kv->index_pool(l), st.kv->ring_kv(l, 1),
             st.kv->ring_gate(l, 1));
    // Lightning indexer (dsv4-model.md §6): q^I from cq, roped; weights from x; top-k rows.
    DeviceBuffer<float> qi(ops_, S * nI * dI), wi(ops_, S * nI);
    o.linear_w(cq.data(), Rq, a.index_wq_b.v(), S, qi.data(), int64_t(nI) * dI);
    o.rope(qi.data(), S, nI, dI, rope.rope_dim, st.pos.data(), rope.inv_freq.data(),
           rope.attention_scaling, false);
    o.linear_w(x, D, a.index_weights_proj.v(), S, wi.data(), nI);
    sel_rows = DeviceBuffer<int32_t>(ops_, S * k);
    sel_count = DeviceBuffer<int32_t>(ops_, S);
    ops::IndexerArgs ia;
    ia.q = qi.data();
    ia.weights = wi.data();
    ia.key_pool = st.kv->index_pool(l);
    ia.cand = st.csa.cand.view();
    ia.n_rows = S;
    ia.n_heads = nI;
    ia.head_dim = dI;
    ia.topk = k;
    ia.max_count = std::max<int64_t>(1, st.csa.max_cand);
    ia.out_rows = sel_rows.data();
    ia.out_count = sel_count.data();
    o.indexer_topk(ia);
    aa.comp_pool = st.kv->comp_pool(l);
    aa.comp = {sel_rows.data(), st.topk_offset.data(), sel_count.data()};
  }
  // Key-count bound: the window, plus top-k (CSA) or every causal compressed row (HCA).
  aa.max_keys = c.sliding_window + (kind == LayerKind::kCsa   ? c.index_topk
                                    : kind == LayerKind::kHca ? st.hca.max_cand
                                                              : 0);
  DeviceBuffer<float> attn(ops_, S * H * hd);
  aa.out = attn.data();
  o.sparse_attention(aa);
  // De-rotation (P3), then the grouped low-rank output projection (P9: G may exceed H).
  o.rope(attn.data(), S, H, hd, rope.rope_dim, st.pos.data(), rope.inv_freq.data(),
         rope.attention_scaling, true);
  const int G = c.o_groups, R = c.o_lora_rank;
  const int64_t gw = int64_t(H) * hd / G;
  DeviceBuffer<float> og(ops_, S * G * R);
  for (int g = 0; g < G; ++g)
    o.linear_w(attn.data() + g * gw, int64_t(H) * hd, a.wo_a.v().rows(int64_t(g) * R, R), S,
               og.data() + g * R, int64_t(G) * R);
  o.linear_w(og.data(), int64_t(G) * R, a.wo_b.v(), S, out, D);
}

void DeepseekV4::moe(Step& st, int l, const float* x, float* out) {
  const ModelConfig& c = cfg_;
  const MoeWeights& m = w_.layers[l].ffn;
  ops::Ops& o = *ops_;
  const int64_t S = st.S;
  const int D = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok,
            I = c.moe_intermediate_size;
  DeviceBuffer<float> logits(ops_, S * E), wgt(ops_, S * k), shared(ops_, S * D);
  DeviceBuffer<int32_t> idx(ops_, S * k);
  o.linear(x, D, m.gate.data(), S, E, D, logits.data(), E);
  ops::RouteArgs ra;
  ra.logits = logits.data();
  ra.n_rows = S;
  ra.n_experts = E;
  ra.topk = k;
  ra.scoring = c.scoring;
  ra.routed_scaling_factor = float(c.routed_scaling_factor);
  ra.out_idx = idx.data();
  ra.out_weight = wgt.data();
  if (c.mlp_layer_types[l] == MlpKind::kHashMoe) {
    ra.tid2eid = m.tid2eid.data();
    ra.token_ids = st.ids.data();
  } else {
    ra.bias = m.bias.data();
  }
  o.route(ra);
  ops::MoeArgs ma;
  ma.x = x;
  ma.w13 = m.w13.v();
  ma.w2 = m.w2.v();
  ma.idx = idx.data();
  ma.weight = wgt.data();
  ma.n_rows = S;
  ma.hidden = D;
  ma.inter = I;
  ma.n_experts = E;
  ma.topk = k;
  ma.swiglu_limit = float(c.swiglu_limit);
  ma.out = out;
  o.moe_experts(ma);
  // Shared expert = the same op with one expert of weight 1 (exact: v·1 = v).
  std::vector<int32_t> zeros(size_t(S), 0);
  std::vector<float> ones(size_t(S), 1.f);
  auto zi = upload_vec(ops_, zeros);
  auto on = upload_vec(ops_, ones);
  ma.w13 = m.shared_w13.v();
  ma.w2 = m.shared_w2.v();
  ma.idx = zi.data();
  ma.weight = on.data();
  ma.n_experts = 1;
  ma.topk = 1;
  ma.out = shared.data();
  o.moe_experts(ma);
  o.add(out, shared.data(), S * D);
}

}  // namespace v4::model
