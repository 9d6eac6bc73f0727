#include "model/weights.h"

#include <fmt/format.h>

#include <cstring>

namespace v4::model {
namespace {

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

class Loader {
 public:
  Loader(const Checkpoint& ck, ops::Ops* ops) : ck_(ck), ops_(ops) {}

  Result<FBuf> f32(const std::string& name, const std::vector<int64_t>& shape, int64_t* counter) {
    V4_ASSIGN_OR_RETURN(std::vector<float> host, ck_.read_f32(name, shape));
    if (counter) *counter += numel(shape);
    return upload(host);
  }
  FBuf upload(const std::vector<float>& host) {
    FBuf b(ops_, int64_t(host.size()));
    ops_->upload(b.data(), host.data(), host.size() * sizeof(float));
    return b;
  }
  // Integer table with every entry in [0, bound) (e.g. tid2eid: expert ids < E).
  Result<IBuf> i32(const std::string& name, const std::vector<int64_t>& shape, int64_t bound) {
    V4_ASSIGN_OR_RETURN(std::vector<int32_t> host, ck_.read_i32(name, shape));
    for (size_t i = 0; i < host.size(); ++i)
      if (host[i] < 0 || host[i] >= bound) {
        const TensorInfo* t = ck_.find(name);
        return make_error(ErrorCode::kInvalidArgument,
                          "{}: tensor '{}': entry {} = {} outside [0, {})", t->file, t->name, i,
                          host[i], bound);
      }
    IBuf b(ops_, int64_t(host.size()));
    ops_->upload(b.data(), host.data(), host.size() * sizeof(int32_t));
    return b;
  }
  const Checkpoint& ck() const { return ck_; }

