#include "engine/model_executor.h"

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
  V4_ASSIGN_OR_RETURN(e->cache_,
                      e->model_->make_cache(opt.kv_budget_bytes, opt.max_sequences, opt.page_size));
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
  if (opt.prefix_cache_bytes > 0 && e->ops_->name() != "cpu") {
    // The prefix store copies pool rows with host memcpy (two-tier binding, docs/cache.md §6);
    // on a device backend the pools live in device memory, so prefix caching stays off there.
    V4_LOG_WARN("prefix cache: not available on the {} backend yet; serving without it",
                e->ops_->name());
    opt.prefix_cache_bytes = 0;
  }
  if (opt.prefix_cache_bytes > 0) {
    V4_ASSIGN_OR_RETURN(auto cfg,
                        cache::PrefixCache::config_for_budget(*e->cache_, opt.prefix_cache_bytes));
    V4_ASSIGN_OR_RETURN(e->prefix_, cache::PrefixCache::create(*e->cache_, cfg));
    V4_LOG_INFO("{}", e->prefix_->explain());
  }
  for (const auto& u : e->cache_->usage())
    e->pools_.push_back({u.name, u.total, u.name == "state_slots" ? 0 : e->page_size_});
  return e;
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
  for (const auto& u : cache_->usage()) out.push_back({u.name, u.used, u.total});
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

Result<SequenceStart> ModelExecutor::start_sequence(std::span<const int32_t> tokens) {
  if (!prefix_) return Executor::start_sequence(tokens);
  V4_ASSIGN_OR_RETURN(auto h, prefix_->admit(*cache_, tokens));
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
  for (const auto& sl : batch.slices)
    V4_RETURN_IF_ERROR(prefix_->on_step(*cache_, sl.seq, sl.tokens));
  return out;
}

}  // namespace v4::engine
