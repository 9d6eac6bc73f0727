#include "model/deepseek_v4.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <limits>
#include <numeric>
#include <set>
#include <string>

#include "base/log.h"
#include "model/step_plan.h"

namespace v4::model {

using ops::DeviceBuffer;

namespace {

template <typename T>
DeviceBuffer<T> upload_vec(ops::Ops* ops, const std::vector<T>& v) {
  DeviceBuffer<T> b(ops, int64_t(v.size()));
  if (!v.empty()) ops->upload(b.data(), v.data(), v.size() * sizeof(T));
  return b;
}

/// A host vector copied into step memory.
template <typename T>
T* to_step(ops::Ops* ops, StepMemory& mem, const std::vector<T>& v) {
  T* p = mem.alloc_n<T>(int64_t(v.size()));
  if (!v.empty()) ops->upload(p, v.data(), v.size() * sizeof(T));
  return p;
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

// Region names of the step profile (ops::Ops::region), per attention kind: the parts of a layer
// whose device time `v4serve bench --profile` reports.
enum Region { kRHcAttn, kRQ, kRKv, kRComp, kRIndexComp, kRIndexQ, kRIndexTopk, kRCore, kROut,
              kRHcFfn, kRRouter, kRRouted, kRShared, kRQTail, kRIndexSel, kROutB, kRHcPostAttn,
              kNumRegions };
const char* region_name(LayerKind k, Region r) {
  static const char* const names[3][kNumRegions] = {
      {"swa: mHC pre + norm (attn)", "swa: q (wq_a, q_norm, wq_b, head norm, rope)",
       "swa: kv (wkv, norm, rope, SWA store)", "", "", "", "", "swa: sparse attention",
       "swa: out (inverse rope, wo_a)", "swa: mHC pre + norm (ffn)", "swa: MoE router",
       "swa: MoE routed experts", "swa: MoE shared expert + add + mHC post", "", "",
       "swa: out (wo_b)", "swa: mHC post (attn)"},
      {"csa: mHC pre + norm (attn)", "csa: q (wq_a, q_norm)",
       "csa: kv (wkv, norm, rope, SWA store)", "csa: compressor (wkv, wgate, pool, norm, rope, store, ring)",
       "csa: indexer weights + compressor", "csa: indexer q (index_wq_b, rope)",
       "csa: indexer scores",  // then kRIndexSel, marked by backends that split the chain
       "csa: sparse attention", "csa: out (inverse rope, wo_a)", "csa: mHC pre + norm (ffn)",
       "csa: MoE router", "csa: MoE routed experts", "csa: MoE shared expert + add + mHC post",
       "csa: q tail (wq_b, head norm, rope)", "csa: indexer top-k + finalize", "csa: out (wo_b)",
       "csa: mHC post (attn)"},
      {"hca: mHC pre + norm (attn)", "hca: q (wq_a, q_norm, wq_b, head norm, rope)",
       "hca: kv (wkv, norm, rope, SWA store)", "hca: compressor (wkv, wgate, pool, norm, rope, store, ring)",
       "", "", "", "hca: sparse attention", "hca: out (inverse rope, wo_a)",
       "hca: mHC pre + norm (ffn)", "hca: MoE router", "hca: MoE routed experts",
       "hca: MoE shared expert + add + mHC post", "", "", "hca: out (wo_b)",
       "hca: mHC post (attn)"}};
  return names[int(k)][r];
}

bool env_graphs_off() {
  const char* e = std::getenv("V4_DECODE_GRAPHS");
  return e && std::string(e) == "0";
}

PlanShape shape_of(const ModelConfig& c) {
  PlanShape s;
  s.window = c.sliding_window;
  for (auto k : c.layer_types) {
    if (k == LayerKind::kCsa) s.csa_ratio = c.compress_rate_csa;
    if (k == LayerKind::kHca) s.hca_ratio = c.compress_rate_hca;
  }
  s.index_topk = c.index_topk;
  return s;
}

/// Compressor plan of one rate (dsv4-model.md §5) as the layers read it: the rows that close in
/// this step with their sources, the ring rows to refresh, the causal candidate map. Host-planned
/// steps list only closing rows; device-planned steps have one entry per batch row (dst −1 where
/// nothing closes, ring_dst −1 for padding: store_rows skips them).
struct CompressPlan {
  int ratio = 0, overlap = 1;
  int64_t n_out = 0;
  const int32_t* src = nullptr;        // [n_out, c·m]
  const int64_t* positions = nullptr;  // [n_out] rope position w·m
  const int32_t* dst = nullptr;        // [n_out] compressed-pool rows
  int64_t n_ring = 0;
  const int32_t* ring_src = nullptr;  // [n_ring] batch rows
  const int32_t* ring_dst = nullptr;  // [n_ring] ring rows
  bool ring_disjoint = false;         // no ring row refreshed is read as state (CompressFusedArgs)
  bool rows_close = false;            // host plan: every row closes a window (CompressFusedArgs)
  ops::RowMap cand;                   // per query: all causal compressed rows (w < (t+1)/m)
  int64_t max_cand = 0;               // ≥ every cand.count (indexer grid bound)
};

/// Releases the step-memory blocks of a scope (a layer's temporaries) when it ends.
class StepScope {
 public:
  explicit StepScope(StepMemory& m) : m_(m), mark_(m.mark()) {}
  ~StepScope() { m_.release(mark_); }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  StepMemory& m_;
  StepMemory::Mark mark_;
};

/// The head's device sampling: rows `logits` [slices.size(), V] belong to batch.slices[slices[k]]
/// (each with `sample` set); fills out->tokens (and the logprob fields when asked).
/// Errors: kInternal when the backend refuses or returns a token outside the vocabulary.
Status sample_on_device(ops::Ops* ops, int64_t V, const ForwardBatch& batch,
                        const std::vector<size_t>& slices, const float* logits,
                        ForwardOutput* out) {
  const int64_t R = int64_t(slices.size());
  std::vector<ops::SampleRowParams> prm(slices.size());
  bool all_greedy = true, want_lp = false;
  int32_t top_n = 0;
  for (size_t k = 0; k < slices.size(); ++k) {
    const DeviceSampling& d = *batch.slices[slices[k]].sample;
    ops::SampleRowParams& p = prm[k];
    p.seed = d.seed;
    p.step = d.step;
    p.temperature = d.temperature;
    p.top_p = d.top_p;
    p.min_p = d.min_p;
    p.top_k = d.top_k;
    p.logprobs = d.top_logprobs >= 0 ? 1 : 0;
    all_greedy &= d.temperature == 0.f;
    want_lp |= d.top_logprobs >= 0;
    top_n = std::max(top_n, d.top_logprobs);
  }
  if (top_n > 20)
    return make_error(ErrorCode::kInvalidArgument, "forward: top_logprobs {} > 20", top_n);
  auto prm_dev = upload_vec(ops, prm);
  DeviceBuffer<int32_t> tok(ops, R), top_tok;
  DeviceBuffer<float> lp, top_lp;
  ops::SampleArgs sa;
  sa.logits = logits;
  sa.params = prm_dev.data();
  sa.n_rows = R;
  sa.vocab = V;
  sa.all_greedy = all_greedy;
  sa.out_tokens = tok.data();
  if (want_lp) {
    lp = DeviceBuffer<float>(ops, R);
    sa.out_logprob = lp.data();
    sa.top_n = top_n;
    if (top_n > 0) {
      top_tok = DeviceBuffer<int32_t>(ops, R * top_n);
      top_lp = DeviceBuffer<float>(ops, R * top_n);
      sa.out_top_tokens = top_tok.data();
      sa.out_top_logprobs = top_lp.data();
    }
  }
  if (!ops->sample(sa))
    return make_error(ErrorCode::kInternal, "forward: the {} backend refused to sample",
                      ops->name());
  std::vector<int32_t> toks(slices.size());
  ops->download(toks.data(), tok.data(), toks.size() * sizeof(int32_t));
  const size_t n_sl = batch.slices.size();
  out->tokens.assign(n_sl, -1);
  for (size_t k = 0; k < slices.size(); ++k) {
    if (toks[k] < 0 || toks[k] >= V)
      return make_error(ErrorCode::kInternal, "forward: sampled token {} outside [0, {})", toks[k],
                        V);
    out->tokens[slices[k]] = toks[k];
  }
  if (want_lp) {
    std::vector<float> l(slices.size()), tl(size_t(R * top_n));
    std::vector<int32_t> tt(size_t(R * top_n));
    ops->download(l.data(), lp.data(), l.size() * sizeof(float));
    if (top_n > 0) {
      ops->download(tt.data(), top_tok.data(), tt.size() * sizeof(int32_t));
      ops->download(tl.data(), top_lp.data(), tl.size() * sizeof(float));
    }
    out->token_logprob.assign(n_sl, std::numeric_limits<float>::quiet_NaN());
    out->top_n = top_n;
    out->top_tokens.assign(n_sl * size_t(top_n), -1);
    out->top_logprobs.assign(n_sl * size_t(top_n), std::numeric_limits<float>::quiet_NaN());
    for (size_t k = 0; k < slices.size(); ++k) {
      if (prm[k].logprobs == 0) continue;
      const size_t i = slices[k];
      out->token_logprob[i] = l[k];
      for (int32_t j = 0; j < top_n; ++j) {
        out->top_tokens[i * size_t(top_n) + size_t(j)] = tt[k * size_t(top_n) + size_t(j)];
        out->top_logprobs[i * size_t(top_n) + size_t(j)] = tl[k * size_t(top_n) + size_t(j)];
      }
    }
  }
  return Status::Ok();
}

/// Output of a decode step whose logits rows [n, V] (on the backend) follow the slices, one row
/// per slice: slices asking for `sample` get a token sampled on the backend when it can (no
/// logits row), the others their row. Mixed steps gather each kind into one block first.
Status decode_output(ops::Ops* ops, int64_t V, const ForwardBatch& batch, const float* logits,
                     ForwardOutput* out) {
  ops->region("output (sampling / logits download)");
  const size_t n = batch.slices.size();
  std::vector<size_t> dev;
  std::vector<int32_t> dev_rows, host_rows;
  for (size_t i = 0; i < n; ++i)
    if (batch.slices[i].sample && !batch.slices[i].logits_all) dev.push_back(i);
  if (!dev.empty() && !ops->sample(ops::SampleArgs{})) dev.clear();
  out->row_begin.assign(1, 0);
  for (size_t i = 0, k = 0; i < n; ++i) {
    if (k < dev.size() && dev[k] == i) {
      dev_rows.push_back(int32_t(i));
      ++k;
    } else {
      host_rows.push_back(int32_t(i));
    }
    out->row_begin.push_back(int64_t(host_rows.size()));
  }
  auto gathered = [&](const std::vector<int32_t>& rows, DeviceBuffer<float>* tmp) {
    if (rows.size() == n) return logits;  // every row, in order
    auto idx = upload_vec(ops, rows);
    *tmp = DeviceBuffer<float>(ops, int64_t(rows.size()) * V);
    ops->gather_rows(logits, idx.data(), int64_t(rows.size()), V, tmp->data());
    return static_cast<const float*>(tmp->data());
  };
  if (!dev.empty()) {
    DeviceBuffer<float> tmp;
    V4_RETURN_IF_ERROR(sample_on_device(ops, V, batch, dev, gathered(dev_rows, &tmp), out));
  }
  out->logits.resize(host_rows.size() * size_t(V));
  if (!host_rows.empty()) {
    DeviceBuffer<float> tmp;
    ops->download(out->logits.data(), gathered(host_rows, &tmp),
                  out->logits.size() * sizeof(float));
  }
  return Status::Ok();
}

}  // namespace

/// Everything one step computes once and every layer reuses ("plan, then run"). Arrays live in
/// `mem` (or, for ids on the decode path, in the staging buffer).
struct DeepseekV4::Step {
  cache::KvCache* kv = nullptr;
  StepMemory* mem = nullptr;
  int64_t S = 0;
  const int32_t* ids = nullptr;          // [S]
  const int64_t* pos = nullptr;          // [S]
  const int32_t* swa_dst = nullptr;      // [S] SWA row of each new token (−1 = skip)
  ops::RowMap swa;                       // per query: window keys
  CompressPlan csa, hca;                 // by layer kind
  const int64_t* topk_offset = nullptr;  // [S] t·index_topk
  const int32_t* shared_idx = nullptr;   // [S] zeros: the shared expert's "expert 0"
  const float* shared_w = nullptr;       // [S] ones: its weight
  template <typename T>
  T* buf(int64_t n) {
    return mem->alloc_n<T>(n);
  }
};

/// The decode fast path's state for one KvCache: a device mirror of its page tables, the staging
/// buffer of raw batch state, and the graphs captured against it (they bake in this cache's pool
/// addresses and these buffers, so all of it is dropped when another cache comes).
struct DeepseekV4::DecodeState {
  struct Entry {  // one (batch bucket, context bucket)
    std::unique_ptr<ops::Graph> graph;
    std::shared_ptr<DeviceBuffer<char>> workspace;  // the region the graph's temporaries use
    float* logits = nullptr;                        // [B, vocab] inside workspace
    size_t peak = 0;                                // step-memory bytes (eager warm-up)
    bool failed = false;                            // capture failed: stay eager
  };
  uint64_t cache_id = 0;
  int64_t P = 0;  // pages per table row
  DecodeStager stager;
  DeviceBuffer<int32_t> staging;                  // DecodeStager layout
  DeviceBuffer<int32_t> page_table, swa_table;    // [max_seqs, P]
  std::shared_ptr<DeviceBuffer<char>> workspace;  // region for the next capture (grows ×2)
  std::map<std::pair<int64_t, int64_t>, Entry> entries;
};

DeepseekV4::~DeepseekV4() = default;

Result<std::unique_ptr<DeepseekV4>> DeepseekV4::load(const std::string& dir, ops::Ops* ops,
                                                     WeightFormatPolicy policy, int num_layers) {
  std::unique_ptr<DeepseekV4> m(new DeepseekV4());
  m->ops_ = ops;
  V4_ASSIGN_OR_RETURN(m->cfg_, ModelConfig::load(dir));
  if (num_layers > 0) V4_RETURN_IF_ERROR(m->cfg_.truncate_layers(num_layers));
  V4_ASSIGN_OR_RETURN(m->ck_, Checkpoint::open(dir));  // headers only (mapped, not read)
  V4_RETURN_IF_ERROR(
      check_weights_fit(dir, m->cfg_, ops, policy, checkpoint_load_bytes(m->ck_, m->cfg_)));
  V4_ASSIGN_OR_RETURN(m->w_, Weights::load(m->ck_, m->cfg_, ops, policy));
  m->init_tables();
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
  V4_RETURN_IF_ERROR(check_weights_fit(config_path, m->cfg_, ops, policy));
  V4_ASSIGN_OR_RETURN(m->w_, Weights::dummy(m->cfg_, ops, policy, seed));
  m->init_tables();
  return m;
}

void DeepseekV4::init_tables() {
  auto make_rope = [&](const RopeSpec& r, RopeTable* t) {
    t->inv_freq = upload_vec(ops_, r.inv_freq());
    t->rope_dim = r.rope_dim;
    t->attention_scaling = float(r.attention_factor);
  };
  make_rope(cfg_.rope_main, &rope_main_);
  make_rope(cfg_.rope_compress, &rope_compress_);
  shared_idx_ = upload_vec(ops_, std::vector<int32_t>(kMaxDecodeRows, 0));
  shared_w_ = upload_vec(ops_, std::vector<float>(kMaxDecodeRows, 1.f));
  decode_opt_.graphs = ops_->supports_graphs() && !env_graphs_off();
}

cache::CacheSpec DeepseekV4::cache_spec(KvDtype kv_dtype, IndexCacheDtype index) const {
  cache::CacheSpec s;
  s.sliding_window = cfg_.sliding_window;
  s.kv_dtype = kv_dtype;
  s.index_cache_dtype = index;
  s.rope_dim = cfg_.rope_dim();
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
                                                               int64_t max_chunk_tokens,
                                                               KvDtype kv_dtype,
                                                               IndexCacheDtype index) const {
  if (kv_dtype != KvDtype::kF32 && !ops_->supports_kv_dtype(kv_dtype))
    return make_error(ErrorCode::kUnsupported, "the {} backend has no {} KV cache pools",
                      ops_->name(), kv_dtype_name(kv_dtype));
  // fp8 indexer keys (kFp8Index) come with a backend's fp8 KV pools.
  if (index == IndexCacheDtype::kFp8 && !ops_->supports_kv_dtype(KvDtype::kFp8))
    return make_error(ErrorCode::kUnsupported, "the {} backend has no fp8 indexer-key pools",
                      ops_->name());
  V4_RETURN_IF_ERROR(cfg_.check_kv_dtype(kv_dtype));
  V4_RETURN_IF_ERROR(cfg_.check_index_cache_dtype(index));
  const auto spec = cache_spec(kv_dtype, index);
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
  forward_t0_ = std::chrono::steady_clock::now();
  const ModelConfig& c = cfg_;
  // ---- 1. validate and reserve ----------------------------------------------------------
  std::set<int32_t> seen;
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
  }
  for (const SeqSlice& sl : batch.slices)
    V4_RETURN_IF_ERROR(kv.reserve(sl.seq, sl.start_pos + int64_t(sl.tokens.size())));
  // ---- 2.–4. plan, layers, head, commit ---------------------------------------------------
  // Device-time markers (ops.h StepTiming): the paths call step_begin after host planning.
  struct EndMarker {
    ops::Ops* o;
    ~EndMarker() { o->step_end(); }
  } end_marker{ops_};
  if (decode_fast_path(batch, kv)) return forward_decode(batch, kv);
  return forward_host_plan(batch, kv);
}

Result<ForwardOutput> DeepseekV4::forward_host_plan(const ForwardBatch& batch, cache::KvCache& kv) {
  const ModelConfig& c = cfg_;
  ops::Ops& o = *ops_;
  StepMemory mem(ops_);
  const HostStepPlan hp = plan_on_host(batch, kv, shape_of(c));
  {
    bool decode_only = true;
    for (const SeqSlice& sl : batch.slices) decode_only &= sl.tokens.size() == 1;
    ops_->note_host_prep(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - forward_t0_).count());
    ops_->step_begin(decode_only);
  }
  Step st;
  st.kv = &kv;
  st.mem = &mem;
  st.S = hp.S;
  st.ids = to_step(ops_, mem, hp.ids);
  st.pos = to_step(ops_, mem, hp.pos);
  st.swa_dst = to_step(ops_, mem, hp.swa_dst);
  st.swa = {to_step(ops_, mem, hp.swa.rows), to_step(ops_, mem, hp.swa.offset),
            to_step(ops_, mem, hp.swa.count)};
  auto upload_compress = [&](const HostCompressPlan& h, CompressPlan* p) {
    p->ratio = h.ratio;
    p->overlap = h.overlap;
    p->n_out = int64_t(h.dst.size());
    p->src = to_step(ops_, mem, h.src);
    p->positions = to_step(ops_, mem, h.positions);
    p->dst = to_step(ops_, mem, h.dst);
    p->n_ring = int64_t(h.ring_dst.size());
    p->ring_src = to_step(ops_, mem, h.ring_src);
    p->ring_dst = to_step(ops_, mem, h.ring_dst);
    p->ring_disjoint = ops::compress_ring_disjoint(h.src.data(), int64_t(h.src.size()),
                                                   h.ring_dst.data(), int64_t(h.ring_dst.size()));
    p->rows_close = true;  // host plans list only the rows that close
    p->cand = {to_step(ops_, mem, h.cand.rows), to_step(ops_, mem, h.cand.offset),
               to_step(ops_, mem, h.cand.count)};
    p->max_cand = h.max_cand;
  };
  if (hp.has_csa) {
    upload_compress(hp.csa, &st.csa);
    st.topk_offset = to_step(ops_, mem, hp.topk_offset);
  }
  if (hp.has_hca) upload_compress(hp.hca, &st.hca);
  if (st.S <= kMaxDecodeRows) {
    st.shared_idx = shared_idx_.data();
    st.shared_w = shared_w_.data();
  } else {
    st.shared_idx = to_step(ops_, mem, std::vector<int32_t>(size_t(st.S), 0));
    st.shared_w = to_step(ops_, mem, std::vector<float>(size_t(st.S), 1.f));
  }