 private:
  const Checkpoint& ck_;
  ops::Ops* ops_;
};

#define LOAD(dst, name, shape, counter) V4_ASSIGN_OR_RETURN(dst, ld.f32(name, shape, counter))

Status load_compressor(Loader& ld, const std::string& p, int c, int d, int m, int D,
                       CompressorWeights* w, int64_t* counter) {
  LOAD(w->wkv, p + "wkv.weight", (std::vector<int64_t>{int64_t(c) * d, D}), counter);
  LOAD(w->wgate, p + "wgate.weight", (std::vector<int64_t>{int64_t(c) * d, D}), counter);
  LOAD(w->ape, p + "ape", (std::vector<int64_t>{m, int64_t(c) * d}), counter);
  LOAD(w->norm, p + "norm.weight", (std::vector<int64_t>{d}), counter);
  return Status::Ok();
}

// Loads one decoder block with prefix `p` ("layers.3." or "mtp.0.").
Status load_block(Loader& ld, const ModelConfig& c, const std::string& p, LayerKind kind,
                  MlpKind mlp, LayerWeights* L, ParamCounts* pc) {
  const int64_t D = c.hidden_size, n = c.hc_mult, H = c.num_attention_heads, hd = c.head_dim;
  const int64_t Rq = c.q_lora_rank, G = c.o_groups, R = c.o_lora_rank;
  const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size, k = c.num_experts_per_tok;
  L->kind = kind;
  L->mlp = mlp;
  int64_t* nm = &pc->norms_and_mhc;
  LOAD(L->attn_norm, p + "attn_norm.weight", (std::vector<int64_t>{D}), nm);
  LOAD(L->ffn_norm, p + "ffn_norm.weight", (std::vector<int64_t>{D}), nm);
  const int64_t mix = (2 + n) * n;
  LOAD(L->hc_attn_fn, p + "hc_attn_fn", (std::vector<int64_t>{mix, n * D}), nm);
  LOAD(L->hc_attn_base, p + "hc_attn_base", (std::vector<int64_t>{mix}), nm);
  LOAD(L->hc_attn_scale, p + "hc_attn_scale", (std::vector<int64_t>{3}), nm);
  LOAD(L->hc_ffn_fn, p + "hc_ffn_fn", (std::vector<int64_t>{mix, n * D}), nm);
  LOAD(L->hc_ffn_base, p + "hc_ffn_base", (std::vector<int64_t>{mix}), nm);
  LOAD(L->hc_ffn_scale, p + "hc_ffn_scale", (std::vector<int64_t>{3}), nm);

  auto& a = L->attn;
  const std::string ap = p + "attn.";
  int64_t* at = &pc->attention;
  LOAD(a.wq_a, ap + "wq_a.weight", (std::vector<int64_t>{Rq, D}), at);
  LOAD(a.q_norm, ap + "q_norm.weight", (std::vector<int64_t>{Rq}), at);
  LOAD(a.wq_b, ap + "wq_b.weight", (std::vector<int64_t>{H * hd, Rq}), at);
  LOAD(a.wkv, ap + "wkv.weight", (std::vector<int64_t>{hd, D}), at);
  LOAD(a.kv_norm, ap + "kv_norm.weight", (std::vector<int64_t>{hd}), at);
  LOAD(a.wo_a, ap + "wo_a.weight", (std::vector<int64_t>{G * R, H * hd / G}), at);
  LOAD(a.wo_b, ap + "wo_b.weight", (std::vector<int64_t>{D, G * R}), at);
  LOAD(a.sinks, ap + "attn_sink", (std::vector<int64_t>{H}), at);
  if (kind != LayerKind::kSliding) {
    const int m = c.compress_rate(kind);
    const int cc = kind == LayerKind::kCsa ? 2 : 1;
    V4_RETURN_IF_ERROR(load_compressor(ld, ap + "compressor.", cc, int(hd), m, int(D),
                                       &a.compressor, &pc->compressor));
    if (kind == LayerKind::kCsa) {
      const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
      V4_RETURN_IF_ERROR(load_compressor(ld, ap + "indexer.compressor.", 2, int(dI), m, int(D),
                                         &a.index_compressor, &pc->indexer));
      LOAD(a.index_wq_b, ap + "indexer.wq_b.weight", (std::vector<int64_t>{nI * dI, Rq}),
           &pc->indexer);
      LOAD(a.index_weights_proj, ap + "indexer.weights_proj.weight", (std::vector<int64_t>{nI, D}),
           &pc->indexer);
    }
  }

  auto& f = L->ffn;
  const std::string fp = p + "ffn.";
  LOAD(f.gate, fp + "gate.weight", (std::vector<int64_t>{E, D}), &pc->router);
  if (mlp == MlpKind::kHashMoe) {
    V4_ASSIGN_OR_RETURN(f.tid2eid, ld.i32(fp + "gate.tid2eid", {c.vocab_size, k}, E));
    pc->router += c.vocab_size * k;
  } else {
    LOAD(f.bias, fp + "gate.bias", (std::vector<int64_t>{E}), &pc->router);
  }
  if (ld.ck().has(fp + "experts.gate_up_proj")) {
    LOAD(f.w13, fp + "experts.gate_up_proj", (std::vector<int64_t>{E, 2 * I, D}),
         &pc->routed_experts);
    LOAD(f.w2, fp + "experts.down_proj", (std::vector<int64_t>{E, D, I}), &pc->routed_experts);
  } else {
    std::vector<float> w13(size_t(E * 2 * I * D)), w2(size_t(E * D * I));
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = fp + "experts." + std::to_string(e) + ".";
      V4_ASSIGN_OR_RETURN(auto g, ld.ck().read_f32(ep + "w1.weight", {I, D}));
      V4_ASSIGN_OR_RETURN(auto u, ld.ck().read_f32(ep + "w3.weight", {I, D}));
      V4_ASSIGN_OR_RETURN(auto dn, ld.ck().read_f32(ep + "w2.weight", {D, I}));
      std::memcpy(&w13[size_t(e * 2 * I * D)], g.data(), g.size() * sizeof(float));
      std::memcpy(&w13[size_t(e * 2 * I * D + I * D)], u.data(), u.size() * sizeof(float));
      std::memcpy(&w2[size_t(e * D * I)], dn.data(), dn.size() * sizeof(float));
    }
    f.w13 = ld.upload(w13);
    f.w2 = ld.upload(w2);
    pc->routed_experts += E * 3 * I * D;
  }
  {
    const std::string sp = fp + "shared_experts.";
    V4_ASSIGN_OR_RETURN(auto g, ld.ck().read_f32(sp + "w1.weight", {I, D}));
    V4_ASSIGN_OR_RETURN(auto u, ld.ck().read_f32(sp + "w3.weight", {I, D}));
    g.insert(g.end(), u.begin(), u.end());
    f.shared_w13 = ld.upload(g);
    LOAD(f.shared_w2, sp + "w2.weight", (std::vector<int64_t>{D, I}), nullptr);
    pc->shared_experts += 3 * I * D;
  }
  return Status::Ok();
}

}  // namespace

