#include "model/weights.h"
#include "ops/null_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <new>
#include <set>

#include "base/log.h"
#include "ops/fill_random.h"

namespace v4::model {
namespace {

/// "12.34 GiB", or "5.6 MiB" below 1 GiB.
std::string gib_str(int64_t bytes) {
  if (bytes < (int64_t(1) << 30)) return fmt::format("{:.1f} MiB", double(bytes) / double(1 << 20));
  return fmt::format("{:.2f} GiB", double(bytes) / double(int64_t(1) << 30));
}

/// Counts a load's bytes and tensors against known totals; calls the observer after every
/// tensor and logs a line every log_interval_s (LoadObserver).
class ProgressReporter {
 public:
  ProgressReporter(std::string what, int64_t bytes_total, int64_t tensors_total,
                   const LoadObserver& obs)
      : what_(std::move(what)), obs_(obs), t0_(std::chrono::steady_clock::now()) {
    p_.bytes_total = bytes_total;
    p_.tensors_total = tensors_total;
    last_log_ = t0_;
    if (obs_.log) V4_LOG_INFO("{}: {} in {} tensors ...", what_, gib_str(bytes_total), tensors_total);
  }
  void add(int64_t bytes, int64_t tensors) {
    p_.bytes_done += bytes;
    p_.tensors_done += tensors;
    const auto now = std::chrono::steady_clock::now();
    p_.elapsed_s = std::chrono::duration<double>(now - t0_).count();
    if (obs_.on_progress) obs_.on_progress(p_);
    if (obs_.log && obs_.log_interval_s > 0 &&
        std::chrono::duration<double>(now - last_log_).count() >= obs_.log_interval_s) {
      last_log_ = now;
      V4_LOG_INFO("{}: {} / {} ({:.0f}%), {} / {} tensors, {:.0f}s elapsed", what_,
                  gib_str(p_.bytes_done), gib_str(p_.bytes_total), percent(), p_.tensors_done,
                  p_.tensors_total, p_.elapsed_s);
    }
  }
  void finish() {
    p_.elapsed_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    p_.finished = true;
    if (obs_.on_progress) obs_.on_progress(p_);
    if (!obs_.log) return;
    V4_LOG_INFO("{}: done, {} / {} ({:.0f}%), {} / {} tensors in {:.2f}s ({:.2f} GB/s)", what_,
                gib_str(p_.bytes_done), gib_str(p_.bytes_total), percent(), p_.tensors_done,
                p_.tensors_total, p_.elapsed_s,
                p_.elapsed_s > 0 ? double(p_.bytes_done) / p_.elapsed_s / 1e9 : 0.0);
  }

 private:
  double percent() const {
    return p_.bytes_total > 0 ? 100.0 * double(p_.bytes_done) / double(p_.bytes_total) : 100.0;
  }
  std::string what_;
  const LoadObserver& obs_;
  std::chrono::steady_clock::time_point t0_, last_log_;
  LoadProgress p_;
};

/// The checkpoint tensors Weights::load reads for `cfg`: everything but the layers past
/// num_hidden_layers (a --num-layers cut) and MTP modules past num_nextn_predict_layers.
bool loaded_tensor(const std::string& name, const ModelConfig& cfg) {
  auto index_after = [&](const std::string& prefix, int bound) {
    if (name.rfind(prefix, 0) != 0) return true;
    const size_t dot = name.find('.', prefix.size());
    try {
      return std::stoi(name.substr(prefix.size(), dot - prefix.size())) < bound;
    } catch (...) {
      return true;
    }
  };
  return index_after("layers.", cfg.num_hidden_layers) &&
         index_after("mtp.", cfg.num_nextn_predict_layers);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

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
  Loader(const Checkpoint& ck, ops::Ops* ops, WeightFormatPolicy policy,
         ProgressReporter* progress = nullptr)
      : ck_(ck), ops_(ops), policy_(policy), progress_(progress) {}

  /// Reports checkpoint tensor `name` (and its `.scale`) as loaded, once.
  void loaded(const std::string& name) {
    if (!progress_ || !seen_.insert(name).second) return;
    const TensorInfo* t = ck_.find(name);
    int64_t bytes = t ? int64_t(t->bytes) : 0;
    if (ends_with(name, ".weight"))
      if (const TensorInfo* sc = ck_.find(name.substr(0, name.size() - 7) + ".scale"))
        bytes += int64_t(sc->bytes);
    progress_->add(bytes, 1);
  }

  /// Checkpoint tensors the model would read (loaded_tensor; `.scale` companions excluded) that
  /// no load reported: stray or renamed tensors. Needs the progress reporter (it fills seen_).
  std::vector<std::string> unused(const ModelConfig& c) const {
    std::vector<std::string> out;
    for (const auto& [name, t] : ck_.tensors())
      if (loaded_tensor(name, c) && !ends_with(name, ".scale") && !seen_.count(name))
        out.push_back(name);
    return out;
  }

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
      WBuf w = make_wbuf(ops_, WFormat(nt->format), 1, N, K, nt->data, nt->scale);
      loaded(name);
      return w;
    }
    if (nt.status().code() != ErrorCode::kUnsupported) return nt.status();
    V4_ASSIGN_OR_RETURN(std::vector<float> host, ck_.read_f32(name, {N, K}));
    if (counter) *counter += N * K;
    WBuf w = from_f32(host, 1, N, K);
    loaded(name);
    return w;
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
    if (ok && fmt0 >= 0) {
      WBuf w = make_wbuf(ops_, WFormat(fmt0), E, N, K, data, scale);
      for (const auto& p : parts)
        for (const auto& name : p) loaded(name);
      return w;
    }
    std::vector<float> host;
    host.reserve(size_t(E * N * K));
    for (int64_t e = 0; e < E; ++e)
      for (size_t i = 0; i < rows.size(); ++i) {
        V4_ASSIGN_OR_RETURN(auto v, ck_.read_f32(parts[e][i], {rows[i], K}));
        host.insert(host.end(), v.begin(), v.end());
      }
    WBuf w = from_f32(host, E, N, K);
    for (const auto& p : parts)
      for (const auto& name : p) loaded(name);
    return w;
  }