  float* h = run_layers(st);

  // Head on the rows that return logits or a sampled token. Slices asking for `sample` (not
  // logits_all) are sampled on the backend when it can (Ops::sample; a call with no rows asks).
  // Their rows go last in the head's row list, so the logits rows to download stay one block in
  // slice order and the sampled rows only send back token ids (and logprobs).
  ForwardOutput out;
  const int64_t V = c.vocab_size;
  out.vocab = V;
  out.row_begin.push_back(0);
  std::vector<size_t> dev_slices;
  for (size_t i = 0; i < batch.slices.size(); ++i)
    if (batch.slices[i].sample && !batch.slices[i].logits_all) dev_slices.push_back(i);
  if (!dev_slices.empty() && !o.sample(ops::SampleArgs{})) dev_slices.clear();
  std::vector<int32_t> sel;
  for (size_t i = 0, k = 0; i < batch.slices.size(); ++i) {
    if (k < dev_slices.size() && dev_slices[k] == i)
      ++k;  // no logits rows
    else if (batch.slices[i].logits_all)
      for (int64_t r = hp.row0[i]; r < hp.row0[i + 1]; ++r) sel.push_back(int32_t(r));
    else
      sel.push_back(int32_t(hp.row0[i + 1] - 1));
    out.row_begin.push_back(int64_t(sel.size()));
  }
  const int64_t R_logits = int64_t(sel.size()), R_dev = int64_t(dev_slices.size());
  for (size_t i : dev_slices) sel.push_back(int32_t(hp.row0[i + 1] - 1));
  const int64_t R = int64_t(sel.size());
  const float* logits = head(st, h, to_step(ops_, mem, sel), R);
  if (R_dev > 0)
    V4_RETURN_IF_ERROR(sample_on_device(ops_, V, batch, dev_slices, logits + R_logits * V, &out));
  out.logits.resize(size_t(R_logits * V));
  o.download(out.logits.data(), logits, out.logits.size() * sizeof(float));