Result<Weights> Weights::load(const Checkpoint& ck, const ModelConfig& c, ops::Ops* ops) {
  Loader ld(ck, ops);
  Weights w;
  const int64_t V = c.vocab_size, D = c.hidden_size, n = c.hc_mult;
  LOAD(w.embed, "embed.weight", (std::vector<int64_t>{V, D}), &w.counts.embed);
  if (!ck.has("head.weight") && c.tie_word_embeddings) {
    LOAD(w.head, "embed.weight", (std::vector<int64_t>{V, D}), nullptr);
  } else {
    LOAD(w.head, "head.weight", (std::vector<int64_t>{V, D}), &w.counts.head);
  }
  LOAD(w.norm, "norm.weight", (std::vector<int64_t>{D}), &w.counts.norms_and_mhc);
  LOAD(w.hc_head_fn, "hc_head_fn", (std::vector<int64_t>{n, n * D}), &w.counts.norms_and_mhc);
  LOAD(w.hc_head_base, "hc_head_base", (std::vector<int64_t>{n}), &w.counts.norms_and_mhc);
  LOAD(w.hc_head_scale, "hc_head_scale", (std::vector<int64_t>{1}), &w.counts.norms_and_mhc);
  w.layers.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l)
    V4_RETURN_IF_ERROR(load_block(ld, c, "layers." + std::to_string(l) + ".", c.layer_types[l],
                                  c.mlp_layer_types[l], &w.layers[l], &w.counts));
  // MTP modules (official names only; transformers drops them).
  for (int i = 0; i < c.num_nextn_predict_layers; ++i) {
    const std::string p = "mtp." + std::to_string(i) + ".";
    if (!ck.has(p + "e_proj.weight")) break;
    MtpWeights m;
    ParamCounts pc;
    int64_t* mc = &w.counts.mtp;
    LOAD(m.e_proj, p + "e_proj.weight", (std::vector<int64_t>{D, D}), mc);
    LOAD(m.h_proj, p + "h_proj.weight", (std::vector<int64_t>{D, D}), mc);
    LOAD(m.enorm, p + "enorm.weight", (std::vector<int64_t>{D}), mc);
    LOAD(m.hnorm, p + "hnorm.weight", (std::vector<int64_t>{D}), mc);
    LOAD(m.norm, p + "norm.weight", (std::vector<int64_t>{D}), mc);
    LOAD(m.hc_head_fn, p + "hc_head_fn", (std::vector<int64_t>{n, n * D}), mc);
    LOAD(m.hc_head_base, p + "hc_head_base", (std::vector<int64_t>{n}), mc);
    LOAD(m.hc_head_scale, p + "hc_head_scale", (std::vector<int64_t>{1}), mc);
    V4_RETURN_IF_ERROR(load_block(ld, c, p, LayerKind::kSliding, MlpKind::kMoe, &m.block, &pc));
    w.counts.mtp += pc.total();
    w.mtp.push_back(std::move(m));
  }
  return w;
}

}  // namespace v4::model
