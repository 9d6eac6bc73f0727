// The real Executor: model::DeepseekV4 + cache::KvCache on an ops backend.
//
// Pools the scheduler budgets (names as the KV cache reports them):
// - "virtual_pages": ceil(n / page_size) pages per sequence of n tokens (C4 / indexer / C128
//   shadows live with them);
// - "swa_pages": the cache gives each new virtual page an SWA page and frees SWA pages once they
//   leave the window after a step, so one sequence holds at most the pages covering its last
//   (max_chunk_tokens + W − 1) positions during a step: min(ceil(n / P), ceil((C + W − 1) / P) +
//   1);
// - "state_slots": one compressor-state ring slot per live sequence.
// With `prefix_cache_bytes` > 0 the executor binds cache::PrefixCache (copy mode: the tree has
// its own store, so the pools above still hold running sequences only): start_sequence → admit,
// after each forward → on_steps for all slices, end_sequence → finish (insert on kFinished and
// kPreempted). On every backend the store lives in backend memory and its copies run as
// Ops::copy_batch (installed with KvCache::set_copy_batch), so the prefix cache works on CUDA.
#pragma once
#include <memory>
#include <string>

#include "cache/pools.h"
#include "cache/radix_kv.h"
#include "engine/executor.h"
#include "model/deepseek_v4.h"
#include "ops/ops.h"

namespace v4::engine {

struct ModelExecutorOptions {
  /// Bytes for all KV pools together: max_sequences state slots, SWA pages for the live windows
  /// (max_sequences × (ceil((max_chunk_tokens + W − 1) / P) + 1), KvCache::options_from_budget),
  /// the rest virtual pages.
  int64_t kv_budget_bytes = int64_t(1) << 30;
  int max_sequences = 256;                     // compressor-state slots = live sequences
  int page_size = 0;                           // tokens per page; 0 = the model's default
  int64_t max_chunk_tokens = 2048;             // the engine's chunked_prefill_size (bounds SWA use)
  int64_t max_context = 0;                     // 0 = config.json max_position_embeddings
  /// Element type of the KV pools and the prefix-cache store (--kv-cache-dtype): kF32 (default,
  /// = "auto" until bf16 is measured on the GPU) or kBf16 (half the KV bytes: twice the tokens
  /// per budget; rows rounded to bf16 on store, as the bf16 reference model keeps them).
  KvDtype kv_dtype = KvDtype::kF32;
  /// Element type of the indexer-key pools and their rows in the prefix-cache store
  /// (--index-cache-dtype): kAuto follows kv_dtype (kv_index_dtype), kFp8 stores kFp8Index keys
  /// (e4m3 codes + one f32 scale per row) with any kv_dtype.
  IndexCacheDtype index_cache_dtype = IndexCacheDtype::kAuto;
  /// Bytes for the prefix cache's tree store (cache::PrefixCache, docs/cache.md); 0 = no prefix
  /// caching. With it, a request resumes at the longest cached boundary of its prompt and every
  /// finished (or preempted) request's tokens are inserted for later requests. The store is
  /// backend memory (device memory on CUDA); with mem_fraction it comes out of the KV budget.
  int64_t prefix_cache_bytes = 0;
  /// true: when prefix_cache_bytes cannot hold the model's boundary state
  /// (PrefixCache::config_for_budget fails), serve without the prefix cache and log a warning
  /// instead of failing (serve's default budget on a large model). false: that is an error.
  bool prefix_cache_optional = false;
  /// cache::ShadowRadixConfig::snapshot_interval (tokens; 0 = boundaries only at branch points
  /// and prompt ends, so the second request sharing part of a prompt recomputes it once).
  int64_t prefix_snapshot_interval = 0;
  /// Sample on the backend when it can (ops::Ops::sample; the CUDA backend): slices that carry
  /// model::DeviceSampling then return a token id instead of a logits row. false = always
  /// return logits (host sampling everywhere; for comparisons and debugging). The environment
  /// variable V4_DEVICE_SAMPLING=0 also turns it off.
  bool device_sampling = true;
  /// > 0 (`--mem-fraction F`): size the KV pools from device memory instead of kv_budget_bytes,
  /// measured when the executor is created (after the weights are loaded):
  ///   budget = F · total − (total − free) − workspace_reserve_bytes(config, max_chunk_tokens,
  ///            max_context)
  /// (Ops::memory_info; CPU: MemTotal / MemAvailable). The pools are allocated once, here, split
  /// as for kv_budget_bytes (SWA pool for the live windows).
  double mem_fraction = 0;
};

/// Bytes kept free for one step's activations and backend scratch when the KV budget comes from
/// --mem-fraction: 512 MiB (CUDA context growth, library workspaces, the backend's cached small
/// blocks) + 1.25 × max_chunk_tokens × 4 bytes × the f32 values one token needs at once:
///   2·n·D + 4·D + n + n² (residual streams, mHC) + 3·H·hd + hd + Rq + G·R (attention)
///   + 4·hd + 4·dI + nI·dI + nI + topk (compressors, indexer q/weights, selected rows)
///   + max_context / m_csa (indexer scores over every candidate row)
///   + E + 2k + k·(3I + D) (router, MoE scratch).
/// The sum counts every step temporary and the backend's grow-only scratch as alive together (an
/// upper bound); the factor 1.25 covers allocator rounding (power-of-two classes ≤ 64 MiB).
int64_t workspace_reserve_bytes(const model::ModelConfig& cfg, int64_t max_chunk_tokens,
                                int64_t max_context);

/// Refuses an explicit KV budget (`kv_bytes`, plus `prefix_bytes` of prefix-cache store) larger
/// than the backend's free memory (Ops::memory_info; CPU: MemAvailable), which would otherwise
/// end in a failed allocation (a std::bad_alloc abort on the CPU). kResourceExhausted naming the
/// flags and the numbers; Ok when the backend reports no free memory figure.
Status check_kv_budget(ops::Ops& ops, int64_t kv_bytes, int64_t prefix_bytes);

/// The KV budget `--mem-fraction F` gives on `ops` now: F · total − (total − free) −
/// reserve_bytes. `explanation` (optional) gets the one-line arithmetic. Errors:
/// kInvalidArgument for F outside (0, 1]; kUnsupported when the backend reports no memory
/// size; kResourceExhausted when the result is ≤ 0 (the message has the numbers).
Result<int64_t> kv_budget_from_mem_fraction(ops::Ops& ops, double fraction, int64_t reserve_bytes,
                                            std::string* explanation = nullptr);

class ModelExecutor : public Executor {
 public:
  /// Loads the checkpoint in `dir` on the CPU backend and sizes the cache from `opt`.
  /// Errors: those of DeepseekV4::load and DeepseekV4::make_cache.
  static Result<std::unique_ptr<ModelExecutor>> load_cpu(const std::string& dir,
                                                         ModelExecutorOptions opt);
  /// Same on the backend named `device` ("cpu" or "cuda", see model::make_backend).
  static Result<std::unique_ptr<ModelExecutor>> load(const std::string& dir,
                                                     ModelExecutorOptions opt,
                                                     const std::string& device);
  /// Wraps an already loaded model (and the ops it was loaded with; both owned from here), e.g.
  /// a DeepseekV4::load_dummy model. With opt.mem_fraction > 0 the KV budget comes from the
  /// device memory left after the weights (kv_budget_from_mem_fraction).
  static Result<std::unique_ptr<ModelExecutor>> create(std::unique_ptr<ops::Ops> ops,
                                                       std::unique_ptr<model::DeepseekV4> model,
                                                       ModelExecutorOptions opt);
  ~ModelExecutor() override;

