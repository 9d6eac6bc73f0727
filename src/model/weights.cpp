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

using ops::WFormat;

/// Uploads stored bytes as a WBuf of E matrices [N, K] in format f.
WBuf make_wbuf(ops::Ops* ops, WFormat f, int64_t E, int64_t N, int64_t K,
               const std::vector<uint8_t>& data, const std::vector<uint8_t>& scale) {
  WBuf w;
  w.data = ops::DeviceBuffer<uint8_t>(ops, int64_t(data.size()));
  if (!data.empty()) ops->upload(w.data.data(), data.data(), data.size());
  if (!scale.empty()) {
    w.scale = ops::DeviceBuffer<uint8_t>(ops, int64_t(scale.size()));
    ops->upload(w.scale.data(), scale.data(), scale.size());
  }
  w.view.data = w.data.data();
  w.view.scale = w.scale.data();
  w.view.format = f;
  w.view.n = N;
  w.view.k = K;
  w.view.experts = E;
  w.view.row0 = 0;
  w.view.rows_total = N;
  return w;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
std::vector<uint8_t> bf16_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = f32_to_bf16(v[i]);
    std::memcpy(&b[2 * i], &h, 2);
  }
  return b;
}

class Loader {
 public:
  Loader(const Checkpoint& ck, ops::Ops* ops, WeightFormatPolicy policy)
      : ck_(ck), ops_(ops), policy_(policy) {}

  /// A decoded f32 stack [E, N, K] stored per policy (f32, or bf16 when asked and supported).
  WBuf from_f32(const std::vector<float>& host, int64_t E, int64_t N, int64_t K) {
    if (policy_.f32_as_bf16 && ops_->supports(WFormat::kBF16))
      return make_wbuf(ops_, WFormat::kBF16, E, N, K, bf16_bytes(host), {});
    return make_wbuf(ops_, WFormat::kF32, E, N, K, f32_bytes(host), {});
  }

  /// Native bytes of a 2-D weight when the policy and backend allow; kUnsupported otherwise.
  Result<Checkpoint::NativeTensor> native(const std::string& name, int64_t N, int64_t K) {
    if (!policy_.native)
      return make_error(ErrorCode::kUnsupported, "native formats off");
    V4_ASSIGN_OR_RETURN(auto nt, ck_.read_native(name, {N, K}));
    if (!ops_->supports(WFormat(nt.format)))
      return make_error(ErrorCode::kUnsupported, "backend does not read {}",
                        ops::wformat_name(WFormat(nt.format)));
    return nt;
  }

  /// Weight matrix [N, K] (native format when possible).
  Result<WBuf> matrix(const std::string& name, int64_t N, int64_t K, int64_t* counter) {
    auto nt = native(name, N, K);
    if (nt.ok()) {
      if (counter) *counter += N * K;
      return make_wbuf(ops_, WFormat(nt->format), 1, N, K, nt->data, nt->scale);
    }
    if (nt.status().code() != ErrorCode::kUnsupported) return nt.status();
    V4_ASSIGN_OR_RETURN(std::vector<float> host, ck_.read_f32(name, {N, K}));
    if (counter) *counter += N * K;
    return from_f32(host, 1, N, K);
  }

  /// Stacks matrices parts[e] = {names of row blocks} (each [rows_i, K]) into E experts of
  /// [Σ rows_i, K], natively when every part has the same native format and FP8 row blocks
  /// stay aligned to 128 rows; else decoded to f32.
  Result<WBuf> stack(const std::vector<std::vector<std::string>>& parts,
                     const std::vector<int64_t>& rows, int64_t K) {
    const int64_t E = int64_t(parts.size());
    int64_t N = 0;
    for (auto r : rows) N += r;
    bool ok = policy_.native;
    std::vector<uint8_t> data, scale;
    int fmt0 = -1;
    for (int64_t e = 0; ok && e < E; ++e)
      for (size_t i = 0; ok && i < rows.size(); ++i) {
        auto nt = native(parts[e][i], rows[i], K);
        if (!nt.ok()) {
          if (nt.status().code() != ErrorCode::kUnsupported) return nt.status();
          ok = false;
          break;
        }
        if (fmt0 < 0) fmt0 = nt->format;
        if (nt->format != fmt0 || (fmt0 == int(WFormat::kFP8Block) && rows.size() > 1 &&
                                   rows[i] % 128 != 0)) {
          ok = false;
          break;
        }
        data.insert(data.end(), nt->data.begin(), nt->data.end());
        scale.insert(scale.end(), nt->scale.begin(), nt->scale.end());
      }
    if (ok && fmt0 >= 0) return make_wbuf(ops_, WFormat(fmt0), E, N, K, data, scale);
    std::vector<float> host;
    host.reserve(size_t(E * N * K));
    for (int64_t e = 0; e < E; ++e)
      for (size_t i = 0; i < rows.size(); ++i) {
        V4_ASSIGN_OR_RETURN(auto v, ck_.read_f32(parts[e][i], {rows[i], K}));
        host.insert(host.end(), v.begin(), v.end());
      }
    return from_f32(host, E, N, K);
  }

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
  WeightFormatPolicy policy_;
};

