#include "engine/model_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "base/log.h"
#include "model/backend.h"

namespace v4::engine {

Result<std::unique_ptr<ModelExecutor>> ModelExecutor::load_cpu(const std::string& dir,
                                                               ModelExecutorOptions opt) {
  return load(dir, opt, "cpu");
}

Result<std::unique_ptr<ModelExecutor>> ModelExecutor::load(const std::string& dir,
                                                           ModelExecutorOptions opt,
                                                           const std::string& device) {
  V4_ASSIGN_OR_RETURN(auto ops, model::make_backend(device));
  V4_ASSIGN_OR_RETURN(auto model, model::DeepseekV4::load(dir, ops.get()));
  return create(std::move(ops), std::move(model), opt);
}

Result<std::unique_ptr<ModelExecutor>> ModelExecutor::create(
    std::unique_ptr<ops::Ops> ops, std::unique_ptr<model::DeepseekV4> model,
    ModelExecutorOptions opt) {
  if (!ops || !model) return make_error(ErrorCode::kInvalidArgument, "ModelExecutor: no model");
  // Own ops and model at once: every early return below then destroys them in the member order
  // the destructor relies on (model and cache before the backend that allocated them).
  std::unique_ptr<ModelExecutor> e(new ModelExecutor());
  e->ops_ = std::move(ops);
  e->model_ = std::move(model);
  if (opt.max_sequences < 1 || opt.max_chunk_tokens < 1)
    return make_error(ErrorCode::kInvalidArgument,
                      "ModelExecutor: max_sequences ({}) and max_chunk_tokens ({}) must be >= 1",
                      opt.max_sequences, opt.max_chunk_tokens);
  const int64_t cfg_ctx0 = e->model_->config().max_position_embeddings;
  if (opt.mem_fraction > 0) {
    const int64_t ctx = opt.max_context > 0 ? std::min(opt.max_context, cfg_ctx0) : cfg_ctx0;
    std::string why;
    V4_ASSIGN_OR_RETURN(
        opt.kv_budget_bytes,
        kv_budget_from_mem_fraction(
            *e->ops_, opt.mem_fraction,
            workspace_reserve_bytes(e->model_->config(), opt.max_chunk_tokens, ctx), &why));
    V4_LOG_INFO("{}", why);
    if (opt.prefix_cache_bytes > 0) {  // the prefix store is allocated next to the pools
      if (opt.kv_budget_bytes - opt.prefix_cache_bytes <= 0)
        return make_error(ErrorCode::kResourceExhausted,
                          "--mem-fraction leaves {} bytes, not more than the prefix cache's {} "
                          "bytes (--prefix-cache-bytes)",
                          opt.kv_budget_bytes, opt.prefix_cache_bytes);
      opt.kv_budget_bytes -= opt.prefix_cache_bytes;
      V4_LOG_INFO("KV budget {:.2f} GiB after the prefix cache store ({:.2f} GiB)",
                  double(opt.kv_budget_bytes) / double(int64_t(1) << 30),
                  double(opt.prefix_cache_bytes) / double(int64_t(1) << 30));
    }
  }
  if (opt.mem_fraction <= 0)
    V4_RETURN_IF_ERROR(check_kv_budget(*e->ops_, opt.kv_budget_bytes, opt.prefix_cache_bytes));
  // The SWA pool is sized for live windows only (max_sequences × (ceil((chunk + W − 1) / P) + 1)
  // pages, the bound pages_for() reports), with --mem-fraction or a fixed --kv-cache-bytes alike;
  // the rest of the budget goes to virtual pages. With equal page counts a V4 shape would spend
  // ~7/8 of the budget on SWA pages. (options_from_budget keeps equal counts when that bound is
  // not smaller: many sequences in a small budget.)
  V4_ASSIGN_OR_RETURN(e->cache_, e->model_->make_cache(opt.kv_budget_bytes, opt.max_sequences,
                                                       opt.page_size, opt.max_chunk_tokens,
                                                       opt.kv_dtype, opt.index_cache_dtype));
  const auto& ko = e->cache_->options();
  e->page_size_ = ko.page_size;
  const int64_t W = e->cache_->spec().sliding_window;
  e->swa_cap_pages_ = (opt.max_chunk_tokens + W - 1 + e->page_size_ - 1) / e->page_size_ + 1;
  const int64_t cfg_ctx = e->model_->config().max_position_embeddings;
  e->max_context_ = opt.max_context > 0 ? std::min(opt.max_context, cfg_ctx) : cfg_ctx;
  e->device_sampling_ = opt.device_sampling;
  if (const char* env = std::getenv("V4_DEVICE_SAMPLING"); env && std::string(env) == "0")
    e->device_sampling_ = false;  // emergency switch without a CLI flag
  if (e->ops_->sample(ops::SampleArgs{}))
    V4_LOG_INFO("sampling: {} on the {} backend for requests without penalties",
                e->device_sampling_ ? "on the device" : "on the host (device sampling off)",
                e->ops_->name());
  // Prefix-cache copies (store <-> pools, docs/cache.md §6) run on the backend: one
  // Ops::copy_batch per phase, stream-ordered with the forward (the pools and the store are
  // backend memory, which the host must not touch on a device backend).
  e->cache_->set_copy_batch(
      [ops = e->ops_.get()](const CopySegment* segs, int64_t n) { ops->copy_batch(segs, n); });
  if (opt.prefix_cache_bytes > 0) {
    auto cfg = cache::PrefixCache::config_for_budget(*e->cache_, opt.prefix_cache_bytes);
    if (!cfg.ok() && opt.prefix_cache_optional) {
      V4_LOG_WARN("{}; serving without the prefix cache", cfg.status().message());
    } else {
      if (!cfg.ok()) return cfg.status();
      cfg->snapshot_interval = opt.prefix_snapshot_interval;
      V4_ASSIGN_OR_RETURN(e->prefix_, cache::PrefixCache::create(*e->cache_, *cfg));
      V4_LOG_INFO("{}", e->prefix_->explain());
      // The interval in use, or why it misbehaves (too small for the store: thinned per prompt;
      // not below the context: no effect) — one line.
      bool warn = false;
      const std::string line = cache::describe_snapshot_interval(
          cfg->snapshot_interval, e->prefix_->radix().interval_point_cap(), cfg->n_snapshots,
          e->max_context_, &warn);
      if (warn)
        V4_LOG_WARN("{}", line);
      else
        V4_LOG_INFO("{}", line);
    }
  }
  if (!e->prefix_ && opt.prefix_snapshot_interval > 0)
    V4_LOG_WARN("--prefix-snapshot-interval {} ignored: the prefix cache is off",
                opt.prefix_snapshot_interval);
  for (const auto& u : e->cache_->usage())
    e->pools_.push_back({u.name, u.total, u.name == "state_slots" ? 0 : e->page_size_});
  return e;
}

int64_t workspace_reserve_bytes(const model::ModelConfig& c, int64_t max_chunk_tokens,
                                int64_t max_context) {
  const int64_t n = c.hc_mult, D = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim;
  const int64_t k = c.num_experts_per_tok, I = c.moe_intermediate_size;
  const int64_t per_token = 2 * n * D + 4 * D + n + n * n + 3 * H * hd + hd + c.q_lora_rank +
                            int64_t(c.o_groups) * c.o_lora_rank + 4 * hd +
                            4 * int64_t(c.index_head_dim) +
                            int64_t(c.index_n_heads) * c.index_head_dim + c.index_n_heads +
                            c.index_topk + max_context / std::max(1, c.compress_rate_csa) +
                            c.n_routed_experts + 2 * k + k * (3 * I + D);
  return (int64_t(512) << 20) + 5 * std::max<int64_t>(1, max_chunk_tokens) * per_token * 4 / 4;
}

Status check_kv_budget(ops::Ops& ops, int64_t kv_bytes, int64_t prefix_bytes) {
  const ops::MemoryInfo m = ops.memory_info();
  const int64_t prefix = std::max<int64_t>(0, prefix_bytes);
  if (m.free_bytes > 0 && (kv_bytes < 0 || kv_bytes > m.free_bytes - prefix))
    return make_error(ErrorCode::kResourceExhausted,
                      "the KV budget ({} bytes, --kv-cache-bytes / --kv-budget-mb) plus the "
                      "prefix cache ({} bytes, --prefix-cache-bytes) exceed the {} backend's "
                      "free memory ({} bytes{})",
                      kv_bytes, prefix, ops.name(), m.free_bytes,
                      ops.name() == "cpu" ? ", MemAvailable" : "");
  return Status::Ok();
}

Result<int64_t> kv_budget_from_mem_fraction(ops::Ops& ops, double fraction, int64_t reserve,
                                            std::string* explanation) {
  if (!(fraction > 0 && fraction <= 1))
    return make_error(ErrorCode::kInvalidArgument, "--mem-fraction {}: must be in (0, 1]",
                      fraction);
  const ops::MemoryInfo m = ops.memory_info();
  if (m.total_bytes <= 0)
    return make_error(ErrorCode::kUnsupported,
                      "--mem-fraction: the {} backend does not report its memory size; give "
                      "--kv-cache-bytes",
                      ops.name());
  const double gib = double(int64_t(1) << 30);
  const int64_t used = m.total_bytes - m.free_bytes;
  const int64_t budget = int64_t(fraction * double(m.total_bytes)) - used - reserve;
  const std::string why = fmt::format(
      "KV budget {:.2f} GiB = --mem-fraction {} × {:.2f} GiB total − {:.2f} GiB in use (weights, "
      "context, other processes) − {:.2f} GiB workspace reserve",
      double(budget) / gib, fraction, double(m.total_bytes) / gib, double(used) / gib,
      double(reserve) / gib);
  if (explanation) *explanation = why;
  if (budget <= 0)
    return make_error(ErrorCode::kResourceExhausted, "--mem-fraction leaves no KV cache: {}", why);
  return budget;
}

ModelExecutor::~ModelExecutor() {
  prefix_.reset();
  cache_.reset();  // frees pool memory through ops_ before ops_ goes
  model_.reset();
}

std::vector<int32_t> ModelExecutor::eos_token_ids() const {
  std::vector<int32_t> out;
  for (int64_t t : model_->config().eos_token_ids) out.push_back(int32_t(t));
  return out;
}

int64_t ModelExecutor::vocab_size() const {
  return model_->config().vocab_size;
}

std::vector<int64_t> ModelExecutor::pages_for(int64_t n) const {
  const int64_t pages = (n + page_size_ - 1) / page_size_;
  std::vector<int64_t> out;
  out.reserve(pools_.size());
  for (const auto& p : pools_) {
    if (p.name == "state_slots")
      out.push_back(n > 0 ? 1 : 0);
    else if (p.name == "swa_pages")
      out.push_back(std::min(pages, swa_cap_pages_));
    else
      out.push_back(pages);
  }
  return out;
}

std::vector<PoolUsage> ModelExecutor::pool_usage() const {
  std::vector<PoolUsage> out;
  for (const auto& u : cache_->usage()) out.push_back({u.name, u.used, u.total, u.bytes_per_unit});
  return out;
}

Result<int32_t> ModelExecutor::create_sequence() {
  return cache_->create_sequence();
}

void ModelExecutor::free_sequence(int32_t seq) {
  if (prefix_)
    (void)prefix_->finish(*cache_, seq, /*insert=*/false);
  else
    cache_->free_sequence(seq);
}

Result<SequenceStart> ModelExecutor::start_sequence(std::span<const int32_t> tokens,
                                                    int64_t max_cached) {
  if (!prefix_) return Executor::start_sequence(tokens, max_cached);
  V4_ASSIGN_OR_RETURN(auto h, prefix_->admit(*cache_, tokens, max_cached));
  SequenceStart st;
  st.seq = h.kv_seq;
  st.cached_tokens = h.cached_tokens;
  st.snapshot_points = std::move(h.snapshot_points);
  return st;
}

void ModelExecutor::end_sequence(int32_t seq, SequenceEnd how, std::span<const int32_t> computed) {
  if (!prefix_) {
    cache_->free_sequence(seq);
    return;
  }
  const bool insert = how == SequenceEnd::kFinished || how == SequenceEnd::kPreempted;
  auto r = prefix_->finish(*cache_, seq, insert);
  if (!r.ok()) V4_LOG_WARN("prefix cache: finish of sequence {}: {}", seq, r.status().to_string());
}

Result<model::ForwardOutput> ModelExecutor::forward(const model::ForwardBatch& batch) {
  Result<model::ForwardOutput> out = [&] {
    if (device_sampling_) return model_->forward(batch, *cache_);
    model::ForwardBatch logits_only = batch;  // device sampling off: every slice gets logits
    for (auto& sl : logits_only.slices) sl.sample.reset();
    return model_->forward(logits_only, *cache_);
  }();
  if (!out.ok() || !prefix_) return out;
  std::vector<cache::StepAppend> steps;
  steps.reserve(batch.slices.size());
  for (const auto& sl : batch.slices) steps.push_back({sl.seq, sl.tokens});
  V4_RETURN_IF_ERROR(prefix_->on_steps(*cache_, steps));  // one batched copy for the step
  return out;
}

DeviceTiming ModelExecutor::device_timing() const {
  const ops::StepTiming t = ops_->step_timing();
  DeviceTiming d;
  d.steps = t.steps;
  d.busy_s = t.busy_s;
  d.idle_s = t.idle_s;
  d.decode_steps = t.decode_steps;
  d.decode_busy_s = t.decode_busy_s;
  d.decode_idle_s = t.decode_idle_s;
  d.decode_host_prep_s = t.decode_host_prep_s;
  d.decode_host_gap_s = t.decode_host_gap_s;
  return d;
}

}  // namespace v4::engine