  for (const SeqSlice& sl : batch.slices)
    kv.commit(sl.seq, sl.start_pos + int64_t(sl.tokens.size()));
  ++decode_stats_.host_plan_steps;
  return out;
}

bool DeepseekV4::decode_fast_path(const ForwardBatch& batch, const cache::KvCache& kv) const {
  const bool graphs = decode_opt_.graphs && ops_->supports_graphs();
  if (!graphs && !decode_opt_.device_plan) return false;
  const int64_t n = int64_t(batch.slices.size());
  if (n == 0 || n > kMaxDecodeRows) return false;
  const int64_t P = decode_table_pages(kv, cfg_.max_position_embeddings);
  for (const SeqSlice& sl : batch.slices) {
    if (sl.tokens.size() != 1 || sl.logits_all) return false;
    if (sl.seq >= kv.options().max_seqs || int64_t(kv.pages(sl.seq).size()) > P) return false;
  }
  return true;
}

void DeepseekV4::reset_decode_graphs() { decode_.reset(); }

DeepseekV4::DecodeState& DeepseekV4::decode_state(cache::KvCache& kv) {
  if (decode_ && decode_->cache_id == kv.id()) return *decode_;
  decode_.reset();  // graphs and tables of another cache
  auto ds = std::make_unique<DecodeState>();
  ds->cache_id = kv.id();
  ds->P = decode_table_pages(kv, cfg_.max_position_embeddings);
  const int rows = kv.options().max_seqs;
  ds->stager = DecodeStager(rows, ds->P);
  ds->staging = DeviceBuffer<int32_t>(ops_, ds->stager.total_ints());
  ds->page_table = DeviceBuffer<int32_t>(ops_, int64_t(rows) * ds->P);
  ds->swa_table = DeviceBuffer<int32_t>(ops_, int64_t(rows) * ds->P);
  decode_ = std::move(ds);
  return *decode_;
}