  Result<FBuf> f32(const std::string& name, const std::vector<int64_t>& shape, int64_t* counter) {
    V4_ASSIGN_OR_RETURN(std::vector<float> host, ck_.read_f32(name, shape));
    if (counter) *counter += numel(shape);
    FBuf b = upload(host);
    loaded(name);
    return b;
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
    loaded(name);
    return b;
  }
  const Checkpoint& ck() const { return ck_; }

 private:
  const Checkpoint& ck_;
  ops::Ops* ops_;
  WeightFormatPolicy policy_;
  ProgressReporter* progress_;
  std::set<std::string> seen_;
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
    ld.loaded(fp + "experts.gate_up_proj");
    ld.loaded(fp + "experts.down_proj");
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
                              WeightFormatPolicy policy, const LoadObserver& obs) {
  const int64_t bytes_total = checkpoint_load_bytes(ck, c);
  int64_t tensors_total = 0;
  for (const auto& [name, t] : ck.tensors())
    if (loaded_tensor(name, c)) tensors_total += ends_with(name, ".scale") ? 0 : 1;
  ProgressReporter progress(fmt::format("loading weights from {}", ck.dir()), bytes_total,
                            tensors_total, obs);
  Loader ld(ck, ops, policy, &progress);
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
  progress.finish();
  if (const auto un = ld.unused(c); !un.empty()) {
    std::string names;
    for (size_t i = 0; i < un.size() && i < 3; ++i) names += (i ? ", '" : "'") + un[i] + "'";
    V4_LOG_WARN("{}: {} tensor(s) of the checkpoint are not used by the model ({}{}): a stray "
                "tensor or a layout this version does not know",
                ck.dir(), un.size(), names, un.size() > 3 ? ", …" : "");
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

int64_t Weights::vector_bytes() const {
  int64_t b = 0;
  auto f = [&](const FBuf& x) { b += x.size() * int64_t(sizeof(float)); };
  auto i = [&](const IBuf& x) { b += x.size() * int64_t(sizeof(int32_t)); };
  auto comp = [&](const CompressorWeights& c) {
    f(c.ape);
    f(c.norm);
  };
  auto layer = [&](const LayerWeights& L) {
    for (const FBuf* x : {&L.attn_norm, &L.ffn_norm, &L.hc_attn_fn, &L.hc_attn_base,
                          &L.hc_attn_scale, &L.hc_ffn_fn, &L.hc_ffn_base, &L.hc_ffn_scale,
                          &L.attn.q_norm, &L.attn.kv_norm, &L.attn.sinks, &L.ffn.gate, &L.ffn.bias})
      f(*x);
    comp(L.attn.compressor);
    comp(L.attn.index_compressor);
    i(L.ffn.tid2eid);
  };
  for (const FBuf* x : {&embed, &norm, &hc_head_fn, &hc_head_base, &hc_head_scale}) f(*x);
  for (const auto& L : layers) layer(L);
  for (const auto& m : mtp) {
    for (const FBuf* x : {&m.e_proj, &m.h_proj, &m.enorm, &m.hnorm, &m.norm, &m.hc_head_fn,
                          &m.hc_head_base, &m.hc_head_scale})
      f(*x);
    layer(m.block);
  }
  return b;
}

// ---- dummy weights (--load-format dummy) ------------------------------------------------------
namespace {

using ops::RandomFill;

/// Generates the tensors of Weights::dummy on the backend, one fresh seed per tensor.
class DummyGen {
 public:
  /// `formats` resolves formats (ops->supports); usually the backend itself (the estimate runs
  /// on a counting backend that asks the real one).
  DummyGen(ops::Ops* ops, WeightFormatPolicy policy, uint64_t seed,
           ProgressReporter* progress = nullptr, const ops::Ops* formats = nullptr)
      : ops_(ops), formats_(formats ? formats : ops), policy_(policy), seed_(seed),
        progress_(progress) {}

  FBuf normal(int64_t n, float stddev) {
    FBuf b(ops_, n);
    ops_->fill_random(b.data(), n, RandomFill::kF32Normal, stddev, next_seed());
    generated(n * 4);
    return b;
  }
  FBuf constant(int64_t n, float v) {
    FBuf b(ops_, n);
    ops_->fill_random(b.data(), n, RandomFill::kF32Constant, v, next_seed());
    generated(n * 4);
    return b;
  }
  IBuf uniform_int(int64_t n, int64_t bound) {
    IBuf b(ops_, n);
    ops_->fill_random(b.data(), n, RandomFill::kI32Uniform, float(bound), next_seed());
    generated(n * 4);
    return b;
  }
  /// Tensors generated so far and their backend bytes.
  const WeightFootprint& footprint() const { return footprint_; }

  /// The format a matrix stored as `want` in a real checkpoint gets on this backend (the same
  /// fallbacks as Weights::load: unsupported → f32, or bf16 with f32_as_bf16).
  WFormat resolve(WFormat want, int64_t K) const {
    if (want == WFormat::kMXFP4 && K % 32 != 0) want = WFormat::kFP8Block;
    if (want != WFormat::kF32 && policy_.native && formats_->supports(want)) return want;
    if (policy_.f32_as_bf16 && formats_->supports(WFormat::kBF16)) return WFormat::kBF16;
    return WFormat::kF32;
  }

  /// E matrices [N, K] with values ≈ N(0, 1/K), stored as `resolve(want, K)`.
  WBuf matrix(WFormat want, int64_t E, int64_t N, int64_t K) {
    const WFormat f = resolve(want, K);
    const float sigma = 1.f / std::sqrt(float(K));
    const int64_t units = E * N * K;
    WBuf w;
    switch (f) {
      case WFormat::kF32:
        w.data = ops::DeviceBuffer<uint8_t>(ops_, units * 4);
        ops_->fill_random(w.data.data(), units, RandomFill::kF32Normal, sigma, next_seed());
        break;
      case WFormat::kBF16:
        w.data = ops::DeviceBuffer<uint8_t>(ops_, units * 2);
        ops_->fill_random(w.data.data(), units, RandomFill::kBF16Normal, sigma, next_seed());
        break;
      case WFormat::kFP8Block: {
        // Power-of-two block scale b near σ; e4m3 codes carry σ/b ∈ [0.7, 1.4].
        const float b = std::ldexp(1.f, int(std::lround(std::log2(double(sigma)))));
        w.data = ops::DeviceBuffer<uint8_t>(ops_, units);
        ops_->fill_random(w.data.data(), units, RandomFill::kE4M3Normal, sigma / b, next_seed());
        const int64_t n_scale = E * ((N + 127) / 128) * ((K + 127) / 128);
        w.scale = ops::DeviceBuffer<uint8_t>(ops_, n_scale * 4);
        ops_->fill_random(w.scale.data(), n_scale, RandomFill::kF32Constant, b, next_seed());
        break;
      }
      case WFormat::kMXFP4: {
        // Uniform e2m1 codes have RMS √8.5625 ≈ 2.926; the ±1 exponent jitter multiplies the
        // RMS by √((1/4 + 1 + 4)/3) ≈ 1.323.
        const float s = sigma / (2.9262f * 1.3229f);
        w.data = ops::DeviceBuffer<uint8_t>(ops_, units / 2);
        ops_->fill_random(w.data.data(), units / 2, RandomFill::kE2M1Packed, 1.f, next_seed());
        w.scale = ops::DeviceBuffer<uint8_t>(ops_, units / 32);
        ops_->fill_random(w.scale.data(), units / 32, RandomFill::kUe8m0, s, next_seed());
        break;
      }
    }
    w.view.data = w.data.data();
    w.view.scale = w.scale.data();
    w.view.format = f;
    w.view.n = N;
    w.view.k = K;
    w.view.experts = E;
    w.view.row0 = 0;
    w.view.rows_total = N;
    generated(w.bytes());
    return w;
  }

 private:
  void generated(int64_t bytes) {
    footprint_.bytes += bytes;
    footprint_.tensors += 1;
    if (progress_) progress_->add(bytes, 1);
  }
  uint64_t next_seed() { return ops::fill::mix64(seed_ + 0x632be59bd9b4e019ull * ++counter_); }
  ops::Ops* ops_;
  const ops::Ops* formats_;
  WeightFormatPolicy policy_;
  uint64_t seed_;
  ProgressReporter* progress_;
  uint64_t counter_ = 0;
  WeightFootprint footprint_;
};

/// Checkpoint formats of a config (dsv4-model.md §11.1).
struct DummyFormats {
  WFormat fp8_matrix;  // attention, indexer wq_b, shared expert
  WFormat bf16_matrix; // compressors, indexer weights_proj, lm_head
  WFormat experts;     // routed experts
};
DummyFormats checkpoint_formats(const ModelConfig& c) {
  const bool bf16 = c.torch_dtype == "bfloat16" || c.torch_dtype == "bf16";
  const WFormat dense = bf16 ? WFormat::kBF16 : WFormat::kF32;
  if (!c.has_quantization_config) return {dense, dense, dense};
  return {WFormat::kFP8Block, WFormat::kBF16,
          c.expert_dtype == "fp4" ? WFormat::kMXFP4 : WFormat::kFP8Block};
}

void dummy_compressor(DummyGen& g, WFormat f, int c, int d, int m, int D, CompressorWeights* w,
                      int64_t* counter) {
  w->wkv = g.matrix(f, 1, int64_t(c) * d, D);
  w->wgate = g.matrix(f, 1, int64_t(c) * d, D);
  w->ape = g.normal(int64_t(m) * c * d, 0.1f);
  w->norm = g.constant(d, 1.f);
  *counter += 2 * int64_t(c) * d * D + int64_t(m) * c * d + d;
}

void dummy_block(DummyGen& g, const ModelConfig& c, const DummyFormats& fm, LayerKind kind,
                 MlpKind mlp, LayerWeights* L, ParamCounts* pc) {
  const int64_t D = c.hidden_size, n = c.hc_mult, H = c.num_attention_heads, hd = c.head_dim;
  const int64_t Rq = c.q_lora_rank, G = c.o_groups, R = c.o_lora_rank;
  const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size, k = c.num_experts_per_tok;
  const int64_t mix = (2 + n) * n;
  L->kind = kind;
  L->mlp = mlp;
  L->attn_norm = g.constant(D, 1.f);
  L->ffn_norm = g.constant(D, 1.f);
  // mHC: mix = RMS(flat)·fnᵀ has standard deviation 0.1 (fn entries N(0, 0.01/(n·D))).
  const float fn_std = 0.1f / std::sqrt(float(n * D));
  L->hc_attn_fn = g.normal(mix * n * D, fn_std);
  L->hc_attn_base = g.normal(mix, 0.1f);
  L->hc_attn_scale = g.constant(3, 1.f);
  L->hc_ffn_fn = g.normal(mix * n * D, fn_std);
  L->hc_ffn_base = g.normal(mix, 0.1f);
  L->hc_ffn_scale = g.constant(3, 1.f);
  pc->norms_and_mhc += 2 * D + 2 * (mix * n * D + mix + 3);

  auto& a = L->attn;
  a.wq_a = g.matrix(fm.fp8_matrix, 1, Rq, D);
  a.q_norm = g.constant(Rq, 1.f);
  a.wq_b = g.matrix(fm.fp8_matrix, 1, H * hd, Rq);
  a.wkv = g.matrix(fm.fp8_matrix, 1, hd, D);
  a.kv_norm = g.constant(hd, 1.f);
  a.wo_a = g.matrix(fm.fp8_matrix, 1, G * R, H * hd / G);
  a.wo_b = g.matrix(fm.fp8_matrix, 1, D, G * R);
  a.sinks = g.normal(H, 1.f);
  pc->attention += Rq * D + Rq + H * hd * Rq + hd * D + hd + G * R * (H * hd / G) + D * G * R + H;
  if (kind != LayerKind::kSliding) {
    const int m = c.compress_rate(kind);
    const int cc = kind == LayerKind::kCsa ? 2 : 1;
    dummy_compressor(g, fm.bf16_matrix, cc, int(hd), m, int(D), &a.compressor, &pc->compressor);
    if (kind == LayerKind::kCsa) {
      const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
      dummy_compressor(g, fm.bf16_matrix, 2, int(dI), m, int(D), &a.index_compressor,
                       &pc->indexer);
      a.index_wq_b = g.matrix(fm.fp8_matrix, 1, nI * dI, Rq);
      a.index_weights_proj = g.matrix(fm.bf16_matrix, 1, nI, D);
      pc->indexer += nI * dI * Rq + nI * D;
    }
  }

  auto& f = L->ffn;
  f.gate = g.normal(E * D, 1.f / std::sqrt(float(D)));
  pc->router += E * D;
  if (mlp == MlpKind::kHashMoe) {
    f.tid2eid = g.uniform_int(c.vocab_size * k, E);
    pc->router += c.vocab_size * k;
  } else {
    f.bias = g.normal(E, 0.01f);
    pc->router += E;
  }
  f.w13 = g.matrix(fm.experts, E, 2 * I, D);
  f.w2 = g.matrix(fm.experts, E, D, I);
  pc->routed_experts += E * 3 * I * D;
  f.shared_w13 = g.matrix(fm.fp8_matrix, 1, 2 * I, D);
  f.shared_w2 = g.matrix(fm.fp8_matrix, 1, D, I);
  pc->shared_experts += 3 * I * D;
}

/// Allocates nothing (distinct placeholder addresses, never dereferenced), runs no op: the
/// generator run on it only counts.
class CountingOps final : public ops::NullOps {
 public:
  std::string name() const override { return "counting"; }
  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    next_ += (bytes + 255) / 256 * 256;
    return reinterpret_cast<void*>(next_);
  }
  void fill_random(void*, int64_t, ops::RandomFill, float, uint64_t) override {}

 private:
  uintptr_t next_ = uintptr_t(1) << 40;
};

/// Generates (or, on a counting backend, counts) every tensor of Weights::dummy into `w`.
void generate_dummy(DummyGen& g, const ModelConfig& c, Weights& w, int* done) {
  const DummyFormats fm = checkpoint_formats(c);
  const int64_t V = c.vocab_size, D = c.hidden_size, n = c.hc_mult;
  w.embed = g.normal(V * D, 1.f);
  w.counts.embed = V * D;
  w.head = g.matrix(fm.bf16_matrix, 1, V, D);
  w.counts.head = V * D;
  w.norm = g.constant(D, 1.f);
  w.hc_head_fn = g.normal(n * n * D, 0.1f / std::sqrt(float(n * D)));
  w.hc_head_base = g.normal(n, 0.1f);
  w.hc_head_scale = g.constant(1, 1.f);
  w.counts.norms_and_mhc += D + n * n * D + n + 1;
  w.layers.resize(size_t(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l, ++*done)
    dummy_block(g, c, fm, c.layer_types[l], c.mlp_layer_types[l], &w.layers[l], &w.counts);
}

}  // namespace

WeightFootprint estimate_weight_footprint(const ModelConfig& c, const ops::Ops& ops,
                                          WeightFormatPolicy policy) {
  CountingOps counting;
  DummyGen g(&counting, policy, 0, nullptr, &ops);
  int done = 0;
  {
    Weights w;
    generate_dummy(g, c, w, &done);
  }
  return g.footprint();
}

int64_t checkpoint_load_bytes(const Checkpoint& ck, const ModelConfig& c) {
  int64_t bytes = 0;
  for (const auto& [name, t] : ck.tensors())
    if (loaded_tensor(name, c)) bytes += int64_t(t.bytes);
  return bytes;
}

Status check_weights_fit(const std::string& model_name, const ModelConfig& c, ops::Ops* ops,
                         WeightFormatPolicy policy, int64_t stored_bytes) {
  const ops::MemoryInfo m = ops->memory_info();
  if (m.free_bytes <= 0) return Status::Ok();  // the backend does not say
  WeightFootprint need = estimate_weight_footprint(c, *ops, policy);
  const bool native = policy.native && (ops->supports(WFormat::kBF16) ||
                                        ops->supports(WFormat::kFP8Block) ||
                                        ops->supports(WFormat::kMXFP4));
  if (stored_bytes >= 0 && native) need.bytes = std::min(need.bytes, stored_bytes);
  if (need.bytes <= m.free_bytes) return Status::Ok();
  // What --num-layers can do: the most leading layers whose weights fit (0: not even one).
  auto fits_with = [&](int n) {
    ModelConfig cut = c;
    if (!cut.truncate_layers(n).ok()) return false;
    return estimate_weight_footprint(cut, *ops, policy).bytes <= m.free_bytes;
  };
  int lo = 0, hi = c.num_hidden_layers - 1;  // fits_with(lo) holds (0 = none), the answer < L
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (fits_with(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
#ifdef V4_HAVE_CUDA
  const char* gpu = "a GPU backend (--device cuda) that keeps the checkpoint's FP8/FP4 formats";
#else
  const char* gpu =
      "a GPU backend that keeps the checkpoint's FP8/FP4 formats (--device cuda, in a build "
      "configured with -DV4_CUDA=ON)";
#endif
  const bool cpu = ops->name() == "cpu";
  std::string hint;
  if (lo >= 1) {
    hint = fmt::format("; use --num-layers {} (or fewer) to keep only the first layers{}{}", lo,
                       cpu ? " or " : "", cpu ? gpu : "");
  } else {
    ModelConfig one = c;
    const int64_t one_bytes =
        one.truncate_layers(1).ok() ? estimate_weight_footprint(one, *ops, policy).bytes : -1;
    hint = fmt::format("; even 1 layer needs {}, so --num-layers cannot make it fit{}{}",
                       gib_str(one_bytes), cpu ? ": use " : "", cpu ? gpu : "");
  }
  return make_error(ErrorCode::kResourceExhausted,
                    "{}: the weights of {} layer{} need {} ({} bytes) on the {} backend but only "
                    "{} ({} bytes) is available{}{}",
                    model_name, c.num_hidden_layers, c.num_hidden_layers == 1 ? "" : "s",
                    gib_str(need.bytes), need.bytes, ops->name(), gib_str(m.free_bytes),
                    m.free_bytes, cpu ? " (MemAvailable)" : "", hint);
}

Result<Weights> Weights::dummy(const ModelConfig& c, ops::Ops* ops, WeightFormatPolicy policy,
                               uint64_t seed, const LoadObserver& obs) {
  const WeightFootprint total = estimate_weight_footprint(c, *ops, policy);
  ProgressReporter progress("generating dummy weights", total.bytes, total.tensors, obs);
  DummyGen g(ops, policy, seed, &progress);
  Weights w;
  int done = 0;
  try {
    generate_dummy(g, c, w, &done);
    ops->synchronize();
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kResourceExhausted,
                      "--load-format dummy: the {} backend ran out of memory after {} layers "
                      "({:.2f} GiB of matrices); use --num-layers to keep fewer layers",
                      ops->name(), done, [&] {
                        int64_t b = 0;
                        for (const auto& [fmt_name, bytes] : w.bytes_by_format()) b += bytes;
                        return double(b) / double(int64_t(1) << 30);
                      }());
  }
  progress.finish();
  return w;
}

namespace {

class ShapeOnlyOps final : public ops::NullOps {
 public:
  std::string name() const override { return "shape-only"; }
  bool supports(WFormat) const override { return true; }
  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    next_ += (bytes + 255) / 256 * 256;  // distinct, aligned, never dereferenced
    return reinterpret_cast<void*>(next_);
  }
  void download(void* dst, const void*, size_t bytes) override { std::memset(dst, 0, bytes); }
  void linear_w(const float*, int64_t, const ops::WeightView&, int64_t, float*, int64_t) override {}
  void fill_random(void*, int64_t, ops::RandomFill, float, uint64_t) override {}
  void copy(void*, const void*, size_t) override {}

 private:
  uintptr_t next_ = uintptr_t(1) << 40;
};

}  // namespace

std::unique_ptr<ops::Ops> make_shape_only_ops() {
  return std::make_unique<ShapeOnlyOps>();
}

}  // namespace v4::model