  const model::DeepseekV4& model() const { return *model_; }
  const cache::KvCache& cache() const { return *cache_; }
  /// EOS ids from config.json (for EngineConfig::eos_token_ids).
  std::vector<int32_t> eos_token_ids() const;

  int64_t vocab_size() const override;
  DeviceTiming device_timing() const override;
  int64_t max_context() const override { return max_context_; }
  std::vector<PoolSpec> pools() const override { return pools_; }
  std::vector<int64_t> pages_for(int64_t n_tokens) const override;
  std::vector<PoolUsage> pool_usage() const override;
  Result<int32_t> create_sequence() override;
  void free_sequence(int32_t seq) override;
  Result<SequenceStart> start_sequence(std::span<const int32_t> tokens,
                                       int64_t max_cached) override;
  void end_sequence(int32_t seq, SequenceEnd how, std::span<const int32_t> computed) override;
  Result<model::ForwardOutput> forward(const model::ForwardBatch& batch) override;

  /// The prefix cache, or nullptr when off (for its stats: prefix_cache()->radix().stats()).
  const cache::PrefixCache* prefix_cache() const { return prefix_.get(); }

 private:
  ModelExecutor() = default;
  std::unique_ptr<ops::Ops> ops_;
  std::unique_ptr<model::DeepseekV4> model_;
  std::unique_ptr<cache::KvCache> cache_;
  std::unique_ptr<cache::PrefixCache> prefix_;  // destroyed before cache_
  std::vector<PoolSpec> pools_;
  int64_t page_size_ = 0;
  int64_t swa_cap_pages_ = 0;  // per-sequence SWA bound
  int64_t max_context_ = 0;
  bool device_sampling_ = true;
};

}  // namespace v4::engine