void DeepseekV4::plan_on_device(Step& st, DecodeState& ds, int64_t B, int64_t ctx) {
  const PlanShape sh = shape_of(cfg_);
  const int W = sh.window;
  ops::DecodePlanArgs a =
      decode_plan_inputs(ds.staging.data(), ds.page_table.data(), ds.swa_table.data(), ds.P,
                         st.kv->options().page_size, W, B);
  st.S = B;
  st.ids = ds.staging.data() + DecodeStager::kIds;
  a.positions = st.buf<int64_t>(B);
  a.swa_dst = st.buf<int32_t>(B);
  a.swa_rows = st.buf<int32_t>(B * W);
  a.swa_offset = st.buf<int64_t>(B);
  a.swa_count = st.buf<int32_t>(B);
  auto add_rate = [&](int m, int cc, CompressPlan* p) {
    ops::DecodePlanRate& r = a.rates[a.n_rates++];
    r.ratio = m;
    r.overlap = cc;
    r.cand_stride = (ctx + m - 1) / m;
    r.src = st.buf<int32_t>(B * cc * m);
    r.positions = st.buf<int64_t>(B);
    r.dst = st.buf<int32_t>(B);
    r.ring_src = st.buf<int32_t>(B);
    r.ring_dst = st.buf<int32_t>(B);
    r.cand_rows = st.buf<int32_t>(B * r.cand_stride);
    r.cand_offset = st.buf<int64_t>(B);
    r.cand_count = st.buf<int32_t>(B);
    p->ratio = m;
    p->overlap = cc;
    p->n_out = B;
    p->src = r.src;
    p->positions = r.positions;
    p->dst = r.dst;
    p->n_ring = B;
    p->ring_src = r.ring_src;
    p->ring_dst = r.ring_dst;
    p->ring_disjoint = true;  // one token per sequence, one slot per row (decode_plan_rows.h)
    p->cand = {r.cand_rows, r.cand_offset, r.cand_count};
    p->max_cand = r.cand_stride;
  };
  if (sh.csa_ratio > 0) {
    add_rate(sh.csa_ratio, 2, &st.csa);
    a.topk = sh.index_topk;
    a.topk_offset = st.buf<int64_t>(B);
    st.topk_offset = a.topk_offset;
  }
  if (sh.hca_ratio > 0) add_rate(sh.hca_ratio, 1, &st.hca);
  ops_->build_decode_plan(a);
  st.pos = a.positions;
  st.swa_dst = a.swa_dst;
  st.swa = {a.swa_rows, a.swa_offset, a.swa_count};
  st.shared_idx = shared_idx_.data();
  st.shared_w = shared_w_.data();
}