#define LOAD(dst, name, shape, counter) V4_ASSIGN_OR_RETURN(dst, ld.f32(name, shape, counter))
#define LOADW(dst, name, N, K, counter) V4_ASSIGN_OR_RETURN(dst, ld.matrix(name, N, K, counter))

Status load_compressor(Loader& ld, const std::string& p, int c, int d, int m, int D,
                       CompressorWeights* w, int64_t* counter) {
  LOADW(w->wkv, p + "wkv.weight", int64_t(c) * d, D, counter);
  LOADW(w->wgate, p + "wgate.weight", int64_t(c) * d, D, counter);
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
  LOADW(a.wq_a, ap + "wq_a.weight", Rq, D, at);
  LOAD(a.q_norm, ap + "q_norm.weight", (std::vector<int64_t>{Rq}), at);
  LOADW(a.wq_b, ap + "wq_b.weight", H * hd, Rq, at);
  LOADW(a.wkv, ap + "wkv.weight", hd, D, at);
  LOAD(a.kv_norm, ap + "kv_norm.weight", (std::vector<int64_t>{hd}), at);
  LOADW(a.wo_a, ap + "wo_a.weight", G * R, H * hd / G, at);
  LOADW(a.wo_b, ap + "wo_b.weight", D, G * R, at);
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
      LOADW(a.index_wq_b, ap + "indexer.wq_b.weight", nI * dI, Rq, &pc->indexer);
      LOADW(a.index_weights_proj, ap + "indexer.weights_proj.weight", nI, D, &pc->indexer);
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
    V4_ASSIGN_OR_RETURN(auto w13, ld.ck().read_f32(fp + "experts.gate_up_proj", {E, 2 * I, D}));
    V4_ASSIGN_OR_RETURN(auto w2, ld.ck().read_f32(fp + "experts.down_proj", {E, D, I}));
    f.w13 = ld.from_f32(w13, E, 2 * I, D);
    f.w2 = ld.from_f32(w2, E, D, I);
  } else {
    std::vector<std::vector<std::string>> up(static_cast<size_t>(E)), down(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = fp + "experts." + std::to_string(e) + ".";
      up[size_t(e)] = {ep + "w1.weight", ep + "w3.weight"};
      down[size_t(e)] = {ep + "w2.weight"};
    }
    V4_ASSIGN_OR_RETURN(f.w13, ld.stack(up, {I, I}, D));
    V4_ASSIGN_OR_RETURN(f.w2, ld.stack(down, {D}, I));
  }
  pc->routed_experts += E * 3 * I * D;
  {
    const std::string sp = fp + "shared_experts.";
    V4_ASSIGN_OR_RETURN(f.shared_w13, ld.stack({{sp + "w1.weight", sp + "w3.weight"}}, {I, I}, D));
    V4_ASSIGN_OR_RETURN(f.shared_w2, ld.stack({{sp + "w2.weight"}}, {D}, I));
    pc->shared_experts += 3 * I * D;
  }
  return Status::Ok();
}

}  // namespace

Result<Weights> Weights::load(const Checkpoint& ck, const ModelConfig& c, ops::Ops* ops,
                              WeightFormatPolicy policy) {
  Loader ld(ck, ops, policy);
  Weights w;
  const int64_t V = c.vocab_size, D = c.hidden_size, n = c.hc_mult;
  LOAD(w.embed, "embed.weight", (std::vector<int64_t>{V, D}), &w.counts.embed);
  if (!ck.has("head.weight") && c.tie_word_embeddings) {
    LOADW(w.head, "embed.weight", V, D, nullptr);
  } else {
    LOADW(w.head, "head.weight", V, D, &w.counts.head);
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

std::map<std::string, int64_t> Weights::bytes_by_format() const {
  std::map<std::string, int64_t> m;
  auto add = [&](const WBuf& b) {
    if (b.data.size() > 0) m[ops::wformat_name(b.view.format)] += b.bytes();
  };
  auto add_layer = [&](const LayerWeights& L) {
    const auto& a = L.attn;
    for (const WBuf* b : {&a.wq_a, &a.wq_b, &a.wkv, &a.wo_a, &a.wo_b, &a.compressor.wkv,
                          &a.compressor.wgate, &a.index_compressor.wkv, &a.index_compressor.wgate,
                          &a.index_wq_b, &a.index_weights_proj, &L.ffn.w13, &L.ffn.w2,
                          &L.ffn.shared_w13, &L.ffn.shared_w2})
      add(*b);
  };
  add(head);
  for (const auto& L : layers) add_layer(L);
  for (const auto& mt : mtp) add_layer(mt.block);
  return m;
}

}  // namespace v4::model