float* DeepseekV4::decode_body(Step& st, DecodeState& ds, int64_t B, int64_t ctx) {
  plan_on_device(st, ds, B, ctx);
  float* h = run_layers(st);
  return head(st, h, nullptr, B);
}

Result<ForwardOutput> DeepseekV4::forward_decode(const ForwardBatch& batch, cache::KvCache& kv) {
  const ModelConfig& c = cfg_;
  DecodeState& ds = decode_state(kv);
  const int64_t n = int64_t(batch.slices.size());
  const int64_t B = decode_bucket(n);
  int64_t need = 1;
  for (const SeqSlice& sl : batch.slices) need = std::max<int64_t>(need, sl.start_pos + 1);
  int64_t ctx = std::max<int64_t>(1, decode_opt_.min_context);
  while (ctx < need) ctx *= 2;
  ctx = std::max(need, std::min<int64_t>(ctx, ds.P * kv.options().page_size));

  // A failure between staging and the plan op would leave the device tables behind the
  // stager's record: forget the record unless the step completes.
  struct Invalidate {
    DecodeStager& s;
    bool done = false;
    ~Invalidate() {
      if (!done) s.invalidate();
    }
  } guard{ds.stager};
  const int64_t ints = ds.stager.stage(batch, kv, B);
  decode_stats_.page_rows_sent += ds.stager.last_deltas();
  ops_->note_host_prep(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - forward_t0_).count());
  ops_->step_begin(/*decode_only=*/true);
  ops_->upload(ds.staging.data(), ds.stager.host(), size_t(ints) * sizeof(int32_t));

  // Logits rows 0..n−1 (slice order) → tokens sampled on the backend and/or logits rows.
  ForwardOutput out;
  out.vocab = c.vocab_size;
  DecodeState::Entry& e = ds.entries[{B, ctx}];
  const bool graphs = decode_opt_.graphs && ops_->supports_graphs();
  if (graphs && e.graph) {
    e.graph->replay();
    V4_RETURN_IF_ERROR(decode_output(ops_, c.vocab_size, batch, e.logits, &out));
    ++decode_stats_.graph_replays;
    ++decode_stats_.replays[{B, ctx}];
  } else {
    {
      StepMemory mem(ops_);
      Step st;
      st.kv = &kv;
      st.mem = &mem;
      const float* logits = decode_body(st, ds, B, ctx);
      V4_RETURN_IF_ERROR(decode_output(ops_, c.vocab_size, batch, logits, &out));
      e.peak = std::max(e.peak, mem.peak());
    }
    ++decode_stats_.device_plan_steps;
    // Warmed up with these shapes: capture the same body against a fixed workspace.
    if (graphs && !e.failed) {
      if (!ds.workspace || size_t(ds.workspace->size()) < e.peak) {
        const int64_t cur = ds.workspace ? ds.workspace->size() : 0;
        ds.workspace =
            std::make_shared<DeviceBuffer<char>>(ops_, std::max<int64_t>(int64_t(e.peak), 2 * cur));
      }
      StepMemory wmem(ds.workspace->data(), size_t(ds.workspace->size()));
      float* logits = nullptr;
      std::unique_ptr<ops::Graph> g;
      try {
        g = ops_->capture([&] {
          Step st;
          st.kv = &kv;
          st.mem = &wmem;
          logits = decode_body(st, ds, B, ctx);
        });
      } catch (const std::exception& ex) {
        V4_LOG_WARN("decode graph B={} ctx={}: capture failed: {}", B, ctx, ex.what());
      }
      if (g) {
        e.graph = std::move(g);
        e.workspace = ds.workspace;
        e.logits = logits;
        ++decode_stats_.captures;
      } else {
        e.failed = true;
        ++decode_stats_.capture_failures;
        V4_LOG_WARN("decode graph B={} ctx={}: no graph, this bucket stays eager", B, ctx);
      }
    }
  }
  for (const SeqSlice& sl : batch.slices)
    kv.commit(sl.seq, sl.start_pos + int64_t(sl.tokens.size()));
  guard.done = true;
  return out;
}

float* DeepseekV4::run_layers(Step& st) {
  const ModelConfig& c = cfg_;
  ops::Ops& o = *ops_;
  const int64_t S = st.S;
  const int n = c.hc_mult, D = c.hidden_size;
  float* h = st.buf<float>(S * n * D);
  float* collapsed = st.buf<float>(S * D);
  float* x = st.buf<float>(S * D);
  float* f = st.buf<float>(S * D);
  float* post = st.buf<float>(S * n);
  float* comb = st.buf<float>(S * n * n);
  o.region("embed");
  o.embed(w_.embed.data(), st.ids, S, D, n, h);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    const LayerKind kind = c.layer_types[l];
    o.region(region_name(kind, kRHcAttn));
    ops::HcArgs hc;
    hc.h = h;
    hc.n_rows = S;
    hc.n_streams = n;
    hc.hidden = D;
    hc.rms_eps = float(c.rms_norm_eps);
    hc.hc_eps = float(c.hc_eps);
    hc.sinkhorn_iters = c.hc_sinkhorn_iters;
    hc.collapsed = collapsed;
    hc.post = post;
    hc.comb = comb;
    hc.fn = L.hc_attn_fn.data();
    hc.base = L.hc_attn_base.data();
    hc.scale = L.hc_attn_scale.data();
    o.hc_pre_norm(hc, L.attn_norm.data(), float(c.rms_norm_eps), x);
    attention(st, l, x, f);
    o.region(region_name(kind, kRHcPostAttn));
    o.hc_post(h, f, post, comb, S, n, D);

    o.region(region_name(kind, kRHcFfn));
    hc.fn = L.hc_ffn_fn.data();
    hc.base = L.hc_ffn_base.data();
    hc.scale = L.hc_ffn_scale.data();
    o.hc_pre_norm(hc, L.ffn_norm.data(), float(c.rms_norm_eps), x);
    moe(st, l, x, f, h, post, comb);  // ends with the mHC post on h
  }
  return h;
}

float* DeepseekV4::head(Step& st, const float* h, const int32_t* sel, int64_t R) {
  const ModelConfig& c = cfg_;
  ops::Ops& o = *ops_;
  const int n = c.hc_mult, D = c.hidden_size;
  const float* hs = h;
  if (sel) {
    float* g = st.buf<float>(R * n * D);
    o.gather_rows(h, sel, R, int64_t(n) * D, g);
    hs = g;
  }
  float* y = st.buf<float>(R * D);
  float* logits = st.buf<float>(R * c.vocab_size);
  o.region("head (mHC head, norm, lm_head)");
  o.hc_head_norm(hs, w_.hc_head_fn.data(), w_.hc_head_base.data(), w_.hc_head_scale.data(), R, n,
                 D, float(c.rms_norm_eps), float(c.hc_eps), w_.norm.data(), float(c.rms_norm_eps),
                 y);
  o.linear_w(y, D, w_.head.v(), R, logits, c.vocab_size);
  return logits;
}

void DeepseekV4::attention(Step& st, int l, const float* x, float* out) {
  const ModelConfig& c = cfg_;
  const AttentionWeights& a = w_.layers[l].attn;
  const LayerKind kind = c.layer_types[l];
  const RopeTable& rope = rope_for(kind);
  ops::Ops& o = *ops_;
  StepScope scope(*st.mem);
  const int64_t S = st.S;
  const int D = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim, Rq = c.q_lora_rank;
  const float eps = float(c.rms_norm_eps);

  // Four independent chains read the layer input x (read-only) and write disjoint buffers, so
  // they run as Ops branches (ops.h fork/join; concurrent streams on CUDA with multi_stream):
  //   0 (main): q path (CSA: wq_a + q_norm, the indexer's q from cq, then the q tail wq_b +
  //     head norm + rope);  1: kv + SWA store;  2: compressor (comp pool, ring 0);
  //   3 (CSA): the indexer's head weights, its compressor (index pool, ring 1), then — after
  //     branch 0's indexer q (branch_wait) — the indexer top-k, which so overlaps the q tail.
  // They join before the sparse attention, which reads the pools and the top-k rows. Every
  // buffer a branch writes is allocated before the fork and released after the join (a
  // release inside would let another branch's allocation reuse memory still in use).
  const bool csa = kind == LayerKind::kCsa, hca = kind == LayerKind::kHca;
  const int nI = c.index_n_heads, dI = c.index_head_dim, topk = c.index_topk;
  float* cq = st.buf<float>(S * Rq);
  float* q = st.buf<float>(S * H * hd);
  float* kvv = st.buf<float>(S * hd);

  // Compressor: pool the rows that close in this step, norm + rope at w·m, store; refresh rings.
  struct CompressBufs {
    float* kc = nullptr;
    float* zc = nullptr;
    float* scratch = nullptr;
  };
  auto compress_bufs = [&](const CompressPlan& plan, int d) {
    CompressBufs b;
    const int cd = plan.overlap * d;
    b.kc = st.buf<float>(S * cd);
    b.zc = st.buf<float>(S * cd);
    const int64_t need = std::max<int64_t>(plan.n_out * d, plan.n_ring * cd);
    if (need > 0) b.scratch = st.buf<float>(need);
    return b;
  };
  auto compress = [&](const CompressorWeights& w, const CompressPlan& plan, int d, void* pool,
                      KvDtype pool_dtype, float* ring_kv, float* ring_gate,
                      const CompressBufs& b) {
    // Projections, pool + norm + rope + store, ring refresh: one op (FlashCompressor on CUDA:
    // with its projections for decode-sized steps, docs/cuda.md).
    ops::CompressProjectArgs pa;
    pa.x = x;
    pa.ldx = D;
    pa.n_fresh = S;
    pa.wkv = w.wkv.v();
    pa.wgate = w.wgate.v();
    pa.kc = b.kc;
    pa.zc = b.zc;
    ops::CompressFusedArgs& ca = pa.step;
    ca.state_kv = ring_kv;
    ca.state_gate = ring_gate;
    ca.bias = w.ape.data();
    ca.norm = w.norm.data();
    ca.eps = eps;
    ca.src = plan.src;
    ca.positions = plan.positions;
    ca.dst = plan.dst;
    ca.n_out = plan.n_out;
    ca.ring_src = plan.ring_src;
    ca.ring_dst = plan.ring_dst;
    ca.ring_disjoint = plan.ring_disjoint;
    ca.rows_close = plan.rows_close;
    ca.n_ring = plan.n_ring;
    ca.ratio = plan.ratio;
    ca.overlap = plan.overlap;
    ca.dim = d;
    ca.rope_dim = rope.rope_dim;
    ca.inv_freq = rope.inv_freq.data();
    ca.attention_scaling = rope.attention_scaling;
    ca.pool = pool;
    ca.pool_dtype = pool_dtype;
    ca.scratch = b.scratch;
    o.compress_project(pa);
  };
  CompressBufs comp_b, icomp_b;
  if (hca) comp_b = compress_bufs(st.hca, hd);
  if (csa) {
    comp_b = compress_bufs(st.csa, hd);
    icomp_b = compress_bufs(st.csa, dI);
  }
  float* qi = csa ? st.buf<float>(S * nI * dI) : nullptr;
  float* wi = csa ? st.buf<float>(S * nI) : nullptr;
  int32_t* sel_rows = csa ? st.buf<int32_t>(S * topk) : nullptr;
  int32_t* sel_count = csa ? st.buf<int32_t>(S) : nullptr;

  o.fork(csa ? 4 : hca ? 3 : 2, S);
  // Branch 0 — Q path: low-rank q, q_norm, per-head unweighted RMS norm, RoPE (dsv4-model.md §4).
  o.region(region_name(kind, kRQ));
  o.linear_w(x, D, a.wq_a.v(), S, cq, Rq);
  o.rms_norm(cq, a.q_norm.data(), S, Rq, eps, cq);
  if (csa) {
    // Lightning indexer (dsv4-model.md §6): q^I from cq, roped (its weights: branch 3). Issued
    // before the q tail so that branch 3's top-k can start while the tail runs.
    o.region(region_name(kind, kRIndexQ));
    o.linear_w(cq, Rq, a.index_wq_b.v(), S, qi, int64_t(nI) * dI);
    o.rope(qi, S, nI, dI, rope.rope_dim, st.pos, rope.inv_freq.data(), rope.attention_scaling,
           false);
  }
  auto q_tail = [&] {
    o.linear_w(cq, Rq, a.wq_b.v(), S, q, int64_t(H) * hd);
    o.rms_norm_rope(q, nullptr, S, H, hd, eps, rope.rope_dim, st.pos, rope.inv_freq.data(),
                    rope.attention_scaling);
  };
  if (!csa) q_tail();
  // Branch 1 — K = V path: kv_norm then RoPE, stored into the SWA pool.
  o.branch(1);
  o.region(region_name(kind, kRKv));
  o.linear_w(x, D, a.wkv.v(), S, kvv, hd);
  o.rms_norm_rope(kvv, a.kv_norm.data(), S, 1, hd, eps, rope.rope_dim, st.pos,
                  rope.inv_freq.data(), rope.attention_scaling);
  o.store_rows_kv(st.kv->swa_pool(l), st.kv->kv_dtype(), st.swa_dst, S, hd, kvv, rope.rope_dim);
  if (hca || csa) {
    // Branch 2 — the compressor of this layer's rate.
    o.branch(2);
    o.region(region_name(kind, kRComp));
    compress(a.compressor, hca ? st.hca : st.csa, hd, st.kv->comp_pool(l), st.kv->kv_dtype(),
             st.kv->ring_kv(l, 0),
             st.kv->ring_gate(l, 0), comp_b);
  }
  if (csa) {
    // Branch 3 — the indexer's compressor (keys of the lightning indexer).
    o.branch(3);
    o.region(region_name(kind, kRIndexComp));
    // The indexer's head weights (from x) here rather than on branch 0, so the top-k below waits
    // for less of branch 0.
    o.linear_w(x, D, a.index_weights_proj.v(), S, wi, nI);
    compress(a.index_compressor, st.csa, dI, st.kv->index_pool(l), st.kv->index_dtype(),
             st.kv->ring_kv(l, 1),
             st.kv->ring_gate(l, 1), icomp_b);
    // Top-k compressed rows per query from the indexer keys and weights (this branch) and the
    // indexer q (branch 0 up to here).
    o.branch_wait(0);
    ops::IndexerArgs ia;
    ia.q = qi;
    ia.weights = wi;
    ia.key_pool = st.kv->index_pool(l);
    ia.key_dtype = st.kv->index_dtype();
    ia.cand = st.csa.cand;
    ia.n_rows = S;
    ia.n_heads = nI;
    ia.head_dim = dI;
    ia.topk = topk;
    ia.max_count = std::max<int64_t>(1, st.csa.max_cand);
    ia.out_rows = sel_rows;
    ia.out_count = sel_count;
    ia.topk_region = region_name(kind, kRIndexSel);
    ia.after_scores_branch = 0;  // the q tail (issued next on branch 0) may follow the scores
    o.region(region_name(kind, kRIndexTopk));
    o.indexer_topk(ia);
    // Branch 0 again — the q tail.
    o.branch(0);
    o.region(region_name(kind, kRQTail));
    q_tail();
  }
  o.join();

  ops::AttentionArgs aa;
  aa.sinks = a.sinks.data();
  aa.swa_pool = st.kv->swa_pool(l);
  aa.kv_dtype = st.kv->kv_dtype();
  aa.rope_dim = rope.rope_dim;
  aa.swa = st.swa;
  aa.n_rows = S;
  aa.n_heads = H;
  aa.head_dim = hd;
  aa.scale = 1.f / std::sqrt(float(hd));
  aa.q = q;
  if (hca) {
    aa.comp_pool = st.kv->comp_pool(l);
    aa.comp = st.hca.cand;
  } else if (csa) {
    // The top-k rows of branch 3 (joined).
    aa.comp_pool = st.kv->comp_pool(l);
    aa.comp = {sel_rows, st.topk_offset, sel_count};
  }
  // Key-count bound: the window, plus top-k (CSA) or every causal compressed row (HCA).
  aa.max_keys = c.sliding_window + (kind == LayerKind::kCsa   ? c.index_topk
                                    : kind == LayerKind::kHca ? st.hca.max_cand
                                                              : 0);
  float* attn = st.buf<float>(S * H * hd);
  aa.out = attn;
  o.region(region_name(kind, kRCore));
  o.sparse_attention(aa);
  o.region(region_name(kind, kROut));
  // De-rotation (P3), then the grouped low-rank output projection (P9: G may exceed H).
  o.rope(attn, S, H, hd, rope.rope_dim, st.pos, rope.inv_freq.data(), rope.attention_scaling, true);
  const int G = c.o_groups, R = c.o_lora_rank;
  const int64_t gw = int64_t(H) * hd / G;
  float* og = st.buf<float>(S * G * R);
  (void)gw;  // = wo_a.k: group g reads attn columns [g·gw, (g+1)·gw)
  o.linear_w_grouped(attn, int64_t(H) * hd, a.wo_a.v(), G, S, og, int64_t(G) * R);
  o.region(region_name(kind, kROutB));
  o.linear_w(og, int64_t(G) * R, a.wo_b.v(), S, out, D);
}

void DeepseekV4::moe(Step& st, int l, const float* x, float* out, float* h, const float* post,
                     const float* comb) {
  const ModelConfig& c = cfg_;
  const MoeWeights& m = w_.layers[l].ffn;
  ops::Ops& o = *ops_;
  StepScope scope(*st.mem);
  const int64_t S = st.S;
  const int D = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok,
            I = c.moe_intermediate_size;
  float* logits = st.buf<float>(S * E);
  float* wgt = st.buf<float>(S * k);
  float* shared = st.buf<float>(S * D);
  int32_t* idx = st.buf<int32_t>(S * k);
  const LayerKind kind = c.layer_types[l];
  o.region(region_name(kind, kRRouter));
  o.linear(x, D, m.gate.data(), S, E, D, logits, E);
  ops::RouteArgs ra;
  ra.logits = logits;
  ra.n_rows = S;
  ra.n_experts = E;
  ra.topk = k;
  ra.scoring = c.scoring;
  ra.routed_scaling_factor = float(c.routed_scaling_factor);
  ra.out_idx = idx;
  ra.out_weight = wgt;
  if (c.mlp_layer_types[l] == MlpKind::kHashMoe) {
    ra.tid2eid = m.tid2eid.data();
    ra.token_ids = st.ids;
  } else {
    ra.bias = m.bias.data();
  }
  o.route(ra);
  ops::MoeArgs ma;
  ma.x = x;
  ma.w13 = m.w13.v();
  ma.w2 = m.w2.v();
  ma.idx = idx;
  ma.weight = wgt;
  ma.n_rows = S;
  ma.hidden = D;
  ma.inter = I;
  ma.n_experts = E;
  ma.topk = k;
  ma.swiglu_limit = float(c.swiglu_limit);
  ma.out = out;
  o.region(region_name(kind, kRRouted));
  o.moe_experts(ma);
  o.region(region_name(kind, kRShared));
  // Shared expert = the same op with one expert of weight 1 (exact: v·1 = v); its constant
  // routing arrays are hoisted out of the layer loop (Step::shared_idx / shared_w).
  ma.w13 = m.shared_w13.v();
  ma.w2 = m.shared_w2.v();
  ma.idx = st.shared_idx;
  ma.weight = st.shared_w;
  ma.n_experts = 1;
  ma.topk = 1;
  ma.out = shared;
  o.moe_experts(ma);
  if (h) {
    o.hc_post_add(h, out, shared, post, comb, S, c.hc_mult, D);
  } else {
    o.add(out, shared, S * D);
  }
}

}  // namespace v4::model
